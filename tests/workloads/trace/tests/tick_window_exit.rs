//! The exit path's tick (on the exiting thread) writes everything a thread handed over, in
//! order, even a buffer handed over between the tick's read of the queue and its taking of
//! the partial buffers: the tick is held in that window (`tracer::testing::on_tick`) while
//! another thread hands a buffer over and then emits more. With
//! `VRAMSHIM_TRACE_FAULT=partials-first` (the tick as it was) that buffer stays in the queue
//! after the end record, lost without a count: this fails.

use std::sync::mpsc::sync_channel;

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check, emit, gettid, hand_over_then, hold_once};

#[test]
fn a_buffer_handed_over_while_the_exit_tick_drains_is_written() {
    let dir = temp_dir("trace_tick_window_exit");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (started_tx, started_rx) = sync_channel::<()>(0);
    let (held_rx, done_tx) = hold_once(TickPoint::BeforeDrain { at_exit: true });
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0;
        emit(tid, next);
        next += 1;
        started_tx.send(()).unwrap();
        held_rx.recv().unwrap();
        hand_over_then(tid, &mut next, 10);
        done_tx.send(()).unwrap();
        (tid, next)
    });
    started_rx.recv().unwrap();
    // Holds its tick (on this thread) until the thread is done.
    tracer::on_exit();
    let (tid, n) = t.join().unwrap();
    tracer::testing::on_tick(None);
    check(&path, tid, n);
}
