//! What the process holds right now: pointer (or VMM handle) -> allocation.
//!
//! 64 shards, each a small spin lock around a `HashMap` with preallocated capacity, so
//! threads allocating different pointers rarely touch the same lock. A forked child gets a
//! fresh table (the parent's is leaked, never touched again: its locks may be held by
//! threads that do not exist in the child).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
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

const SHARDS: usize = 64;
const SHARD_CAPACITY: usize = 64;

#[inline]
fn mix(key: u64) -> u64 {
    // Device pointers are aligned; fold the high bits in and spread with a Fibonacci multiply.
    (key ^ (key >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Hasher for keys already mixed well enough: one multiply.
#[derive(Default)]
pub struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01B3);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = mix(k);
    }
}

type Map = HashMap<u64, Entry, BuildHasherDefault<KeyHasher>>;

struct Shard {
    lock: AtomicBool,
    map: std::cell::UnsafeCell<Map>,
}

// SAFETY: `map` is only accessed while `lock` is held (see `Shard::with`).
unsafe impl Sync for Shard {}

impl Shard {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Map) -> R) -> R {
        let mut spins = 0u32;
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
        struct Unlock<'a>(&'a AtomicBool);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _u = Unlock(&self.lock);
        // SAFETY: we hold the lock, so this is the only reference to the map.
        f(unsafe { &mut *self.map.get() })
    }
}

struct Shards {
    shards: Box<[Shard]>,
}

impl Shards {
    fn new() -> Shards {
        Shards {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    lock: AtomicBool::new(false),
                    map: std::cell::UnsafeCell::new(Map::with_capacity_and_hasher(
                        SHARD_CAPACITY,
                        Default::default(),
                    )),
                })
                .collect(),
        }
    }
    #[inline]
    fn shard(&self, key: u64) -> &Shard {
        &self.shards[(mix(key) >> 58) as usize & (SHARDS - 1)]
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

    #[inline]
    fn shards(&self) -> &Shards {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: once published, a table is never freed (only leaked on fork).
            return unsafe { &*p };
        }
        self.create()
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

    /// Insert; returns the entry previously recorded at `key` (a free we never saw).
    #[inline]
    pub fn insert(&self, key: u64, e: Entry) -> Option<Entry> {
        self.shards().shard(key).with(|m| m.insert(key, e))
    }

    /// Remove and return the entry at `key`.
    #[inline]
    pub fn remove(&self, key: u64) -> Option<Entry> {
        if self.ptr.load(Ordering::Acquire).is_null() {
            return None;
        }
        self.shards().shard(key).with(|m| m.remove(&key))
    }

    /// The entry at `key`, if live.
    pub fn get(&self, key: u64) -> Option<Entry> {
        if self.ptr.load(Ordering::Acquire).is_null() {
            return None;
        }
        self.shards().shard(key).with(|m| m.get(&key).copied())
    }

    /// Remove every entry matching `pred`, returning them.
    pub fn drain_where(&self, mut pred: impl FnMut(&Entry) -> bool) -> Vec<(u64, Entry)> {
        let mut out = Vec::new();
        if self.ptr.load(Ordering::Acquire).is_null() {
            return out;
        }
        for s in self.shards().shards.iter() {
            s.with(|m| {
                m.retain(|k, e| {
                    if pred(e) {
                        out.push((*k, *e));
                        false
                    } else {
                        true
                    }
                })
            });
        }
        out
    }

    /// Visit every live entry (shard by shard; not an atomic snapshot).
    pub fn for_each(&self, mut f: impl FnMut(u64, &Entry)) {
        if self.ptr.load(Ordering::Acquire).is_null() {
            return;
        }
        for s in self.shards().shards.iter() {
            s.with(|m| m.iter().for_each(|(k, e)| f(*k, e)));
        }
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(|_, _| n += 1);
        n
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
                        let k = (t << 40) | (i << 9);
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
        T.reset_leak();
        assert!(T.is_empty());
        assert!(T.remove(1 << 9).is_none());
    }
}
