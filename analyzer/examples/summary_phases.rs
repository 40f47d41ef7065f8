//! Where `vramshim summary`'s time goes, phase by phase, on one trace (scripts/bench analyzer):
//! the trace crate's decoder alone (an `Event` per record, as `next_into` gives them), its
//! frame-at-a-time visitor alone (what the fast path decodes with), decoder + the 1 s reorder
//! window (the windowed path), the aggregation alone over events already decoded into memory,
//! the windowed path end to end, and `analyze` end to end (the in-order fast path on an
//! in-order trace). Prints one `phase seconds events/s` line each (CPU time of this thread, so
//! a loaded machine skews it less than wall time).
//!
//! Usage: summary_phases TRACE [ROUNDS [PHASE...]]  (the best of ROUNDS, default 3; all phases
//! unless some are named: decode, visit, order, aggregate, windowed, end-to-end)

use std::path::PathBuf;

use vramshim_analyzer::analysis::{self, Analysis, Options};
use vramshim_analyzer::input;
use vramshim_trace::{Event, MemOp, TraceReader, Visitor};

/// Counts what the visitor decoder hands out (and keeps the fields alive).
struct Count(u64, u64);

impl Visitor for Count {
    #[inline]
    fn memop(&mut self, _alloc: bool, m: &MemOp) {
        self.0 += 1;
        self.1 = self.1.wrapping_add(m.addr ^ m.size ^ m.t_ns);
    }
    fn event(&mut self, _ev: Event) {
        self.0 += 1;
    }
}

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn best<F: FnMut() -> u64>(rounds: usize, mut f: F) -> (f64, u64) {
    let mut out = (f64::INFINITY, 0);
    for _ in 0..rounds {
        let t = thread_cpu_s();
        let n = f();
        let dt = thread_cpu_s() - t;
        if dt < out.0 {
            out = (dt, n);
        }
    }
    out
}

fn line(phase: &str, (s, n): (f64, u64)) {
    println!(
        "{phase:<12} {s:>8.3} s {:>8.2} M events/s ({n} events)",
        n as f64 / s / 1e6
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().expect("usage: summary_phases TRACE [ROUNDS]"));
    let rounds: usize = args.next().map_or(3, |r| r.parse().expect("ROUNDS"));
    let only: Vec<String> = args.collect();
    let want = |p: &str| only.is_empty() || only.iter().any(|o| o == p);
    // As `summary` runs it (no memory-over-time chart: `report` alone draws one).
    let opts = Options {
        progress: false,
        timeline: false,
        ..Options::default()
    };

    if want("decode") {
        line(
            "decode",
            best(rounds, || {
                let mut r = TraceReader::open(&path).expect("open");
                let mut ev = Event::Lost { t_ns: 0, count: 0 };
                let mut n = 0;
                while r.next_into(&mut ev).expect("decode") {
                    n += 1;
                }
                n
            }),
        );
    }
    if want("visit") {
        line(
            "visit",
            best(rounds, || {
                let mut r = TraceReader::open(&path).expect("open");
                let mut c = Count(0, 0);
                while r.visit_frame(&mut c).expect("decode") {}
                std::hint::black_box(c.1);
                c.0
            }),
        );
    }
    if want("order") {
        line(
            "decode+order",
            best(rounds, || {
                let mut o = input::open(&path).expect("open");
                let mut n = 0;
                while let Some(e) = o.events.next_event() {
                    e.expect("decode");
                    n += 1;
                }
                n
            }),
        );
    }
    if want("aggregate") {
        // Decoded into memory first (untimed), then only the aggregation is timed.
        let mut out = (f64::INFINITY, 0);
        for _ in 0..rounds {
            let mut o = input::open(&path).expect("open");
            let header = o.header.clone();
            let mut events = Vec::new();
            while let Some(e) = o.events.next_event() {
                events.push(e.expect("decode"));
            }
            let n = events.len() as u64;
            let t = thread_cpu_s();
            let mut a = Analysis::new(opts.clone(), header, "x", o.format);
            for e in events.drain(..) {
                a.feed(e);
            }
            std::hint::black_box(a.finish(Vec::new()));
            let dt = thread_cpu_s() - t;
            if dt < out.0 {
                out = (dt, n);
            }
        }
        line("aggregate", out);
    }
    if want("windowed") {
        line(
            "windowed",
            best(rounds, || {
                let o = input::open(&path).expect("open");
                analysis::analyze_windowed(o, &opts)
                    .expect("analyze")
                    .events
            }),
        );
    }
    if want("end-to-end") {
        line(
            "end-to-end",
            best(rounds, || {
                let r =
                    analysis::analyze(input::open(&path).expect("open"), &opts).expect("analyze");
                r.events
            }),
        );
    }
}
