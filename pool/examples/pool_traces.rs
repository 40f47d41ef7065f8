//! Replay every RMM CSV trace through stitch (with its budget, the default, and without),
//! caching and direct, side by side, under both free semantics (every free a `cudaFree`, every free stream-ordered).
//!
//! `cargo run --release -p vramshim-pool --example pool_traces -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

#[macro_use]
mod common;

use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, MIB, Policy, PolicyKind};

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB as f64)
}

type Make = Box<dyn Fn() -> Box<dyn Policy>>;

fn policies() -> Vec<(&'static str, Make)> {
    vec![
        ("stitch", Box::new(|| PolicyKind::Stitch.build())),
        (
            "stitch, budget off",
            Box::new(|| -> Box<dyn Policy> { Box::new(Stitch::new()) }),
        ),
        ("caching", Box::new(|| PolicyKind::Caching.build())),
        ("direct", Box::new(|| PolicyKind::Direct.build())),
    ]
}

fn main() {
    let traces = common::traces(std::env::args().skip(1).collect());
    say!(
        "| trace | frees | policy | peak live MiB | min device MiB | min/peak live | peak reserved MiB (80 GiB device) | reserved/live | driver calls | syncs | 2nd-pass driver calls | driver calls /1000 allocs, 2nd half |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, t, live) in traces {
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
                say!(
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
