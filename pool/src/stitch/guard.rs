//! The shape guard (`Stitch::with_shape_guard`): a large block keeps out of the places
//! where much larger blocks went last, while other windows take it at no driver call.
//!
//! A shape-varying stream (a serving model's layers at one sequence length) alternates a
//! few much larger blocks (attention scores) with many smaller ones in every layer. The
//! larger ones die first and their places are free while the smaller ones of the next
//! layer are placed; a smaller one put there leaves the next larger block no window, and it
//! is stitched over pages of many handles (a map each). The guard is only a preference:
//! among the windows the arena and the carve consider, one touching none of those places
//! comes first; where every window touches one, placement is as without it. Near the
//! device's limit (the arena's runs' `roomy` test) the guard stands aside: there every
//! window counts for the smallest device.

use super::*;

/// Places remembered per larger size that the guard keeps clear: the latest (two cut
/// bert_serve's stream-ordered second half less, 27.1 against 22.6 per 1000 allocations).
const GUARDED: usize = 1;
/// A size is guarded against blocks of at most 1 / RATIO of it.
const RATIO: u64 = 2;
/// Sizes of at least this many pages are guarded (guarding t5_train's 15.62 MiB blocks, under
/// 8 pages, cost its second pass 2 more driver calls with handles per request).
const MIN_PAGES: u64 = 8;

impl Stitch {
    /// With the guard on, the shape guard: a large block keeps out of the places where much
    /// larger blocks went last where it can (see `guard`). Off by default.
    pub fn with_shape_guard(mut self, on: bool) -> Self {
        self.guard_on = on;
        self
    }

    /// Allocations for which the shape guard named places to keep clear.
    pub fn guard_looks(&self) -> u64 {
        self.guard_looks
    }

    /// The byte ranges `(page, start, end)` of the latest places of sizes at least `RATIO`
    /// times `size` (none with the guard off or standing aside, or for a small block).
    pub(super) fn guarded(&self, size: u64) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        if !self.guard_now || self.class_of(size) != LARGE {
            return out;
        }
        for (&s, places) in &self.ghosts {
            if s < size.saturating_mul(RATIO) || s < MIN_PAGES * self.gran {
                continue;
            }
            for &(m, va, off) in places.iter().rev().take(GUARDED) {
                let Some(Some(mp)) = self.maps.get(m as usize) else {
                    continue;
                };
                if mp.va != va || off + s > mp.pages.len() as u64 * self.gran {
                    continue;
                }
                out.extend(self.pieces(&mp.pages, off, s));
            }
        }
        out
    }

    /// `[off, off + size)` of mapping `m` touches a byte of `guard`.
    pub(super) fn touches_guard(
        &self,
        guard: &[(u32, u64, u64)],
        m: u32,
        off: u64,
        size: u64,
    ) -> bool {
        if guard.is_empty() {
            return false;
        }
        self.pieces(&self.map(m).pages, off, size)
            .iter()
            .any(|&(p, s, e)| guard.iter().any(|&(q, gs, ge)| p == q && s < ge && gs < e))
    }
}
