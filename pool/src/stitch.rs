//! `stitch`: virtual-memory stitching with packed page tails.
//!
//! Physical memory is held in granularity-sized pages (one handle each). A block is a byte
//! range `[off, off + size)` of a *mapping*: a reserved address range with a list of pages
//! mapped one after another. Any free page can back any block, so there is no external
//! fragmentation above a page. Page tails are packed: every page has a byte-range
//! sub-allocator (512-B units), a block may take a shared page's free *suffix* as its head,
//! whole free pages in the middle and another shared page's free *prefix* as its tail, and
//! blocks under a page go into any free range of a shared page. One physical page may be
//! mapped in several mappings (at several addresses); blocks own *physical* byte ranges, so
//! two blocks never overlap physically whatever their addresses.
//!
//! Speed: a freed block stays formed (mapping and bytes kept) in a cache keyed by size, so a
//! repeated request of the same size is a hash lookup; mappings stay cached and are reused
//! when their pages' needed bytes are free, so a repeating workload makes no driver calls.
//! Formed free blocks are dissolved (bytes given back to their pages, least recently freed
//! first) only when a request cannot be placed otherwise; physical growth comes last.
//!
//! Stream rules: a `FreeMode::Sync` block waits in `pending` until a synchronization (one
//! device sync releases every pending block; the process's own syncs count). The pool
//! synchronizes when a request misses the cache while its exact-size twin is pending (and at
//! least `SYNC_BATCH` blocks are), before it would grow for such a twin, once pending bytes
//! reach an eighth of the pool, and at the cap before dissolving cached blocks: exact reuse is
//! what keeps a `cudaMalloc`/`cudaFree` workload within 5% of its peak live bytes. A
//! `FreeMode::Async { stream: s }` block is reusable at once on `s`; on another stream after a
//! synchronization, or by making that stream wait on an event recorded on `s` when the block
//! changes streams (it covers the free; `cudaStreamWaitEvent`, no host synchronization, and
//! no event at all on the same-stream fast path). Bytes of dissolved blocks carry the same
//! condition as a per-page fence. No synchronization during capture.

use crate::blocks::{BState, Block, Blocks, SizeLists};
use crate::device::{Device, DeviceError, EventId, Handle, Stream};
use crate::fxhash::FxMap;
use crate::{ALIGN, Alloc, FreeMode, Policy, PoolError, Request, Stats, round_up};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How many cached blocks of one size the fast path looks at.
const FAST_SCAN: usize = 8;
/// Pending (cudaFree'd) blocks worth a synchronization when one of them is the exact size a
/// request misses.
const SYNC_BATCH: usize = 8;
/// How many cached mappings of one length a placement looks at.
const MAP_SCAN: usize = 64;
/// Page classes: blocks up to half a page are "small" and share pages with each other;
/// larger blocks share their heads and tails with each other. A class takes the other's
/// free bytes only before the pool would otherwise grow or fail (keeps long-lived small
/// blocks from pinning the pages that large blocks need).
const SMALL: usize = 0;
const LARGE: usize = 1;

#[derive(Clone, Copy, Debug)]
struct Fence {
    stream: Stream,
    event: Option<EventId>,
    epoch: u64,
    /// free order: of two fences on one stream the later free covers the earlier
    seq: u64,
}

struct Page {
    handle: Handle,
    /// free byte ranges start -> end
    free: BTreeMap<u64, u64>,
    used: u64,
    /// blocks (live, pending or cached) holding bytes here: start -> (end, block address)
    occ: BTreeMap<u64, (u64, u64)>,
    /// SMALL or LARGE: which blocks this page was first used for (while partly used)
    class: usize,
    maps: Vec<u32>,
    fences: Vec<Fence>,
}

struct Mapping {
    va: u64,
    pages: Vec<u32>,
    /// blocks (live, pending or cached) placed in this mapping
    users: u32,
}

/// What the slow path found: a cached block (after a synchronization released it), or a
/// new block's place `(mapping, offset)`.
enum Slot {
    Hit(u64),
    New(u32, u64),
}

/// Where a new block goes: an existing mapping, or new pages to map.
enum Plan {
    Existing { map: u32, off: u64 },
    New { pages: Vec<u32>, off: u64 },
}

/// Testing switches that break a safety rule on purpose (to prove the checks can fail).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Hand out blocks freed with `cudaFree` at once, without waiting for a sync.
    pub reuse_sync_frees_early: bool,
    /// Reuse stream-ordered frees on any stream without waiting on their event.
    pub ignore_streams: bool,
    /// Do not mark a new block's bytes used (the next block may overlap it).
    pub skip_take: bool,
    /// The old, lazier synchronization: never synchronize for a freed twin of the request
    /// (place it elsewhere while the twin waits) and dissolve cached blocks before
    /// synchronizing at the cap. Not a safety fault: it proves the tightness tests can fail.
    pub lazy_sync: bool,
}

impl Faults {
    fn any(&self) -> bool {
        self.reuse_sync_frees_early || self.ignore_streams || self.skip_take || self.lazy_sync
    }
}

/// See the module documentation.
pub struct Stitch {
    gran: u64,
    pages: Vec<Option<Page>>,
    free_slots: Vec<u32>,
    npages: u64,
    /// pages with no used byte
    free_pages: BTreeSet<u32>,
    /// partly or fully used pages of the small class
    small_pages: BTreeSet<u32>,
    /// free ranges of partly used pages, per page class: (len, page, start)
    ranges: [BTreeSet<(u64, u32, u64)>; 2],
    /// partly used pages with a free prefix, per class: (len, page)
    prefix: [BTreeSet<(u64, u32)>; 2],
    /// partly used pages with a free suffix, per class: (len, page)
    suffix: [BTreeSet<(u64, u32)>; 2],
    maps: Vec<Option<Mapping>>,
    free_map_slots: Vec<u32>,
    nmaps: u64,
    maps_by_len: FxMap<usize, Vec<u32>>,
    maps_by_va: BTreeMap<u64, u32>,
    blocks: Blocks,
    /// the exact-size cache (and pending blocks counted by size)
    sizes: SizeLists,
    /// cached blocks in free order, per class (stale entries skipped)
    lru: [VecDeque<(u64, u64)>; 2],
    ncached: usize,
    /// `cudaFree`d blocks waiting for a synchronization (block indices)
    pending: Vec<u32>,
    epoch: u64,
    flushed_epoch: u64,
    /// bytes of `pending` blocks
    pending_bytes: u64,
    seq: u64,
    frees_since_sync: bool,
    events: FxMap<EventId, u32>,
    faults: Faults,
    /// soft limit over peak live beyond which cached blocks are dissolved before growing
    /// (None: cache until the device or cap refuses)
    headroom: Option<f64>,
    stats: Stats,
}

impl Default for Stitch {
    fn default() -> Self {
        Self::new()
    }
}

impl Stitch {
    pub fn new() -> Self {
        Stitch {
            gran: 0,
            pages: Vec::new(),
            free_slots: Vec::new(),
            npages: 0,
            free_pages: BTreeSet::new(),
            small_pages: BTreeSet::new(),
            ranges: Default::default(),
            prefix: Default::default(),
            suffix: Default::default(),
            maps: Vec::new(),
            free_map_slots: Vec::new(),
            nmaps: 0,
            maps_by_len: FxMap::default(),
            maps_by_va: BTreeMap::new(),
            blocks: Blocks::default(),
            sizes: SizeLists::default(),
            lru: Default::default(),
            ncached: 0,
            pending: Vec::new(),
            epoch: 0,
            flushed_epoch: 0,
            pending_bytes: 0,
            seq: 0,
            frees_since_sync: false,
            events: FxMap::default(),
            faults: Faults::default(),
            headroom: None,
            stats: Stats::default(),
        }
    }

    /// Soft limit: once the pool holds more than `peak_live * (1 + headroom)` bytes, a
    /// request that misses the cache dissolves cached blocks before the pool grows (tighter
    /// when memory is plentiful, at the cost of some driver calls in steady state). Default
    /// `None`: cache until the device or the cap refuses, then dissolve.
    pub fn with_headroom(mut self, headroom: Option<f64>) -> Self {
        self.headroom = headroom;
        self
    }

    /// Break safety rules on purpose (tests only).
    pub fn set_faults(&mut self, f: Faults) {
        self.faults = f;
    }

    /// Physical pages held.
    pub fn pages(&self) -> u64 {
        self.npages
    }

    /// Mappings held.
    pub fn mappings(&self) -> u64 {
        self.nmaps
    }

    /// Blocks freed and kept formed for reuse.
    pub fn cached_blocks(&self) -> usize {
        self.ncached
    }

    /// One line describing the page state (for debugging placement).
    #[doc(hidden)]
    pub fn debug_state(&self) -> String {
        let partial: Vec<&Page> = self
            .pages
            .iter()
            .flatten()
            .filter(|p| p.used > 0 && p.used < self.gran)
            .collect();
        let pfree: u64 = partial.iter().map(|p| self.gran - p.used).sum();
        let small_partial = partial.iter().filter(|p| p.class == SMALL).count();
        let small_free: u64 = partial
            .iter()
            .filter(|p| p.class == SMALL)
            .map(|p| self.gran - p.used)
            .sum();
        let full = self
            .pages
            .iter()
            .flatten()
            .filter(|p| p.used == self.gran)
            .count();
        let largest_suffix = self.suffix[LARGE]
            .iter()
            .next_back()
            .map(|x| x.0)
            .unwrap_or(0);
        let largest_prefix = self.prefix[LARGE]
            .iter()
            .next_back()
            .map(|x| x.0)
            .unwrap_or(0);
        format!(
            "small partial {small_partial} free {} KiB; pages {} (free {}, partial {}, full {}), partial free bytes {} KiB, largest suffix {} KiB, prefix {} KiB, cached {}, pending {}, live {} KiB, maps {}",
            small_free / 1024,
            self.npages,
            self.free_pages.len(),
            partial.len(),
            full,
            pfree / 1024,
            largest_suffix / 1024,
            largest_prefix / 1024,
            self.ncached,
            self.pending.len(),
            self.stats.live / 1024,
            self.nmaps
        )
    }

    fn page(&self, p: u32) -> &Page {
        self.pages[p as usize].as_ref().unwrap()
    }
    fn page_mut(&mut self, p: u32) -> &mut Page {
        self.pages[p as usize].as_mut().unwrap()
    }
    fn map(&self, m: u32) -> &Mapping {
        self.maps[m as usize].as_ref().unwrap()
    }
    fn map_mut(&mut self, m: u32) -> &mut Mapping {
        self.maps[m as usize].as_mut().unwrap()
    }

    fn update_reserved(&mut self) {
        let r = self.npages * self.gran;
        self.stats.set_reserved(r);
        self.stats.mappings = self.nmaps;
    }

    // ------------------------------------------------------------ page sub-allocator

    fn unindex(&mut self, p: u32) {
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

    fn index(&mut self, p: u32) {
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
    fn take(&mut self, p: u32, s: u64, e: u64, class: usize) {
        self.unindex(p);
        let pg = self.page_mut(p);
        if pg.used == 0 {
            pg.class = class;
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
    fn give(&mut self, p: u32, s: u64, e: u64) {
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

    fn free_prefix(&self, p: u32) -> u64 {
        let pg = self.page(p);
        if pg.used == 0 {
            return self.gran;
        }
        pg.free.get(&0).copied().unwrap_or(0)
    }

    fn free_suffix(&self, p: u32) -> u64 {
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
    fn pieces(&self, pages: &[u32], off: u64, size: u64) -> Vec<(u32, u64, u64)> {
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

    // ------------------------------------------------------------ events and fences

    fn ev_ref(&mut self, ev: EventId) {
        *self.events.entry(ev).or_insert(0) += 1;
    }

    fn ev_unref(&mut self, dev: &mut dyn Device, ev: EventId) {
        if let Some(n) = self.events.get_mut(&ev) {
            *n -= 1;
            if *n == 0 {
                self.events.remove(&ev);
                dev.destroy_event(ev);
            }
        }
    }

    fn add_fence(&mut self, dev: &mut dyn Device, p: u32, f: Fence) {
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

    fn purge_fences(&mut self, dev: &mut dyn Device, p: u32) {
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

    fn has_active_fence(&self, p: u32) -> bool {
        self.page(p).fences.iter().any(|f| f.epoch >= self.epoch)
    }

    // ------------------------------------------------------------ synchronization

    fn do_sync(&mut self, dev: &mut dyn Device) -> Result<(), PoolError> {
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
    fn flush_pending(&mut self) {
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
                self.pending_bytes -= size;
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    // ------------------------------------------------------------ cache

    /// May a cached block be handed out on stream `t`? `Some(None)`: at once;
    /// `Some(Some(s))`: after ordering `t` behind stream `s`'s work (an event recorded on `s`
    /// now, which covers the free, and `cudaStreamWaitEvent(t)`: no host synchronization);
    /// `None`: not without a synchronization.
    fn compat_at(b: &Block, t: Stream, epoch: u64, ignore: bool) -> Option<Option<Stream>> {
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
    fn order_after(
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

    /// Take a cached block of `size` for a request of `req` bytes on stream `t`.
    fn cache_take(&mut self, dev: &mut dyn Device, size: u64, t: Stream, req: u64) -> Option<u64> {
        // the hot path of a repeating workload: one lookup of the size's list; its blocks
        // are slab indices (disjoint fields borrowed together)
        let (epoch, ignore) = (self.epoch, self.faults.ignore_streams);
        let l = self.sizes.find(size)?;
        let list = &mut self.sizes.at_mut(l).cached;
        let n = list.len();
        let mut found = None;
        for i in (n.saturating_sub(FAST_SCAN)..n).rev() {
            let id = list[i];
            let b = self.blocks.at_mut(id);
            match Self::compat_at(b, t, epoch, ignore) {
                Some(None) => {
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
                    self.ncached -= 1;
                    if let Some(ev) = old_ev {
                        self.ev_unref(dev, ev);
                    }
                    return Some(a);
                }
                Some(Some(s)) => {
                    found = Some((i, id, s));
                    break;
                }
                None => {}
            }
        }
        // behind another stream's work: order `t` after it first
        let (i, id, s) = found?;
        self.sizes.at_mut(l).cached.remove(i);
        self.ncached -= 1;
        if self.order_after(dev, t, s).is_err() {
            // cannot order: put it back and let the slow path decide
            self.sizes.at_mut(l).cached.insert(i, id);
            self.ncached += 1;
            return None;
        }
        let b = self.blocks.at_mut(id);
        let old_ev = b.event.take();
        b.state = BState::Live;
        b.req = req;
        b.stream = t;
        let a = b.addr;
        if let Some(ev) = old_ev {
            self.ev_unref(dev, ev);
        }
        Some(a)
    }

    /// The hot path of [`Policy::alloc`]: the block of this size freed last, when it may be
    /// handed out on stream `t` at once with no device call (freed on `t`, or released by a
    /// synchronization since, and no event to drop). `None`: the general path decides (it
    /// would take the same block in this case; this is only the short way to it).
    #[inline]
    pub fn alloc_cached(&mut self, req: u64, t: Stream) -> Option<u64> {
        if self.gran == 0
            || self.faults.any()
            || (!self.pending.is_empty() && self.flushed_epoch != self.epoch)
        {
            return None;
        }
        let size = round_up(req.max(1), ALIGN);
        let l = self.sizes.find(size)?;
        let list = &mut self.sizes.at_mut(l).cached;
        let &id = list.last()?;
        let b = self.blocks.at_mut(id);
        if b.event.is_some() || !(b.free_stream == t || b.epoch < self.epoch) {
            return None;
        }
        list.pop();
        let c = if size <= self.gran / 2 { SMALL } else { LARGE };
        if self.lru[c].back() == Some(&(b.seq, b.addr)) {
            self.lru[c].pop_back();
        }
        b.state = BState::Live;
        b.req = req;
        b.stream = t;
        self.ncached -= 1;
        self.stats.cache_hits += 1;
        self.stats.allocs += 1;
        self.stats.add_live(req);
        Some(b.addr)
    }

    /// Give a cached block's bytes back to its pages.
    fn dissolve(&mut self, dev: &mut dyn Device, addr: u64) {
        let (id, b) = self.blocks.remove(addr).unwrap();
        debug_assert_eq!(b.state, BState::Cached);
        let list = &mut self.sizes.at_mut(b.list).cached;
        if let Some(i) = list.iter().rposition(|&x| x == id) {
            list.remove(i);
        }
        self.ncached -= 1;
        let fence = (b.epoch >= self.epoch).then_some(Fence {
            stream: b.free_stream,
            event: b.event,
            epoch: b.epoch,
            seq: b.seq,
        });
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
    }

    /// Dissolve cached blocks, least recently freed first, until `want` bytes were given
    /// back (at least one block). Returns false if nothing was cached.
    fn dissolve_some(&mut self, dev: &mut dyn Device, want: u64) -> bool {
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

    fn dissolve_class(&mut self, dev: &mut dyn Device, want: u64, class: usize) -> bool {
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

    fn compact_lru(&mut self) {
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

    // ------------------------------------------------------------ placement

    /// Best placement of `size` bytes with the pages held now, or None. `mix`: also use the
    /// other class's shared pages.
    fn place(&self, size: u64, mix: bool, allow_new: bool) -> Option<Plan> {
        let g = self.gran;
        let cls = self.class_of(size);
        let classes: &[usize] = match (mix, cls) {
            (false, SMALL) => &[SMALL],
            (false, _) => &[LARGE],
            (true, SMALL) => &[SMALL, LARGE],
            (true, _) => &[LARGE, SMALL],
        };
        // best fit (len, page) >= min over the allowed classes, skipping page `not`
        let best = |sets: &[BTreeSet<(u64, u32)>; 2], min: u64, not: Option<u32>| {
            classes
                .iter()
                .filter_map(|&c| {
                    sets[c]
                        .range((min, 0)..)
                        .find(|x| Some(x.1) != not)
                        .copied()
                })
                .min()
        };
        let largest = |sets: &[BTreeSet<(u64, u32)>; 2]| {
            classes
                .iter()
                .filter_map(|&c| sets[c].iter().next_back().copied())
                .max()
        };
        // A. existing mappings (no driver call)
        if size <= g {
            // best-fit free range of a shared page (always mapped somewhere)
            let r = classes
                .iter()
                .filter_map(|&c| self.ranges[c].range((size, 0, 0)..).next().copied())
                .min();
            if let Some((len, p, s)) = r
                && let Some(&m) = self.page(p).maps.first()
            {
                let e = s + len;
                // keep prefixes and suffixes whole for heads and tails
                let pos = if s == 0 && e < g { e - size } else { s };
                let idx = self.map(m).pages.iter().position(|&q| q == p).unwrap() as u64;
                return Some(Plan::Existing {
                    map: m,
                    off: idx * g + pos,
                });
            }
            // a free page that is mapped
            for &p in self.free_pages.iter().take(MAP_SCAN) {
                if let Some(&m) = self.page(p).maps.first() {
                    let idx = self.map(m).pages.iter().position(|&q| q == p).unwrap() as u64;
                    return Some(Plan::Existing {
                        map: m,
                        off: idx * g,
                    });
                }
            }
        }
        if cls == LARGE {
            let n_min = size.div_ceil(g) as usize;
            for n in [n_min.max(2), n_min.max(2) + 1] {
                let Some(list) = self.maps_by_len.get(&n) else {
                    continue;
                };
                for &m in list.iter().rev().take(MAP_SCAN) {
                    if let Some(off) = self.fit_in_mapping(m, size, classes) {
                        return Some(Plan::Existing { map: m, off });
                    }
                }
            }
        }
        if !allow_new {
            return None;
        }
        // B. new mapping over free resources
        let k0 = size / g;
        let r = size % g;
        let nfree = self.free_pages.len() as u64;
        let take_free =
            |k: u64| -> Vec<u32> { self.free_pages.iter().take(k as usize).copied().collect() };
        // Tier 1: no new holes. A partly used page's free end is consumed whole (head = its
        // whole free suffix, or tail = its whole free prefix) when that saves a fresh page;
        // the rest comes from fresh pages, whose leftover is again a clean prefix or suffix.
        if r > 0 && (cls == LARGE || mix) {
            // best fit >= r saves a fresh page; otherwise the largest free end still packs
            let head = best(&self.suffix, r, None);
            let tail = best(&self.prefix, r, None);
            let pick = match (head, tail) {
                (Some(h), Some(t)) => Some(if h.0 <= t.0 { (h, true) } else { (t, false) }),
                (Some(h), None) => Some((h, true)),
                (None, Some(t)) => Some((t, false)),
                (None, None) => match (largest(&self.suffix), largest(&self.prefix)) {
                    (Some(h), Some(t)) => Some(if h.0 >= t.0 { (h, true) } else { (t, false) }),
                    (Some(h), None) => Some((h, true)),
                    (None, Some(t)) => Some((t, false)),
                    (None, None) => None,
                },
            };
            if let Some(((len, p), use_head)) = pick
                && len < size
            {
                let rest = size - len;
                let n = rest.div_ceil(g);
                if nfree >= n {
                    let fresh = take_free(n);
                    return Some(if use_head {
                        let mut pages = vec![p];
                        pages.extend(fresh);
                        Plan::New {
                            pages,
                            off: g - len,
                        }
                    } else {
                        let mut pages = fresh;
                        pages.push(p);
                        Plan::New {
                            pages,
                            off: n * g - rest,
                        }
                    });
                }
            }
        }
        if nfree >= size.div_ceil(g) {
            return Some(Plan::New {
                pages: take_free(size.div_ceil(g)),
                off: 0,
            });
        }
        // Tier 2: use partly used pages' free ends even if that leaves a hole.
        if cls == LARGE || mix {
            if nfree >= k0 && r > 0 {
                // tail: best-fit prefix
                if let Some((_, t)) = best(&self.prefix, r, None) {
                    let mut pages = take_free(k0);
                    pages.push(t);
                    return Some(Plan::New { pages, off: 0 });
                }
                // head: best-fit suffix
                if let Some((_, h)) = best(&self.suffix, r, None) {
                    let mut pages = vec![h];
                    pages.extend(take_free(k0));
                    return Some(Plan::New { pages, off: g - r });
                }
                // split: largest suffix as head, best-fit prefix for the rest
                if let Some((hl, h)) = largest(&self.suffix) {
                    let need = r - hl.min(r);
                    if let Some((_, t)) = best(&self.prefix, need, Some(h)) {
                        let mut pages = vec![h];
                        pages.extend(take_free(k0));
                        pages.push(t);
                        return Some(Plan::New { pages, off: g - hl });
                    }
                }
            }
            if k0 >= 1 && nfree + 1 >= k0 {
                // one page fewer: head + tail make up a page plus the remainder
                if let Some((hl, h)) = largest(&self.suffix) {
                    let need = r + g - hl; // > r, <= g
                    if need < g
                        && let Some((_, t)) = best(&self.prefix, need, Some(h))
                    {
                        let mut pages = vec![h];
                        pages.extend(take_free(k0 - 1));
                        pages.push(t);
                        return Some(Plan::New { pages, off: g - hl });
                    }
                }
            }
        }
        None
    }

    fn class_of(&self, size: u64) -> usize {
        if size <= self.gran / 2 { SMALL } else { LARGE }
    }

    /// A cached mapping that can host `size` bytes once the cached blocks in the way are
    /// dissolved (live and pending blocks stay): `(mapping, offset, blocks to dissolve)`.
    /// This is what keeps a repeating workload free of driver calls: a request that misses
    /// the exact-size cache takes the mapping an earlier pass made for it.
    fn reuse_mapping(&self, size: u64) -> Option<(u32, u64, Vec<u64>)> {
        let g = self.gran;
        let n_min = size.div_ceil(g) as usize;
        let pinned = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| b.state != BState::Cached)
        };
        for n in [n_min, n_min + 1] {
            let Some(list) = self.maps_by_len.get(&n) else {
                continue;
            };
            'maps: for &m in list.iter().rev().take(MAP_SCAN) {
                let mp = self.map(m);
                let off = if n == 1 {
                    // a gap between pinned blocks of the page
                    let pg = self.page(mp.pages[0]);
                    let mut prev_end = 0u64;
                    let mut found = None;
                    for (&s, &(e, a)) in &pg.occ {
                        if !pinned(a) {
                            continue;
                        }
                        if s >= prev_end + size {
                            found = Some(prev_end);
                            break;
                        }
                        prev_end = prev_end.max(e);
                    }
                    if found.is_none() && g >= prev_end + size {
                        found = Some(prev_end);
                    }
                    match found {
                        Some(o) => o,
                        None => continue,
                    }
                } else {
                    for &p in &mp.pages[1..n - 1] {
                        if self.page(p).occ.values().any(|&(_, a)| pinned(a)) {
                            continue 'maps;
                        }
                    }
                    let head = self.page(mp.pages[0]);
                    let live_end = head
                        .occ
                        .iter()
                        .filter(|(_, (_, a))| pinned(*a))
                        .map(|(_, &(e, _))| e)
                        .max()
                        .unwrap_or(0);
                    let tail = self.page(mp.pages[n - 1]);
                    let live_start = tail
                        .occ
                        .iter()
                        .find(|(_, (_, a))| pinned(*a))
                        .map(|(&s, _)| s)
                        .unwrap_or(g);
                    let n = n as u64;
                    let lo = round_up(live_end.max(((n - 1) * g + 1).saturating_sub(size)), ALIGN);
                    let Some(top) = ((n - 1) * g + live_start).checked_sub(size) else {
                        continue;
                    };
                    let hi = (g - 1).min(top);
                    if lo > hi {
                        continue;
                    }
                    lo
                };
                let mut victims = Vec::new();
                for (p, s, e) in self.pieces(&mp.pages, off, size) {
                    for (_, &(oe, a)) in self.page(p).occ.range(..e) {
                        if oe > s && !victims.contains(&a) {
                            victims.push(a);
                        }
                    }
                }
                return Some((m, off, victims));
            }
        }
        None
    }

    /// Best-fit gap of at least `size` bytes between pinned (live or pending) blocks of a
    /// small page: `(mapping, offset, cached blocks to dissolve)`.
    fn reuse_small(&self, size: u64) -> Option<(u32, u64, Vec<u64>)> {
        let g = self.gran;
        let pinned = |a: u64| {
            self.blocks
                .get(a)
                .is_some_and(|b| b.state != BState::Cached)
        };
        let mut best: Option<(u64, u32, u64)> = None; // (gap len, page, offset)
        for &p in &self.small_pages {
            let pg = self.page(p);
            let mut prev_end = 0u64;
            let consider = |s: u64, e: u64, best: &mut Option<(u64, u32, u64)>| {
                if e >= s + size {
                    let len = e - s;
                    // keep a free prefix whole: place at its end
                    let pos = if s == 0 && e < g { e - size } else { s };
                    if best.is_none_or(|b| len < b.0) {
                        *best = Some((len, p, pos));
                    }
                }
            };
            for (&s, &(e, a)) in &pg.occ {
                if !pinned(a) {
                    continue;
                }
                consider(prev_end, s, &mut best);
                prev_end = prev_end.max(e);
            }
            consider(prev_end, g, &mut best);
        }
        let (_, p, pos) = best?;
        let m = *self.page(p).maps.first()?;
        let idx = self.map(m).pages.iter().position(|&q| q == p)? as u64;
        let mut victims = Vec::new();
        for (_, &(oe, a)) in self.page(p).occ.range(..pos + size) {
            if oe > pos && !victims.contains(&a) {
                victims.push(a);
            }
        }
        Some((m, idx * g + pos, victims))
    }

    /// Offset at which `size` bytes fit in mapping `m` spanning all its pages, if any.
    fn fit_in_mapping(&self, m: u32, size: u64, classes: &[usize]) -> Option<u64> {
        let g = self.gran;
        let mp = self.map(m);
        let n = mp.pages.len() as u64;
        if n < 2 {
            return None;
        }
        let ends = [mp.pages[0], mp.pages[n as usize - 1]];
        if ends.iter().any(|&p| {
            let pg = self.page(p);
            pg.used != 0 && !classes.contains(&pg.class)
        }) {
            return None;
        }
        for &p in &mp.pages[1..mp.pages.len() - 1] {
            if self.page(p).used != 0 {
                return None;
            }
        }
        let sf = self.free_suffix(mp.pages[0]);
        let pf = self.free_prefix(mp.pages[n as usize - 1]);
        let lo = (g - sf).max(((n - 1) * g + 1).saturating_sub(size));
        let lo = round_up(lo, ALIGN);
        let hi = (g - 1).min(((n - 1) * g + pf).checked_sub(size)?);
        (lo <= hi).then_some(lo)
    }

    /// Make `plan` real for a block of `size` bytes on stream `t`.
    fn commit(
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
    fn try_commit(
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

    fn new_mapping(&mut self, dev: &mut dyn Device, pages: Vec<u32>) -> Result<u32, PoolError> {
        let g = self.gran;
        let len = pages.len() as u64 * g;
        let va = dev.reserve(len).map_err(PoolError::Device)?;
        for (i, &p) in pages.iter().enumerate() {
            let h = self.page(p).handle;
            if let Err(e) = dev.map(va + i as u64 * g, h) {
                if i > 0 {
                    let _ = dev.unmap(va, i as u64 * g);
                }
                let _ = dev.unreserve(va, len);
                return Err(PoolError::Device(e));
            }
        }
        if let Err(e) = dev.set_access(va, len) {
            let _ = dev.unmap(va, len);
            let _ = dev.unreserve(va, len);
            return Err(PoolError::Device(e));
        }
        let n = pages.len();
        let mapping = Mapping {
            va,
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

    fn drop_mapping(&mut self, dev: &mut dyn Device, m: u32) -> Result<(), PoolError> {
        let g = self.gran;
        let (va, n) = {
            let mp = self.map(m);
            debug_assert_eq!(mp.users, 0);
            (mp.va, mp.pages.len())
        };
        let len = n as u64 * g;
        dev.unmap(va, len).map_err(PoolError::Device)?;
        let _ = dev.unreserve(va, len);
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

    fn grow(&mut self, dev: &mut dyn Device) -> Result<u32, DeviceError> {
        let h = dev.create()?;
        let g = self.gran;
        let page = Page {
            handle: h,
            free: BTreeMap::from([(0, g)]),
            used: 0,
            occ: BTreeMap::new(),
            class: LARGE,
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

    fn release_page(&mut self, dev: &mut dyn Device, p: u32) -> Result<(), PoolError> {
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

    fn purge_fences_all_of(&mut self, dev: &mut dyn Device, p: u32) {
        let fences = std::mem::take(&mut self.page_mut(p).fences);
        for f in fences {
            if let Some(e) = f.event {
                self.ev_unref(dev, e);
            }
        }
    }

    /// Unmap cached mappings nobody uses once there are too many of them (bounded VA and
    /// bookkeeping under a workload whose shapes keep changing). Only mappings whose pages
    /// carry no pending stream condition are dropped (no synchronization needed).
    fn gc_mappings(&mut self, dev: &mut dyn Device) {
        let limit = 2 * self.npages + 64;
        if self.nmaps <= limit {
            return;
        }
        let mut victims = Vec::new();
        for (i, m) in self.maps.iter().enumerate() {
            if let Some(m) = m
                && m.users == 0
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

    /// Place with what is held now: `allow_new` lets it map free pages into a new mapping.
    fn step_place(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
        mix: bool,
        allow_new: bool,
    ) -> Result<Option<(u32, u64)>, PoolError> {
        match self.place(size, mix, allow_new) {
            Some(plan) => self.try_commit(dev, plan, size, t),
            None => Ok(None),
        }
    }

    /// Create pages for the shortfall and place. `Ok(Err(e))`: the device or cap refused
    /// (after trying the other class's shared pages), with pages created here given back.
    fn step_grow(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        t: Stream,
    ) -> Result<Result<(u32, u64), DeviceError>, PoolError> {
        let g = self.gran;
        let want = size.div_ceil(g);
        let nfree = self.free_pages.len() as u64;
        let mut created: Vec<u32> = Vec::new();
        let mut shortfall = want.saturating_sub(nfree).max(1);
        for _attempt in 0..4 {
            let mut refused = None;
            for _ in 0..shortfall {
                match self.grow(dev) {
                    Ok(p) => created.push(p),
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
        // only reachable during capture: the bytes need a synchronization we may not make
        self.release_unused(dev, &created);
        Ok(Err(DeviceError::OutOfMemory))
    }

    fn alloc_slow(
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
            && let Some(a) = self.sync_and_take(dev, size, t, req)?
        {
            return Ok(Slot::Hit(a));
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
        // Grow-first mode (below the soft limit): keep cached blocks for exact reuse and
        // take free pages or new pages, like a caching allocator.
        let limit = self.soft_limit();
        if (self.npages + size.div_ceil(g)) * g <= limit {
            // A block of this very size waits for a synchronization: take it (one sync
            // releases every pending block) rather than place the request elsewhere while
            // its twin waits, which scatters both over shared pages.
            if !self.faults.lazy_sync
                && self.sizes.has_pending(size)
                && let Some(a) = self.sync_and_take(dev, size, t, req)?
            {
                return Ok(Slot::Hit(a));
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
            && let Some((m, off, victims)) = self.reuse_mapping(size)
        {
            for v in victims {
                self.dissolve(dev, v);
            }
            if let Some(x) = self.try_commit(dev, Plan::Existing { map: m, off }, size, t)? {
                return Ok(Slot::New(x.0, x.1));
            }
        }
        // 3. free pages under a new mapping
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

    /// Synchronize (if blocks are pending and no capture forbids it) and take a cached block.
    fn sync_and_take(
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
    fn pending_limit(&self) -> u64 {
        (self.npages * self.gran / 8).max(2 * self.gran)
    }

    /// Bytes the pool may hold before it prefers dissolving cached blocks to growing.
    fn soft_limit(&self) -> u64 {
        match self.headroom {
            None => u64::MAX,
            Some(h) => (self.stats.peak_live as f64 * (1.0 + h.max(0.0))) as u64,
        }
    }

    fn release_unused(&mut self, dev: &mut dyn Device, created: &[u32]) {
        for &p in created {
            if self.pages[p as usize].is_some() {
                let pg = self.page(p);
                if pg.used == 0 && pg.maps.is_empty() && pg.fences.is_empty() {
                    let _ = self.release_page(dev, p);
                }
            }
        }
    }
}

impl Policy for Stitch {
    fn name(&self) -> &'static str {
        "stitch"
    }

    fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError> {
        if let Some(e) = crate::refuse_oversized(&req, &self.stats) {
            return Err(e);
        }
        if let Some(addr) = self.alloc_cached(req.size, req.stream) {
            return Ok(Alloc {
                addr,
                size: round_up(req.size.max(1), ALIGN),
            });
        }
        if self.gran == 0 {
            self.gran = dev.granularity();
        }
        let t = req.stream;
        let size = round_up(req.size.max(1), ALIGN);
        if self.faults.reuse_sync_frees_early && !self.pending.is_empty() {
            self.epoch += 1;
            self.flush_pending();
        }
        if !self.pending.is_empty() && self.flushed_epoch != self.epoch {
            self.flush_pending();
        }
        let mut hit = self.cache_take(dev, size, t, req.size);
        if hit.is_none()
            && self.pending_bytes > 0
            && self.pending_bytes >= self.pending_limit()
            && !dev.is_capturing()
            && self.do_sync(dev).is_ok()
        {
            // enough cudaFree'd memory waits for a synchronization: one sync releases it all
            // (instead of growing while it waits)
            hit = self.cache_take(dev, size, t, req.size);
        }
        let slot = match hit {
            Some(a) => Ok(Slot::Hit(a)),
            None => self.alloc_slow(dev, size, t, req.size),
        };
        let addr = match slot {
            Ok(Slot::Hit(a)) => {
                self.stats.cache_hits += 1;
                a
            }
            slot => {
                let (map, off) = match slot {
                    Ok(Slot::Hit(_)) => unreachable!(),
                    Ok(Slot::New(m, o)) => (m, o),
                    Err(PoolError::OutOfMemory { why, .. }) => {
                        return Err(PoolError::OutOfMemory {
                            requested: req.size,
                            reserved: self.stats.reserved,
                            live: self.stats.live,
                            why,
                        });
                    }
                    Err(e) => return Err(e),
                };
                let addr = self.map(map).va + off;
                let list = self.sizes.intern(size);
                self.blocks.insert(Block {
                    addr,
                    list,
                    size,
                    req: req.size,
                    map,
                    off,
                    stream: t,
                    state: BState::Live,
                    free_stream: t,
                    event: None,
                    epoch: 0,
                    seq: 0,
                });
                self.gc_mappings(dev);
                addr
            }
        };
        self.stats.allocs += 1;
        self.stats.add_live(req.size);
        Ok(Alloc { addr, size })
    }

    fn free(&mut self, _dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError> {
        let epoch = self.epoch;
        let Some(id) = self.blocks.id(addr) else {
            return Err(PoolError::UnknownPointer(addr));
        };
        let b = self.blocks.at_mut(id);
        if b.state != BState::Live {
            return Err(PoolError::UnknownPointer(addr));
        }
        let req = b.req;
        b.epoch = epoch;
        self.frees_since_sync = true;
        self.stats.frees += 1;
        self.stats.live -= req;
        match mode {
            FreeMode::Sync => {
                b.state = BState::Pending;
                self.pending.push(id);
                self.pending_bytes += b.size;
                self.sizes.at_mut(b.list).pending += 1;
            }
            FreeMode::Async { stream } => {
                b.state = BState::Cached;
                b.free_stream = stream;
                self.seq += 1;
                b.seq = self.seq;
                let (size, seq) = (b.size, b.seq);
                self.sizes.at_mut(b.list).cached.push(id);
                let c = self.class_of(size);
                self.lru[c].push_back((seq, addr));
                self.ncached += 1;
                self.compact_lru();
            }
        }
        Ok(req)
    }

    fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError> {
        self.stats.trims += 1;
        if dev.is_capturing() || self.gran == 0 {
            return Ok(0);
        }
        if self.frees_since_sync || !self.pending.is_empty() {
            self.do_sync(dev)?;
        }
        self.flush_pending();
        while self.dissolve_some(dev, u64::MAX) {}
        let before = self.npages;
        for p in 0..self.pages.len() as u32 {
            if self.pages[p as usize].is_some() {
                self.purge_fences(dev, p);
            }
        }
        let unused: Vec<u32> = self
            .maps
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.as_ref().filter(|m| m.users == 0).map(|_| i as u32))
            .collect();
        for m in unused {
            self.drop_mapping(dev, m)?;
        }
        let free: Vec<u32> = self
            .free_pages
            .iter()
            .copied()
            .filter(|&p| self.page(p).maps.is_empty())
            .collect();
        for p in free {
            self.release_page(dev, p)?;
        }
        Ok((before - self.npages) * self.gran)
    }

    fn note_process_sync(&mut self) {
        self.stats.process_syncs += 1;
        self.epoch += 1;
        self.frees_since_sync = false;
    }

    fn owns(&self, addr: u64) -> bool {
        self.blocks
            .get(addr)
            .is_some_and(|b| b.state == BState::Live)
    }

    fn contains(&self, addr: u64) -> bool {
        self.maps_by_va
            .range(..=addr)
            .next_back()
            .is_some_and(|(&va, &m)| addr < va + self.map(m).pages.len() as u64 * self.gran)
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn reset(&mut self) {
        let stats = self.stats;
        let faults = self.faults;
        *self = Stitch::new();
        self.faults = faults;
        self.stats = Stats {
            reserved: 0,
            live: 0,
            mappings: 0,
            ..stats
        };
    }
}
