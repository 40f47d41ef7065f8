//! NVML as the layers see it: the NVML device of a CUDA device and back (they agree on
//! PCI bus ids, whatever the enumeration order and `CUDA_VISIBLE_DEVICES`), and the
//! device's free memory without a context, and this process's use of a device by NVML's
//! accounting. Real calls only, never our hooks.

use crate::cuda::real::{self, Lib, Slot};
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

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: u32,
    used_gpu_memory: u64,
    gpu_instance_id: u32,
    compute_instance_id: u32,
}

type PfnNvmlProcesses = unsafe extern "C" fn(nvmlDevice_t, *mut u32, *mut ProcessInfo) -> c_int;

// Only this query calls them, resolved like the hooks' (`real::Slot`).
static NVML_PROCESSES_V3: Slot = Slot::new(c"nvmlDeviceGetComputeRunningProcesses_v3", Lib::Nvml);
static NVML_PROCESSES_V2: Slot = Slot::new(c"nvmlDeviceGetComputeRunningProcesses_v2", Lib::Nvml);

/// Device memory this process holds on `device` according to NVML's per-process accounting
/// (context, modules and allocations alike): how the cap measures a context's footprint.
/// `None` when NVML is missing, or does not list this process (a pid namespace NVML does not
/// see into, or no context yet). The NVML device is the one with the CUDA device's PCI bus id
/// (NVML ignores `CUDA_VISIBLE_DEVICES`, so its index is not the CUDA ordinal).
pub(crate) fn process_used(device: i32) -> Option<u64> {
    let init = real::nvmlInit_v2()?;
    let procs = match NVML_PROCESSES_V3.get() {
        0 => NVML_PROCESSES_V2.get(),
        a => a,
    };
    if procs == 0 {
        return None;
    }
    // SAFETY: the address is NVML's function of that name, with this ABI.
    let procs = unsafe { std::mem::transmute::<usize, PfnNvmlProcesses>(procs) };
    // SAFETY: nvmlInit_v2 takes no arguments (reference-counted, harmless to repeat).
    if unsafe { init() } != NVML_SUCCESS {
        return None;
    }
    let dev = handle(device)?;
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

/// `nvmlGetMemoryLimits_v1_t` as NVIDIA's bindings lay it out (driver r615+).
#[repr(C)]
struct MemoryLimitsV1 {
    name_space: *mut c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type PfnNvmlMemoryLimits = unsafe extern "C" fn(nvmlDevice_t, *mut MemoryLimitsV1) -> c_int;

static NVML_MEMORY_LIMITS_V1: Slot = Slot::new(c"nvmlDeviceGetMemoryLimits_v1", Lib::Nvml);

/// NVML's memory limits of the device: `(soft, hard)` in bytes, 0 = none. `nameSpace` is
/// passed NULL (the device's own limits, not a named namespace's). `None`, silently, when NVML
/// or the function (drivers before r615) is missing, or NVML answers an error.
fn limits_of(f: PfnNvmlMemoryLimits, h: nvmlDevice_t) -> Option<(u64, u64)> {
    let mut l = MemoryLimitsV1 {
        name_space: std::ptr::null_mut(),
        soft_limit: 0,
        hard_limit: 0,
        current_used: 0,
    };
    // SAFETY: l is a valid in/out struct of the layout NVML writes.
    (unsafe { f(h, &mut l) } == NVML_SUCCESS).then_some((l.soft_limit, l.hard_limit))
}

fn limits_fn() -> Option<PfnNvmlMemoryLimits> {
    let a = NVML_MEMORY_LIMITS_V1.get();
    // SAFETY: the address is NVML's function of that name, with this ABI.
    (a != 0).then(|| unsafe { std::mem::transmute::<usize, PfnNvmlMemoryLimits>(a) })
}

/// The memory limits of every NVML device that has one: `(NVML index, soft, hard)`. Needs no
/// CUDA context (read at set-up).
pub(crate) fn memory_limits_all() -> Vec<(u32, u64, u64)> {
    let (Some(f), Some(init), Some(shutdown), Some(by_index)) = (
        limits_fn(),
        real::nvmlInit_v2(),
        real::nvmlShutdown(),
        real::nvmlDeviceGetHandleByIndex_v2(),
    ) else {
        return Vec::new();
    };
    // SAFETY: nvmlInit_v2 takes no arguments; balanced by shutdown below.
    if unsafe { init() } != NVML_SUCCESS {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..super::MAX_DEVICES as c_uint {
        let mut h: nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: h is a valid out-pointer.
        if unsafe { by_index(i, &mut h) } != NVML_SUCCESS {
            break;
        }
        if let Some((soft, hard)) = limits_of(f, h) {
            out.push((i, soft, hard));
        }
    }
    // SAFETY: balances the init above.
    unsafe { shutdown() };
    out
}

/// The memory limits `(soft, hard)` of CUDA device `dev` (its NVML device by PCI bus id).
pub(crate) fn memory_limits(dev: CUdevice) -> Option<(u64, u64)> {
    let f = limits_fn()?;
    let init = real::nvmlInit_v2()?;
    let shutdown = real::nvmlShutdown()?;
    // SAFETY: nvmlInit_v2 takes no arguments; balanced by shutdown below.
    if unsafe { init() } != NVML_SUCCESS {
        return None;
    }
    let r = handle(dev).and_then(|h| limits_of(f, h));
    // SAFETY: balances the init above.
    unsafe { shutdown() };
    r
}
