//! Why a trace needs the device it needs: the smallest device on which the stitch pool
//! completes it, and, one page below, the request that fails there with the pool's page state
//! (free pages, free bytes inside partly used pages, the largest free head and tail a large
//! block could take). `-v` lists every partly used page: its free ranges and the blocks that
//! pin it (size, state, index of the allocating event).
//!
//! `cargo run --release -p vramshim-pool --example pool_fit -- TRACE.csv [sync|async]
//! [stitch|no-budget] [MiB] [-v]` (default: sync, stitch, one page below the smallest device;
//! `stitch` is the pool with its budget, `Stitch::tight()`, also accepted as `tight`;
//! `no-budget` is `Stitch::new()`).

mod common;

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{MIB, Policy, Request};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: pool_fit TRACE.csv [sync|async] [stitch|no-budget] [MiB] [-v]";
    let Some(path) = args.first() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mut frees = Frees::CudaFree;
    let mut tight = true;
    let mut device: Option<u64> = None;
    let mut verbose = false;
    for a in &args[1..] {
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
    let events = frees.apply(&t.events);
    let make = move || -> Box<dyn Policy> { Box::new(common::stitch(tight)) };
    let live = replay::peak_live(&events);
    let min = replay::min_capacity_with(&events, &make);
    println!(
        "peak live {:.1} MiB, smallest device {} MiB ({:.3} x peak live)",
        live as f64 / MIB as f64,
        min / MIB,
        min as f64 / live as f64
    );
    let cap = device.unwrap_or(min.saturating_sub(2 * MIB));
    let (mut dev, mut p) = common::checking_stitch(cap, tight);
    let mut ids: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut born: HashMap<u64, usize> = HashMap::new();
    let mut now = 0u64;
    for (i, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, stream } => {
                match p.alloc(&mut dev, Request { size, stream }) {
                    Ok(a) => {
                        ids.insert(id, (a.addr, size));
                        born.insert(a.addr, i);
                        now += size;
                    }
                    Err(e) => {
                        println!(
                            "device {} MiB: event {i} (allocation of {size} B) fails with {:.1} MiB live: {e}",
                            cap / MIB,
                            now as f64 / MIB as f64
                        );
                        report(&p, &born, verbose);
                        return;
                    }
                }
            }
            Event::Free { id, mode } => {
                if let Some((a, size)) = ids.remove(&id) {
                    born.remove(&a);
                    let _ = p.free(&mut dev, a, mode);
                    now -= size;
                }
            }
            Event::ProcessSync => {
                dev.process_sync();
                p.note_process_sync();
            }
        }
    }
    println!(
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
    println!(
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
        println!(
            "page {} ({}): free {} | {}",
            v.page,
            if v.small { "small" } else { "large" },
            free.join(" "),
            blocks.join(", ")
        );
    }
}
