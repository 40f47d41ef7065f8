//! How tightly one address range can hold a trace when nothing is ever stitched: per trace,
//! the peak of live bytes, then the extent (peak end of the range over peak live) of
//! - the offline plan: every block's lifetime known, blocks placed greedy by size (largest
//!   first, each at the lowest best-fitting gap among the placed blocks whose lifetimes
//!   overlap it, TFLite / TVM style), in bytes and in whole 2 MiB pages;
//! - online arenas grown at their end, in whole pages ([`Place`], [`Lifetimes`]), with the
//!   most whole pages the arena maps over the tight pool's default budget (5% + 2 MiB over
//!   the peak of live bytes so far: what the pool would refuse it, and serve by stitching),
//!   and the growth events (page count rounded up each
//!   time the range's end passes its mapped pages) of the second half of the allocations,
//!   where issue 17's call target is counted.
//!
//! The offline plan is not reachable online, and not the smallest single range either (the
//! greedy is one heuristic; the smallest is at least the peak of live bytes): it is a range
//! a planner that knew every lifetime reaches, so a pool that never stitches is not bounded
//! by best fit.
//!
//! `cargo run --release -p vramshim-pool --example pool_plan -- [--ends=T[,T...]] [DIR_OR_FILES...]`
//! (default: two ends at 12 ticks; tests/workloads/traces).

#[macro_use]
mod common;

use common::plan::{Block, PAGE, blocks, offline};

use std::collections::{BTreeMap, HashMap};
use vramshim_pool::MIB;
use vramshim_pool::stitch::Budget;

/// Where an online arena takes a block's lifetime from; lifetimes count the allocations and
/// frees in between (a clock a pool keeps by itself).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lifetimes {
    /// The trace's own free (an oracle).
    Oracle,
    /// The lifetime of the last block freed whose size and the sizes of the `k` allocations
    /// before it were the same.
    Context(usize),
    /// The lifetime of the last block freed whose shape key was the same: the base-2
    /// logarithms of the sizes of the [`SHAPE_BEFORE`] allocations before it over its own size,
    /// rounded and clipped to +-[`SHAPE_CLIP`]. A new request shape scales its layers' sizes
    /// together, so its first layer finds the lifetimes of the layers of earlier shapes.
    Shape,
}

/// Allocations before a block that its shape key reads.
const SHAPE_BEFORE: usize = 8;
/// The shape key's clip: size ratios beyond 2^4 either way count as 2^4.
const SHAPE_CLIP: f64 = 4.0;

impl Lifetimes {
    fn name(self) -> String {
        match self {
            Lifetimes::Oracle => "oracle".into(),
            Lifetimes::Context(k) => format!("last lifetime of size + {k} before"),
            Lifetimes::Shape => format!("last lifetime of the shape of {SHAPE_BEFORE} before"),
        }
    }

    /// The key block `i` learns its lifetime under and is predicted by.
    fn key(self, blocks: &[Block], i: usize) -> Vec<u64> {
        match self {
            Lifetimes::Oracle => Vec::new(),
            Lifetimes::Context(k) => blocks[i.saturating_sub(k)..=i]
                .iter()
                .map(|b| b.size)
                .collect(),
            Lifetimes::Shape => {
                let own = blocks[i].size.max(1) as f64;
                let before = &blocks[i.saturating_sub(SHAPE_BEFORE)..i];
                std::iter::once(before.len() as u64)
                    .chain(before.iter().map(|b| {
                        let q = (b.size.max(1) as f64 / own)
                            .log2()
                            .round()
                            .clamp(-SHAPE_CLIP, SHAPE_CLIP);
                        (q + SHAPE_CLIP) as u64
                    }))
                    .collect()
            }
        }
    }
}

/// How an online arena places a block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Best fit by (length, address) among the gaps between live blocks.
    BestFit,
    /// In the gap whose neighbouring block frees closest to the block's predicted free, at that
    /// neighbour's side; best fit when nothing is predicted, and such a block, as a neighbour,
    /// counts as freed when it was allocated (a guess that keeps blocks of known lifetimes
    /// together).
    Near(Lifetimes),
    /// Two ends by predicted lifetime: at least `l` ticks at the bottom of the lowest gap that
    /// fits, shorter at the top of the highest gap that fits below the mapped end, best fit when
    /// nothing is predicted. Short-lived blocks then die above the long-lived ones, so the
    /// space they leave is one run that the next large block fits in.
    Ends(Lifetimes, usize),
}

impl Place {
    fn name(self) -> String {
        match self {
            Place::BestFit => "best fit".into(),
            Place::Near(l) => format!("near, {}", l.name()),
            Place::Ends(l, t) => format!("two ends at {t} ticks, {}", l.name()),
        }
    }

    fn lifetimes(self) -> Option<Lifetimes> {
        match self {
            Place::BestFit => None,
            Place::Near(l) | Place::Ends(l, _) => Some(l),
        }
    }
}

/// What an online arena did: its peak end in whole pages, and its growth events in the
/// second half of the allocations as (allocation number from 1, pages added).
struct Arena {
    pages: u64,
    grows: Vec<(usize, u64)>,
    /// The most whole pages mapped over the tight pool's default budget (5% + 2 MiB over the
    /// peak of live bytes so far, that allocation's included, in whole pages) after any
    /// allocation, and how many allocations of the second half left the arena over it.
    over_budget: (i64, usize),
}

/// A gap between live blocks: start, length, and the predicted frees of the blocks below and
/// above it (none: the range's start, or its mapped end).
type Gap = (u64, u64, Option<usize>, Option<usize>);

/// Replays `blocks` in event order on one range grown at its end, placing by `place`.
fn online(blocks: &[Block], place: Place) -> Arena {
    // frees and allocations in event order: (event index, block, is_alloc)
    let mut order: Vec<(usize, usize, bool)> = Vec::with_capacity(2 * blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        order.push((b.at, i, true));
        order.push((b.until, i, false));
    }
    order.sort_unstable();
    // the clock: one tick per allocation or free
    let (mut born, mut dies) = (vec![0; blocks.len()], vec![0; blocks.len()]);
    for (tick, &(_, i, alloc)) in order.iter().enumerate() {
        if alloc {
            born[i] = tick;
        } else {
            dies[i] = tick;
        }
    }
    let lifetimes = place.lifetimes();
    // live blocks: start -> (len, predicted free tick)
    let mut live: BTreeMap<u64, (u64, Option<usize>)> = BTreeMap::new();
    let mut at: Vec<u64> = vec![0; blocks.len()];
    let mut learned: HashMap<Vec<u64>, usize> = HashMap::new();
    let half = blocks.len() / 2;
    let mut mapped = 0u64;
    let mut grows = Vec::new();
    let mut gaps: Vec<Gap> = Vec::new();
    let (mut live_bytes, mut running) = (0u64, 0u64);
    let mut over_budget = (i64::MIN, 0usize);
    for (tick, &(_, i, alloc)) in order.iter().enumerate() {
        let b = blocks[i];
        if !alloc {
            live_bytes -= b.size;
            live.remove(&at[i]);
            if let Some(l) = lifetimes.filter(|l| *l != Lifetimes::Oracle) {
                learned.insert(l.key(blocks, i), tick - born[i]);
            }
            continue;
        }
        let life = match lifetimes {
            None => None,
            Some(Lifetimes::Oracle) => Some(dies[i] - tick),
            Some(l) => learned.get(&l.key(blocks, i)).copied(),
        };
        let pf = life.map(|l| tick + l);
        gaps.clear();
        let mut prev = 0u64;
        let mut below: Option<usize> = None;
        for (&s, &(l, f)) in &live {
            if s - prev >= b.len {
                gaps.push((prev, s - prev, below, f));
            }
            prev = s + l;
            below = f;
        }
        let end = prev;
        let start = match place {
            Place::Near(_) => near(&gaps, b.len, pf).unwrap_or(end),
            Place::BestFit => best_fit(&gaps).unwrap_or(end),
            Place::Ends(_, short) => {
                if mapped >= end + b.len {
                    gaps.push((end, mapped - end, below, None));
                }
                match life.map(|l| l >= short) {
                    None => best_fit(&gaps),
                    Some(true) => gaps.first().map(|g| g.0),
                    Some(false) => gaps.last().map(|g| g.0 + g.1 - b.len),
                }
                .unwrap_or(end)
            }
        };
        // no overlap with the live blocks on either side
        assert!(
            live.range(..start)
                .next_back()
                .is_none_or(|(s, (l, _))| s + l <= start)
                && live
                    .range(start..)
                    .next()
                    .is_none_or(|(s, _)| start + b.len <= *s),
            "block {i} placed over a live block"
        );
        live.insert(start, (b.len, pf.or(Some(tick))));
        at[i] = start;
        let need = (start + b.len).div_ceil(PAGE) * PAGE;
        if need > mapped {
            if i >= half {
                grows.push((i + 1, (need - mapped) / PAGE));
            }
            mapped = need;
        }
        live_bytes += b.size;
        running = running.max(live_bytes);
        let budget = Budget::default();
        let limit = ((running as f64 * (1.0 + budget.ratio)) as u64 + budget.slack) / PAGE;
        let over = (mapped / PAGE) as i64 - limit as i64;
        over_budget.0 = over_budget.0.max(over);
        if over > 0 && i >= half {
            over_budget.1 += 1;
        }
    }
    Arena {
        pages: mapped / PAGE,
        grows,
        over_budget,
    }
}

/// The start of the best-fitting gap, by (length, address).
fn best_fit(gaps: &[Gap]) -> Option<u64> {
    gaps.iter().min_by_key(|g| (g.1, g.0)).map(|g| g.0)
}

/// Where [`Place::Near`] puts a block of `len` predicted to free at `pf` (best fit without).
fn near(gaps: &[Gap], len: u64, pf: Option<usize>) -> Option<u64> {
    let Some(p) = pf else {
        return best_fit(gaps);
    };
    let dist = |g: &Gap| {
        [g.2, g.3]
            .into_iter()
            .flatten()
            .map(|x| x.abs_diff(p))
            .min()
            .unwrap_or(usize::MAX)
    };
    let g = gaps.iter().min_by_key(|g| (dist(g), g.1, g.0))?;
    Some(match (g.2, g.3) {
        (Some(lo), Some(hi)) if hi.abs_diff(p) < lo.abs_diff(p) => g.0 + g.1 - len,
        _ => g.0,
    })
}

/// The `--ends=T,...` argument's thresholds (ticks), or what is wrong with it.
fn parse_ends(a: &str) -> Result<Vec<usize>, String> {
    let list = a.strip_prefix("--ends=").unwrap_or(a);
    let ends: Result<Vec<usize>, String> = list
        .split(',')
        .map(|t| {
            t.parse::<usize>()
                .map_err(|_| format!("`{t}` in `{a}` is not a whole number of ticks"))
        })
        .collect();
    ends
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut ends = vec![12];
    if let Some(a) = args.first().filter(|a| a.starts_with("--ends=")) {
        match parse_ends(a) {
            Ok(e) => ends = e,
            Err(e) => {
                eprintln!("pool_plan: {e}; expected --ends=T[,T...] (e.g. --ends=9,12,15)");
                std::process::exit(2);
            }
        }
        args.remove(0);
    }
    let mut places = vec![
        Place::BestFit,
        Place::Near(Lifetimes::Oracle),
        Place::Near(Lifetimes::Context(0)),
        Place::Near(Lifetimes::Context(3)),
    ];
    for &t in &ends {
        places.push(Place::Ends(Lifetimes::Oracle, t));
        places.push(Place::Ends(Lifetimes::Shape, t));
    }
    say!(
        "| trace | peak live MiB | offline plan (bytes) | offline plan (pages) | online policy | peak / peak live | most pages over the default budget (allocations over it, 2nd half) | growths, 2nd half (allocation: pages) |"
    );
    say!("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |");
    for (name, t, live) in common::traces(args) {
        let bs = blocks(&t.events);
        let plan = offline(&bs);
        let lf = live as f64;
        for (n, &place) in places.iter().enumerate() {
            let a = online(&bs, place);
            let mut grows: Vec<String> = a
                .grows
                .iter()
                .take(6)
                .map(|(i, p)| format!("{i}: {p}"))
                .collect();
            if a.grows.len() > 6 {
                grows.push("...".into());
            }
            let (head, pl, pp) = if n == 0 {
                (
                    format!("{:.2}", lf / MIB as f64),
                    format!("{:.3}", plan as f64 / lf),
                    format!("{:.3}", (plan.div_ceil(PAGE) * PAGE) as f64 / lf),
                )
            } else {
                (String::new(), String::new(), String::new())
            };
            say!(
                "| {} | {head} | {pl} | {pp} | {} | {:.3} | {} ({}) | {} ({}) |",
                if n == 0 { name.as_str() } else { "" },
                place.name(),
                (a.pages * PAGE) as f64 / lf,
                a.over_budget.0,
                a.over_budget.1,
                a.grows.len(),
                grows.join(", ")
            );
        }
    }
}
