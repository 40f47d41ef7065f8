//! Layer replay: within one long round, a repeated sequence of large requests takes the
//! places of the repeat before the previous one (period two).
//!
//! Why: a job that is never idle (a server: the model's weights stay live) has one long
//! round, so the round replay (`rounds`) never acts. Its work still repeats: a transformer
//! layer makes the same requests in the same order as the layer before it, as long as the
//! input's shape stays. The layer before cannot lend its places: some of its blocks (its
//! output, the residual) live into the next layer, so the next layer, laid out afresh, puts
//! its blocks around them wherever the cache and the arena's windows allow, and a large
//! block that finds every earlier place of its size holding one of those is stitched anew
//! (driver calls in every layer). Everything of the layer before the previous one is dead
//! by the time a layer starts, so layer k can take layer k-2's places exactly: what is live
//! beside it then (the end of layer k-1) lies where the end of layer k-3 lay beside layer
//! k-2, which layer k-2's places kept clear of. Two alternating layouts then repeat with no
//! driver call.
//!
//! The rule: every allocation of at least a page of a budgeted pool with layers on goes
//! through the general path (the fast path declines it: `SizeList::replay_next`), and its
//! size and place are remembered in order. When the sequence of these sizes has repeated
//! with some period `p` of at least two sizes (at most `MAX_PERIOD` allocations) for the last
//! `p + 1` allocations, this one included, and the allocation `2p` before had this size too,
//! the allocation takes the place of the one `2p` before it, else of the one `p` before it
//! (the first repeats of a new shape, whose layer before the previous one differed), if only
//! cached (or pending) blocks are there now; else the usual placement. Which place is safe is
//! decided as for the round replay (`Stitch::place_free`): never a live block's bytes,
//! pending ones released by a synchronization first. Not near the device's limit
//! (`roomy`): there the usual placement packs tighter (smaller devices).
//!
//! Holds (`Stitch::with_layer_holds`, off by default). The first layers of a new shape have
//! no layout to replay: layer 2's blocks go where the usual placement puts them, around
//! layer 1's output, so layer 3's replay of layer 1 falls back where layer 2 left a block
//! that lives into layer 3; the fallback lands in places of layer 2 that layer 4 will want,
//! and so on (a fallback of a block of many pages is a new stitched mapping). So when a
//! large allocation gets no place of the sequence and its place one period back is taken
//! by a live block, the places that the next `p - 1` allocations will take two periods
//! after them (the allocations `p + 1` to `2p - 1` before this one) are held while it is
//! placed, those of its own size whose bytes are all free now: it goes in the arena or a
//! held mapping outside them, with no driver call, or, if there is no such room, where the
//! usual placement puts it as if nothing were held. A hold is a placeholder live block
//! over the place for the length of the allocation; it never touches a byte that is not
//! free, and the allocation goes only where bytes are free (`Faults::hold_over_live` puts
//! it at its place one period back, over the live block there).
//!
//! Blocks under a page share pages (their places matter little) and are left to the fast
//! path. A caller's thread caches (`thread_cache`) keep only frees under a page while the
//! rule acts (`Stitch::aside_below`): a cache hit is served where the pool never sees it, so
//! a layer's block a cache served would neither be placed by the rule nor remembered. The
//! one exception is a run of one large size too long for any period (`Layers::loose`): its
//! next allocations of that size go to the fast path unremembered anyway, so the caches may
//! keep frees of that size while the run lasts (`Stitch::aside_run`: a loop of one large
//! stream-ordered pair then takes no pool lock). The first allocation of another size is a
//! miss in every cache, which gives back what it keeps before the pool serves it; that
//! allocation breaks the run, and frees of the run's size reach the pool again.

use super::*;

/// The longest period (in allocations of at least a page) looked for.
const MAX_PERIOD: usize = 64;
/// Allocations remembered: at least two periods back from the allocation being served (a
/// power of two: an index is a mask, not a division).
const RING: usize = (2 * MAX_PERIOD + 1).next_power_of_two();

/// The recent large allocations (of at least a page).
pub(super) struct Layers {
    /// (size, mapping, the mapping's address, offset) by large allocation number mod `RING`
    ring: Vec<(u64, u32, u64, u64)>,
    /// large allocations remembered since the last reset
    n: u64,
    /// how many of the latest large allocations in a row had the size of the one before them
    same: u32,
    /// the size of that run when it is too long for any period of two sizes or more: its
    /// next allocation may take the fast path (see `note_layer`)
    loose: Option<u64>,
    /// allocations served at a place of two periods before
    pub(super) replays: u64,
    /// allocations placed outside held places (see "Holds")
    pub(super) held_placed: u64,
}

impl Default for Layers {
    fn default() -> Self {
        Layers {
            ring: vec![(0, 0, 0, 0); RING],
            n: 0,
            same: 0,
            loose: None,
            replays: 0,
            held_placed: 0,
        }
    }
}

impl Layers {
    /// Forget the sequence (a round ended: the round replay takes over).
    pub(super) fn clear(&mut self) {
        self.n = 0;
        self.same = 0;
        self.loose = None;
    }

    /// The shortest period `p` (of at least two sizes) over which the sequence, with one
    /// more allocation of `size`, has repeated for the last `p + 1` allocations, when the
    /// allocation `2p` before had this size too: `p`.
    fn period(&self, size: u64) -> Option<usize> {
        // The latest `same` allocations had this size: a period of at most `same + 1` would
        // repeat this size alone, not a sequence of two sizes or more. Starting past it keeps
        // a long run of one size (a loop of one large request) from testing every period at
        // every allocation.
        let same = if self.n > 0 && self.back(1).0 == size {
            self.same as usize + 1
        } else {
            0
        };
        for p in same + 2..=MAX_PERIOD {
            if (p as u64) * 2 > self.n {
                return None;
            }
            if self.back(p).0 != size || self.back(2 * p).0 != size {
                continue;
            }
            // each of the latest `p` had the size of the one `p` before it
            if (1..p).all(|k| self.back(k).0 == self.back(k + p).0) {
                return Some(p);
            }
        }
        None
    }

    /// The large allocation `k` before the next one.
    fn back(&self, k: usize) -> (u64, u32, u64, u64) {
        self.ring[(self.n - k as u64) as usize & (RING - 1)]
    }

    /// Remember a large allocation of `size` placed at `(m, va, off)`.
    fn push(&mut self, size: u64, m: u32, va: u64, off: u64) {
        self.same = if self.n > 0 && self.back(1).0 == size {
            self.same.saturating_add(1)
        } else {
            0
        };
        self.ring[self.n as usize & (RING - 1)] = (size, m, va, off);
        self.n += 1;
    }
}

impl Stitch {
    /// Whether the layer replay looks at an allocation of `size`.
    #[inline]
    fn layer_size(&self, size: u64) -> bool {
        self.layers_on && self.budget.is_some() && self.gran > 0 && size >= self.gran
    }

    /// Place the allocation of `size` on stream `t` where the large allocation two periods
    /// (else one period) before it went, when the sequence repeats and that place is free but
    /// for cached blocks.
    #[cold]
    #[inline(never)]
    pub(super) fn layer_commit(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Option<Slot>, PoolError> {
        if !self.layer_size(size) {
            return Ok(None);
        }
        // near the device's limit the usual placement packs tighter (see `pressure`)
        if !self.roomy(dev, 0) {
            return Ok(None);
        }
        let Some(p) = self.layers.period(size) else {
            return Ok(None);
        };
        let mut found = None;
        for k in [2 * p, p] {
            let (_, m, va, off) = self.layers.back(k);
            if let Some(f) = self.place_free(dev, m, va, off, size) {
                found = Some(f);
                break;
            }
        }
        let Some((m, off, occupants)) = found else {
            if self.holds_on {
                // held when the usual placement is due (not on a cache hit)
                self.hold_ask = Some((self.stats.allocs, p));
            }
            return Ok(None);
        };
        let slot = self.commit_place(dev, m, off, occupants, size, t, req)?;
        if slot.is_some() {
            self.layers.replays += 1;
        }
        Ok(slot)
    }

    /// Hold (see "Holds" above) the free places of `size` that the next `p - 1` allocations
    /// of the sequence will take two periods after them, when the place of the allocation
    /// of `size` being served one period back is taken by a live block.
    fn hold_next(&mut self, size: u64, p: usize) {
        let (_, m, va, off) = self.layers.back(p);
        if !self.place_mapped(m, va, off, size)
            || !matches!(self.occupants(m, off, size), rounds::Occupants::Live)
        {
            return;
        }
        let own = (m, off);
        for k in p + 1..2 * p {
            let (sz, m, va, off) = self.layers.back(k);
            if sz != size || !self.place_mapped(m, va, off, sz) {
                continue;
            }
            let addr = va + off;
            let pieces = self.pieces(&self.map(m).pages, off, sz);
            if self.blocks.get(addr).is_some()
                || !pieces.iter().all(|&(q, s, e)| self.bytes_free(q, s, e))
            {
                continue;
            }
            for &(q, s, e) in &pieces {
                self.take(q, s, e, LARGE);
                self.page_mut(q).occ.insert(s, (e, addr));
            }
            let list = self.sizes.intern(sz);
            self.blocks.insert(Block {
                addr,
                list,
                size: sz,
                req: sz,
                map: m,
                off,
                stream: crate::ANY_STREAM,
                state: BState::Live,
                free_stream: crate::ANY_STREAM,
                event: None,
                epoch: 0,
                seq: 0,
            });
            self.map_mut(m).users += 1;
            self.held.push(addr);
        }
        if !self.held.is_empty() && self.faults.hold_over_live {
            // the fault: the allocation goes to its own place, over the live block there
            self.held_over = Some(own);
        }
    }

    /// In the arena or a held mapping with no driver call, while places are held.
    fn place_held(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
    ) -> Result<Option<(u32, u64)>, PoolError> {
        if let Some((m, off)) = self.held_over
            && let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)?
        {
            return Ok(Some(x));
        }
        if let Some((off, _)) = self.arena_window(size, false)
            && let Some(m) = self.arena
            && let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)?
        {
            return Ok(Some(x));
        }
        self.step_place(dev, size, t, false, false)
    }

    /// Whether mapping `m` is still the one at `va` and holds `[off, off + size)`.
    fn place_mapped(&self, m: u32, va: u64, off: u64, size: u64) -> bool {
        self.maps
            .get(m as usize)
            .and_then(|x| x.as_ref())
            .is_some_and(|mp| mp.va == va && off + size <= mp.pages.len() as u64 * self.gran)
    }

    /// End the holds: their places' bytes are free again.
    pub(super) fn unhold(&mut self) {
        self.held_over = None;
        while let Some(addr) = self.held.pop() {
            let Some((_, b)) = self.blocks.remove(addr) else {
                continue;
            };
            let pages = self.map(b.map).pages.clone();
            for (q, s, e) in self.pieces(&pages, b.off, b.size) {
                self.give(q, s, e);
                if self.page(q).occ.get(&s).is_some_and(|&(_, a)| a == addr) {
                    self.page_mut(q).occ.remove(&s);
                }
            }
            self.map_mut(b.map).users -= 1;
        }
    }

    /// Serve a large allocation of `size` while places are held: in the arena or a held
    /// mapping outside them (no driver call), else as if nothing were held.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_held(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
        p: usize,
    ) -> Result<Slot, PoolError> {
        self.hold_next(size, p);
        if self.held.is_empty() {
            return self.alloc_slow(dev, size, t, req);
        }
        let placed = self.place_held(dev, size, t);
        self.unhold();
        match placed? {
            Some((m, off)) => {
                self.layers.held_placed += 1;
                Ok(Slot::New(m, off))
            }
            None => self.alloc_slow(dev, size, t, req),
        }
    }

    /// After a large allocation of `size` (now a block at `addr`) was served by the general
    /// path: remember its place, and keep the next allocation of its size off the fast path.
    #[cold]
    #[inline(never)]
    pub(super) fn note_layer(&mut self, size: u64, addr: u64) {
        if !self.layer_size(size) {
            return;
        }
        let Some((m, off)) = self.blocks.get(addr).map(|b| (b.map, b.off)) else {
            return;
        };
        let va = self.map(m).va;
        self.layers.push(size, m, va, off);
        // A run of one size longer than any period looked for (a loop of one large request):
        // its next allocation of this size cannot be given a layer's place (`period` starts
        // past the run), so it may take the fast path unremembered, until another size breaks
        // the run and its size is kept off the fast path again (a loop of the pool's
        // benchmarks: 8 MiB pairs would each take the general path).
        if self.layers.same == 0
            && let Some(run) = self.layers.loose.take()
        {
            self.next_off_fast_path(run);
        }
        if self.layers.same as usize + 3 > MAX_PERIOD {
            self.layers.loose = Some(size);
        } else {
            self.next_off_fast_path(size);
        }
    }

    /// The next allocation of `size` goes through the general path.
    fn next_off_fast_path(&mut self, size: u64) {
        if let Some(l) = self.sizes.find(size) {
            let sl = self.sizes.at_mut(l);
            sl.replay_next = sl.allocs;
        }
    }

    /// The requested sizes a caller may keep aside when freed (`Policy::aside_below`): with
    /// the layer replay acting, those under a page, so that every allocation the rule looks at
    /// reaches the pool; else any.
    pub fn aside_below(&self) -> u64 {
        if self.layer_size(self.gran) {
            self.gran
        } else {
            u64::MAX
        }
    }

    /// The size (rounded to `ALIGN`) of the run of one large request too long for any period
    /// (`Layers::loose`) while the layer replay acts, 0 when there is none: a caller may keep
    /// frees of that size aside too (`Policy::aside_run`), its next allocations taking the fast
    /// path unremembered (see `note_layer`). Changed only by an allocation the general path
    /// serves (`note_layer`, and `forget_layout` at a round's end).
    pub fn aside_run(&self) -> u64 {
        if self.layer_size(self.gran) {
            self.layers.loose.unwrap_or(0)
        } else {
            0
        }
    }

    /// Allocations placed outside the places held for the next ones (see `layers`, "Holds").
    pub fn layer_holds(&self) -> u64 {
        self.layers.held_placed
    }

    /// Allocations served at the place of the allocation two periods of a repeated sequence
    /// before them (see `layers`).
    pub fn layer_replays(&self) -> u64 {
        self.layers.replays
    }

    /// The places the layer replay would look at for the next allocation of `size` bytes
    /// (rounded as the pool rounds it), in its order (two periods back, then one), with the
    /// blocks that are not cached there now (diagnostics: why a layer's block was placed
    /// anew). Empty when no period covers the allocation. Changes nothing.
    #[doc(hidden)]
    pub fn layer_places(&self, size: u64) -> Vec<LayerPlace> {
        let size = round_up(size.max(1), ALIGN);
        if !self.layer_size(size) {
            return Vec::new();
        }
        let Some(p) = self.layers.period(size) else {
            return Vec::new();
        };
        [2 * p, p]
            .into_iter()
            .map(|back| {
                let (_, m, va, off) = self.layers.back(back);
                self.place_view(back, m, va, off, size)
            })
            .collect()
    }

    /// The earlier places of blocks of `size` bytes the pool remembers (its twins', see
    /// `placement`, "ghosts"), latest first, with the blocks that are not cached there now
    /// (diagnostics; `back` counts the places back). Changes nothing.
    #[doc(hidden)]
    pub fn twin_places(&self, size: u64) -> Vec<LayerPlace> {
        let size = round_up(size.max(1), ALIGN);
        let Some(v) = self.ghosts.get(&size) else {
            return Vec::new();
        };
        v.iter()
            .rev()
            .enumerate()
            .map(|(i, &(m, va, off))| self.place_view(i + 1, m, va, off, size))
            .collect()
    }

    /// The place `(m, va, off)` of `size` bytes as `layer_places` shows it.
    fn place_view(&self, back: usize, m: u32, va: u64, off: u64, size: u64) -> LayerPlace {
        let mapping = self.maps.get(m as usize).and_then(|x| x.as_ref());
        let Some(mp) = mapping.filter(|mp| mp.va == va) else {
            return LayerPlace {
                back,
                addr: va + off,
                gone: true,
                blockers: Vec::new(),
            };
        };
        let mut blockers: Vec<(u64, u64, &'static str)> = Vec::new();
        let end = (off + size).min(mp.pages.len() as u64 * self.gran);
        for (pg, s, e) in self.pieces(&mp.pages, off, end.saturating_sub(off)) {
            for (_, &(oe, a)) in self.page(pg).occ.range(..e) {
                if oe <= s || blockers.iter().any(|b| b.0 == a) {
                    continue;
                }
                let state = match self.blocks.get(a).map(|b| (b.state, b.size)) {
                    Some((BState::Cached, _)) => continue,
                    Some((BState::Live, sz)) => (sz, "live"),
                    Some((BState::Pending, sz)) => (sz, "pending"),
                    _ => (0, "?"),
                };
                blockers.push((a, state.0, state.1));
            }
        }
        LayerPlace {
            back,
            addr: va + off,
            gone: off + size > mp.pages.len() as u64 * self.gran,
            blockers,
        }
    }

    /// The mapping (its address) and offset of the block at `addr`, live or not, and
    /// whether that mapping is the arena (diagnostics).
    #[doc(hidden)]
    pub fn place_of(&self, addr: u64) -> Option<(u64, u64, bool)> {
        let b = self.blocks.get(addr)?;
        let mp = self.maps.get(b.map as usize)?.as_ref()?;
        Some((mp.va, b.off, self.arena == Some(b.map)))
    }
}

/// One place the layer replay looks at (see `Stitch::layer_places`).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct LayerPlace {
    /// how many large allocations back the place's block was allocated
    pub back: usize,
    /// the place's address
    pub addr: u64,
    /// its mapping was dropped or re-formed (the place is no longer there)
    pub gone: bool,
    /// `(address, size, "live" | "pending")` of the blocks in it that are not cached
    pub blockers: Vec<(u64, u64, &'static str)>,
}
