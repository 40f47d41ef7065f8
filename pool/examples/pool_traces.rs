//! Replay every RMM CSV trace through stitch (default and tight), caching and direct, side
//! by side, under both free semantics (every free a `cudaFree`, every free stream-ordered).
//!
//! `cargo run --release -p vramshim-pool --example pool_traces -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, MIB, Policy, PolicyKind, rmm_csv};

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB as f64)
}

type Make = Box<dyn Fn() -> Box<dyn Policy>>;

fn policies() -> Vec<(&'static str, Make)> {
    vec![
        ("stitch", Box::new(|| PolicyKind::Stitch.build())),
        (
            "stitch tight",
            Box::new(|| -> Box<dyn Policy> { Box::new(Stitch::tight()) }),
        ),
        ("caching", Box::new(|| PolicyKind::Caching.build())),
        ("direct", Box::new(|| PolicyKind::Direct.build())),
    ]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut files = Vec::new();
    let roots = if args.is_empty() {
        vec![concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/workloads/traces").to_string()]
    } else {
        args
    };
    for r in roots {
        let p = std::path::Path::new(&r);
        if p.is_dir() {
            let mut v: Vec<_> = match std::fs::read_dir(p) {
                Ok(d) => d
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.to_string_lossy().ends_with(".csv"))
                    .collect(),
                Err(e) => {
                    eprintln!("{}: {e}", p.display());
                    std::process::exit(1);
                }
            };
            v.sort();
            files.extend(v);
        } else {
            files.push(p.to_path_buf());
        }
    }
    println!(
        "| trace | frees | policy | peak live MiB | min device MiB | min/peak live | peak reserved MiB (80 GiB device) | reserved/live | driver calls | syncs | 2nd-pass driver calls | driver calls /1000 allocs, 2nd half |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for f in files {
        let t = match rmm_csv::parse_file(&f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{}: {e}", f.display());
                std::process::exit(1);
            }
        };
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let live = replay::peak_live(&t.events);
        for frees in Frees::BOTH {
            let stream = frees.apply(&t.events);
            for (label, make) in policies() {
                let mut dev = AccountingDevice::new(80 << 30);
                let mut p = make();
                let r = replay::run_with(&stream, p.as_mut(), &mut dev);
                assert!(r.completed, "{name} {label}: {:?}", r.first_failure);
                let min = replay::min_capacity_with(&stream, &*make);
                let passes = replay::calls_per_pass_with(&t.events, frees, &*make, 2);
                let half = replay::second_half_calls_per_1000(&t.events, frees, &*make);
                println!(
                    "| {name} | {} | {label} | {} | {} | {:.3} | {} | {:.3} | {} | {} | {} | {:.1} |",
                    frees.name(),
                    mib(live),
                    mib(min),
                    min as f64 / live as f64,
                    mib(r.peak_device_used),
                    r.peak_device_used as f64 / live as f64,
                    r.driver_calls,
                    r.syncs,
                    passes[1],
                    half,
                );
            }
        }
    }
}
