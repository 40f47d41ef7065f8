//! What the first layers of each new large shape find: for the first allocations of every
//! size of at least `MIN_PAGES` pages first seen after `FROM`, the pool's handles just before
//! the allocation (how many, how many pages each, what is free, cached or pending in them),
//! its held bytes against its budget, and the fewest handles a new mapping over what is free
//! (or cached, or pending) could map; then what the allocation made.
//!
//! `cargo run --release -p vramshim-pool --example pool_handles -- TRACE.csv [sync|async] [FROM] [LAYERS] [pages|request|pow2] [nolayers] [guard]`
//! (`FROM`: default the second half; `LAYERS`: how many allocations of each new size are
//! listed, default 4; handles sized per request by default; `guard`: the shape guard,
//! `Stitch::with_shape_guard`). Every free reaches the pool (no
//! thread caches), as in `pool_calls`.
//!
//! Columns: `held/budget` pages; `handles` (of which whole free: no byte used); `free`,
//! `cached`, `pending` in pages' worth; `fewest free`: the fewest handles whose free bytes add
//! up to the request (a lower bound on the maps of a new mapping over free bytes alone: it
//! ignores that the bytes must lie end to end); `+cached`, `+pending`: the same counting
//! cached bytes (a dissolve), and pending ones too (a synchronization) as free; `to 1.10x`:
//! pages the pool could still take before it held 1.10 x the trace's peak live bytes;
//! `bound`: the fewest driver calls of a new mapping over those handles' free, cached and
//! pending bytes, or over a fresh handle of at most the pages `to 1.10x` leaves and the
//! handles for the rest (a map per handle, a set access, a create if it grows); the mappings
//! column: mappings held spanning the request's pages, of which have a window no live or
//! pending block touches (a carve at 0 calls once cached blocks are dissolved), and of which
//! no block at all.

#[macro_use]
mod common;

use vramshim_pool::replay::{Event, Frees};
use vramshim_pool::stitch::{HandleView, Shapes, Stitch};
use vramshim_pool::{AccountingDevice, CallCounts, Device, MIB, Policy, Request};

/// Sizes of at least this many pages are the shapes listed.
const MIN_PAGES: u64 = 8;

fn kinds(c: &CallCounts) -> String {
    let mut s = String::new();
    for (n, v) in [
        ("create", c.create),
        ("release", c.release),
        ("map", c.map),
        ("unmap", c.unmap),
        ("set_access", c.set_access),
    ] {
        if v > 0 {
            s.push_str(&format!(" {n} {v}"));
        }
    }
    if s.is_empty() {
        s.push_str(" none");
    }
    s
}

/// The fewest handles whose `bytes` add up to `size` (None: all of them do not).
fn fewest(hs: &[HandleView], size: u64, bytes: impl Fn(&HandleView) -> u64) -> Option<usize> {
    let mut v: Vec<u64> = hs.iter().map(bytes).filter(|&b| b > 0).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0;
    for (i, b) in v.iter().enumerate() {
        sum += b;
        if sum >= size {
            return Some(i + 1);
        }
    }
    None
}

/// The fewest driver calls a new mapping for `size` bytes makes with the handles `hs` and
/// `room` pages of growth: 0 if a held mapping has a window for it (not counted here: see
/// the mappings column), else a map per handle and a set access, plus a create if it grows
/// (a fresh handle of at most `room` pages, the rest from the handles' `bytes`).
fn bound(
    hs: &[HandleView],
    size: u64,
    room: u64,
    g: u64,
    bytes: &dyn Fn(&HandleView) -> u64,
) -> String {
    let pages = size.div_ceil(g);
    let held = fewest(hs, size, bytes).map(|k| k as u64 + 1);
    let grown = if room >= pages {
        Some(3)
    } else if room > 0 {
        fewest(hs, size - room * g, bytes).map(|k| k as u64 + 3)
    } else {
        None
    };
    match (held, grown) {
        (Some(a), Some(b)) => a.min(b).to_string(),
        (Some(a), None) | (None, Some(a)) => a.to_string(),
        (None, None) => "-".to_string(),
    }
}

fn show(n: Option<usize>) -> String {
    n.map_or("-".to_string(), |k| k.to_string())
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let shapes = if args.iter().any(|a| a == "pages") {
        Shapes::Pages
    } else if args.iter().any(|a| a == "pow2") {
        Shapes::Pow2
    } else {
        Shapes::Request
    };
    let layers = !args.iter().any(|a| a == "nolayers");
    let guard = args.iter().any(|a| a == "guard");
    args.retain(|a| {
        !matches!(
            a.as_str(),
            "pages" | "request" | "pow2" | "nolayers" | "guard"
        )
    });
    let Some(path) = args.first() else {
        eprintln!(
            "usage: pool_handles TRACE.csv [sync|async] [FROM] [LAYERS] [pages|request|pow2] [nolayers] [guard]"
        );
        std::process::exit(2);
    };
    let frees = match args.get(1).map(String::as_str) {
        Some("sync") => Frees::CudaFree,
        _ => Frees::StreamOrdered,
    };
    let t = common::read_trace(std::path::Path::new(path));
    let ev = frees.apply(&t.events);
    let allocs = ev
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let from: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(allocs / 2);
    let per_size: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let g = dev.granularity();
    let mut p = Stitch::tight()
        .with_layers(layers)
        .with_shapes(shapes)
        .with_shape_guard(guard);
    // the trace's peak of live bytes, for the room up to 1.10 x of it
    let peak = {
        let (mut live, mut peak) = (0u64, 0u64);
        let mut sizes = std::collections::HashMap::new();
        for e in &ev {
            match *e {
                Event::Alloc { id, size, .. } => {
                    sizes.insert(id, size);
                    live += size;
                    peak = peak.max(live);
                }
                Event::Free { id, .. } => live -= sizes.remove(&id).unwrap_or(0),
                _ => {}
            }
        }
        peak
    };
    let cap_pages = (peak as f64 * 1.10 / g as f64).floor() as u64;
    // each size's first allocation: a size first seen after `FROM` is a new shape there
    let mut first: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut i = 0;
    for e in &ev {
        if let Event::Alloc { size, .. } = *e {
            i += 1;
            first.entry(size).or_insert(i);
        }
    }
    let mut seen: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut ids = std::collections::HashMap::new();
    let mut n = 0usize;
    say!(
        "| alloc | size MiB (pages) | layer | live MiB | held/budget | handles (whole free) | pages per handle | free | cached | pending | fewest free | +cached | +pending | to 1.10x | bound | mappings long enough (window free of live and pending; of any block) | calls |"
    );
    say!(
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    );
    for e in &ev {
        match *e {
            Event::Alloc { id, size, stream } => {
                n += 1;
                let pages = size.div_ceil(g);
                let k = seen.entry(size).or_insert(0);
                *k += 1;
                let listed = n > from
                    && pages >= MIN_PAGES
                    && *k <= per_size
                    && first.get(&size).is_some_and(|&f| f > from);
                let before = dev.calls();
                let row = listed.then(|| {
                    let hs = p.handle_views();
                    let s = p.stats();
                    let mut hist = std::collections::BTreeMap::new();
                    for h in &hs {
                        *hist.entry(h.pages).or_insert(0u32) += 1;
                    }
                    let hist: Vec<String> =
                        hist.iter().map(|(k, c)| format!("{k}x{c}")).collect();
                    let whole = hs.iter().filter(|h| h.free_pages == h.pages).count();
                    let sum = |f: &dyn Fn(&HandleView) -> u64| -> f64 {
                        hs.iter().map(f).sum::<u64>() as f64 / g as f64
                    };
                    let room = cap_pages.saturating_sub(s.reserved / g);
                    let all = |h: &HandleView| h.free + h.cached + h.pending;
                    let (long, pinned_free, all_free) = p.carve_view(size);
                    format!(
                        "| {n} | {:.2} ({pages}) | {k} | {:.1} | {}/{} | {} ({whole}) | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {long} ({pinned_free}; {all_free}) |",
                        size as f64 / MIB as f64,
                        s.live as f64 / MIB as f64,
                        s.reserved / g,
                        s.budget / g,
                        hs.len(),
                        hist.join(" "),
                        sum(&|h| h.free),
                        sum(&|h| h.cached),
                        sum(&|h| h.pending),
                        show(fewest(&hs, size, |h| h.free)),
                        show(fewest(&hs, size, |h| h.free + h.cached)),
                        show(fewest(&hs, size, |h| h.free + h.cached + h.pending)),
                        cap_pages as i64 - (s.reserved / g) as i64,
                        bound(&hs, size, room, g, &all),
                    )
                });
                let a = p.alloc(&mut dev, Request { size, stream }).expect("alloc");
                dev.check_alloc(a.addr, size, stream);
                ids.insert(id, a.addr);
                if let Some(row) = row {
                    say!("{row}{} |", kinds(&dev.calls().since(&before)));
                }
            }
            Event::Free { id, mode } => {
                let Some(a) = ids.remove(&id) else { continue };
                dev.check_free(a, mode);
                p.free(&mut dev, a, mode).expect("free");
            }
            Event::ProcessSync => vramshim_pool::replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => {
                vramshim_pool::replay::retire_stream(&mut p, &mut dev, stream)
            }
        }
    }
    say!(
        "peak live {:.2} MiB, 1.10 x = {cap_pages} pages; violations {:?}",
        peak as f64 / MIB as f64,
        dev.violations().first()
    );
}
