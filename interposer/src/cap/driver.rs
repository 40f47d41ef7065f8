//! The default [`DeviceQueries`](super::DeviceQueries): the real driver (never our hooks),
//! initialised with `cuInit(0)` if the process has not done it yet (the runtime does the
//! same on its first call; calling it twice is harmless).

use std::ffi::c_int;

use crate::cuda::real;
use crate::cuda::types::{
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, CUstream,
};

type PfnCuInit = unsafe extern "C" fn(u32) -> c_int;
type PfnCuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;

fn cu_init() -> bool {
    let a = real::driver_symbol(c"cuInit");
    if a == 0 {
        return false;
    }
    // SAFETY: `a` is the driver's cuInit, whose ABI is PfnCuInit.
    let f = unsafe { std::mem::transmute::<usize, PfnCuInit>(a) };
    // SAFETY: cuInit(0) has no pointer arguments.
    unsafe { f(0) == CUDA_SUCCESS }
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
    let a = real::driver_symbol(c"cuDeviceGetCount");
    if a == 0 {
        return None;
    }
    // SAFETY: `a` is the driver's cuDeviceGetCount, whose ABI is PfnCuDeviceGetCount.
    let f = unsafe { std::mem::transmute::<usize, PfnCuDeviceGetCount>(a) };
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    let ok = with_init(|| unsafe { f(&mut n) });
    ok.then_some(n)
}

type PfnCuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;

/// The device's UUID (`cuDeviceGetUuid_v2`: a MIG instance's own; else `cuDeviceGetUuid`).
pub(crate) fn uuid(device: i32) -> Option<[u8; 16]> {
    let a = match real::driver_symbol(c"cuDeviceGetUuid_v2") {
        0 => real::driver_symbol(c"cuDeviceGetUuid"),
        a => a,
    };
    if a == 0 {
        return None;
    }
    // SAFETY: `a` is the driver's cuDeviceGetUuid(_v2), whose ABI is PfnCuDeviceGetUuid
    // (CUuuid is 16 bytes).
    let f = unsafe { std::mem::transmute::<usize, PfnCuDeviceGetUuid>(a) };
    let mut id = [0u8; 16];
    // SAFETY: id is a valid 16-byte out-pointer; the driver checks the ordinal.
    with_init(|| unsafe { f(&mut id, device) }).then_some(id)
}

type PfnCuDeviceGetPciBusId = unsafe extern "C" fn(*mut std::ffi::c_char, c_int, c_int) -> c_int;

/// The device's PCI address as the driver writes it (`0000:01:00.0`), for matching the
/// cgroup's dmem regions.
pub fn pci_bus_id(device: i32) -> Option<String> {
    let a = real::driver_symbol(c"cuDeviceGetPCIBusId");
    if a == 0 {
        return None;
    }
    // SAFETY: `a` is the driver's cuDeviceGetPCIBusId, whose ABI is PfnCuDeviceGetPciBusId.
    let f = unsafe { std::mem::transmute::<usize, PfnCuDeviceGetPciBusId>(a) };
    let mut buf = [0 as std::ffi::c_char; 32];
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

/// Whether `stream` or the legacy stream is capturing, or the driver cannot say (an error
/// counts as capturing: never synchronize when unsure). False without the query.
pub(crate) fn capturing(stream: u64) -> bool {
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

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: u32,
    used_gpu_memory: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

type PfnNvmlInit = unsafe extern "C" fn() -> c_int;
type PfnNvmlProcesses =
    unsafe extern "C" fn(*mut std::ffi::c_void, *mut u32, *mut ProcessInfo) -> c_int;

/// Device memory this process holds on `device` according to NVML's per-process accounting
/// (context, modules and allocations alike): how the cap measures a context's footprint.
/// `None` when NVML is missing, or does not list this process (a pid namespace NVML does not
/// see into, or no context yet). The NVML device is the one with the CUDA device's PCI bus id
/// (NVML ignores `CUDA_VISIBLE_DEVICES`, so its index is not the CUDA ordinal).
pub(crate) fn process_used(device: i32) -> Option<u64> {
    let h = nvml_handle()?;
    let sym = |n: &std::ffi::CStr| real::dlsym_real(h, n) as usize;
    let init = sym(c"nvmlInit_v2");
    let procs = match sym(c"nvmlDeviceGetComputeRunningProcesses_v3") {
        0 => sym(c"nvmlDeviceGetComputeRunningProcesses_v2"),
        a => a,
    };
    if init == 0 || procs == 0 {
        return None;
    }
    // SAFETY: the addresses are NVML's functions of those names, with these ABIs.
    let (init, procs) = unsafe {
        (
            std::mem::transmute::<usize, PfnNvmlInit>(init),
            std::mem::transmute::<usize, PfnNvmlProcesses>(procs),
        )
    };
    // SAFETY: nvmlInit_v2 takes no arguments (reference-counted, harmless to repeat).
    if unsafe { init() } != 0 {
        return None;
    }
    let dev = crate::cuda::nvml::handle(device)?;
    // As many entries as the device has processes (a machine can run hundreds): NVML says
    // how many when the buffer is too small.
    const INSUFFICIENT_SIZE: i32 = 7;
    let mut infos = vec![ProcessInfo::default(); 128];
    let mut n = infos.len() as u32;
    for _ in 0..3 {
        // SAFETY: n is the capacity of infos, both valid.
        match unsafe { procs(dev, &mut n, infos.as_mut_ptr()) } {
            0 => break,
            INSUFFICIENT_SIZE if (n as usize) > infos.len() && n <= 1 << 16 => {
                infos = vec![ProcessInfo::default(); n as usize + 16];
                n = infos.len() as u32;
            }
            _ => return None,
        }
    }
    let me = std::process::id();
    infos[..(n as usize).min(infos.len())]
        .iter()
        .find(|p| p.pid == me)
        .map(|p| p.used_gpu_memory)
        .filter(|&u| u > 0 && u != u64::MAX)
}

fn nvml_handle() -> Option<*mut std::ffi::c_void> {
    for name in [c"libnvidia-ml.so.1", c"libnvidia-ml.so"] {
        for flags in [
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
            libc::RTLD_NOW | libc::RTLD_NODELETE,
        ] {
            // SAFETY: dlopen with a valid name; NODELETE keeps the handle valid for the process.
            let h = unsafe { libc::dlopen(name.as_ptr(), flags) };
            if !h.is_null() {
                return Some(h);
            }
        }
    }
    // SAFETY: clears the dlerror state our failed dlopen left behind.
    unsafe { libc::dlerror() };
    None
}

/// Empties the driver's memory pools of `device` of the blocks they keep cached: waits for
/// the device's pending work (so that stream-ordered frees reach their pools), trims every
/// pool the process may have used to zero, and returns what they still cache (reserved
/// minus used bytes; 0 = nothing). `None`, having done nothing, when a stream capture is
/// underway on `stream` or the legacy stream (synchronizing then would break the capture;
/// an error of the query counts as a capture), when `device` is not the current context's,
/// or when the driver lacks a function.
pub(crate) fn settle_pools(device: i32, stream: u64) -> Option<u64> {
    real::cuStreamIsCapturing()?;
    let get_device = real::cuCtxGetDevice()?;
    let sync = real::cuCtxSynchronize()?;
    let trim = real::cuMemPoolTrimTo()?;
    let attr = real::cuMemPoolGetAttribute()?;
    if capturing(stream) {
        return None;
    }
    let mut current: c_int = -1;
    // SAFETY: valid out-pointer.
    if unsafe { get_device(&mut current) } != CUDA_SUCCESS || current != device {
        return None;
    }
    // SAFETY: no arguments; no capture is underway (checked above).
    if unsafe { sync() } != CUDA_SUCCESS {
        return None;
    }
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
