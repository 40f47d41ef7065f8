//! The arena of the tight pool: one mapping that grows at its end (an address range reserved
//! well beyond what is mapped, pages mapped in order as the pool grows, like PyTorch's
//! expandable segments), from which large blocks are carved by address.
//!
//! Why: under a budget, blocks of a new shape must come out of the pages the pool holds. A
//! pool whose mappings are each as long as the block they were made for can only serve a
//! new shape by stitching a new mapping (one map per page, set access), which is
//! what a shape-varying stream or a repeated workload whose layout drifts pays over and over.
//! In the arena every free window of the mapped range is usable by any size, so a new shape
//! costs no driver call while a window fits (after dissolving cached blocks in the way), and
//! the pool grows only at the arena's end, by the shortfall. Placement is best fit by
//! address, so a repeated workload lands where it landed before. The stitching of the rest
//! of the pool stays the fallback when the budget forbids growth (free pages anywhere become
//! one new mapping).

use super::*;

/// Pages the first arena reservation holds (grows by doubling: the pages are mapped again in
/// a reservation twice as long, the old one kept while blocks use it).
const ARENA_MIN_PAGES: u64 = 1 << 10;

impl Stitch {
    /// The best window of `size` bytes in the arena: `(offset, cached blocks to dissolve)`.
    /// Windows are the gaps between blocks that stay (live and pending, and cached ones
    /// unless `victims_ok`); of the candidates it takes the one whose cached blocks hold the
    /// fewest bytes, then the tightest gap, then the lowest address.
    pub(super) fn arena_window(&self, size: u64, victims_ok: bool) -> Option<(u64, Vec<u64>)> {
        let m = self.arena?;
        let g = self.gran;
        let mp = self.map(m);
        let blocked = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| !victims_ok || b.state != BState::Cached)
        };
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        let mut prev_end = 0u64;
        for (i, &p) in mp.pages.iter().enumerate() {
            let base = i as u64 * g;
            let pg = self.page(p);
            if pg.used == 0 {
                continue;
            }
            for (&s, &(e, a)) in &pg.occ {
                if !blocked(a) {
                    continue;
                }
                if base + s >= prev_end + size {
                    gaps.push((prev_end, base + s));
                }
                prev_end = prev_end.max(base + e);
            }
            // bytes of this page used by blocks outside the arena's view are taken too
            if pg.occ.is_empty() {
                prev_end = prev_end.max(base + g);
            }
        }
        let end = mp.pages.len() as u64 * g;
        if end >= prev_end + size {
            gaps.push((prev_end, end));
        }
        if let Some(long) = self.ends_class {
            return self.ends_window(m, &gaps, end, size, long, victims_ok);
        }
        // with the shape guard on, windows clear of much larger blocks' places come first
        // (see `guard`), their gaps looked at from both ends
        let guard = self.guarded(size);
        // (touches the guard, victim bytes, gap length, offset, victims)
        let mut best: Option<(bool, u64, u64, u64, Vec<u64>)> = None;
        for (s, e) in gaps {
            let offs: &[u64] = if victims_ok || !guard.is_empty() {
                &[s, e - size]
            } else {
                &[s]
            };
            for &off in offs {
                let mut off = round_up(off, ALIGN);
                if off + size > e {
                    continue;
                }
                if self.faults.guard_over_live && !guard.is_empty() && off + size == e && e < end {
                    off += ALIGN;
                }
                let (bytes, victims) = if victims_ok {
                    self.victims_in(m, off, size)
                } else {
                    (0, Vec::new())
                };
                let touches = self.touches_guard(&guard, m, off, size);
                if best
                    .as_ref()
                    .is_none_or(|b| (touches, bytes, e - s, off) < (b.0, b.1, b.2, b.3))
                {
                    best = Some((touches, bytes, e - s, off, victims));
                }
            }
        }
        best.map(|(_, _, _, off, v)| (off, v))
    }

    /// [`Stitch::set_ends_class`]'s window among `gaps` (`end`: the arena's mapped end): the
    /// fewest cached bytes in the way, then the lowest window for a long-lived block (at its
    /// bottom), the highest for a short-lived one (at its top).
    fn ends_window(
        &self,
        m: u32,
        gaps: &[(u64, u64)],
        end: u64,
        size: u64,
        long: bool,
        victims_ok: bool,
    ) -> Option<(u64, Vec<u64>)> {
        // (victim bytes, offset or its reverse, offset, victims)
        let mut best: Option<(u64, u64, u64, Vec<u64>)> = None;
        for &(s, e) in gaps {
            // the fault moves a block up only into a live or pending block (a window below
            // the mapped end, no cached block to dissolve)
            let over = !long && self.faults.ends_over_live && e < end && !victims_ok;
            let off = if long {
                round_up(s, ALIGN)
            } else {
                (e - size) / ALIGN * ALIGN + if over { ALIGN } else { 0 }
            };
            if off < s || (off + size > e && !over) {
                continue;
            }
            let (bytes, victims) = if victims_ok {
                self.victims_in(m, off, size)
            } else {
                (0, Vec::new())
            };
            let key = if long { off } else { u64::MAX - off };
            if best.as_ref().is_none_or(|b| (bytes, key) < (b.0, b.1)) {
                best = Some((bytes, key, off, victims));
            }
        }
        best.map(|(_, _, off, v)| (off, v))
    }

    /// Cached blocks overlapping `[off, off + size)` of mapping `m`, and their bytes.
    fn victims_in(&self, m: u32, off: u64, size: u64) -> (u64, Vec<u64>) {
        let mut victims = Vec::new();
        let mut bytes = 0;
        for (p, s, e) in self.pieces(&self.map(m).pages, off, size) {
            for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                if oe > s && !victims.contains(&a) {
                    victims.push(a);
                    bytes += self.blocks.get(a).map_or(0, |b| b.size);
                }
            }
        }
        (bytes, victims)
    }

    /// Grow the arena at its end so that `size` bytes fit after its last block: pages the
    /// pool holds outside the arena first (free ones, mapped again here), then new pages
    /// while `limit` (bytes the pool may hold) allows. Returns the block's offset, or `None`
    /// (nothing changed) when the budget or the device refuses.
    pub(super) fn arena_grow(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        limit: u64,
    ) -> Result<Option<u64>, PoolError> {
        let g = self.gran;
        let (len, tail_start) = match self.arena {
            Some(m) => {
                let mp = self.map(m);
                let n = mp.pages.len();
                // the arena's free suffix: after the last used byte of its last used page
                let mut start = n as u64 * g;
                for i in (0..n).rev() {
                    let sf = self.free_suffix(mp.pages[i]);
                    start = i as u64 * g + (g - sf);
                    if sf < g {
                        break;
                    }
                }
                (n as u64, round_up(start, ALIGN))
            }
            None => (0, 0),
        };
        let want = (tail_start + size).div_ceil(g).saturating_sub(len);
        if want == 0 {
            return Ok(Some(tail_start));
        }
        let in_arena = |s: &Self, p: u32| s.arena.is_some_and(|m| s.page(p).maps.contains(&m));
        let idle = |s: &Self, p: u32| !in_arena(s, p) && !s.has_active_fence(p);
        // handles sized per request: free handles of several pages are taken whole (one map
        // each, in order) where they fit the shortfall, before pages of a handle of their own
        let mut spare: Vec<u32> = Vec::new();
        if self.shapes != Shapes::Pages {
            for run in self.free_runs() {
                if spare.len() + run.len() <= want as usize && run.iter().all(|&p| idle(self, p)) {
                    spare.extend_from_slice(&run);
                }
            }
        }
        let singles: Vec<u32> = self
            .free_pages
            .iter()
            .copied()
            .filter(|&p| idle(self, p))
            .take(want as usize - spare.len())
            .collect();
        spare.extend(singles);
        let create = want - spare.len() as u64;
        if (self.npages + create) * g > limit {
            return Ok(None);
        }
        let mut pages = spare;
        let mut created = Vec::new();
        // The shortfall as one run (one create and one map), while the device has room: a
        // page of a run is stitched elsewhere only with its whole run (see `pages`), which
        // a pool near the device's limit cannot afford, so there it grows a handle per page
        // (as with the fault switch).
        let split = if self.shapes != Shapes::Pages {
            self.handle_split(dev, create)
        } else if !self.grow_runs || self.faults.page_handles || !self.roomy(dev, create) {
            vec![1; create as usize]
        } else {
            vec![create]
        };
        for k in split.into_iter().filter(|&k| k > 0) {
            match self.grow_run(dev, k) {
                Ok(run) => {
                    pages.extend_from_slice(&run);
                    created.extend(run);
                }
                Err(e) => {
                    self.release_unused(dev, &created);
                    if e.is_oom() {
                        return Ok(None);
                    }
                    return Err(PoolError::Device(e));
                }
            }
        }
        if let Err(e) = self.extend_arena(dev, pages) {
            self.release_unused(dev, &created);
            return Err(e);
        }
        Ok(Some(tail_start))
    }

    /// Map `pages` at the arena's end (a new, twice as long reservation when the current one
    /// is full, with the arena's pages mapped again in order).
    fn extend_arena(&mut self, dev: &mut dyn Device, pages: Vec<u32>) -> Result<(), PoolError> {
        let g = self.gran;
        let (old, len, room) = match self.arena {
            Some(m) => {
                let mp = self.map(m);
                (Some(m), mp.pages.len() as u64, mp.reserved / g)
            }
            None => (None, 0, 0),
        };
        let k = pages.len() as u64;
        if let Some(m) = old
            && len + k <= room
        {
            let va = self.map(m).va;
            if let Err((e, done)) = self.map_pages(dev, va + len * g, &pages) {
                if done > 0 {
                    let _ = dev.unmap(va + len * g, done);
                }
                return Err(PoolError::Device(e));
            }
            if let Err(e) = dev.set_access(va + len * g, k * g) {
                let _ = dev.unmap(va + len * g, k * g);
                return Err(PoolError::Device(e));
            }
            let n = len as usize;
            if let Some(l) = self.maps_by_len.get_mut(&n) {
                l.retain(|&x| x != m);
            }
            for &p in &pages {
                self.page_mut(p).maps.push(m);
            }
            self.map_mut(m).pages.extend(pages);
            self.maps_by_len.entry(n + k as usize).or_default().push(m);
            return Ok(());
        }
        // a new reservation: the old arena's pages again, then the new ones
        let mut all: Vec<u32> = old.map(|m| self.map(m).pages.clone()).unwrap_or_default();
        all.extend(pages);
        let cap = (2 * all.len() as u64).max(ARENA_MIN_PAGES);
        let m = self.new_mapping_in(dev, all, cap * g)?;
        self.arena = Some(m);
        Ok(())
    }
}
