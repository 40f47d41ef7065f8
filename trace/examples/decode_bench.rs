//! Decode-only benchmark: `TraceReader::next_into` over a multi-million-event trace built from
//! real traced events (the `.vramtrace` files given as arguments, e.g. the replay traces that
//! `trace_bench replay` keeps with `TRACE_BENCH_KEEP=dir`), repeated with shifted timestamps.
//! The same events are written as columnar frames (v2 default) and as row frames (the v1
//! layout) and decoded side by side; cost is CPU time of this thread, best of `BENCH_RUNS`.
//!
//! `decode_bench N FILE...`; `DECODE_ONLY=columnar|rows` decodes one layout once (for
//! `valgrind --tool=callgrind`, which gives an instruction count per event).

use std::path::PathBuf;

use vramshim_trace::*;

fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn load(files: &[PathBuf]) -> Vec<Event> {
    let mut out = Vec::new();
    for f in files {
        let mut r = TraceReader::open(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let mut e = Event::Lost { t_ns: 0, count: 0 };
        while r.next_into(&mut e).unwrap() {
            if matches!(e, Event::Alloc(_) | Event::Free(_)) {
                out.push(e.clone());
            }
        }
    }
    out
}

fn build(src: &[Event], n: usize, layout: FrameLayout) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.set_layout(layout);
    let span = src
        .iter()
        .filter_map(|e| e.t_ns())
        .max()
        .unwrap_or(0)
        .saturating_sub(src.iter().filter_map(|e| e.t_ns()).min().unwrap_or(0))
        + 1000;
    let mut k = 0u64;
    'outer: loop {
        for e in src {
            if k as usize >= n {
                break 'outer;
            }
            let mut e = e.clone();
            if let Event::Alloc(m) | Event::Free(m) = &mut e {
                m.t_ns += span * (k / src.len() as u64);
            }
            w.write(&e).unwrap();
            k += 1;
        }
    }
    w.finish().unwrap()
}

/// The writer thread's share: 64 KiB row buffers as the tracer's threads hand them over
/// (`RecordEncoder`), into frames (`write_records`, 1 MiB frame target), to memory.
/// Returns CPU ns per event, best of `runs`.
fn writer_cost(src: &[Event], n: usize, layout: FrameLayout, level: i32, runs: usize) -> f64 {
    let mut bufs = Vec::new();
    let mut enc = RecordEncoder::with_capacity(80 << 10);
    enc.begin(1);
    for k in 0..n {
        enc.push(&src[k % src.len()]);
        if enc.len() >= 64 << 10 {
            bufs.push(enc.take());
            enc.begin(1);
        }
    }
    bufs.push(enc.take());
    let mut best = u64::MAX;
    for _ in 0..runs {
        let t0 = cpu_ns();
        let mut w = TraceWriter::with_level(Vec::new(), &Header::default(), level).unwrap();
        w.set_layout(layout);
        for (b, st) in &bufs {
            w.write_records(b, *st).unwrap();
        }
        std::hint::black_box(w.finish().unwrap().len());
        best = best.min(cpu_ns() - t0);
    }
    best as f64 / n as f64
}

fn decode(bytes: &[u8]) -> (u64, u64) {
    let t0 = cpu_ns();
    let mut r = TraceReader::from_reader(bytes).unwrap();
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    let mut n = 0u64;
    let mut sum = 0u64;
    while r.next_into(&mut e).unwrap() {
        if let Event::Alloc(m) | Event::Free(m) = &e {
            sum = sum.wrapping_add(m.size ^ m.latency_ns as u64);
        }
        n += 1;
    }
    std::hint::black_box(sum);
    (n, cpu_ns() - t0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_000_000);
    let files: Vec<PathBuf> = args.map(PathBuf::from).collect();
    assert!(!files.is_empty(), "usage: decode_bench N FILE.vramtrace...");
    let src = load(&files);
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let layouts = [
        ("columnar (v2)", FrameLayout::Auto),
        ("rows (v1 layout)", FrameLayout::Rows),
    ];
    if let Ok(only) = std::env::var("DECODE_ONLY") {
        let l = if only == "rows" {
            FrameLayout::Rows
        } else {
            FrameLayout::Auto
        };
        let b = build(&src, n, l);
        let reps: usize = std::env::var("DECODE_REPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        for _ in 0..reps {
            let (k, ns) = decode(&b);
            println!("{only}: {k} events, {:.1} ns/event", ns as f64 / k as f64);
        }
        return;
    }
    println!("| layout | events | file B/event | decode ns/event (CPU) | decode Mev/s per core |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let built: Vec<_> = layouts.iter().map(|(_, l)| build(&src, n, *l)).collect();
    let mut best = [u64::MAX; 2];
    let mut count = [0u64; 2];
    // Alternate layouts so both see the same machine load.
    for _ in 0..runs {
        for (i, b) in built.iter().enumerate() {
            let (k, ns) = decode(b);
            count[i] = k;
            best[i] = best[i].min(ns);
        }
    }
    for (i, (name, _)) in layouts.iter().enumerate() {
        let per = best[i] as f64 / count[i] as f64;
        println!(
            "| {name} | {} | {:.2} | {per:.1} | {:.1} |",
            count[i],
            built[i].len() as f64 / count[i] as f64,
            1e3 / per
        );
    }
    println!();
    println!("| writer thread: layout, zstd level | CPU ns/event | Mev/s per core |");
    println!("| --- | ---: | ---: |");
    for (name, l, level) in [
        ("columnar, 3", FrameLayout::Auto, 3),
        ("columnar, -1 (back-pressure level)", FrameLayout::Auto, -1),
        ("rows, 3", FrameLayout::Rows, 3),
        ("rows, -1", FrameLayout::Rows, -1),
    ] {
        let per = writer_cost(&src, n.min(2_000_000), l, level, runs);
        println!("| {name} | {per:.1} | {:.1} |", 1e3 / per);
    }
}
