//! Process lifecycle hooks for the tracer (owner: trace): `fork` (a `Fork` record in the
//! parent's trace, with the child's pid) and `_exit`/`_Exit` (flush the trace and write its
//! end record, which `atexit` never sees for these). Both only act when tracing already runs
//! in this process; otherwise they are a straight call through.
//!
//! Limits (docs/trace-format.md section 9): `vfork`, `clone` and `posix_spawn` children are
//! not recorded (they exec at once); `_exit` in a vfork child never touches the parent's
//! trace. `_exit` is async-signal-safe, and so is its hook: the exiting thread neither
//! allocates nor locks (a signal handler may have interrupted `malloc` on it); the writer
//! thread finishes the trace, waited for a bounded time (`tracer::on_quick_exit`), and glibc's
//! `_exit` is looked up at load, not here (`dlsym` is not async-signal-safe).

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cuda::real;
use crate::tracer;
use vramshim_trace::Event;

type ForkFn = unsafe extern "C" fn() -> libc::pid_t;
type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// glibc's `_exit` (0: not looked up yet), resolved by [`init`].
static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Looks up glibc's `_exit` (at load, from the library's constructor).
pub(crate) fn init() {
    let p = real::dlsym_real(libc::RTLD_NEXT, c"_exit");
    REAL_EXIT.store(p as usize, Ordering::Release);
}

fn real_exit(code: c_int) -> ! {
    let mut p = REAL_EXIT.load(Ordering::Acquire) as *mut libc::c_void;
    if p.is_null() {
        // Only before the constructor ran (another library's constructor calling `_exit`).
        p = real::dlsym_real(libc::RTLD_NEXT, c"_exit");
    }
    if !p.is_null() {
        // SAFETY: glibc's `_exit`, with the caller's argument.
        unsafe { std::mem::transmute::<*mut libc::c_void, ExitFn>(p)(code) }
    }
    // SAFETY: exit_group ends the process; it has no memory-safety preconditions.
    unsafe { libc::syscall(libc::SYS_exit_group, code as libc::c_long) };
    unreachable_exit()
}

/// `exit_group` does not return; if it somehow did, abort rather than return into `_exit`'s
/// caller (which `_exit`'s contract forbids).
fn unreachable_exit() -> ! {
    std::process::abort()
}

/// # Safety
/// C ABI: `fork`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    let p = real::dlsym_real(libc::RTLD_NEXT, c"fork");
    if p.is_null() {
        // SAFETY: setting errno, as fork does on failure.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: glibc's `fork`; its atfork handlers (ours included) run inside it.
    let pid = unsafe { std::mem::transmute::<*mut libc::c_void, ForkFn>(p)() };
    if pid > 0 {
        let _ = std::panic::catch_unwind(|| {
            if tracer::running() {
                tracer::emit(Event::Fork {
                    t_ns: tracer::now_raw(),
                    child_pid: pid as u32,
                });
            }
        });
    }
    pid
}

fn flush_before_exit() {
    let _ = std::panic::catch_unwind(tracer::on_quick_exit);
}

/// # Safety
/// C ABI: `_exit`'s contract (never returns).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    flush_before_exit();
    real_exit(code)
}

/// # Safety
/// C ABI: `_Exit`'s contract (never returns).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _Exit(code: c_int) -> ! {
    flush_before_exit();
    real_exit(code)
}
