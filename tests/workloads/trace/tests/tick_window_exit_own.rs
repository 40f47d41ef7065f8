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
use vramshim_trace_tests::tick_window::exit_inside_own_slot;

static HANDLED: AtomicBool = AtomicBool::new(false);

extern "C" fn exit_from_handler(_sig: libc::c_int) {
    // What `exit()` called from a handler runs first (the library's exit hook).
    tracer::on_exit();
    HANDLED.store(true, Ordering::SeqCst);
}

#[test]
fn a_handler_that_exits_inside_its_own_slot_gets_the_slots_events_counted_lost() {
    exit_inside_own_slot("trace_tick_window_exit_own", exit_from_handler, &HANDLED);
}
