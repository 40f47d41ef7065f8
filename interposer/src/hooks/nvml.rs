//! NVML memory information (`nvidia-smi`, pynvml, DCGM inside a capped process see the
//! cap). Reached as exported symbols (programs linked with `-lnvidia-ml`) and through our
//! `dlsym` hook (dlopen + dlsym, which is what pynvml and nvidia-smi do). NVML is never
//! linked: the real functions come from the already-loaded `libnvidia-ml.so.1`.

use super::Site;
use crate::cap;
use crate::cuda::types::*;
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
    let read = || {
        if mem.is_null() {
            return (None, None);
        }
        // SAFETY: non-null struct the real call just filled.
        let (free, total) = unsafe { *mem }.free_total();
        (Some(free), Some(total))
    };
    let write = |dev: i32, _, _| {
        if !mem.is_null() && dev >= 0 {
            // SAFETY: non-null struct supplied by the caller, just filled.
            unsafe { &mut *mem }.adjust(dev);
        }
    };
    let device = || crate::cuda::nvml::cuda_ordinal_of(device);
    super::query_hook(h, api, device, call, read, write)
}

hooks! {
    ["nvmlDeviceGetMemoryInfo", 0] nvmlDeviceGetMemoryInfo,
    fn(device: nvmlDevice_t, mem: *mut nvmlMemory_t) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(h, Api::NvmlDeviceGetMemoryInfo, device, mem, |f| unsafe { f(device, mem) })
    }

    ["nvmlDeviceGetMemoryInfo_v2", 0] nvmlDeviceGetMemoryInfo_v2,
    fn(device: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        memory_info(h, Api::NvmlDeviceGetMemoryInfoV2, device, mem, |f| unsafe { f(device, mem) })
    }
}
