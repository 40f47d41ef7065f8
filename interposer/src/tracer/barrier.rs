//! Asymmetric barriers: the application thread's side of a slot hand-off costs two plain
//! stores and a load (no locked instruction: an uncontended `lock cmpxchg` + release costs
//! ~15-30 ns on this VM, more than the rest of `emit`), and the writer thread, which takes a
//! slot's buffer a few times per 100 ms, pays for both sides with one
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of the process
//! executes a full memory barrier before the call returns.
//!
//! The protocol is the one biased lock (`crate::sys::biased`), held per slot (`slots::Slot`):
//! the owner checks the slot's lock inside its window; the writer takes the lock, then
//! ([`heavy`]) runs the barrier and waits for the owner to leave its window. Without
//! membarrier (old kernel, seccomp) [`available`] is false and every hand-off takes the lock.

use std::sync::atomic::{AtomicBool, Ordering};

static AVAILABLE: AtomicBool = AtomicBool::new(false);

/// The asymmetric protocol may be used (registered in this process).
#[inline]
pub(crate) fn available() -> bool {
    AVAILABLE.load(Ordering::Relaxed)
}

/// Enable the protocol where the process can use `membarrier` (once per process; a forked
/// child again). `VRAMSHIM_TRACE_LOCKS=1` keeps the locked hand-off.
pub(crate) fn init() {
    if available() || super::config_var("VRAMSHIM_TRACE_LOCKS").is_some_and(|v| v.trim() == "1") {
        return;
    }
    if crate::sys::membarrier::available() {
        AVAILABLE.store(true, Ordering::Release);
    }
}

/// The writer's side: a full barrier on every running thread of the process. False when the
/// kernel refused (then the writer must not rely on the protocol).
pub(crate) fn heavy() -> bool {
    #[cfg(test)]
    if FAILS.get() {
        return false;
    }
    crate::sys::membarrier::all_threads()
}

#[cfg(test)]
thread_local! {
    /// Tests: [`heavy`] fails on this thread (as when the kernel refuses the barrier).
    pub(crate) static FAILS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Forked child: a new address space, not registered.
pub(crate) fn on_fork_child() {
    AVAILABLE.store(false, Ordering::Relaxed);
    crate::sys::membarrier::on_fork_child();
}
