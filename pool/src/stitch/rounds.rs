//! A tight pool replays the previous round's layout.
//!
//! Why: a repeated workload (training steps, the passes of a job) makes the same requests in
//! the same order every round. The first round is laid out from nothing: every page and
//! mapping it needs is made then. A later round laid out afresh takes different decisions,
//! because the pool now holds pages and mappings the first round did not have (a window in
//! the arena instead of growth, a free page instead of a new one), and where its layout
//! differs, the largest blocks no longer fit the held ranges and are stitched anew: driver
//! calls in every round. So the pool remembers where each allocation that reached its slow
//! path (a miss of the fast path) went in this round, with its rank among the round's
//! allocations of its size (fast-path hits count); when nothing is live again (see `quiet`)
//! that becomes the previous round. In the new round, the allocation of a size whose rank
//! the previous round placed on its slow path skips the fast path (one comparison there:
//! `SizeList::replay_next`) and takes, before any cached block, the place the previous round
//! gave that rank, if no live block is in it now (cached blocks in the way are dissolved;
//! `cudaFree`d blocks waiting there are released by one synchronization, as the previous
//! round had them released by then). Taking whichever cached block fits instead, or a hit
//! where the previous round missed, would let the layouts drift apart. A round that repeats
//! the previous one then takes exactly its places: no driver call, and no creep (the layout
//! is the first round's, which fitted the budget). A round that differs falls back to the
//! usual placement wherever a remembered place is taken or missing. The mappings the places
//! are in are not re-formed over other pages (`Stitch::repairable`) while a round names them.
//!
//! Hits: an allocation the fast path served in the previous round (a cached block of its
//! size) has no place remembered; the new round serves it from the cache again, and takes the
//! same block only if the cache holds the same blocks in the same order, that is if the
//! round's `cudaFree`d blocks were released by synchronizations at the same points. The
//! allocation that made a place synchronized there when the pending frees had reached their
//! limit (`pending_limit`); so does its replay (`Faults::replay_skips_sync` skips it, for the
//! tests). Without it a later pass's hits take other cached blocks than the first pass's
//! from the first synchronization it skips on, and its layout drifts as above: driver calls
//! in later passes, and a larger device for three passes than for one (the GPU recording of
//! GPT-2 behind `cudaFree`, `examples/pool_passes.rs`).
//!
//! Bounded: at most `ROUND_PLACES` places are remembered per round (a job that is never
//! idle has one long round; the rest of it is not remembered).

use super::*;

/// Places remembered per round, at most.
const ROUND_PLACES: usize = 1 << 16;

/// Where an allocation went: (its rank among the round's allocations of its size, mapping,
/// the mapping's address, offset).
type Place = (u32, u32, u64, u64);

/// The places of the rounds, updated in place: a rank this round has served holds this
/// round's place, a rank it has not reached yet the previous round's.
#[derive(Default)]
pub(super) struct Rounds {
    /// per size list (`SizeLists` index): places by rank
    places: Vec<Vec<Place>>,
    /// places held
    count: usize,
    /// mappings (and their addresses) that places are in, or were in during this round
    maps: FxMap<u32, u64>,
    /// allocations served at a replayed place
    replays: u64,
    /// of those, the ones served by a new block there (not cache hits), and that count at
    /// the last round end (see `quiet`)
    anew: u64,
    anew_mark: u64,
    /// the (mapping, address) last put in `maps` since it was rebuilt: a round's places
    /// are mostly in few mappings, so most places need no hash insert
    last_map: Option<(u32, u64)>,
}

impl Rounds {
    pub(super) fn replays(&self) -> u64 {
        self.replays
    }

    /// Allocations served by a new block at their rank's place of the round before, since
    /// the last round end.
    pub(super) fn anew_since_end(&self) -> u64 {
        self.anew - self.anew_mark
    }
}

/// Note in `maps` that a place is in mapping `m` at `va` (`last`: the entry put there last).
#[inline]
fn note_map(maps: &mut FxMap<u32, u64>, last: &mut Option<(u32, u64)>, m: u32, va: u64) {
    if *last != Some((m, va)) {
        maps.insert(m, va);
        *last = Some((m, va));
    }
}

impl Stitch {
    /// Under a budget, after an allocation of `size` that reached the slow path, now a block
    /// at `addr`: count it, remember its place under its rank, and find the next rank of the
    /// size that has a place to replay.
    pub(super) fn note_round(&mut self, size: u64, addr: u64) {
        let Some(l) = self.sizes.find(size) else {
            return;
        };
        let sl = self.sizes.at(l);
        let (k, mut at) = (sl.allocs, sl.replay_at as usize);
        let mut next = u32::MAX;
        if !self.faults.forget_rounds
            && let Some((m, off)) = self.taken_place(addr)
        {
            // a block lies at its mapping's address plus its offset (blocks never move)
            let va = addr - off;
            debug_assert_eq!(va, self.map(m).va);
            let place = (k, m, va, off);
            let li = l as usize;
            let r = &mut self.rounds;
            if r.places.len() <= li {
                r.places.resize_with(li + 1, Vec::new);
            }
            let v = &mut r.places[li];
            // places before `at` are of ranks already served (below `k`), the one at `at`
            // (if any) of rank `k` or later: ranks come in order
            let i = at.min(v.len());
            debug_assert_eq!(i, v.partition_point(|p| p.0 < k));
            if v.get(i).is_some_and(|p| p.0 == k) {
                if v[i] != place {
                    v[i] = place;
                    note_map(&mut r.maps, &mut r.last_map, m, va);
                }
                at = i + 1;
            } else if r.count < ROUND_PLACES {
                if i == v.len() {
                    v.push(place);
                } else {
                    v.insert(i, place);
                }
                r.count += 1;
                note_map(&mut r.maps, &mut r.last_map, m, va);
                at = i + 1;
            } else {
                at = i;
            }
            next = v.get(at).map_or(u32::MAX, |p| p.0);
        }
        let sl = self.sizes.at_mut(l);
        sl.allocs = sl.allocs.wrapping_add(1);
        sl.replay_next = next;
        sl.replay_at = at as u32;
    }

    /// The (mapping, offset) of the block at `addr`: the block the cache handed out last
    /// (the usual case: no lookup) or any other.
    #[inline]
    fn taken_place(&mut self, addr: u64) -> Option<(u32, u64)> {
        match self.last_taken.take() {
            Some((a, m, off)) if a == addr => Some((m, off)),
            _ => self.blocks.get(addr).map(|b| (b.map, b.off)),
        }
    }

    /// Nothing is live and the layout is forgotten: this round's places are the ones the
    /// next round replays (ranks this round did not reach are dropped).
    pub(super) fn end_round(&mut self) {
        self.rounds.anew_mark = self.rounds.anew;
        self.rounds.maps.clear();
        self.rounds.last_map = None;
        self.rounds.count = 0;
        for (l, v) in self.rounds.places.iter_mut().enumerate() {
            let reached = self.sizes.at(l as u32).allocs;
            v.truncate(v.partition_point(|p| p.0 < reached));
        }
        self.sizes.reset_allocs();
        let r = &mut self.rounds;
        for (l, v) in r.places.iter().enumerate() {
            self.sizes.at_mut(l as u32).replay_next = v.first().map_or(u32::MAX, |p| p.0);
            r.count += v.len();
            for &(_, m, va, _) in v {
                note_map(&mut r.maps, &mut r.last_map, m, va);
            }
        }
    }

    /// Whether a place of this round or the previous one is in mapping `m` (re-forming it
    /// over other pages would move those places to pages that other blocks of the round
    /// use, and the round could not be replayed).
    pub(super) fn in_rounds(&self, m: u32) -> bool {
        let va = self.map(m).va;
        self.rounds.maps.get(&m) == Some(&va)
    }

    /// Whether the allocation of `size` now being served is of a rank the previous round
    /// placed on its slow path (`round_place`'s first test, made here so that the usual
    /// answer, no, costs no call).
    #[inline]
    pub(super) fn round_due(&self, size: u64) -> bool {
        self.sizes.find(size).is_some_and(|l| {
            let sl = self.sizes.at(l);
            sl.allocs == sl.replay_next
        })
    }

    /// The place the allocation of `size` now being served had in the previous round (the
    /// k-th allocation of a size takes the previous round's k-th), if only cached blocks
    /// are in it now: `(mapping, offset, the cached blocks in it)`.
    fn round_place(&mut self, dev: &mut dyn Device, size: u64) -> Option<(u32, u64, Occupants)> {
        if self.faults.forget_rounds {
            return None;
        }
        // only a rank that the previous round placed on its slow path has a place
        let sl = self.sizes.at(self.sizes.find(size)?);
        if sl.allocs != sl.replay_next {
            return None;
        }
        let (k, i) = (sl.allocs, sl.replay_at as usize);
        let v = self.rounds.places.get(self.sizes.find(size)? as usize)?;
        let &(rank, m, va, off) = v.get(i)?;
        if rank != k {
            return None;
        }
        self.place_free(dev, m, va, off, size)
    }

    /// Whether `[off, off + size)` of mapping `m` (still at `va`) holds only cached blocks
    /// (pending ones are released by one synchronization, as a remembered place's round had
    /// them released by then): `(mapping, offset, the cached blocks in it)`.
    pub(super) fn place_free(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        va: u64,
        off: u64,
        size: u64,
    ) -> Option<(u32, u64, Occupants)> {
        let mp = self.maps.get(m as usize)?.as_ref()?;
        if mp.va != va || off + size > mp.pages.len() as u64 * self.gran {
            return None;
        }
        match self.occupants(m, off, size) {
            o @ (Occupants::Cached(_) | Occupants::Exact(_)) => Some((m, off, o)),
            Occupants::Live if self.faults.replay_over_live => {
                Some((m, off, Occupants::Cached(Vec::new())))
            }
            Occupants::Live => None,
            Occupants::Pending => {
                // blocks freed with `cudaFree` wait there: one synchronization releases
                // every pending block
                if dev.is_capturing() {
                    return None;
                }
                if self.faults.replay_unsynced {
                    // the pending blocks released as if a synchronization had been made
                    self.epoch += 1;
                } else if self.do_sync(dev).is_err() {
                    return None;
                }
                self.flush_pending();
                match self.occupants(m, off, size) {
                    o @ (Occupants::Cached(_) | Occupants::Exact(_)) => Some((m, off, o)),
                    _ => None,
                }
            }
        }
    }

    /// Place the allocation of `size` on stream `t` where it was in the previous round, if
    /// that place is free but for cached blocks: the cached block there when it is one of
    /// this very size at this very place (a hit, as the previous round may have had), else a
    /// new block with the cached blocks in the way dissolved.
    pub(super) fn round_commit(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Option<Slot>, PoolError> {
        let Some((m, off, occupants)) = self.round_place(dev, size) else {
            return Ok(None);
        };
        self.rounds.replays += 1;
        let slot = self.commit_place(dev, m, off, occupants, size, t, req)?;
        if matches!(slot, Some(Slot::New(..))) {
            self.rounds.anew += 1;
        }
        Ok(slot)
    }

    /// Serve the allocation of `size` on stream `t` at a free place (`place_free`'s
    /// answer): the cached block there when it is one of this very size at this very place,
    /// else a new block with the cached blocks in the way dissolved.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_place(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        off: u64,
        occupants: Occupants,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Option<Slot>, PoolError> {
        let victims = match occupants {
            Occupants::Exact(a) => {
                if let Some(a) = self.take_cached(dev, a, size, t, req) {
                    return Ok(Some(Slot::Hit(a)));
                }
                vec![a]
            }
            Occupants::Cached(v) => v,
            Occupants::Live | Occupants::Pending => return Ok(None),
        };
        self.commit_over(dev, m, off, victims, size, t)
    }

    /// A new block of `size` on stream `t` at `off` in mapping `m`, over the cached blocks
    /// `victims` there (dissolved first): a round's place replayed, or a kept range's carve.
    pub(super) fn commit_over(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        off: u64,
        victims: Vec<u64>,
        size: u64,
        t: Stream,
    ) -> Result<Option<Slot>, PoolError> {
        for v in victims {
            self.dissolve(dev, v);
        }
        Ok(self
            .try_commit(dev, Plan::Existing { map: m, off }, size, t)?
            .map(|(m, o)| Slot::New(m, o)))
    }

    /// Take the cached block at `addr` (of `size`) for a request of `req` bytes on stream
    /// `t`, if it may be handed out on `t` (at once, or behind its free stream's work).
    fn take_cached(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Option<u64> {
        let id = self.blocks.id(addr)?;
        let (epoch, ignore) = (self.epoch, self.faults.ignore_streams);
        let b = self.blocks.at_mut(id);
        if b.state != BState::Cached || b.size != size {
            return None;
        }
        let list = b.list;
        let r = Self::compat_at(b, t, epoch, ignore)?;
        self.reuse_on(dev, t, r).ok()?;
        let cached = &mut self.sizes.at_mut(list).cached;
        let i = cached.iter().rposition(|&x| x == id)?;
        cached.remove(i);
        self.ncached -= 1;
        self.stats.cached -= size;
        // its LRU entry goes stale (skipped: the block is no longer cached)
        let b = self.blocks.at_mut(id);
        let old_ev = b.event.take();
        b.state = BState::Live;
        b.req = req;
        b.stream = t;
        if let Some(ev) = old_ev {
            self.ev_unref(dev, ev);
        }
        Some(addr)
    }

    /// What holds bytes of `[off, off + size)` of mapping `m` now.
    pub(super) fn occupants(&self, m: u32, off: u64, size: u64) -> Occupants {
        // the usual case of a repeated round: the block there is of this very place
        let at = self.map(m).va + off;
        if let Some(b) = self.blocks.get(at)
            && b.map == m
            && b.off == off
            && b.size == size
        {
            return match b.state {
                BState::Cached => Occupants::Exact(at),
                BState::Pending => Occupants::Pending,
                BState::Live | BState::Vacant => Occupants::Live,
            };
        }
        let mut victims = Vec::new();
        let mut pending = false;
        for (p, s, e) in self.pieces(&self.map(m).pages, off, size) {
            // a page's blocks hold disjoint byte ranges: walk back from `e` until one ends
            // at or before `s`
            for (_, &(oe, a)) in self.page(p).occ.range(..e).rev() {
                if oe <= s {
                    break;
                }
                match self.blocks.get(a).map(|b| b.state) {
                    Some(BState::Cached) => {
                        if !victims.contains(&a) {
                            victims.push(a);
                        }
                    }
                    Some(BState::Pending) => pending = true,
                    _ => return Occupants::Live,
                }
            }
        }
        if pending {
            Occupants::Pending
        } else {
            Occupants::Cached(victims)
        }
    }
}

pub(super) enum Occupants {
    /// the cached block of this very place (of this size)
    Exact(u64),
    /// only cached blocks (these), or nothing
    Cached(Vec<u64>),
    /// a live block
    Live,
    /// pending blocks, and no live one
    Pending,
}
