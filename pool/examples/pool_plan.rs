//! How tightly one address range can hold a trace when nothing is ever stitched: per trace,
//! the peak of live bytes, then the extent (peak end of the range over peak live) of
//! - the offline plan: every block's lifetime known, blocks placed greedy by size (largest
//!   first, each at the lowest best-fitting gap among the placed blocks whose lifetimes
//!   overlap it, TFLite / TVM style), in bytes and in whole 2 MiB pages;
//! - online arenas grown at their end, in whole pages, with the growth events (page count
//!   rounded up each time the range's end passes its mapped pages) of the second half of the
//!   allocations, where issue 17's call target is counted: best fit by (length, address), and
//!   "near" placements that put a block in the gap whose neighbouring block frees closest to
//!   the block's free time, at that neighbour's side, the free time read from the trace (an
//!   oracle: a bound for what predicting lifetimes can gain) or predicted online (see
//!   [`Predict`]).
//!
//! The offline plan is not reachable online; it is the smallest single range a planner that
//! knew every lifetime would need, so a pool that never stitches is not bounded by best fit.
//!
//! `cargo run --release -p vramshim-pool --example pool_plan -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

mod common;

use common::plan::{Block, PAGE, blocks, offline};

use std::collections::{BTreeMap, HashMap};
use vramshim_pool::MIB;

/// Where an online arena takes a block's free time from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Predict {
    /// Nothing: best fit by (length, address).
    None,
    /// The trace's own free (an oracle).
    Oracle,
    /// The lifetime (in events) of the last block freed whose size and the sizes of the `k`
    /// allocations before it were the same; best fit when no such block was freed yet (and
    /// such a block, as a neighbour, counts as freed when it was allocated).
    Context(usize),
}

impl Predict {
    fn name(self) -> String {
        match self {
            Predict::None => "best fit".into(),
            Predict::Oracle => "near, oracle".into(),
            Predict::Context(k) => format!("near, last lifetime of size + {k} before"),
        }
    }
}

/// What an online arena did: its peak end in whole pages, and its growth events in the
/// second half of the allocations as (allocation number from 1, pages added).
struct Arena {
    pages: u64,
    grows: Vec<(usize, u64)>,
}

/// Replays `blocks` in event order on one range grown at its end, placing by `predict`.
fn online(blocks: &[Block], predict: Predict) -> Arena {
    // frees and allocations in event order: (event index, block, is_alloc)
    let mut order: Vec<(usize, usize, bool)> = Vec::with_capacity(2 * blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        order.push((b.at, i, true));
        order.push((b.until, i, false));
    }
    order.sort_unstable();
    // live blocks: start -> (len, predicted free event)
    let mut live: BTreeMap<u64, (u64, Option<usize>)> = BTreeMap::new();
    let mut at: Vec<u64> = vec![0; blocks.len()];
    let mut learned: HashMap<Vec<u64>, usize> = HashMap::new();
    let key = |i: usize, k: usize| -> Vec<u64> {
        blocks[i.saturating_sub(k)..=i]
            .iter()
            .map(|b| b.size)
            .collect()
    };
    let half = blocks.len() / 2;
    let mut mapped = 0u64;
    let mut grows = Vec::new();
    for (t, i, alloc) in order {
        let b = blocks[i];
        if !alloc {
            live.remove(&at[i]);
            if let Predict::Context(k) = predict {
                learned.insert(key(i, k), b.until - b.at);
            }
            continue;
        }
        let pf = match predict {
            Predict::None => None,
            Predict::Oracle => Some(b.until),
            Predict::Context(k) => learned.get(&key(i, k)).map(|l| t + l),
        };
        // gaps between live blocks: (start, len, free of the block below, free of the block above)
        let mut pick: Option<(u64, u64, Option<usize>, Option<usize>)> = None;
        let mut score_best = (usize::MAX, u64::MAX);
        let mut prev = 0u64;
        let mut below: Option<usize> = None;
        for (&s, &(l, f)) in &live {
            if s - prev >= b.len {
                let gap = s - prev;
                let score = match pf {
                    None => (0, gap),
                    Some(p) => (
                        [below, f]
                            .into_iter()
                            .flatten()
                            .map(|x| x.abs_diff(p))
                            .min()
                            .unwrap_or(usize::MAX),
                        gap,
                    ),
                };
                if score < score_best {
                    score_best = score;
                    pick = Some((prev, gap, below, f));
                }
            }
            prev = s + l;
            below = f;
        }
        let start = match pick {
            None => prev,
            Some((s, gap, lo, hi)) => match (pf, lo, hi) {
                (Some(p), Some(lo), Some(hi)) if hi.abs_diff(p) < lo.abs_diff(p) => s + gap - b.len,
                _ => s,
            },
        };
        // A block whose free time is not predicted counts, as a neighbour, as freed at once:
        // a guess that keeps blocks of known lifetimes next to each other.
        live.insert(start, (b.len, pf.or(Some(t))));
        at[i] = start;
        let need = (start + b.len).div_ceil(PAGE) * PAGE;
        if need > mapped {
            if i >= half {
                grows.push((i + 1, (need - mapped) / PAGE));
            }
            mapped = need;
        }
    }
    Arena {
        pages: mapped / PAGE,
        grows,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!(
        "| trace | peak live MiB | offline plan (bytes) | offline plan (pages) | online policy | peak / peak live | growths, 2nd half (allocation: pages) |"
    );
    println!("| --- | ---: | ---: | ---: | --- | ---: | --- |");
    for (name, t, live) in common::traces(args) {
        let bs = blocks(&t.events);
        let plan = offline(&bs);
        let lf = live as f64;
        for (n, predict) in [
            Predict::None,
            Predict::Oracle,
            Predict::Context(0),
            Predict::Context(3),
        ]
        .into_iter()
        .enumerate()
        {
            let a = online(&bs, predict);
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
            println!(
                "| {} | {head} | {pl} | {pp} | {} | {:.3} | {} ({}) |",
                if n == 0 { name.as_str() } else { "" },
                predict.name(),
                (a.pages * PAGE) as f64 / lf,
                a.grows.len(),
                grows.join(", ")
            );
        }
    }
}
