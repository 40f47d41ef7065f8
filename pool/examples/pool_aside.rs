//! Where a caller that keeps stream-ordered frees aside (the interposer's thread caches, as
//! `vramshim_pool::thread_cache` mirrors them: 8 frees, exact size and stream, the round watch,
//! hits counted into the pool's windows) leaves the tight pool's driver calls on random repeated
//! workloads, which `vramshim replay` predicts with every free reaching the pool. Prints, over
//! 200 random streams (a round of 60-200 events of seven sizes on three streams, a quarter of
//! the frees `cudaFree`, a third of the stream-ordered ones on another stream, a
//! synchronization in 18 events; the round made 6-13 times), how many make other driver calls
//! than the model, and how many hand out another address first at an allocation the caller
//! served itself; then the same with the caller changed on purpose: giving back what it keeps
//! at each process synchronization (`--drain-at-sync`), serving nothing itself (`--no-hits`),
//! or both. `--one-stream`: every block on stream 0, every free stream-ordered there, no
//! synchronization within a round (what the log-replay workload's `--async` makes).
//!
//! `--csv DIR` (implies `--one-stream`): also each round as an RMM log `DIR/SEED.csv` and
//! `DIR/expected.txt` (`SEED REPEATS MODEL_CALLS CALLER_CALLS` a line), to run the live pool
//! on (`replay --async --repeat REPEATS DIR/SEED.csv` under libvramshim.so).
//!
//! `cargo run --release -p vramshim-pool --example pool_aside [-- [SEEDS] [--one-stream] [--csv DIR]]`

#[macro_use]
mod common;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::thread_cache::{self, Rules, Step, ThreadCache};
use vramshim_pool::{AccountingDevice, FreeMode, KIB, MIB};
use vramshim_testkit::XorShift;

/// Random stream `seed`: one round (everything freed at its end), and how many times it is
/// made (6-13).
fn stream(seed: u64, one_stream: bool) -> (Vec<Event>, usize) {
    // The streams are the same on every run.
    let mut r = XorShift::seeded(seed);
    let sizes = [
        4 * KIB,
        100 * KIB,
        MIB,
        3 * MIB + 300 * KIB,
        7 * MIB,
        20 * MIB,
        45 * MIB,
    ];
    let mut round = Vec::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut id = 0;
    for _ in 0..60 + r.below(140) {
        match r.below(18) {
            0..10 => {
                let stream = if one_stream { 0 } else { r.below(3) };
                let size = sizes[r.below(sizes.len() as u64) as usize];
                round.push(Event::Alloc { id, size, stream });
                live.push((id, stream));
                id += 1;
            }
            10..17 if !live.is_empty() => {
                let (id, s) = live.swap_remove(r.below(live.len() as u64) as usize);
                let mode = match r.below(12) {
                    _ if one_stream => FreeMode::Async { stream: s },
                    0..3 => FreeMode::Sync,
                    3..6 => FreeMode::Async { stream: r.below(3) },
                    _ => FreeMode::Async { stream: s },
                };
                round.push(Event::Free { id, mode });
            }
            10..17 => {}
            _ if one_stream => {}
            _ => round.push(Event::ProcessSync),
        }
    }
    for (id, s) in live {
        round.push(Event::Free {
            id,
            mode: FreeMode::Async { stream: s },
        });
    }
    (round, 6 + r.below(8) as usize)
}

/// `round` as an RMM log (one thread, one stream, an address per id) for the log-replay
/// workload, which makes it `--repeat` times.
fn write_csv(path: &std::path::Path, round: &[Event]) {
    use std::fmt::Write;
    let mut out = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let mut sizes = HashMap::new();
    for (i, ev) in round.iter().enumerate() {
        let (action, id, size) = match *ev {
            Event::Alloc { id, size, .. } => {
                sizes.insert(id, size);
                ("allocate", id, size)
            }
            Event::Free { id, .. } => ("free", id, sizes[&id]),
            Event::ProcessSync | Event::StreamRetired { .. } => continue,
        };
        let _ = writeln!(
            out,
            "1,00:00:00.{i:06},{action},{:#x},{size},0",
            0x1000_0000 + id * 0x1000
        );
    }
    std::fs::write(path, out).unwrap();
}

/// The cache, or changed on purpose.
#[derive(Clone, Copy)]
struct Caller {
    /// keeps frees (false: every free reaches the pool, the model)
    keeps: bool,
    drain_at_sync: bool,
    hits: bool,
}

impl Caller {
    fn rules(self) -> Rules {
        Rules {
            slots: if self.keeps { Rules::LIVE.slots } else { 0 },
            serve: self.hits,
            give_back_at_sync: self.drain_at_sync,
            ..Rules::LIVE
        }
    }
}

/// `events` through a tight pool behind `c` (a [`ThreadCache`], changed as `c` says) on the
/// checking device: (driver calls, the address of each allocation, whether the cache served
/// it).
fn run(events: &[Event], c: Caller) -> (u64, Vec<u64>, Vec<bool>) {
    let mut dev = AccountingDevice::new(replay::UNLIMITED);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    let mut cache = ThreadCache::new(c.rules());
    let (mut addrs, mut served) = (Vec::new(), Vec::new());
    thread_cache::run_observed(events, &mut p, &mut dev, &mut cache, |step, _| {
        if let Step::Alloc { addr, hit } = step {
            addrs.push(addr);
            served.push(hit);
        }
    })
    .unwrap();
    cache.give_back(&mut p, &mut dev).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    (dev.calls().driver_calls(), addrs, served)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let one_stream = args.iter().any(|a| a == "--one-stream");
    let seeds: u64 = args.iter().find_map(|s| s.parse().ok()).unwrap_or(200);
    let csv = args
        .iter()
        .position(|a| a == "--csv")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let one_stream = one_stream || csv.is_some();
    let drawn: Vec<(Vec<Event>, usize)> = (0..seeds).map(|s| stream(s, one_stream)).collect();
    let streams: Vec<Vec<Event>> = drawn
        .iter()
        .map(|(round, n)| replay::repeat(round, *n))
        .collect();
    let models: Vec<_> = streams
        .iter()
        .map(|s| {
            run(
                s,
                Caller {
                    keeps: false,
                    drain_at_sync: false,
                    hits: false,
                },
            )
        })
        .collect();
    if let Some(dir) = &csv {
        // each round as a log, and what the model and the mirrored caches call the driver
        // for it made so many times: `SEED REPEATS MODEL CALLER`
        std::fs::create_dir_all(dir).unwrap();
        let mut expected = String::new();
        for (seed, ((round, n), s)) in drawn.iter().zip(&streams).enumerate() {
            write_csv(&dir.join(format!("{seed}.csv")), round);
            let c = Caller {
                keeps: true,
                drain_at_sync: false,
                hits: true,
            };
            expected += &format!("{seed} {n} {} {}\n", models[seed].0, run(s, c).0);
        }
        std::fs::write(dir.join("expected.txt"), expected).unwrap();
    }
    let total: u64 = models.iter().map(|m| m.0).sum();
    say!("{seeds} streams, the model (every free reaching the pool): {total} driver calls");
    for (name, drain_at_sync, hits) in [
        ("the caller (as the thread caches)", false, true),
        (
            "giving back what it keeps at each process synchronization",
            true,
            true,
        ),
        ("serving nothing itself", false, false),
        ("both", true, false),
    ] {
        let c = Caller {
            keeps: true,
            drain_at_sync,
            hits,
        };
        let (mut differ, mut addr_differ, mut first_served, mut calls) = (0, 0, 0, 0);
        for (s, m) in streams.iter().zip(&models) {
            let (n, addrs, served) = run(s, c);
            calls += n;
            let first = m.1.iter().zip(&addrs).position(|(a, b)| a != b);
            addr_differ += u64::from(first.is_some());
            if n != m.0 {
                differ += 1;
                first_served += u64::from(first.is_some_and(|i| served[i]));
            }
        }
        say!(
            "{name}: driver calls differ on {differ} (first other address at a block the caller served: {first_served}), addresses on {addr_differ}; {calls} driver calls"
        );
    }
}
