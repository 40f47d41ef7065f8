//! A thread that emits after the exit path's tick has taken the last buffers (and before the
//! end record) gets every event written or counted lost: the exit tick is held after its drain
//! (`tracer::testing::on_tick`) while another thread emits more than a buffer's worth (so that
//! one would be handed over, too). The writer no longer takes events then, so they are counted
//! in the `Lost` record before the end record. With `VRAMSHIM_TRACE_FAULT=late-close` (threads
//! stopped only after the end record, as before) they sit in the thread's buffer and the
//! writer's queue, neither written nor counted: this fails.

use std::sync::mpsc::sync_channel;

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check_counted, emit, gettid};

#[test]
fn events_emitted_after_the_exit_ticks_drain_are_counted_lost() {
    let dir = temp_dir("trace_tick_window_exit_late");
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (started_tx, started_rx) = sync_channel::<()>(0);
    let (held_tx, held_rx) = sync_channel::<()>(0);
    let (done_tx, done_rx) = sync_channel::<()>(0);
    let mut fired = false;
    tracer::testing::on_tick(Some(Box::new(move |p| {
        if p == (TickPoint::AfterDrain { at_exit: true }) && !fired {
            fired = true;
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        }
    })));
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0;
        for _ in 0..10 {
            emit(tid, next);
            next += 1;
        }
        started_tx.send(()).unwrap();
        held_rx.recv().unwrap();
        // Three buffers' worth (a buffer is handed over at 1024 entries).
        for _ in 0..3000 {
            emit(tid, next);
            next += 1;
        }
        done_tx.send(()).unwrap();
        (tid, next)
    });
    started_rx.recv().unwrap();
    // Holds its tick (on this thread) after the drain until the thread is done.
    tracer::on_exit();
    let (tid, n) = t.join().unwrap();
    tracer::testing::on_tick(None);
    let c = check_counted(&path, tid, n);
    assert_eq!(
        c.events, 10,
        "thread {tid}: the events before the exit are written"
    );
}
