//! Synchronization, stream lifetime and IPC: what the pool needs to see (a device-wide
//! synchronization the process makes itself releases every pending `cudaFree`d block:
//! `pool::note_process_sync`; a stream the process destroys is retired first, since its
//! handle value may name a new stream afterwards: `pool::retire_stream`; legacy IPC on pool
//! memory is refused with a clear error: `pool::refuse_ipc`) and what the trace records
//! (`Sync` events of the process: device, stream, event).
//!
//! Depth-guarded like allocations: `cudaDeviceSynchronize` reaching our `cuCtxSynchronize`
//! is one synchronization.

use super::Site;
use crate::cuda::real;
use crate::cuda::types::*;
use crate::sys::ids;
use crate::{pool, tracer};
use std::ffi::{c_int, c_void};
use vramshim_trace::{Event, SyncKind};

/// Run a synchronizing call (`call` on the real function), then tell the pool
/// (device-wide) and the tracer.
fn sync<F: Copy>(
    h: Site<F>,
    kind: SyncKind,
    stream: u64,
    device_wide: bool,
    call: impl Fn(F) -> c_int,
) -> c_int {
    let name = h.name;
    h.guarded(call, |_, call| {
        let traced = tracer::enabled();
        let t0 = traced.then(tracer::stamp);
        let rc = call();
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

/// `cudaStreamDestroy`, `cuStreamDestroy[_v2]`: the pool retires the stream while its handle
/// still names it (it records an event on it for what was freed on it), then the real destroy,
/// recorded in the trace when it succeeded (`StreamDestroy`, timed at the call: `vramshim
/// replay` retires the stream there, as the pool did). The default streams' handles (0,
/// legacy, per-thread) are no stream a program destroys: the real call answers them.
fn stream_destroy<F: Copy>(h: Site<F>, stream: u64, call: impl Fn(F) -> c_int) -> c_int {
    let name = h.name;
    h.guarded(call, |_, call| {
        let t0 = tracer::enabled().then(tracer::stamp);
        if stream > 2 && pool::enabled() {
            super::pool_glue::retire_stream(stream);
        }
        // a stream destroyed while it captures captures no more
        crate::cuda::captures::ended(stream);
        let rc = call();
        crate::debug!("{name} stream={stream:#x} -> {rc}");
        if let Some(t0) = t0
            && rc == CUDA_SUCCESS
            && stream > 2
        {
            tracer::emit(Event::StreamDestroy {
                t_ns: t0.ns,
                tid: ids::tid(),
                device: real::current_driver_device().unwrap_or(-1),
                stream,
            });
        }
        rc
    })
}

/// Legacy IPC: refused with a clear error on pool memory.
fn ipc<F: Copy>(h: Site<F>, ptr: u64, call: impl Fn(F) -> c_int) -> c_int {
    let name = h.name;
    h.guarded(call, |_, call| {
        if pool::enabled()
            && let Some(code) = super::pool_glue::refuse_ipc(ptr)
        {
            crate::debug!("{name} addr={ptr:#x} -> {code} [pool refused]");
            return code;
        }
        call()
    })
}

hooks! {
    ["cudaDeviceSynchronize", 0] cudaDeviceSynchronize,
    ["cuCtxSynchronize", 2000] cuCtxSynchronize,
    fn() |h| {
        // SAFETY: no arguments.
        sync(h, SyncKind::ProcessDevice, 0, true, |f| unsafe { f() })
    }

    ["cudaStreamSynchronize", 0] cudaStreamSynchronize,
    ["cudaStreamSynchronize", 0, ptds] cudaStreamSynchronize_ptsz,
    ["cuStreamSynchronize", 2000] cuStreamSynchronize,
    ["cuStreamSynchronize", 7000, ptds] cuStreamSynchronize_ptsz,
    fn(s: CUstream) |h| {
        // SAFETY: forwarding the caller's argument unchanged.
        sync(h, SyncKind::ProcessStream, s as u64, false, |f| unsafe { f(s) })
    }

    ["cudaStreamDestroy", 0] cudaStreamDestroy,
    ["cuStreamDestroy", 2000] cuStreamDestroy,
    ["cuStreamDestroy", 4000] cuStreamDestroy_v2,
    fn(s: CUstream) |h| {
        // SAFETY: forwarding the caller's argument unchanged.
        stream_destroy(h, s as u64, |f| unsafe { f(s) })
    }

    ["cudaEventSynchronize", 0] cudaEventSynchronize,
    ["cuEventSynchronize", 2000] cuEventSynchronize,
    fn(e: CUevent) |h| {
        // SAFETY: forwarding the caller's argument unchanged.
        sync(h, SyncKind::ProcessEvent, 0, false, |f| unsafe { f(e) })
    }

    /// `cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*)`.
    ["cudaIpcGetMemHandle", 0] cudaIpcGetMemHandle,
    fn(handle: *mut c_void, dev_ptr: *mut c_void) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        ipc(h, dev_ptr as u64, |f| unsafe { f(handle, dev_ptr) })
    }

    /// `cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr)`.
    ["cuIpcGetMemHandle", 4010] cuIpcGetMemHandle,
    fn(handle: *mut c_void, dptr: CUdeviceptr) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        ipc(h, dptr, |f| unsafe { f(handle, dptr) })
    }
}
