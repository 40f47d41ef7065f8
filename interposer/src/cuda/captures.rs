//! The stream captures the process has under way (the hooks on every begin- and end-capture
//! entry point report them), and whether the calling thread may make a potentially unsafe
//! call now: a synchronization, an event query, a virtual-memory call (`cuMemCreate`,
//! `cuMemMap`, ...), `cudaMalloc`. Such a call made while a capture forbids it fails and
//! invalidates that capture, whichever thread makes it, so the layers that make calls of their
//! own (the pool, the cap's settling of the driver's pools) ask here first.
//!
//! CUDA's rules (`cuThreadExchangeStreamCaptureMode`): a thread in global mode (the default)
//! is forbidden while it has a capture of its own not begun in relaxed mode, or while any other
//! thread has a capture begun in global mode; in thread-local mode only its own captures count;
//! in relaxed mode none does. The thread's mode is read from the driver (two exchanges: there
//! is no query), only while some capture is under way.

use crate::cuda::real;
use crate::cuda::types::{CUDA_SUCCESS, CUstream};
use crate::sys::spin::SpinLock;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL` (== `cudaStreamCaptureModeGlobal`).
pub(crate) const MODE_GLOBAL: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
#[cfg(test)]
const MODE_THREAD_LOCAL: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub(crate) const MODE_RELAXED: c_int = 2;
/// `CU_STREAM_CAPTURE_STATUS_NONE`: the stream is not capturing.
const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
const CU_STREAM_PER_THREAD: u64 = 0x2;
/// `CU_STREAM_LEGACY`: the legacy default stream.
const CU_STREAM_LEGACY: u64 = 0x1;
/// Stream keys with this bit are per-thread default streams: `PER_THREAD_BASE | tid`.
const PER_THREAD_BASE: u64 = vramshim_pool::streams::PER_THREAD_BASE;

#[derive(Clone, Copy)]
struct Capture {
    /// The stream, as the caller keys streams (the pool's stream ids).
    stream: u64,
    mode: c_int,
    /// The thread that began it.
    tid: u32,
}

/// Captures under way (few: one per capturing stream).
static CAPTURES: SpinLock<Vec<Capture>> = SpinLock::new(Vec::new());
/// How many: the test every unsafe call pays while none is under way.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// The calling thread begins capturing `stream` in `mode`: recorded before the real call, so
/// that no unsafe call is decided on without it once the call may have begun the capture (the
/// begin hook then waits for the requests in flight). A capture the runtime's entry point and
/// then the driver's report twice is one. Returns what was recorded for the stream before,
/// for [`restore`] when the real call fails.
pub(crate) fn begun(stream: u64, mode: c_int) -> Option<(c_int, u32)> {
    let tid = crate::sys::ids::tid();
    let mut c = CAPTURES.lock();
    let before = if let Some(x) = c.iter_mut().find(|x| x.stream == stream) {
        let before = (x.mode, x.tid);
        *x = Capture { stream, mode, tid };
        Some(before)
    } else {
        c.push(Capture { stream, mode, tid });
        None
    };
    ACTIVE.store(c.len(), Ordering::Release);
    before
}

/// The real begin-capture call on `stream` failed: what [`begun`] replaced is put back (a
/// capture already under way on the stream goes on; none: nothing is recorded).
pub(crate) fn restore(stream: u64, before: Option<(c_int, u32)>) {
    let mut c = CAPTURES.lock();
    match before {
        Some((mode, tid)) => {
            if let Some(x) = c.iter_mut().find(|x| x.stream == stream) {
                *x = Capture { stream, mode, tid };
            }
        }
        None => c.retain(|x| x.stream != stream),
    }
    ACTIVE.store(c.len(), Ordering::Release);
}

/// The capture of `stream` ended (or the stream was destroyed).
pub(crate) fn ended(stream: u64) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut c = CAPTURES.lock();
    c.retain(|x| x.stream != stream);
    ACTIVE.store(c.len(), Ordering::Release);
}

/// After an end-capture call on `stream` (the handle as the caller passed it; `per_thread`:
/// through a `_ptsz` entry point) that failed: whether the capture goes on. A failed end
/// may leave it under way (an argument refused, a thread-local capture ended from another
/// thread) or end it (an invalidated capture), so the driver is asked; unsure (no query, or
/// the query failed), it goes on: forgetting a capture that goes on would let the pool make a
/// call that invalidates it.
pub(crate) fn goes_on_after_failed_end(stream: u64, per_thread: bool) -> bool {
    let Some(query) = real::cuStreamIsCapturing() else {
        return true;
    };
    // handle 0 through a `_ptsz` entry point is the thread's per-thread default stream
    let handle = if stream == 0 && per_thread {
        CU_STREAM_PER_THREAD
    } else {
        stream
    };
    let mut status: c_int = 0;
    // SAFETY: valid out-pointer; the handle is the one the caller ended.
    let rc = unsafe { query(handle as usize as CUstream, &mut status) };
    rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// Whether any capture is under way.
pub(crate) fn any() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Whether `stream` (a stream key as given to [`begun`], of a request this thread makes) is
/// capturing: a stream a begin call named, or one that joined a capture (a stream that waits
/// on an event recorded in a capturing stream joins that capture until it ends, and its work is
/// captured; no begin call names it, so the driver is asked). One atomic load while no capture
/// is under way.
pub(crate) fn capturing(stream: u64) -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
        && (CAPTURES.lock().iter().any(|x| x.stream == stream) || joined(stream))
}

/// Whether `stream`, named by no begin call, joined a capture: the driver's answer for it
/// (`cuStreamIsCapturing`, through the real entry point; a query is allowed during any
/// capture). Unsure (no query, or the query failed) counts as capturing: the caller then
/// leaves the request to the driver, or holds a block a graph may use. The legacy stream
/// never captures (and asking about it while a blocking stream captures is refused);
/// another thread's per-thread default stream has no handle here: neither is asked.
#[cold]
#[inline(never)]
fn joined(stream: u64) -> bool {
    if joins_unseen() {
        return false;
    }
    let handle = if stream & PER_THREAD_BASE != 0 {
        if stream != PER_THREAD_BASE | u64::from(crate::sys::ids::tid()) {
            return false;
        }
        CU_STREAM_PER_THREAD
    } else if stream == 0 || stream == CU_STREAM_LEGACY {
        return false;
    } else {
        stream
    };
    let Some(query) = real::cuStreamIsCapturing() else {
        return true;
    };
    let mut status: c_int = 0;
    // SAFETY: valid out-pointer; the handle is the request's stream.
    let rc = unsafe { query(handle as usize as CUstream, &mut status) };
    rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=joins-unseen`): only the streams a begin call named
/// capture, as once: a stream that joined a capture is served by the pool.
fn joins_unseen() -> bool {
    static READ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ.get_or_init(|| crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "joins-unseen"))
}

/// The calling thread's capture interaction mode (global without the driver's exchange).
fn thread_mode() -> c_int {
    let Some(exchange) = real::cuThreadExchangeStreamCaptureMode() else {
        return MODE_GLOBAL;
    };
    let mut mode = MODE_RELAXED;
    // SAFETY: valid in/out pointer; the second exchange puts the thread's mode back.
    unsafe {
        if exchange(&mut mode) != 0 {
            return MODE_GLOBAL;
        }
        let mut back = mode;
        exchange(&mut back);
    }
    mode
}

/// Whether a capture under way forbids the calling thread potentially unsafe calls now
/// (CUDA's rules, above). One atomic load while no capture is under way.
pub(crate) fn forbid_unsafe_calls() -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mode = thread_mode();
    if mode == MODE_RELAXED {
        return false;
    }
    let me = crate::sys::ids::tid();
    forbidden(mode, me, &CAPTURES.lock())
}

/// The rule, for a thread `me` in `mode` among `captures`.
fn forbidden(mode: c_int, me: u32, captures: &[Capture]) -> bool {
    mode != MODE_RELAXED
        && captures.iter().any(|c| {
            (c.tid == me && c.mode != MODE_RELAXED)
                || (mode == MODE_GLOBAL && c.mode == MODE_GLOBAL)
        })
}

/// A forked child has no capture under way (its CUDA is not the parent's).
pub(crate) fn on_fork_child() {
    // SAFETY: the atfork child handler runs on the child's only thread, holding no guard.
    let c = unsafe { CAPTURES.reset_in_child() };
    std::mem::forget(std::mem::take(c));
    ACTIVE.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(stream: u64, mode: c_int, tid: u32) -> Capture {
        Capture { stream, mode, tid }
    }

    #[test]
    fn the_thread_s_mode_decides_which_captures_forbid_it() {
        let other_global = [cap(7, MODE_GLOBAL, 2)];
        let other_local = [cap(7, MODE_THREAD_LOCAL, 2)];
        let own_local = [cap(7, MODE_THREAD_LOCAL, 1)];
        let own_relaxed = [cap(7, MODE_RELAXED, 1)];
        // global: another thread's global capture, and its own not begun relaxed
        assert!(forbidden(MODE_GLOBAL, 1, &other_global));
        assert!(!forbidden(MODE_GLOBAL, 1, &other_local));
        assert!(forbidden(MODE_GLOBAL, 1, &own_local));
        assert!(!forbidden(MODE_GLOBAL, 1, &own_relaxed));
        // thread-local: only its own
        assert!(!forbidden(MODE_THREAD_LOCAL, 1, &other_global));
        assert!(forbidden(MODE_THREAD_LOCAL, 1, &own_local));
        assert!(!forbidden(MODE_THREAD_LOCAL, 1, &own_relaxed));
        // relaxed: none
        assert!(!forbidden(MODE_RELAXED, 1, &other_global));
        assert!(!forbidden(MODE_RELAXED, 1, &own_local));
        assert!(!forbidden(MODE_GLOBAL, 1, &[]));
    }
}
