//! Per-thread caches of stream-ordered frees (owner: pool).
//!
//! A block freed with `cudaFreeAsync(p, s)` may be handed out again at once to a request
//! ordered on the same stream `s` (stream order covers the free); nothing else may take it
//! without an event or a synchronization. A thread keeps its last few such frees here and
//! serves its own requests on the same stream from them without the pool lock, which all
//! threads share: this is what lets 16 threads allocate and free on their own streams
//! without queueing on one lock.
//!
//! To the pool a block here is still live (its bytes stay put, its physical pages stay
//! held); the cap was already given back by the dispatcher at the free. Before the pool
//! serves anything (an allocation, its cache hits included, a free, a trim), every cache is
//! drained into it ([`drain`]), each thread's blocks in the order that thread freed them (the
//! caches one after another), so the pool decides as it would with no cache here: it sees
//! every freed block, and dissolves its cached blocks in the order the program freed them
//! (with several freeing threads, in each thread's order). Only exact matches are served:
//! same device, same requested size, same pool stream; what a cache serves is what the
//! pool's own fast path would have served (the block of that size freed last).
//!
//! Round ends: a tight pool ends a round (forgets its layout, see `vramshim_pool::stitch`)
//! at an allocation that finds nothing live. Blocks kept here are live to it, so a program
//! whose last frees of a pass all land here would never end a round. Each cache counts the
//! bytes it keeps of the device ([`kept_mine`], after a free it kept while the pool's round
//! could end); when the bytes kept reach what the pool has live
//! (`Stitch::round_end_watch`; [`others_kept`] adds the other threads' caches), everything
//! live is kept here and the caller gives every cache back to the pool, which then sees the
//! round end as it would without the caches. The same watch is 0 while a tight pool holds
//! more than its budget and the pages it was lately forced to take past it: every free then
//! reaches the pool, which dissolves its cache (within those pages a free changes nothing in
//! the pool, which keeps them and its cache, so the caches keep frees there too).
//!
//! Hits: an allocation a cache serves is one the pool never sees, and the pool's budget ends
//! its windows by the allocations it counts (`vramshim_pool::stitch::Budget`): a program whose
//! use shrank to a loop the caches serve whole would keep the budget of its old peak, and its
//! pages, for good. Each cache counts its hits; a drain hands them to the pool
//! (`Stitch::note_aside_hits`) with the frees, and a cache that served [`HIT_BATCH`] hits since
//! the last drain has its thread drain every cache ([`take`] says so): a window of the pool's
//! budget (65,536 allocations by default) ends at most a batch per thread later than it would
//! without caches.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use crate::sys::spin::SpinLock;

// Hits a cache serves at most before its thread hands every cache's hits to the pool
// (`HIT_BATCH`: one pool lock per this many hits at least), and the frees a thread keeps
// (`Slots`: `SLOTS` of them, in free order, a hit the newest that matches): those of the
// pool's model of these caches (`vramshim_pool::thread_cache`, which `vramshim replay` runs
// and the live tests compare with this library), defined once so that the two cannot drift
// apart.
pub(crate) use vramshim_pool::thread_cache::HIT_BATCH;
use vramshim_pool::thread_cache::Slots;
/// Threads with a cache at one time (others use the pool directly).
const CACHES: usize = 64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Freed {
    pub device: i32,
    pub addr: u64,
    /// the size the program asked for (the pool's accounting of the block)
    pub size: u64,
    /// pool stream id the block was freed on
    pub stream: u64,
}

struct Cache {
    /// a thread owns this cache
    claimed: AtomicBool,
    /// Bytes (as the program asked) of the frees held, as [`kept_mine`] last counted them (0
    /// after a drain): read by other threads' round-end checks (an estimate; the drain
    /// decides).
    kept: AtomicU64,
    /// The device all the frees [`Cache::kept`] counted were of ([`MIXED`]: several, or
    /// none).
    kept_device: AtomicI64,
    /// Hits served since the last drain, all of device [`Cache::hits_device`]; written by the
    /// owner and by a drain, each holding [`Cache::slots`]' lock.
    hits: AtomicU64,
    /// The device of [`Cache::hits`] (a hit of another device moves them to [`SPILLED`]).
    hits_device: AtomicI64,
    /// The frees; locked by the owner thread around its own get/put, and by a drain.
    slots: SpinLock<Slots<Freed>>,
}

static CACHE: [Cache; CACHES] = [const {
    Cache {
        claimed: AtomicBool::new(false),
        kept: AtomicU64::new(0),
        kept_device: AtomicI64::new(MIXED),
        hits: AtomicU64::new(0),
        hits_device: AtomicI64::new(0),
        slots: SpinLock::new(Slots::new(Freed {
            device: 0,
            addr: 0,
            size: 0,
            stream: 0,
        })),
    }
}; CACHES];

/// Bit `i`: cache `i` may hold frees (set by a put, cleared by a drain). A cache that counted
/// hits since the last drain has its bit set (it served them from frees a put brought).
static NONEMPTY: AtomicU64 = AtomicU64::new(0);

/// Per device: hits a cache counted before it served one of another device (a thread
/// alternating devices), for the next drain; [`SPILLED_DEVICES`] bit `d`: device `d` has some.
static SPILLED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static SPILLED_DEVICES: AtomicU64 = AtomicU64::new(0);

/// Testing only: hits are not counted (the pool's budget windows then end only by the
/// allocations it serves itself, to prove the test that a shrunk loop gets its pages back
/// can fail).
static NO_HITS: AtomicBool = AtomicBool::new(false);

/// Caches are used at all (off under the pool's fault switches, and with
/// `VRAMSHIM_POOL_DEBUG=no-tcache`).
static ON: AtomicBool = AtomicBool::new(true);

/// Testing only: serve a cached block to a request on any stream (breaks stream order on
/// purpose, to prove the early-reuse test can fail).
static ANY_STREAM: AtomicBool = AtomicBool::new(false);

/// Testing only: never drain (the pool does not see the threads' freed blocks, to prove the
/// drain test can fail).
static NO_DRAIN: AtomicBool = AtomicBool::new(false);

/// See [`configure_no_round_end`].
static NO_ROUND_END: AtomicBool = AtomicBool::new(false);

const UNCLAIMED: u8 = u8::MAX;
const NONE: u8 = u8::MAX - 1;

/// This thread's cache; released when the thread exits (its frees stay for a drain or the
/// next owner: same-stream reuse is valid whichever thread asks).
struct Mine(Cell<u8>);

impl Drop for Mine {
    fn drop(&mut self) {
        let i = self.0.get();
        if (i as usize) < CACHES {
            CACHE[i as usize].claimed.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static MINE: Mine = const { Mine(Cell::new(UNCLAIMED)) };
}

pub(crate) fn configure(on: bool, any_stream: bool, no_drain: bool) {
    ON.store(on, Ordering::Relaxed);
    ANY_STREAM.store(any_stream, Ordering::Relaxed);
    NO_DRAIN.store(no_drain, Ordering::Relaxed);
}

/// Testing only: never give the caches back at a round end (to prove the test that the live
/// pool ends its rounds as the model does can fail).
pub(crate) fn configure_no_round_end() {
    NO_ROUND_END.store(true, Ordering::Relaxed);
}

/// Testing only: never count the caches' hits into the pool.
pub(crate) fn configure_no_hits() {
    NO_HITS.store(true, Ordering::Relaxed);
}

/// Whether the caches' hits are dropped instead of counted (see [`configure_no_hits`]).
#[inline]
pub(crate) fn no_hits() -> bool {
    NO_HITS.load(Ordering::Relaxed)
}

/// Whether round ends are watched at all.
#[inline]
pub(crate) fn round_ends() -> bool {
    !NO_ROUND_END.load(Ordering::Relaxed)
}

#[inline]
fn mine() -> Option<usize> {
    let i = MINE.try_with(|m| {
        let i = m.0.get();
        if i != UNCLAIMED {
            return i;
        }
        let i = claim();
        m.0.set(i);
        i
    });
    match i {
        Ok(i) if (i as usize) < CACHES => Some(i as usize),
        _ => None,
    }
}

#[cold]
fn claim() -> u8 {
    CACHE
        .iter()
        .position(|c| {
            c.claimed
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
        .map_or(NONE, |i| i as u8)
}

impl Cache {
    /// Only a drain competes with the owner, briefly (unless it was preempted).
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Slots<Freed>) -> R) -> R {
        f(&mut self.slots.lock())
    }
}

/// A cached block for `size` bytes on `device` (0 to 63), pool stream `stream`, freed on that
/// stream; and whether this cache's hits reached [`HIT_BATCH`] (the caller then drains every
/// cache, which hands the hits to the pool).
#[inline]
pub(crate) fn take(device: i32, size: u64, stream: u64) -> Option<(u64, bool)> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    let any = ANY_STREAM.load(Ordering::Relaxed);
    let c = &CACHE[mine()?];
    c.with(|slots| {
        // newest first: the block freed last is the likeliest twin
        let a = slots
            .take_newest(|f| f.size == size && f.device == device && (f.stream == stream || any))?
            .addr;
        // under the cache's lock, as a drain reads and clears them
        let mut h = c.hits.load(Ordering::Relaxed);
        let d = i64::from(device);
        if h == 0 {
            c.hits_device.store(d, Ordering::Relaxed);
        } else if c.hits_device.load(Ordering::Relaxed) != d {
            spill(c.hits_device.load(Ordering::Relaxed), h);
            c.hits_device.store(d, Ordering::Relaxed);
            h = 0;
        }
        c.hits.store(h + 1, Ordering::Relaxed);
        Some((a, h + 1 >= HIT_BATCH))
    })
}

/// Hits of device `d` a cache counted, kept for the next drain.
#[cold]
#[inline(never)]
fn spill(d: i64, hits: u64) {
    if let Some(s) = usize::try_from(d).ok().and_then(|d| SPILLED.get(d)) {
        s.fetch_add(hits, Ordering::Relaxed);
        SPILLED_DEVICES.fetch_or(1 << d, Ordering::Release);
    }
}

/// What [`put`] did with a freed block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Not kept (the cache is full, or off): the caller frees it into the pool.
    No,
    /// Kept.
    Yes,
    /// Kept, and no cache was known to keep frees before ([`used`] is still false): the
    /// pool does not publish its round watch yet, so the caller publishes it and marks the
    /// caches used ([`set_used`]) before it compares the bytes kept with the watch (else a
    /// round that ends at this free would be missed).
    First,
}

/// Keep a block freed on pool stream `f.stream` (see [`Kept`]).
#[inline]
pub(crate) fn put(f: Freed) -> Kept {
    if !ON.load(Ordering::Relaxed) {
        return Kept::No;
    }
    let Some(i) = mine() else {
        return Kept::No;
    };
    CACHE[i].with(|slots| {
        if !slots.push(f) {
            return Kept::No;
        }
        // under the cache's lock: a drain that cleared the bit before this point takes
        // the block when it gets the lock; one that clears it later sees it set
        let bit = 1u64 << i;
        if NONEMPTY.load(Ordering::Relaxed) & bit == 0 {
            NONEMPTY.fetch_or(bit, Ordering::AcqRel);
            // A cache is one thread's: its next put comes after this one's caller marked
            // the caches used, so only the first put after a drain need ask.
            if !USED.load(Ordering::Acquire) {
                return Kept::First;
            }
        }
        Kept::Yes
    })
}

/// Bytes of `device`'s blocks this thread's cache keeps (as the program asked): a device's
/// round watch is that device's live bytes, so only its own blocks count. Also published for
/// the other threads' round-end checks ([`others_kept`]): all the bytes kept, and the one
/// device they are of (or [`MIXED`]).
#[cold]
#[inline(never)]
pub(crate) fn kept_mine(device: i32) -> u64 {
    let Some(i) = mine() else {
        return 0;
    };
    let c = &CACHE[i];
    c.with(|slots| {
        let (mut all, mut of_device, mut only) = (0, 0, None);
        for f in slots.as_slice() {
            all += f.size;
            if f.device == device {
                of_device += f.size;
            }
            only = match only {
                None => Some(i64::from(f.device)),
                Some(d) if d == i64::from(f.device) => Some(d),
                Some(_) => Some(MIXED),
            };
        }
        c.kept.store(all, Ordering::Relaxed);
        c.kept_device
            .store(only.unwrap_or(MIXED), Ordering::Relaxed);
        of_device
    })
}

/// Bytes of `device`'s blocks the other threads' caches keep (an estimate: read without their
/// locks, as each owner last counted them). A cache whose blocks were all of another device
/// adds nothing; one whose blocks were of several devices adds all of them (more than the
/// device's: at worst the caches are given back when they need not be, never the reverse).
/// Only caches that may hold frees are read; none in a program with one allocating thread.
#[cold]
#[inline(never)]
pub(crate) fn others_kept(device: i32) -> u64 {
    let me = mine().map_or(0, |i| 1u64 << i);
    let mut bits = NONEMPTY.load(Ordering::Acquire) & !me;
    let mut sum = 0;
    while bits != 0 {
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        let d = CACHE[i].kept_device.load(Ordering::Relaxed);
        if d == i64::from(device) || d == MIXED {
            sum += CACHE[i].kept.load(Ordering::Relaxed);
        }
    }
    sum
}

/// [`Cache::kept_device`] of a cache whose blocks are of several devices (or none).
const MIXED: i64 = -1;

/// Whether other threads' caches may hold frees.
#[inline]
pub(crate) fn others_nonempty() -> bool {
    let me = mine().map_or(0, |i| 1u64 << i);
    NONEMPTY.load(Ordering::Relaxed) & !me != 0
}

/// Some cache kept a free once (sticky).
static USED: AtomicBool = AtomicBool::new(false);

/// Has any cache ever kept a free?
#[inline]
pub(crate) fn used() -> bool {
    USED.load(Ordering::Relaxed)
}

/// A cache kept its first free ([`Kept::First`]); called with the pool lock held, after
/// every pool's round watch was published.
pub(crate) fn set_used() {
    USED.store(true, Ordering::Release);
}

/// May any cache hold a free?
#[inline]
pub(crate) fn any() -> bool {
    NONEMPTY.load(Ordering::Acquire) != 0 && !NO_DRAIN.load(Ordering::Relaxed)
}

/// What a drain hands over.
pub(crate) enum Drained {
    /// A cache served this many hits of this device.
    Hits(i32, u64),
    /// A block a cache kept.
    Freed(Freed),
}

/// Empty every cache, handing each cache's hits to `f` and then its blocks in the order its
/// thread freed them (called with the pool lock held; the lock order is pool, then cache, and
/// an owner never takes the pool lock while holding its cache).
pub(crate) fn drain(mut f: impl FnMut(Drained)) {
    if NO_DRAIN.load(Ordering::Relaxed) {
        return;
    }
    let mut bits = NONEMPTY.swap(0, Ordering::AcqRel);
    while bits != 0 {
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        let c = &CACHE[i];
        let (got, h, hd) = c.with(|slots| {
            let got = slots.take_all();
            c.kept.store(0, Ordering::Relaxed);
            c.kept_device.store(MIXED, Ordering::Relaxed);
            let h = c.hits.swap(0, Ordering::Relaxed);
            (got, h, c.hits_device.load(Ordering::Relaxed))
        });
        if h != 0 && !no_hits() {
            f(Drained::Hits(hd as i32, h));
        }
        for fr in got.as_slice() {
            f(Drained::Freed(*fr));
        }
    }
    if SPILLED_DEVICES.load(Ordering::Relaxed) != 0 {
        let mut devs = SPILLED_DEVICES.swap(0, Ordering::Acquire);
        while devs != 0 {
            let d = devs.trailing_zeros() as usize;
            devs &= devs - 1;
            let h = SPILLED[d].swap(0, Ordering::Relaxed);
            if h != 0 && !no_hits() {
                f(Drained::Hits(d as i32, h));
            }
        }
    }
}

/// In a forked child: the parent's blocks are not the child's; forget them all (no pool
/// call) and every claim but this thread's.
pub(crate) fn on_fork_child() {
    let me = MINE.try_with(|m| m.0.get()).unwrap_or(UNCLAIMED);
    for (i, c) in CACHE.iter().enumerate() {
        // SAFETY: a forked child runs one thread, which holds no cache's lock here.
        unsafe { c.slots.reset_in_child() }.take_all();
        c.kept.store(0, Ordering::Relaxed);
        c.kept_device.store(MIXED, Ordering::Relaxed);
        c.hits.store(0, Ordering::Relaxed);
        if i != me as usize {
            c.claimed.store(false, Ordering::Release);
        }
    }
    for s in &SPILLED {
        s.store(0, Ordering::Relaxed);
    }
    SPILLED_DEVICES.store(0, Ordering::Relaxed);
    NONEMPTY.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread whose hits alternate between devices: each device's hits reach the drain
    /// (the other device's through the spill), none lost, none counted twice; a drained
    /// cache starts again at 0 and says a batch is due only at its `HIT_BATCH`-th hit.
    #[test]
    fn hits_of_two_devices_reach_the_drain_each_once() {
        let freed = |device, addr| Freed {
            device,
            addr,
            size: 4096,
            stream: 1,
        };
        let drained = || {
            let mut hits = [0u64; 2];
            let mut frees = 0;
            drain(|d| match d {
                Drained::Hits(dev, n) => hits[dev as usize] += n,
                Drained::Freed(_) => frees += 1,
            });
            (hits, frees)
        };
        drained();
        assert_ne!(put(freed(0, 0x1000)), Kept::No);
        assert_ne!(put(freed(1, 0x2000)), Kept::No);
        assert_ne!(put(freed(0, 0x3000)), Kept::No);
        assert_eq!(take(0, 4096, 1), Some((0x3000, false)));
        assert_eq!(take(1, 4096, 1), Some((0x2000, false)));
        assert_eq!(take(0, 4096, 1), Some((0x1000, false)));
        assert_eq!(take(0, 4096, 1), None);
        assert_eq!(drained(), ([2, 1], 0));
        assert_eq!(drained(), ([0, 0], 0));
        for i in 1..=HIT_BATCH {
            assert_ne!(put(freed(1, 0x4000)), Kept::No);
            assert_eq!(take(1, 4096, 1), Some((0x4000, i == HIT_BATCH)));
        }
        assert_eq!(drained(), ([0, HIT_BATCH], 0));
    }
}
