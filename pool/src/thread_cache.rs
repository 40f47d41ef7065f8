//! The interposer's per-thread caches of stream-ordered frees (`interposer/src/pool/tcache.rs`)
//! as pure code in front of a policy: what `vramshim replay` runs in front of the pool
//! (`replay::run_with`, for a policy whose [`Policy::thread_caches`] says the live library
//! keeps them) so that it predicts the live library's driver calls and reserved bytes where
//! the caches change them.
//!
//! Why they can: a cache hands a request the block of that size freed last on its stream
//! without the pool, and keeps frees from the pool until it gives them back. On repeated
//! workloads a hit can take a block the pool would not have handed out (the tight pool replays
//! the previous round's places), and frees kept across a process synchronization reach the
//! pool after it (docs/benchmarks.md, "Where `vramshim replay` and the live pool behind the
//! thread caches differ").
//!
//! The rules ([`Rules::LIVE`]) are the live caches': a cache keeps [`SLOTS`] frees, only
//! stream-ordered ones (`cudaFreeAsync`) of a requested size the pool lets a caller keep
//! ([`may_keep`] with `Policy::aside_below` and `Policy::aside_run`: under a page while the
//! tight pool's layer replay acts, which must see every large allocation it remembers, and the
//! size of a run of one large request it has no period for), and serves only stream-ordered requests
//! (`cudaMallocAsync`: never one on [`ANY_STREAM`]); a hit is the newest kept free of the same
//! requested size and stream; everything kept is given back, in free order, with the hits
//! counted into the pool's budget windows (`Policy::note_aside_hits`), before the pool serves
//! an allocation or a free, after [`HIT_BATCH`] hits, and when the bytes kept reach the pool's
//! round watch (`Policy::round_end_watch`). Every event is one thread's: a replayed stream
//! carries no thread (see docs/analyzer.md, `replay`). The interposer's caches keep their
//! frees in the same [`Slots`] (what is kept, in which order, which free a hit takes) with
//! the same [`HIT_BATCH`]; around them they are lock-free code of their own (atomics, a spin
//! lock per cache, drains across threads and devices, the round watch published per device),
//! which the live tests hold equal to this.

use crate::accounting::AccountingDevice;
use crate::replay::Event;
use crate::{ANY_STREAM, Alloc, Device, FreeMode, Policy, PoolError, Request, Stream};
use std::collections::HashMap;

/// Frees a cache keeps (as the interposer's).
pub const SLOTS: usize = 8;

/// Hits a cache serves before its thread gives back what it keeps (as the interposer's).
pub const HIT_BATCH: u64 = 4096;

/// Whether a cache may keep a free of `size` requested bytes, the pool letting a caller keep
/// those under `below` (`Policy::aside_below`) and those that it rounds to `run()`
/// (`Policy::aside_run`, 0: none): the rule both forms of the caches apply. `run` is asked
/// only for a size of `below` or more, so that a small free (the cached pair) reads one value.
#[inline(always)]
pub fn may_keep(size: u64, below: u64, run: impl FnOnce() -> u64) -> bool {
    size < below || crate::round_up(size.max(1), crate::ALIGN) == run()
}

/// The frees one cache keeps, oldest first (the order they were freed in), at most [`SLOTS`],
/// and the rule of a hit: the newest that matches. The storage both forms of the caches use:
/// this model's [`ThreadCache`] and the interposer's lock-free caches (under a spin lock each,
/// so everything here is plain, inlined code: no allocation, no lock).
#[derive(Clone, Copy, Debug)]
pub struct Slots<T: Copy> {
    items: [T; SLOTS],
    n: usize,
}

impl<T: Copy> Slots<T> {
    /// No free kept (`fill` only fills the unused slots).
    pub const fn new(fill: T) -> Self {
        Slots {
            items: [fill; SLOTS],
            n: 0,
        }
    }

    /// Frees kept.
    #[inline]
    pub fn len(&self) -> usize {
        self.n
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Keep `t` as the newest; false: all [`SLOTS`] are taken (nothing changed).
    #[inline]
    pub fn push(&mut self, t: T) -> bool {
        if self.n == SLOTS {
            return false;
        }
        self.items[self.n] = t;
        self.n += 1;
        true
    }

    /// The newest kept free that `matches` (the block freed last is the likeliest twin),
    /// taken out; the others keep their order.
    #[inline]
    pub fn take_newest(&mut self, mut matches: impl FnMut(&T) -> bool) -> Option<T> {
        let i = (0..self.n).rev().find(|&i| matches(&self.items[i]))?;
        let t = self.items[i];
        self.n -= 1;
        if i < self.n {
            self.items.copy_within(i + 1..=self.n, i);
        }
        Some(t)
    }

    /// The frees kept, oldest first.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        &self.items[..self.n]
    }

    /// Everything kept (oldest first), leaving no free kept.
    #[inline]
    pub fn take_all(&mut self) -> Slots<T> {
        let all = *self;
        self.n = 0;
        all
    }
}

/// How a cache keeps frees: the live caches' rules ([`Rules::LIVE`]), or changed on purpose
/// (the interposer's `VRAMSHIM_POOL_DEBUG=tcache-*` and `no-tcache` switches have their
/// counterparts here, so that the tests and examples that break a rule run this code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Frees kept at most (0: none, every free reaches the pool; `no-tcache`; at most
    /// [`SLOTS`]).
    pub slots: usize,
    /// Requests served from the frees kept (false: frees are only kept, then given back).
    pub serve: bool,
    /// Give back what is kept when the bytes kept reach the pool's round watch
    /// (false: `tcache-no-round-end`).
    pub round_watch: bool,
    /// Tell the pool the hits served when giving back (false: `tcache-no-hits`; the caches
    /// still give back after [`HIT_BATCH`] hits, as the live ones do).
    pub count_hits: bool,
    /// Give back what is kept at each process synchronization (not a live rule: what would
    /// make the caches' frees reach the pool before the synchronization).
    pub give_back_at_sync: bool,
    /// Give back what is kept when the process destroys a stream, before the pool is told
    /// (false: `tcache-keep-retired`; a free kept on the destroyed stream is then served to a
    /// request on a new stream that got its handle, unordered).
    pub give_back_at_retire: bool,
    /// Keep frees of any size, also those the pool asks to see (`Policy::aside_below`,
    /// `Policy::aside_run`; not a live rule: what the caches did before the tight pool's layer
    /// replay needed every large free, kept to measure and to prove the tests of that limit
    /// can fail).
    pub keep_large: bool,
    /// Keep frees of the size of a run the pool's layer replay has no period for
    /// (`Policy::aside_run`; false: `tcache-no-run`, every free of a page or more reaching
    /// the pool while the layer replay acts, as the caches did before they kept the run's).
    pub keep_run: bool,
}

impl Rules {
    /// The live library's caches.
    pub const LIVE: Rules = Rules {
        slots: SLOTS,
        serve: true,
        round_watch: true,
        count_hits: true,
        give_back_at_sync: false,
        give_back_at_retire: true,
        keep_large: false,
        keep_run: true,
    };

    /// No cache: every free reaches the pool (what the live library runs with under the
    /// pool's fault switches, or `VRAMSHIM_POOL_DEBUG=no-tcache`).
    pub const NONE: Rules = Rules {
        slots: 0,
        ..Rules::LIVE
    };
}

impl Default for Rules {
    fn default() -> Self {
        Rules::LIVE
    }
}

/// A free a cache keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    addr: u64,
    /// the size the program asked for (what the pool counts live)
    size: u64,
    /// the size the pool handed out (what a hit hands out again)
    granted: u64,
    /// the stream it was freed on
    stream: Stream,
}

/// What [`ThreadCache::free`] did with a free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Kept by the cache; `given_back`: the bytes kept reached the round watch, and the cache
    /// gave everything back at once.
    Kept { given_back: bool },
    /// Freed into the pool (after the cache gave back what it kept).
    Pool,
}

/// One thread's cache in front of a policy: the frees it keeps in free order, and the hits
/// served since it last gave back.
#[derive(Debug)]
pub struct ThreadCache {
    rules: Rules,
    kept: Slots<Kept>,
    /// hits since the cache last gave back
    batch: u64,
    /// hits in all
    hits: u64,
}

impl ThreadCache {
    /// A cache following `rules`.
    pub fn new(rules: Rules) -> Self {
        let none = Kept {
            addr: 0,
            size: 0,
            granted: 0,
            stream: 0,
        };
        ThreadCache {
            rules,
            kept: Slots::new(none),
            batch: 0,
            hits: 0,
        }
    }

    /// Allocations served from kept frees so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Frees kept now.
    pub fn kept(&self) -> usize {
        self.kept.len()
    }

    /// Serve `req` as the live library does: from the cache (`Ok((alloc, true))`, a hit: the
    /// newest kept free of that requested size on that stream), else from the pool after the
    /// cache gave back what it kept (`Ok((alloc, false))`). Err: the pool's.
    pub fn alloc<P: Policy + ?Sized>(
        &mut self,
        p: &mut P,
        dev: &mut dyn Device,
        req: Request,
    ) -> Result<(Alloc, bool), PoolError> {
        if self.rules.serve
            && req.stream != ANY_STREAM
            && let Some(k) = self
                .kept
                .take_newest(|k| k.size == req.size && k.stream == req.stream)
        {
            self.batch += 1;
            self.hits += 1;
            if self.batch >= HIT_BATCH {
                self.give_back(p, dev)?;
            }
            let a = Alloc {
                addr: k.addr,
                size: k.granted,
            };
            return Ok((a, true));
        }
        self.give_back(p, dev)?;
        p.alloc(dev, req).map(|a| (a, false))
    }

    /// Free the block at `addr` (`size` requested, `granted` handed out) as the live library
    /// does: a stream-ordered free of a size the pool lets a caller keep ([`may_keep`]) is
    /// kept while there is room (and everything kept is given back at once if its bytes reach
    /// the pool's round watch); any other free reaches the pool after the cache gave back what
    /// it kept. Err: the pool's.
    pub fn free<P: Policy + ?Sized>(
        &mut self,
        p: &mut P,
        dev: &mut dyn Device,
        addr: u64,
        size: u64,
        granted: u64,
        mode: FreeMode,
    ) -> Result<Freed, PoolError> {
        if let FreeMode::Async { stream } = mode
            && self.kept.len() < self.rules.slots
            && (self.rules.keep_large
                || may_keep(size, p.aside_below(), || {
                    if self.rules.keep_run {
                        p.aside_run()
                    } else {
                        0
                    }
                }))
            && self.kept.push(Kept {
                addr,
                size,
                granted,
                stream,
            })
        {
            // Everything live is kept here (a round could end), or the pool is above its
            // budget and the pages it keeps: it must see the frees now.
            let w = p.round_end_watch();
            let due = self.rules.round_watch
                && w != u64::MAX
                && self.kept.as_slice().iter().map(|k| k.size).sum::<u64>() >= w;
            if due {
                self.give_back(p, dev)?;
            }
            return Ok(Freed::Kept { given_back: due });
        }
        self.give_back(p, dev)?;
        p.free(dev, addr, mode)?;
        Ok(Freed::Pool)
    }

    /// The process synchronized the device: given back first under
    /// [`Rules::give_back_at_sync`] (the live caches keep their frees). The caller tells the
    /// pool and the device.
    pub fn process_sync<P: Policy + ?Sized>(
        &mut self,
        p: &mut P,
        dev: &mut dyn Device,
    ) -> Result<(), PoolError> {
        if self.rules.give_back_at_sync {
            self.give_back(p, dev)?;
        }
        Ok(())
    }

    /// The process destroys `stream`: what is kept is given back (under
    /// [`Rules::give_back_at_retire`]: it may hold frees of that stream, which a request on a
    /// new stream with its handle must not take), then the pool is told. The caller tells the
    /// device.
    pub fn retire_stream<P: Policy + ?Sized>(
        &mut self,
        p: &mut P,
        dev: &mut dyn Device,
        stream: Stream,
    ) -> Result<(), PoolError> {
        let r = if self.rules.give_back_at_retire {
            self.give_back(p, dev)
        } else {
            Ok(())
        };
        p.retire_stream(dev, stream);
        r
    }

    /// Give the hits (under [`Rules::count_hits`]) and every kept free back to the pool, in
    /// free order. Err: the pool's first (the rest are still given back).
    pub fn give_back<P: Policy + ?Sized>(
        &mut self,
        p: &mut P,
        dev: &mut dyn Device,
    ) -> Result<(), PoolError> {
        let hits = std::mem::take(&mut self.batch);
        if self.rules.count_hits && hits > 0 {
            p.note_aside_hits(dev, hits);
        }
        let mut first = Ok(());
        for k in self.kept.take_all().as_slice() {
            let r = p.free(dev, k.addr, FreeMode::Async { stream: k.stream });
            if first.is_ok()
                && let Err(e) = r
            {
                first = Err(e);
            }
        }
        first
    }
}

/// One event's outcome in [`run_observed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An allocation served at `addr`, by the cache (`hit`) or the pool.
    Alloc { addr: u64, hit: bool },
    /// A free the cache kept (see [`Freed::Kept`]).
    Kept { given_back: bool },
}

/// `events` by one thread through `p` behind `cache` on `dev`, as the live library serves
/// them, on the checking device's checks (`check_alloc`, `check_free`); `on` sees each
/// allocation and each free kept, with the pool as it is after it. The cache is not given
/// back at the end. Err: the pool's first error (an allocation the device cannot hold, a free
/// of an unknown block).
pub fn run_observed<P: Policy + ?Sized>(
    events: &[Event],
    p: &mut P,
    dev: &mut AccountingDevice,
    cache: &mut ThreadCache,
    mut on: impl FnMut(Step, &P),
) -> Result<(), PoolError> {
    let mut ids: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    for ev in events {
        match *ev {
            Event::Alloc { id, size, stream } => {
                let (a, hit) = cache.alloc(p, dev, Request { size, stream })?;
                dev.check_alloc(a.addr, a.size, stream);
                ids.insert(id, (a.addr, size, a.size));
                on(Step::Alloc { addr: a.addr, hit }, p);
            }
            Event::Free { id, mode } => {
                let Some((addr, size, granted)) = ids.remove(&id) else {
                    continue;
                };
                dev.check_free(addr, mode);
                if let Freed::Kept { given_back } = cache.free(p, dev, addr, size, granted, mode)? {
                    on(Step::Kept { given_back }, p);
                }
            }
            Event::ProcessSync => {
                cache.process_sync(p, dev)?;
                dev.process_sync();
                p.note_process_sync();
            }
            Event::StreamRetired { stream } => {
                cache.retire_stream(p, dev, stream)?;
                dev.retire_stream(stream);
            }
        }
    }
    Ok(())
}

/// `events` by one thread through `p` behind the live library's cache ([`Rules::LIVE`]) on
/// `dev`; the cache given back at the end. Err: as [`run_observed`].
pub fn run<P: Policy + ?Sized>(
    events: &[Event],
    p: &mut P,
    dev: &mut AccountingDevice,
) -> Result<(), PoolError> {
    let mut c = ThreadCache::new(Rules::LIVE);
    run_observed(events, p, dev, &mut c, |_, _| {})?;
    c.give_back(p, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hit is the newest free that matches; the others keep their free order; a full
    /// cache refuses without changing; everything taken comes out oldest first.
    #[test]
    fn slots_keep_free_order_and_hand_out_the_newest_match() {
        let mut s = Slots::new((0u64, 0u64));
        for i in 0..SLOTS as u64 {
            assert!(s.push((i, i % 3)));
        }
        assert!(!s.push((99, 0)), "a full cache took a free");
        assert_eq!(s.len(), SLOTS);
        // kinds 0,1,2,0,1,2,0,1: the newest of kind 0 is free 6, then 3
        assert_eq!(s.take_newest(|f| f.1 == 0), Some((6, 0)));
        assert_eq!(s.take_newest(|f| f.1 == 0), Some((3, 0)));
        assert_eq!(s.take_newest(|f| f.1 == 9), None);
        let order: Vec<u64> = s.as_slice().iter().map(|f| f.0).collect();
        assert_eq!(order, [0, 1, 2, 4, 5, 7]);
        let all = s.take_all();
        assert!(s.is_empty());
        assert_eq!(all.as_slice().len(), 6);
        assert_eq!(all.as_slice()[3], (4, 1));
    }
}
