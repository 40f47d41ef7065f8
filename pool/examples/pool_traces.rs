//! Replay every RMM CSV trace through stitch, caching and direct, side by side.
//!
//! `cargo run --release -p vramshim-pool --example pool_traces -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

use vramshim_pool::replay::{self, ReplayResult, UNLIMITED};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, MIB, Policy, PolicyKind, rmm_csv};

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB as f64)
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
            let mut v: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".csv"))
                .collect();
            v.sort();
            files.extend(v);
        } else {
            files.push(p.to_path_buf());
        }
    }
    println!(
        "| trace | policy | peak live MiB | min device MiB | min/peak live | peak reserved MiB (unlimited) | reserved/live | driver calls | syncs | 2nd-pass driver calls |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for f in files {
        let t = match rmm_csv::parse_file(&f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let live = replay::peak_live(&t.events);
        {
            // stitch with a soft limit at peak live: dissolves cached blocks before growing
            let make = || -> Box<dyn Policy> { Box::new(Stitch::new().with_headroom(Some(0.0))) };
            let mut dev = AccountingDevice::new(UNLIMITED);
            let mut p = make();
            let r = replay::run_with(&t.events, p.as_mut(), &mut dev);
            let min = replay::min_capacity_with(&t.events, &make);
            let twice = replay::repeat(&t.events, 2);
            let mut dev = AccountingDevice::new(UNLIMITED);
            let mut p = make();
            let r2 = replay::run_with(&twice, p.as_mut(), &mut dev);
            println!(
                "| {name} | stitch, soft limit 0 | {} | {} | {:.3} | {} | {:.3} | {} | {} | {} |",
                mib(live),
                mib(min),
                min as f64 / live as f64,
                mib(r.peak_device_used),
                r.peak_device_used as f64 / live as f64,
                r.driver_calls,
                r.syncs,
                r2.driver_calls - r.driver_calls,
            );
        }
        for kind in PolicyKind::ALL {
            let r: ReplayResult = replay::run(&t.events, kind, UNLIMITED, None);
            assert!(r.completed, "{name} {kind}: {:?}", r.first_failure);
            let min = replay::min_capacity(&t.events, kind);
            let passes = replay::driver_calls_per_pass(&t.events, kind, 2);
            println!(
                "| {name} | {kind} | {} | {} | {:.3} | {} | {:.3} | {} | {} | {} |",
                mib(live),
                mib(min),
                min as f64 / live as f64,
                mib(r.peak_device_used),
                r.peak_device_used as f64 / live as f64,
                r.driver_calls,
                r.syncs,
                passes[1],
            );
        }
    }
}
