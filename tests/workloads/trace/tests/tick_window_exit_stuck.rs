//! A thread that stays inside its own trace buffer (its window, or its lock:
//! `tracer::testing::inside_own_slot`) through all of the exit drain's patience, as a stopped
//! thread does, gets the events that buffer holds counted lost in the `Lost` record before
//! the end record: the drain gives its slot up when its patience is spent (100 ms at most for
//! all threads together) and counts what
//! it could not take. The events a tick took before are written. With
//! `VRAMSHIM_TRACE_FAULT=own-wait` (slots given up on are dropped uncounted, as before) they are
//! neither written nor counted: this fails.

use std::sync::mpsc::sync_channel;

use vramshim::tracer;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check_counted, emit, gettid, whole_tick};

#[test]
fn a_slot_whose_thread_stays_inside_through_the_exit_drain_is_counted_lost() {
    let dir = temp_dir("trace_tick_window_exit_stuck");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (emitted_tx, emitted_rx) = sync_channel::<()>(0);
    let (go_on_tx, go_on_rx) = sync_channel::<()>(0);
    let (inside_tx, inside_rx) = sync_channel::<()>(0);
    let (done_tx, done_rx) = sync_channel::<()>(0);
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0u64;
        for _ in 0..10 {
            emit(tid, next);
            next += 1;
        }
        emitted_tx.send(()).unwrap();
        go_on_rx.recv().unwrap();
        // These stay in the thread's buffer.
        for _ in 0..5 {
            emit(tid, next);
            next += 1;
        }
        tracer::testing::inside_own_slot(|| {
            inside_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        (tid, next)
    });
    emitted_rx.recv().unwrap();
    // A whole tick after the first events takes them.
    whole_tick();
    go_on_tx.send(()).unwrap();
    inside_rx.recv().unwrap();
    // The thread stays inside its slot until the trace is finished.
    tracer::on_exit();
    done_tx.send(()).unwrap();
    let (tid, n) = t.join().unwrap();
    let c = check_counted(&path, tid, n);
    assert_eq!(
        (c.events, c.lost),
        (10, 5),
        "the events a tick took are written, those left in the slot counted lost"
    );
}
