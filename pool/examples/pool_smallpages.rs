//! The pages that a trace's small blocks (at most half a page, the stitch pool's small class)
//! need by themselves, under five placement rules and both free semantics: a model of the
//! small-block pages alone, not the pool (no large blocks, no budget, no thread caches, no
//! round replay), to tell what the placement rule costs from what the rest of the pool adds.
//!
//! Pages of 2 MiB, blocks rounded to 512 B, a page never given back. Rules:
//! - `ranges`: no cache; a request takes the best-fit free range (freed bytes merge with
//!   their free neighbours at once), else a new page: PyTorch's small pool without its
//!   release of empty segments.
//! - `cache`: an exact-size cache (a request takes the cached block of its size freed last);
//!   a miss takes the best-fit free range, else the best-fit gap between live and pending
//!   blocks (dissolving the cached blocks in it), else a new page: the stitch pool's order.
//! - `cache-gaps`: the same cache; a miss takes the best-fit gap between live and pending
//!   blocks at once, cached bytes counted free (a miss places as if nothing were cached).
//! - `gap-then-range`: the gap `cache-gaps` takes, and in it the best-fit free range where
//!   one fits (no cached block dissolved), else its start, dissolving: the cache-less choice
//!   of gap with the fewest cached blocks lost.
//! - `range-in-gap`: the best-fit free range in the tightest gap between live and pending
//!   blocks that holds one, else as `cache-gaps`: `cache`'s free range, chosen by its gap.
//!
//! Frees: stream-ordered (a freed block is cached, or free, at once), or `cudaFree` (it waits
//! until a synchronization: made on a miss when a block of the request's size waits and at
//! least 8 wait, or when 4 MiB or more wait, and before a new page when one of its size waits,
//! as the pool's batching does). Printed per trace: the peak of small live bytes in whole
//! pages (a bound no rule beats) and the pages each rule needs.
//!
//! `cargo run --release -p vramshim-pool --example pool_smallpages -- [DIR_OR_FILES...]`
//! (default: tests/workloads/traces).

#[macro_use]
mod common;

use std::collections::{BTreeMap, HashMap};
use vramshim_pool::replay::{Event, Frees};
use vramshim_pool::{ALIGN, MIB};

const PAGE: u64 = 2 * MIB;
/// Blocks that wait for a synchronization, of which one of the request's size makes a miss
/// synchronize (the pool's `SYNC_BATCH`).
const SYNC_BATCH: usize = 8;
/// Waiting bytes that make a miss synchronize (the pool's floor of two pages).
const SYNC_BYTES: u64 = 2 * PAGE;

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Pending,
    Cached,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Rule {
    Ranges,
    Cache,
    CacheGaps,
    GapThenRange,
    RangeInGap,
}

struct Model {
    rule: Rule,
    sync_frees: bool,
    /// per page: start -> (end, state)
    pages: Vec<BTreeMap<u64, (u64, State)>>,
    /// per size: cached blocks (page, start), freed last at the end
    cache: HashMap<u64, Vec<(usize, u64)>>,
    pending: Vec<(usize, u64, u64)>,
    syncs: u64,
}

impl Model {
    fn new(rule: Rule, sync_frees: bool) -> Self {
        Model {
            rule,
            sync_frees,
            pages: Vec::new(),
            cache: HashMap::new(),
            pending: Vec::new(),
            syncs: 0,
        }
    }

    /// Best-fit gap (by length, then page and start) of at least `size` bytes between the
    /// blocks whose state `pins` says pin their bytes: (page, start).
    fn best(&self, size: u64, pins: impl Fn(State) -> bool) -> Option<(usize, u64)> {
        let mut best: Option<(u64, usize, u64)> = None;
        for (p, occ) in self.pages.iter().enumerate() {
            let mut prev = 0;
            let mut gap = |s: u64, e: u64| {
                if e >= s + size && best.is_none_or(|b| (e - s, p, s) < b) {
                    best = Some((e - s, p, s));
                }
            };
            for (&s, &(e, st)) in occ {
                if pins(st) {
                    gap(prev, s);
                    prev = prev.max(e);
                }
            }
            gap(prev, PAGE);
        }
        best.map(|b| (b.1, b.2))
    }

    /// Gaps between pinned blocks of at least `size` bytes, tightest first: (len, page, start, end).
    fn gaps(&self, size: u64) -> Vec<(u64, usize, u64, u64)> {
        let mut out = Vec::new();
        for (p, occ) in self.pages.iter().enumerate() {
            let mut prev = 0;
            let mut gap = |s: u64, e: u64| {
                if e >= s + size {
                    out.push((e - s, p, s, e));
                }
            };
            for (&s, &(e, st)) in occ {
                if st != State::Cached {
                    gap(prev, s);
                    prev = prev.max(e);
                }
            }
            gap(prev, PAGE);
        }
        out.sort();
        out
    }

    /// Best-fit free range of at least `size` bytes inside [lo, hi) of page `p`.
    fn range_in(&self, p: usize, lo: u64, hi: u64, size: u64) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        let mut prev = lo;
        for (&s, &(e, _)) in self.pages[p].range(lo..hi) {
            if s >= prev + size && best.is_none_or(|b| s - prev < b.0) {
                best = Some((s - prev, prev));
            }
            prev = prev.max(e);
        }
        if hi >= prev + size && best.is_none_or(|b| hi - prev < b.0) {
            best = Some((hi - prev, prev));
        }
        best
    }

    fn take_cached(&mut self, size: u64) -> Option<(usize, u64)> {
        let (p, s) = self.cache.get_mut(&size)?.pop()?;
        self.pages[p].insert(s, (s + size, State::Live));
        Some((p, s))
    }

    fn sync(&mut self) {
        self.syncs += 1;
        for (p, s, size) in std::mem::take(&mut self.pending) {
            self.release(p, s, size);
        }
    }

    /// A freed block's bytes: cached, or free at once without a cache.
    fn release(&mut self, p: usize, s: u64, size: u64) {
        if self.rule == Rule::Ranges {
            self.pages[p].remove(&s);
        } else {
            self.pages[p].insert(s, (s + size, State::Cached));
            self.cache.entry(size).or_default().push((p, s));
        }
    }

    fn alloc(&mut self, size: u64) -> (usize, u64) {
        if let Some(x) = self.take_cached(size) {
            return x;
        }
        let twin = |m: &Model| m.pending.iter().any(|b| b.2 == size);
        if self.sync_frees && !self.pending.is_empty() {
            let bytes: u64 = self.pending.iter().map(|b| b.2).sum();
            if (twin(self) && self.pending.len() >= SYNC_BATCH) || bytes >= SYNC_BYTES {
                self.sync();
                if let Some(x) = self.take_cached(size) {
                    return x;
                }
            }
        }
        let pinned = |st: State| st != State::Cached;
        let mut at = match self.rule {
            Rule::Ranges => self.best(size, |_| true),
            Rule::Cache => self
                .best(size, |_| true)
                .or_else(|| self.best(size, pinned)),
            Rule::CacheGaps => self.best(size, pinned),
            // the tightest gap between pinned blocks, as cache-gaps chooses it; inside it a free
            // range when one fits, else dissolving
            Rule::GapThenRange => self
                .gaps(size)
                .first()
                .map(|&(_, p, s, e)| self.range_in(p, s, e, size).map_or((p, s), |r| (p, r.1))),
            // the tightest gap that holds a free range of the size, else the tightest gap
            Rule::RangeInGap => {
                let gaps = self.gaps(size);
                gaps.iter()
                    .find_map(|&(_, p, s, e)| self.range_in(p, s, e, size).map(|r| (p, r.1)))
                    .or_else(|| gaps.first().map(|&(_, p, s, _)| (p, s)))
            }
        };
        if at.is_none() && self.sync_frees && twin(self) {
            self.sync();
            if let Some(x) = self.take_cached(size) {
                return x;
            }
            at = self.best(size, pinned);
        }
        let (p, s) = at.unwrap_or_else(|| {
            self.pages.push(BTreeMap::new());
            (self.pages.len() - 1, 0)
        });
        // the cached blocks in the way are dissolved
        let victims: Vec<(u64, u64)> = self.pages[p]
            .range(..s + size)
            .filter(|(_, (e, st))| *e > s && *st == State::Cached)
            .map(|(&b, &(e, _))| (b, e))
            .collect();
        for (b, e) in victims {
            self.pages[p].remove(&b);
            if let Some(l) = self.cache.get_mut(&(e - b)) {
                l.retain(|&x| x != (p, b));
            }
        }
        self.pages[p].insert(s, (s + size, State::Live));
        (p, s)
    }

    fn free(&mut self, p: usize, s: u64, size: u64) {
        if self.sync_frees {
            self.pages[p].insert(s, (s + size, State::Pending));
            self.pending.push((p, s, size));
        } else {
            self.release(p, s, size);
        }
    }
}

fn main() {
    let traces = common::traces(std::env::args().skip(1).collect());
    say!(
        "| trace | frees | small peak live (pages) | ranges | cache | cache-gaps | gap-then-range | range-in-gap | syncs (cache / cache-gaps) |"
    );
    say!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (name, t, _) in traces {
        for frees in Frees::BOTH {
            let events = frees.apply(&t.events);
            let sync_frees = frees == Frees::CudaFree;
            let mut pages = Vec::new();
            let mut syncs = Vec::new();
            let mut peak = 0u64;
            for rule in [
                Rule::Ranges,
                Rule::Cache,
                Rule::CacheGaps,
                Rule::GapThenRange,
                Rule::RangeInGap,
            ] {
                let mut m = Model::new(rule, sync_frees);
                let mut ids: HashMap<u64, (usize, u64, u64)> = HashMap::new();
                let (mut live, mut top) = (0u64, 0u64);
                for e in &events {
                    match *e {
                        Event::Alloc { id, size, .. } if size <= PAGE / 2 => {
                            let r = size.max(1).div_ceil(ALIGN) * ALIGN;
                            let (p, s) = m.alloc(r);
                            if let Some((op, os, or)) = ids.insert(id, (p, s, r)) {
                                m.free(op, os, or);
                                live -= or;
                            }
                            live += r;
                            top = top.max(live);
                        }
                        Event::Free { id, .. } => {
                            if let Some((p, s, r)) = ids.remove(&id) {
                                m.free(p, s, r);
                                live -= r;
                            }
                        }
                        _ => {}
                    }
                }
                peak = top;
                pages.push(m.pages.len());
                syncs.push(m.syncs);
            }
            say!(
                "| {name} | {} | {:.2} MiB ({}) | {} | {} | {} | {} | {} | {} / {} |",
                frees.name(),
                peak as f64 / MIB as f64,
                peak.div_ceil(PAGE),
                pages[0],
                pages[1],
                pages[2],
                pages[3],
                pages[4],
                syncs[1],
                syncs[2]
            );
        }
    }
}
