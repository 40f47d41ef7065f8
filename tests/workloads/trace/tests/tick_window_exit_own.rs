//! A thread that exits from a signal handler that interrupted it inside its own trace buffer
//! (its window, or its lock: `tracer::testing::inside_own_slot`) gets the events that buffer
//! holds counted lost: the exit path's drain recognizes the calling thread's own slot, which
//! the thread cannot leave while the handler runs, and gives it up at once, counting its
//! events in the `Lost` record before the end record. The events a tick took before are
//! written. With `VRAMSHIM_TRACE_FAULT=own-wait` (the drain waits for its own slot like any
//! other's, through all of its patience in vain, and drops what it gives up on uncounted, as before)
//! they are neither written nor counted: this fails.

use std::sync::atomic::{AtomicBool, Ordering};

use vramshim::tracer;
use vramshim_trace_tests::tick_window::{check_counted, emit, ten_taken};

static HANDLED: AtomicBool = AtomicBool::new(false);

extern "C" fn exit_from_handler(_sig: libc::c_int) {
    // What `exit()` called from a handler runs first (the library's exit hook).
    tracer::on_exit();
    HANDLED.store(true, Ordering::SeqCst);
}

#[test]
fn a_handler_that_exits_inside_its_own_slot_gets_the_slots_events_counted_lost() {
    // Its first ten events are taken by a whole tick.
    let (path, tid, mut next) = ten_taken("trace_tick_window_exit_own");
    // These stay in the thread's buffer.
    for _ in 0..5 {
        emit(tid, next);
        next += 1;
    }
    // SAFETY: installs a handler for SIGUSR1 (a plain function) in this test process.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            exit_from_handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
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
