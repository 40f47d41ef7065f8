//! A caller that keeps freed blocks aside and serves some allocations from them itself (the
//! interposer's per-thread caches, see `round_end_watch` in `quiet`): its hits counted toward
//! the budget's windows, so that they end.
//!
//! Why: the budget follows the peak of live bytes over the current and the previous window of
//! allocations (`budget`), and a window ends at a free once a window's allocations were made.
//! A hit the caller serves is an allocation the pool never sees: a program whose use shrank
//! to a loop the caller serves whole (one size freed and asked again on its stream) would
//! never end a window, so its budget would stay at the old peak and the pages of that peak
//! would never go back (a peak, then a long loop of small pairs on one stream: the pages of
//! the peak stay held for as long as the loop runs). So the caller counts its hits and tells
//! the pool ([`Stitch::note_aside_hits`]) whenever it gives back what it keeps, and after so
//! many hits at the latest (the interposer's caches: 4096 each); a window they complete
//! ends there, as at the pool's next free.
//!
//! The hits count toward the window only: the pool's statistics (allocations, cache hits)
//! and its rounds (a round ends where an allocation finds nothing live, at most once per so
//! many of its own allocations, see `quiet`) stay those of the allocations it serves, as
//! without the count (counted there, a loop the caller serves with a block live would make
//! the round watch due at every free the caller keeps, for nothing).

use super::*;

impl Stitch {
    /// Allocations made in the budget's current window, the caller's hits included.
    #[inline]
    pub(super) fn window_allocs(&self) -> u64 {
        self.stats.allocs.saturating_add(self.aside_hits)
    }

    /// A caller served `n` allocations from blocks it kept aside (live to the pool
    /// throughout): counted toward the budget's window, and a window that they complete ends
    /// now, as it would at the pool's next free (the budget then enforced: above it the cache
    /// is dissolved and idle pages go back).
    pub fn note_aside_hits(&mut self, dev: &mut dyn Device, n: u64) {
        if n == 0 {
            return;
        }
        if self.faults.hits_as_allocs {
            self.stats.allocs = self.stats.allocs.saturating_add(n);
        } else {
            self.aside_hits = self.aside_hits.saturating_add(n);
        }
        if self.budget.is_some() && self.window_allocs() >= self.next_window {
            if self.faults.hits_roll_unkept {
                self.roll_window();
            } else {
                self.enforce_budget(dev);
            }
        }
    }
}
