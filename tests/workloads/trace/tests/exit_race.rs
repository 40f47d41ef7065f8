//! A buffer handed to the writer thread just before the process exits is written, never
//! dropped uncounted: the exit path (on the exiting thread) and the writer thread must not
//! both think the other has it. `VRAMSHIM_TRACE_WRITER_FAULT=hold` makes the writer take a
//! buffer off its channel before it holds its lock and keep it 200 ms (the loop before
//! session 5's fix): this test then fails.

use vramshim::tracer;
use vramshim_testkit::temp_dir;
use vramshim_trace::{Event, TraceReader};
use vramshim_trace_tests::tick_window::{emit, gettid};

/// A few buffers' worth (a buffer is handed over at 1024 entries).
const EVENTS: u64 = 5000;

#[test]
fn a_buffer_handed_over_just_before_exit_is_written() {
    let dir = temp_dir("trace_exit_race");
    let path = dir.join("race.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let tid = gettid();
    for i in 0..EVENTS {
        emit(tid, i);
    }
    // Let the writer thread wake for the buffers handed over, then exit.
    std::thread::sleep(std::time::Duration::from_millis(20));
    tracer::on_exit();
    let lost = tracer::testing::lost();

    let mut r = TraceReader::open(&path).unwrap();
    let mut written = 0u64;
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        if let Event::Alloc(m) = &e {
            assert_eq!(m.size, written, "events out of order or missing");
            written += 1;
        }
    }
    assert_eq!(r.truncation(), None);
    assert_eq!(
        written + lost,
        EVENTS,
        "written {written}, counted lost {lost}"
    );
    assert_eq!(lost, 0);
}
