//! The tight pool's budget slack against its driver calls: for each budget (ratio, slack,
//! and whether the arena grows by runs of pages under one handle, `Stitch::with_runs`),
//! every trace under both free semantics, the peak reserved over peak live on an 80 GiB
//! device, the driver calls of passes 2 and 3 of a 3-pass loop, and the calls per 1000
//! allocations in the second half of one pass. Then, per trace, the bound of a pool that never
//! stitches: one address range, best fit by (length, address), freed ranges coalesced, grown at
//! its end only (PyTorch's expandable segments in one segment, no small pool): its peak length
//! in whole pages over peak live. A pool that serves every new shape without a driver call
//! needs at least about that much memory.
//!
//! `cargo run --release -p vramshim-pool --example pool_slack -- [RATIO:SLACK_MIB[:runs][:kept][:nolayers][:grow][:holds] ...] -- [DIR_OR_FILES...]`
//! (default budgets: 0.05:2 0.075:2 0.10:0 0.05:16 0.05:32 0.05:2:runs; `:nolayers`: without
//! the layer replay, `Stitch::with_layers(false)`, which is on by default; `:grow`:
//! `Stitch::with_grow`; `:holds`: `Stitch::with_layer_holds`).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use vramshim_pool::replay::Event;
use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Budget, Stitch};
use vramshim_pool::{ALIGN, AccountingDevice, MIB, Policy};

/// Peak bytes (whole 2 MiB pages) of one best-fit range that only grows at its end.
fn arena_only(events: &[Event]) -> u64 {
    let g = 2 * MIB;
    // free ranges start -> end, and by (len, start) for best fit
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut by_len: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut end = 0u64;
    let mut peak = 0u64;
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in events {
        match *e {
            Event::Alloc { id, size, .. } => {
                let sz = size.max(1).div_ceil(ALIGN) * ALIGN;
                let at = if let Some(&(len, s)) = by_len.range((sz, 0)..).next() {
                    by_len.remove(&(len, s));
                    free.remove(&s);
                    if len > sz {
                        free.insert(s + sz, s + len);
                        by_len.insert((len - sz, s + sz));
                    }
                    s
                } else if let Some((&s, &fe)) = free.iter().next_back()
                    && fe == end
                {
                    // the free tail grows
                    free.remove(&s);
                    by_len.remove(&(fe - s, s));
                    end = s + sz;
                    s
                } else {
                    end += sz;
                    end - sz
                };
                peak = peak.max(end);
                live.insert(id, (at, sz));
            }
            Event::Free { id, .. } => {
                let Some((mut s, sz)) = live.remove(&id) else {
                    continue;
                };
                let mut fe = s + sz;
                if let Some((&ps, &pe)) = free.range(..s).next_back()
                    && pe == s
                {
                    free.remove(&ps);
                    by_len.remove(&(pe - ps, ps));
                    s = ps;
                }
                if let Some(&ne) = free.get(&fe) {
                    free.remove(&fe);
                    by_len.remove(&(ne - fe, fe));
                    fe = ne;
                }
                free.insert(s, fe);
                by_len.insert((fe - s, s));
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    peak.div_ceil(g) * g
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut budgets: Vec<(f64, u64, bool, bool, bool, bool, bool)> = Vec::new();
    for a in &args[..split] {
        let (spec, holds) = match a.strip_suffix(":holds") {
            Some(s) => (s, true),
            None => (a.as_str(), false),
        };
        let (spec, grow) = match spec.strip_suffix(":grow") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        // layers are on by default: `:nolayers` turns them off (`:layers` is the default)
        let (spec, layers) = match (spec.strip_suffix(":nolayers"), spec.strip_suffix(":layers")) {
            (Some(s), _) => (s, false),
            (None, Some(s)) => (s, true),
            (None, None) => (spec, true),
        };
        let (spec, kept) = match spec.strip_suffix(":kept") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        let (spec, runs) = match spec.strip_suffix(":runs") {
            Some(s) => (s, true),
            None => (spec, false),
        };
        let parsed = spec
            .split_once(':')
            .and_then(|(r, s)| Some((r.parse::<f64>().ok()?, s.parse::<u64>().ok()?)));
        match parsed {
            Some((r, s)) if r.is_finite() && r >= 0.0 => {
                budgets.push((r, s, runs, kept, layers, grow, holds))
            }
            _ => {
                eprintln!(
                    "pool_slack: budget `{a}`: expected RATIO:SLACK_MIB[:runs][:kept][:nolayers][:grow][:holds] such as 0.05:2 or 0.05:2:runs"
                );
                std::process::exit(2);
            }
        }
    }
    if budgets.is_empty() {
        budgets = vec![
            (0.05, 2, false, false, true, false, false),
            (0.075, 2, false, false, true, false, false),
            (0.10, 0, false, false, true, false, false),
            (0.05, 16, false, false, true, false, false),
            (0.05, 32, false, false, true, false, false),
            (0.05, 2, true, false, true, false, false),
        ];
    }
    let traces = common::traces(args.get(split + 1..).unwrap_or(&[]).to_vec());
    println!(
        "| trace | frees | budget | reserved/live | min device / peak live | driver calls | passes 2, 3 calls | calls /1000 allocs, 2nd half |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |");
    let mut bounds = Vec::new();
    for (name, t, live) in traces {
        for frees in Frees::BOTH {
            let stream = frees.apply(&t.events);
            for &(ratio, slack, runs, kept, layers, grow, holds) in &budgets {
                let make = move || -> Box<dyn Policy> {
                    Box::new(
                        Stitch::new()
                            .with_budget(Some(Budget {
                                ratio,
                                slack: slack * MIB,
                                ..Budget::default()
                            }))
                            .with_runs(runs)
                            .with_kept(kept)
                            .with_layers(layers)
                            .with_grow(grow)
                            .with_layer_holds(holds),
                    )
                };
                let mut dev = AccountingDevice::new(80 << 30);
                let mut p = make();
                let r = replay::run_with(&stream, p.as_mut(), &mut dev);
                assert!(r.completed, "{name}: {:?}", r.first_failure);
                let passes = replay::calls_per_pass_with(&t.events, frees, &make, 3);
                let half = replay::second_half_calls_per_1000(&t.events, frees, &make);
                let min = replay::min_capacity_with(&stream, &make);
                println!(
                    "| {name} | {} | {:.1}% + {slack} MiB{}{}{}{}{} | {:.3} | {:.3} | {} | {}, {} | {:.1} |",
                    frees.name(),
                    ratio * 100.0,
                    if runs { ", runs" } else { "" },
                    if kept { ", kept" } else { "" },
                    if layers { "" } else { ", no layers" },
                    if grow { ", grow" } else { "" },
                    if holds { ", holds" } else { "" },
                    r.peak_device_used as f64 / live as f64,
                    min as f64 / live as f64,
                    r.driver_calls,
                    passes[1],
                    passes[2],
                    half
                );
            }
        }
        bounds.push((name, arena_only(&t.events) as f64 / live as f64));
    }
    println!();
    println!("| trace | one best-fit range grown at its end, peak / peak live |");
    println!("| --- | ---: |");
    for (name, r) in bounds {
        println!("| {name} | {r:.3} |");
    }
}
