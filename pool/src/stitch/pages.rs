//! Pages: the byte-range sub-allocator inside each physical page, the free-range indexes
//! the placement searches, and creating and releasing the pages themselves.
//!
//! Handles sized per request (`Stitch::with_shapes`): the pages a large request grows the
//! pool by come as one handle, or as handles of power-of-two pages, instead of one handle
//! per page; they are runs as below, so a later new mapping takes them only whole (one map
//! per handle) and they go back to the device only whole. They are made only while the device
//! has room for many of them (`shapes_roomy`), and the arena takes free ones whole when it
//! grows over pages the pool holds.
//!
//! Runs: the arena grows by a run of pages under one handle (one create and one map
//! whatever its length, where a handle per page costs a create and a map per page). CUDA
//! maps a handle only whole (`cuMemMap` takes no offset into it but 0) and releases it only
//! whole, so a page of a run is never stitched into another mapping on its own: its free
//! bytes are used through the mappings its run is in (the arena), it is indexed apart
//! (`bound_free`, and no head or tail of a new mapping), and it goes back to the device
//! only with its whole run, once no page of the run holds a byte and no mapping of them
//! is in use.

use super::*;

impl Stitch {
    pub(super) fn unindex(&mut self, p: u32) {
        let g = self.gran;
        let pg = self.pages[p as usize].as_ref().unwrap();
        let bound = pg.run > 1 && !self.faults.stitch_run_pages;
        if pg.used == 0 {
            if bound {
                self.bound_free.remove(&p);
            } else {
                self.free_pages.remove(&p);
            }
            return;
        }
        let c = pg.class;
        if c == SMALL {
            self.small_pages.remove(&p);
        }
        // a page of a run is a head (its free suffix) only as its run's last page and a tail
        // (its free prefix) only as its run's first: the new mapping maps the whole run
        let (head_ok, tail_ok) = if bound {
            (pg.idx + 1 == pg.run, pg.idx == 0)
        } else {
            (true, true)
        };
        for (&s, &e) in &pg.free {
            self.ranges[c].remove(&(e - s, p, s));
            if s == 0 && tail_ok {
                self.prefix[c].remove(&(e, p));
            }
            if e == g && head_ok {
                self.suffix[c].remove(&(e - s, p));
            }
        }
    }

    pub(super) fn index(&mut self, p: u32) {
        let g = self.gran;
        let pg = self.pages[p as usize].as_ref().unwrap();
        let bound = pg.run > 1 && !self.faults.stitch_run_pages;
        if pg.used == 0 {
            if bound {
                self.bound_free.insert(p);
            } else {
                self.free_pages.insert(p);
            }
            return;
        }
        let c = pg.class;
        if c == SMALL {
            self.small_pages.insert(p);
        }
        let (head_ok, tail_ok) = if bound {
            (pg.idx + 1 == pg.run, pg.idx == 0)
        } else {
            (true, true)
        };
        for (&s, &e) in &pg.free {
            self.ranges[c].insert((e - s, p, s));
            if s == 0 && tail_ok {
                self.prefix[c].insert((e, p));
            }
            if e == g && head_ok {
                self.suffix[c].insert((e - s, p));
            }
        }
    }

    /// Mark `[s, e)` of page `p` used (must be free).
    pub(super) fn take(&mut self, p: u32, s: u64, e: u64, class: usize) {
        self.unindex(p);
        let life = self.life;
        let pg = self.page_mut(p);
        if pg.used == 0 {
            pg.class = class;
            pg.life = life;
        }
        let (&fs, &fe) = pg.free.range(..=s).next_back().expect("take: not free");
        debug_assert!(fs <= s && e <= fe, "take: range not free");
        pg.free.remove(&fs);
        if fs < s {
            pg.free.insert(fs, s);
        }
        if e < fe {
            pg.free.insert(e, fe);
        }
        pg.used += e - s;
        self.index(p);
    }

    /// Give `[s, e)` of page `p` back.
    pub(super) fn give(&mut self, p: u32, s: u64, e: u64) {
        self.unindex(p);
        let pg = self.page_mut(p);
        let (mut s2, mut e2) = (s, e);
        if let Some((&ps, &pe)) = pg.free.range(..s).next_back()
            && pe == s
        {
            pg.free.remove(&ps);
            s2 = ps;
        }
        if let Some(&ne) = pg.free.get(&e) {
            pg.free.remove(&e);
            e2 = ne;
        }
        pg.free.insert(s2, e2);
        pg.used -= e - s;
        self.index(p);
    }

    pub(super) fn free_prefix(&self, p: u32) -> u64 {
        let pg = self.page(p);
        if pg.used == 0 {
            return self.gran;
        }
        pg.free.get(&0).copied().unwrap_or(0)
    }

    pub(super) fn free_suffix(&self, p: u32) -> u64 {
        let g = self.gran;
        let pg = self.page(p);
        if pg.used == 0 {
            return g;
        }
        match pg.free.iter().next_back() {
            Some((&s, &e)) if e == g => g - s,
            _ => 0,
        }
    }

    /// `(page, start, end)` pieces of `[off, off + size)` over `pages`.
    pub(super) fn pieces(&self, pages: &[u32], off: u64, size: u64) -> Vec<(u32, u64, u64)> {
        let g = self.gran;
        let mut out = Vec::with_capacity(size.div_ceil(g) as usize + 1);
        let end = off + size;
        let mut a = off;
        while a < end {
            let i = a / g;
            let s = a % g;
            let e = g.min(end - i * g);
            out.push((pages[i as usize], s, e));
            a = i * g + e;
        }
        out
    }

    /// One new page with a handle of its own.
    pub(super) fn grow(&mut self, dev: &mut dyn Device) -> Result<u32, DeviceError> {
        Ok(self.grow_run(dev, 1)?[0])
    }

    /// `k` (>= 1) new pages under one handle: one driver call (see "Runs" above).
    pub(super) fn grow_run(
        &mut self,
        dev: &mut dyn Device,
        k: u64,
    ) -> Result<Vec<u32>, DeviceError> {
        let h = dev.create(k)?;
        let g = self.gran;
        let mut ids = Vec::with_capacity(k as usize);
        for i in 0..k {
            let page = Page {
                handle: h,
                run: k as u32,
                idx: i as u32,
                free: BTreeMap::from([(0, g)]),
                used: 0,
                occ: BTreeMap::new(),
                class: LARGE,
                life: 0,
                maps: Vec::new(),
                fences: Vec::new(),
            };
            let id = match self.free_slots.pop() {
                Some(id) => {
                    self.pages[id as usize] = Some(page);
                    id
                }
                None => {
                    self.pages.push(Some(page));
                    (self.pages.len() - 1) as u32
                }
            };
            ids.push(id);
        }
        if k > 1 {
            self.runs.insert(h, ids.clone());
        }
        for &id in &ids {
            self.index(id);
        }
        self.npages += k;
        self.update_reserved();
        Ok(ids)
    }

    /// Whether `create` new pages may come as one run: the pool would then hold at most
    /// 1 / `RUN_ROOM` of what the device could give it (the pages held and the device's
    /// room; a device that does not know its room is taken for a roomy one).
    pub(super) fn roomy(&self, dev: &dyn Device, create: u64) -> bool {
        let Some(room) = dev.room() else {
            return true;
        };
        let g = self.gran;
        let held = self.npages.saturating_mul(g);
        let could = held.saturating_add(room);
        held.saturating_add(create.saturating_mul(g)) <= could / RUN_ROOM
    }

    /// Whether `create` new pages may come as a handle sized per request: `roomy` for
    /// RUN_ROOM² times as many pages. A handle of several pages is mapped into other mappings
    /// and given back only whole, so once the pool nears the device's limit the pages of
    /// the handles it made while it was small are pages that no other shape can take on
    /// their own: the device then holds the pool only if such handles were a small part of
    /// what it could give from the start. With `roomy` for the handle alone, t5's first
    /// quarter of a device near its peak came as handles of four pages and behind `cudaFree`
    /// it needed 486 MiB where a handle per page needs 484 (`examples/pool_passes.rs`).
    pub(super) fn shapes_roomy(&self, dev: &dyn Device, create: u64) -> bool {
        if self.faults.shapes_near_limit {
            return self.roomy(dev, create);
        }
        self.roomy(dev, create.saturating_mul(RUN_ROOM * RUN_ROOM))
    }

    /// The handles `create` new pages for a large request come as (pages each, in the order
    /// they are created): one each under `Shapes::Pages`, else as `with_shapes` says while
    /// the device has room for many such handles (`shapes_roomy`).
    pub(super) fn handle_split(&self, dev: &dyn Device, create: u64) -> Vec<u64> {
        let per_page = vec![1; create as usize];
        if create <= 1 || self.faults.page_handles || !self.shapes_roomy(dev, create) {
            return per_page;
        }
        match self.shapes {
            Shapes::Pages => per_page,
            Shapes::Request => vec![create],
            Shapes::Pow2 => (0..64)
                .rev()
                .map(|b| 1u64 << b)
                .filter(|&k| create & k != 0)
                .collect(),
        }
    }

    /// The pages of `p`'s handle, in order (`p` alone when it has a handle of its own).
    pub(super) fn run_of(&self, p: u32) -> Vec<u32> {
        let pg = self.page(p);
        if pg.run > 1 {
            self.runs[&pg.handle].clone()
        } else {
            vec![p]
        }
    }

    /// Whether `ok` holds for every page of `p`'s run.
    pub(super) fn run_all(&self, p: u32, ok: impl Fn(u32) -> bool) -> bool {
        if self.page(p).run <= 1 {
            return ok(p);
        }
        self.runs[&self.page(p).handle].iter().all(|&q| ok(q))
    }

    /// Give page `p` back to the device, with its whole run (the caller has checked that no
    /// page of it is used or mapped).
    pub(super) fn release_page(&mut self, dev: &mut dyn Device, p: u32) -> Result<(), PoolError> {
        let pg = self.page(p);
        let (h, k) = (pg.handle, pg.run as u64);
        dev.release(h, k).map_err(PoolError::Device)?;
        let pages = if k > 1 {
            self.runs.remove(&h).unwrap_or_default()
        } else {
            vec![p]
        };
        for q in pages {
            if self.pages[q as usize].is_none() {
                continue;
            }
            self.purge_fences_all_of(dev, q);
            self.free_pages.remove(&q);
            self.bound_free.remove(&q);
            self.pages[q as usize] = None;
            self.free_slots.push(q);
            self.npages -= 1;
        }
        self.update_reserved();
        Ok(())
    }

    /// Map `pages` one after another at `va` (whole runs in order: one map per handle).
    /// `Err((error, bytes mapped from va))`; a page of a run that is not there whole and in
    /// order is refused (`DeviceError::Unsupported`) before anything is mapped for it.
    pub(super) fn map_pages(
        &self,
        dev: &mut dyn Device,
        va: u64,
        pages: &[u32],
    ) -> Result<(), (DeviceError, u64)> {
        let g = self.gran;
        let mut i = 0;
        while i < pages.len() {
            let pg = self.page(pages[i]);
            let mut k = pg.run as usize;
            if k > 1 {
                let whole = pg.idx == 0
                    && pages.len() - i >= k
                    && self
                        .runs
                        .get(&pg.handle)
                        .is_some_and(|r| r[..] == pages[i..i + k]);
                if !whole && self.faults.stitch_run_pages {
                    // the fault: the page mapped as if its handle were its own
                    k = 1;
                } else if !whole {
                    return Err((DeviceError::Unsupported, i as u64 * g));
                }
            }
            if let Err(e) = dev.map(va + i as u64 * g, pg.handle, k as u64) {
                return Err((e, i as u64 * g));
            }
            i += k;
        }
        Ok(())
    }
}

/// A partly used page as placement sees it (diagnostics, e.g. `examples/pool_fit.rs`).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct PageView {
    pub page: u32,
    /// first used by a block of at most half a page
    pub small: bool,
    pub used: u64,
    /// free byte ranges `(start, end)`
    pub free: Vec<(u64, u64)>,
    /// `(start, end, block address, block size, "live" | "pending" | "cached")`
    pub blocks: Vec<(u64, u64, u64, u64, &'static str)>,
    /// lifetime class of its blocks (see `Stitch::set_lifetime_class`)
    pub life: u8,
}

/// One handle as placement sees it (diagnostics, e.g. `examples/pool_handles.rs`): its pages
/// and the bytes of each state in them.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct HandleView {
    /// its first page
    pub page: u32,
    pub pages: u32,
    /// pages with no byte used
    pub free_pages: u32,
    /// bytes of live, pending and cached blocks, and free bytes
    pub live: u64,
    pub pending: u64,
    pub cached: u64,
    pub free: u64,
}

impl Stitch {
    /// Every partly used page (diagnostics: where the free bytes a large request cannot use
    /// lie, and which blocks pin them).
    #[doc(hidden)]
    pub fn partial_pages(&self) -> Vec<PageView> {
        self.page_views(false)
    }

    /// Free pages (no byte used) with a handle of their own, and free pages of runs
    /// (diagnostics: what a new mapping may take one by one, and what only whole).
    #[doc(hidden)]
    pub fn free_page_counts(&self) -> (usize, usize) {
        (self.free_pages.len(), self.bound_free.len())
    }

    /// Every page with a used byte, full ones included (diagnostics and tests).
    #[doc(hidden)]
    pub fn used_pages(&self) -> Vec<PageView> {
        self.page_views(true)
    }

    /// Every handle the pool holds, in page order of its first page (diagnostics: how many
    /// handles a new mapping over what is free or cached would map).
    #[doc(hidden)]
    pub fn handle_views(&self) -> Vec<HandleView> {
        let mut out = Vec::new();
        for (i, pg) in self.pages.iter().enumerate() {
            let Some(pg) = pg else { continue };
            if pg.idx != 0 {
                continue;
            }
            let members: Vec<u32> = if pg.run > 1 {
                self.runs[&pg.handle].clone()
            } else {
                vec![i as u32]
            };
            let mut v = HandleView {
                page: i as u32,
                pages: members.len() as u32,
                ..HandleView::default()
            };
            for q in members {
                let qg = self.page(q);
                if qg.used == 0 {
                    v.free_pages += 1;
                }
                v.free += self.gran - qg.used;
                for (&s, &(e, a)) in &qg.occ {
                    match self.blocks.get(a).map(|b| b.state) {
                        Some(BState::Live) => v.live += e - s,
                        Some(BState::Pending) => v.pending += e - s,
                        Some(BState::Cached) => v.cached += e - s,
                        _ => {}
                    }
                }
            }
            out.push(v);
        }
        out
    }

    fn page_views(&self, full: bool) -> Vec<PageView> {
        let mut out = Vec::new();
        for (i, pg) in self.pages.iter().enumerate() {
            let Some(pg) = pg else { continue };
            if pg.used == 0 || (pg.used == self.gran && !full) {
                continue;
            }
            let blocks = pg
                .occ
                .iter()
                .map(|(&s, &(e, a))| {
                    let (size, state) = self.blocks.get(a).map_or((0, "?"), |b| {
                        let st = match b.state {
                            BState::Live => "live",
                            BState::Pending => "pending",
                            BState::Cached => "cached",
                            BState::Vacant => "?",
                        };
                        (b.size, st)
                    });
                    (s, e, a, size, state)
                })
                .collect();
            out.push(PageView {
                page: i as u32,
                small: pg.class == SMALL,
                used: pg.used,
                life: pg.life,
                free: pg.free.iter().map(|(&s, &e)| (s, e)).collect(),
                blocks,
            });
        }
        out
    }
}
