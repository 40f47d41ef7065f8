//! Asymmetric barriers: the application thread's side of a slot hand-off costs two plain
//! stores and a load (no locked instruction: an uncontended `lock cmpxchg` + release costs
//! ~15-30 ns on this VM, more than the rest of `emit`), and the writer thread, which takes a
//! slot's buffer a few times per 100 ms, pays for both sides with one
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread of the process
//! executes a full memory barrier before the call returns.
//!
//! The protocol (`slots::Slot`): the owner stores `busy = true`, then ([`light`]) loads
//! `claim`; the writer stores `claim = true`, then ([`heavy`]) loads `busy`. With the heavy
//! barrier between the writer's store and load, they cannot both miss each other: either the
//! owner sees the claim (and takes the slot's lock instead), or the writer sees it busy (and
//! waits for `busy = false`). Without membarrier (old kernel, seccomp) [`available`] is false
//! and every hand-off takes the lock.

use std::sync::atomic::{AtomicBool, Ordering, compiler_fence};

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

/// The application thread's side: keep the compiler from moving the `claim` load above the
/// `busy` store (the CPU may; [`heavy`] covers that).
#[inline(always)]
pub(crate) fn light() {
    compiler_fence(Ordering::SeqCst);
}

/// The writer's side: a full barrier on every running thread of the process. False when the
/// kernel refused (then the writer must not rely on the protocol).
pub(crate) fn heavy() -> bool {
    crate::sys::membarrier::all_threads()
}

/// Forked child: a new address space, not registered.
pub(crate) fn on_fork_child() {
    AVAILABLE.store(false, Ordering::Relaxed);
    crate::sys::membarrier::on_fork_child();
}
