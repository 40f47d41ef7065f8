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
//! held); the cap was already given back by the dispatcher at the free. Before the pool does
//! anything but an exact-size hit (placement, growth, dissolving, trim), every cache is
//! drained into it ([`drain`]), so the pool's decisions see every freed block, as before.
//! Only exact matches are served: same device, same requested size, same pool stream.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sys::spin::SpinLock;

/// Frees a thread keeps.
const SLOTS: usize = 8;
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
    /// The frees and how many; locked by the owner thread around its own get/put, and by a
    /// drain.
    slots: SpinLock<([Freed; SLOTS], usize)>,
}

static CACHE: [Cache; CACHES] = [const {
    Cache {
        claimed: AtomicBool::new(false),
        slots: SpinLock::new((
            [Freed {
                device: 0,
                addr: 0,
                size: 0,
                stream: 0,
            }; SLOTS],
            0,
        )),
    }
}; CACHES];

/// Bit `i`: cache `i` may hold frees (set by a put, cleared by a drain).
static NONEMPTY: AtomicU64 = AtomicU64::new(0);

/// Caches are used at all (off under the pool's fault switches, and with
/// `VRAMSHIM_POOL_DEBUG=no-tcache`).
static ON: AtomicBool = AtomicBool::new(true);

/// Testing only: serve a cached block to a request on any stream (breaks stream order on
/// purpose, to prove the early-reuse test can fail).
static ANY_STREAM: AtomicBool = AtomicBool::new(false);

/// Testing only: never drain (the pool does not see the threads' freed blocks, to prove the
/// drain test can fail).
static NO_DRAIN: AtomicBool = AtomicBool::new(false);

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
    fn with<R>(&self, f: impl FnOnce(&mut ([Freed; SLOTS], usize)) -> R) -> R {
        f(&mut self.slots.lock())
    }
}

/// A cached block for `size` bytes on `device`, pool stream `stream`, freed on that stream.
#[inline]
pub(crate) fn take(device: i32, size: u64, stream: u64) -> Option<u64> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    let any = ANY_STREAM.load(Ordering::Relaxed);
    CACHE[mine()?].with(|(slots, n)| {
        // newest first: the block freed last is the likeliest twin
        let i = (0..*n).rev().find(|&i| {
            let f = &slots[i];
            f.size == size && f.device == device && (f.stream == stream || any)
        })?;
        let a = slots[i].addr;
        *n -= 1;
        if i < *n {
            slots.copy_within(i + 1..=*n, i);
        }
        Some(a)
    })
}

/// Keep a block freed on pool stream `f.stream`. False: the cache is full (or off); the
/// caller frees it into the pool.
#[inline]
pub(crate) fn put(f: Freed) -> bool {
    if !ON.load(Ordering::Relaxed) {
        return false;
    }
    let Some(i) = mine() else {
        return false;
    };
    CACHE[i].with(|(slots, n)| {
        if *n == SLOTS {
            return false;
        }
        slots[*n] = f;
        *n += 1;
        // under the cache's lock: a drain that cleared the bit before this point takes
        // the block when it gets the lock; one that clears it later sees it set
        let bit = 1u64 << i;
        if NONEMPTY.load(Ordering::Relaxed) & bit == 0 {
            NONEMPTY.fetch_or(bit, Ordering::AcqRel);
        }
        true
    })
}

/// May any cache hold a free?
#[inline]
pub(crate) fn any() -> bool {
    NONEMPTY.load(Ordering::Acquire) != 0 && !NO_DRAIN.load(Ordering::Relaxed)
}

/// Empty every cache, handing each block to `f` (called with the pool lock held; the lock
/// order is pool, then cache, and an owner never takes the pool lock while holding its
/// cache).
pub(crate) fn drain(mut f: impl FnMut(Freed)) {
    if NO_DRAIN.load(Ordering::Relaxed) {
        return;
    }
    let mut bits = NONEMPTY.swap(0, Ordering::AcqRel);
    while bits != 0 {
        let i = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        let (got, k) = CACHE[i].with(|(slots, n)| {
            let k = std::mem::take(n);
            (*slots, k)
        });
        for fr in &got[..k] {
            f(*fr);
        }
    }
}

/// In a forked child: the parent's blocks are not the child's; forget them all (no pool
/// call) and every claim but this thread's.
pub(crate) fn on_fork_child() {
    let me = MINE.try_with(|m| m.0.get()).unwrap_or(UNCLAIMED);
    for (i, c) in CACHE.iter().enumerate() {
        // SAFETY: a forked child runs one thread, which holds no cache's lock here.
        unsafe { c.slots.reset_in_child() }.1 = 0;
        if i != me as usize {
            c.claimed.store(false, Ordering::Release);
        }
    }
    NONEMPTY.store(0, Ordering::Release);
}
