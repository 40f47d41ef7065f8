//! A thread that exits from a signal handler that interrupted it just after it queued a full
//! buffer for the writer (before its slot got a new one) gets that buffer written, and not also
//! counted lost: the exit writes what is queued, and the writer marks the hand-over written, so
//! the slot's note of a buffer out does not count it again. Every event is written once.

use vramshim::tracer::testing::HandOverPoint;
use vramshim_trace_tests::tick_window::exit_in_hand_over;

#[test]
fn a_handler_that_exits_after_queueing_gets_the_buffer_written_once() {
    let c = exit_in_hand_over(
        "trace_tick_window_exit_hand_over_queued",
        HandOverPoint::Queued,
    );
    assert_eq!(c.lost, 0, "the queued buffer is written, not counted lost");
}
