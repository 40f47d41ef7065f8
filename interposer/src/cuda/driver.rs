//! What the cap asks of the devices, from the real driver (never our hooks): total memory,
//! device count, UUID, PCI address, whether a stream captures, and the settling of the
//! driver's memory pools. Each query initialises the driver with `cuInit(0)` if the process
//! has not done it yet (the runtime does the same on its first call; calling it twice is
//! harmless).

use std::ffi::{c_char, c_int};

use crate::cuda::real::{self, Lib, Slot};
use crate::cuda::types::{
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUstream, PfnCuMemPoolGetAttribute,
    PfnCuMemPoolTrimTo,
};

type PfnCuInit = unsafe extern "C" fn(u32) -> c_int;
type PfnCuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;
type PfnCuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type PfnCuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;

// Functions only these queries call, resolved like the hooks' (`real::Slot`).
static CU_INIT: Slot = Slot::new(c"cuInit", Lib::Driver);
static CU_DEVICE_GET_UUID_V2: Slot = Slot::new(c"cuDeviceGetUuid_v2", Lib::Driver);
static CU_DEVICE_GET_UUID: Slot = Slot::new(c"cuDeviceGetUuid", Lib::Driver);
static CU_DEVICE_GET: Slot = Slot::new(c"cuDeviceGet", Lib::Driver);
static CU_DEVICE_GET_NAME: Slot = Slot::new(c"cuDeviceGetName", Lib::Driver);

/// The real `cuInit(0)`'s answer (None: the driver has no cuInit). Once start-up failed, it
/// answers that failure again.
pub(crate) fn init() -> Option<c_int> {
    let a = CU_INIT.get();
    if a == 0 {
        return None;
    }
    // SAFETY: `a` is the driver's cuInit, whose ABI is PfnCuInit.
    let f = unsafe { std::mem::transmute::<usize, PfnCuInit>(a) };
    // SAFETY: cuInit(0) has no pointer arguments.
    Some(unsafe { f(0) })
}

fn cu_init() -> bool {
    init() == Some(CUDA_SUCCESS)
}

/// Runs `call`, initialising the driver and retrying once if it was not initialised.
fn with_init(mut call: impl FnMut() -> c_int) -> bool {
    match call() {
        CUDA_SUCCESS => true,
        CUDA_ERROR_NOT_INITIALIZED => cu_init() && call() == CUDA_SUCCESS,
        _ => false,
    }
}

/// Real total memory of `device`.
pub(crate) fn total(device: i32) -> Option<u64> {
    let f = real::cuDeviceTotalMem_v2()?;
    let mut bytes: usize = 0;
    // SAFETY: bytes is a valid out-pointer; the driver checks the ordinal.
    let ok = with_init(|| unsafe { f(&mut bytes, device) });
    (ok && bytes > 0).then_some(bytes as u64)
}

/// Number of devices the process sees.
pub(crate) fn count() -> Option<i32> {
    let f = real::cuDeviceGetCount()?;
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    let ok = with_init(|| unsafe { f(&mut n) });
    ok.then_some(n)
}

/// The device's UUID (`cuDeviceGetUuid_v2`: a MIG instance's own; else `cuDeviceGetUuid`,
/// the parent GPU's).
pub(crate) fn uuid(device: i32) -> Option<[u8; 16]> {
    let f = uuid_fn()?;
    let mut id = [0u8; 16];
    // SAFETY: id is a valid 16-byte out-pointer; the driver checks the ordinal.
    with_init(|| unsafe { f(&mut id, device) }).then_some(id)
}

fn uuid_fn() -> Option<PfnCuDeviceGetUuid> {
    let a = match CU_DEVICE_GET_UUID_V2.get() {
        0 => CU_DEVICE_GET_UUID.get(),
        a => a,
    };
    // SAFETY: `a` is the driver's cuDeviceGetUuid(_v2), whose ABI is PfnCuDeviceGetUuid
    // (CUuuid is 16 bytes).
    (a != 0).then(|| unsafe { std::mem::transmute::<usize, PfnCuDeviceGetUuid>(a) })
}

/// The device's PCI address as the driver writes it (`0000:01:00.0`), for matching the
/// cgroup's dmem regions.
pub(crate) fn pci_bus_id(device: i32) -> Option<String> {
    let f = real::cuDeviceGetPCIBusId()?;
    let mut buf = [0 as c_char; 32];
    // SAFETY: buf is a valid out-buffer of the length passed; the driver checks the ordinal
    // and writes a NUL-terminated string of at most that length.
    let ok = with_init(|| unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, device) });
    if !ok {
        return None;
    }
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8(bytes).ok()
}

/// Whether a synchronization of the context would break a capture: one is under way in the
/// process (`captures::ctx_sync_forbidden`). Under `VRAMSHIM_POOL_DEBUG=sync-by-mode` (testing
/// only) the old rule, [`capturing`].
fn sync_would_break_a_capture(stream: u64) -> bool {
    if super::captures::syncs_by_mode() {
        capturing(stream)
    } else {
        super::captures::ctx_sync_forbidden()
    }
}

/// Whether `stream` or the legacy stream is capturing, or the driver cannot say (an error
/// counts as capturing), or a capture on another stream forbids the calling thread
/// potentially unsafe calls by the mode rules (`captures`): the cap waits for room only
/// while none is. False without the query. Not the rule for a synchronization of the
/// context: see [`sync_would_break_a_capture`].
pub(crate) fn capturing(stream: u64) -> bool {
    if super::captures::forbid_unsafe_calls() {
        return true;
    }
    let Some(query) = real::cuStreamIsCapturing() else {
        return false;
    };
    for s in [stream, 0] {
        let mut status: c_int = 0;
        // SAFETY: valid out-pointer; the stream is the request's own (or the legacy one).
        let rc = unsafe { query(s as usize as CUstream, &mut status) };
        if rc != CUDA_SUCCESS || status != 0 {
            return true;
        }
    }
    false
}

/// Empties the driver's memory pools of `device` of the blocks they keep cached: waits for
/// the device's pending work (so that stream-ordered frees reach their pools), trims every
/// pool the process may have used to zero, and returns what they still cache (reserved
/// minus used bytes; 0 = nothing). `None`, having done nothing, while a stream capture is
/// under way in the process, whatever its mode and thread (the driver refuses the
/// synchronization during any capture and invalidates it:
/// tests/workloads/sim/driver_facts.expected, `ctx_sync`), when `device` is not the current
/// context's, or when the driver lacks a function. The question, the synchronization and the
/// trims (`cuMemPoolTrimTo` is potentially unsafe too) are one section a begin-capture call on
/// another thread waits for (`captures::gated`): no capture begins between them.
pub(crate) fn settle_pools(device: i32, stream: u64) -> Option<u64> {
    real::cuStreamIsCapturing()?;
    let get_device = real::cuCtxGetDevice()?;
    let sync = real::cuCtxSynchronize()?;
    let trim = real::cuMemPoolTrimTo()?;
    let attr = real::cuMemPoolGetAttribute()?;
    super::captures::gated(|| {
        if sync_would_break_a_capture(stream) {
            return None;
        }
        let mut current: c_int = -1;
        // SAFETY: valid out-pointer.
        if unsafe { get_device(&mut current) } != CUDA_SUCCESS || current != device {
            return None;
        }
        // SAFETY: no arguments; no capture is under way (checked above).
        if unsafe { sync() } != CUDA_SUCCESS {
            return None;
        }
        trim_and_measure(device, trim, attr)
    })
}

/// `settle_pools` after its synchronization: every pool of `device` trimmed to zero, and
/// what they still cache.
fn trim_and_measure(
    device: i32,
    trim: PfnCuMemPoolTrimTo,
    attr: PfnCuMemPoolGetAttribute,
) -> Option<u64> {
    let mut cached = 0u64;
    for pool in crate::cuda::mempools::pools_of(device) {
        // SAFETY: a pool handle the driver gave; a stale one answers an error, skipped.
        if unsafe { trim(pool, 0) } != CUDA_SUCCESS {
            continue;
        }
        let (mut reserved, mut used) = (0u64, 0u64);
        // SAFETY: both attributes are cuuint64_t, written through valid out-pointers.
        let ok = unsafe {
            attr(
                pool,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            ) == CUDA_SUCCESS
                && attr(
                    pool,
                    CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                    (&mut used as *mut u64).cast(),
                ) == CUDA_SUCCESS
        };
        if !ok {
            return None;
        }
        cached = cached.saturating_add(reserved.saturating_sub(used));
    }
    Some(cached)
}

/// A device as the trace header describes it.
pub(crate) struct Device {
    pub index: i32,
    pub name: String,
    /// 0 when the driver did not say.
    pub total_bytes: u64,
    pub uuid: Option<[u8; 16]>,
}

/// The devices, only if the process already loaded and initialised the driver (empty
/// otherwise: this never loads or initialises it).
pub(crate) fn devices_if_initialised() -> Vec<Device> {
    if real::libcuda_if_loaded().is_null() {
        return Vec::new();
    }
    let (Some(count), Some(total)) = (real::cuDeviceGetCount(), real::cuDeviceTotalMem_v2()) else {
        return Vec::new();
    };
    let (get, name) = (CU_DEVICE_GET.get(), CU_DEVICE_GET_NAME.get());
    if get == 0 || name == 0 {
        return Vec::new();
    }
    // SAFETY: the addresses are the real driver functions of these names, with these ABIs.
    let (get, name) = unsafe {
        (
            std::mem::transmute::<usize, PfnCuDeviceGet>(get),
            std::mem::transmute::<usize, PfnCuDeviceGetName>(name),
        )
    };
    let uuid = uuid_fn();
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.clamp(0, super::MAX_DEVICES as c_int) {
        let mut dev: c_int = -1;
        // SAFETY: dev is a valid out-pointer.
        if unsafe { get(&mut dev, i) } != CUDA_SUCCESS {
            continue;
        }
        let mut buf = [0u8; 256];
        // SAFETY: buf is writable for the length passed.
        let rc = unsafe { name(buf.as_mut_ptr() as *mut c_char, buf.len() as c_int - 1, dev) };
        let nm = if rc == CUDA_SUCCESS {
            let k = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..k]).into_owned()
        } else {
            String::new()
        };
        let mut bytes: usize = 0;
        // SAFETY: bytes is a valid out-pointer.
        let rc = unsafe { total(&mut bytes, dev) };
        let id = uuid.and_then(|f| {
            let mut id = [0u8; 16];
            // SAFETY: id is a valid 16-byte out-pointer; the driver checks the ordinal.
            (unsafe { f(&mut id, dev) } == CUDA_SUCCESS).then_some(id)
        });
        out.push(Device {
            index: i,
            name: nm,
            total_bytes: if rc == CUDA_SUCCESS { bytes as u64 } else { 0 },
            uuid: id,
        });
    }
    out
}
