//! The writer thread's tick writes a thread's buffers in the order the thread filled them,
//! even when the thread hands a full buffer over between the tick's read of the queue and its
//! taking of the partial buffers: the tick is held in that window
//! (`tracer::testing::on_tick`) while the thread hands a buffer over and then emits more.
//! With `VRAMSHIM_TRACE_FAULT=partials-first` (the tick as it was: partial buffers written
//! before what was handed over meanwhile) the partial buffer's events come first: this fails.

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check, emit, gettid, hand_over_then, hold_once};

#[test]
fn a_buffer_handed_over_while_a_tick_drains_is_written_before_the_partial_one() {
    let dir = temp_dir("trace_tick_window_writer");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (held_rx, done_tx) = hold_once(TickPoint::BeforeDrain { at_exit: false });
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0;
        // The first event starts the writer thread, whose first tick is then held.
        emit(tid, next);
        next += 1;
        held_rx.recv().unwrap();
        hand_over_then(tid, &mut next, 10);
        done_tx.send(()).unwrap();
        (tid, next)
    });
    let (tid, n) = t.join().unwrap();
    tracer::testing::on_tick(None);
    tracer::on_exit();
    check(&path, tid, n);
}
