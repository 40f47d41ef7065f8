//! Mappings that grow in place: a request larger than a stitched mapping whose bytes are free
//! or cached is served by mapping only the pages missing at that mapping's end.
//!
//! Why: CUDA maps a handle only whole and every new mapping needs an access call, so a
//! stitched mapping of n single-page handles costs n maps + 1 access, whatever part of it the
//! pool had mapped already. A shape-varying stream (serving: the sequence length grew) asks
//! for a larger block where a smaller shape's mapping lies unused with its bytes free or
//! cached: stitching the larger block afresh pays for every page again. With `grow` on, every
//! stitched mapping's address range is carved out of the pool's chunks (see `vas`) with room
//! after its pages (address space, no device memory), and before the slow path stitches a
//! new mapping for a large request it looks for a stitched mapping whose pages hold no live
//! or pending block but in a prefix of its first page (the block's head starts after it) and
//! whose room fits the rest: the cached
//! blocks there are dissolved, the missing pages (free pages, the last one possibly a page's
//! free prefix) are mapped after its end and made accessible (k maps + 1 access for k
//! missing pages), and the block is placed at the head offset. A mapping only grows (nothing
//! of it is unmapped), so no stream's use of its earlier addresses is disturbed; the bytes
//! taken carry their pages' stream conditions as any placement's (`commit`).
//!
//! Not near the device's limit (`pressure`) or with lifetime classes: there the usual
//! placement decides which pages a block may take.

use super::*;

/// A stitched range's address room: its pages' length times this.
const ROOM: u64 = 4;
/// Fewest pages a mapping grows from (fewer save less than they risk).
const MIN_PAGES: usize = 2;

/// A mapping that can grow in place for a request: (mapping, block offset, pages missing,
/// cached blocks to dissolve, their bytes).
struct Candidate {
    map: u32,
    off: u64,
    missing: u64,
    victims: Vec<u64>,
    victim_bytes: u64,
}

impl Stitch {
    /// The address length carved for a stitched mapping of `len` bytes (room to grow into
    /// with `grow` on).
    pub(super) fn grow_room(&self, len: u64) -> u64 {
        if self.grow_on { len * ROOM } else { len }
    }

    /// Place a large block of `size` bytes by growing a stitched mapping in place (see the
    /// module documentation). `None`: no mapping fits, or too few free pages for the missing
    /// ones (nothing changed), or the grown mapping's bytes need a synchronization that a
    /// capture forbids (the mapping stays grown, its cached blocks dissolved).
    pub(super) fn grow_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
    ) -> Result<Option<(u32, u64)>, PoolError> {
        if !self.grow_on
            || self.class_of(size) != LARGE
            || self.lives
            || self.under_pressure(dev, size)
        {
            return Ok(None);
        }
        let Some(c) = self.grow_candidate(size) else {
            return Ok(None);
        };
        let g = self.gran;
        let n = self.map(c.map).pages.len() as u64;
        let end = c.off + size;
        let tail = end - (end.div_ceil(g) - 1) * g;
        // the missing pages: whole free pages, the last one possibly a free prefix
        let own: Vec<u32> = self.map(c.map).pages.clone();
        let mut add: Vec<u32> = self
            .free_pages
            .iter()
            .copied()
            .filter(|p| !own.contains(p))
            .take(c.missing as usize - 1)
            .collect();
        if add.len() + 1 != c.missing as usize {
            return Ok(None);
        }
        let last = self.prefix[LARGE]
            .range((tail, 0)..)
            .map(|x| x.1)
            .find(|p| !own.contains(p) && self.page(*p).run <= 1)
            .or_else(|| {
                self.free_pages
                    .iter()
                    .copied()
                    .find(|p| !own.contains(p) && !add.contains(p))
            });
        let Some(last) = last else {
            return Ok(None);
        };
        add.push(last);
        for v in c.victims {
            self.dissolve(dev, v);
        }
        self.extend_mapping(dev, c.map, add)?;
        debug_assert!(self.map(c.map).pages.len() as u64 == n + c.missing);
        let placed = self.try_commit(
            dev,
            Plan::Existing {
                map: c.map,
                off: c.off,
            },
            size,
            t,
        )?;
        if placed.is_some() {
            self.grows += 1;
        }
        Ok(placed)
    }

    /// The stitched mapping that grows by the fewest pages for `size` bytes (then the
    /// fewest cached bytes dissolved).
    fn grow_candidate(&self, size: u64) -> Option<Candidate> {
        let g = self.gran;
        // a byte range of a page holds no block that must stay (live or pending; with the
        // fault switch, any block may be "dissolved")
        let stays = |a: u64| {
            !self.faults.grow_over_live
                && self
                    .blocks
                    .get(a)
                    .is_some_and(|b| b.state != BState::Cached)
        };
        let mut best: Option<Candidate> = None;
        for (i, mp) in self.maps.iter().enumerate() {
            let Some(mp) = mp else { continue };
            let m = i as u32;
            let n = mp.pages.len();
            if mp.own_va || self.arena == Some(m) || n < MIN_PAGES {
                continue;
            }
            if mp.pages.iter().any(|&q| self.page(q).run > 1) {
                continue;
            }
            // the block starts after the last block of its first page that stays (a page of
            // large blocks); no other page of the mapping holds a block that stays
            let mut kept_end = None;
            let mut others = false;
            for (i, &q) in mp.pages.iter().enumerate() {
                for &(e, a) in self.page(q).occ.values() {
                    if stays(a) {
                        if i == 0 {
                            kept_end = kept_end.max(Some(e));
                        } else {
                            others = true;
                        }
                    }
                }
            }
            if others || kept_end.is_some() && self.page(mp.pages[0]).class != LARGE {
                continue;
            }
            let off = round_up(kept_end.unwrap_or(0), ALIGN);
            if off >= g {
                continue;
            }
            let need = (off + size).div_ceil(g);
            if need <= n as u64 || need * g > mp.reserved {
                continue;
            }
            let missing = need - n as u64;
            if best.as_ref().is_some_and(|b| b.missing < missing) {
                continue;
            }
            // the cached blocks after the head are dissolved
            let victims = self.cached_in(m, off, n as u64 * g - off);
            let bytes = victims
                .iter()
                .map(|&a| self.blocks.get(a).map_or(0, |b| b.size))
                .sum();
            if best
                .as_ref()
                .is_none_or(|b| (missing, bytes) < (b.missing, b.victim_bytes))
            {
                best = Some(Candidate {
                    map: m,
                    off,
                    missing,
                    victims,
                    victim_bytes: bytes,
                });
            }
        }
        best
    }

    /// Map `pages` after the end of stitched mapping `m` (within its address room) and make
    /// them accessible.
    fn extend_mapping(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        pages: Vec<u32>,
    ) -> Result<(), PoolError> {
        let g = self.gran;
        let (va, n) = {
            let mp = self.map(m);
            (mp.va, mp.pages.len())
        };
        let k = pages.len() as u64;
        let at = va + n as u64 * g;
        if let Err((e, done)) = self.map_pages(dev, at, &pages) {
            if done > 0 {
                let _ = dev.unmap(at, done);
            }
            return Err(PoolError::Device(e));
        }
        if let Err(e) = dev.set_access(at, k * g) {
            let _ = dev.unmap(at, k * g);
            return Err(PoolError::Device(e));
        }
        if let Some(l) = self.maps_by_len.get_mut(&n) {
            l.retain(|&x| x != m);
        }
        for &p in &pages {
            let pg = self.page_mut(p);
            if !pg.maps.contains(&m) {
                pg.maps.push(m);
            }
        }
        self.map_mut(m).pages.extend(pages);
        self.maps_by_len.entry(n + k as usize).or_default().push(m);
        Ok(())
    }
}
