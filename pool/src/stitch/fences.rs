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
//!
//! Page fences: the bytes of a block freed stream-ordered and dissolved before a
//! synchronization carry a fence on each page they lie in (another stream must be ordered
//! behind the free before it reuses them, and the page may not go back to the device while the
//! stream may still use them). A synchronization ends them; so do the same events: each
//! settle (`settle_busy`, at the mapping limit and, throttled, above the budget) also asks
//! about the streams of fences no event was yet seen past, records an event where none is in
//! flight, and once the device says a stream's event is complete, remembers the newest free
//! it covers (`passed`): fences up to it are no conditions any more, so a process that never
//! synchronizes the device still gets such pages back under its budget.
//!
//! Retired streams: a stream the program destroys may still run the work it was given (the
//! destroy returns at once), and a stream created later may get the same handle value (a
//! handle is the address of a driver object, and freed addresses are reused). Whatever is
//! keyed on the old stream (cached blocks freed on it, page fences, busy mappings and their
//! events) is re-keyed at the destroy ([`Stitch::retire_stream`]) on a retired id no request
//! names, ordered by an event recorded on the old stream just before it goes: a request on
//! the new stream waits on that event, never takes such a block "on the same stream". If no
//! event can be recorded (during a capture, or the driver refuses), only a synchronization
//! covers them.

use super::*;

/// Retired stream ids: this bit (no stream handle, per-thread stream id or `ANY_STREAM` has
/// it alone) and a count.
const RETIRED: Stream = 1 << 63;

/// Whether `s` is a retired stream's id (see "Retired streams").
pub(super) fn is_retired(s: Stream) -> bool {
    s & RETIRED != 0 && s != crate::ANY_STREAM
}

/// How a cached block may be handed out on a stream (see [`Stitch::compat_at`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Reuse {
    Now,
    After(Stream),
    Wait(EventId),
}

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
        if f.stream != crate::ANY_STREAM && self.fences_by_events() {
            // a settle may learn that its stream passed it (see "Page fences")
            self.busy_unsettled = true;
        }
        for e in dropped {
            self.ev_unref(dev, e);
        }
    }

    pub(super) fn purge_fences(&mut self, dev: &mut dyn Device, p: u32) {
        let epoch = self.epoch;
        if self.page(p).fences.is_empty() {
            return;
        }
        let passed = &self.passed;
        let until_sync = !self.fences_by_events();
        let pg = self.pages[p as usize].as_mut().unwrap();
        let mut dropped: Vec<EventId> = Vec::new();
        pg.fences.retain(|o| {
            let keep = o.epoch >= epoch
                && (until_sync || passed.get(&o.stream).is_none_or(|&at| at < o.seq));
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
        self.page(p)
            .fences
            .iter()
            .any(|f| f.epoch >= self.epoch && !self.fence_passed(f))
    }

    #[inline(always)]
    pub(super) fn do_sync(&mut self, dev: &mut dyn Device) -> Result<(), PoolError> {
        if dev.is_capturing() {
            return Err(PoolError::Device(DeviceError::NotPermitted));
        }
        dev.synchronize().map_err(PoolError::Device)?;
        self.stats.syncs += 1;
        self.epoch += 1;
        // every fence and busy mark is of an earlier epoch now
        self.passed.clear();
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

    /// May a cached block be handed out on stream `t`? `Some(Reuse::Now)`: at once;
    /// `Some(Reuse::After(s))`: after ordering `t` behind stream `s`'s work (an event recorded
    /// on `s` now, which covers the free, and `cudaStreamWaitEvent(t)`: no host
    /// synchronization); `Some(Reuse::Wait(e))`: after `t` waits on the event `e` recorded
    /// after the free (a retired stream's, see "Retired streams"); `None`: not without a
    /// synchronization.
    pub(super) fn compat_at(b: &Block, t: Stream, epoch: u64, ignore: bool) -> Option<Reuse> {
        if b.free_stream == t || b.epoch < epoch || ignore {
            Some(Reuse::Now)
        } else if t == crate::ANY_STREAM || b.free_stream == crate::ANY_STREAM {
            // no stream to order: only memory a synchronization covers
            None
        } else if let Some(ev) = b.event {
            Some(Reuse::Wait(ev))
        } else if is_retired(b.free_stream) {
            // no event was recorded before it went: only a synchronization covers it
            None
        } else {
            Some(Reuse::After(b.free_stream))
        }
    }

    /// Order stream `t` as `r` says (see [`Stitch::compat_at`]).
    pub(super) fn reuse_on(
        &mut self,
        dev: &mut dyn Device,
        t: Stream,
        r: Reuse,
    ) -> Result<(), DeviceError> {
        match r {
            Reuse::Now => Ok(()),
            Reuse::After(s) => self.order_after(dev, t, s),
            Reuse::Wait(ev) => {
                dev.stream_wait_event(t, ev)?;
                self.stats.stream_waits += 1;
                Ok(())
            }
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
        if self.fences_by_events() && self.passed.get(&stream).is_some_and(|&at| at >= free_seq) {
            // the stream is known past the free already: its addresses are unused
            return;
        }
        let sync_only = stream == crate::ANY_STREAM
            || self.faults.busy_until_sync
            // a retired stream gets no new event: only the one recorded before it went
            || (is_retired(stream) && !self.marks.contains_key(&stream))
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
    /// that stays behind.) Mappings a synchronization ended forget their streams. The page
    /// fences of dissolved bytes are settled by the same events (see "Page fences").
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
                self.settled += 1;
            } else {
                mp.busy_on = on;
            }
        }
        // the page fences of dissolved bytes: the same events say when their streams passed
        // the frees (see "Page fences")
        let by_events = self.fences_by_events();
        for pg in self.pages.iter().flatten().filter(|_| by_events) {
            for f in &pg.fences {
                if f.epoch < epoch
                    || f.stream == crate::ANY_STREAM
                    || self.passed.get(&f.stream).is_some_and(|&at| at >= f.seq)
                    || (is_retired(f.stream) && !self.marks.contains_key(&f.stream))
                {
                    continue;
                }
                let st = streams.entry(f.stream).or_insert_with(|| {
                    let done = self.marks.get(&f.stream).and_then(|&(ev, at)| {
                        (self.faults.busy_done_unasked || dev.event_done(ev)).then_some(at)
                    });
                    (done, false)
                });
                st.1 |= st.0.is_none_or(|at| at < f.seq);
            }
        }
        let mut learned = false;
        for (&s, &(done, _)) in &streams {
            if let Some(at) = done {
                let p = self.passed.entry(s).or_insert(0);
                if *p < at {
                    *p = at;
                    learned = true;
                }
            }
        }
        if learned && self.fences_by_events() {
            // fences the streams passed are no conditions any more
            for p in 0..self.pages.len() as u32 {
                if self.pages[p as usize]
                    .as_ref()
                    .is_some_and(|pg| !pg.fences.is_empty())
                {
                    self.purge_fences(dev, p);
                }
            }
            self.idle_gen += 1;
            self.settled += 1;
        }
        let mut left = false;
        for (s, (done, waits)) in streams {
            // a stream's event in flight stays until it completes
            if !waits || (self.marks.contains_key(&s) && done.is_none()) {
                left |= waits;
                if is_retired(s)
                    && !waits
                    && done.is_some()
                    && let Some((ev, _)) = self.marks.remove(&s)
                {
                    // nothing more will be asked of it (a later busy mark of the retired
                    // stream waits for a synchronization instead)
                    dev.destroy_event(ev);
                }
                continue;
            }
            left = true;
            if is_retired(s) {
                // its handle may name another stream now (never reached: a retired stream's
                // mark covers every free on it, see `retire_stream`)
                continue;
            }
            if let Ok(ev) = dev.record_event(s) {
                self.stats.events_recorded += 1;
                if let Some((old, _)) = self.marks.insert(s, (ev, self.seq)) {
                    dev.destroy_event(old);
                }
            }
        }
        // mappings in use are asked about once unused, at a later settle
        self.busy_unsettled = left
            || self.maps.iter().flatten().any(|mp| !mp.busy_on.is_empty())
            || (by_events
                && (0..self.pages.len() as u32)
                    .any(|p| self.pages[p as usize].is_some() && self.has_active_fence(p)));
    }

    /// Whether stream `f.stream` is known to have passed the free that fence `f` stands for
    /// (an event recorded on it after the free was seen complete: see "Page fences").
    pub(super) fn fence_passed(&self, f: &Fence) -> bool {
        self.fences_by_events() && self.passed.get(&f.stream).is_some_and(|&at| at >= f.seq)
    }

    /// Whether the events recorded on streams clear page fences (and spare busy marks of
    /// frees known passed): only with `Stitch::with_event_settles`, and off under either
    /// switch of the rules before those events.
    fn fences_by_events(&self) -> bool {
        self.event_settles && !self.faults.fences_until_sync && !self.faults.busy_until_sync
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
        self.passed.clear();
        self.busy_unsettled = false;
    }

    /// The program destroys stream `s` (called just before the driver's destroy, while `s`
    /// still names it): see "Retired streams". Whatever the pool keys on `s` and no
    /// synchronization covers yet is re-keyed on a retired id, ordered by one event recorded
    /// on `s` now (blocks and page fences) and, for busy mappings, by the stream's mark (a
    /// second event, so that a mark in flight is replaced by one that covers every free).
    pub fn retire_stream(&mut self, dev: &mut dyn Device, s: Stream) {
        if self.faults.ignore_retired || s == crate::ANY_STREAM || is_retired(s) {
            return;
        }
        let epoch = self.epoch;
        let blocks: Vec<u32> = self
            .blocks
            .cached_ids()
            .filter(|&id| {
                let b = self.blocks.at(id);
                b.free_stream == s && b.epoch >= epoch
            })
            .collect();
        let fenced: Vec<u32> = (0..self.pages.len() as u32)
            .filter(|&p| {
                self.pages[p as usize]
                    .as_ref()
                    .is_some_and(|pg| pg.fences.iter().any(|f| f.stream == s && f.epoch >= epoch))
            })
            .collect();
        let busy = self
            .maps
            .iter()
            .flatten()
            .any(|mp| mp.busy_until > epoch && mp.busy_on.iter().any(|&(x, _)| x == s));
        if blocks.is_empty() && fenced.is_empty() && !busy {
            if let Some((ev, _)) = self.marks.remove(&s) {
                dev.destroy_event(ev);
            }
            self.passed.remove(&s);
            return;
        }
        self.retired += 1;
        let r = RETIRED | self.retired;
        // an event query or record during a capture would break it
        let capturing = dev.is_capturing();
        let mut record = |st: &mut Stats| {
            let ev = (!capturing).then(|| dev.record_event(s).ok()).flatten();
            if ev.is_some() {
                st.events_recorded += 1;
            }
            ev
        };
        let ev = if blocks.is_empty() && fenced.is_empty() {
            None
        } else {
            record(&mut self.stats)
        };
        // the stream's mark covers everything keyed on it: busy mappings, and the fences of
        // its blocks and bytes once it is seen complete (see "Page fences")
        let mark = record(&mut self.stats);
        for id in blocks {
            let b = self.blocks.at_mut(id);
            b.free_stream = r;
            debug_assert!(
                b.event.is_none(),
                "a block keyed on a live stream has no event"
            );
            b.event = ev;
            if let Some(ev) = ev {
                self.ev_ref(ev);
            }
        }
        for p in fenced {
            let pg = self.page_mut(p);
            let mut n = 0;
            for f in pg.fences.iter_mut() {
                if f.stream == s && f.epoch >= epoch {
                    f.stream = r;
                    debug_assert!(f.event.is_none());
                    f.event = ev;
                    n += 1;
                }
            }
            if let Some(ev) = ev {
                for _ in 0..n {
                    self.ev_ref(ev);
                }
            }
        }
        if let Some((old, _)) = self.marks.remove(&s) {
            dev.destroy_event(old);
        }
        // what was learned of the old stream says nothing of a new one with its handle
        self.passed.remove(&s);
        if let Some(m) = mark {
            self.marks.insert(r, (m, self.seq));
            self.busy_unsettled = true;
        }
        for mp in self.maps.iter_mut().flatten() {
            if mp.busy_until <= epoch {
                continue;
            }
            if mark.is_some() {
                for e in mp.busy_on.iter_mut() {
                    if e.0 == s {
                        e.0 = r;
                    }
                }
            } else if mp.busy_on.iter().any(|&(x, _)| x == s) {
                mp.busy_on.clear();
                mp.busy_sync_only = true;
            }
        }
    }
}
