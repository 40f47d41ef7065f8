//! Stream capture's beginning and end, through every entry point (the runtime's, the
//! driver's with and without a mode, to a graph, `_ptsz`; the lookups hand these hooks out):
//! `cuda::captures` keeps the captures under way, so that the pool and the cap make no call
//! that would break one (a synchronization of the context during any capture; an event query
//! or `cudaMalloc` where the mode rules forbid it), on any thread.
//!
//! Not depth-guarded: the runtime's begin reaching the driver's is the same capture, reported
//! twice (the registry keeps one per stream), and a capture begun inside another hook's real
//! call still counts.

use super::Site;
use crate::cuda::captures;
use crate::cuda::types::*;
use std::ffi::{c_int, c_void};

/// The stream's key, as the pool keys streams (a per-thread default stream is the calling
/// thread's).
fn key<F: Copy>(h: Site<F>, stream: CUstream) -> u64 {
    crate::pool::pool_stream_id(stream as u64, h.stream_flags())
}

/// A begin-capture entry point: the begin recorded as in flight, then every pool request and
/// every other decision about unsafe calls in flight waited for, then the real call, then the
/// capture recorded only if it began (`captures::beginning`). A request or call decides
/// whether a capture forbids its unsafe calls and makes them inside one critical section (the
/// pool's lock, `captures::gated`): one in flight when the begin is recorded may have decided
/// without it, and the capture must not begin before it is done; a later one waits for the
/// real call's outcome, and sees the capture if it began. So a begin that fails (the legacy
/// stream, a stream already capturing) is a capture no other thread ever acted on. (The pool's
/// lock is not held across the real call: the runtime's begin reaches the driver's hook, and
/// a runtime's lazy initialization may allocate; a request of this thread inside the call
/// does not wait for its own begin.)
fn begin<F: Copy>(
    h: Site<F>,
    stream: CUstream,
    mode: c_int,
    call: impl FnOnce(F) -> c_int,
) -> c_int {
    let name = h.name;
    h.unguarded(|f| {
        let key = key(h, stream);
        let rc = if !crate::pool::begin_waits_for_requests() {
            let rc = call(f);
            if rc == CUDA_SUCCESS {
                captures::begun_now(key, mode);
            }
            rc
        } else if crate::pool::begin_recorded_first() {
            captures::begun_now(key, mode);
            crate::pool::wait_for_requests();
            let rc = call(f);
            if rc != CUDA_SUCCESS {
                captures::ended(key);
            }
            rc
        } else {
            if captures::beginning(key, mode) {
                crate::pool::wait_for_requests();
                captures::wait_for_sections();
            }
            let rc = call(f);
            captures::began(key, mode, rc == CUDA_SUCCESS);
            rc
        };
        crate::debug!("{name} stream={:#x} mode={mode} -> {rc}", stream as u64);
        rc
    })
}

/// An end-capture entry point: the real call, then the capture forgotten unless it goes on
/// (a thread-local capture ended from another thread is refused and goes on, and so is an
/// end whose arguments the driver refuses, a null graph pointer say; an invalidated one ends
/// with its error: after any other failure the driver is asked).
fn end<F: Copy>(h: Site<F>, stream: CUstream, call: impl FnOnce(F) -> c_int) -> c_int {
    let name = h.name;
    h.unguarded(|f| {
        let rc = call(f);
        let goes_on = match rc {
            CUDA_SUCCESS => false,
            CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => true,
            _ => captures::goes_on_after_failed_end(
                stream as u64,
                h.stream_flags() & vramshim_trace::flags::PER_THREAD_STREAM != 0,
            ),
        };
        if !goes_on {
            captures::ended(key(h, stream));
        }
        crate::debug!("{name} stream={:#x} -> {rc}", stream as u64);
        rc
    })
}

hooks! {
    ["cuStreamBeginCapture", 10000] cuStreamBeginCapture,
    ["cuStreamBeginCapture", 10000, ptds] cuStreamBeginCapture_ptsz,
    fn(s: CUstream) |h| {
        // SAFETY: forwarding the caller's argument unchanged.
        begin(h, s, captures::MODE_GLOBAL, |f| unsafe { f(s) })
    }

    ["cudaStreamBeginCapture", 0] cudaStreamBeginCapture,
    ["cudaStreamBeginCapture", 0, ptds] cudaStreamBeginCapture_ptsz,
    ["cuStreamBeginCapture", 10010] cuStreamBeginCapture_v2,
    ["cuStreamBeginCapture", 10010, ptds] cuStreamBeginCapture_v2_ptsz,
    fn(s: CUstream, mode: c_int) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        begin(h, s, mode, |f| unsafe { f(s, mode) })
    }

    ["cudaStreamBeginCaptureToGraph", 0] cudaStreamBeginCaptureToGraph,
    ["cudaStreamBeginCaptureToGraph", 0, ptds] cudaStreamBeginCaptureToGraph_ptsz,
    ["cuStreamBeginCaptureToGraph", 12030] cuStreamBeginCaptureToGraph,
    ["cuStreamBeginCaptureToGraph", 12030, ptds] cuStreamBeginCaptureToGraph_ptsz,
    fn(s: CUstream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, n: usize, mode: c_int) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        begin(h, s, mode, |f| unsafe { f(s, graph, deps, edges, n, mode) })
    }

    ["cudaStreamEndCapture", 0] cudaStreamEndCapture,
    ["cudaStreamEndCapture", 0, ptds] cudaStreamEndCapture_ptsz,
    ["cuStreamEndCapture", 10000] cuStreamEndCapture,
    ["cuStreamEndCapture", 10000, ptds] cuStreamEndCapture_ptsz,
    fn(s: CUstream, graph: *mut *mut c_void) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        end(h, s, |f| unsafe { f(s, graph) })
    }
}
