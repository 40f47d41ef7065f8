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
    /// The capture query's answer for the request being served: the pool asks before each
    /// synchronization it considers, and the answer cannot change within one call (a
    /// capture begins only in a call of the program's own), so one query per call suffices;
    /// none while no capture is under way (see [`Device::is_capturing`]).
    capturing: Cell<Option<bool>>,
    /// Whether a stream capture under way, on any thread, forbids the calling thread
    /// potentially unsafe calls (`captures`): asked once per request served, when first
    /// needed. Then the pool makes none: no synchronization, event query, event creation or
    /// virtual-memory call (each would fail and invalidate the capture); it serves only from
    /// what it holds. A capture another thread begins later waits for the request to be done
    /// (the begin hooks record the capture, then wait for the pool's lock, then begin it), so
    /// the answer holds for the whole request.
    forbidden: Cell<Option<bool>>,
    /// Calls refused for it while serving the request.
    refused: Cell<u32>,
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
    /// Peers not yet granted access to the pages mapped before their grant: a capture forbade
    /// the calls then (see [`Self::grant_peers`]).
    pub(crate) ungranted: u64,
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
            refused: Cell::new(0),
            free_events: Vec::new(),
            charge,
            charged: 0,
            limit,
            held: 0,
            calls: CallCounts::default(),
            peers: peers & !(1 << ordinal),
            ungranted: 0,
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
        self.refused.set(0);
        if self.charge {
            (super::cap_view().clear_refusal)();
        }
    }

    /// Is the request's stream capturing? (One driver query.)
    fn query_capture(&self) -> bool {
        self.enter();
        let Some(f) = self.fns.capturing else {
            return false;
        };
        let mut status: c_int = 0;
        // SAFETY: valid out-pointer; the stream is the caller's.
        let rc = unsafe { f(Self::cu_stream(self.stream), &mut status) };
        // an error here (e.g. an illegal query during a global-mode capture) counts as
        // capturing: never synchronize when unsure
        rc != CUDA_SUCCESS || status != 0
    }

    /// Whether a capture forbids this thread unsafe calls now (see `forbidden`).
    fn forbidden(&self) -> bool {
        if let Some(f) = self.forbidden.get() {
            return f;
        }
        let f = !super::other_captures_ignored() && captures::forbid_unsafe_calls();
        self.forbidden.set(Some(f));
        f
    }

    /// `Err` (counted, no driver call) when a capture forbids this thread unsafe calls.
    fn unsafe_call(&self) -> Result<(), DeviceError> {
        if self.forbidden() {
            self.refused.set(self.refused.get() + 1);
            return Err(DeviceError::NotPermitted);
        }
        Ok(())
    }

    /// Calls refused because a capture forbade them while serving the request.
    pub(crate) fn refused(&self) -> u32 {
        self.refused.get()
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
    /// include them. While a stream capture forbids the calling thread potentially unsafe calls
    /// (`cuMemSetAccess` is a virtual-memory call: it would fail and invalidate the capture)
    /// the grant of the pages mapped now is owed (`ungranted`), and made by a later call
    /// (`pool::grant_owed_peers`, after a capture ends); `grant_in_capture` (testing only)
    /// makes it at once.
    pub(crate) fn grant_peers(
        &mut self,
        peers: u64,
        grant_in_capture: bool,
    ) -> Result<(), DeviceError> {
        let peers = peers & !(1 << self.ordinal);
        let new = peers & !self.peers;
        if new | self.ungranted == 0 {
            return Ok(());
        }
        self.peers |= new;
        if !grant_in_capture && self.forbidden() {
            self.ungranted |= new;
            return Ok(());
        }
        self.ungranted = 0;
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
        self.unsafe_call()?;
        self.enter();
        self.calls.reserve += 1;
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer.
        ok(unsafe { (self.fns.reserve)(&mut p, size as usize, self.gran as usize, 0, 0) })?;
        self.reservations.insert(p, size);
        Ok(p)
    }

    fn unreserve(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.unsafe_call()?;
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
        self.unsafe_call()?;
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
        self.unsafe_call()?;
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
        self.unsafe_call()?;
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
        self.unsafe_call()?;
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
        self.unsafe_call()?;
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

    /// The request's stream captures, or a capture forbids this thread unsafe calls: either
    /// way no synchronization and no event recorded for later queries.
    fn is_capturing(&self) -> bool {
        if self.forbidden() {
            return true;
        }
        if let Some(c) = self.capturing.get() {
            return c;
        }
        // With no capture under way in the process the driver has nothing to answer: every
        // begin-capture entry point is hooked and records a begin in flight (counted as under
        // way) before the real call, then waits for the pool's lock (held here), so a capture
        // that begins later begins after this request. While one is under way the driver is asked: it knows the
        // streams a capture joined (and the legacy stream's dependence on a capturing
        // blocking stream), which the record does not.
        let c = captures::any() && self.query_capture();
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
                self.unsafe_call()?;
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
        // not asked: not known to be done
        if self.unsafe_call().is_err() {
            return false;
        }
        self.enter();
        self.calls.event_query += 1;
        // SAFETY: an event of ours.
        unsafe { (self.fns.ev_query)(event as usize as CUevent) == CUDA_SUCCESS }
    }

    fn stream_wait_event(&mut self, stream: Stream, event: EventId) -> Result<(), DeviceError> {
        if Self::legacy_in_capture(stream) {
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
        if self.free_events.len() < 256 || self.forbidden() {
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

    /// A device over that driver whose unsafe calls a capture forbids (as another thread's
    /// global-mode capture does); no cap.
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
            refused: Cell::new(0),
            free_events: Vec::new(),
            charge: false,
            charged: 0,
            limit: None,
            held: 0,
            calls: CallCounts::default(),
            peers: 0,
            ungranted: 0,
            mapped: BTreeSet::new(),
            reservations: BTreeMap::new(),
        }
    }

    /// The device's counts say what reached the driver: an event record whose event a
    /// capture kept from being created, and a synchronization the capture forbade, are not
    /// counted; a record on a recycled event (no creation needed) is.
    #[test]
    fn calls_a_capture_forbids_are_not_counted() {
        let stream = 0x7f00_1000;
        let mut d = forbidden_device();
        let before = (
            CREATED.load(Ordering::Relaxed),
            RECORDED.load(Ordering::Relaxed),
            SYNCED.load(Ordering::Relaxed),
        );
        assert_eq!(d.record_event(stream), Err(DeviceError::NotPermitted));
        assert_eq!(d.synchronize(), Err(DeviceError::NotPermitted));
        assert_eq!(
            (d.calls.event_record, d.calls.synchronize),
            (0, 0),
            "counted without a driver call"
        );
        d.free_events.push(0x2000);
        assert!(d.record_event(stream).is_ok());
        assert_eq!(d.calls.event_record, 1);
        assert_eq!(
            (
                CREATED.load(Ordering::Relaxed) - before.0,
                RECORDED.load(Ordering::Relaxed) - before.1,
                SYNCED.load(Ordering::Relaxed) - before.2
            ),
            (0, 1, 0),
            "the driver's own count"
        );
    }

    /// The capture query: none while the process has no capture under way (no driver call
    /// per synchronization); while one is, the driver is asked about the request's stream,
    /// and a stream the record does not name but the driver says captures gets no
    /// synchronization. (The only test in this binary that records a capture.)
    #[test]
    fn the_driver_is_asked_about_captures_only_while_one_is_under_way() {
        let mut d = forbidden_device();
        d.forbidden.set(Some(false));
        d.stream = JOINED;
        let synced = SYNCED.load(Ordering::Relaxed);
        let queried = QUERIED.load(Ordering::Relaxed);
        assert!(!captures::any(), "another test recorded a capture");
        assert!(!d.is_capturing());
        assert_eq!(
            QUERIED.load(Ordering::Relaxed),
            queried,
            "asked with none under way"
        );

        let other = 0x7f00_3000;
        captures::begun_now(other, captures::MODE_RELAXED);
        d.capturing.set(None);
        let joined = d.is_capturing();
        let refused = d.synchronize();
        captures::ended(other);
        assert!(joined, "the joined stream's capture was not seen");
        assert_eq!(refused, Err(DeviceError::NotPermitted));
        assert_eq!(
            SYNCED.load(Ordering::Relaxed),
            synced,
            "synchronized during the capture"
        );
        assert_eq!(
            QUERIED.load(Ordering::Relaxed),
            queried + 1,
            "one query a request"
        );
    }
}
