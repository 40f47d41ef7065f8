//! The smallest device per trace for the default pool (stitch with its budget), with the
//! near-the-limit rules (`stitch/pressure.rs`: when the device is nearly full the pool
//! re-forms its rounds' mappings and dissolves cached blocks before it grows) and without them
//! (`Faults::pressure_off`, the pool as before the rules), side by side, under both free semantics: the smallest device, its ratio to peak
//! live, and on that device the driver calls, synchronizations and round mappings re-formed
//! under pressure; then whether the trace completes on the whole-page device of 1.03 x peak
//! live.
//!
//! `cargo run --release -p vramshim-pool --example pool_small -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

#[macro_use]
mod common;

use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, MIB, Policy};

fn pool(rule: bool) -> Stitch {
    let mut p = Stitch::tight();
    p.set_faults(Faults {
        pressure_off: !rule,
        ..Faults::default()
    });
    p
}

fn main() {
    let traces = common::traces(std::env::args().skip(1).collect());
    say!(
        "| trace | frees | rule | peak live MiB | min device MiB | min/peak live | driver calls there | syncs there | round mappings re-formed there | 1.03 x device MiB | completes there |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (name, t, live) in traces {
        let small = (live as f64 * 1.03) as u64 / (2 * MIB) * (2 * MIB);
        for frees in Frees::BOTH {
            let stream = frees.apply(&t.events);
            for rule in [false, true] {
                let make = move || -> Box<dyn Policy> { Box::new(pool(rule)) };
                let min = replay::min_capacity_with(&stream, &make);
                let run = |capacity: u64| {
                    let mut dev = AccountingDevice::new(capacity);
                    let mut p = pool(rule);
                    let r = replay::run_with(&stream, &mut p, &mut dev);
                    (r, p.pressure_reforms())
                };
                let (r, reforms) = run(min);
                let (at_small, _) = run(small);
                say!(
                    "| {name} | {} | {} | {:.1} | {} | {:.3} | {} | {} | {reforms} | {} | {} |",
                    frees.name(),
                    if rule { "near-limit rules" } else { "off" },
                    live as f64 / MIB as f64,
                    min / MIB,
                    min as f64 / live as f64,
                    r.driver_calls,
                    r.syncs,
                    small / MIB,
                    if at_small.completed { "yes" } else { "no" },
                );
            }
        }
    }
}
