//! The interposer's per-thread cache of stream-ordered frees (`interposer/src/pool/tcache.rs`)
//! for one thread, as pure code in front of a tight pool: what `vramshim replay` would need to
//! predict the live library's driver calls where the cache changes them.
//!
//! Why: the cache hands a request the block of that size freed last on its stream without
//! the pool, and keeps frees from the pool until it gives them back. That is invisible to the
//! pool on the shared traces, but not always: on repeated workloads a hit can take a block
//! the pool would not have handed out (the tight pool replays the previous round's places),
//! and frees kept across a process synchronization reach the pool after it (see
//! docs/benchmarks.md, "Where `vramshim replay` and the live pool behind the thread caches
//! differ"). The rules here are the live cache's, one thread's: [`SLOTS`] frees kept, only
//! stream-ordered ones; a hit is the newest kept free of the same requested size and stream;
//! everything kept is given back, in free order, with the hits counted into the pool's budget
//! windows (`Stitch::note_aside_hits`), before the pool serves an allocation or a free,
//! after [`HIT_BATCH`] hits, and when the bytes kept reach `Stitch::round_end_watch`.

use crate::accounting::AccountingDevice;
use crate::replay::Event;
use crate::stitch::Stitch;
use crate::{ANY_STREAM, Device, FreeMode, Policy, PoolError, Request};
use std::collections::HashMap;

/// Frees a cache keeps (as the interposer's).
pub const SLOTS: usize = 8;

/// Hits a cache serves before its thread gives back what it keeps (as the interposer's).
pub const HIT_BATCH: u64 = 4096;

/// One thread's cache: the frees it keeps (address, requested size, stream freed on) in free
/// order, and the hits served since it last gave back.
#[derive(Debug, Default)]
pub struct ThreadCache {
    kept: Vec<(u64, u64, u64)>,
    hits: u64,
}

impl ThreadCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The newest kept free of `size` on `stream`, taken (a hit), and whether the cache
    /// served [`HIT_BATCH`] hits since it last gave back (then the caller gives back).
    pub fn take(&mut self, size: u64, stream: u64) -> Option<(u64, bool)> {
        if stream == ANY_STREAM {
            return None;
        }
        let i = self
            .kept
            .iter()
            .rposition(|&(_, sz, s)| sz == size && s == stream)?;
        self.hits += 1;
        Some((self.kept.remove(i).0, self.hits >= HIT_BATCH))
    }

    /// Keep a block freed stream-ordered on `stream`, if there is room. True: kept (then the
    /// caller asks [`ThreadCache::due`] whether to give back at once).
    pub fn put(&mut self, addr: u64, size: u64, stream: u64) -> bool {
        if self.kept.len() >= SLOTS {
            return false;
        }
        self.kept.push((addr, size, stream));
        true
    }

    /// After a free kept: the bytes kept reach the pool's round watch (everything live is
    /// kept here, or the pool is above its budget and the pages it keeps).
    pub fn due(&self, p: &Stitch) -> bool {
        let w = p.round_end_watch();
        w != u64::MAX && self.kept.iter().map(|k| k.1).sum::<u64>() >= w
    }

    /// Give the hits and every kept free back to the pool, in free order.
    pub fn give_back(&mut self, p: &mut Stitch, dev: &mut dyn Device) -> Result<(), PoolError> {
        p.note_aside_hits(dev, std::mem::take(&mut self.hits));
        for (a, _, s) in self.kept.drain(..) {
            p.free(dev, a, FreeMode::Async { stream: s })?;
        }
        Ok(())
    }
}

/// `events` by one thread through `p` behind its [`ThreadCache`] on `dev`, as the live library
/// serves them; the cache given back at the end. Every allocation as the interposer makes it
/// (`Stitch::alloc_cached`, then `Policy::alloc`). Err: the pool's first error (an
/// allocation the device cannot hold, a free of an unknown block).
pub fn run(events: &[Event], p: &mut Stitch, dev: &mut AccountingDevice) -> Result<(), PoolError> {
    let mut c = ThreadCache::new();
    let mut ids: HashMap<u64, (u64, u64)> = HashMap::new();
    for ev in events {
        match *ev {
            Event::Alloc { id, size, stream } => {
                let addr = match c.take(size, stream) {
                    Some((a, batch)) => {
                        if batch {
                            c.give_back(p, dev)?;
                        }
                        a
                    }
                    None => {
                        c.give_back(p, dev)?;
                        match p.alloc_cached(size, stream) {
                            Some(a) => a,
                            None => p.alloc(dev, Request { size, stream })?.addr,
                        }
                    }
                };
                dev.check_alloc(addr, size, stream);
                ids.insert(id, (addr, size));
            }
            Event::Free { id, mode } => {
                let Some((addr, size)) = ids.remove(&id) else {
                    continue;
                };
                dev.check_free(addr, mode);
                if let FreeMode::Async { stream } = mode
                    && c.put(addr, size, stream)
                {
                    if c.due(p) {
                        c.give_back(p, dev)?;
                    }
                    continue;
                }
                c.give_back(p, dev)?;
                p.free(dev, addr, mode)?;
            }
            Event::ProcessSync => {
                dev.process_sync();
                p.note_process_sync();
            }
        }
    }
    c.give_back(p, dev)
}
