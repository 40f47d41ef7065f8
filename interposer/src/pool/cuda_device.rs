//! The pool's `Device` over the CUDA driver's virtual-memory API (the real functions the
//! interposer resolved; never our hooks). One per device ordinal.

use crate::cuda::types::*;
use crate::cuda::{captures, real};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_int, c_uint};
use vramshim_pool::{CallCounts, Device, DeviceError, EventId, Handle, Stream};

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_int = 0;
/// `CU_EVENT_DISABLE_TIMING`.
const CU_EVENT_DISABLE_TIMING: c_uint = 2;

fn code(rc: CUresult) -> DeviceError {
    match rc {
        CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory,
        c => DeviceError::Driver(c),
    }
}

fn ok(rc: CUresult) -> Result<(), DeviceError> {
    if rc == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(code(rc))
    }
}

/// Every driver function the pool needs, resolved once.
#[derive(Clone, Copy)]
struct Fns {
    reserve: PfnCuMemAddressReserve,
    unreserve: PfnCuMemAddressFree,
    create: PfnCuMemCreate,
    release: PfnCuMemRelease,
    map: PfnCuMemMap,
    unmap: PfnCuMemUnmap,
    set_access: PfnCuMemSetAccess,
    granularity: PfnCuMemGetAllocationGranularity,
    sync: PfnCuCtxSynchronize,
    ev_create: PfnCuEventCreate,
    ev_record: PfnCuEventRecord,
    ev_query: PfnCuEventQuery,
    ev_destroy: PfnCuEventDestroy,
    wait: PfnCuStreamWaitEvent,
    capturing: Option<PfnCuStreamIsCapturing>,
}

impl Fns {
    fn resolve() -> Option<Fns> {
        Some(Fns {
            reserve: real::cuMemAddressReserve()?,
            unreserve: real::cuMemAddressFree()?,
            create: real::cuMemCreate()?,
            release: real::cuMemRelease()?,
            map: real::cuMemMap()?,
            unmap: real::cuMemUnmap()?,
            set_access: real::cuMemSetAccess()?,
            granularity: real::cuMemGetAllocationGranularity()?,
            sync: real::cuCtxSynchronize()?,
            ev_create: real::cuEventCreate()?,
            ev_record: real::cuEventRecord()?,
            ev_query: real::cuEventQuery()?,
            ev_destroy: real::cuEventDestroy_v2()?,
            wait: real::cuStreamWaitEvent()?,
            capturing: real::cuStreamIsCapturing(),
        })
    }
}

/// The CUDA backend for one device.
pub(crate) struct CudaDevice {
    fns: Fns,
    ordinal: c_int,
    gran: u64,
    /// The stream of the request being served (capture checks).
    stream: Stream,
    /// The request being served came through the runtime API: make sure the thread has the
    /// runtime's primary context current before a driver call (as the real call would).
    runtime: bool,
    /// Whether a stream capture is under way in the process for the request being served (any
    /// mode, any thread: `captures::ctx_sync_forbidden`): then the pool makes no
    /// synchronization, and records no event for later queries (see [`Device::is_capturing`]).
    /// Asked once per request, when first needed, so that every decision of one request
    /// agrees: a capture another thread begins meanwhile records its begin, then waits for the
    /// pool's lock (held here) before its real call, so it begins after the request anyway.
    capturing: Cell<Option<bool>>,
    /// Whether a stream capture under way, on any thread, forbids the calling thread
    /// potentially unsafe calls (`captures`: the mode rules): asked once per request served,
    /// when first needed. Of the pool's calls only the event query is one (the virtual-memory
    /// calls, event creation and destruction, and records and waits on streams that do not
    /// capture are allowed during any capture: tests/workloads/sim/driver_facts.expected);
    /// then the pool takes its events for not yet complete. A capture another thread begins
    /// later waits for the request to be done (the begin hooks record the begin, then wait
    /// for the pool's lock, then begin it), so the answer holds for the whole request.
    forbidden: Cell<Option<bool>>,
    /// Recycled events.
    free_events: Vec<usize>,
    /// Every page is charged to the cap when created and given back when released (see
    /// `cap::pages`): what the device holds for the pool counts against the cap together
    /// with everything else the cap charges. A refused charge is refused growth, and the
    /// pool dissolves cached blocks instead.
    charge: bool,
    /// Bytes of pages charged to the cap and not given back.
    charged: u64,
    /// Under `VRAMSHIM_CAP_FAULT=pool-live-bytes` only (pages not charged): physical bytes the
    /// pool may hold, the process's capped total.
    limit: Option<u64>,
    /// Physical bytes held (handles created and not released).
    held: u64,
    pub calls: CallCounts,
    /// Bit `d`: device `d` has peer access to this device; every mapping is made accessible
    /// from it too.
    peers: u64,
    /// Pages mapped now (start addresses), and the reservations (start -> size): what a new
    /// peer must be granted access to, in runs that stay inside one reservation.
    mapped: BTreeSet<u64>,
    reservations: BTreeMap<u64, u64>,
}

// SAFETY: the raw handles inside are plain integers/addresses owned by this process's CUDA
// context; the pool is only used behind a lock.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    fn prop(ordinal: c_int) -> CUmemAllocationProp {
        CUmemAllocationProp {
            type_: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: CUmemAllocFlags::default(),
        }
    }

    /// `Err(why)` when the virtual-memory API is missing or refuses (fall back).
    pub(crate) fn new(ordinal: c_int, peers: u64) -> Result<CudaDevice, String> {
        let fns = Fns::resolve().ok_or_else(|| {
            "the CUDA driver has no virtual-memory API (cuMemCreate/cuMemMap/...)".to_string()
        })?;
        let prop = Self::prop(ordinal);
        let mut g: usize = 0;
        // SAFETY: valid out-pointer and property struct.
        let rc = unsafe { (fns.granularity)(&mut g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) };
        if rc != CUDA_SUCCESS || g == 0 || !g.is_power_of_two() || g < 512 {
            return Err(format!(
                "cuMemGetAllocationGranularity failed on device {ordinal} (code {rc}, granularity {g})"
            ));
        }
        let charge = (super::cap_view().charges_pages)();
        let mut limit = None;
        if !charge && let Some(total) = real::cuDeviceTotalMem_v2() {
            let mut t: usize = 0;
            // SAFETY: valid out-pointer.
            if unsafe { total(&mut t, ordinal) } == CUDA_SUCCESS && t > 0 {
                let capped = (super::cap_view().visible_total)(ordinal, t as u64);
                if capped < t as u64 {
                    limit = Some(capped);
                }
            }
        }
        Ok(CudaDevice {
            fns,
            ordinal,
            gran: g as u64,
            stream: 0,
            runtime: false,
            capturing: Cell::new(None),
            forbidden: Cell::new(None),
            free_events: Vec::new(),
            charge,
            charged: 0,
            limit,
            held: 0,
            calls: CallCounts::default(),
            peers: peers & !(1 << ordinal),
            mapped: BTreeSet::new(),
            reservations: BTreeMap::new(),
        })
    }

    fn cu_stream(s: Stream) -> CUstream {
        if s == vramshim_pool::ANY_STREAM {
            std::ptr::null_mut()
        } else if s & super::PTDS_BASE != 0 && s != vramshim_pool::ANY_STREAM {
            // Another thread's per-thread default stream has no handle here. The legacy
            // stream orders after all prior work of every blocking stream (per-thread
            // default streams are blocking), so events recorded and waited on it are a
            // conservative stand-in.
            0x1 as CUstream
        } else {
            s as usize as CUstream
        }
    }
}

impl CudaDevice {
    /// Whether work for `s` goes on the legacy stream ([`Self::cu_stream`]: no stream, the
    /// legacy stream itself, another thread's per-thread default stream).
    fn on_legacy(s: Stream) -> bool {
        matches!(Self::cu_stream(s) as usize, 0 | 0x1)
    }

    /// Whether work for `s` would go on the legacy stream while a capture is under way: the
    /// legacy stream waits for every blocking stream, a capturing one too, which CUDA
    /// refuses and which invalidates that capture.
    fn legacy_in_capture(s: Stream) -> bool {
        Self::on_legacy(s) && captures::any()
    }

    /// A new request is served (on `stream`; `runtime`: through the runtime API).
    #[inline]
    pub(crate) fn begin(&mut self, stream: Stream, runtime: bool) {
        self.stream = stream;
        self.runtime = runtime;
        self.capturing.set(None);
        self.forbidden.set(None);
        if self.charge {
            (super::cap_view().clear_refusal)();
        }
    }

    /// The old rule, testing only (`VRAMSHIM_POOL_DEBUG=sync-by-mode`): a synchronization
    /// only where the mode rules forbid the thread nothing and the request's stream does not
    /// capture (one driver query). The driver refuses a `cuCtxSynchronize` during any capture
    /// and invalidates it: under this rule the pool breaks another thread's relaxed or
    /// thread-local capture.
    fn capturing_by_mode(&self) -> bool {
        if self.forbidden() {
            return true;
        }
        self.enter();
        let Some(f) = self.fns.capturing else {
            return false;
        };
        let mut status: c_int = 0;
        // SAFETY: valid out-pointer; the stream is the caller's.
        let rc = unsafe { f(Self::cu_stream(self.stream), &mut status) };
        rc != CUDA_SUCCESS || status != 0
    }

    /// Whether a capture forbids this thread unsafe calls now (see `forbidden`).
    fn forbidden(&self) -> bool {
        if let Some(f) = self.forbidden.get() {
            return f;
        }
        let f = captures::forbid_unsafe_calls();
        self.forbidden.set(Some(f));
        f
    }

    #[inline]
    fn enter(&self) {
        if self.runtime {
            super::ensure_context_once(self.ordinal);
        }
    }
}

impl CudaDevice {
    /// Read-write for the owner and every peer.
    fn set_access_raw(&self, va: u64, size: u64) -> Result<(), DeviceError> {
        let desc = |id: c_int| CUmemAccessDesc {
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut descs = vec![desc(self.ordinal)];
        descs.extend(
            (0..64)
                .filter(|d| self.peers & (1 << d) != 0)
                .map(|d| desc(d as c_int)),
        );
        // SAFETY: a range we mapped; `descs.len()` descriptors.
        ok(unsafe { (self.fns.set_access)(va, size as usize, descs.as_ptr(), descs.len()) })
    }

    /// New peers (`peers`, a device bit set): grant them access to every page mapped now, in
    /// runs of contiguous pages inside one reservation (one call per run); later mappings
    /// include them. At once, whatever captures are under way: `cuMemSetAccess` is allowed
    /// during any capture and leaves it valid (tests/workloads/sim/driver_facts.expected).
    pub(crate) fn grant_peers(&mut self, peers: u64) -> Result<(), DeviceError> {
        let peers = peers & !(1 << self.ordinal);
        let new = peers & !self.peers;
        if new == 0 {
            return Ok(());
        }
        self.peers |= new;
        let mut run: Option<(u64, u64)> = None;
        let mut first_err = Ok(());
        let pages: Vec<u64> = self.mapped.iter().copied().collect();
        for p in pages {
            let joins = run.is_some_and(|(s, n)| s + n == p && !self.reservations.contains_key(&p));
            if joins {
                if let Some((_, n)) = run.as_mut() {
                    *n += self.gran;
                }
                continue;
            }
            if let Some((s, n)) = run.replace((p, self.gran)) {
                first_err = first_err.and(self.set_access_counted(s, n));
            }
        }
        if let Some((s, n)) = run {
            first_err = first_err.and(self.set_access_counted(s, n));
        }
        first_err
    }

    fn set_access_counted(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.enter();
        self.calls.set_access += 1;
        self.set_access_raw(va, size)
    }
}

/// The pool is forgotten without releasing its pages (`cudaDeviceReset` destroyed them with
/// the context): their charges go back. A forked child forgets its pools without dropping
/// them (the parent's charges are not the child's).
impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.charged > 0 {
            (super::cap_view().uncharge_pages)(self.ordinal, self.charged);
            self.charged = 0;
        }
    }
}

impl Device for CudaDevice {
    fn granularity(&self) -> u64 {
        self.gran
    }

    /// What the cap still allows (pages charged as created), or under the uncharged fault
    /// what the process's capped total leaves; unknown without a cap (the device's own free
    /// memory would cost a driver query on every new mapping).
    fn room(&self) -> Option<u64> {
        if self.charge {
            (super::cap_view().headroom)(self.ordinal)
        } else {
            self.limit.map(|l| l.saturating_sub(self.held))
        }
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.enter();
        self.calls.reserve += 1;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        ok(unsafe { (self.fns.reserve)(&mut p, size as usize, self.gran as usize, 0, 0) })?;
        self.reservations.insert(p, size);
        Ok(p)
    }

    fn unreserve(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.enter();
        self.calls.unreserve += 1;
        // SAFETY: a range returned by reserve.
        ok(unsafe { (self.fns.unreserve)(va, size as usize) })?;
        self.reservations.remove(&va);
        Ok(())
    }

    fn create(&mut self, pages: u64) -> Result<Handle, DeviceError> {
        let Some(bytes) = pages.checked_mul(self.gran).filter(|&b| b > 0) else {
            return Err(DeviceError::Driver(CUDA_ERROR_INVALID_VALUE));
        };
        if self
            .limit
            .is_some_and(|l| self.held.saturating_add(bytes) > l)
        {
            return Err(DeviceError::CapExceeded);
        }
        // Charged before it exists, so the device never holds more than the cap allows. (A
        // refused charge may empty the driver's pools first, a synchronization decided and made
        // under this lock, which a capture's begin waits for: `captures::under_pool_lock`.)
        let stream = Self::cu_stream(self.stream) as usize as u64;
        if self.charge
            && !captures::under_pool_lock(|| {
                (super::cap_view().charge_page)(self.ordinal, bytes, stream)
            })
        {
            return Err(DeviceError::CapExceeded);
        }
        self.enter();
        self.calls.create += 1;
        let prop = Self::prop(self.ordinal);
        let mut h: CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct.
        let rc = ok(unsafe { (self.fns.create)(&mut h, bytes as usize, &prop, 0) });
        if let Err(e) = rc {
            if self.charge {
                (super::cap_view().uncharge_pages)(self.ordinal, bytes);
            }
            return Err(e);
        }
        self.held += bytes;
        if self.charge {
            self.charged += bytes;
        }
        Ok(h)
    }

    fn release(&mut self, handle: Handle, pages: u64) -> Result<(), DeviceError> {
        let bytes = pages.saturating_mul(self.gran);
        self.enter();
        self.calls.release += 1;
        // SAFETY: a handle returned by create.
        ok(unsafe { (self.fns.release)(handle) })?;
        self.held = self.held.saturating_sub(bytes);
        if self.charge && self.charged >= bytes {
            self.charged -= bytes;
            (super::cap_view().uncharge_pages)(self.ordinal, bytes);
        }
        Ok(())
    }

    fn map(&mut self, va: u64, handle: Handle, pages: u64) -> Result<(), DeviceError> {
        let bytes = pages.saturating_mul(self.gran);
        self.enter();
        self.calls.map += 1;
        // SAFETY: va lies in a reservation of ours with `bytes` free after it; handle from
        // create, of exactly `pages` pages (mapped whole, at offset 0 into it).
        ok(unsafe { (self.fns.map)(va, bytes as usize, 0, handle, 0) })?;
        for i in 0..pages {
            self.mapped.insert(va + i * self.gran);
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.enter();
        self.calls.unmap += 1;
        // SAFETY: a range we mapped.
        ok(unsafe { (self.fns.unmap)(va, size as usize) })?;
        let gone: Vec<u64> = self.mapped.range(va..va + size).copied().collect();
        for p in gone {
            self.mapped.remove(&p);
        }
        Ok(())
    }

    fn set_access(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.enter();
        self.calls.set_access += 1;
        self.set_access_raw(va, size)
    }

    fn malloc(&mut self, _size: u64) -> Result<u64, DeviceError> {
        Err(DeviceError::Unsupported)
    }

    fn free(&mut self, _ptr: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported)
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.enter();
        if self.is_capturing() {
            return Err(DeviceError::NotPermitted);
        }
        self.calls.synchronize += 1;
        let f = self.fns.sync;
        // SAFETY: no arguments.
        ok((super::wait_view().wait)(
            self.ordinal,
            false,
            0,
            &mut || unsafe { f() },
        ))
    }

    /// Some capture is under way in the process: no synchronization (the driver refuses a
    /// `cuCtxSynchronize` during any capture, whatever its mode and thread and the caller's,
    /// and invalidates it: tests/workloads/sim/driver_facts.expected, `ctx_sync`), and no
    /// event recorded for later queries. Every begin-capture entry point is hooked and records
    /// its begin before the real call, so with none recorded no capture is under way; a
    /// stream that joined a capture joined one whose begin is recorded. A begin in flight
    /// waits for the pool's lock (held here) before its real call, unless the lock was taken
    /// without waiting for it (then it counts: `captures::ctx_sync_forbidden`).
    fn is_capturing(&self) -> bool {
        if let Some(c) = self.capturing.get() {
            return c;
        }
        let c = if captures::syncs_by_mode() {
            captures::ctx_sync_forbidden() && self.capturing_by_mode()
        } else {
            captures::ctx_sync_forbidden()
        };
        self.capturing.set(Some(c));
        c
    }
    fn record_event(&mut self, stream: Stream) -> Result<EventId, DeviceError> {
        self.enter();
        // An event recorded on a capturing stream would be part of the capture: the pool
        // could neither query nor wait on it outside it.
        if captures::capturing(stream) || Self::legacy_in_capture(stream) {
            return Err(DeviceError::NotPermitted);
        }
        let ev = match self.free_events.pop() {
            Some(e) => e,
            None => {
                let mut e: CUevent = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                ok(unsafe { (self.fns.ev_create)(&mut e, CU_EVENT_DISABLE_TIMING) })?;
                e as usize
            }
        };
        self.calls.event_record += 1;
        // SAFETY: an event of ours, the caller's stream.
        let rc = unsafe { (self.fns.ev_record)(ev as CUevent, Self::cu_stream(stream)) };
        if rc != CUDA_SUCCESS {
            self.free_events.push(ev);
            return Err(code(rc));
        }
        Ok(ev as EventId)
    }

    fn event_done(&mut self, event: EventId) -> bool {
        // `cuEventQuery` is potentially unsafe (the mode rules); not asked: not known to be done
        if self.forbidden() {
            return false;
        }
        self.enter();
        self.calls.event_query += 1;
        // SAFETY: an event of ours.
        unsafe { (self.fns.ev_query)(event as usize as CUevent) == CUDA_SUCCESS }
    }

    fn stream_wait_event(&mut self, stream: Stream, event: EventId) -> Result<(), DeviceError> {
        // A capturing stream may wait only on an event recorded in its capture (the driver
        // refuses any other and invalidates the capture); the pool's events are recorded
        // outside any.
        if captures::capturing(stream) || Self::legacy_in_capture(stream) {
            return Err(DeviceError::NotPermitted);
        }
        self.enter();
        self.calls.stream_wait += 1;
        let (f, s, e) = (
            self.fns.wait,
            Self::cu_stream(stream),
            event as usize as CUevent,
        );
        // SAFETY: an event of ours, the caller's stream.
        ok((super::wait_view().wait)(
            self.ordinal,
            true,
            s as u64,
            &mut || unsafe { f(s, e, 0) },
        ))
    }

    fn destroy_event(&mut self, event: EventId) {
        self.calls.event_destroy += 1;
        if self.free_events.len() < 256 {
            self.free_events.push(event as usize);
        } else {
            self.enter();
            // SAFETY: an event of ours, no longer referenced.
            unsafe { (self.fns.ev_destroy)(event as usize as CUevent) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_ulonglong;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The pool's work for no stream, the legacy stream (pool stream 0) and a per-thread
    /// default stream goes on the legacy stream: while a capture is under way it makes none
    /// there (the legacy stream would wait for a capturing blocking stream).
    #[test]
    fn no_stream_the_legacy_stream_and_per_thread_streams_go_on_the_legacy_stream() {
        assert!(CudaDevice::on_legacy(vramshim_pool::ANY_STREAM));
        assert!(CudaDevice::on_legacy(0));
        assert!(CudaDevice::on_legacy(super::super::PTDS_BASE | 7));
        assert!(!CudaDevice::on_legacy(0x7f00_1000));
    }

    // A driver that refuses every call it is not expected to receive, and counts the event
    // creations, event records and synchronizations it is asked for.
    static CREATED: AtomicUsize = AtomicUsize::new(0);
    static RECORDED: AtomicUsize = AtomicUsize::new(0);
    static SYNCED: AtomicUsize = AtomicUsize::new(0);
    const REFUSED: CUresult = CUDA_ERROR_INVALID_VALUE;
    unsafe extern "C" fn reserve(
        _: *mut CUdeviceptr,
        _: usize,
        _: usize,
        _: CUdeviceptr,
        _: c_ulonglong,
    ) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn range(_: CUdeviceptr, _: usize) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn create(
        _: *mut CUmemGenericAllocationHandle,
        _: usize,
        _: *const CUmemAllocationProp,
        _: c_ulonglong,
    ) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn release(_: CUmemGenericAllocationHandle) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn map(
        _: CUdeviceptr,
        _: usize,
        _: usize,
        _: CUmemGenericAllocationHandle,
        _: c_ulonglong,
    ) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn set_access(
        _: CUdeviceptr,
        _: usize,
        _: *const CUmemAccessDesc,
        _: usize,
    ) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn granularity(
        _: *mut usize,
        _: *const CUmemAllocationProp,
        _: c_int,
    ) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn sync() -> CUresult {
        SYNCED.fetch_add(1, Ordering::Relaxed);
        CUDA_SUCCESS
    }
    unsafe extern "C" fn ev_create(e: *mut CUevent, _: c_uint) -> CUresult {
        CREATED.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's out-pointer.
        unsafe { *e = 0x1000 as CUevent };
        CUDA_SUCCESS
    }
    unsafe extern "C" fn ev_record(_: CUevent, _: CUstream) -> CUresult {
        RECORDED.fetch_add(1, Ordering::Relaxed);
        CUDA_SUCCESS
    }
    unsafe extern "C" fn ev_one(_: CUevent) -> CUresult {
        REFUSED
    }
    unsafe extern "C" fn wait(_: CUstream, _: CUevent, _: c_uint) -> CUresult {
        REFUSED
    }
    /// A stream that joined a capture the process's record does not name (through an event
    /// of a capturing stream): only the driver knows it captures.
    const JOINED: u64 = 0x7f00_2000;
    static QUERIED: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn capturing(s: CUstream, status: *mut c_int) -> CUresult {
        QUERIED.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's out-pointer.
        unsafe { *status = c_int::from(s as u64 == JOINED) };
        CUDA_SUCCESS
    }

    /// A device over that driver whose potentially unsafe calls a capture forbids (as another
    /// thread's global-mode capture does); no cap.
    fn forbidden_device() -> CudaDevice {
        CudaDevice {
            fns: Fns {
                reserve,
                unreserve: range,
                create,
                release,
                map,
                unmap: range,
                set_access,
                granularity,
                sync,
                ev_create,
                ev_record,
                ev_query: ev_one,
                ev_destroy: ev_one,
                wait,
                capturing: Some(capturing),
            },
            ordinal: 0,
            gran: 2 << 20,
            stream: 0x7f00_1000,
            runtime: false,
            capturing: Cell::new(None),
            forbidden: Cell::new(Some(true)),
            free_events: Vec::new(),
            charge: false,
            charged: 0,
            limit: None,
            held: 0,
            calls: CallCounts::default(),
            peers: 0,
            mapped: BTreeSet::new(),
            reservations: BTreeMap::new(),
        }
    }

    /// While a capture forbids the thread potentially unsafe calls, the virtual-memory calls,
    /// event creation and an event record on a stream that does not capture still reach the
    /// driver (it allows them during any capture: tests/workloads/sim/driver_facts.expected);
    /// the event query does not (it is one), and the event counts as not complete. This
    /// driver refuses the virtual-memory calls with its own code: the device passes that on
    /// (no `NotPermitted` of its own), and counts each as made.
    #[test]
    fn the_virtual_memory_calls_are_made_while_a_capture_forbids_unsafe_calls() {
        let stream = 0x7f00_1000;
        let mut d = forbidden_device();
        let created = CREATED.load(Ordering::Relaxed);
        let refused = Err(DeviceError::Driver(REFUSED));
        assert_eq!(d.reserve(2 << 20).map(|_| ()), refused);
        assert_eq!(d.create(1).map(|_| ()), refused);
        assert_eq!(d.map(0x1000_0000, 7, 1), refused);
        assert_eq!(d.set_access(0x1000_0000, 2 << 20), refused);
        assert_eq!(d.unmap(0x1000_0000, 2 << 20), refused);
        assert_eq!(d.release(7, 1), refused);
        assert_eq!(d.unreserve(0x1000_0000, 2 << 20), refused);
        let c = &d.calls;
        assert_eq!(
            (
                c.reserve,
                c.create,
                c.map,
                c.set_access,
                c.unmap,
                c.release,
                c.unreserve
            ),
            (1, 1, 1, 1, 1, 1, 1),
            "a virtual-memory call was held back"
        );
        let ev = d
            .record_event(stream)
            .expect("an event on a stream that does not capture");
        assert_eq!(
            CREATED.load(Ordering::Relaxed) - created,
            1,
            "no event created"
        );
        assert!(!d.event_done(ev));
        assert_eq!(
            d.calls.event_query, 0,
            "an event query the capture forbids was made"
        );
    }

    /// No synchronization while any capture is under way in the process, whatever its mode
    /// and thread, and though the mode rules forbid the calling thread nothing and the
    /// request's stream does not capture: the driver refuses `cuCtxSynchronize` during any
    /// capture and invalidates it. The answer is the process's record of captures, with no
    /// driver query, and one per request; with none under way the device synchronizes. (The
    /// only test in this binary that records a capture.)
    #[test]
    fn no_synchronization_while_any_capture_is_under_way() {
        let mut d = forbidden_device();
        d.forbidden.set(Some(false));
        let synced = SYNCED.load(Ordering::Relaxed);
        let queried = QUERIED.load(Ordering::Relaxed);
        assert!(!captures::any(), "another test recorded a capture");
        assert!(!d.is_capturing());
        assert_eq!(d.synchronize(), Ok(()));
        assert_eq!(
            SYNCED.load(Ordering::Relaxed),
            synced + 1,
            "not synchronized"
        );

        for mode in [captures::MODE_RELAXED, captures::MODE_GLOBAL] {
            let other = 0x7f00_3000;
            captures::begun_now(other, mode);
            d.begin(0x7f00_1000, false);
            d.forbidden.set(Some(false));
            let capturing = d.is_capturing();
            let refused = d.synchronize();
            captures::ended(other);
            assert!(capturing, "mode {mode}: the capture was not seen");
            assert_eq!(refused, Err(DeviceError::NotPermitted), "mode {mode}");
            assert_eq!(
                SYNCED.load(Ordering::Relaxed),
                synced + 1,
                "mode {mode}: synchronized during the capture"
            );
            // the answer holds for the request
            assert!(d.is_capturing(), "mode {mode}");
        }
        d.begin(0x7f00_1000, false);
        assert!(!d.is_capturing(), "a capture ended is still seen");
        assert_eq!(
            QUERIED.load(Ordering::Relaxed),
            queried,
            "the driver was asked"
        );
    }
}
