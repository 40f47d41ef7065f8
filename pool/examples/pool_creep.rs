//! The tight pool over repeated passes: peak reserved / peak live, driver calls and
//! synchronizations so far after each pass, and where the pool grew past its earlier
//! high-water mark.
//!
//! `cargo run --release -p vramshim-pool --example pool_creep -- TRACE.csv [PASSES] [sync|async] [-v]`; also the driver calls of the second half of the allocations, by kind

#[macro_use]
mod common;

use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, Policy, Request};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: pool_creep TRACE.csv [PASSES] [sync|async] [-v]");
        std::process::exit(2);
    };
    let passes: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    let frees = match args.get(2).map(String::as_str) {
        Some("async") => Frees::StreamOrdered,
        _ => Frees::CudaFree,
    };
    let verbose = args.iter().any(|a| a == "-v");
    let t = common::read_trace(std::path::Path::new(path));
    let one = replay::repeat(&t.events, 1).len();
    let all = frees.apply(&replay::repeat(&t.events, passes));
    let mut dev = AccountingDevice::new(replay::UNLIMITED);
    let mut p = Stitch::tight();
    let mut ids = std::collections::HashMap::new();
    let (mut live, mut peak_live, mut hw) = (0u64, 0u64, 0u64);
    let mut sizes = std::collections::HashMap::new();
    let allocs = all
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let (mut seen, mut half) = (0, None);
    for (i, ev) in all.iter().enumerate() {
        if matches!(ev, Event::Alloc { .. }) {
            seen += 1;
            if seen == allocs / 2 + 1 {
                half = Some(dev.calls());
            }
        }
        match *ev {
            Event::Alloc { id, size, stream } => {
                let before = p.stats().reserved;
                let a = p.alloc(&mut dev, Request { size, stream }).expect("alloc");
                ids.insert(id, a.addr);
                sizes.insert(id, size);
                live += size;
                peak_live = peak_live.max(live);
                let r = p.stats().reserved;
                if r > hw {
                    if verbose && i >= one {
                        say!(
                            "pass {} ev {}: size {} grew {} -> {} MiB (live {} MiB, budget {} MiB) | {}",
                            i / one + 1,
                            i % one,
                            size,
                            before >> 20,
                            r >> 20,
                            live >> 20,
                            p.stats().budget >> 20,
                            p.debug_state()
                        );
                    }
                    hw = r;
                }
            }
            Event::Free { id, mode } => {
                if let Some(a) = ids.remove(&id) {
                    let _ = p.free(&mut dev, a, mode);
                    live -= sizes.remove(&id).unwrap_or(0);
                }
            }
            Event::ProcessSync => replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => replay::retire_stream(&mut p, &mut dev, stream),
        }
        if (i + 1) % one == 0 {
            say!(
                "after pass {}: held {:.3} x peak live, driver calls {}, syncs {}",
                (i + 1) / one,
                dev.peak_used() as f64 / peak_live as f64,
                dev.calls().driver_calls(),
                dev.calls().syncs()
            );
        }
    }
    if let Some(h) = half {
        let e = dev.calls();
        say!(
            "second half of the allocations: create {} release {} map {} unmap {} reserve {} unreserve {} set_access {}",
            e.create - h.create,
            e.release - h.release,
            e.map - h.map,
            e.unmap - h.unmap,
            e.reserve - h.reserve,
            e.unreserve - h.unreserve,
            e.set_access - h.set_access
        );
    }
}
