//! What the process holds right now: pointer (or VMM handle) -> allocation, and the bytes
//! live per counter slot (device), kept exact by the same operations.
//!
//! 64 shards, each a spin lock around a small open-addressing table (linear probing,
//! backward-shift deletion, so no tombstones pile up under alloc/free churn). One insert or
//! remove is one atomic read-modify-write (taking the shard lock) and usually one cache line
//! of slots; threads allocating different pointers rarely meet on a shard. Each shard also
//! keeps its share of the bytes live per slot, updated under its lock: the process-wide
//! total is the sum over shards, exact whenever no request is in flight, at no extra atomic
//! cost on the hot path. A forked child gets a fresh table (the parent's is leaked, never
//! touched again: its locks may be held by threads that do not exist in the child).

use crate::counters::{SLOTS, slot};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering, Ordering::Relaxed};
use vramshim_trace::{AllocKind, Api};

/// One live allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub kind: AllocKind,
    pub device: i32,
    pub stream: u64,
    pub api: Api,
    pub flags: u8,
    /// Bytes charged to the cap for it (given back at free).
    pub charged: u64,
}

const VACANT: Entry = Entry {
    size: 0,
    kind: AllocKind::Runtime,
    device: -1,
    stream: 0,
    api: Api::CudaMalloc,
    flags: 0,
    charged: 0,
};

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;
/// Initial slots per shard (a power of two); a shard doubles when half full.
const INITIAL_BITS: u32 = 5;
/// Key 0 marks a vacant slot: no allocation or handle is ever recorded at 0.
const EMPTY: u64 = 0;

#[inline(always)]
fn mix(key: u64) -> u64 {
    // Device pointers are aligned: fold the high bits in, spread with a Fibonacci multiply,
    // and use the product's high bits (its low bits only see the key's low bits).
    (key ^ (key >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The slots of one shard; only touched with the shard lock held.
struct Slots {
    slots: Box<[(u64, Entry)]>,
    len: usize,
    /// log2 of `slots.len()`.
    bits: u32,
}

impl Slots {
    fn with_bits(bits: u32) -> Slots {
        Slots {
            slots: vec![(EMPTY, VACANT); 1 << bits].into_boxed_slice(),
            len: 0,
            bits,
        }
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Home position of a key: the hash bits just below the shard bits.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        ((mix(key) << SHARD_BITS) >> (64 - self.bits)) as usize
    }

    /// Position of `key`, or of the vacant slot where it would go.
    #[inline(always)]
    fn find(&self, key: u64) -> (usize, bool) {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return (i, true);
            }
            if k == EMPTY {
                return (i, false);
            }
            i = (i + 1) & mask;
        }
    }

    /// Fill the hole at `i` by shifting back the entries after it that may move (their
    /// home is not cyclically inside `(i, j]`), then mark the last hole vacant.
    fn delete_at(&mut self, mut i: usize) {
        let mask = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = self.slots[j];
                i = j;
            }
        }
        self.slots[i].0 = EMPTY;
        self.len -= 1;
    }

    #[cold]
    fn grow(&mut self) {
        let mut bigger = Slots::with_bits(self.bits + 1);
        for &(k, e) in self.slots.iter().filter(|(k, _)| *k != EMPTY) {
            let (i, _) = bigger.find(k);
            bigger.slots[i] = (k, e);
        }
        bigger.len = self.len;
        *self = bigger;
    }
}

#[repr(align(64))]
struct Shard {
    lock: AtomicBool,
    slots: UnsafeCell<Slots>,
    /// Bytes live per counter slot among this shard's entries (written under the lock,
    /// read without it).
    live: [AtomicU64; SLOTS],
}

// SAFETY: `slots` is only accessed while `lock` is held (see `Shard::with`); `live` is atomic.
unsafe impl Sync for Shard {}

impl Shard {
    fn new() -> Shard {
        Shard {
            lock: AtomicBool::new(false),
            slots: UnsafeCell::new(Slots::with_bits(INITIAL_BITS)),
            live: [const { AtomicU64::new(0) }; SLOTS],
        }
    }

    #[inline(always)]
    fn with<R>(&self, f: impl FnOnce(&mut Slots, &[AtomicU64; SLOTS]) -> R) -> R {
        if self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        struct Unlock<'a>(&'a AtomicBool);
        impl Drop for Unlock<'_> {
            #[inline(always)]
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _u = Unlock(&self.lock);
        // SAFETY: we hold the lock, so this is the only reference to the slots.
        f(unsafe { &mut *self.slots.get() }, &self.live)
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            if !self.lock.load(Relaxed)
                && self
                    .lock
                    .compare_exchange_weak(false, true, Ordering::Acquire, Relaxed)
                    .is_ok()
            {
                return;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// Add (or take back) an entry's bytes in its counter slot; only the lock holder writes.
#[inline(always)]
fn account(live: &[AtomicU64; SLOTS], e: &Entry, add: bool) {
    let c = &live[slot(e.device, e.kind)];
    let v = c.load(Relaxed);
    c.store(
        if add {
            v.wrapping_add(e.size)
        } else {
            v.wrapping_sub(e.size)
        },
        Relaxed,
    );
}

struct Shards {
    shards: Box<[Shard]>,
}

impl Shards {
    fn new() -> Shards {
        Shards {
            shards: (0..SHARDS).map(|_| Shard::new()).collect(),
        }
    }
    #[inline(always)]
    fn shard(&self, key: u64) -> &Shard {
        &self.shards[(mix(key) >> (64 - SHARD_BITS)) as usize]
    }
}

/// A sharded map from pointer (or handle) to [`Entry`].
pub struct LiveTable {
    ptr: AtomicPtr<Shards>,
}

impl Default for LiveTable {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveTable {
    pub const fn new() -> LiveTable {
        LiveTable {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    #[inline(always)]
    fn published(&self) -> Option<&Shards> {
        // SAFETY: once published, a table is never freed (only leaked on fork).
        unsafe { self.ptr.load(Ordering::Acquire).as_ref() }
    }

    #[inline(always)]
    fn shards(&self) -> &Shards {
        match self.published() {
            Some(s) => s,
            None => self.create(),
        }
    }

    #[cold]
    fn create(&self) -> &Shards {
        let fresh = Box::into_raw(Box::new(Shards::new()));
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: we just published `fresh`; it lives forever.
            Ok(_) => unsafe { &*fresh },
            Err(cur) => {
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: `cur` is a published table.
                unsafe { &*cur }
            }
        }
    }

    /// Insert (`key` must not be 0); returns the entry previously recorded at `key` (a
    /// free we never saw), whose bytes are no longer counted live.
    #[inline(always)]
    pub fn insert(&self, key: u64, e: Entry) -> Option<Entry> {
        debug_assert!(key != EMPTY);
        if key == EMPTY {
            return None;
        }
        self.shards().shard(key).with(|t, live| {
            account(live, &e, true);
            let (i, found) = t.find(key);
            if found {
                let old = std::mem::replace(&mut t.slots[i].1, e);
                account(live, &old, false);
                return Some(old);
            }
            t.slots[i] = (key, e);
            t.len += 1;
            if t.len * 2 > t.slots.len() {
                t.grow();
            }
            None
        })
    }

    /// Remove and return the entry at `key`.
    #[inline(always)]
    pub fn remove(&self, key: u64) -> Option<Entry> {
        self.published()?.shard(key).with(|t, live| {
            let (i, found) = t.find(key);
            if !found || key == EMPTY {
                return None;
            }
            let e = t.slots[i].1;
            t.delete_at(i);
            account(live, &e, false);
            Some(e)
        })
    }

    /// The entry at `key`, if live.
    pub fn get(&self, key: u64) -> Option<Entry> {
        if key == EMPTY {
            return None;
        }
        self.published()?.shard(key).with(|t, _| {
            let (i, found) = t.find(key);
            found.then(|| t.slots[i].1)
        })
    }

    /// Remove every entry matching `pred`, returning them.
    pub fn drain_where(&self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<(u64, Entry)> {
        let mut out = Vec::new();
        let Some(shards) = self.published() else {
            return out;
        };
        for s in shards.shards.iter() {
            s.with(|t, live| {
                let mut i = 0;
                while i < t.slots.len() {
                    let (k, e) = t.slots[i];
                    if k != EMPTY && pred(&e) {
                        out.push((k, e));
                        account(live, &e, false);
                        // The shift may pull a later entry into `i`: look at it again.
                        t.delete_at(i);
                    } else {
                        i += 1;
                    }
                }
            });
        }
        out
    }

    /// Visit every live entry (shard by shard; not an atomic snapshot).
    pub fn for_each(&self, mut f: impl FnMut(u64, &Entry)) {
        let Some(shards) = self.published() else {
            return;
        };
        for s in shards.shards.iter() {
            s.with(|t, _| {
                t.slots
                    .iter()
                    .filter(|(k, _)| *k != EMPTY)
                    .for_each(|(k, e)| f(*k, e))
            });
        }
    }

    /// Bytes live in a counter slot (see `counters::slot`): exact when no request is in
    /// flight.
    pub fn live_bytes(&self, slot: usize) -> u64 {
        self.published().map_or(0, |s| {
            s.shards
                .iter()
                .map(|sh| sh.live[slot].load(Relaxed))
                .fold(0u64, u64::wrapping_add)
        })
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        let Some(shards) = self.published() else {
            return 0;
        };
        shards.shards.iter().map(|s| s.with(|t, _| t.len)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Start over with an empty table without touching the old one (fork child: its locks
    /// may be held by threads that no longer exist). The old table is leaked.
    pub fn reset_leak(&self) {
        self.ptr.store(std::ptr::null_mut(), Ordering::Release);
    }
}

/// Device pointers (and host pointers of `cudaMallocHost` & co.).
pub static ALLOCS: LiveTable = LiveTable::new();
/// VMM handles of `cuMemCreate`, keyed by handle value.
pub static HANDLES: LiveTable = LiveTable::new();

#[cfg(test)]
mod tests {
    use super::*;

    fn e(size: u64) -> Entry {
        Entry {
            size,
            kind: AllocKind::Runtime,
            device: 0,
            stream: 0,
            api: Api::CudaMalloc,
            flags: 0,
            charged: 0,
        }
    }

    #[test]
    fn insert_remove_concurrent() {
        static T: LiveTable = LiveTable::new();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        let k = (t << 40) | ((i + 1) << 9);
                        assert!(T.insert(k, e(i)).is_none());
                        if i % 2 == 0 {
                            assert_eq!(T.remove(k).map(|x| x.size), Some(i));
                        }
                    }
                });
            }
        });
        assert_eq!(T.len(), 8 * 5_000);
        let drained = T.drain_where(|x| x.size % 4 == 1);
        assert_eq!(drained.len(), 8 * 2_500);
        assert_eq!(T.len(), 8 * 2_500);
        let want: u64 = (0..8u64)
            .flat_map(|_| (0..10_000u64).filter(|i| i % 2 == 1 && i % 4 != 1))
            .sum();
        assert_eq!(T.live_bytes(0), want, "live bytes follow the entries");
        T.reset_leak();
        assert!(T.is_empty());
        assert_eq!(T.live_bytes(0), 0);
        assert!(T.remove(1 << 9).is_none());
    }

    /// Against a model map, with keys crowded into few home slots so that probe chains wrap
    /// and backward-shift deletion moves entries; growth included.
    #[test]
    fn matches_a_model_under_churn() {
        use std::collections::HashMap;
        let t = LiveTable::new();
        let mut model: HashMap<u64, Entry> = HashMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..200_000u64 {
            // 3000 distinct keys: shards grow well past their initial size, then shrink.
            let key = ((rnd() % 3000) + 1) << 12;
            let mut en = e(rnd() % 5000);
            en.device = (rnd() % 3) as i32;
            if rnd() % 7 == 0 {
                en.kind = AllocKind::Host;
            }
            match rnd() % 3 {
                0 | 1 if round < 120_000 || rnd() % 2 == 0 => {
                    assert_eq!(t.insert(key, en), model.insert(key, en), "insert {key:#x}");
                }
                _ => assert_eq!(t.remove(key), model.remove(&key), "remove {key:#x}"),
            }
            if round % 20_000 == 0 {
                assert_eq!(t.len(), model.len());
                for (k, v) in &model {
                    assert_eq!(t.get(*k), Some(*v));
                }
            }
        }
        assert_eq!(t.len(), model.len());
        let mut seen = 0;
        t.for_each(|k, v| {
            assert_eq!(model.get(&k), Some(v));
            seen += 1;
        });
        assert_eq!(seen, model.len());
        for s in 0..SLOTS {
            let want = model
                .values()
                .filter(|v| slot(v.device, v.kind) == s)
                .map(|v| v.size)
                .sum::<u64>();
            assert_eq!(t.live_bytes(s), want, "slot {s}");
        }
        let gone = t.drain_where(|v| v.device == 1);
        model.retain(|_, v| v.device != 1);
        assert!(gone.iter().all(|(_, v)| v.device == 1));
        assert_eq!(t.len(), model.len());
        for (k, v) in &model {
            assert_eq!(t.get(*k), Some(*v));
        }
        assert_eq!(t.live_bytes(1), 0);
        assert!(
            t.insert(0, e(1)).is_none() && t.get(0).is_none(),
            "key 0 is never stored"
        );
    }
}
