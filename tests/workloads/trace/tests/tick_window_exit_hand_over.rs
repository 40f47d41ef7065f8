//! A thread that exits from a signal handler that interrupted it in the middle of handing a
//! full buffer over (the buffer out of its slot, not yet queued for the writer) gets that
//! buffer's events counted lost in the `Lost` record before the end record: the slot says
//! what it has out, and the exit drain, which gives up the thread's own slot, counts it. The
//! events a tick took before are written. With `VRAMSHIM_SLOTS_FAULT=hand-over-uncounted` (only
//! the buffer in the slot is counted, as before) they are neither written nor counted: this
//! fails.

use vramshim::tracer::testing::HandOverPoint;
use vramshim_trace_tests::tick_window::exit_in_hand_over;

#[test]
fn a_handler_that_exits_mid_hand_over_gets_the_buffer_counted_lost() {
    let c = exit_in_hand_over("trace_tick_window_exit_hand_over", HandOverPoint::Taken);
    assert_eq!(c.events, 10, "the events a tick took are written");
    assert!(
        c.lost > 100,
        "the buffer handed over is counted lost ({})",
        c.lost
    );
}
