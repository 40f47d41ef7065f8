//! The calling thread's current runtime device, asked of the runtime (`cudaGetDevice`) once
//! and then remembered per thread until something that may change it runs on that thread:
//! `cudaSetDevice`, or a change of the driver's current context (`cuCtxSetCurrent`,
//! `cuCtxPushCurrent_v2`, `cuCtxPopCurrent_v2`, `cuCtxDestroy_v2`, `cuCtxCreate_v2`; the
//! runtime follows the current context). All of these are hooked here and forget the
//! remembered device before and after passing the call on unchanged.
//!
//! Why every change is seen: the runtime device is only needed by the runtime hooks
//! (`cudaMalloc` & co.), and those only run when the process reaches the runtime through
//! its dynamic symbols (shared runtime, `dlopen`/`dlsym`); then `cudaSetDevice` is reached
//! the same way, through our export or our `dlsym` hook. A statically linked runtime calls
//! its own `cudaSetDevice` unseen, but then its allocations are not seen by the runtime
//! hooks either: they reach our driver hooks, which ask the driver for the current context's
//! device on every request. Context changes go through the driver's exported functions or
//! through `cuGetProcAddress` / `cudaGetDriverEntryPoint`, which hand out these hooks.

use super::Site;
use crate::cuda::real;
use crate::cuda::types::*;
use std::ffi::c_int;

/// The runtime's current device for the calling thread, or -1.
#[inline(always)]
pub(crate) fn rt_device() -> i32 {
    let c = &crate::sys::thread::state().rt_device;
    match c.get() {
        0 => ask(c),
        d => d - 1,
    }
}

#[cold]
fn ask(c: &std::cell::Cell<i32>) -> i32 {
    match real::current_runtime_device() {
        Some(d) if (0..i32::MAX).contains(&d) => {
            c.set(d + 1);
            d
        }
        _ => -1,
    }
}

/// Forget the remembered device (the calling thread's current device may change).
#[inline]
pub(crate) fn forget() {
    if fault_stale() {
        return;
    }
    crate::sys::thread::state().rt_device.set(0);
}

/// Test-only switch (`VRAMSHIM_DEVICE_FAULT=stale`): never forget, so allocations after a
/// device switch are charged to the old device (the device-switch test must catch it).
fn fault_stale() -> bool {
    crate::config::switch_on("VRAMSHIM_DEVICE_FAULT", "stale")
}

/// Pass a call that may change the current device on, forgetting the device around it.
#[inline(always)]
pub(super) fn changing<F: Copy>(h: Site<F>, call: impl FnOnce(F) -> c_int) -> c_int {
    forget();
    let rc = match h.real() {
        Ok(f) => call(f),
        Err(missing) => missing,
    };
    forget();
    rc
}

hooks! {
    ["cudaSetDevice", 0] cudaSetDevice,
    fn(device: c_int) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        changing(h, |f| unsafe { f(device) })
    }

    ["cuCtxSetCurrent", 4000] cuCtxSetCurrent,
    ["cuCtxPushCurrent", 4000] cuCtxPushCurrent_v2,
    ["cuCtxDestroy", 4000] cuCtxDestroy_v2,
    fn(ctx: CUcontext) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        changing(h, |f| unsafe { f(ctx) })
    }

    ["cuCtxPopCurrent", 4000] cuCtxPopCurrent_v2,
    fn(pctx: *mut CUcontext) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        changing(h, |f| unsafe { f(pctx) })
    }
}
