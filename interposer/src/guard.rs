//! Re-entrancy: one request = one event = one charge. While an outer hook runs (a
//! `cudaMalloc`), hooks it reaches again (the runtime's `cuMemAlloc_v2` through our own
//! `cuGetProcAddress` substitution) pass straight through to the real function.
//!
//! The depth counter is a const-initialized, non-Drop thread-local: no lazy init, no
//! destructor registration, usable in constructors and during thread exit.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Enter a hook. Returns `true` if this is the outermost hook on this thread (the caller
/// must then call [`leave`]); `false` if nested: pass straight through, do not `leave`.
#[inline(always)]
pub fn enter() -> bool {
    DEPTH
        .try_with(|d| {
            if d.get() == 0 {
                d.set(1);
                true
            } else {
                false
            }
        })
        // Thread-local storage already destroyed (a free from a TLS destructor at thread
        // exit): account it anyway, there is no outer hook on this thread.
        .unwrap_or(true)
}

/// Leave the outermost hook.
#[inline(always)]
pub fn leave() {
    let _ = DEPTH.try_with(|d| d.set(0));
}

/// Whether a hook is active on this thread.
#[inline]
pub fn active() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// Reset after fork (the forking thread is the child's only thread and is inside no hook
/// of ours unless it forked from within CUDA, which CUDA does not support).
pub(crate) fn on_fork_child() {
    let _ = DEPTH.try_with(|d| d.set(0));
}
