//! Per-thread state of the hooks, in one zero-initialized, non-Drop thread-local block (no
//! lazy init, no destructor registration, usable in constructors and during thread exit),
//! reached once per hook with two instructions (see `tls`):
//!
//! * re-entrancy depth: one request = one event = one charge. While an outer hook runs (a
//!   `cudaMalloc`), hooks it reaches again (the runtime's `cuMemAlloc_v2` through our own
//!   `cuGetProcAddress` substitution) pass straight through to the real function;
//! * how many hooks this thread passed through that way;
//! * opaque pointers to what the layers above keep per thread (the call-counter block, the
//!   live-table parts, the trace buffer) and its remembered runtime device: this layer
//!   names none of their types;
//! * the thread-exit handler that gives those back ([`at_thread_exit`]).

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Per-thread parts a live table may cache in the state (see `state::live_table`).
pub(crate) const PARTS: usize = 2;

#[repr(C)]
pub(crate) struct State {
    depth: Cell<u32>,
    /// Set by the thread-exit destructor: do not claim a block again on this thread.
    pub(crate) exited: Cell<bool>,
    /// This thread's exit handler is registered (see [`at_thread_exit`]).
    exit_registered: Cell<bool>,
    nested: Cell<u64>,
    /// This thread's call-counter block (`state::counters`); null until its first counted
    /// call, and again after its thread-exit handler ran.
    pub(crate) calls: Cell<*const ()>,
    /// The runtime's current device + 1 as last asked (0: ask again; `hooks::current`).
    pub(crate) rt_device: Cell<i32>,
    /// This thread's kernel id, 0 until asked (`ids::tid`): here rather than in a
    /// `thread_local!` of its own, which costs a `__tls_get_addr` call per read in a cdylib.
    pub(crate) tid: Cell<u32>,
    /// This thread's trace buffer (`tracer::slots`), null until its first event; here for
    /// the same reason.
    pub(crate) trace_slot: Cell<*const ()>,
    /// This thread's parts of the per-thread live tables (`live_table::LiveTable::own`).
    pub(crate) parts: [Cell<*const ()>; PARTS],
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
                exit_registered: Cell::new(false),
                nested: Cell::new(0),
                calls: Cell::new(std::ptr::null()),
                rt_device: Cell::new(0),
                tid: Cell::new(0),
                trace_slot: Cell::new(std::ptr::null()),
                parts: [const { Cell::new(std::ptr::null()) }; super::PARTS],
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
pub(crate) struct Token(&'static State);

impl Token {
    /// Leave the outermost hook.
    #[inline(always)]
    pub(crate) fn leave(self) {
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
pub(crate) fn enter() -> Option<Token> {
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
pub(crate) fn nested_real<F>(real: impl FnOnce() -> Option<F>) -> Option<F> {
    let s = st();
    if s.depth.get() == 0 {
        return None;
    }
    let f = real()?;
    s.nested.set(s.nested.get() + 1);
    Some(f)
}

/// Hooks the calling thread passed straight through so far.
pub(crate) fn nested_on_this_thread() -> u64 {
    st().nested.get()
}

/// Run `f` on this thread's state (counters' registration and thread-exit handling).
pub(crate) fn with_state<R>(f: impl FnOnce(&State) -> R) -> Option<R> {
    Some(f(st()))
}

// ------------------------------------------------------------------- thread exit

/// What runs when a registered thread exits: the release functions of the layers that keep
/// per-thread resources in the state (each added once, by its first registration).
static EXIT_FNS: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
/// pthread key + 1 (0 = not created yet, usize::MAX = creation failed).
static KEY: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_thread_exit(_: *mut c_void) {
    // Late calls on this thread (TLS destructors freeing memory) take the shared paths.
    let s = st();
    s.exited.set(true);
    for f in &EXIT_FNS {
        let a = f.load(Ordering::Acquire);
        if a != 0 {
            // SAFETY: only `at_thread_exit` stores here, and only addresses of `fn(&State)`.
            let f = unsafe { std::mem::transmute::<usize, fn(&State)>(a) };
            f(s);
        }
    }
}

fn key() -> Option<libc::pthread_key_t> {
    let k = KEY.load(Ordering::Acquire);
    if k == usize::MAX {
        return None;
    }
    if k != 0 {
        return Some((k - 1) as libc::pthread_key_t);
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: key is a valid out-pointer; the destructor is a plain extern "C" fn.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) };
    let v = if rc == 0 {
        key as usize + 1
    } else {
        usize::MAX
    };
    match KEY.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => (rc == 0).then_some(key),
        Err(cur) => {
            if rc == 0 {
                // SAFETY: we created this key and nobody else has seen it.
                unsafe { libc::pthread_key_delete(key) };
            }
            (cur != usize::MAX).then(|| (cur - 1) as libc::pthread_key_t)
        }
    }
}

/// Make sure `release` runs when the calling thread exits, so that what a layer keeps for
/// this thread in `st` goes back. False once the thread is exiting (its handler ran or
/// runs): keep nothing for it then.
#[cold]
pub(crate) fn at_thread_exit(st: &State, release: fn(&State)) -> bool {
    if st.exited.get() {
        return false;
    }
    let a = release as usize;
    for f in &EXIT_FNS {
        match f.compare_exchange(0, a, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(cur) if cur == a => break,
            Err(_) => {}
        }
    }
    if !st.exit_registered.get() {
        st.exit_registered.set(true);
        if let Some(k) = key() {
            // SAFETY: k is a valid key; any non-null value makes the destructor run.
            unsafe { libc::pthread_setspecific(k, st as *const State as *const c_void) };
        }
    }
    true
}

/// Reset after fork (the forking thread is the child's only thread).
pub(crate) fn on_fork_child() {
    let s = st();
    s.depth.set(0);
    s.nested.set(0);
}
