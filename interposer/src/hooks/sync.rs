//! Synchronization and IPC: what the pool needs to see (a device-wide synchronization the
//! process makes itself releases every pending `cudaFree`d block: `pool::note_process_sync`;
//! legacy IPC on pool memory is refused with a clear error: `pool::refuse_ipc`) and what the
//! trace records (`Sync` events of the process: device, stream, event).
//!
//! Depth-guarded like allocations: `cudaDeviceSynchronize` reaching our `cuCtxSynchronize`
//! is one synchronization.

use super::NO_DRIVER;
use crate::cuda::real;
use crate::cuda::types::*;
use crate::pipeline::run_hook;
use crate::sys::ids;
use crate::{pool, tracer};
use std::ffi::{c_int, c_void};
use vramshim_trace::{Event, SyncKind};

/// Run a synchronizing call `f`, then tell the pool (device-wide) and the tracer.
fn sync(
    name: &'static str,
    kind: SyncKind,
    stream: u64,
    device_wide: bool,
    f: impl Fn() -> c_int,
) -> c_int {
    run_hook(name, CUDA_ERROR_UNKNOWN, &f, |_| {
        let traced = tracer::enabled();
        let t0 = traced.then(tracer::stamp);
        let rc = f();
        if rc == CUDA_SUCCESS && device_wide && pool::enabled() {
            super::pool_glue::note_process_sync();
        }
        crate::debug!("{name} stream={stream:#x} -> {rc}");
        if let Some(t0) = t0
            && rc == CUDA_SUCCESS
        {
            tracer::emit(Event::Sync {
                t_ns: t0.ns,
                tid: ids::tid(),
                device: real::current_driver_device().unwrap_or(-1),
                kind,
                stream,
                latency_ns: t0.latency_ns(),
            });
        }
        rc
    })
}

/// A wait the pool makes itself (`run`), recorded in the trace as the pool's: a device-wide
/// synchronization, or `stream` made to wait on an event (`on_event`). Wired into the pool by
/// `lifecycle` (the pool does not import the tracer).
pub(crate) fn pool_wait(
    device: i32,
    on_event: bool,
    stream: u64,
    run: &mut dyn FnMut() -> c_int,
) -> c_int {
    if !tracer::enabled() {
        return run();
    }
    let t0 = tracer::stamp();
    let rc = run();
    if rc == CUDA_SUCCESS {
        tracer::emit(Event::Sync {
            t_ns: t0.ns,
            tid: ids::tid(),
            device,
            kind: if on_event {
                SyncKind::PoolEvent
            } else {
                SyncKind::PoolDevice
            },
            stream,
            latency_ns: t0.latency_ns(),
        });
    }
    rc
}

/// # Safety
/// C ABI: `cudaDeviceSynchronize`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> c_int {
    let Some(f) = real::cudaDeviceSynchronize() else {
        return super::NO_RUNTIME;
    };
    // SAFETY: no arguments.
    sync(
        "cudaDeviceSynchronize",
        SyncKind::ProcessDevice,
        0,
        true,
        || unsafe { f() },
    )
}

/// # Safety
/// C ABI: `cuCtxSynchronize`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> c_int {
    let Some(f) = real::cuCtxSynchronize() else {
        return NO_DRIVER;
    };
    // SAFETY: no arguments.
    sync(
        "cuCtxSynchronize",
        SyncKind::ProcessDevice,
        0,
        true,
        || unsafe { f() },
    )
}

macro_rules! stream_sync {
    ($name:ident, $missing:expr) => {
        /// # Safety
        /// C ABI: the real function's contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: CUstream) -> c_int {
            let Some(f) = real::$name() else {
                return $missing;
            };
            // SAFETY: forwarding the caller's argument unchanged.
            sync(
                stringify!($name),
                SyncKind::ProcessStream,
                s as u64,
                false,
                || unsafe { f(s) },
            )
        }
    };
}

stream_sync!(cudaStreamSynchronize, super::NO_RUNTIME);
stream_sync!(cudaStreamSynchronize_ptsz, super::NO_RUNTIME);
stream_sync!(cuStreamSynchronize, NO_DRIVER);
stream_sync!(cuStreamSynchronize_ptsz, NO_DRIVER);

macro_rules! event_sync {
    ($name:ident, $missing:expr) => {
        /// # Safety
        /// C ABI: the real function's contract.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(e: CUevent) -> c_int {
            let Some(f) = real::$name() else {
                return $missing;
            };
            // SAFETY: forwarding the caller's argument unchanged.
            sync(
                stringify!($name),
                SyncKind::ProcessEvent,
                0,
                false,
                || unsafe { f(e) },
            )
        }
    };
}

event_sync!(cudaEventSynchronize, super::NO_RUNTIME);
event_sync!(cuEventSynchronize, NO_DRIVER);

fn ipc(
    name: &'static str,
    f: Option<PfnIpcGetMemHandle>,
    missing: c_int,
    handle: *mut c_void,
    ptr: u64,
) -> c_int {
    let Some(f) = f else {
        return missing;
    };
    // SAFETY: forwarding the caller's arguments unchanged.
    let call = || unsafe { f(handle, ptr) };
    run_hook(name, CUDA_ERROR_UNKNOWN, call, |_| {
        if pool::enabled()
            && let Some(code) = super::pool_glue::refuse_ipc(ptr)
        {
            crate::debug!("{name} addr={ptr:#x} -> {code} [pool refused]");
            return code;
        }
        call()
    })
}

/// # Safety
/// C ABI: `cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaIpcGetMemHandle(handle: *mut c_void, dev_ptr: *mut c_void) -> c_int {
    ipc(
        "cudaIpcGetMemHandle",
        real::cudaIpcGetMemHandle(),
        super::NO_RUNTIME,
        handle,
        dev_ptr as u64,
    )
}

/// # Safety
/// C ABI: `cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CUdeviceptr) -> c_int {
    ipc(
        "cuIpcGetMemHandle",
        real::cuIpcGetMemHandle(),
        NO_DRIVER,
        handle,
        dptr,
    )
}
