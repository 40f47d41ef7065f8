//! In-process microbenchmark of the cap's accounting: what one charge + uncharge costs.
//!
//!   cargo run --release -p vramshim-region --example bench [-- ITERS PROCS]
//!
//! Variants (each a charge followed by its uncharge, the work one cudaMalloc + cudaFree adds):
//! - `baseline`: the loop alone (black-boxed counter), subtracted from the others;
//! - `private`: the single-process cap (CAS reservation on a process-local word);
//! - `shared, 1 process`: the shared region (in-flight bracket, CAS on the region's device
//!   total, slot update), one process;
//! - `shared, N processes`: N forked processes charging one region at once (contended cache
//!   line). Per-pair cost = process CPU time / pairs, so it does not depend on how many cores
//!   the processes share.
//!
//! Prints a markdown table (ns per charge+uncharge pair, minus the baseline).

use std::hint::black_box;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use vramshim_region::spec::parse_cap;
use vramshim_region::{Check, MAX_BYTES, ProcessKey, Region, release, reserve};

fn cpu_ns() -> f64 {
    // /proc/self/stat utime+stime would be too coarse; use schedstat (ns of CPU time).
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

fn time(iters: u64, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..iters / 10 {
        f(i);
    }
    let c0 = cpu_ns();
    let t0 = Instant::now();
    for i in 0..iters {
        f(i);
    }
    let wall = t0.elapsed().as_nanos() as f64;
    let cpu = cpu_ns() - c0;
    (if cpu > 0.0 { cpu } else { wall }) / iters as f64
}

fn main() {
    if let (Ok(per), Ok(path)) = (
        std::env::var("VRAMSHIM_BENCH_CHILD"),
        std::env::var("VRAMSHIM_BENCH_REGION"),
    ) {
        println!(
            "{}",
            child_main(
                per.parse().unwrap_or(1_000_000),
                std::path::Path::new(&path)
            )
        );
        return;
    }
    let mut args = std::env::args().skip(1);
    let iters: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5_000_000);
    let procs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(8);
    let size = 4096u64;

    let counter = AtomicU64::new(0);
    let base = time(iters, |i| {
        black_box(&counter);
        black_box(i);
    });

    let word = AtomicU64::new(0);
    let private = time(iters, |_| {
        let _ = black_box(reserve(&word, size, MAX_BYTES));
        release(&word, size);
    });

    let caps = parse_cap("1TiB").unwrap();
    let region = Region::anonymous(&caps).expect("region");
    let me = ProcessKey::current().expect("/proc");
    let slot = region.claim_slot(me, 0).expect("slot");
    let shared1 = time(iters, |_| {
        let _ = black_box(region.charge(slot, 0, size, MAX_BYTES, Check::Atomic));
        region.uncharge(slot, 0, size);
    });

    // N processes hammering one region (anonymous shared memory, inherited across fork).
    let shared_n = {
        let per = iters / 2;
        let mut kids = Vec::new();
        for _ in 0..procs {
            let exe = std::env::current_exe().unwrap();
            kids.push(
                std::process::Command::new(exe)
                    .env("VRAMSHIM_BENCH_CHILD", per.to_string())
                    .env(
                        "VRAMSHIM_BENCH_REGION",
                        std::env::temp_dir().join(format!("vramshim-bench-{}", std::process::id())),
                    )
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn"),
            );
        }
        let mut costs: Vec<f64> = kids
            .into_iter()
            .map(|k| {
                let o = k.wait_with_output().expect("child");
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<f64>()
                    .expect("child result")
            })
            .collect();
        let _ = std::fs::remove_file(
            std::env::temp_dir().join(format!("vramshim-bench-{}", std::process::id())),
        );
        costs.sort_by(f64::total_cmp);
        costs[costs.len() / 2]
    };

    println!("| variant | ns per charge+uncharge | added vs baseline |");
    println!("| --- | ---: | ---: |");
    println!("| baseline (loop only) | {base:.1} | - |");
    println!(
        "| private cap (1 process) | {private:.1} | {:.1} |",
        private - base
    );
    println!(
        "| shared region, 1 process | {shared1:.1} | {:.1} |",
        shared1 - base
    );
    println!(
        "| shared region, {procs} processes at once (median) | {shared_n:.1} | {:.1} |",
        shared_n - base
    );
}

/// A child of the N-process variant: attach the file region named by the parent, run the
/// pairs, return the CPU ns per pair.
fn child_main(per: u64, path: &std::path::Path) -> f64 {
    let caps = parse_cap("1TiB").unwrap();
    let (region, _) = Region::open_or_create(path, &caps).expect("region");
    let me = ProcessKey::current().expect("/proc");
    let slot = region.claim_slot(me, 0).expect("slot");
    let c = time(per, |_| {
        let _ = black_box(region.charge(slot, 0, 4096, MAX_BYTES, Check::Atomic));
        region.uncharge(slot, 0, 4096);
    });
    region.release_slot(slot);
    c
}
