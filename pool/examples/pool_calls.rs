//! Where a trace's driver calls go: every allocation (or free) that makes driver calls on the
//! tight pool, with its index, size, live and held bytes, and the calls by kind.
//!
//! `cargo run --release -p vramshim-pool --example pool_calls -- TRACE.csv [sync|async] [FROM] [runs] [nolayers] [grow] [holds] [places] [request|pow2] [twice] [guard]`
//! (`FROM`: the first allocation index listed; default: the second half; `runs`: the arena
//! grows by runs of pages, `Stitch::with_runs`; `nolayers`: `Stitch::with_layers(false)`, the
//! layer replay being on by default; `grow`: `Stitch::with_grow`; `holds`:
//! `Stitch::with_layer_holds`; `places`: also every allocation of at least a page among the
//! `PLACES_SPAN` from `FROM` on, with its place (the arena or a stitched mapping, and the
//! offset) and, where the layer replay had places for it, which allocation each place was and
//! which live or pending blocks were in it, and the latest earlier places of its size
//! (`twin place`) with the blocks in them; `request` / `pow2`: handles sized per request,
//! `Stitch::with_shapes`; `twice`: two passes of the trace as `pool_slack`'s "passes 2, 3"
//! runs them, `FROM` defaulting to the second pass's first allocation; `guard`: the shape
//! guard, `Stitch::with_shape_guard`). Every free reaches the pool (no thread caches).

#[macro_use]
mod common;

use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Shapes, Stitch};
use vramshim_pool::{ALIGN, AccountingDevice, CallCounts, Device, MIB, Policy, Request};

/// How many allocations from `FROM` on `places` lists.
const PLACES_SPAN: usize = 100;
/// How many earlier places of its size (latest first) `places` shows for an allocation.
const TWINS_SHOWN: usize = 3;

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / MIB as f64)
}

fn kinds(c: &CallCounts) -> String {
    let mut s = String::new();
    for (n, v) in [
        ("create", c.create),
        ("release", c.release),
        ("map", c.map),
        ("unmap", c.unmap),
        ("reserve", c.reserve),
        ("unreserve", c.unreserve),
        ("set_access", c.set_access),
    ] {
        if v > 0 {
            s.push_str(&format!(" {n} {v}"));
        }
    }
    s
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let runs = args.iter().any(|a| a == "runs");
    let layers = !args.iter().any(|a| a == "nolayers");
    let grow = args.iter().any(|a| a == "grow");
    let places = args.iter().any(|a| a == "places");
    let holds = args.iter().any(|a| a == "holds");
    let twice = args.iter().any(|a| a == "twice");
    let guard = args.iter().any(|a| a == "guard");
    let shapes = if args.iter().any(|a| a == "pow2") {
        Shapes::Pow2
    } else if args.iter().any(|a| a == "request") {
        Shapes::Request
    } else {
        Shapes::Pages
    };
    args.retain(|a| {
        a != "runs"
            && a != "layers"
            && a != "nolayers"
            && a != "grow"
            && a != "holds"
            && a != "places"
            && a != "request"
            && a != "pow2"
            && a != "twice"
            && a != "guard"
    });
    let Some(path) = args.first() else {
        eprintln!(
            "usage: pool_calls TRACE.csv [sync|async] [FROM] [runs] [nolayers] [grow] [holds] [places] [request|pow2] [twice] [guard]"
        );
        std::process::exit(2);
    };
    let frees = match args.get(1).map(String::as_str) {
        Some("sync") => Frees::CudaFree,
        _ => Frees::StreamOrdered,
    };
    let t = common::read_trace(std::path::Path::new(path));
    let one = frees.apply(&t.events);
    let one_allocs = one
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let ev = if twice {
        frees.apply(&replay::repeat(&t.events, 2))
    } else {
        one
    };
    let allocs = ev
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let from: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(if twice { one_allocs } else { allocs / 2 });
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight()
        .with_runs(runs)
        .with_layers(layers)
        .with_grow(grow)
        .with_layer_holds(holds)
        .with_shape_guard(guard)
        .with_shapes(shapes);
    let mut ids = std::collections::HashMap::new();
    // for `places`: the number of the latest allocation at each address, and of each
    // allocation of at least a page, in order (the layer replay counts those)
    let mut numbers: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut large: Vec<usize> = Vec::new();
    let mut n = 0usize;
    let mut total = 0u64;
    for e in &ev {
        let before = dev.calls();
        let what = match *e {
            Event::Alloc { id, size, stream } => {
                n += 1;
                let listed = places && n > from && n <= from + PLACES_SPAN;
                // each place with its earlier allocation's number and its blockers', named
                // before this allocation changes what lies there
                let looked: Vec<(usize, u64, String)> = if listed {
                    p.layer_places(size)
                        .into_iter()
                        .map(|lp| {
                            let mut why = String::new();
                            if lp.gone {
                                why.push_str(" gone");
                            }
                            for &(b, bs, st) in &lp.blockers {
                                let who =
                                    numbers.get(&b).map_or("?".to_string(), |x| x.to_string());
                                why.push_str(&format!(" {st} {} MiB (alloc {who})", mib(bs)));
                            }
                            (lp.back, lp.addr, why)
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let (hits, replays) = (p.stats().cache_hits, p.replays() + p.layer_replays());
                // the earlier places of its size (its twins'), with what is in them now
                let twins: Vec<String> = if listed {
                    p.twin_places(size)
                        .into_iter()
                        .take(TWINS_SHOWN)
                        .map(|tp| {
                            let mut why = format!("{:#x}", tp.addr);
                            if tp.gone {
                                why.push_str(" gone");
                            }
                            for &(b, bs, st) in &tp.blockers {
                                let who =
                                    numbers.get(&b).map_or("?".to_string(), |x| x.to_string());
                                why.push_str(&format!(" {st} {} MiB (alloc {who})", mib(bs)));
                            }
                            why
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                let a = p.alloc(&mut dev, Request { size, stream }).expect("alloc");
                dev.check_alloc(a.addr, size, stream);
                // how the pool served it: its cache, a replayed place, or placed afresh
                let how = if p.stats().cache_hits > hits {
                    " (cached block)"
                } else if p.replays() + p.layer_replays() > replays {
                    " (replayed place)"
                } else {
                    ""
                };
                ids.insert(id, a.addr);
                // kept after the free: a pending or cached block is still that allocation's
                numbers.insert(a.addr, n);
                let g = dev.granularity();
                if size.max(1).div_ceil(ALIGN) * ALIGN >= g {
                    large.push(n);
                    if listed {
                        let d = dev.calls().since(&before);
                        let (va, off, arena) = p.place_of(a.addr).expect("a live block");
                        let at = if arena {
                            "arena".to_string()
                        } else {
                            format!("mapping {va:#x}")
                        };
                        say!(
                            "  alloc {n} size {} MiB at {at} + {} MiB{how}:{}",
                            mib(size),
                            mib(off),
                            kinds(&d)
                        );
                        for why in &twins {
                            say!("    twin place {why}");
                        }
                        for (back, addr, why) in &looked {
                            let whose = large
                                .len()
                                .checked_sub(back + 1)
                                .map_or("?".to_string(), |i| large[i].to_string());
                            let taken = if *addr == a.addr { " taken;" } else { "" };
                            say!("    layer place {back} back (alloc {whose}):{taken}{why}");
                        }
                    }
                }
                format!("alloc {n} size {:.2} MiB", size as f64 / MIB as f64)
            }
            Event::Free { id, mode } => {
                let Some(a) = ids.remove(&id) else { continue };
                dev.check_free(a, mode);
                p.free(&mut dev, a, mode).expect("free");
                format!("free after alloc {n}")
            }
            Event::ProcessSync => {
                replay::process_sync(&mut p, &mut dev);
                continue;
            }
            Event::StreamRetired { stream } => {
                replay::retire_stream(&mut p, &mut dev, stream);
                continue;
            }
        };
        let d = dev.calls().since(&before);
        if d.driver_calls() > 0 && n > from {
            total += d.driver_calls();
            let s = p.stats();
            let (own, bound) = p.free_page_counts();
            say!(
                "{what}: live {:.1} held {:.1} budget {:.1} MiB, free pages {own} + {bound} in runs:{}",
                s.live as f64 / MIB as f64,
                s.reserved as f64 / MIB as f64,
                s.budget as f64 / MIB as f64,
                kinds(&d)
            );
        }
    }
    say!(
        "driver calls after allocation {from}: {total} ({:.1} per 1000 allocations); violations {:?}; layer replays {}; grown in place {}",
        total as f64 * 1000.0 / (allocs - from).max(1) as f64,
        dev.violations().first(),
        p.layer_replays(),
        p.grows()
    );
}
