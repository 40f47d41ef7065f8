//! Where a trace's second pass leaves the first pass's places: two passes of the trace as
//! `pool_slack`'s "passes 2, 3" runs them (`replay::repeat`, the tight pool kept, every free
//! reaching it), and each allocation of at least a page of the second pass whose place (the
//! arena or a stitched mapping, and the offset) differs from its twin's in the first pass, or
//! that makes driver calls, with the twin's place, calls and bytes held; frees that make
//! driver calls; then how many differ. A repeated workload makes no call in its second pass
//! while every large block finds a place where its twin's was, or one as good.
//!
//! `cargo run --release -p vramshim-pool --example pool_diverge -- TRACE.csv [sync|async] [request|pow2] [N]`
//! (`N`: the most lines listed, default 20; `request` / `pow2`: handles sized per request,
//! `Stitch::with_shapes`).

#[macro_use]
mod common;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Shapes, Stitch};
use vramshim_pool::{AccountingDevice, Device, MIB, Policy, Request};

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

fn at(place: (u64, u64, bool)) -> String {
    let (va, off, arena) = place;
    let m = if arena {
        "arena".to_string()
    } else {
        format!("mapping {va:#x}")
    };
    format!("{m} + {:.4} MiB", mib(off))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: pool_diverge TRACE.csv [sync|async] [request|pow2] [N]");
        std::process::exit(2);
    };
    let shapes = if args.iter().any(|a| a == "pow2") {
        Shapes::Pow2
    } else if args.iter().any(|a| a == "request") {
        Shapes::Request
    } else {
        Shapes::Pages
    };
    let frees = if args.iter().any(|a| a == "sync") {
        Frees::CudaFree
    } else {
        Frees::StreamOrdered
    };
    let show: usize = args[1..].iter().find_map(|a| a.parse().ok()).unwrap_or(20);
    let t = common::read_trace(std::path::Path::new(path));
    let per = frees
        .apply(&t.events)
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let ev = frees.apply(&replay::repeat(&t.events, 2));
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight().with_shapes(shapes);
    let g = dev.granularity();
    let mut ids = HashMap::new();
    // the first pass's places, calls and bytes held, by allocation
    let mut first: Vec<((u64, u64, bool), u64, u64)> = Vec::new();
    let (mut n, mut shown, mut differ) = (0usize, 0usize, 0usize);
    for e in &ev {
        let before = dev.calls();
        match *e {
            Event::Alloc { id, size, stream } => {
                let a = p.alloc(&mut dev, Request { size, stream }).expect("alloc");
                ids.insert(id, a.addr);
                let place = p.place_of(a.addr).expect("a live block");
                let calls = dev.calls().since(&before).driver_calls();
                let held = p.stats().reserved;
                if n < per {
                    first.push((place, calls, held));
                } else {
                    let (twin, twin_calls, twin_held) = first[n - per];
                    if (twin != place && size >= g) || calls > 0 {
                        differ += 1;
                        if shown < show {
                            shown += 1;
                            say!(
                                "alloc {} size {:.2} MiB: first pass {} ({twin_calls} calls, {:.0} MiB held); second {} ({calls} calls, {:.0} MiB held, {:.1} live)",
                                n - per,
                                mib(size),
                                at(twin),
                                mib(twin_held),
                                at(place),
                                mib(held),
                                mib(p.stats().live)
                            );
                        }
                    }
                }
                n += 1;
            }
            Event::Free { id, mode } => {
                let Some(a) = ids.remove(&id) else { continue };
                p.free(&mut dev, a, mode).expect("free");
                let c = dev.calls().since(&before).driver_calls();
                if c > 0 && shown < show {
                    shown += 1;
                    say!(
                        "free after alloc {} of pass {}: {c} calls",
                        n % per,
                        n / per + 1
                    );
                }
            }
            Event::ProcessSync => replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => replay::retire_stream(&mut p, &mut dev, stream),
        }
    }
    say!(
        "{differ} of {per} allocations of the second pass differ or make calls; violations {:?}",
        dev.violations().first()
    );
}
