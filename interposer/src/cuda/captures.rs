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

/// The calling thread began capturing `stream` in `mode` (the real call succeeded). A capture
/// the runtime's entry point and then the driver's report twice is one.
pub(crate) fn begun(stream: u64, mode: c_int) {
    let tid = crate::sys::ids::tid();
    let mut c = CAPTURES.lock();
    if let Some(x) = c.iter_mut().find(|x| x.stream == stream) {
        *x = Capture { stream, mode, tid };
    } else {
        c.push(Capture { stream, mode, tid });
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

/// Whether any capture is under way.
pub(crate) fn any() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Whether `stream` (a stream key as given to [`begun`]) is capturing.
pub(crate) fn capturing(stream: u64) -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && CAPTURES.lock().iter().any(|x| x.stream == stream)
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
