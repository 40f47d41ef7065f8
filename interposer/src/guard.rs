//! Per-thread state of the hooks, in one zero-initialized, non-Drop thread-local block (no
//! lazy init, no destructor registration, usable in constructors and during thread exit),
//! reached once per hook with two instructions (see `tls`):
//!
//! * re-entrancy depth: one request = one event = one charge. While an outer hook runs (a
//!   `cudaMalloc`), hooks it reaches again (the runtime's `cuMemAlloc_v2` through our own
//!   `cuGetProcAddress` substitution) pass straight through to the real function;
//! * how many hooks this thread passed through that way;
//! * this thread's block of call counters (`counters::CallBlock`), its live-table parts
//!   (`live_table`) and its remembered runtime device (`hooks::current`).

use std::cell::Cell;

#[repr(C)]
pub(crate) struct State {
    depth: Cell<u32>,
    /// Set by the thread-exit destructor: do not claim a block again on this thread.
    pub(crate) exited: Cell<bool>,
    nested: Cell<u64>,
    /// This thread's call-counter block; null until its first counted call, and again after
    /// its thread-exit destructor ran.
    pub(crate) calls: Cell<*const crate::counters::CallBlock>,
    /// The runtime's current device + 1 as last asked (0: ask again; `hooks::current`).
    pub(crate) rt_device: Cell<i32>,
    /// This thread's kernel id, 0 until asked (`ids::tid`): here rather than in a
    /// `thread_local!` of its own, which costs a `__tls_get_addr` call per read in a cdylib.
    pub(crate) tid: Cell<u32>,
    /// This thread's trace buffer (`tracer::slots`), null until its first event; here for
    /// the same reason.
    pub(crate) trace_slot: Cell<*const ()>,
    /// This thread's parts of the per-thread live tables (`live_table::LiveTable::own`).
    pub(crate) parts: [Cell<*const ()>; crate::live_table::CACHE_SLOTS],
}

/// The state lives in this library's static TLS block, reached with the initial-exec model:
/// one `mov %fs:0` and one add of a GOT offset, where `thread_local!` in a cdylib costs a
/// call to `__tls_get_addr` (~20 instructions) per hook. A preloaded library is loaded at
/// start-up, so its static TLS is reserved then; `dlopen` of it still works (glibc keeps
/// spare static TLS for such libraries, and this block is 64 bytes). All-zero bytes are a
/// valid `State` (depth 0, not exited, no block), which is what `.tbss` holds in every
/// new thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tls {
    use super::State;
    const _: () = assert!(std::mem::size_of::<State>() <= 64);

    std::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 6",
        // Global for the other codegen units of this crate, hidden from everything else.
        ".globl vramshim_guard_state",
        ".hidden vramshim_guard_state",
        ".type vramshim_guard_state, @object",
        ".size vramshim_guard_state, 64",
        "vramshim_guard_state:",
        ".zero 64",
        ".popsection",
    );

    #[inline(always)]
    pub(super) fn state() -> *const State {
        let p: *const State;
        // SAFETY: reads the thread pointer and this library's TLS offset from the GOT (both
        // valid for the life of the thread); the result is this thread's 64-byte block,
        // zero-initialized by the loader, which is a valid `State`. `nomem`: both words it
        // reads are fixed for the life of the thread (no Rust code writes them), so the
        // compiler may compute it once per hook instead of again after every store.
        unsafe {
            std::arch::asm!(
                "mov {p}, qword ptr fs:[0]",
                "add {p}, qword ptr [rip + vramshim_guard_state@GOTTPOFF]",
                p = out(reg) p,
                options(pure, nomem, nostack),
            );
        }
        p
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tls {
    use super::State;
    use std::cell::Cell;
    thread_local! {
        static STATE: State = const {
            State {
                depth: Cell::new(0),
                exited: Cell::new(false),
                nested: Cell::new(0),
                calls: Cell::new(std::ptr::null()),
                rt_device: Cell::new(0),
                tid: Cell::new(0),
                trace_slot: Cell::new(std::ptr::null()),
                parts: [const { Cell::new(std::ptr::null()) }; crate::live_table::CACHE_SLOTS],
            }
        };
    }
    #[inline(always)]
    pub(super) fn state() -> *const State {
        STATE.with(|s| s as *const State)
    }
}

/// This thread's state (valid for the thread's lifetime, only used on this thread).
#[inline(always)]
pub(crate) fn state() -> &'static State {
    st()
}

#[inline(always)]
fn st() -> &'static State {
    // SAFETY: see `tls::state`; the reference never leaves this thread (State is !Sync).
    unsafe { &*tls::state() }
}

/// Proof of being the outermost hook on this thread; hand it back with [`Token::leave`].
/// Holds this thread's state (valid while the thread lives, and only used on this thread:
/// `State` is not `Sync`, so neither is the token).
pub struct Token(&'static State);

impl Token {
    /// Leave the outermost hook.
    #[inline(always)]
    pub fn leave(self) {
        self.0.depth.set(0);
    }

    /// This thread's state.
    #[inline(always)]
    pub(crate) fn state(&self) -> &State {
        self.0
    }
}

/// Enter a hook: `Some(token)` if this is the outermost hook on this thread (give the token
/// back with [`Token::leave`]); `None` if nested: pass straight through.
#[inline(always)]
pub fn enter() -> Option<Token> {
    let s = st();
    if s.depth.get() == 0 {
        s.depth.set(1);
        Some(Token(s))
    } else {
        s.nested.set(s.nested.get() + 1);
        None
    }
}

/// For hooks that the runtime reaches from inside ours: if a hook is already active on this
/// thread and `real` knows the real function (resolved, so no call), count this one as
/// passed straight through (as [`enter`] would) and return the function to jump to. `None`:
/// take the hook's full path (which passes through, and counts, by [`enter`] when nested).
/// Checked first, before any frame is set up.
#[inline(always)]
pub fn nested_real<F>(real: impl FnOnce() -> Option<F>) -> Option<F> {
    let s = st();
    if s.depth.get() == 0 {
        return None;
    }
    let f = real()?;
    s.nested.set(s.nested.get() + 1);
    Some(f)
}

/// Hooks the calling thread passed straight through so far.
pub fn nested_on_this_thread() -> u64 {
    st().nested.get()
}

/// Whether a hook is active on this thread.
#[inline]
pub fn active() -> bool {
    st().depth.get() > 0
}

/// Run `f` on this thread's state (counters' registration and thread-exit handling).
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    Some(f(st()))
}

/// Reset after fork (the forking thread is the child's only thread).
pub(crate) fn on_fork_child() {
    let s = st();
    s.depth.set(0);
    s.nested.set(0);
}
