//! Where a trace's pages come from: the default pool (stitch with its budget) replayed on an
//! 80 GiB device behind the live library's thread caches (as `replay::run_with` runs it),
//! and every event after which the pool holds more pages than before: the event, the bytes
//! live then, the pages before and after, and the bytes cached and pending a
//! synchronization. With `-v`, after each of them every page that is not wholly live: its
//! class (`S`: first used by a block of at most half a page, `L`: larger) and its bytes
//! live, cached, pending and free. At the end: the trace's peak of live bytes, and the peak
//! of the live bytes of blocks of at most half a page (what the small-block pages must hold
//! at least, in whole pages).
//!
//! Where the growth is for a block of at most half a page, the line says what the small-block
//! pages held for it besides: the widest gap between live and pending blocks on one of them
//! (what dissolving every cached block there opens: the slow path's `reuse_small` takes such
//! a gap before the pool grows), the widest gap between live blocks alone (what settling the
//! pending blocks by a synchronization would open as well), and whether the pool synchronized
//! while serving the request. Both are read after the request on the small-block pages held
//! before it (the page made for it left out); a request the pool synchronized for reads its
//! pending blocks as cached.
//!
//! `cargo run --release -p vramshim-pool --example pool_peak -- TRACE.csv [sync|async] [-v]`
//! (default: sync, i.e. `cudaFree`).

#[macro_use]
mod common;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::thread_cache::{self, ThreadCache};
use vramshim_pool::{MIB, Policy, Request};

fn mib(b: u64) -> String {
    format!("{:.2}", b as f64 / MIB as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: pool_peak TRACE.csv [sync|async] [-v]";
    let Some(path) = args.first() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mut frees = Frees::CudaFree;
    let mut verbose = false;
    for a in &args[1..] {
        match a.as_str() {
            "sync" => frees = Frees::CudaFree,
            "async" => frees = Frees::StreamOrdered,
            "-v" => verbose = true,
            other => {
                eprintln!("pool_peak: unknown argument {other:?}; {usage}");
                std::process::exit(2);
            }
        }
    }
    let t = common::read_trace(std::path::Path::new(path));
    let events = frees.apply(&t.events);
    let (mut dev, mut p) = common::checking_stitch(80 << 30, true);
    let g = 2 * MIB;
    // in front of the pool, the live library's thread caches, as `replay` runs them
    let mut front = p
        .thread_caches()
        .then(|| ThreadCache::new(thread_cache::Rules::LIVE));
    let mut ids: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    let (mut small, mut small_peak) = (0u64, 0u64);
    let mut pages = p.pages();
    for (i, ev) in events.iter().enumerate() {
        let syncs = p.stats().syncs;
        // the small block this event allocated, if any: (address, size)
        let mut small_block = None;
        let what = match *ev {
            Event::Alloc { id, size, stream } => {
                let got = match &mut front {
                    Some(c) => c
                        .alloc(&mut p, &mut dev, Request { size, stream })
                        .map(|x| x.0),
                    None => p.alloc(&mut dev, Request { size, stream }),
                };
                let a = match got {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("pool_peak: event {i} (allocation of {size} B) fails: {e}");
                        std::process::exit(1);
                    }
                };
                ids.insert(id, (a.addr, size, a.size));
                live += size;
                if size <= g / 2 {
                    small += size;
                    small_block = Some(a.addr);
                }
                format!("allocation of {size} B")
            }
            Event::Free { id, mode } => {
                let Some((a, size, granted)) = ids.remove(&id) else {
                    continue;
                };
                let _ = match &mut front {
                    Some(c) => c.free(&mut p, &mut dev, a, size, granted, mode).map(|_| 0),
                    None => p.free(&mut dev, a, mode),
                };
                live -= size;
                if size <= g / 2 {
                    small -= size;
                }
                format!("free of {size} B")
            }
            Event::ProcessSync => {
                if let Some(c) = &mut front {
                    let _ = c.process_sync(&mut p, &mut dev);
                }
                replay::process_sync(&mut p, &mut dev);
                "process synchronization".to_string()
            }
            Event::StreamRetired { stream } => {
                match &mut front {
                    Some(c) => {
                        let _ = c.retire_stream(&mut p, &mut dev, stream);
                    }
                    None => p.retire_stream(&mut dev, stream),
                }
                dev.retire_stream(stream);
                "stream retired".to_string()
            }
        };
        peak = peak.max(live);
        small_peak = small_peak.max(small);
        if p.pages() > pages {
            let s = p.stats();
            say!(
                "event {i} ({what}): {} MiB live ({} MiB in blocks of at most half a page), pages {pages} -> {}, {} MiB cached, {} MiB pending",
                mib(live),
                mib(small),
                p.pages(),
                mib(s.cached),
                mib(s.pending)
            );
            if let Some(addr) = small_block {
                let (pinned, live_only) = widest_gaps(&p, g, addr);
                say!(
                    "  small pages before it: widest gap {} KiB between live and pending blocks, {} KiB between live blocks; synchronized for it: {}",
                    pinned / 1024,
                    live_only / 1024,
                    if p.stats().syncs > syncs { "yes" } else { "no" }
                );
            }
            if verbose {
                pages_of(&p, g);
            }
        }
        pages = p.pages();
    }
    say!(
        "peak live {} MiB, of blocks of at most half a page {} MiB ({} pages at least); pages held at the end {}",
        mib(peak),
        mib(small_peak),
        small_peak.div_ceil(g),
        p.pages()
    );
}

/// Every page that is not wholly live: class, bytes live, cached, pending and free.
fn pages_of(p: &Stitch, g: u64) {
    for v in p.used_pages() {
        let mut by = [0u64; 3];
        for b in &v.blocks {
            let k = match b.4 {
                "live" => 0,
                "cached" => 1,
                _ => 2,
            };
            by[k] += b.1 - b.0;
        }
        if by[0] == g {
            continue;
        }
        say!(
            "  page {} {}: live {} KiB, cached {} KiB, pending {} KiB, free {} KiB, {} blocks",
            v.page,
            if v.small { "S" } else { "L" },
            by[0] / 1024,
            by[1] / 1024,
            by[2] / 1024,
            (g - v.used) / 1024,
            v.blocks.len()
        );
    }
}

/// The widest gap on a small-block page between live and pending blocks, and between live
/// blocks alone, the page of the block at `skip` (the request's own, on the page just
/// created for it) left out.
fn widest_gaps(p: &Stitch, g: u64, skip: u64) -> (u64, u64) {
    let mut widest = (0u64, 0u64);
    let pages = p.used_pages();
    for v in pages
        .iter()
        .filter(|v| v.small && v.blocks.iter().all(|b| b.2 != skip))
    {
        for (k, pins) in [&["live", "pending"][..], &["live"][..]]
            .into_iter()
            .enumerate()
        {
            let mut prev = 0u64;
            let mut w = 0u64;
            for b in v.blocks.iter().filter(|b| pins.contains(&b.4)) {
                w = w.max(b.0.saturating_sub(prev));
                prev = prev.max(b.1);
            }
            w = w.max(g.saturating_sub(prev));
            let slot = if k == 0 { &mut widest.0 } else { &mut widest.1 };
            *slot = (*slot).max(w);
        }
    }
    widest
}
