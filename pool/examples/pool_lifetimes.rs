//! How much of a trace's smallest device is lifetime: the smallest device of the stitch pool
//! as is, and told, at each allocation, whether the block dies before the trace's peak of
//! live bytes (`Stitch::set_lifetime_class`: blocks of the two classes never share a page).
//! An oracle (it reads the future from the trace), not a policy: it bounds what a layout
//! that predicted lifetimes could gain, e.g. one learned from an earlier pass of a
//! repeating workload.
//!
//! `cargo run --release -p vramshim-pool --example pool_lifetimes -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

#[macro_use]
mod common;
#[path = "../tests/common/lifetimes.rs"]
mod lifetimes;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::{MIB, Policy, Request};

/// Does the stream complete on `cap` bytes? `class[i]`: lifetime class of event `i`'s
/// allocation (None: no classes).
fn completes(events: &[Event], class: Option<&[u8]>, cap: u64, tight: bool) -> bool {
    let (mut dev, mut p) = common::checking_stitch(cap, tight);
    let mut ids: HashMap<u64, u64> = HashMap::new();
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, stream } => {
                if let Some(c) = class {
                    p.set_lifetime_class(c[i]);
                }
                match p.alloc(&mut dev, Request { size, stream }) {
                    Ok(a) => {
                        dev.check_alloc(a.addr, a.size, stream);
                        ids.insert(id, a.addr);
                    }
                    Err(_) => return false,
                }
            }
            Event::Free { id, mode } => {
                if let Some(a) = ids.remove(&id) {
                    dev.check_free(a, mode);
                    let _ = p.free(&mut dev, a, mode);
                }
            }
            Event::ProcessSync => replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => replay::retire_stream(&mut p, &mut dev, stream),
        }
    }
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    true
}

/// Smallest device in whole 2 MiB pages (binary search; the stream completes on an
/// unlimited device).
fn min_device(events: &[Event], class: Option<&[u8]>, tight: bool) -> u64 {
    let page = 2 * MIB;
    let (mut lo, mut hi) = (replay::peak_live(events) / page, 1u64 << 20);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if completes(events, class, mid * page, tight) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * page
}

fn main() {
    let traces = common::traces(std::env::args().skip(1).collect());
    say!(
        "| trace | frees | pool | peak live MiB | min device MiB | min/peak live | with lifetime classes (oracle) MiB | min/peak live |"
    );
    say!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, t, _) in traces {
        for frees in Frees::BOTH {
            let events = frees.apply(&t.events);
            // each allocation's class (1: freed before the peak of live bytes), and the peak
            let (class, peak) = lifetimes::classes(&events);
            for (label, tight) in [("stitch, budget off", false), ("stitch", true)] {
                let plain = min_device(&events, None, tight);
                let told = min_device(&events, Some(&class), tight);
                say!(
                    "| {name} | {} | {label} | {:.1} | {} | {:.3} | {} | {:.3} |",
                    frees.name(),
                    peak as f64 / MIB as f64,
                    plain / MIB,
                    plain as f64 / peak as f64,
                    told / MIB,
                    told as f64 / peak as f64
                );
            }
        }
    }
}
