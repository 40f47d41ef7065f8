//! A caller that keeps freed blocks aside and serves some allocations from them itself (the
//! interposer's per-thread caches, see `round_end_watch` in `quiet`): its hits counted into
//! the pool's per-size ranks.
//!
//! Why: a tight pool replays a round by rank (the k-th allocation of a size takes the k-th's
//! place of the round before, see `rounds`), and counts its own cache hits into the ranks. A
//! hit the caller serves from what it keeps is, to the pool, an allocation it never saw: its
//! k-th allocation of that size is then the model's (k + hits)-th, and takes another rank's
//! place, which a block of the round may still hold (then it is stitched anew: driver calls in
//! a repeated round). With the arena grown by runs (`Stitch::with_runs`) a repeated t5 behind
//! such a caller made calls in its later passes for this reason. So the caller asks first
//! whether the pool would serve that rank from its own cache at all ([`Stitch::aside_may_serve`]:
//! not when the rank is one the pool replays, which its own fast path leaves to the slow path
//! too), and tells the pool of every hit it served ([`Stitch::note_aside_hit`]), which counts
//! it as its own fast path counts a hit.

use super::*;

impl Stitch {
    /// Whether a caller keeping freed blocks aside may serve a request of `req` bytes from
    /// them: not when the pool's next allocation of that size is a rank whose place it
    /// replays (it leaves such a rank to its slow path, which takes the place the round
    /// before gave it). A caller that serves it must call [`Stitch::note_aside_hit`].
    #[inline]
    pub fn aside_may_serve(&self, req: u64) -> bool {
        let size = round_up(req.max(1), ALIGN);
        match self.sizes.find(size) {
            Some(l) => {
                let sl = self.sizes.at(l);
                sl.allocs != sl.replay_next
            }
            None => true,
        }
    }

    /// A caller served a request of `req` bytes from a block it kept aside (live to the pool
    /// throughout): counted as the pool's fast path counts a cache hit (the size's rank, the
    /// allocations and hits the budget's window and the round's end look at).
    #[inline]
    pub fn note_aside_hit(&mut self, req: u64) {
        let size = round_up(req.max(1), ALIGN);
        if let Some(l) = self.sizes.find(size) {
            let sl = self.sizes.at_mut(l);
            sl.allocs = sl.allocs.wrapping_add(1);
        }
        self.stats.allocs += 1;
        self.stats.cache_hits += 1;
    }
}
