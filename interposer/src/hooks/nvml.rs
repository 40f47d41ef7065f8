//! NVML memory information (`nvidia-smi`, pynvml, DCGM inside a capped process see the
//! cap). Reached as exported symbols (programs linked with `-lnvidia-ml`) and through our
//! `dlsym` hook (dlopen + dlsym, which is what pynvml and nvidia-smi do). NVML is never
//! linked: the real functions come from the already-loaded `libnvidia-ml.so.1`.

use crate::dispatch::run_hook;
use crate::ffi_types::*;
use crate::{cap, dispatch, real};
use std::ffi::{c_int, c_uint};
use vramshim_trace::Api;

/// The CUDA ordinal of an NVML device handle. NVML indexes every physical device; CUDA
/// ordinals number the devices visible to this process (`CUDA_VISIBLE_DEVICES`), in CUDA's
/// order: the two agree on PCI bus ids, so the answer is the CUDA device whose bus id names
/// this handle (None: a device this process cannot use, answered unadjusted). Only when the
/// driver cannot tell (not initialized yet: nothing is charged anywhere) is NVML's own index
/// taken.
fn cuda_ordinal_of(device: nvmlDevice_t) -> Option<i32> {
    if let Some(count) = real::cuDeviceGetCount() {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer.
        if unsafe { count(&mut n) } == CUDA_SUCCESS {
            let max = crate::counters::MAX_DEVICES as c_int;
            return (0..n.min(max)).find(|&d| super::context::nvml_handle(d) == Some(device));
        }
    }
    nvml_index(device)
}

fn nvml_index(device: nvmlDevice_t) -> Option<i32> {
    let f = real::nvmlDeviceGetIndex()?;
    let mut i: c_uint = 0;
    // SAFETY: i is a valid out-pointer; device is the caller's handle.
    let rc = unsafe { f(device, &mut i) };
    (rc == NVML_SUCCESS).then_some(i as i32)
}

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
            dispatch::meminfo(
                tok,
                Api::NvmlDeviceGetMemoryInfo,
                || cuda_ordinal_of(device),
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
            dispatch::meminfo(
                tok,
                Api::NvmlDeviceGetMemoryInfoV2,
                || cuda_ordinal_of(device),
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
