//! The trace writer's cost per frame and per event for small frames: what the interposer's
//! writer thread pays on a 50 ms tick that finds a few events.
//!
//! `frame_cost KIND EVENTS FRAMES`: writes FRAMES frames of EVENTS events each (KIND `sync`:
//! `Sync` records, as a training step's closing synchronize; `memop`: alloc/free pairs with
//! noisy nanosecond timings) through `write_records` + `flush_frame`, as the writer thread
//! does, into memory. Prints CPU ns per frame and the file's bytes per event. Under valgrind's
//! callgrind with `--toggle-collect='*one_frame*'`, the count divided by FRAMES is the
//! instructions per frame (`scripts/bench writer` does this).
//!
//! `frame_cost trace:FILE EVENTS FRAMES`: the events of a real trace (FILE, e.g. a GPT-2 run's
//! tensor-level trace: its `Torch` records), in their order and cycled, EVENTS a frame; here
//! `one_frame` also encodes them (`RecordEncoder::push`, as the writer thread encodes a
//! thread's buffer), so the count is the writer's whole cost per frame of such events;
//! `--toggle-collect='*encode_events*'` counts the encoding alone. `trace-torch:FILE`: the
//! same with only the trace's PyTorch allocator events (what a long training run's frames
//! hold once its one-time records, modules and Python code, are written).
//!
//! `FRAME_COST_CHAINED=1` (real events): each frame's events are one chained context of
//! format v5 (`RecordEncoder::context_chained`), whose model continues from the previous
//! frame's, as the writer thread codes a thread's consecutive buffers; without it each frame
//! starts a fresh model, as format v4 did.
//!
//! `FRAME_COST_DECODE=1`: then reads the written trace back (`TraceReader::next_into`, in
//! `decode_all`: `--toggle-collect='*decode_all*'` counts the decoder) and prints its CPU ns
//! per event.

use std::time::Instant;

use vramshim_trace::{
    AllocKind, Api, Event, FrameLayout, Header, MemOp, RecordEncoder, RecordStats, SyncKind,
    TraceWriter,
};

fn events(kind: &str, n: usize, frame: usize) -> Vec<Event> {
    // A deterministic generator (xorshift) for the timing noise.
    let mut rng = vramshim_testkit::XorShift(0x9e37_79b9_7f4a_7c15 ^ frame as u64);
    let mut rnd = move || rng.next_u64();
    let mut t = 1_000_000_000 + frame as u64 * 50_000_000;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        t += 5_000 + rnd() % 200_000;
        match kind {
            "sync" => out.push(Event::Sync {
                t_ns: t,
                tid: 1000,
                device: 0,
                kind: SyncKind::ProcessDevice,
                stream: 0,
                latency_ns: 150_000 + (rnd() % 900_000) as u32,
            }),
            _ => {
                let m = MemOp {
                    t_ns: t,
                    tid: 1000,
                    api: Api::CudaMalloc,
                    kind: AllocKind::Runtime,
                    flags: 0,
                    device: 0,
                    stream: 0,
                    addr: 0x7f00_0000_0000 + ((i as u64 / 2) % 64) * (2 << 20),
                    size: 4096 << ((i / 2) % 8),
                    result: 0,
                    latency_ns: 2_000 + (rnd() % 30_000) as u32,
                    stack: 0,
                };
                out.push(if i % 2 == 0 {
                    Event::Alloc(m)
                } else {
                    Event::Free(m)
                });
            }
        }
    }
    out
}

/// The events of the trace at `path` (header records, `Module`s and the like included), or
/// one line and exit 2.
fn trace_events(path: &str) -> Vec<Event> {
    let r = match vramshim_trace::TraceReader::open(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("frame_cost: {path}: {e}");
            std::process::exit(2);
        }
    };
    let ev: Vec<Event> = r.filter_map(Result::ok).collect();
    if ev.is_empty() {
        eprintln!("frame_cost: {path}: no events");
        std::process::exit(2);
    }
    ev
}

/// Reads every event of `bytes` (a whole trace); returns how many. Not inlined:
/// `--toggle-collect='*decode_all*'` counts exactly this.
#[inline(never)]
fn decode_all(bytes: &[u8]) -> u64 {
    let mut r = vramshim_trace::TraceReader::from_reader(bytes).unwrap();
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    let mut n = 0;
    while r.next_into(&mut e).unwrap() {
        n += 1;
    }
    n
}

/// Encodes `ev` into records as the writer thread encodes a thread's buffer. Not inlined:
/// `--toggle-collect='*encode_events*'` counts exactly this.
#[inline(never)]
fn encode_events(enc: &mut RecordEncoder, ev: &[Event], chained: bool) {
    if chained {
        enc.clear();
        enc.context_chained(1000);
    } else {
        enc.begin(1000);
    }
    let mut i = 0;
    while let Some(e) = ev.get(i) {
        if !matches!(e, Event::Torch(_)) {
            enc.push(e);
            i += 1;
            continue;
        }
        // A row of PyTorch allocator events in one call, as the writer thread hands over
        // the entries of a thread's buffer (the row ends at the first other event).
        i += enc.push_torch_all(ev[i..].iter().map_while(|e| match e {
            Event::Torch(op) => Some(op),
            _ => None,
        }));
    }
}

/// A frame of a real trace's events: encoded, then appended, compressed and written.
#[inline(never)]
fn one_frame_encoded(
    w: &mut TraceWriter<Vec<u8>>,
    enc: &mut RecordEncoder,
    ev: &[Event],
    chained: bool,
) {
    encode_events(enc, ev, chained);
    w.write_encoded(enc).unwrap();
    w.flush_frame().unwrap();
}

/// One frame as the writer thread makes it on a tick: the records appended, then compressed
/// and written. Not inlined: `valgrind --tool=callgrind --toggle-collect='*one_frame*'`
/// counts exactly this.
#[inline(never)]
fn one_frame(w: &mut TraceWriter<Vec<u8>>, b: &[u8], st: RecordStats) {
    w.write_records(b, st).unwrap();
    w.flush_frame().unwrap();
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4
        || !(matches!(a[1].as_str(), "sync" | "memop")
            || a[1].starts_with("trace:")
            || a[1].starts_with("trace-torch:"))
    {
        eprintln!(
            "usage: frame_cost sync|memop|trace:FILE|trace-torch:FILE EVENTS_PER_FRAME FRAMES"
        );
        std::process::exit(2);
    }
    let (kind, n, frames) = (a[1].as_str(), a[2].parse::<usize>(), a[3].parse::<usize>());
    let (Ok(n), Ok(frames)) = (n, frames) else {
        eprintln!("frame_cost: EVENTS_PER_FRAME and FRAMES are whole numbers");
        std::process::exit(2);
    };
    let from_file = kind.strip_prefix("trace:").map(trace_events).or_else(|| {
        kind.strip_prefix("trace-torch:").map(|f| {
            let mut ev = trace_events(f);
            ev.retain(|e| matches!(e, Event::Torch(_)));
            ev
        })
    });
    // Encoded before timing: the writer thread's encoding is per event, not per frame.
    let bufs: Vec<_> = (0..frames)
        .filter(|_| from_file.is_none())
        .map(|f| {
            let mut enc = RecordEncoder::with_capacity(64 << 10);
            enc.begin(1000);
            for e in events(kind, n, f) {
                enc.push(&e);
            }
            enc.take()
        })
        .collect();
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    // FRAME_COST_LEVEL=N: that zstd level instead of the default.
    if let Some(l) = std::env::var("FRAME_COST_LEVEL")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        w.set_level(l).unwrap();
    }
    // FRAME_COST_LAYOUT=rows|columnar: one layout only (default: the writer's own choice).
    match std::env::var("FRAME_COST_LAYOUT").as_deref() {
        Ok("rows") => w.set_layout(FrameLayout::Rows),
        Ok("columnar") => w.set_layout(FrameLayout::Columnar),
        _ => {}
    }
    // Real events: FRAMES frames of EVENTS each, the file's events in order, cycled.
    let frames_ev: Vec<Vec<Event>> = match &from_file {
        Some(all) => (0..frames)
            .map(|f| {
                (0..n)
                    .map(|i| all[(f * n + i) % all.len()].clone())
                    .collect()
            })
            .collect(),
        None => Vec::new(),
    };
    let mut enc = RecordEncoder::with_capacity(64 << 10);
    let chained = std::env::var_os("FRAME_COST_CHAINED").is_some();
    let t0 = Instant::now();
    for (b, st) in &bufs {
        one_frame(&mut w, b, *st);
    }
    for ev in &frames_ev {
        one_frame_encoded(&mut w, &mut enc, ev, chained);
    }
    let dt = t0.elapsed().as_nanos() as f64;
    let st = w.stats();
    if std::env::var_os("FRAME_COST_DECODE").is_some() {
        let bytes = w.finish().unwrap();
        let t0 = Instant::now();
        let n = decode_all(&bytes);
        let d = t0.elapsed().as_nanos() as f64;
        println!("decoded {n} events: {:.1} ns/event", d / n.max(1) as f64);
        return;
    }
    let per_frame = if frames > 0 { dt / frames as f64 } else { 0.0 };
    let ev = (n * frames).max(1) as f64;
    println!(
        "{} {n} events/frame, {frames} frames: {per_frame:.0} ns/frame, {:.2} bytes/event ({} frames, {} bytes; {:.2} raw bytes/event)",
        if from_file.is_some() { "trace" } else { kind },
        (st.file_bytes as f64) / ev,
        st.frames,
        st.file_bytes,
        st.raw_bytes as f64 / ev
    );
}
