//! Stream conditions: events and per-page fences that say when freed bytes may be reused on
//! another stream, the per-mapping mark that says when a mapping may be unmapped
//! (`Stitch::map_busy`), and the synchronizations that release `cudaFree`d blocks.
//!
//! Busy mappings: a block freed stream-ordered and given back to its pages before a
//! synchronization leaves its mapping busy (its stream may still use those addresses). A
//! synchronization ends that; so does the stream passing the free, which the pool learns
//! without one: the mapping remembers the free's stream and number, and when the pool looks
//! for mappings to drop (`settle_busy`) it records an event on that stream (one in flight per
//! stream) and, at a later look, asks the device whether it is complete. A process that never
//! synchronizes the device (it waits for its own stream, or the stream simply runs) would
//! otherwise keep every such mapping for good. No event is recorded or asked about during a
//! capture (a query there is capture-unsafe), and a free on no particular stream or during a
//! capture waits for a synchronization.

use super::*;

impl Stitch {
    pub(super) fn ev_ref(&mut self, ev: EventId) {
        *self.events.entry(ev).or_insert(0) += 1;
    }

    pub(super) fn ev_unref(&mut self, dev: &mut dyn Device, ev: EventId) {
        if let Some(n) = self.events.get_mut(&ev) {
            *n -= 1;
            if *n == 0 {
                self.events.remove(&ev);
                dev.destroy_event(ev);
            }
        }
    }

    pub(super) fn add_fence(&mut self, dev: &mut dyn Device, p: u32, f: Fence) {
        let epoch = self.epoch;
        let pg = self.page_mut(p);
        // a later free on the same stream already covers this one
        if pg
            .fences
            .iter()
            .any(|o| o.epoch >= epoch && o.stream == f.stream && o.seq >= f.seq)
        {
            return;
        }
        let mut dropped: Vec<EventId> = Vec::new();
        pg.fences.retain(|o| {
            let keep = o.epoch >= epoch && o.stream != f.stream;
            if !keep && let Some(e) = o.event {
                dropped.push(e);
            }
            keep
        });
        pg.fences.push(f);
        if let Some(ev) = f.event {
            self.ev_ref(ev);
        }
        for e in dropped {
            self.ev_unref(dev, e);
        }
    }

    pub(super) fn purge_fences(&mut self, dev: &mut dyn Device, p: u32) {
        let epoch = self.epoch;
        let pg = self.page_mut(p);
        if pg.fences.is_empty() {
            return;
        }
        let mut dropped: Vec<EventId> = Vec::new();
        pg.fences.retain(|o| {
            let keep = o.epoch >= epoch;
            if !keep && let Some(e) = o.event {
                dropped.push(e);
            }
            keep
        });
        for e in dropped {
            self.ev_unref(dev, e);
        }
    }

    /// Whether a stream may still use mapping `m`'s addresses: a block freed through it
    /// stream-ordered was given back to its pages since the last synchronization. Only the
    /// mapping the block was in: the page fences say when the *bytes* may be reused, and a
    /// page is in other mappings too, whose addresses no stream used for that block.
    pub(super) fn map_busy(&self, m: u32) -> bool {
        let mp = self.map(m);
        !self.faults.unmap_busy
            && (mp.busy_until > self.epoch
                || self.faults.page_fenced_maps
                    && mp.pages.iter().any(|&p| self.has_active_fence(p)))
    }

    pub(super) fn has_active_fence(&self, p: u32) -> bool {
        self.page(p).fences.iter().any(|f| f.epoch >= self.epoch)
    }

    #[inline(always)]
    pub(super) fn do_sync(&mut self, dev: &mut dyn Device) -> Result<(), PoolError> {
        if dev.is_capturing() {
            return Err(PoolError::Device(DeviceError::NotPermitted));
        }
        dev.synchronize().map_err(PoolError::Device)?;
        self.stats.syncs += 1;
        self.epoch += 1;
        self.frees_since_sync = false;
        self.flush_pending();
        Ok(())
    }

    /// Pending blocks freed before the last synchronization become cached.
    pub(super) fn flush_pending(&mut self) {
        let epoch = self.epoch;
        self.flushed_epoch = epoch;
        let mut i = 0;
        let half = self.gran / 2;
        while i < self.pending.len() {
            let id = self.pending[i];
            let b = self.blocks.at_mut(id);
            if b.epoch < epoch {
                b.state = BState::Cached;
                self.seq += 1;
                b.seq = self.seq;
                let (size, seq, a) = (b.size, b.seq, b.addr);
                let list = self.sizes.at_mut(b.list);
                list.cached.push(id);
                list.pending -= 1;
                let c = if size <= half { SMALL } else { LARGE };
                self.lru[c].push_back((seq, a));
                self.ncached += 1;
                self.stats.cached += size;
                self.pending_bytes -= size;
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// May a cached block be handed out on stream `t`? `Some(None)`: at once;
    /// `Some(Some(s))`: after ordering `t` behind stream `s`'s work (an event recorded on `s`
    /// now, which covers the free, and `cudaStreamWaitEvent(t)`: no host synchronization);
    /// `None`: not without a synchronization.
    pub(super) fn compat_at(
        b: &Block,
        t: Stream,
        epoch: u64,
        ignore: bool,
    ) -> Option<Option<Stream>> {
        if b.free_stream == t || b.epoch < epoch || ignore {
            Some(None)
        } else if t == crate::ANY_STREAM || b.free_stream == crate::ANY_STREAM {
            // no stream to order: only memory a synchronization covers
            None
        } else {
            Some(Some(b.free_stream))
        }
    }

    /// Order stream `t` after everything enqueued on stream `s` so far.
    pub(super) fn order_after(
        &mut self,
        dev: &mut dyn Device,
        t: Stream,
        s: Stream,
    ) -> Result<(), DeviceError> {
        let ev = dev.record_event(s)?;
        self.stats.events_recorded += 1;
        let r = dev.stream_wait_event(t, ev);
        dev.destroy_event(ev);
        r?;
        self.stats.stream_waits += 1;
        Ok(())
    }

    pub(super) fn purge_fences_all_of(&mut self, dev: &mut dyn Device, p: u32) {
        let fences = std::mem::take(&mut self.page_mut(p).fences);
        for f in fences {
            if let Some(e) = f.event {
                self.ev_unref(dev, e);
            }
        }
    }

    /// Synchronize (if blocks are pending and no capture forbids it) and take a cached block.
    pub(super) fn sync_and_take(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        req: u64,
    ) -> Result<Option<u64>, PoolError> {
        if self.pending.is_empty() || dev.is_capturing() {
            return Ok(None);
        }
        self.do_sync(dev)?;
        Ok(self.cache_take(dev, size, t, req))
    }

    /// Pending (cudaFree'd) bytes worth one synchronization on a cache miss: an eighth of
    /// what the pool holds, at least two pages.
    pub(super) fn pending_limit(&self) -> u64 {
        (self.npages * self.gran / 8).max(2 * self.gran)
    }

    /// Mapping `m` is busy for a block freed on `stream` (free number `free_seq`, in epoch
    /// `free_epoch`) whose bytes were just given back: until a synchronization, or until an
    /// event recorded on `stream` after the free is complete.
    pub(super) fn mark_busy(
        &mut self,
        dev: &mut dyn Device,
        m: u32,
        stream: Stream,
        free_seq: u64,
        free_epoch: u64,
    ) {
        let epoch = self.epoch;
        let sync_only = stream == crate::ANY_STREAM
            || self.faults.busy_until_sync
            // a free captured into a graph is passed when the graph runs, not the stream
            || dev.is_capturing();
        let mp = self.map_mut(m);
        // a mapping no longer busy starts afresh
        if mp.busy_until <= epoch {
            mp.busy_on.clear();
            mp.busy_sync_only = false;
        }
        mp.busy_until = mp.busy_until.max(free_epoch + 1);
        if sync_only {
            mp.busy_on.clear();
            mp.busy_sync_only = true;
        } else if !mp.busy_sync_only {
            match mp.busy_on.iter_mut().find(|(s, _)| *s == stream) {
                Some(e) => e.1 = e.1.max(free_seq),
                None => mp.busy_on.push((stream, free_seq)),
            }
            self.busy_unsettled = true;
        }
    }

    /// Let unused busy mappings whose streams have passed the frees through them go: each
    /// stream has at most one event in flight (`marks`), recorded after the frees it covers;
    /// once the device says it is complete, the mappings it covers are no longer busy on that
    /// stream, and a new one is recorded for the frees after it. (One in flight: an event
    /// replaced by a newer one before it completes would never be seen complete on a stream
    /// that stays behind.) Mappings a synchronization ended forget their streams.
    pub(super) fn settle_busy(&mut self, dev: &mut dyn Device) {
        // an event query or record during a capture would break it
        if !self.busy_unsettled || dev.is_capturing() {
            return;
        }
        let epoch = self.epoch;
        // per stream: (covered up to this free, if its event is complete), whether a free
        // after that waits
        let mut streams: FxMap<Stream, (Option<u64>, bool)> = FxMap::default();
        for m in 0..self.maps.len() as u32 {
            let Some(mp) = self.maps[m as usize].as_ref() else {
                continue;
            };
            if mp.busy_on.is_empty() {
                continue;
            }
            if mp.busy_until <= epoch {
                let mp = self.map_mut(m);
                mp.busy_on.clear();
                mp.busy_sync_only = false;
                continue;
            }
            if mp.users != 0 || mp.busy_sync_only {
                continue;
            }
            let mut on = std::mem::take(&mut self.map_mut(m).busy_on);
            on.retain(|&(s, seq)| {
                let st = streams.entry(s).or_insert_with(|| {
                    let done = self.marks.get(&s).and_then(|&(ev, at)| {
                        (self.faults.busy_done_unasked || dev.event_done(ev)).then_some(at)
                    });
                    (done, false)
                });
                let covered = st.0.is_some_and(|at| at >= seq);
                st.1 |= !covered;
                !covered
            });
            let mp = self.map_mut(m);
            if on.is_empty() {
                mp.busy_until = 0;
                self.idle_gen += 1;
            } else {
                mp.busy_on = on;
            }
        }
        let mut left = false;
        for (s, (done, waits)) in streams {
            // a stream's event in flight stays until it completes
            if !waits || (self.marks.contains_key(&s) && done.is_none()) {
                left |= waits;
                continue;
            }
            left = true;
            if let Ok(ev) = dev.record_event(s) {
                self.stats.events_recorded += 1;
                if let Some((old, _)) = self.marks.insert(s, (ev, self.seq)) {
                    dev.destroy_event(old);
                }
            }
        }
        // mappings in use are asked about once unused, at a later settle
        self.busy_unsettled = left || self.maps.iter().flatten().any(|mp| !mp.busy_on.is_empty());
    }

    /// After a synchronization: no mapping is busy, no event is needed.
    pub(super) fn drop_busy_events(&mut self, dev: &mut dyn Device) {
        for mp in self.maps.iter_mut().flatten() {
            mp.busy_on.clear();
            mp.busy_sync_only = false;
        }
        for (_, (ev, _)) in self.marks.drain() {
            dev.destroy_event(ev);
        }
        self.busy_unsettled = false;
    }
}
