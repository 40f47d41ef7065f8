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
        let (pages, off, existing) = match plan {
            Plan::Existing { map, off } => (self.map(map).pages.clone(), off, Some(map)),
            Plan::New { pages, off } => (pages, off, None),
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
        let map = match existing {
            Some(m) => m,
            None => self.new_mapping(dev, pages)?,
        };
        let addr = self.map(map).va + off;
        if !self.faults.skip_take {
            for &(p, s, e) in &pieces {
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
        let va = dev.reserve(reserve).map_err(PoolError::Device)?;
        for (i, &p) in pages.iter().enumerate() {
            let h = self.page(p).handle;
            if let Err(e) = dev.map(va + i as u64 * g, h) {
                if i > 0 {
                    let _ = dev.unmap(va, i as u64 * g);
                }
                let _ = dev.unreserve(va, reserve);
                return Err(PoolError::Device(e));
            }
        }
        if let Err(e) = dev.set_access(va, len) {
            let _ = dev.unmap(va, len);
            let _ = dev.unreserve(va, reserve);
            return Err(PoolError::Device(e));
        }
        let n = pages.len();
        let mapping = Mapping {
            va,
            reserved: reserve,
            pages,
            users: 0,
        };
        let id = match self.free_map_slots.pop() {
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
        let (va, n, reserved) = {
            let mp = self.map(m);
            debug_assert_eq!(mp.users, 0);
            (mp.va, mp.pages.len(), mp.reserved)
        };
        let len = n as u64 * g;
        dev.unmap(va, len).map_err(PoolError::Device)?;
        let _ = dev.unreserve(va, reserved);
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
        self.free_map_slots.push(m);
        self.nmaps -= 1;
        self.update_reserved();
        Ok(())
    }

    /// Unmap cached mappings nobody uses once there are too many of them (bounded VA and
    /// bookkeeping under a workload whose shapes keep changing). Only mappings whose pages
    /// carry no pending stream condition are dropped (no synchronization needed).
    pub(super) fn gc_mappings(&mut self, dev: &mut dyn Device) {
        let limit = 2 * self.npages + 64;
        if self.nmaps <= limit {
            return;
        }
        let mut victims = Vec::new();
        for (i, m) in self.maps.iter().enumerate() {
            if let Some(m) = m
                && m.users == 0
                && self.arena != Some(i as u32)
                && !m.pages.iter().any(|&p| self.has_active_fence(p))
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
