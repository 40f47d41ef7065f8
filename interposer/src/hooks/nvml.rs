//! NVML memory information (`nvidia-smi`, pynvml, DCGM inside a capped process see the
//! cap). Reached as exported symbols (programs linked with `-lnvidia-ml`) and through our
//! `dlsym` hook (dlopen + dlsym, which is what pynvml and nvidia-smi do). NVML is never
//! linked: the real functions come from the already-loaded `libnvidia-ml.so.1`.

use super::Site;
use crate::cuda::types::*;
use crate::pipeline::run_hook;
use crate::{cap, pipeline};
use std::ffi::c_int;
use vramshim_trace::Api;

/// The NVML memory structures: what the real call reports, and the cap's answer written
/// back in place.
trait NvmlMemory: Copy {
    /// (free, total) as the real call reported them.
    fn free_total(&self) -> (u64, u64);
    /// Replace the figures the real call wrote with the cap's view of `dev`.
    fn adjust(&mut self, dev: i32);
}

impl NvmlMemory for nvmlMemory_t {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn adjust(&mut self, dev: i32) {
        (self.total, self.free, self.used) =
            cap::nvml_adjust(dev, self.total, self.free, self.used);
    }
}

impl NvmlMemory for nvmlMemory_v2_t {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn adjust(&mut self, dev: i32) {
        (self.total, self.reserved, self.free, self.used) =
            cap::nvml_adjust_v2(dev, self.total, self.reserved, self.free, self.used);
    }
}

/// The shared body of the memory-information hooks: the real query (`call`), then the
/// cap's view of the CUDA device with the handle's PCI bus id written over it.
fn memory_info<F: Copy, M: NvmlMemory>(
    h: Site<F>,
    api: Api,
    device: nvmlDevice_t,
    mem: *mut M,
    call: impl Fn(F) -> c_int,
) -> c_int {
    let f = match h.real() {
        Ok(f) => f,
        Err(missing) => return missing,
    };
    run_hook(
        h.name,
        NVML_ERROR_UNKNOWN,
        || call(f),
        |tok| {
            pipeline::meminfo(
                tok,
                api,
                || crate::cuda::nvml::cuda_ordinal_of(device),
                || {
                    let rc = call(f);
                    if rc != NVML_SUCCESS || mem.is_null() {
                        return (rc, None, None);
                    }
                    // SAFETY: non-null struct the real call just filled.
                    let (free, total) = unsafe { *mem }.free_total();
                    (rc, Some(free), Some(total))
                },
                |dev, _, _| {
                    if !mem.is_null() && dev >= 0 {
                        // SAFETY: non-null struct supplied by the caller, just filled.
                        unsafe { &mut *mem }.adjust(dev);
                    }
                },
            )
        },
    )
}

hooks! {
    ["nvmlDeviceGetMemoryInfo", 0]
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, mem: *mut nvmlMemory_t) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(h, Api::NvmlDeviceGetMemoryInfo, device, mem, |f| unsafe { f(device, mem) })
    }

    ["nvmlDeviceGetMemoryInfo_v2", 0]
    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(h, Api::NvmlDeviceGetMemoryInfoV2, device, mem, |f| unsafe { f(device, mem) })
    }
}
