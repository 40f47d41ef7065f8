//! `membarrier(2)`: a full memory barrier on every running thread of this process, so that
//! a hot path can pair a plain store with a plain load and leave the barrier to the rare
//! side (the live table's cross-thread frees, the trace writer's buffer hand-off). One
//! registration per process, shared by every user; a forked child registers again (a new
//! address space starts unregistered).

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

const CMD_QUERY: libc::c_long = 0;
const CMD_GLOBAL: libc::c_long = 1;
const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

const UNASKED: u8 = 0;
const REGISTERED: u8 = 1;
const UNAVAILABLE: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNASKED);

fn call(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes (cmd, flags[, cpu_id]) and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    }
}

/// Registers this process for the expedited barrier on first use; whether it can be used
/// (false on kernels without it and under seccomp filters that refuse it).
pub(crate) fn available() -> bool {
    match STATE.load(Relaxed) {
        REGISTERED => true,
        UNAVAILABLE => false,
        _ => {
            let q = call(CMD_QUERY);
            let ok = q > 0
                && q & CMD_PRIVATE_EXPEDITED != 0
                && call(CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
            STATE.store(if ok { REGISTERED } else { UNAVAILABLE }, Relaxed);
            ok
        }
    }
}

/// A full barrier on every thread of the process that runs right now (the others pass one
/// when they are next scheduled). Falls back to the global (slow) command if the expedited
/// one is refused; false when neither worked, so the caller must not rely on it.
pub(crate) fn all_threads() -> bool {
    call(CMD_PRIVATE_EXPEDITED) == 0 || call(CMD_GLOBAL) == 0
}

/// Forked child: register again on next use.
pub(crate) fn on_fork_child() {
    STATE.store(UNASKED, Relaxed);
}

#[cfg(test)]
mod tests {
    #[test]
    fn registers_once_and_barriers_work_where_available() {
        let first = super::available();
        assert_eq!(super::available(), first, "the answer is remembered");
        if first {
            assert!(super::all_threads());
        }
        super::on_fork_child();
        assert_eq!(
            super::available(),
            first,
            "a fresh registration gives the same answer"
        );
    }
}
