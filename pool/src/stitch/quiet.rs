//! A tight pool forgets its layout when nothing is live.
//!
//! Why: a repeated workload (training steps, serving rounds) ends each round with nothing
//! live. A pool that keeps its cached blocks and their places into the next round hands
//! them out by size, not by lifetime, so each round's layout drifts from the first one's:
//! free bytes end up scattered over partly used pages, and a large block that fitted in the
//! first round no longer fits in the pages held, so the pool grows past its budget and its
//! peak creeps up pass after pass (`examples/pool_creep.rs`). When nothing is live, every cached block is dissolved and the earlier
//! places are forgotten; the pages and mappings stay (no driver call), so the next round is
//! laid out afresh, as compactly as the first, in memory the pool already holds: the places
//! of the round that ended, taken in the order of that round (see `rounds`), not by size.
//!
//! A round none of whose allocations was placed afresh (each hit the cache or took its
//! rank's place of the round before) has the previous round's layout: it ends (its places
//! become the ones the next round replays) without dissolving its cached blocks, which the
//! next round then takes again at their places.
//!
//! Blocks freed with `cudaFree` and still waiting for a synchronization are released by one
//! synchronization first (nothing is live: every byte of the pool is free once it is made);
//! never during capture. It is done at most once per `MIN_ALLOCS` allocations and only
//! when some allocation since the last time missed the cache, so a loop that allocates and
//! frees one block keeps its cache.

use super::*;

/// Allocations between two forgettings of the layout, at least.
const MIN_ALLOCS: u64 = 256;

impl Stitch {
    /// Called by an allocation that finds nothing live, under a budget.
    #[cold]
    #[inline(never)]
    pub(super) fn forget_layout(&mut self, dev: &mut dyn Device) {
        if !self.layout_due() {
            return;
        }
        let (allocs, hits) = (self.stats.allocs, self.stats.cache_hits);
        if !self.pending.is_empty() && self.flushed_epoch != self.epoch {
            self.flush_pending();
        }
        if !self.pending.is_empty() && (dev.is_capturing() || self.do_sync(dev).is_err()) {
            return;
        }
        // A round that took only places the round before had (cache hits, and new blocks at
        // their rank's place of that round) has not drifted: its cached blocks stay where the
        // next round takes them again (the replay takes the cached block of a rank's very
        // place as a hit). Dissolved, each of them would be placed anew in the next round,
        // which then is due to end too: a rotation of sizes with nothing live between pairs
        // would dissolve and re-place every size every `MIN_ALLOCS` allocations.
        let (a0, h0) = self.layout_mark;
        let fresh = (allocs - a0)
            .saturating_sub(hits - h0)
            .saturating_sub(self.rounds.anew_since_end());
        if fresh > 0 {
            while self.dissolve_some(dev, u64::MAX) {}
            self.ghosts.clear();
            self.forget_kept();
        }
        self.end_round();
        self.layers.clear();
        self.layout_mark = (allocs, hits);
    }

    /// For a caller that keeps some freed blocks aside before giving them back (the
    /// interposer's per-thread caches of stream-ordered frees, which stay live to the pool
    /// while kept) and serves some allocations from them itself: the live bytes at which
    /// the caller must give back what it keeps, `u64::MAX` when it need not. When the blocks
    /// kept aside reach it, everything live is kept aside: given back, the next allocation
    /// finds nothing live and ends the round as it would have without them. 0 while the
    /// pool holds more than its budget and the pages it was lately forced to take past it
    /// (a free then dissolves the cache at once); within those pages a free changes nothing
    /// (they are kept, and so is the cache: see `budget::release_keep`). Asked with
    /// the rule an allocation that finds nothing live follows (`layout_due`), so a
    /// caller that gives back what it keeps at this point, and before the pool serves
    /// anything, lets the pool end its rounds where it would without the caller.
    #[inline]
    pub fn round_end_watch(&self) -> u64 {
        if self.budget.is_none() || self.gran == 0 {
            return u64::MAX;
        }
        // above its budget the pool enforces it at each free: nothing may be kept aside
        // (but for the pages it keeps, where enforcing it gives nothing back)
        let keep = if self.faults.dissolve_when_stuck {
            self.limit_now
        } else {
            self.release_keep()
        };
        if self.stats.reserved > keep && !self.faults.watch_never_zero {
            return 0;
        }
        if self.layout_due() {
            self.stats.live
        } else {
            u64::MAX
        }
    }

    /// Whether an allocation that finds nothing live forgets the layout (under a budget,
    /// at most once per `MIN_ALLOCS` allocations, and only when some allocation since the
    /// last time missed the cache).
    #[inline]
    pub(super) fn layout_due(&self) -> bool {
        if self.budget.is_none() || self.faults.keep_layout || self.gran == 0 {
            return false;
        }
        let (allocs, hits) = (self.stats.allocs, self.stats.cache_hits);
        let (a0, h0) = self.layout_mark;
        allocs >= a0 + MIN_ALLOCS && allocs - a0 != hits - h0
    }
}
