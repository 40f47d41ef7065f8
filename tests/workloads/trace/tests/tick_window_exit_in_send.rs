//! A thread that a signal handler interrupts inside the channel's own send of a full buffer to
//! the writer (its place in the channel claimed, not yet filled), where the handler exits
//! (`on_exit`), does not hang the exit: the library blocks signals across the send, so the
//! handler runs once the buffer is queued, and the exit writes it (every event written once).
//!
//! The signal lands in that window every time: the thread is single-stepped (the x86 trap
//! flag, a SIGTRAP after each instruction) from just before the send until the channel counts
//! the claimed place, and the step's handler then raises SIGUSR1, whose handler exits. With
//! `VRAMSHIM_TRACE_FAULT=send-unmasked` (signals not blocked) the exit spins for
//! ever on the half-written place (or waits for the writer thread's lock while that thread
//! spins on it): the watchdog then fails the test.

#![cfg(target_arch = "x86_64")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vramshim::tracer;
use vramshim::tracer::testing::HandOverPoint;
use vramshim_trace_tests::tick_window::{
    check_counted, emit_until_a_handler_exits, ten_taken, watchdog,
};

/// The trap flag of RFLAGS: a debug exception (SIGTRAP) after every instruction.
const TF: i64 = 0x100;

static ARMED: AtomicBool = AtomicBool::new(false);
static CLAIMED: AtomicBool = AtomicBool::new(false);

/// After each instruction of the stepped thread: once the send has claimed its place in the
/// (otherwise empty) channel, stop stepping and raise the signal whose handler exits.
extern "C" fn on_step(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if tracer::testing::queued_buffers() == 0 {
        return;
    }
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passes this handler (SA_SIGINFO) the interrupted context; clearing
    // the trap flag in its saved flags stops the stepping when the handler returns.
    unsafe { (*uc).uc_mcontext.gregs[libc::REG_EFL as usize] &= !TF };
    CLAIMED.store(true, Ordering::SeqCst);
    // SAFETY: raise sends SIGUSR1 (its handler installed) to this thread: handled when this
    // handler returns (its mask holds SIGUSR1), unless the thread has it blocked.
    unsafe { libc::raise(libc::SIGUSR1) };
}

/// The hand-over hook: at the first send, once the writer has taken every earlier buffer,
/// step the thread through the send.
fn step_the_send(p: HandOverPoint) {
    if p != HandOverPoint::Sending || !ARMED.swap(false, Ordering::SeqCst) {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while tracer::testing::queued_buffers() > 0 {
        assert!(
            Instant::now() < deadline,
            "the writer took no buffer in 60 s"
        );
        std::thread::yield_now();
    }
    // SAFETY: sets the trap flag in RFLAGS (push, or, pop: the stack is restored); the
    // SIGTRAP handler installed by the test clears it again.
    unsafe { std::arch::asm!("pushfq", "or qword ptr [rsp], 0x100", "popfq") };
}

#[test]
fn a_handler_that_exits_from_inside_the_send_does_not_hang() {
    let (path, tid, mut next) = ten_taken("trace_tick_window_exit_in_send");
    // SAFETY: a zeroed sigaction filled in here; the handler is a plain function of this test.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_step
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaddset(&mut sa.sa_mask, libc::SIGUSR1);
        assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()), 0);
    }
    watchdog(
        120,
        "the exit did not finish in 120 s: it spins on the send it interrupted",
    );
    ARMED.store(true, Ordering::SeqCst);
    emit_until_a_handler_exits(tid, &mut next, step_the_send);
    assert!(
        CLAIMED.load(Ordering::SeqCst),
        "the send was never seen to claim its place"
    );
    let c = check_counted(&path, tid, next);
    assert_eq!(c.lost, 0, "the queued buffer is written, not counted lost");
}
