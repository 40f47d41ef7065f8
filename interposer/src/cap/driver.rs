//! The default [`DeviceQueries`](super::DeviceQueries): the real driver (never our hooks),
//! initialised with `cuInit(0)` if the process has not done it yet (the runtime does the
//! same on its first call; calling it twice is harmless).

use std::ffi::c_int;

use crate::ffi_types::{CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS};
use crate::real;

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
pub fn total(device: i32) -> Option<u64> {
    let f = real::cuDeviceTotalMem_v2()?;
    let mut bytes: usize = 0;
    // SAFETY: bytes is a valid out-pointer; the driver checks the ordinal.
    let ok = with_init(|| unsafe { f(&mut bytes, device) });
    (ok && bytes > 0).then_some(bytes as u64)
}

/// Number of devices the process sees.
pub fn count() -> Option<i32> {
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
