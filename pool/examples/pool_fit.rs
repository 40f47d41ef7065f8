//! Why a trace needs the device it needs: the smallest device on which the stitch pool
//! completes it, and, one page below, the request that fails there with the pool's page state
//! (free pages, free bytes inside partly used pages, the largest free head and tail a large
//! block could take). `-v` lists every partly used page: its free ranges and the blocks that
//! pin it (size, state, index of the allocating event).
//!
//! Then the bound at that request, for any placement of it with the blocks where they are
//! (no live byte moves): the whole pages it could take (free pages held and pages the device
//! can still create), the largest free page end on each side, and what the request needs (its
//! whole pages and its remainder as a head and a tail, or one whole page fewer and head and
//! tail making up a page more); and how many pages moving live bytes would free without moving
//! any address (two partly used pages whose used bytes lie at different offsets can share one
//! physical page: both mappings' pages are mapped to one of them after its bytes are copied).
//! The replay runs behind the live library's thread caches, as `replay::run_with` does, so
//! the request that fails is the one the smallest-device search saw fail.
//! `at=N` stops before event N instead (it must be an allocation) and prints the same for it.
//! `passes=N` replays N passes of the trace with the pool kept across them (`replay::repeat`:
//! each pass `cudaFree`s what it left live), as `pool_passes` does; event indices count from
//! the first pass's start.
//!
//! `cargo run --release -p vramshim-pool --example pool_fit -- TRACE.csv [sync|async]
//! [stitch|no-budget] [MiB] [at=N] [passes=N] [-v]` (default: sync, stitch, one page below the smallest
//! device; `stitch` is the pool with its budget, `Stitch::tight()`, also accepted as `tight`;
//! `no-budget` is `Stitch::new()`).

#[macro_use]
mod common;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::thread_cache::{self, ThreadCache};
use vramshim_pool::{Device, MIB, Policy, Request};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: pool_fit TRACE.csv [sync|async] [stitch|no-budget] [MiB] [at=N] [passes=N] [-v]";
    let Some(path) = args.first() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mut frees = Frees::CudaFree;
    let mut tight = true;
    let mut device: Option<u64> = None;
    let mut verbose = false;
    let mut at: Option<usize> = None;
    let mut passes = 1usize;
    for a in &args[1..] {
        if let Some(n) = a.strip_prefix("passes=") {
            match n.parse::<usize>() {
                Ok(n) if n >= 1 => passes = n,
                _ => {
                    eprintln!("pool_fit: passes= takes a count of at least 1, not {n:?}; {usage}");
                    std::process::exit(2);
                }
            }
            continue;
        }
        if let Some(n) = a.strip_prefix("at=") {
            match n.parse::<usize>() {
                Ok(n) => at = Some(n),
                Err(_) => {
                    eprintln!("pool_fit: at= takes an event index, not {n:?}; {usage}");
                    std::process::exit(2);
                }
            }
            continue;
        }
        match a.as_str() {
            "sync" => frees = Frees::CudaFree,
            "async" => frees = Frees::StreamOrdered,
            "stitch" | "tight" => tight = true,
            "no-budget" => tight = false,
            "-v" => verbose = true,
            n => match n.parse::<u64>() {
                Ok(m) => device = Some(m * MIB),
                Err(_) => {
                    eprintln!("pool_fit: unknown argument {n:?}; {usage}");
                    std::process::exit(2);
                }
            },
        }
    }
    let t = common::read_trace(std::path::Path::new(path));
    let events = frees.apply(&replay::repeat(&t.events, passes));
    let make = move || -> Box<dyn Policy> { Box::new(common::stitch(tight)) };
    let live = replay::peak_live(&events);
    let min = replay::min_capacity_with(&events, &make);
    say!(
        "peak live {:.1} MiB, smallest device {} MiB ({:.3} x peak live)",
        live as f64 / MIB as f64,
        min / MIB,
        min as f64 / live as f64
    );
    let cap = device.unwrap_or(min.saturating_sub(2 * MIB));
    let (mut dev, mut p) = common::checking_stitch(cap, tight);
    // in front of the pool, the live library's thread caches, as `replay` runs them
    let mut front = p
        .thread_caches()
        .then(|| ThreadCache::new(thread_cache::Rules::LIVE));
    let mut ids: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let mut born: HashMap<u64, usize> = HashMap::new();
    let mut now = 0u64;
    for (i, ev) in events.iter().enumerate() {
        if at == Some(i) {
            let Event::Alloc { size, .. } = *ev else {
                eprintln!("pool_fit: event {i} is not an allocation");
                std::process::exit(2);
            };
            say!(
                "device {} MiB: before event {i} (allocation of {size} B), {:.1} MiB live",
                cap / MIB,
                now as f64 / MIB as f64
            );
            report(&p, &born, verbose);
            bound(&p, &dev, size);
            return;
        }
        match *ev {
            Event::Alloc { id, size, stream } => {
                let got = match &mut front {
                    Some(c) => c
                        .alloc(&mut p, &mut dev, Request { size, stream })
                        .map(|x| x.0),
                    None => p.alloc(&mut dev, Request { size, stream }),
                };
                match got {
                    Ok(a) => {
                        ids.insert(id, (a.addr, size, a.size));
                        born.insert(a.addr, i);
                        now += size;
                    }
                    Err(e) => {
                        say!(
                            "device {} MiB: event {i} (allocation of {size} B) fails with {:.1} MiB live: {e}",
                            cap / MIB,
                            now as f64 / MIB as f64
                        );
                        report(&p, &born, verbose);
                        bound(&p, &dev, size);
                        return;
                    }
                }
            }
            Event::Free { id, mode } => {
                if let Some((a, size, granted)) = ids.remove(&id) {
                    born.remove(&a);
                    let _ = match &mut front {
                        Some(c) => c.free(&mut p, &mut dev, a, size, granted, mode).map(|_| 0),
                        None => p.free(&mut dev, a, mode),
                    };
                    now -= size;
                }
            }
            Event::ProcessSync => {
                if let Some(c) = &mut front {
                    let _ = c.process_sync(&mut p, &mut dev);
                }
                replay::process_sync(&mut p, &mut dev);
            }
            Event::StreamRetired { stream } => {
                match &mut front {
                    Some(c) => {
                        let _ = c.retire_stream(&mut p, &mut dev, stream);
                    }
                    None => p.retire_stream(&mut dev, stream),
                }
                dev.retire_stream(stream);
            }
        }
    }
    say!(
        "device {} MiB: completes ({} violations)",
        cap / MIB,
        dev.violations().len()
    );
}

fn report(p: &Stitch, born: &HashMap<u64, usize>, verbose: bool) {
    let pages = p.partial_pages();
    let g = 2 * MIB;
    let free: u64 = pages.iter().map(|v| g - v.used).sum();
    let small = pages.iter().filter(|v| v.small).count();
    let small_free: u64 = pages.iter().filter(|v| v.small).map(|v| g - v.used).sum();
    let head = pages
        .iter()
        .filter_map(|v| v.free.last().filter(|r| r.1 == g).map(|r| r.1 - r.0))
        .max()
        .unwrap_or(0);
    let tail = pages
        .iter()
        .filter_map(|v| v.free.first().filter(|r| r.0 == 0).map(|r| r.1))
        .max()
        .unwrap_or(0);
    let free_pages = p.pages() - p.used_pages().len() as u64;
    say!(
        "pool: {} pages held ({free_pages} free), {} partly used ({} KiB free in them; small-block pages {small}, {} KiB free), largest free head {} KiB, tail {} KiB, {} cached blocks, {} KiB pending a synchronization",
        p.pages(),
        pages.len(),
        free / 1024,
        small_free / 1024,
        head / 1024,
        tail / 1024,
        p.cached_blocks(),
        p.stats().pending / 1024
    );
    if !verbose {
        return;
    }
    for v in pages {
        let free: Vec<String> = v
            .free
            .iter()
            .map(|&(s, e)| format!("{}K-{}K", s / 1024, e / 1024))
            .collect();
        let blocks: Vec<String> = v
            .blocks
            .iter()
            .map(|&(s, e, a, size, st)| {
                let ev = born.get(&a).map_or("?".to_string(), |i| i.to_string());
                format!("{}K-{}K {size} B {st} (event {ev})", s / 1024, e / 1024)
            })
            .collect();
        say!(
            "page {} ({}): free {} | {}",
            v.page,
            if v.small { "small" } else { "large" },
            free.join(" "),
            blocks.join(", ")
        );
    }
}

/// What any placement of a `size`-byte request needs with the blocks where they are, and what
/// the pool has (see the module documentation).
fn bound(p: &Stitch, dev: &dyn Device, size: u64) {
    let g = 2 * MIB;
    // every used page as it would be with pending blocks released and cached ones dissolved:
    // (page, live byte ranges in order)
    let live: Vec<(u32, Vec<(u64, u64)>)> = p
        .used_pages()
        .iter()
        .map(|v| {
            let spans = v
                .blocks
                .iter()
                .filter(|b| b.4 == "live")
                .map(|b| (b.0, b.1))
                .collect();
            (v.page, spans)
        })
        .collect();
    let held_free = p.pages() - live.iter().filter(|x| !x.1.is_empty()).count() as u64;
    let creatable = dev.room().unwrap_or(0) / g;
    let whole = held_free + creatable;
    let (k, r) = (size / g, size % g);
    let partial: Vec<&(u32, Vec<(u64, u64)>)> = live
        .iter()
        .filter(|x| !x.1.is_empty() && x.1.iter().map(|s| s.1 - s.0).sum::<u64>() < g)
        .collect();
    let spare: u64 = partial
        .iter()
        .map(|x| g - x.1.iter().map(|s| s.1 - s.0).sum::<u64>())
        .sum();
    // free page ends: (bytes, page) of each free suffix and prefix
    let mut suffixes: Vec<(u64, u32)> = partial
        .iter()
        .map(|x| (g - x.1.iter().map(|s| s.1).max().unwrap_or(0), x.0))
        .filter(|x| x.0 > 0)
        .collect();
    let mut prefixes: Vec<(u64, u32)> = partial
        .iter()
        .map(|x| (x.1[0].0, x.0))
        .filter(|x| x.0 > 0)
        .collect();
    suffixes.sort_unstable_by(|a, b| b.cmp(a));
    prefixes.sort_unstable_by(|a, b| b.cmp(a));
    // the largest head + tail: one end alone, or a suffix and a prefix of two pages, or of
    // one page whose used bytes lie between them (the page mapped twice)
    let mut ends = suffixes.first().map_or(0, |x| x.0);
    ends = ends.max(prefixes.first().map_or(0, |x| x.0));
    for &(s, sp) in suffixes.iter().take(8) {
        for &(t, tp) in prefixes.iter().take(8) {
            if sp != tp || t <= g - s {
                ends = ends.max(s + t);
            }
        }
    }
    let top = |v: &[(u64, u32)]| -> String {
        v.iter()
            .take(4)
            .map(|(b, pg)| format!("{} KiB (page {pg})", b / 1024))
            .collect::<Vec<_>>()
            .join(", ")
    };
    say!(
        "bound (pending blocks released, cached ones dissolved): the request is {k} whole pages + {} KiB; whole pages it could take: {whole} ({held_free} free held, {creatable} the device can still create); {} KiB free in {} partly used pages; free page ends: suffixes {}; prefixes {}; largest head + tail {} KiB",
        r / 1024,
        spare / 1024,
        partial.len(),
        top(&suffixes),
        top(&prefixes),
        ends / 1024
    );
    let fits_a = whole >= k && ends >= r;
    let fits_b = k >= 1 && whole + 1 >= k && ends >= r + g;
    let short = |pages: u64, bytes: u64| {
        format!(
            "{} whole page(s) and {} KiB of ends short",
            pages.saturating_sub(whole),
            bytes.saturating_sub(ends) / 1024
        )
    };
    say!(
        "bound: {k} whole pages with ends >= {} KiB: {}; {} whole pages with ends >= {} KiB: {}",
        r / 1024,
        if fits_a {
            "fits".to_string()
        } else {
            short(k, r)
        },
        k.saturating_sub(1),
        (r + g) / 1024,
        if fits_b {
            "fits".to_string()
        } else {
            short(k.saturating_sub(1), r + g)
        },
    );
    let merged = merge_pairs(&partial);
    say!(
        "bound: pages freed by moving live bytes without moving an address (pairs of partly used pages whose used bytes lie at different offsets): {}{}",
        merged.len(),
        merged
            .iter()
            .take(6)
            .map(|(a, b)| format!(" {b}->{a}"))
            .collect::<String>()
    );
}

/// A greedy matching of partly used pages (page, used byte ranges) whose used ranges do not
/// overlap: the fullest pages first, each with the fullest partner that fits around it.
fn merge_pairs(pages: &[&(u32, Vec<(u64, u64)>)]) -> Vec<(u32, u32)> {
    let used = |x: &(u32, Vec<(u64, u64)>)| x.1.iter().map(|s| s.1 - s.0).sum::<u64>();
    let mut order: Vec<usize> = (0..pages.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(used(pages[i])));
    let apart = |a: usize, b: usize| {
        pages[a]
            .1
            .iter()
            .all(|x| pages[b].1.iter().all(|y| x.1 <= y.0 || y.1 <= x.0))
    };
    let mut taken = vec![false; pages.len()];
    let mut out = Vec::new();
    for (n, &a) in order.iter().enumerate() {
        if taken[a] {
            continue;
        }
        if let Some(&b) = order[n + 1..].iter().find(|&&b| !taken[b] && apart(a, b)) {
            taken[a] = true;
            taken[b] = true;
            out.push((pages[a].0, pages[b].0));
        }
    }
    out
}
