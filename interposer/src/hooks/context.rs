//! Context lifetime, for the cap's context accounting (`VRAMSHIM_CAP_CONTEXT`): when this
//! process creates its first context on a device (`cuDevicePrimaryCtxRetain`, which the
//! runtime's lazy initialization also goes through, or `cuCtxCreate_v2`), the device's free
//! memory is read before and after through NVML and handed to `cap::on_context_created`;
//! when it goes (`cuDevicePrimaryCtxReset_v2`, the last `cuDevicePrimaryCtxRelease_v2`,
//! `cudaDeviceReset`) the cap hears `on_context_destroyed`.
//!
//! Only done when a cap is configured (NVML is not touched otherwise). These hooks are not
//! depth-guarded: the runtime creates its context inside our outer `cudaMalloc`. The CUDA
//! device is found in NVML by its PCI bus id (falling back to the same index).

use crate::cap;
use crate::cuda::types::*;
use crate::cuda::{nvml, real};
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

const MAX: usize = crate::cuda::MAX_DEVICES;
/// This process has a context on the device (as far as we saw).
static PRESENT: [AtomicBool; MAX] = [const { AtomicBool::new(false) }; MAX];
/// Primary-context retains minus releases we saw, per device.
static REFS: [AtomicI64; MAX] = [const { AtomicI64::new(0) }; MAX];

fn idx(dev: CUdevice) -> Option<usize> {
    (dev >= 0 && (dev as usize) < MAX).then_some(dev as usize)
}

/// At exit, when tracing is on and the process loaded the driver: if the driver's start-up
/// failed (`cuInit` answers the process's error again), the trace records it, so a program
/// that died in CUDA start-up leaves a trace that says why; a process that recorded nothing
/// else still gets its trace.
pub(crate) fn record_startup_failure() {
    if !crate::tracer::enabled() || real::libcuda_if_loaded().is_null() {
        return;
    }
    // A context was made: start-up did not fail, and the driver is left alone at exit (its
    // own teardown may have run; it would answer "deinitialized", which is no failure).
    if PRESENT.iter().any(|p| p.load(Ordering::Acquire)) {
        return;
    }
    let Some(rc) = crate::cuda::driver::init() else {
        return;
    };
    const CUDA_ERROR_DEINITIALIZED: c_int = 4;
    if rc != CUDA_SUCCESS && rc != CUDA_ERROR_DEINITIALIZED {
        crate::tracer::call_failed("cuInit", -1, rc);
    } else if crate::tracer::nothing_recorded() {
        crate::tracer::start_now();
    }
}

/// Run `create` (which makes a context on `dev`), measuring it if it is the first. A failure
/// is recorded: a process whose context cannot be created (device full, unavailable) learns
/// it from the first call that needed one.
fn creating(name: &str, dev: CUdevice, create: impl FnOnce() -> c_int) -> c_int {
    let Some(i) = idx(dev) else {
        let rc = create();
        if rc != CUDA_SUCCESS {
            crate::tracer::call_failed(name, dev, rc);
        }
        return rc;
    };
    let first = !PRESENT[i].load(Ordering::Acquire) && cap::global().is_some();
    let before = if first { nvml::free_bytes(dev) } else { None };
    let rc = create();
    if rc != CUDA_SUCCESS {
        crate::tracer::call_failed(name, dev, rc);
    }
    if rc == CUDA_SUCCESS && !PRESENT[i].swap(true, Ordering::AcqRel) {
        let after = before.and_then(|_| nvml::free_bytes(dev));
        match (before, after) {
            (Some(b), Some(a)) => {
                crate::debug!(
                    "context created on device {dev}: free {b} -> {a} ({} bytes)",
                    b.saturating_sub(a)
                );
                cap::on_context_created(dev, b, a);
            }
            _ => crate::debug!("context created on device {dev} (not measured)"),
        }
    }
    rc
}

/// Tell the cap the context of `dev` is gone (once).
pub(crate) fn destroyed(dev: CUdevice) {
    if let Some(i) = idx(dev) {
        REFS[i].store(0, Ordering::Release);
        if PRESENT[i].swap(false, Ordering::AcqRel) {
            crate::debug!("context destroyed on device {dev}");
            cap::on_context_destroyed(dev);
        }
    }
}

/// Forked child: it has no context of its own.
pub(crate) fn on_fork_child() {
    for i in 0..MAX {
        PRESENT[i].store(false, Ordering::Relaxed);
        REFS[i].store(0, Ordering::Relaxed);
    }
}

/// Everything the context of `dev` held is gone (`cudaDeviceReset`,
/// `cuDevicePrimaryCtxReset_v2`): its allocations, the pool's mappings, the cap's context.
pub(crate) fn reset(dev: CUdevice) {
    crate::pipeline::device_reset(dev);
    super::pool_glue::on_device_reset(dev);
    destroyed(dev);
}

hooks! {
    ["cuDevicePrimaryCtxRetain", 7000] cuDevicePrimaryCtxRetain,
    fn(pctx: *mut CUcontext, dev: CUdevice) |h| {
        h.unguarded(|f| {
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = creating(h.name, dev, || unsafe { f(pctx, dev) });
            if rc == CUDA_SUCCESS
                && let Some(i) = idx(dev)
            {
                REFS[i].fetch_add(1, Ordering::AcqRel);
            }
            rc
        })
    }

    ["cuDevicePrimaryCtxRelease", 11000] cuDevicePrimaryCtxRelease_v2,
    fn(dev: CUdevice) |h| {
        h.unguarded(|f| {
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = unsafe { f(dev) };
            if rc == CUDA_SUCCESS
                && let Some(i) = idx(dev)
                && REFS[i].fetch_sub(1, Ordering::AcqRel) == 1
            {
                destroyed(dev);
            }
            rc
        })
    }

    ["cuDevicePrimaryCtxReset", 11000] cuDevicePrimaryCtxReset_v2,
    fn(dev: CUdevice) |h| {
        h.unguarded(|f| {
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = unsafe { f(dev) };
            if rc == CUDA_SUCCESS {
                reset(dev);
            }
            rc
        })
    }

    ["cuCtxCreate", 3020] cuCtxCreate_v2,
    fn(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) |h| {
        // The new context becomes current: the runtime device may change.
        super::current::changing(h, |f| {
            crate::pipeline::run_unguarded(h.name, CUDA_ERROR_UNKNOWN, || {
                // SAFETY: forwarding the caller's arguments unchanged.
                creating("cuCtxCreate", dev, || unsafe { f(pctx, flags, dev) })
            })
        })
    }

    /// The current context's device gains access to `peer`'s memory: the pool grants it on
    /// its mappings of that device too.
    ["cuCtxEnablePeerAccess", 4000] cuCtxEnablePeerAccess,
    fn(peer: CUcontext, flags: c_uint) |h| {
        h.unguarded(|f| {
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = unsafe { f(peer, flags) };
            if granted(rc) {
                let mut me: CUdevice = -1;
                let accessor = real::cuCtxGetDevice()
                    // SAFETY: valid out-pointer.
                    .filter(|get| unsafe { get(&mut me) } == CUDA_SUCCESS)
                    .map(|_| me);
                if let (Some(a), Some(o)) = (accessor, device_of_context(peer)) {
                    super::pool_glue::on_peer_access(o, a);
                }
            }
            rc
        })
    }

    /// The runtime's current device gains access to `peer_device`'s memory (the real
    /// runtime may also reach our `cuCtxEnablePeerAccess`; telling the pool twice is
    /// harmless).
    ["cudaDeviceEnablePeerAccess", 0] cudaDeviceEnablePeerAccess,
    fn(peer_device: c_int, flags: c_uint) |h| {
        h.unguarded(|f| {
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = unsafe { f(peer_device, flags) };
            if granted(rc)
                && let Some(me) = real::current_runtime_device()
            {
                super::pool_glue::on_peer_access(peer_device, me);
            }
            rc
        })
    }
}

/// Whether a peer-access call left the grant standing, and the pool must honour it.
fn granted(rc: c_int) -> bool {
    (rc == CUDA_SUCCESS || rc == PEER_ACCESS_ALREADY_ENABLED) && crate::pool::enabled()
}

/// `cudaErrorPeerAccessAlreadyEnabled` / `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`: the grant
/// stands, so the pool must honour it too (it may not have seen the first one).
const PEER_ACCESS_ALREADY_ENABLED: c_int = 704;

/// The device of context `ctx` (made current for the question, then restored).
fn device_of_context(ctx: CUcontext) -> Option<CUdevice> {
    let (push, pop, get) = (
        real::cuCtxPushCurrent_v2()?,
        real::cuCtxPopCurrent_v2()?,
        real::cuCtxGetDevice()?,
    );
    let mut dev: CUdevice = -1;
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: a context the caller handed to the driver, pushed and popped in pairs; valid
    // out-pointers.
    unsafe {
        if push(ctx) != CUDA_SUCCESS {
            return None;
        }
        let rc = get(&mut dev);
        pop(&mut popped);
        (rc == CUDA_SUCCESS && dev >= 0).then_some(dev)
    }
}
