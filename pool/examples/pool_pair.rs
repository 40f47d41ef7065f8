//! CPU cost of a cached allocate+free pair of each stitch pool, in-process on the accounting
//! device, behind both free semantics: `cudaFree` (the freed block waits for a
//! synchronization, so the next request of its size misses the exact-size cache until the
//! pool synchronizes) and stream-ordered (`cudaFreeAsync`: reusable at once on its stream).
//! The pairs rotate 4 KiB / 1 MiB / 8 MiB (a small block, and two large ones that go through
//! the large-block paths). Two cases: a 4 KiB block stays live throughout (*one live*), as
//! `bench_pool.c` keeps one through the interposer, so the pool never sees nothing live; or
//! nothing else is live (*idle*), so every pair ends what a tight pool takes for a round
//! (see `stitch::rounds`). Each allocation goes through `Stitch::alloc_cached` and then, on a
//! miss, `Stitch::alloc_missed` (`Policy::alloc` less the fast path it just tried): the
//! interposer's sequence.
//!
//! `cargo run --release -p vramshim-pool --example pool_pair -- [PAIRS] [RUNS]`: one markdown
//! table, CPU ns per pair (thread CPU time / pairs, median of RUNS), with the driver calls
//! and pool synchronizations per 1000 pairs of the timed loop.
//! `pool_pair --one tight|no-budget|tight-nolayers sync|async live|idle PAIRS`: one cell, no output (for
//! `valgrind --tool=callgrind`: instructions per pair = (Ir of a long run - Ir of a short
//! run) / the difference in pairs; `scripts/bench pool` prints it).

#[macro_use]
mod common;

use vramshim_pool::stitch::Stitch;
use vramshim_pool::{ANY_STREAM, AccountingDevice, FreeMode, GIB, Policy, Request, Stream};

const SIZES: [u64; 3] = [4096, 1 << 20, 8 << 20];
/// `tight`: `Stitch::tight()` (a budget over live bytes); `no-budget`: `Stitch::new()`;
/// `tight-nolayers`: the tight pool without its layer replay (`Stitch::with_layers(false)`).
const POOLS: [&str; 3] = ["tight", "no-budget", "tight-nolayers"];

/// CPU time of the calling thread in ns (/proc/thread-self/schedstat: time on CPU).
fn thread_cpu_ns() -> u128 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|x| x.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn pool(name: &str) -> Stitch {
    match name {
        "no-budget" => Stitch::new(),
        "tight-nolayers" => Stitch::tight().with_layers(false),
        _ => Stitch::tight(),
    }
}

/// The request stream and free mode of a pair.
fn semantics(sync: bool) -> (Stream, FreeMode) {
    if sync {
        (ANY_STREAM, FreeMode::Sync)
    } else {
        (0, FreeMode::Async { stream: 0 })
    }
}

struct Bench {
    p: Stitch,
    dev: AccountingDevice,
    stream: Stream,
    mode: FreeMode,
    next: usize,
}

impl Bench {
    /// A pool (with the anchor block live unless `idle`) after 1000 pairs.
    fn new(name: &str, sync: bool, idle: bool) -> Bench {
        let (stream, mode) = semantics(sync);
        let mut b = Bench {
            p: pool(name),
            dev: AccountingDevice::new(64 * GIB),
            stream,
            mode,
            next: 0,
        };
        if !idle {
            b.p.alloc(&mut b.dev, Request { size: 4096, stream })
                .expect("anchor");
        }
        for _ in 0..1000 {
            b.pair();
        }
        b
    }

    #[inline(never)]
    fn pair(&mut self) {
        let size = SIZES[self.next % SIZES.len()];
        self.next += 1;
        let addr = match self.p.alloc_cached(size, self.stream) {
            Some(a) => a,
            None => {
                let req = Request {
                    size,
                    stream: self.stream,
                };
                self.p
                    .alloc_missed(&mut self.dev, req)
                    .expect("allocation")
                    .addr
            }
        };
        self.p.free(&mut self.dev, addr, self.mode).expect("free");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn usage() -> ! {
    eprintln!(
        "usage: pool_pair [PAIRS] [RUNS]\n       pool_pair --one tight|no-budget|tight-nolayers sync|async live|idle PAIRS"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--one") {
        let (Some(name), Some(mode), Some(live), Some(pairs)) = (
            args.get(1).filter(|n| POOLS.contains(&n.as_str())),
            args.get(2).filter(|m| *m == "sync" || *m == "async"),
            args.get(3).filter(|m| *m == "live" || *m == "idle"),
            args.get(4).and_then(|n| n.parse::<usize>().ok()),
        ) else {
            usage()
        };
        let mut b = Bench::new(name, mode == "sync", live == "idle");
        for _ in 0..pairs {
            b.pair();
        }
        std::hint::black_box(b.p.stats());
        return;
    }
    let num = |i: usize, d: usize| match args.get(i) {
        None => d,
        Some(a) => a.parse().unwrap_or_else(|_| usage()),
    };
    let (pairs, runs) = (num(0, 1_000_000).max(1), num(1, 5).max(1));
    say!(
        "| pool | frees | else live | pairs | CPU ns/pair (median of {runs}) | driver calls /1000 pairs | pool syncs /1000 pairs |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: |");
    for name in POOLS {
        for (sync, idle) in [(true, false), (true, true), (false, false), (false, true)] {
            let mut ns = Vec::new();
            let (mut calls, mut syncs) = (0, 0);
            for _ in 0..runs {
                let mut b = Bench::new(name, sync, idle);
                let (c0, s0) = (b.dev.calls().driver_calls(), b.p.stats().syncs);
                let t0 = thread_cpu_ns();
                for _ in 0..pairs {
                    b.pair();
                }
                ns.push((thread_cpu_ns() - t0) as f64 / pairs as f64);
                calls = b.dev.calls().driver_calls() - c0;
                syncs = b.p.stats().syncs - s0;
            }
            let per_k = |n: u64| n as f64 * 1000.0 / pairs as f64;
            say!(
                "| {name} | {} | {} | {pairs} | {:.0} | {:.2} | {:.1} |",
                if sync { "cudaFree" } else { "stream-ordered" },
                if idle { "nothing" } else { "one 4 KiB block" },
                median(ns),
                per_k(calls),
                per_k(syncs)
            );
        }
    }
}
