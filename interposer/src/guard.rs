//! Per-thread state of the hooks, in one const-initialized, non-Drop thread-local (a plain
//! `#[thread_local]`: no lazy init, no destructor registration, usable in constructors and
//! during thread exit), reached once per hook:
//!
//! * re-entrancy depth: one request = one event = one charge. While an outer hook runs (a
//!   `cudaMalloc`), hooks it reaches again (the runtime's `cuMemAlloc_v2` through our own
//!   `cuGetProcAddress` substitution) pass straight through to the real function;
//! * how many hooks this thread passed through that way;
//! * this thread's block of call counters (`counters::CallBlock`).

use std::cell::Cell;

pub(crate) struct State {
    depth: Cell<u32>,
    nested: Cell<u64>,
    /// This thread's call-counter block; null until its first counted call, and again after
    /// its thread-exit destructor ran.
    pub(crate) calls: Cell<*const crate::counters::CallBlock>,
    /// Set by the thread-exit destructor: do not claim a block again on this thread.
    pub(crate) exited: Cell<bool>,
}

thread_local! {
    static STATE: State = const {
        State {
            depth: Cell::new(0),
            nested: Cell::new(0),
            calls: Cell::new(std::ptr::null()),
            exited: Cell::new(false),
        }
    };
}

/// Proof of being the outermost hook on this thread; hand it back with [`Token::leave`].
/// Holds the address of this thread's state (valid while the thread lives, and only used on
/// this thread).
pub struct Token(*const State);

impl Token {
    /// Leave the outermost hook.
    #[inline(always)]
    pub fn leave(self) {
        if !self.0.is_null() {
            // SAFETY: the pointer is this thread's STATE, alive for the thread's lifetime.
            unsafe { (*self.0).depth.set(0) };
        }
    }

    /// This thread's state (None when thread-local storage is already gone).
    #[inline(always)]
    pub(crate) fn state(&self) -> Option<&State> {
        // SAFETY: as above; the reference does not outlive the hook (same thread).
        unsafe { self.0.as_ref() }
    }
}

/// Enter a hook: `Some(token)` if this is the outermost hook on this thread (give the token
/// back with [`Token::leave`]); `None` if nested: pass straight through.
#[inline(always)]
pub fn enter() -> Option<Token> {
    match STATE.try_with(|s| {
        if s.depth.get() == 0 {
            s.depth.set(1);
            Some(Token(s as *const State))
        } else {
            s.nested.set(s.nested.get() + 1);
            None
        }
    }) {
        Ok(t) => t,
        // Thread-local storage already destroyed (a free from a TLS destructor at thread
        // exit): account it anyway, there is no outer hook on this thread.
        Err(_) => Some(Token(std::ptr::null())),
    }
}

/// Hooks the calling thread passed straight through so far.
pub fn nested_on_this_thread() -> u64 {
    STATE.try_with(|s| s.nested.get()).unwrap_or(0)
}

/// Whether a hook is active on this thread.
#[inline]
pub fn active() -> bool {
    STATE.try_with(|s| s.depth.get() > 0).unwrap_or(true)
}

/// Run `f` on this thread's state (counters' registration and thread-exit handling).
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    STATE.try_with(f).ok()
}

/// Reset after fork (the forking thread is the child's only thread).
pub(crate) fn on_fork_child() {
    let _ = STATE.try_with(|s| {
        s.depth.set(0);
        s.nested.set(0);
    });
}
