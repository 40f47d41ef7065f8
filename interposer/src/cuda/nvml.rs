//! NVML as the layers see it: the NVML device of a CUDA device and back (they agree on
//! PCI bus ids, whatever the enumeration order and `CUDA_VISIBLE_DEVICES`), and the
//! device's free memory without a context. Real calls only, never our hooks.

use crate::cuda::real;
use crate::cuda::types::*;
use std::ffi::{c_char, c_int, c_uint};

/// NVML's handle for CUDA device `dev`: by PCI bus id (what CUDA and NVML agree on whatever
/// the enumeration order and `CUDA_VISIBLE_DEVICES`), else by index. NVML initialized.
pub(crate) fn handle(dev: CUdevice) -> Option<nvmlDevice_t> {
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    if let (Some(bus), Some(by_bus)) = (
        real::cuDeviceGetPCIBusId(),
        real::nvmlDeviceGetHandleByPciBusId_v2(),
    ) {
        let mut id = [0 as c_char; 64];
        // SAFETY: id holds 64 bytes; h is a valid out-pointer.
        unsafe {
            if bus(id.as_mut_ptr(), id.len() as c_int, dev) == CUDA_SUCCESS
                && by_bus(id.as_ptr(), &mut h) == NVML_SUCCESS
            {
                return Some(h);
            }
        }
    }
    let by_index = real::nvmlDeviceGetHandleByIndex_v2()?;
    // SAFETY: h is a valid out-pointer.
    (unsafe { by_index(dev as c_uint, &mut h) } == NVML_SUCCESS).then_some(h)
}

/// The device's free memory as NVML reports it (no context needed).
pub(crate) fn free_bytes(dev: CUdevice) -> Option<u64> {
    let init = real::nvmlInit_v2()?;
    let shutdown = real::nvmlShutdown()?;
    let info = real::nvmlDeviceGetMemoryInfo()?;
    // SAFETY: plain NVML calls with valid out-pointers; init/shutdown are balanced.
    unsafe {
        if init() != NVML_SUCCESS {
            return None;
        }
        let mut m = nvmlMemory_t::default();
        let ok = handle(dev).is_some_and(|h| info(h, &mut m) == NVML_SUCCESS);
        shutdown();
        ok.then_some(m.free)
    }
}

/// The CUDA ordinal of an NVML device handle. NVML indexes every physical device; CUDA
/// ordinals number the devices visible to this process (`CUDA_VISIBLE_DEVICES`), in CUDA's
/// order: the two agree on PCI bus ids, so the answer is the CUDA device whose bus id names
/// this handle (None: a device this process cannot use, answered unadjusted). Only when the
/// driver cannot tell (not initialized yet: nothing is charged anywhere) is NVML's own index
/// taken.
pub(crate) fn cuda_ordinal_of(device: nvmlDevice_t) -> Option<i32> {
    if let Some(count) = real::cuDeviceGetCount() {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out-pointer.
        if unsafe { count(&mut n) } == CUDA_SUCCESS {
            let max = super::MAX_DEVICES as c_int;
            return (0..n.min(max)).find(|&d| handle(d) == Some(device));
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
