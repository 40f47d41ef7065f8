//! Near the device's limit, a block of more than a page goes on page ends: its whole pages
//! from free pages, its remainder from the free ends of partly used pages, so that the pages
//! held come back whole when blocks of that kind die.
//!
//! Why: on a nearly full device what decides whether a large request fits is how many wholly
//! free pages there are (a block's middle pages must be whole pages; the free bytes of partly
//! used pages serve only as one head and one tail). Two choices of the pool cost whole pages
//! there:
//! - A block that takes its twin's place (the exact-size cache, the round replay, a held
//!   mapping, the arena's earlier window) takes the twin's remainder pages too: where the
//!   twin's head and tail were ends of pages other blocks hold, the new block takes the same
//!   `k + 1` pages' worth again although free page ends elsewhere could carry its remainder
//!   with `k` whole pages.
//! - Two such blocks placed one after the other share the page between them (the arena packs
//!   by address), so when the first dies that page stays held by the second and the first's
//!   pages do not all come back whole.
//!
//! t5's peak request (the fourth of four blocks of 7 pages and a part) shows both: placed
//! the usual way it finds one whole page fewer than it needs (`examples/pool_fit.rs` prints
//! that bound). With this rule the first two blocks keep apart, the first one's pages all
//! come back whole, and the last two take their remainders from the free ends the blocks
//! freed just before the peak left (docs/benchmarks.md, "t5 on 1.03 x peak live: page ends
//! near the limit").
//!
//! The rule, for a block of more than a page whose size is not whole pages, while
//! `Stitch::under_pressure` says the device is nearly full: the pool takes no twin's block,
//! round place or held mapping for it; it releases what waits for a synchronization (one sync)
//! and dissolves its cache, then places the block with the fewest whole pages: a free suffix
//! and a free prefix (best fit of their sum) carry a remainder of half a page or more, else
//! fresh pages take the remainder with the largest free end, one of a page no other block of a
//! page or more holds where that costs no fresh page more. While the device is nearly full the
//! fast path declines (`near`), so a twin cached by a stream-ordered free goes the same way.
//! Why half a page and why not whole-page blocks: a remainder smaller than that on page ends
//! leaves holes between two blocks' ends (ViT's blocks of a page and a sliver), and blocks of
//! whole pages have no remainder to place, only a layout to disturb (`examples/pool_small.rs`
//! measures both). On a large device the rule never applies. Safety is that of the paths it takes (a
//! synchronization before pending bytes are reused, dissolving, a new mapping over free bytes);
//! `Faults::ends_unsynced` releases the pending blocks without the synchronization, for the
//! tests that show the checks catch it.
//!
//! Rounds first: a block of the rule whose rank had a place in the previous round (see
//! `rounds`) takes that place when no live block is in it, before the rule's own placement.
//! A repeated workload (the passes of a training loop, the pool kept) that completed its
//! previous round on this device completes this one in the same places; placed by the rule
//! instead, its blocks go around what the previous round left (the pool enters the round
//! holding every page it had at its peak, so the device's room is short from the round's
//! first large block on, not only near the peak as in the first round), and the round's
//! layout parts from the one that fitted: later passes then need a larger device than the
//! first (`examples/pool_passes.rs`; docs/benchmarks.md, "Repeated passes on the device one
//! pass needs"). The layer replay's places (a layer two periods back in the same round) are
//! not taken first: they are not a layout that completed. `Faults::ends_skip_rounds` skips
//! the round's place, for the test that shows the passes' devices depend on it.

use super::*;

/// Free page ends looked at on each side (the largest ones).
const ENDS_SCAN: usize = 16;

impl Stitch {
    /// Whether the allocation of `size` bytes now under way is placed by this rule; keeps
    /// `near` (and so the fast path) up to date where it asks the device. Asked only for a
    /// block of more than a page or while `near` holds (`ends_first` implies `near`, so a
    /// request not asked about is never placed by the rule).
    #[inline(never)]
    pub(super) fn ends_due(&mut self, dev: &dyn Device, size: u64) -> bool {
        let g = self.gran;
        let block =
            self.budget.is_some() && !self.faults.ends_off && size > g && !size.is_multiple_of(g);
        self.ends_first = false;
        if !block && !self.near {
            return false;
        }
        let pressed = self.under_pressure(dev, size);
        // the fast path declines from further off: a stream-ordered twin cached before the
        // device was nearly full is not handed out as it gets there
        let near = pressed
            || (!self.faults.pressure_off
                && dev
                    .room()
                    .is_some_and(|room| room < size.saturating_add(self.stats.reserved)));
        if near != self.near {
            self.near = near;
            self.update_slow_only();
        }
        self.ends_first = block && pressed;
        self.ends_first
    }

    pub(super) fn update_slow_only(&mut self) {
        self.slow_only = self.lives || self.faults_on || self.near;
    }

    /// Place a block of the rule: release the pending blocks, dissolve the cache, then place
    /// with the pages held or grow by the shortfall. `None`: the device refused; the slow path
    /// goes on with its usual placement.
    pub(super) fn ends_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
    ) -> Result<Option<Slot>, PoolError> {
        if !self.pending.is_empty() && !dev.is_capturing() {
            if self.faults.ends_unsynced {
                self.epoch += 1;
                self.flush_pending();
            } else {
                self.do_sync(dev)?;
            }
        }
        while self.dissolve_some(dev, u64::MAX) {}
        let placed = match self.step_place(dev, size, t, false, true)? {
            Some(x) => Some(x),
            None => self.step_grow(dev, size, t)?.ok(),
        };
        Ok(placed.map(|(m, o)| {
            self.ends_places += 1;
            Slot::New(m, o)
        }))
    }

    /// The block's whole pages from free pages and its remainder from a free suffix (head)
    /// and a free prefix (tail) whose sum fits it best, or one suffix alone.
    pub(super) fn ends_plan(
        &self,
        size: u64,
        classes: &[usize],
        take_free: &dyn Fn(u64) -> Option<Vec<u32>>,
    ) -> Option<Plan> {
        let g = self.gran;
        let (k, r) = (size / g, size % g);
        // (sum, head page, head bytes, tail page)
        let mut best: Option<(u64, u32, u64, Option<u32>)> = None;
        for &c in classes {
            for &(hl, h) in self.suffix[c].iter().rev().take(ENDS_SCAN) {
                if !self.life_ok(h) {
                    continue;
                }
                for &c2 in classes {
                    for &(tl, tp) in self.prefix[c2].iter().rev().take(ENDS_SCAN) {
                        if tp == h || !self.life_ok(tp) {
                            continue;
                        }
                        let sum = hl + tl;
                        if sum >= r && best.is_none_or(|b| sum < b.0) {
                            best = Some((sum, h, hl, Some(tp)));
                        }
                    }
                }
                if hl >= r && best.is_none_or(|b| hl < b.0) {
                    best = Some((hl, h, hl, None));
                }
            }
        }
        let (_, h, hl, tail) = best?;
        let mut pages = vec![h];
        pages.extend(take_free(k)?);
        if let Some(tp) = tail
            && hl < r
        {
            pages.push(tp);
        }
        Some(Plan::New {
            pages,
            off: g - hl.min(r),
        })
    }

    /// Of the free ends a block takes its remainder with fresh pages after (`any`: the
    /// largest), the largest of a page that holds no block of a page or more, if it needs no
    /// more fresh pages than `any`: `((bytes, page), is a suffix)`.
    pub(super) fn own_end(
        &self,
        size: u64,
        classes: &[usize],
        any: Option<((u64, u32), bool)>,
    ) -> Option<((u64, u32), bool)> {
        let g = self.gran;
        let largest = |sets: &[BTreeSet<(u64, u32)>; 2]| {
            classes
                .iter()
                .filter_map(|&c| {
                    sets[c]
                        .iter()
                        .rev()
                        .find(|x| self.life_ok(x.1) && !self.holds_big(x.1))
                        .copied()
                })
                .max()
        };
        let own = match (largest(&self.suffix), largest(&self.prefix)) {
            (Some(h), Some(t)) => Some(if h.0 >= t.0 { (h, true) } else { (t, false) }),
            (Some(h), None) => Some((h, true)),
            (None, Some(t)) => Some((t, false)),
            (None, None) => None,
        }?;
        let fresh = |x: ((u64, u32), bool)| size.saturating_sub(x.0.0).div_ceil(g);
        (Some(fresh(own)) == any.map(fresh)).then_some(own)
    }

    /// Page `p` holds bytes of a block of a page or more.
    fn holds_big(&self, p: u32) -> bool {
        let g = self.gran;
        self.page(p)
            .occ
            .values()
            .any(|&(_, a)| self.blocks.get(a).is_some_and(|b| b.size >= g))
    }

    /// Blocks placed on page ends near the device's limit (see the module documentation).
    pub fn ends_places(&self) -> u64 {
        self.ends_places
    }
}
