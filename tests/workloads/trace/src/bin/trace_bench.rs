//! The tracer benchmark (issue 4), run by `scripts/bench trace`:
//!
//! 1. hot path: CPU cost on the calling thread of one traced call, i.e. what the interposer
//!    adds when `VRAMSHIM_TRACE` is set: the two clock reads the dispatcher takes (`t0` and
//!    the latency) plus `tracer::emit`, against tracing off (one relaxed load). Without stacks
//!    and with `VRAMSHIM_STACKS=16` (the call made 24 frames deep).
//! 2. sustained: 2 threads (one per core) emit as fast as they can; events/s until the file is
//!    finished, and the loss (must be 0).
//! 3. bytes/event: the real traces replayed through `libvramshim.so` on cuda-sim by the replay
//!    workload with `VRAMSHIM_TRACE`.
//!
//! Each measurement runs in a fresh process (the tracer is configured once per process):
//! `trace_bench` runs them all and prints markdown tables; `trace_bench hot STACKS N`,
//! `trace_bench sustained THREADS EVENTS` and `trace_bench replay` run one.
//! Costs are CPU time of the measuring thread (`CLOCK_THREAD_CPUTIME_ID`): the machine is
//! shared, so wall time would measure the neighbours.

use std::path::Path;
use std::process::Command;

use vramshim::tracer;
use vramshim_testkit::{interposer_lib, replay_exe, run, sim_command, temp_dir, trace_file};
use vramshim_trace::{AllocKind, Api, Event, MemOp, TraceReader};

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn mono() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

fn thread_cpu() -> u64 {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn process_cpu() -> u64 {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Clock reads per traced call: `TRACE_CLOCK` (the dispatcher's: `tracer::stamp()` and
/// `Stamp::latency_ns`), `SYNTHETIC` (none: the tracer layer's own cost, `emit`), or
/// `GETTIME` (two `clock_gettime(CLOCK_MONOTONIC)`, what the dispatcher read before the TSC
/// clock; kept for comparison).
static CLOCKS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(TRACE_CLOCK);
const TRACE_CLOCK: u8 = 0;
const SYNTHETIC: u8 = 1;
const GETTIME: u8 = 2;

/// What the dispatcher does per traced call: t0, the call, latency, emit.
#[inline(never)]
fn traced_call(i: u64, tid: u32) {
    if tracer::enabled() {
        let (t0, latency) = match CLOCKS.load(std::sync::atomic::Ordering::Relaxed) {
            TRACE_CLOCK => {
                let s = tracer::stamp();
                (s.ns, s.latency_ns())
            }
            GETTIME => {
                let t0 = mono();
                (t0, mono().saturating_sub(t0) as u32)
            }
            _ => (1_000_000_000 + i * 1000, 500),
        };
        let m = MemOp {
            t_ns: t0,
            tid,
            api: Api::CudaMalloc,
            kind: AllocKind::Runtime,
            flags: 0,
            device: 0,
            stream: 0,
            addr: 0x7f00_0000_0000 + ((i & 1023) << 12),
            size: 4096 + (i & 1023),
            result: 0,
            latency_ns: latency,
            stack: 0,
        };
        tracer::emit(if i.is_multiple_of(2) {
            Event::Alloc(m)
        } else {
            Event::Free(m)
        });
    }
}

/// Calls `f` `depth` frames deeper (so stacks have frames to walk).
#[inline(never)]
fn deep(depth: u32, f: &mut dyn FnMut()) {
    if depth == 0 {
        f();
    } else {
        deep(depth - 1, f);
    }
    std::hint::black_box(depth);
}

fn hot(stacks: u32, n: u64, on: bool) {
    let dir = temp_dir("trace_bench_hot");
    if on {
        tracer::testing::enable(dir.join("hot.vramtrace").to_str().unwrap(), stacks);
        // The tracer is linked into this binary: by default all of its frames count as the
        // tracer's own and are skipped (the walk then runs to the end of the stack and keeps
        // the few libc frames). TRACE_BENCH_KEEP_OWN=1 keeps them: exactly `stacks` frames.
        if std::env::var_os("TRACE_BENCH_KEEP_OWN").is_some() {
            tracer::testing::keep_own_frames();
        }
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    // Warm-up starts the writer and fills the stack table.
    for i in 0..10_000 {
        traced_call(i, tid);
    }
    let mut per_call = f64::MAX;
    for _ in 0..5 {
        let mut ns = 0;
        deep(24, &mut || {
            let t = thread_cpu();
            for i in 0..n {
                traced_call(i, tid);
            }
            ns = thread_cpu() - t;
        });
        per_call = per_call.min(ns as f64 / n as f64);
    }
    if on {
        tracer::on_exit();
    }
    println!("hot stacks={stacks} on={on} ns_per_call={per_call:.1}");
}

/// The hot path's clock variants side by side in one process (same placement, same
/// neighbours): `rounds` rounds, each measuring `n` calls per variant; the best round of each.
fn mix(stacks: u32, n: u64, rounds: usize) {
    let dir = temp_dir("trace_bench_mix");
    tracer::testing::enable(dir.join("mix.vramtrace").to_str().unwrap(), stacks);
    if std::env::var_os("TRACE_BENCH_KEEP_OWN").is_some() {
        tracer::testing::keep_own_frames();
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    for i in 0..10_000 {
        traced_call(i, tid);
    }
    let modes = [SYNTHETIC, TRACE_CLOCK, GETTIME];
    let mut best = [f64::MAX; 3];
    for _ in 0..rounds {
        for (k, &mode) in modes.iter().enumerate() {
            CLOCKS.store(mode, std::sync::atomic::Ordering::Relaxed);
            let mut ns = 0;
            deep(24, &mut || {
                let t = thread_cpu();
                for i in 0..n {
                    traced_call(i, tid);
                }
                ns = thread_cpu() - t;
            });
            best[k] = best[k].min(ns as f64 / n as f64);
        }
    }
    tracer::on_exit();
    println!(
        "mix stacks={stacks} emit={:.1} tsc={:.1} gettime={:.1}",
        best[0], best[1], best[2]
    );
}

fn sustained(threads: usize, events: u64) {
    let dir = temp_dir("trace_bench_sustained");
    let path = dir.join("s.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let per = events / threads as u64;
    let cpu0 = process_cpu();
    let t0 = mono();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u32;
                for i in 0..per {
                    traced_call(i, tid);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    tracer::on_exit();
    let wall = mono() - t0;
    let cpu = process_cpu() - cpu0;
    let mut r = TraceReader::open(&path).unwrap();
    let (mut written, mut lost) = (0u64, 0u64);
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        match e {
            Event::Alloc(_) | Event::Free(_) => written += 1,
            Event::Lost { count, .. } => lost += count,
            _ => {}
        }
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "sustained threads={threads} events={} written={written} lost={lost} wall_s={:.3} \
         events_per_s={:.0} cpu_ns_per_event={:.1} bytes_per_event={:.2}",
        per * threads as u64,
        wall as f64 / 1e9,
        written as f64 / (wall as f64 / 1e9),
        cpu as f64 / (per * threads as u64) as f64,
        size as f64 / written.max(1) as f64
    );
}

fn replay() {
    let exe = replay_exe();
    println!("| trace | alloc+free events | file bytes | bytes/event | lost |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for name in ["vit_train", "t5_train", "bert_serve"] {
        let dir = temp_dir("trace_bench_replay");
        let path = dir.join(format!("{name}.vramtrace"));
        let csv = trace_file(&format!("{name}.rmm.csv"));
        let mut cmd = sim_command(&exe, "trace_bench_replay");
        cmd.env("LD_PRELOAD", interposer_lib())
            .env("VRAMSHIM_TRACE", &path)
            .arg(&csv);
        let out = run(&mut cmd);
        out.assert_success();
        let (ops, lost) = count(&path);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        // For format experiments: keep the traces (TRACE_BENCH_KEEP=dir).
        if let Some(keep) = std::env::var_os("TRACE_BENCH_KEEP") {
            let _ = std::fs::copy(&path, Path::new(&keep).join(format!("{name}.vramtrace")));
        }
        println!(
            "| {name} | {ops} | {size} | {:.2} | {lost} |",
            size as f64 / ops.max(1) as f64
        );
    }
}

fn count(path: &Path) -> (u64, u64) {
    let mut r = TraceReader::open(path).unwrap();
    let (mut ops, mut lost) = (0, 0);
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        match e {
            Event::Alloc(_) | Event::Free(_) => ops += 1,
            Event::Lost { count, .. } => lost += count,
            _ => {}
        }
    }
    (ops, lost)
}

/// Runs this binary with `args` and returns its stdout.
fn sub(args: &[&str]) -> String {
    sub_env(args, &[])
}

fn sub_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().unwrap();
    let o = Command::new(exe)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("VRAMSHIM_TRACE")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn field(s: &str, key: &str) -> f64 {
    s.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["hot", stacks, n, on] => hot(stacks.parse().unwrap(), n.parse().unwrap(), *on == "1"),
        ["emit", stacks, n] => {
            CLOCKS.store(SYNTHETIC, std::sync::atomic::Ordering::Relaxed);
            hot(stacks.parse().unwrap(), n.parse().unwrap(), true)
        }
        ["gettime", stacks, n] => {
            CLOCKS.store(GETTIME, std::sync::atomic::Ordering::Relaxed);
            hot(stacks.parse().unwrap(), n.parse().unwrap(), true)
        }
        ["mix", stacks, n] => mix(stacks.parse().unwrap(), n.parse().unwrap(), 7),
        ["sustained", t, n] => sustained(t.parse().unwrap(), n.parse().unwrap()),
        ["replay"] => replay(),
        [] => {
            let runs: usize = std::env::var("BENCH_RUNS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(5);
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "hot path: CPU ns per traced call on the calling thread (median of {runs} processes; in each, 7 rounds of the clock variants side by side, the best round of each)"
            );
            println!("| variant | ns/call | added ns/call |");
            println!("| --- | ---: | ---: |");
            let off = median(
                (0..runs)
                    .map(|_| field(&sub(&["hot", "0", "1000000", "0"]), "ns_per_call"))
                    .collect(),
            );
            println!("| tracing off (enabled() = one relaxed load) | {off:.1} | - |");
            type Set<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);
            let sets: [Set; 3] = [
                ("no stacks", "0", "1000000", &[]),
                (
                    "VRAMSHIM_STACKS=16, 16 frames kept",
                    "16",
                    "20000",
                    &[("TRACE_BENCH_KEEP_OWN", "1")],
                ),
                (
                    "VRAMSHIM_STACKS=16, every call walks (VRAMSHIM_STACKS_FAULT=nocache)",
                    "16",
                    "20000",
                    &[
                        ("TRACE_BENCH_KEEP_OWN", "1"),
                        ("VRAMSHIM_STACKS_FAULT", "nocache"),
                    ],
                ),
            ];
            for (label, stacks, n, env) in sets {
                let outs: Vec<String> = (0..runs)
                    .map(|_| sub_env(&["mix", stacks, n], env))
                    .collect();
                for (key, what) in [
                    ("emit", "tracer layer only (emit)"),
                    ("tsc", "emit + the dispatcher's 2 trace-clock reads (TSC)"),
                    (
                        "gettime",
                        "emit + 2 clock_gettime (the dispatcher before the TSC clock)",
                    ),
                ] {
                    let v = median(outs.iter().map(|o| field(o, key)).collect());
                    println!("| {what}, {label} | {v:.1} | {:.1} |", v - off);
                }
            }
            let old = median(
                (0..runs)
                    .map(|_| field(&sub(&["hot", "16", "20000", "1"]), "ns_per_call"))
                    .collect(),
            );
            println!(
                "| emit + 2 TSC reads, VRAMSHIM_STACKS=16 as defined before (the binary's frames skipped as own: ~30 walked, 3 kept) | {old:.1} | {:.1} |",
                old - off
            );
            println!();
            println!("sustained: 2 threads emit 10M events as fast as they can (median of {runs})");
            println!(
                "| events | written | lost | wall s | events/s (wall) | CPU ns/event, all threads | events/s per 2 cores of CPU | bytes/event |"
            );
            println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            let mut outs: Vec<String> = (0..runs.min(3))
                .map(|_| sub(&["sustained", "2", "10000000"]))
                .collect();
            outs.sort_by(|x, y| field(x, "events_per_s").total_cmp(&field(y, "events_per_s")));
            let s = &outs[outs.len() / 2];
            let cpu = field(s, "cpu_ns_per_event");
            println!(
                "| {} | {} | {} | {:.2} | {:.0} | {:.1} | {:.0} | {:.2} |",
                field(s, "events"),
                field(s, "written"),
                field(s, "lost"),
                field(s, "wall_s"),
                field(s, "events_per_s"),
                cpu,
                2e9 / cpu,
                field(s, "bytes_per_event")
            );
            println!();
            println!(
                "bytes/event: the real traces replayed through libvramshim.so on cuda-sim (replay workload, VRAMSHIM_TRACE, zstd level 1 for frames of 1 KiB and more)"
            );
            print!("{}", sub(&["replay"]));
        }
        _ => {
            eprintln!("usage: trace_bench [hot STACKS N 0|1 | sustained THREADS EVENTS | replay]");
            std::process::exit(2);
        }
    }
}
