//! `tick_window_exit_own.rs` for `_exit`: a thread whose signal handler calls `_exit` having
//! interrupted it inside its own trace buffer (`tracer::testing::inside_own_slot`) gets that
//! buffer's events counted lost, and the trace still ends. The `_exit` hook has the writer
//! thread drain every buffer while the exiting thread waits; the writer is told the exiting
//! thread's slot, which that thread cannot leave while its handler runs, and gives it up,
//! counting its events in the `Lost` record before the end record. The events a tick took
//! before are written. With `VRAMSHIM_TRACE_FAULT=own-wait` (the drain waits for that slot
//! like any other's and drops what it gives up on uncounted) they are neither written nor
//! counted: this fails.

use std::sync::atomic::{AtomicBool, Ordering};

use vramshim::tracer;
use vramshim_trace_tests::tick_window::{check_counted, emit, ten_taken};

static HANDLED: AtomicBool = AtomicBool::new(false);

extern "C" fn quick_exit_from_handler(_sig: libc::c_int) {
    // What `_exit` called from a handler runs first (the library's `_exit` hook).
    tracer::testing::quick_exit();
    HANDLED.store(true, Ordering::SeqCst);
}

#[test]
fn a_handler_that_calls_exit_inside_its_own_slot_gets_the_slots_events_counted_lost() {
    // Its first ten events are taken by a whole tick.
    let (path, tid, mut next) = ten_taken("trace_tick_window_exit_own_quick");
    // These stay in the thread's buffer.
    for _ in 0..5 {
        emit(tid, next);
        next += 1;
    }
    // SAFETY: installs a handler for SIGUSR1 (a plain function) in this test process.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            quick_exit_from_handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    assert_ne!(old, libc::SIG_ERR);
    tracer::testing::inside_own_slot(|| {
        // SAFETY: raise delivers SIGUSR1 to this thread before it returns.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    });
    assert!(HANDLED.load(Ordering::SeqCst), "the handler did not run");
    let c = check_counted(&path, tid, next);
    assert_eq!(
        (c.events, c.lost),
        (10, 5),
        "the events a tick took are written, those left in the slot counted lost"
    );
}
