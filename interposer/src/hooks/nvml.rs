//! NVML memory information (`nvidia-smi`, pynvml, DCGM inside a capped process see the
//! cap). Reached as exported symbols (programs linked with `-lnvidia-ml`) and through our
//! `dlsym` hook (dlopen + dlsym, which is what pynvml and nvidia-smi do). NVML is never
//! linked: the real functions come from the already-loaded `libnvidia-ml.so.1`.

use crate::cuda::real;
use crate::cuda::types::*;
use crate::pipeline::run_hook;
use crate::{cap, pipeline};
use std::ffi::c_int;
use vramshim_trace::Api;

/// # Safety
/// C ABI: `nvmlDeviceGetMemoryInfo`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> c_int {
    let Some(f) = real::nvmlDeviceGetMemoryInfo() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    run_hook(
        "nvmlDeviceGetMemoryInfo",
        NVML_ERROR_UNKNOWN,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(device, mem) },
        |tok| {
            let used_real = std::cell::Cell::new(0u64);
            pipeline::meminfo(
                tok,
                Api::NvmlDeviceGetMemoryInfo,
                || crate::cuda::nvml::cuda_ordinal_of(device),
                || {
                    // SAFETY: forwarding the caller's arguments unchanged.
                    let rc = unsafe { f(device, mem) };
                    if rc != NVML_SUCCESS || mem.is_null() {
                        return (rc, None, None);
                    }
                    // SAFETY: non-null struct the real call just filled.
                    let m = unsafe { *mem };
                    used_real.set(m.used);
                    (rc, Some(m.free), Some(m.total))
                },
                |dev, _, _| {
                    if !mem.is_null() && dev >= 0 {
                        // SAFETY: non-null struct supplied by the caller, just filled.
                        let m = unsafe { &mut *mem };
                        let (t, f, u) = cap::nvml_adjust(dev, m.total, m.free, used_real.get());
                        m.total = t;
                        m.free = f;
                        m.used = u;
                    }
                },
            )
        },
    )
}

/// # Safety
/// C ABI: `nvmlDeviceGetMemoryInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> c_int {
    let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    run_hook(
        "nvmlDeviceGetMemoryInfo_v2",
        NVML_ERROR_UNKNOWN,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(device, mem) },
        |tok| {
            pipeline::meminfo(
                tok,
                Api::NvmlDeviceGetMemoryInfoV2,
                || crate::cuda::nvml::cuda_ordinal_of(device),
                || {
                    // SAFETY: forwarding the caller's arguments unchanged.
                    let rc = unsafe { f(device, mem) };
                    if rc != NVML_SUCCESS || mem.is_null() {
                        return (rc, None, None);
                    }
                    // SAFETY: non-null struct the real call just filled.
                    let m = unsafe { *mem };
                    (rc, Some(m.free), Some(m.total))
                },
                |dev, _, _| {
                    if !mem.is_null() && dev >= 0 {
                        // SAFETY: non-null struct supplied by the caller, just filled.
                        let m = unsafe { &mut *mem };
                        let (t, r, f, u) =
                            cap::nvml_adjust_v2(dev, m.total, m.reserved, m.free, m.used);
                        m.total = t;
                        m.reserved = r;
                        m.free = f;
                        m.used = u;
                    }
                },
            )
        },
    )
}
