//! The slow path of an allocation: place with what is held, synchronize or dissolve cached
//! blocks, then grow, in the order that keeps the pool tight.

use super::*;

impl Stitch {
    /// Place with what is held now: `allow_new` lets it map free pages into a new mapping.
    pub(super) fn step_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        mix: bool,
        allow_new: bool,
    ) -> Result<Option<(u32, u64)>, PoolError> {
        let run_ends = self.run_ends_room(dev, size);
        match self.place(size, mix, allow_new, run_ends) {
            Some(plan) => self.try_commit(dev, plan, size, t),
            None => Ok(None),
        }
    }

    /// Create pages for the shortfall and place. `Ok(Err(e))`: the device or cap refused
    /// (after trying the other class's shared pages), with pages created here given back.
    ///
    /// During a capture a placement may be refused without any refusal of growth: the
    /// placement prefers bytes already mapped (no driver call) and looks at no fence, and a
    /// request on no stream over bytes a stream-ordered free fenced (or one whose stream
    /// cannot be ordered after the freeing one) needs a synchronization, which no capture
    /// allows; each round then picks the same bytes again. The request then goes on pages of
    /// its own, new ones (those created here first), which no fence covers: out of memory
    /// only when the device (or the cap) refuses them.
    pub(super) fn step_grow(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
    ) -> Result<Result<(u32, u64), DeviceError>, PoolError> {
        let want = self.fresh_pages_for(size);
        let nfree = self.free_pages.len() as u64;
        let mut created: Vec<u32> = Vec::new();
        let mut shortfall = want.saturating_sub(nfree).max(1);
        // handles sized per request: the pages the plan lacking the fewest lacks, then (if
        // the free pages there do not add up to its middle) its whole middle as one run
        let need = if self.shapes != Shapes::Pages
            && self.class_of(size) == LARGE
            && !self.ends_first
            && self.run_ends_room(dev, size)
        {
            let d: &dyn Device = dev;
            let split = |x: u64| self.handle_split(d, x);
            self.run_ends_need(size, &split)
        } else {
            None
        };
        if let Some((lack, _)) = need {
            shortfall = lack.max(1);
        }
        for attempt in 0..4 {
            if attempt == 1
                && let Some((lack, whole)) = need
                && whole > lack
            {
                // pages created for the plan and not taken go back first
                self.release_unused(dev, &created);
                created.clear();
                shortfall = whole;
            }
            let mut refused = None;
            let split = if self.class_of(size) == LARGE {
                self.handle_split(dev, shortfall)
            } else {
                vec![1; shortfall as usize]
            };
            for k in split {
                match self.grow_run(dev, k) {
                    Ok(run) => created.extend(run),
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            for mix in [false, true] {
                if refused.is_none() || mix {
                    match self.step_place(dev, size, t, mix, true) {
                        Ok(Some(x)) => {
                            self.release_unused(dev, &created);
                            return Ok(Ok(x));
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.release_unused(dev, &created);
                            return Err(e);
                        }
                    }
                }
            }
            if let Some(e) = refused {
                self.release_unused(dev, &created);
                if !e.is_oom() {
                    return Err(PoolError::Device(e));
                }
                return Ok(Err(e));
            }
            shortfall = 1;
        }
        // only reachable during capture: the bytes placed on need a synchronization we may
        // not make (outside a capture no commit is refused so, and nothing here moves)
        if dev.is_capturing() {
            return self.grow_apart(dev, size, t, created);
        }
        self.release_unused(dev, &created);
        Ok(Err(DeviceError::OutOfMemory))
    }

    /// [`Stitch::step_grow`] during a capture, after its placements were refused for want of
    /// a synchronization: `size` bytes on new pages of their own under a new mapping, the
    /// pages `created` (new and unused) first, more grown for the rest. The pages left
    /// unused are given back.
    fn grow_apart(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        mut created: Vec<u32>,
    ) -> Result<Result<(u32, u64), DeviceError>, PoolError> {
        let n = size.div_ceil(self.gran).max(1) as usize;
        while created.len() < n {
            match self.grow(dev) {
                Ok(p) => created.push(p),
                Err(e) => {
                    self.release_unused(dev, &created);
                    if !e.is_oom() {
                        return Err(PoolError::Device(e));
                    }
                    return Ok(Err(e));
                }
            }
        }
        // A run is mapped only whole, and the mapping takes the first `n` pages: no run may
        // cross page `n`. None does: `step_grow` creates, in order, the runs of its first
        // shortfall (the fresh pages `size` needs less the free ones, or the pages the plan
        // lacking the fewest lacks: at most `n`), or once that plan's whole middle instead
        // (at most `n` too: the whole pages between a head and a tail of `size`), then single
        // pages; the pages grown here are single.
        debug_assert!(
            created.get(n).is_none_or(|&p| self.page(p).idx == 0),
            "a run crosses the new mapping's end"
        );
        let plan = Plan::New {
            pages: created[..n].to_vec(),
            off: 0,
        };
        let r = self.try_commit(dev, plan, size, t);
        self.release_unused(dev, &created);
        match r? {
            Some(x) => Ok(Ok(x)),
            None => Ok(Err(DeviceError::OutOfMemory)),
        }
    }

    /// With handles sized per request: whether a new mapping for `size` bytes may be planned
    /// over handles' free ends (`run_ends_plan`) and growth made for such a plan
    /// (`run_ends_need`), which is while the device has room for the request's pages
    /// (`roomy`). Near the limit the usual placement, which packs a remainder into the
    /// tightest page end, decides: a plan over ends chooses the fewest handles first and
    /// leaves holes the smallest device pays for (bert's three passes stream-ordered with a
    /// synchronization between them needed 216 MiB where its device of one pass has 214).
    pub(super) fn run_ends_room(&self, dev: &dyn Device, size: u64) -> bool {
        self.shapes != Shapes::Pages
            && (self.faults.run_ends_near_limit || self.roomy(dev, size.div_ceil(self.gran.max(1))))
    }

    /// Free pages with a handle of their own that a new mapping of `size` bytes takes (see
    /// `place_pages`, tier 1): its whole pages, and one more for the remainder unless a partly
    /// used page's free end holds it (the mapping then starts or ends in that page). Growth
    /// creates only these: a page created for a remainder that a free end then takes would
    /// be given back at once (a create and a release for nothing).
    pub(super) fn fresh_pages_for(&self, size: u64) -> u64 {
        let g = self.gran;
        let (whole, rest) = (size / g, size % g);
        if rest == 0 {
            return whole;
        }
        if self.class_of(size) == LARGE && !self.ends_first && !self.faults.remainder_page {
            let holds = |ends: &[BTreeSet<(u64, u32)>; 2]| {
                ends[LARGE]
                    .range((rest, 0)..)
                    .any(|&(_, p)| self.life_ok(p))
            };
            if holds(&self.suffix) || holds(&self.prefix) {
                return whole;
            }
        }
        whole + 1
    }

    pub(super) fn alloc_slow(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Slot, PoolError> {
        let g = self.gran;
        // A block of this very size waits for a synchronization and enough others wait
        // with it: one sync releases them all and the request takes its twin. Exact reuse
        // keeps the layout a repeating workload made (placing the request elsewhere while
        // its twin waits scatters both over shared pages: 6% more memory on the shipped
        // traces replayed through cudaMalloc/cudaFree, and driver calls in every pass);
        // batching keeps it to one sync per SYNC_BATCH cudaFrees at most.
        if !self.faults.lazy_sync
            && self.pending.len() >= SYNC_BATCH
            && self.sizes.has_pending(size)
            && !self.ends_first
            && let Some(a) = self.sync_and_take(dev, size, t, req)?
        {
            return Ok(Slot::Hit(a));
        }
        // Near the device's limit, a block of more than a page goes on page ends (see `ends`)
        if self.ends_first
            && let Some(slot) = self.ends_place(dev, size, t)?
        {
            return Ok(slot);
        }
        // Under a budget a large block comes out of the arena while it fits there (see
        // `arena`); the steps below are the fallback when the budget forbids its growth.
        // The arena places by address whatever a block's lifetime class, so near the
        // device's limit a pool told lifetime classes stitches large blocks from pages of
        // their own class instead (see `lifetimes_near_limit`).
        if self.budget.is_some()
            && self.class_of(size) == LARGE
            && !self.lifetimes_near_limit(dev, size)
            && let Some(slot) = self.arena_place(dev, size, t, req)?
        {
            return Ok(slot);
        }
        // 1. free bytes in existing mappings (no driver call)
        if let Some(x) = self.step_place(dev, size, t, false, false)? {
            return Ok(Slot::New(x.0, x.1));
        }
        // Small blocks live inside single pages, which are always mapped: a small request
        // that misses the cache takes the best gap between pinned blocks of a small page,
        // dissolving only the cached blocks in that gap (no driver call), before the pool grows.
        if self.class_of(size) == SMALL
            && self.ncached > 0
            && let Some((m, off, victims)) = self.reuse_small(size)
        {
            for v in victims {
                self.dissolve(dev, v);
            }
            if let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // a small request that fits no small page takes a free range of a large-block page
        // (mapped already) rather than a new page
        if self.class_of(size) == SMALL
            && let Some(x) = self.step_place(dev, size, t, true, false)?
        {
            return Ok(Slot::New(x.0, x.1));
        }
        // Under a budget, a large request takes the place its twin had, or a window of free
        // bytes of any mapping held (no driver call) before it grows or stitches pages
        let tight = self.budget.is_some();
        if tight
            && self.class_of(size) == LARGE
            && let Some((m, off, _)) = self.ghost(size, false).or_else(|| self.carve(size, false))
            && let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)?
        {
            return Ok(Slot::New(x.0, x.1));
        }
        // Grow-first mode (below the soft limit): keep cached blocks for exact reuse and
        // take free pages or new pages, like a caching allocator. Not near the device's
        // limit (see `pressure`): there cached blocks are dissolved and the bytes held are
        // used before the pool grows, as above its budget.
        let limit = self.soft_limit().min(self.budget_limit(req));
        if (self.npages + size.div_ceil(g)) * g <= limit && !self.under_pressure(dev, size) {
            // A block of this very size waits for a synchronization: take it (one sync
            // releases every pending block) rather than place the request elsewhere while
            // its twin waits, which scatters both over shared pages.
            if !self.faults.lazy_sync
                && self.sizes.has_pending(size)
                && let Some(a) = self.sync_and_take(dev, size, t, req)?
            {
                return Ok(Slot::Hit(a));
            }
            // an unused mapping grown by its missing pages before a new one (see `grow`)
            if let Some(x) = self.grow_place(dev, size, t)? {
                return Ok(Slot::New(x.0, x.1));
            }
            if let Some(x) = self.step_place(dev, size, t, false, true)? {
                return Ok(Slot::New(x.0, x.1));
            }
            if let Ok(x) = self.step_grow(dev, size, t)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // Growth was refused or is beyond the soft limit: release the pending blocks first
        // (an exact-size twin is the tightest fit there is; the rest joins the cache).
        if !self.faults.lazy_sync
            && let Some(a) = self.sync_and_take(dev, size, t, req)?
        {
            return Ok(Slot::Hit(a));
        }
        // 2. a cached mapping, dissolving the cached blocks in the way (no driver call)
        if self.ncached > 0
            && let Some((m, off, victims)) = (if tight { self.ghost(size, true) } else { None })
                .or_else(|| self.reuse_mapping(size))
                .or_else(|| if tight { self.carve(size, true) } else { None })
        {
            for v in victims {
                self.dissolve(dev, v);
            }
            if let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // 3. an unused mapping grown by its missing pages (see `grow`), else free pages
        // under a new mapping
        if let Some(x) = self.grow_place(dev, size, t)? {
            return Ok(Slot::New(x.0, x.1));
        }
        if let Some(x) = self.step_place(dev, size, t, false, true)? {
            return Ok(Slot::New(x.0, x.1));
        }
        // 4. dissolve cached blocks, least recently freed first
        while self.dissolve_some(dev, size) {
            if let Some(x) = self.step_place(dev, size, t, false, true)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // 5. one synchronization releases every pending cudaFree'd block
        if !self.pending.is_empty() && !dev.is_capturing() {
            self.do_sync(dev)?;
            while self.dissolve_some(dev, u64::MAX) {}
            if let Some(x) = self.step_place(dev, size, t, false, true)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // 6. grow by the shortfall; if refused, share pages across classes
        match self.step_grow(dev, size, t)? {
            Ok(x) => Ok(Slot::New(x.0, x.1)),
            Err(e) => {
                self.stats.oom_retries += 1;
                Err(PoolError::OutOfMemory {
                    requested: size,
                    reserved: self.stats.reserved,
                    live: self.stats.live,
                    why: e,
                })
            }
        }
    }

    /// A large block in the arena: a free window, else (once a synchronization released
    /// its pending twin, if it has one) a window with cached blocks dissolved out of the
    /// way, else the arena grown at its end within the budget, else the same after one
    /// synchronization releases the pending blocks. `None`: the budget (or the device)
    /// refuses; the caller stitches what the pool holds.
    fn arena_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Option<Slot>, PoolError> {
        // where a block of this size went last, if nothing but cached blocks is there now:
        // a repeating pattern keeps its layout (and its mappings)
        for victims_ok in [false, true] {
            if let Some((m, off, victims)) = self.ghost(size, victims_ok) {
                for v in victims {
                    self.dissolve(dev, v);
                }
                if let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)? {
                    return Ok(Some(Slot::New(x.0, x.1)));
                }
            }
        }
        for round in 0..2 {
            if let Some((off, _)) = self.arena_window(size, false)
                && let Some(x) = self.arena_commit(dev, off, size, t)?
            {
                return Ok(Some(x));
            }
            // with kept ranges on (see `kept`), cached bytes are taken out of the range that
            // fits the request most tightly rather than wherever the fewest are cached
            if self.kept_on
                && let Some(x) = self.kept_place(dev, size, t, true)?
            {
                return Ok(Some(x));
            }
            if round == 0
                && !self.faults.lazy_sync
                && self.sizes.has_pending(size)
                && let Some(a) = self.sync_and_take(dev, size, t, req)?
            {
                return Ok(Some(Slot::Hit(a)));
            }
            if self.ncached > 0
                && let Some((off, victims)) = self.arena_window(size, true)
            {
                for v in victims {
                    self.dissolve(dev, v);
                }
                if let Some(x) = self.arena_commit(dev, off, size, t)? {
                    return Ok(Some(x));
                }
            }
            let limit = self.budget_limit(req);
            if let Some(off) = self.arena_grow(dev, size, limit)?
                && let Some(x) = self.arena_commit(dev, off, size, t)?
            {
                return Ok(Some(x));
            }
            if round == 0 {
                if self.pending.is_empty() || dev.is_capturing() {
                    break;
                }
                if let Some(a) = self.sync_and_take(dev, size, t, req)? {
                    return Ok(Some(Slot::Hit(a)));
                }
            }
        }
        Ok(None)
    }

    fn arena_commit(
        &mut self,
        dev: &mut dyn Device,
        off: u64,
        size: u64,
        t: Stream,
    ) -> Result<Option<Slot>, PoolError> {
        let Some(map) = self.arena else {
            return Ok(None);
        };
        Ok(self
            .try_commit(dev, Plan::Existing { map, off }, size, t)?
            .map(|(m, o)| Slot::New(m, o)))
    }

    /// Bytes the pool may hold before it prefers dissolving cached blocks to growing.
    pub(super) fn soft_limit(&self) -> u64 {
        match self.headroom {
            None => u64::MAX,
            Some(h) => (self.stats.peak_live as f64 * (1.0 + h.max(0.0))) as u64,
        }
    }

    pub(super) fn release_unused(&mut self, dev: &mut dyn Device, created: &[u32]) {
        for &p in created {
            if self.pages[p as usize].is_some()
                && self.run_all(p, |q| {
                    let pg = self.page(q);
                    pg.used == 0 && pg.maps.is_empty() && pg.fences.is_empty()
                })
            {
                let _ = self.release_page(dev, p);
            }
        }
    }
}
