//! `caching`: a model of PyTorch's `CUDACachingAllocator` (allocators.md section 1).
//!
//! - sizes rounded up to 512 B (`kMinBlockSize`); requests `<= 1 MiB` use the small pool,
//!   others the large pool;
//! - segments (one device `malloc` each): 2 MiB for small requests, 20 MiB for requests
//!   under 10 MiB, else the request rounded up to 2 MiB;
//! - free blocks ordered by (stream, size, address); best fit on the request's own stream
//!   only; oversize rules with `max_split_size` (default unlimited) and
//!   `max_non_split_rounding` (20 MiB);
//! - split: small pool if the remainder is >= 512 B, large pool if the request is under
//!   `max_split_size` and the remainder is > 1 MiB; merge with free neighbours on free;
//! - out of memory: release oversize cached blocks (only with `max_split_size`), then
//!   `release_cached_blocks` (synchronize, free every whole cached segment), retry once.
//!
//! Stream rules: a block is reusable by its allocating stream at once; a stream-ordered free
//! on another stream records an event and the block returns to the pool when the event
//! completes (PyTorch's `record_stream`); a `FreeMode::Sync` free waits for a
//! synchronization (the process's, or the out-of-memory path's).

use crate::device::{Device, DeviceError, EventId, Stream};
use crate::fxhash::FxMap;
use crate::{Alloc, FreeMode, MIB, Policy, PoolError, Request, Stats, round_up};
use std::collections::{BTreeMap, BTreeSet};

const K_MIN_BLOCK: u64 = 512;
const K_SMALL_SIZE: u64 = MIB;
const K_SMALL_BUFFER: u64 = 2 * MIB;
const K_LARGE_BUFFER: u64 = 20 * MIB;
const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
const K_ROUND_LARGE: u64 = 2 * MIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    /// Waiting for an event (cross-stream free) or a synchronization (Sync free).
    Pending,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    req: u64,
    stream: Stream,
    small: bool,
    prev: Option<u64>,
    next: Option<u64>,
    state: State,
}

/// See the module documentation.
pub struct Caching {
    blocks: FxMap<u64, Block>,
    small: BTreeSet<(Stream, u64, u64)>,
    large: BTreeSet<(Stream, u64, u64)>,
    /// segment base -> size
    segments: BTreeMap<u64, u64>,
    pending_events: Vec<(u64, EventId)>,
    /// (addr, epoch at free)
    pending_sync: Vec<(u64, u64)>,
    epoch: u64,
    max_split_size: u64,
    max_non_split_rounding: u64,
    stats: Stats,
}

impl Default for Caching {
    fn default() -> Self {
        Self::new()
    }
}

impl Caching {
    pub fn new() -> Self {
        Caching {
            blocks: FxMap::default(),
            small: BTreeSet::new(),
            large: BTreeSet::new(),
            segments: BTreeMap::new(),
            pending_events: Vec::new(),
            pending_sync: Vec::new(),
            epoch: 0,
            max_split_size: u64::MAX,
            max_non_split_rounding: K_LARGE_BUFFER,
            stats: Stats::default(),
        }
    }

    /// `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N` (bytes here; at least 20 MiB).
    pub fn with_max_split_size(mut self, bytes: u64) -> Self {
        self.max_split_size = bytes.max(K_LARGE_BUFFER);
        self
    }

    pub fn round_size(size: u64) -> u64 {
        if size < K_MIN_BLOCK {
            K_MIN_BLOCK
        } else {
            round_up(size, K_MIN_BLOCK)
        }
    }

    pub fn allocation_size(size: u64) -> u64 {
        if size <= K_SMALL_SIZE {
            K_SMALL_BUFFER
        } else if size < K_MIN_LARGE_ALLOC {
            K_LARGE_BUFFER
        } else {
            round_up(size, K_ROUND_LARGE)
        }
    }

    fn set_of(&mut self, small: bool) -> &mut BTreeSet<(Stream, u64, u64)> {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn insert_free(&mut self, addr: u64) {
        let b = self.blocks[&addr];
        let key = (b.stream, b.size, addr);
        self.set_of(b.small).insert(key);
    }

    fn remove_free(&mut self, addr: u64) {
        let b = self.blocks[&addr];
        let key = (b.stream, b.size, addr);
        self.set_of(b.small).remove(&key);
    }

    /// Return a block to its pool, merging with free neighbours.
    fn free_block(&mut self, addr: u64) {
        let mut addr = addr;
        {
            let b = self.blocks.get_mut(&addr).unwrap();
            b.state = State::Free;
            b.req = 0;
        }
        // merge with prev
        if let Some(p) = self.blocks[&addr].prev
            && self.blocks[&p].state == State::Free
        {
            self.remove_free(p);
            let b = self.blocks.remove(&addr).unwrap();
            let pb = self.blocks.get_mut(&p).unwrap();
            pb.size += b.size;
            pb.next = b.next;
            if let Some(n) = b.next {
                self.blocks.get_mut(&n).unwrap().prev = Some(p);
            }
            addr = p;
        }
        // merge with next
        if let Some(n) = self.blocks[&addr].next
            && self.blocks[&n].state == State::Free
        {
            self.remove_free(n);
            let nb = self.blocks.remove(&n).unwrap();
            let b = self.blocks.get_mut(&addr).unwrap();
            b.size += nb.size;
            b.next = nb.next;
            if let Some(nn) = nb.next {
                self.blocks.get_mut(&nn).unwrap().prev = Some(addr);
            }
        }
        self.insert_free(addr);
    }

    fn process_events(&mut self, dev: &mut dyn Device) {
        if !self.pending_events.is_empty() {
            let mut i = 0;
            while i < self.pending_events.len() {
                let (addr, ev) = self.pending_events[i];
                if dev.event_done(ev) {
                    dev.destroy_event(ev);
                    self.pending_events.swap_remove(i);
                    self.free_block(addr);
                } else {
                    i += 1;
                }
            }
        }
        if !self.pending_sync.is_empty() && self.pending_sync[0].1 < self.epoch {
            let ready: Vec<u64> = self
                .pending_sync
                .iter()
                .filter(|p| p.1 < self.epoch)
                .map(|p| p.0)
                .collect();
            self.pending_sync.retain(|p| p.1 >= self.epoch);
            for a in ready {
                self.free_block(a);
            }
        }
    }

    fn get_free_block(&mut self, small: bool, stream: Stream, size: u64) -> Option<u64> {
        let max_split = self.max_split_size;
        let rounding = self.max_non_split_rounding;
        let set = if small { &self.small } else { &self.large };
        let &(s, bsize, addr) = set.range((stream, size, 0)..).next()?;
        if s != stream {
            return None;
        }
        if size < max_split && bsize >= max_split {
            return None;
        }
        if size >= max_split && bsize >= size.saturating_add(rounding) {
            return None;
        }
        Some(addr)
    }

    fn alloc_block(
        &mut self,
        dev: &mut dyn Device,
        alloc_size: u64,
        small: bool,
        stream: Stream,
    ) -> Result<u64, DeviceError> {
        let addr = dev.malloc(alloc_size)?;
        self.segments.insert(addr, alloc_size);
        self.blocks.insert(
            addr,
            Block {
                size: alloc_size,
                req: 0,
                stream,
                small,
                prev: None,
                next: None,
                state: State::Free,
            },
        );
        self.insert_free(addr);
        let r = self.stats.reserved + alloc_size;
        self.stats.set_reserved(r);
        Ok(addr)
    }

    /// Free one whole cached segment.
    fn release_block(&mut self, dev: &mut dyn Device, addr: u64) -> Result<u64, DeviceError> {
        dev.free(addr)?;
        self.remove_free(addr);
        let b = self.blocks.remove(&addr).unwrap();
        self.segments.remove(&addr);
        let r = self.stats.reserved - b.size;
        self.stats.set_reserved(r);
        Ok(b.size)
    }

    /// `release_available_cached_blocks`: only with `max_split_size` set.
    fn release_available_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
        small: bool,
        stream: Stream,
        size: u64,
    ) -> bool {
        if self.max_split_size == u64::MAX || small {
            return false;
        }
        let key_size = size.max(self.max_split_size);
        // smallest single whole oversize block >= request on this stream
        let cand = self
            .large
            .range((stream, key_size, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.2)
            .find(|a| {
                let b = &self.blocks[a];
                b.prev.is_none() && b.next.is_none()
            });
        if let Some(a) = cand {
            return self.release_block(dev, a).is_ok();
        }
        // else the largest ones until enough is released
        let mut released = 0;
        let cands: Vec<u64> = self
            .large
            .range((stream, self.max_split_size, 0)..)
            .take_while(|k| k.0 == stream)
            .map(|k| k.2)
            .collect();
        for a in cands.into_iter().rev() {
            if released >= size {
                break;
            }
            let b = self.blocks[&a];
            if b.prev.is_none() && b.next.is_none() && self.release_block(dev, a).is_ok() {
                released += b.size;
            }
        }
        released >= size
    }

    /// `release_cached_blocks`: synchronize (outstanding events and Sync frees complete),
    /// then free every whole cached segment. Returns bytes released.
    fn release_cached_blocks(&mut self, dev: &mut dyn Device) -> u64 {
        if dev.is_capturing() {
            return 0;
        }
        if (!self.pending_events.is_empty() || !self.pending_sync.is_empty())
            && dev.synchronize().is_ok()
        {
            self.stats.syncs += 1;
            self.epoch += 1;
            for (a, ev) in std::mem::take(&mut self.pending_events) {
                dev.destroy_event(ev);
                self.free_block(a);
            }
            self.process_events(dev);
        }
        let whole: Vec<u64> = self
            .small
            .iter()
            .chain(self.large.iter())
            .map(|k| k.2)
            .filter(|a| {
                let b = &self.blocks[a];
                b.prev.is_none() && b.next.is_none()
            })
            .collect();
        let mut released = 0;
        for a in whole {
            if let Ok(n) = self.release_block(dev, a) {
                released += n;
            }
        }
        released
    }
}

impl Policy for Caching {
    fn name(&self) -> &'static str {
        "caching"
    }

    fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError> {
        if let Some(e) = crate::refuse_oversized(&req, &self.stats) {
            return Err(e);
        }
        self.process_events(dev);
        let stream = req.stream;
        let size = Self::round_size(req.size);
        let small = size <= K_SMALL_SIZE;
        let alloc_size = Self::allocation_size(size);
        let mut hit = true;
        let addr = match self.get_free_block(small, stream, size) {
            Some(a) => a,
            None => {
                hit = false;
                match self.alloc_block(dev, alloc_size, small, stream) {
                    Ok(a) => a,
                    Err(e) if e.is_oom() => {
                        self.stats.oom_retries += 1;
                        let mut got = None;
                        if self.release_available_cached_blocks(dev, small, stream, size) {
                            got = self.alloc_block(dev, alloc_size, small, stream).ok();
                        }
                        if got.is_none() {
                            self.release_cached_blocks(dev);
                            // blocks that came back from pending may now fit
                            got = self.get_free_block(small, stream, size);
                        }
                        match got {
                            Some(a) => a,
                            None => match self.alloc_block(dev, alloc_size, small, stream) {
                                Ok(a) => a,
                                Err(e2) if e2.is_oom() => {
                                    return Err(PoolError::OutOfMemory {
                                        requested: req.size,
                                        reserved: self.stats.reserved,
                                        live: self.stats.live,
                                        why: e2,
                                    });
                                }
                                Err(e2) => return Err(PoolError::Device(e2)),
                            },
                        }
                    }
                    Err(e) => return Err(PoolError::Device(e)),
                }
            }
        };
        self.remove_free(addr);
        let b = self.blocks[&addr];
        let remaining = b.size - size;
        let split = if b.small {
            remaining >= K_MIN_BLOCK
        } else {
            size < self.max_split_size && remaining > K_SMALL_SIZE
        };
        if split {
            let rest = addr + size;
            self.blocks.insert(
                rest,
                Block {
                    size: remaining,
                    req: 0,
                    stream: b.stream,
                    small: b.small,
                    prev: Some(addr),
                    next: b.next,
                    state: State::Free,
                },
            );
            if let Some(n) = b.next {
                self.blocks.get_mut(&n).unwrap().prev = Some(rest);
            }
            let bm = self.blocks.get_mut(&addr).unwrap();
            bm.size = size;
            bm.next = Some(rest);
            self.insert_free(rest);
        }
        let bm = self.blocks.get_mut(&addr).unwrap();
        bm.state = State::Allocated;
        bm.req = req.size;
        let usable = bm.size;
        self.stats.allocs += 1;
        if hit {
            self.stats.cache_hits += 1;
        }
        self.stats.add_live(req.size);
        Ok(Alloc { addr, size: usable })
    }

    fn free(&mut self, dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError> {
        let Some(b) = self.blocks.get_mut(&addr) else {
            return Err(PoolError::UnknownPointer(addr));
        };
        if b.state != State::Allocated {
            return Err(PoolError::UnknownPointer(addr));
        }
        let req = b.req;
        let bstream = b.stream;
        self.stats.frees += 1;
        self.stats.live -= req;
        match mode {
            FreeMode::Sync => {
                b.state = State::Pending;
                self.pending_sync.push((addr, self.epoch));
            }
            FreeMode::Async { stream } if stream != bstream => {
                b.state = State::Pending;
                match dev.record_event(stream) {
                    Ok(ev) => {
                        self.stats.events_recorded += 1;
                        self.pending_events.push((addr, ev));
                    }
                    // no event: wait for a synchronization instead
                    Err(_) => self.pending_sync.push((addr, self.epoch)),
                }
            }
            FreeMode::Async { .. } => self.free_block(addr),
        }
        Ok(req)
    }

    /// Free blocks of `stream` return to it only once an event recorded on it now is
    /// complete (or a synchronization): a stream that gets its handle later is not it.
    fn retire_stream(&mut self, dev: &mut dyn Device, stream: Stream) {
        let free: Vec<u64> = self
            .small
            .iter()
            .chain(self.large.iter())
            .filter(|k| k.0 == stream)
            .map(|k| k.2)
            .collect();
        let capturing = dev.is_capturing();
        for addr in free {
            self.remove_free(addr);
            self.blocks.get_mut(&addr).unwrap().state = State::Pending;
            match (!capturing).then(|| dev.record_event(stream)) {
                Some(Ok(ev)) => {
                    self.stats.events_recorded += 1;
                    self.pending_events.push((addr, ev));
                }
                _ => self.pending_sync.push((addr, self.epoch)),
            }
        }
    }

    fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError> {
        self.stats.trims += 1;
        Ok(self.release_cached_blocks(dev))
    }

    fn note_process_sync(&mut self) {
        self.stats.process_syncs += 1;
        self.epoch += 1;
    }

    fn owns(&self, addr: u64) -> bool {
        self.blocks
            .get(&addr)
            .is_some_and(|b| b.state == State::Allocated)
    }

    fn contains(&self, addr: u64) -> bool {
        self.segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, &l)| addr < s + l)
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn reset(&mut self) {
        let stats = self.stats;
        *self = Caching {
            max_split_size: self.max_split_size,
            ..Caching::new()
        };
        self.stats = Stats {
            reserved: 0,
            live: 0,
            ..stats
        };
    }
}
