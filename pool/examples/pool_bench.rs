//! CPU cost of an allocate+free pair that hits the pool's cache, in-process on the
//! accounting device (stitch with its budget, the default; stitch without one; caching): single-threaded, and 16 threads sharing one pool behind a mutex (as
//! the interposer does).
//!
//! `cargo run --release -p vramshim-pool --example pool_bench -- [PAIRS] [RUNS]`
//! Prints one markdown table; each cell is the median over RUNS runs of CPU time per pair
//! (process CPU time / pairs, robust on a shared machine), wall time alongside.

#[macro_use]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Instant;
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, FreeMode, GIB, Policy, PolicyKind, Request};

/// CPU time of the calling thread in ns (/proc/thread-self/schedstat: time on CPU).
fn thread_cpu_ns() -> u128 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|x| x.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

struct Shared {
    policy: Box<dyn Policy>,
    dev: AccountingDevice,
}

fn sizes() -> [u64; 8] {
    [512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 1000, 300_000]
}

/// ns per pair (cpu, wall) for `threads` threads doing `pairs` pairs each.
fn run(kind: Kind, threads: usize, pairs: usize) -> (f64, f64) {
    let shared = Arc::new(Mutex::new(Shared {
        policy: kind.build(),
        dev: AccountingDevice::new(64 * GIB),
    }));
    // warm the cache: every size once per thread, freed
    {
        let mut g = shared.lock().unwrap();
        let Shared { policy, dev } = &mut *g;
        let mut v = Vec::new();
        for _ in 0..threads {
            for s in sizes() {
                v.push(
                    policy
                        .alloc(dev, Request { size: s, stream: 0 })
                        .unwrap()
                        .addr,
                );
            }
        }
        for a in v {
            policy.free(dev, a, FreeMode::Async { stream: 0 }).unwrap();
        }
    }
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|ti| {
            let sh = shared.clone();
            std::thread::spawn(move || {
                let c0 = thread_cpu_ns();
                let sz = sizes();
                for i in 0..pairs {
                    let size = sz[(i + ti) % sz.len()];
                    let a = {
                        let mut g = sh.lock().unwrap();
                        let Shared { policy, dev } = &mut *g;
                        policy.alloc(dev, Request { size, stream: 0 }).unwrap().addr
                    };
                    let mut g = sh.lock().unwrap();
                    let Shared { policy, dev } = &mut *g;
                    policy.free(dev, a, FreeMode::Async { stream: 0 }).unwrap();
                }
                thread_cpu_ns() - c0
            })
        })
        .collect();
    let cpu: u128 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    let wall = t0.elapsed().as_nanos() as f64;
    let n = (threads * pairs) as f64;
    (cpu as f64 / n, wall / n)
}
/// The policies measured: stitch (with its budget, the default), stitch without a budget
/// (`Stitch::new()`), caching.
#[derive(Clone, Copy)]
enum Kind {
    Policy(PolicyKind),
    StitchNoBudget,
}

impl Kind {
    fn build(self) -> Box<dyn Policy> {
        match self {
            Kind::Policy(k) => k.build(),
            Kind::StitchNoBudget => Box::new(Stitch::new()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Policy(k) => k.name(),
            Kind::StitchNoBudget => "stitch, budget off",
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pairs: usize = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    say!(
        "| policy | threads | pairs/thread | CPU ns/pair (median of {runs}) | wall ns/pair | driver calls during the timed loop |"
    );
    say!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for kind in [
        Kind::Policy(PolicyKind::Stitch),
        Kind::StitchNoBudget,
        Kind::Policy(PolicyKind::Caching),
    ] {
        for threads in [1usize, 16] {
            let per = if threads == 1 { pairs } else { pairs / 10 };
            let mut cpu = Vec::new();
            let mut wall = Vec::new();
            for _ in 0..runs {
                let (c, w) = run(kind, threads, per);
                cpu.push(c);
                wall.push(w);
            }
            // driver calls in a timed loop: measure once more with counting
            let calls = {
                let mut dev = AccountingDevice::new(64 * GIB);
                let mut p = kind.build();
                for s in sizes() {
                    let a = p.alloc(&mut dev, Request { size: s, stream: 0 }).unwrap();
                    p.free(&mut dev, a.addr, FreeMode::Async { stream: 0 })
                        .unwrap();
                }
                let before = dev.calls().driver_calls();
                for i in 0..10_000 {
                    let s = sizes()[i % 8];
                    let a = p.alloc(&mut dev, Request { size: s, stream: 0 }).unwrap();
                    p.free(&mut dev, a.addr, FreeMode::Async { stream: 0 })
                        .unwrap();
                }
                dev.calls().driver_calls() - before
            };
            say!(
                "| {} | {threads} | {per} | {:.0} | {:.0} | {calls} |",
                kind.name(),
                median(cpu),
                median(wall)
            );
        }
    }
}
