//! Mappings: making a placement real (reserving and mapping address ranges over pages) and
//! unmapping mappings that are no longer worth keeping.

use super::*;

impl Stitch {
    /// Make `plan` real for a block of `size` bytes on stream `t`.
    pub(super) fn commit(
        &mut self,
        dev: &mut dyn Device,
        plan: Plan,
        size: u64,
        t: Stream,
    ) -> Result<(u32, u64), PoolError> {
        let cls = self.class_of(size);
        let (pages, off, existing, repair) = match plan {
            Plan::Existing { map, off } => (self.map(map).pages.clone(), off, Some(map), None),
            Plan::New { pages, off } => {
                let pressure = self.reform_pressure(dev, size);
                match self.repairable(&pages, pressure) {
                    Some((m, pages, round)) => (pages, off, None, Some((m, round))),
                    None => (pages, off, None, None),
                }
            }
        };
        let pieces = self.pieces(&pages, off, size);
        // stream safety of the free bytes we are about to take
        let mut need_sync = false;
        let mut waits: Vec<EventId> = Vec::new();
        let mut order: Vec<Stream> = Vec::new();
        for &(p, _, _) in &pieces {
            self.purge_fences(dev, p);
            for f in &self.page(p).fences {
                if f.stream == t || self.faults.ignore_streams {
                    continue;
                }
                match f.event {
                    _ if t == crate::ANY_STREAM || f.stream == crate::ANY_STREAM => {
                        need_sync = true
                    }
                    Some(ev) => {
                        if !waits.contains(&ev) {
                            waits.push(ev)
                        }
                    }
                    // a retired stream's handle may name another stream now
                    None if is_retired(f.stream) => need_sync = true,
                    None => {
                        if !order.contains(&f.stream) {
                            order.push(f.stream)
                        }
                    }
                }
            }
        }
        if !need_sync {
            for &ev in &waits {
                if dev.stream_wait_event(t, ev).is_err() {
                    need_sync = true;
                    break;
                }
                self.stats.stream_waits += 1;
            }
        }
        if !need_sync {
            for &s in &order {
                if self.order_after(dev, t, s).is_err() {
                    need_sync = true;
                    break;
                }
            }
        }
        if need_sync {
            self.do_sync(dev)?;
        }
        let map = match (existing, repair) {
            (Some(m), _) => m,
            (None, Some((m, round))) => {
                self.repair_mapping(dev, m, &pages)?;
                if round {
                    self.pressure_reforms += 1;
                }
                m
            }
            (None, None) => self.new_mapping(dev, pages)?,
        };
        let addr = self.map(map).va + off;
        if !self.faults.skip_take {
            for &(p, s, e) in &pieces {
                // the fault switches' carve, replayed place or arena window over a live
                // block: its bytes are not free
                if (self.faults.kept_over_live
                    || self.faults.replay_over_live
                    || self.faults.grow_over_live
                    || self.faults.hold_over_live
                    || self.faults.ends_over_live
                    || self.faults.run_end_over_live
                    || self.faults.guard_over_live)
                    && !self.bytes_free(p, s, e)
                {
                    continue;
                }
                self.take(p, s, e, cls);
                self.page_mut(p).occ.insert(s, (e, addr));
            }
        }
        self.map_mut(map).users += 1;
        Ok((map, off))
    }

    /// Commit, or `None` if the plan needs a synchronization that stream capture forbids.
    pub(super) fn try_commit(
        &mut self,
        dev: &mut dyn Device,
        plan: Plan,
        size: u64,
        t: Stream,
    ) -> Result<Option<(u32, u64)>, PoolError> {
        match self.commit(dev, plan, size, t) {
            Ok(x) => Ok(Some(x)),
            Err(PoolError::Device(DeviceError::NotPermitted)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(super) fn new_mapping(
        &mut self,
        dev: &mut dyn Device,
        pages: Vec<u32>,
    ) -> Result<u32, PoolError> {
        let len = pages.len() as u64 * self.gran;
        self.new_mapping_in(dev, pages, len)
    }

    /// A new mapping of `pages` at the start of a reservation of `reserve` bytes (at least
    /// the pages' length).
    pub(super) fn new_mapping_in(
        &mut self,
        dev: &mut dyn Device,
        pages: Vec<u32>,
        reserve: u64,
    ) -> Result<u32, PoolError> {
        let g = self.gran;
        let len = pages.len() as u64 * g;
        let reserve = reserve.max(len);
        // a mapping that grows in place (the arena) has a reservation of its own; the others
        // take their range from the pool's chunks (see `vas`)
        let own_va = reserve > len;
        // a stitched range with room to grow into, with `grow` on
        let carve = if own_va { len } else { self.grow_room(len) };
        let va = if own_va {
            dev.reserve(reserve)
        } else {
            self.va_take(dev, carve)
        }
        .map_err(PoolError::Device)?;
        let give_back = |s: &mut Self, dev: &mut dyn Device| {
            if own_va {
                let _ = dev.unreserve(va, reserve);
            } else {
                s.va_put(dev, va, carve);
            }
        };
        if let Err((e, done)) = self.map_pages(dev, va, &pages) {
            if done > 0 {
                let _ = dev.unmap(va, done);
            }
            give_back(self, dev);
            return Err(PoolError::Device(e));
        }
        if let Err(e) = dev.set_access(va, len) {
            let _ = dev.unmap(va, len);
            give_back(self, dev);
            return Err(PoolError::Device(e));
        }
        let n = pages.len();
        let mapping = Mapping {
            va,
            reserved: if own_va { reserve } else { carve },
            own_va,
            pages,
            users: 0,
            busy_until: 0,
            busy_on: Vec::new(),
            busy_sync_only: false,
        };
        // Places of blocks are remembered as (slot, address) and recognised by both (see
        // `ghost`, `rounds`, `kept`): a dropped mapping's address range is taken again (see
        // `vas`), so a new mapping never gets a slot whose last mapping had its address
        let slot = self
            .free_map_slots
            .iter()
            .rposition(|&(_, old)| old != va)
            .map(|i| self.free_map_slots.remove(i).0);
        let id = match slot {
            Some(id) => {
                self.maps[id as usize] = Some(mapping);
                id
            }
            None => {
                self.maps.push(Some(mapping));
                (self.maps.len() - 1) as u32
            }
        };
        let pl = self.map(id).pages.clone();
        for p in pl {
            let pg = self.page_mut(p);
            if !pg.maps.contains(&id) {
                pg.maps.push(id);
            }
        }
        self.maps_by_len.entry(n).or_default().push(id);
        self.maps_by_va.insert(va, id);
        self.nmaps += 1;
        self.update_reserved();
        Ok(id)
    }

    pub(super) fn drop_mapping(&mut self, dev: &mut dyn Device, m: u32) -> Result<(), PoolError> {
        let g = self.gran;
        let (va, n, reserved, own_va) = {
            let mp = self.map(m);
            debug_assert_eq!(mp.users, 0);
            (mp.va, mp.pages.len(), mp.reserved, mp.own_va)
        };
        let len = n as u64 * g;
        dev.unmap(va, len).map_err(PoolError::Device)?;
        if own_va {
            let _ = dev.unreserve(va, reserved);
        } else {
            self.va_put(dev, va, reserved);
        }
        if self.arena == Some(m) {
            self.arena = None;
        }
        let mp = self.maps[m as usize].take().unwrap();
        for p in mp.pages {
            let pg = self.page_mut(p);
            pg.maps.retain(|&x| x != m);
        }
        if let Some(l) = self.maps_by_len.get_mut(&n) {
            l.retain(|&x| x != m);
        }
        self.maps_by_va.remove(&va);
        self.free_map_slots.push((m, va));
        self.nmaps -= 1;
        self.idle_gen += 1;
        self.update_reserved();
        Ok(())
    }

    /// Unmap cached mappings nobody uses once there are too many of them (bounded VA and
    /// bookkeeping under a workload whose shapes keep changing). Only mappings no stream may
    /// still use are dropped (`map_busy`: no synchronization needed).
    pub(super) fn gc_mappings(&mut self, dev: &mut dyn Device) {
        let limit = 2 * self.npages + 64;
        if self.nmaps <= limit {
            return;
        }
        // mappings whose streams have passed the frees through them may go too
        self.settle_busy(dev);
        let mut victims = Vec::new();
        for (i, m) in self.maps.iter().enumerate() {
            if let Some(m) = m
                && m.users == 0
                && self.arena != Some(i as u32)
                && !self.map_busy(i as u32)
            {
                victims.push(i as u32);
                if self.nmaps - (victims.len() as u64) <= self.npages + 32 {
                    break;
                }
            }
        }
        for m in victims {
            if self.drop_mapping(dev, m).is_err() {
                break;
            }
        }
    }
}

impl Stitch {
    /// Under a budget: an unused mapping of as many pages as `pages` (a new mapping's plan)
    /// that already maps most of them, the plan's pages reordered to its slots (whole free
    /// pages in the middle may go in any order; the first and last stay first and last, as
    /// their free suffix and prefix are what the block's head and tail take), and whether it
    /// is a mapping that a round's places are in.
    /// Remapping only the slots that differ costs fewer driver calls than a new mapping:
    /// a pool whose free pages drift between passes of a repeating workload (a budget keeps
    /// few spare) re-forms the ranges of its largest blocks out of the ranges it has.
    ///
    /// `pressure` (the device is nearly full, see `pressure`): mappings that a round's
    /// places are in may be re-formed too.
    pub(super) fn repairable(
        &self,
        pages: &[u32],
        pressure: bool,
    ) -> Option<(u32, Vec<u32>, bool)> {
        self.budget?;
        let n = pages.len();
        if n < 3 {
            return None;
        }
        // slots are remapped one page at a time: pages of runs are mapped only whole
        if pages.iter().any(|&p| self.page(p).run > 1) {
            return None;
        }
        let list = self.maps_by_len.get(&n)?;
        let inner: crate::fxhash::FxMap<u32, ()> =
            pages[1..n - 1].iter().map(|&p| (p, ())).collect();
        // (slots to remap, mapping, its page list for the plan)
        let mut best: Option<(usize, u32, Vec<u32>)> = None;
        // (mapping, whether it is a round's: re-formed only under pressure)
        let mut best_round = false;
        for &m in list.iter().rev().take(MAP_SCAN) {
            let mp = self.map(m);
            let round = self.in_rounds(m);
            if round && !pressure {
                continue;
            }
            // the fault switch under pressure: a round's mapping whatever uses it
            let unchecked = round && self.faults.pressure_reform_used;
            // (the fault switch takes only mappings in use: their blocks' bytes would move)
            // slots are remapped one page at a time: a mapping of runs is never re-formed
            if mp.pages.iter().any(|&q| self.page(q).run > 1) {
                continue;
            }
            if !unchecked && ((mp.users != 0) != self.faults.repair_used || self.arena == Some(m)) {
                continue;
            }
            // a stream may still touch the mapping's addresses (a block freed through it
            // stream-ordered, not yet covered: `map_busy`): unmapping any of it must wait, as
            // for dropping a mapping
            if !unchecked && self.map_busy(m) {
                continue;
            }
            let mut out = vec![u32::MAX; n];
            out[0] = pages[0];
            out[n - 1] = pages[n - 1];
            let mut used = crate::fxhash::FxMap::default();
            for (slot, &q) in out[1..n - 1].iter_mut().zip(&mp.pages[1..n - 1]) {
                if inner.contains_key(&q) && used.insert(q, ()).is_none() {
                    *slot = q;
                }
            }
            let mut rest = pages[1..n - 1].iter().filter(|p| !used.contains_key(p));
            for slot in out.iter_mut().take(n - 1).skip(1) {
                if *slot == u32::MAX {
                    *slot = *rest.next()?;
                }
            }
            let differ = (0..n).filter(|&i| out[i] != mp.pages[i]).count();
            if best.as_ref().is_none_or(|b| differ < b.0) {
                best = Some((differ, m, out));
                best_round = round;
            }
        }
        let (differ, m, out) = best?;
        // a new mapping costs n + 1 calls (n maps, one access call: its addresses come from
        // the pool's chunks, see `vas`) and one unmap when it is dropped; a repair about 2 per
        // slot (unmap, map) + 1. The unmap is counted because the new mapping's is as
        // certain as the repair's (docs/benchmarks.md, "The price of a new mapping", has the
        // price without it)
        (2 * differ + 1 < n + 2).then_some((m, out, best_round))
    }

    /// Remap the slots of unused mapping `m` whose page is not `pages`' (see
    /// [`Self::repairable`]), then make the mapping accessible again.
    pub(super) fn repair_mapping(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        pages: &[u32],
    ) -> Result<(), PoolError> {
        let g = self.gran;
        let va = self.map(m).va;
        let old = self.map(m).pages.clone();
        let mut i = 0;
        while i < old.len() {
            if old[i] == pages[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < old.len() && old[i] != pages[i] {
                i += 1;
            }
            dev.unmap(va + start as u64 * g, (i - start) as u64 * g)
                .map_err(PoolError::Device)?;
            for (k, &q) in old.iter().enumerate().take(i).skip(start) {
                self.page_mut(q).maps.retain(|&x| x != m);
                // keep the books true even if a map below fails: the slot is empty
                self.map_mut(m).pages[k] = u32::MAX;
            }
            for (k, &q) in pages.iter().enumerate().take(i).skip(start) {
                let h = self.page(q).handle;
                if let Err(e) = dev.map(va + k as u64 * g, h, 1) {
                    if k > start {
                        let _ = dev.unmap(va + start as u64 * g, (k - start) as u64 * g);
                    }
                    self.drop_broken_mapping(dev, m);
                    return Err(PoolError::Device(e));
                }
            }
            for (k, &q) in pages.iter().enumerate().take(i).skip(start) {
                self.map_mut(m).pages[k] = q;
                let pg = self.page_mut(q);
                if !pg.maps.contains(&m) {
                    pg.maps.push(m);
                }
            }
        }
        // a page that moved to another slot of this mapping lost it from its list when its
        // old slot was unmapped (after its new one was mapped): it is still mapped here
        for &q in pages {
            let pg = self.page_mut(q);
            if !pg.maps.contains(&m) {
                pg.maps.push(m);
            }
        }
        if let Err(e) = dev.set_access(va, old.len() as u64 * g) {
            self.drop_broken_mapping(dev, m);
            return Err(PoolError::Device(e));
        }
        self.repairs += 1;
        self.idle_gen += 1;
        Ok(())
    }

    /// A mapping a failed repair left with empty slots: unmap what is mapped and forget it.
    fn drop_broken_mapping(&mut self, dev: &mut dyn Device, m: u32) {
        let g = self.gran;
        let (va, pages, reserved, own_va) = {
            let mp = self.map(m);
            (mp.va, mp.pages.clone(), mp.reserved, mp.own_va)
        };
        for (k, &p) in pages.iter().enumerate() {
            if p != u32::MAX {
                let _ = dev.unmap(va + k as u64 * g, g);
                self.page_mut(p).maps.retain(|&x| x != m);
            }
        }
        if own_va {
            let _ = dev.unreserve(va, reserved);
        } else {
            self.va_put(dev, va, reserved);
        }
        let n = pages.len();
        if let Some(l) = self.maps_by_len.get_mut(&n) {
            l.retain(|&x| x != m);
        }
        self.maps[m as usize] = None;
        self.maps_by_va.remove(&va);
        self.free_map_slots.push((m, va));
        self.nmaps -= 1;
        self.idle_gen += 1;
        self.update_reserved();
    }
}
