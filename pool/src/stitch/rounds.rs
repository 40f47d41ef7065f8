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
//! Bounded: at most `ROUND_PLACES` places are remembered per round (a job that is never
//! idle has one long round; the rest of it is not remembered).

use super::*;

/// Places remembered per round, at most.
const ROUND_PLACES: usize = 1 << 16;

/// Where an allocation went: (its rank among the round's allocations of its size, mapping,
/// the mapping's address, offset).
type Place = (u32, u32, u64, u64);

/// The places of this round and of the previous one.
#[derive(Default)]
pub(super) struct Rounds {
    /// this round's allocations that reached the slow path: size -> (how many of the size
    /// came before it in the round, mapping, its address, offset), in order
    now: FxMap<u64, Vec<Place>>,
    /// places remembered in this round
    count: usize,
    /// the previous round's
    prev: FxMap<u64, Vec<Place>>,
    /// mappings (and their addresses) that places of either round are in
    maps: FxMap<u32, u64>,
}

impl Stitch {
    /// Remember where a request of `size` that missed the fast path went (a block at `addr`).
    pub(super) fn note_round(&mut self, size: u64, addr: u64) {
        if self.rounds.count >= ROUND_PLACES || self.faults.forget_rounds {
            return;
        }
        let Some(b) = self.blocks.get(addr) else {
            return;
        };
        let (m, off) = (b.map, b.off);
        let va = self.map(m).va;
        let k = self.rank(size);
        self.rounds
            .now
            .entry(size)
            .or_default()
            .push((k, m, va, off));
        self.rounds.maps.insert(m, va);
        self.rounds.count += 1;
    }

    /// Nothing is live and the layout is forgotten: this round becomes the previous one.
    pub(super) fn end_round(&mut self) {
        let now = std::mem::take(&mut self.rounds.now);
        self.rounds.maps.clear();
        for v in now.values() {
            for &(_, m, va, _) in v {
                self.rounds.maps.insert(m, va);
            }
        }
        self.rounds.count = 0;
        self.sizes.reset_allocs();
        for (&size, v) in &now {
            if let (Some(l), Some(p)) = (self.sizes.find(size), v.first()) {
                self.sizes.at_mut(l).replay_next = p.0;
            }
        }
        self.rounds.prev = now;
    }

    /// After an allocation of `size` on the slow path: the next rank of the size that the
    /// previous round placed on its slow path.
    pub(super) fn next_replay(&mut self, size: u64) {
        let Some(l) = self.sizes.find(size) else {
            return;
        };
        let sl = self.sizes.at(l);
        if sl.replay_next >= sl.allocs {
            return;
        }
        let k = sl.allocs;
        let next = self.rounds.prev.get(&size).and_then(|v| {
            let i = v.partition_point(|p| p.0 < k);
            v.get(i).map(|p| p.0)
        });
        self.sizes.at_mut(l).replay_next = next.unwrap_or(u32::MAX);
    }

    /// How many allocations of `size` this round made before the one being served.
    fn rank(&self, size: u64) -> u32 {
        self.sizes.find(size).map_or(0, |l| self.sizes.at(l).allocs)
    }

    /// Whether a place of this round or the previous one is in mapping `m` (re-forming it
    /// over other pages would move those places to pages that other blocks of the round
    /// use, and the round could not be replayed).
    pub(super) fn in_rounds(&self, m: u32) -> bool {
        let va = self.map(m).va;
        self.rounds.maps.get(&m) == Some(&va)
    }

    /// The place the allocation of `size` now being served had in the previous round (the
    /// k-th allocation of a size takes the previous round's k-th), if only cached blocks
    /// are in it now: `(mapping, offset, cached blocks to dissolve)`.
    pub(super) fn round_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
    ) -> Option<(u32, u64, Vec<u64>)> {
        if self.faults.forget_rounds {
            return None;
        }
        // only a rank that the previous round placed on its slow path has a place
        let sl = self.sizes.at(self.sizes.find(size)?);
        if sl.allocs != sl.replay_next {
            return None;
        }
        let k = sl.allocs;
        let v = self.rounds.prev.get(&size)?;
        let i = v.binary_search_by_key(&k, |p| p.0).ok()?;
        let (_, m, va, off) = v[i];
        let mp = self.maps.get(m as usize)?.as_ref()?;
        if mp.va != va || off + size > mp.pages.len() as u64 * self.gran {
            return None;
        }
        match self.occupants(m, off, size) {
            Occupants::Cached(victims) => Some((m, off, victims)),
            Occupants::Live => None,
            Occupants::Pending => {
                // blocks freed with `cudaFree` wait there: the previous round had them
                // released by then; one synchronization releases every pending block
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
                    Occupants::Cached(victims) => Some((m, off, victims)),
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
        let Some((m, off, victims)) = self.round_place(dev, size) else {
            return Ok(None);
        };
        if let [a] = victims[..]
            && a == self.map(m).va + off
            && let Some(a) = self.take_cached(dev, a, size, t, req)
        {
            return Ok(Some(Slot::Hit(a)));
        }
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
        if let Some(s) = Self::compat_at(b, t, epoch, ignore)? {
            self.order_after(dev, t, s).ok()?;
        }
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
    fn occupants(&self, m: u32, off: u64, size: u64) -> Occupants {
        // the usual case of a repeated round: the block there is of this very place
        let at = self.map(m).va + off;
        if let Some(b) = self.blocks.get(at)
            && b.map == m
            && b.off == off
            && b.size == size
        {
            return match b.state {
                BState::Cached => Occupants::Cached(vec![at]),
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

enum Occupants {
    /// only cached blocks (these), or nothing
    Cached(Vec<u64>),
    /// a live block
    Live,
    /// pending blocks, and no live one
    Pending,
}
