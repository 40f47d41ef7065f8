//! Pages: the byte-range sub-allocator inside each physical page, the free-range indexes
//! the placement searches, and creating and releasing the pages themselves.

use super::*;

impl Stitch {
    pub(super) fn unindex(&mut self, p: u32) {
        let g = self.gran;
        let pg = self.pages[p as usize].as_ref().unwrap();
        if pg.used == 0 {
            self.free_pages.remove(&p);
            return;
        }
        let c = pg.class;
        if c == SMALL {
            self.small_pages.remove(&p);
        }
        for (&s, &e) in &pg.free {
            self.ranges[c].remove(&(e - s, p, s));
            if s == 0 {
                self.prefix[c].remove(&(e, p));
            }
            if e == g {
                self.suffix[c].remove(&(e - s, p));
            }
        }
    }

    pub(super) fn index(&mut self, p: u32) {
        let g = self.gran;
        let pg = self.pages[p as usize].as_ref().unwrap();
        if pg.used == 0 {
            self.free_pages.insert(p);
            return;
        }
        let c = pg.class;
        if c == SMALL {
            self.small_pages.insert(p);
        }
        for (&s, &e) in &pg.free {
            self.ranges[c].insert((e - s, p, s));
            if s == 0 {
                self.prefix[c].insert((e, p));
            }
            if e == g {
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

    pub(super) fn grow(&mut self, dev: &mut dyn Device) -> Result<u32, DeviceError> {
        let h = dev.create()?;
        let g = self.gran;
        let page = Page {
            handle: h,
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
        self.free_pages.insert(id);
        self.npages += 1;
        self.update_reserved();
        Ok(id)
    }

    pub(super) fn release_page(&mut self, dev: &mut dyn Device, p: u32) -> Result<(), PoolError> {
        let h = self.page(p).handle;
        dev.release(h).map_err(PoolError::Device)?;
        self.purge_fences_all_of(dev, p);
        self.free_pages.remove(&p);
        self.pages[p as usize] = None;
        self.free_slots.push(p);
        self.npages -= 1;
        self.update_reserved();
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

impl Stitch {
    /// Every partly used page (diagnostics: where the free bytes a large request cannot use
    /// lie, and which blocks pin them).
    #[doc(hidden)]
    pub fn partial_pages(&self) -> Vec<PageView> {
        self.page_views(false)
    }

    /// Every page with a used byte, full ones included (diagnostics and tests).
    #[doc(hidden)]
    pub fn used_pages(&self) -> Vec<PageView> {
        self.page_views(true)
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
