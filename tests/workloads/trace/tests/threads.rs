//! 16 threads x 1M events through the tracer in-process (the interposer as a library, events
//! handed straight to `tracer::emit`, as the hooks do): nothing is lost, or every loss is
//! recorded so that written + lost == emitted exactly; per thread, order is preserved.

use vramshim::tracer;
use vramshim_testkit::temp_dir;
use vramshim_trace::{AllocKind, Api, Event, MemOp, TraceReader};

const THREADS: usize = 16;
const PER_THREAD: u64 = 1_000_000;

#[test]
fn sixteen_threads_a_million_events_each() {
    let dir = temp_dir("trace_threads");
    let path = dir.join("threads.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    assert!(tracer::enabled());
    let handles: Vec<_> = (0..THREADS)
        .map(|k| {
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u32;
                for i in 0..PER_THREAD {
                    let m = MemOp {
                        t_ns: tracer::now_raw(),
                        tid,
                        api: Api::CudaMalloc,
                        kind: AllocKind::Runtime,
                        flags: 0,
                        device: 0,
                        stream: 0,
                        addr: ((k as u64 + 1) << 40) | (i << 8),
                        size: i,
                        result: 0,
                        latency_ns: 100,
                        stack: 0,
                    };
                    tracer::emit(if i % 2 == 0 {
                        Event::Alloc(m)
                    } else {
                        Event::Free(m)
                    });
                }
                tid
            })
        })
        .collect();
    let tids: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    tracer::on_exit();
    let lost_counted = tracer::testing::lost();

    // Stream it: 16M events do not need to sit in memory.
    let mut r = TraceReader::open(&path).unwrap();
    let mut next = [0u64; THREADS];
    let mut lost_recorded = 0u64;
    let mut written = 0u64;
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        match &e {
            Event::Alloc(m) | Event::Free(m) => {
                let k = ((m.addr >> 40) - 1) as usize;
                assert_eq!(m.tid, tids[k]);
                // Per thread, in order (a dropped buffer shows up as a gap, never a reorder).
                assert!(
                    m.size >= next[k],
                    "thread {k}: {} after {}",
                    m.size,
                    next[k]
                );
                assert_eq!(m.addr & 0xff_ffff_ffff, m.size << 8);
                assert_eq!(matches!(e, Event::Alloc(_)), m.size % 2 == 0);
                next[k] = m.size + 1;
                written += 1;
            }
            Event::Lost { count, .. } => lost_recorded += count,
            _ => {}
        }
    }
    assert_eq!(r.truncation(), None);
    eprintln!("written {written}, lost {lost_recorded}");
    assert_eq!(lost_recorded, lost_counted);
    assert_eq!(written + lost_recorded, THREADS as u64 * PER_THREAD);
    assert_eq!(lost_recorded, 0, "events were lost (recorded) at this rate");
}
