//! The exact-size cache of freed blocks: the hot path, taking a cached block on a stream,
//! and dissolving cached blocks back into their pages (least recently freed first).

use super::*;

impl Stitch {
    /// Take a cached block of `size` for a request of `req` bytes on stream `t`.
    pub(super) fn cache_take(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Option<u64> {
        // the hot path of a repeating workload: one lookup of the size's list; its blocks
        // are slab indices (disjoint fields borrowed together)
        let (epoch, ignore) = (self.epoch, self.faults.ignore_streams);
        let l = self.sizes.find(size)?;
        let n = self.sizes.at(l).cached.len();
        let mut found = None;
        for i in (n.saturating_sub(FAST_SCAN)..n).rev() {
            let id = self.sizes.at(l).cached[i];
            // with lifetime classes, a block is reused only by its own class
            if self.lives && !self.block_life_ok(id) {
                continue;
            }
            let list = &mut self.sizes.at_mut(l).cached;
            let b = self.blocks.at_mut(id);
            match Self::compat_at(b, t, epoch, ignore) {
                Some(Reuse::Now) => {
                    // at once: take it here
                    if i + 1 == n {
                        list.pop();
                    } else {
                        list.remove(i);
                    }
                    // the block freed last is usually the one taken (a repeating pair):
                    // drop its LRU entry now rather than leave it stale for compaction
                    let c = if size <= self.gran / 2 { SMALL } else { LARGE };
                    if self.lru[c].back() == Some(&(b.seq, b.addr)) {
                        self.lru[c].pop_back();
                    }
                    let old_ev = b.event.take();
                    b.state = BState::Live;
                    b.req = req;
                    b.stream = t;
                    let a = b.addr;
                    self.last_taken = Some((a, b.map, b.off));
                    self.ncached -= 1;
                    self.stats.cached -= size;
                    if let Some(ev) = old_ev {
                        self.ev_unref(dev, ev);
                    }
                    return Some(a);
                }
                Some(r) => {
                    found = Some((i, id, r));
                    break;
                }
                None => {}
            }
        }
        // behind another stream's work: order `t` after it first
        let (i, id, r) = found?;
        self.sizes.at_mut(l).cached.remove(i);
        self.ncached -= 1;
        self.stats.cached -= size;
        if self.reuse_on(dev, t, r).is_err() {
            // cannot order: put it back and let the slow path decide
            self.sizes.at_mut(l).cached.insert(i, id);
            self.ncached += 1;
            self.stats.cached += size;
            return None;
        }
        let b = self.blocks.at_mut(id);
        let old_ev = b.event.take();
        b.state = BState::Live;
        b.req = req;
        b.stream = t;
        let a = b.addr;
        self.last_taken = Some((a, b.map, b.off));
        if let Some(ev) = old_ev {
            self.ev_unref(dev, ev);
        }
        Some(a)
    }

    /// The hot path of [`Policy::alloc`]: the block of this size freed last, when it may be
    /// handed out on stream `t` at once with no device call (freed on `t`, or released by a
    /// synchronization since, and no event to drop). `None`: the general path decides (it
    /// would take the same block in this case; this is only the short way to it).
    ///
    /// Not when a tight pool's round ends with this allocation (nothing live, see `quiet`):
    /// [`Policy::alloc`] forgets the layout first, and a block taken here would carry the
    /// ended round's layout into the next one, which then is not the round the pool replays.
    #[inline]
    pub fn alloc_cached(&mut self, req: u64, t: Stream) -> Option<u64> {
        if self.stats.live == 0 && self.layout_due() {
            return None;
        }
        self.alloc_hit(req, t)
    }

    /// [`Stitch::alloc_cached`] once a round that ends has been seen to.
    #[inline]
    pub(super) fn alloc_hit(&mut self, req: u64, t: Stream) -> Option<u64> {
        if self.gran == 0
            || self.slow_only
            || (!self.pending.is_empty() && self.flushed_epoch != self.epoch)
        {
            return None;
        }
        let size = round_up(req.max(1), ALIGN);
        let l = self.sizes.find(size)?;
        let sl = self.sizes.at_mut(l);
        if sl.allocs == sl.replay_next {
            return None;
        }
        let &id = sl.cached.last()?;
        let b = self.blocks.at_mut(id);
        if b.event.is_some() || !(b.free_stream == t || b.epoch < self.epoch) {
            return None;
        }
        sl.cached.pop();
        sl.allocs = sl.allocs.wrapping_add(1);
        let c = if size <= self.gran / 2 { SMALL } else { LARGE };
        if self.lru[c].back() == Some(&(b.seq, b.addr)) {
            self.lru[c].pop_back();
        }
        b.state = BState::Live;
        b.req = req;
        b.stream = t;
        self.ncached -= 1;
        self.stats.cached -= size;
        self.stats.cache_hits += 1;
        self.stats.allocs += 1;
        self.stats.add_live(req);
        Some(b.addr)
    }

    /// Give a cached block's bytes back to its pages.
    pub(super) fn dissolve(&mut self, dev: &mut dyn Device, addr: u64) {
        let (id, b) = self.blocks.remove(addr).unwrap();
        debug_assert_eq!(b.state, BState::Cached);
        let list = &mut self.sizes.at_mut(b.list).cached;
        if let Some(i) = list.iter().rposition(|&x| x == id) {
            list.remove(i);
        }
        self.ncached -= 1;
        self.stats.cached -= b.size;
        let fence = (b.epoch >= self.epoch).then_some(Fence {
            stream: b.free_stream,
            event: b.event,
            epoch: b.epoch,
            seq: b.seq,
        });
        if fence.is_some() {
            self.mark_busy(dev, b.map, b.free_stream, b.seq, b.epoch);
        }
        let pages = self.map(b.map).pages.clone();
        for (p, s, e) in self.pieces(&pages, b.off, b.size) {
            if !self.faults.skip_take {
                self.give(p, s, e);
                self.page_mut(p).occ.remove(&s);
            }
            if let Some(f) = fence {
                self.add_fence(dev, p, f);
            }
        }
        if let Some(ev) = b.event {
            self.ev_unref(dev, ev);
        }
        self.map_mut(b.map).users -= 1;
        self.idle_gen += 1;
    }

    /// Dissolve cached blocks, least recently freed first, until `want` bytes were given
    /// back (at least one block). Returns false if nothing was cached.
    pub(super) fn dissolve_some(&mut self, dev: &mut dyn Device, want: u64) -> bool {
        // the older of the two classes' heads first
        let c = match (self.lru[SMALL].front(), self.lru[LARGE].front()) {
            (Some(s), Some(l)) => {
                if s.0 <= l.0 {
                    SMALL
                } else {
                    LARGE
                }
            }
            (Some(_), None) => SMALL,
            _ => LARGE,
        };
        self.dissolve_class(dev, want, c) || self.dissolve_class(dev, want, 1 - c)
    }

    pub(super) fn dissolve_class(&mut self, dev: &mut dyn Device, want: u64, class: usize) -> bool {
        let mut done = 0u64;
        let mut any = false;
        while let Some((seq, a)) = self.lru[class].pop_front() {
            let Some(b) = self.blocks.get(a) else {
                continue;
            };
            if b.state != BState::Cached || b.seq != seq {
                continue;
            }
            done += b.size;
            self.dissolve(dev, a);
            any = true;
            if done >= want {
                break;
            }
        }
        any
    }

    pub(super) fn compact_lru(&mut self) {
        if self.lru[0].len() + self.lru[1].len() > 2 * self.ncached + 1024 {
            let blocks = &self.blocks;
            for l in &mut self.lru {
                l.retain(|&(seq, a)| {
                    blocks
                        .get(a)
                        .is_some_and(|b| b.state == BState::Cached && b.seq == seq)
                });
            }
        }
    }
}
