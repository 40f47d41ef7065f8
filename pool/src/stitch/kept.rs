//! Kept ranges: the place a large block was given stays a unit that smaller requests are
//! carved from, best fit, instead of a window cut anywhere in the pool's bytes.
//!
//! Why: on a shape-varying stream (a server whose requests change the model's activation
//! shapes) every layer allocates a few large blocks of one new shape and many smaller ones
//! of another. A smaller block that the budget leaves no free window for takes cached bytes:
//! cut where the fewest cached bytes are, it lands in one large block's range and another's,
//! so when the next layer asks for the large shape again no range of it is whole and a new
//! one is stitched (a map per page and an access call, in every layer). Carved best fit out of the ranges large blocks were given (the range whose
//! free bytes fit the request most tightly, packed at its low end), the smaller blocks fill
//! one range while the others stay whole, and a range's pieces coalesce back as they are
//! freed (bytes given back to a page merge with their free neighbours), so the large shape
//! finds its range again with no call. As PyTorch's expandable segments carve and coalesce
//! within a segment, and GMLake keeps its stitched blocks for reuse.
//!
//! A range is a remembered window `(mapping, its address, offset, length)`: it holds no byte
//! of its own. Its bytes are the pages', used by whatever blocks lie there now, and the
//! budget and idle release give its pages back as any others (a range whose mapping is gone
//! is forgotten). Only live and pending blocks bound a carve, unless cached blocks are not
//! to be dissolved; `Faults::kept_over_live` ignores live blocks, for the tests that show
//! the checking device catches a carve over one.

use super::*;

/// Ranges remembered, at most (the most recently placed are kept).
const KEPT: usize = 32;
/// Blocks of at least this many pages leave a range.
const KEPT_MIN_PAGES: u64 = 2;

/// A kept range: (mapping, its address, offset, length).
pub(super) type Kept = (u32, u64, u64, u64);

impl Stitch {
    /// A large block of `size` was placed at `off` of mapping `m`: its window becomes a
    /// kept range (the most recent last).
    pub(super) fn note_kept(&mut self, size: u64, m: u32, off: u64) {
        if !self.kept_on || size < KEPT_MIN_PAGES * self.gran {
            return;
        }
        let va = self.map(m).va;
        let k = (m, va, off, size);
        self.kept.retain(|&x| x != k);
        if self.kept.len() >= KEPT {
            self.kept.remove(0);
        }
        self.kept.push(k);
    }

    /// The best kept range to carve `size` bytes from: of the ranges longer than `size`
    /// whose mapping is still there, with a window of `size` bytes that no live or pending
    /// block touches (and no cached one unless `victims_ok`), the one with the fewest such
    /// free bytes (the tightest fit), the most recent on a tie; the window is the lowest
    /// one in it. `(mapping, offset, cached blocks to dissolve)`.
    pub(super) fn kept_carve(&self, size: u64, victims_ok: bool) -> Option<(u32, u64, Vec<u64>)> {
        if !self.kept_on {
            return None;
        }
        let over_live = self.faults.kept_over_live;
        let blocked = |a: u64| {
            self.blocks.get(a).is_some_and(|b| match b.state {
                BState::Cached => !victims_ok,
                BState::Live => !over_live,
                _ => true,
            })
        };
        // (free bytes, recency, mapping, offset)
        let mut best: Option<(u64, usize, u32, u64)> = None;
        for (i, &(m, va, off0, len)) in self.kept.iter().enumerate() {
            if len <= size {
                continue;
            }
            let Some(Some(mp)) = self.maps.get(m as usize) else {
                continue;
            };
            if mp.va != va || off0 + len > mp.pages.len() as u64 * self.gran {
                continue;
            }
            let (free, first) = self.range_free(m, off0, len, size, &blocked);
            let Some(at) = first else {
                continue;
            };
            if !self.window_life_ok(m, at, size) {
                continue;
            }
            if best.is_none_or(|b| (free, usize::MAX - i) < (b.0, usize::MAX - b.1)) {
                best = Some((free, i, m, at));
            }
        }
        let (_, _, m, off) = best?;
        let victims = if victims_ok {
            self.cached_in(m, off, size)
        } else {
            Vec::new()
        };
        Some((m, off, victims))
    }

    /// In `[off0, off0 + len)` of mapping `m`: the bytes no blocked block holds, and the
    /// lowest 512-B aligned offset with `size` such bytes in a row.
    fn range_free(
        &self,
        m: u32,
        off0: u64,
        len: u64,
        size: u64,
        blocked: &dyn Fn(u64) -> bool,
    ) -> (u64, Option<u64>) {
        let g = self.gran;
        let mp = self.map(m);
        let end = off0 + len;
        let mut free = 0u64;
        let mut first = None;
        let mut prev_end = off0;
        let mut gap = |s: u64, e: u64, first: &mut Option<u64>| {
            let s = s.max(off0);
            let e = e.min(end);
            if e > s {
                free += e - s;
                let at = round_up(s, ALIGN);
                if first.is_none() && at + size <= e {
                    *first = Some(at);
                }
            }
        };
        let p0 = off0 / g;
        let p1 = (end - 1) / g;
        for i in p0..=p1 {
            let base = i * g;
            for (&s, &(e, a)) in &self.page(mp.pages[i as usize]).occ {
                if base + e <= off0 || base + s >= end || !blocked(a) {
                    continue;
                }
                gap(prev_end, base + s, &mut first);
                prev_end = prev_end.max(base + e);
            }
        }
        gap(prev_end, end, &mut first);
        (free, first)
    }

    /// Whether `[s, e)` of page `p` is free.
    pub(super) fn bytes_free(&self, p: u32, s: u64, e: u64) -> bool {
        self.page(p)
            .free
            .range(..=s)
            .next_back()
            .is_some_and(|(_, &fe)| e <= fe)
    }

    /// Blocks carved out of kept ranges.
    pub fn kept_carves(&self) -> u64 {
        self.kept_carves
    }

    /// Forget every kept range (the layout is forgotten, see `quiet`).
    pub(super) fn forget_kept(&mut self) {
        self.kept.clear();
    }
}

impl Stitch {
    /// Place a block of `size` on stream `t` in a kept range (see `kept_carve`).
    pub(super) fn kept_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        victims_ok: bool,
    ) -> Result<Option<Slot>, PoolError> {
        let Some((m, off, victims)) = self.kept_carve(size, victims_ok) else {
            return Ok(None);
        };
        let slot = self.commit_over(dev, m, off, victims, size, t)?;
        if slot.is_some() {
            self.kept_carves += 1;
        }
        Ok(slot)
    }
}
