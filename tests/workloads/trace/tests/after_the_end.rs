//! Events refused once the trace is finished come after its end, like events after tracing is
//! switched off: they are not counted lost, so the tracer's count stays what the trace's
//! `Lost` records say, and the finished file is left as it is. The writer counts refused
//! events only while the exit path is taking the last buffers (`Closing`: those are in the
//! `Lost` record before the end record, `tick_window_exit_late*.rs`); without that check this
//! test fails. A thread that passed the tracer's `enabled` check just before the exit path
//! finished reaches the writer's refusal so; here tracing is turned on again after the end
//! (`tracer::testing::enable`), which puts every later event there, on this thread's slot and
//! on a new thread's, through both ways of appending.

use vramshim::tracer;
use vramshim_testkit::temp_dir;
use vramshim_trace_tests::tick_window::{check, emit, emit_memop, gettid};

#[test]
fn events_refused_after_the_end_are_not_counted_lost() {
    let dir = temp_dir("trace_after_the_end");
    let path = dir.join("end.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let tid = gettid();
    for i in 0..10 {
        emit(tid, i);
    }
    tracer::on_exit();
    // all ten written, none counted lost
    check(&path, tid, 10);
    let finished = std::fs::read(&path).unwrap();

    tracer::testing::enable(path.to_str().unwrap(), 0);
    for i in 10..20 {
        emit(tid, i);
        emit_memop(tid, i);
    }
    std::thread::spawn(|| {
        let tid = gettid();
        emit(tid, 0);
        emit_memop(tid, 1);
    })
    .join()
    .unwrap();
    assert_eq!(
        tracer::testing::lost(),
        0,
        "events refused after the trace's end were counted lost (the trace's Lost records say 0)"
    );
    assert!(
        std::fs::read(&path).unwrap() == finished,
        "the finished trace changed after its end"
    );
    check(&path, tid, 10);
}
