//! The cap's table of live packed (sub-page) allocations per (device, 2 MiB page), behind a
//! lock a forked child can reset: a thread of the parent may hold it at the fork, in the
//! middle of an update, and that thread does not exist in the child (a `std::sync::Mutex`
//! would stay locked there for good, and every free of a packed allocation would wait on it).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering::*};

type Map = HashMap<(usize, u64), u32>;

/// Spins before yielding: the lock is only ever held for one map update.
const SPINS: u32 = 64;

pub(super) struct PackedTable {
    locked: AtomicBool,
    map: UnsafeCell<Map>,
}

// SAFETY: `map` is only touched by the holder of `locked` (through `PackedGuard`), or by the
// only thread of a freshly forked child (`reset_in_child`).
unsafe impl Sync for PackedTable {}

pub(super) struct PackedGuard<'a> {
    t: &'a PackedTable,
}

impl Deref for PackedGuard<'_> {
    type Target = Map;
    fn deref(&self) -> &Map {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.t.map.get() }
    }
}

impl DerefMut for PackedGuard<'_> {
    fn deref_mut(&mut self) -> &mut Map {
        // SAFETY: the guard holds the lock, so this is the only reference.
        unsafe { &mut *self.t.map.get() }
    }
}

impl Drop for PackedGuard<'_> {
    fn drop(&mut self) {
        self.t.locked.store(false, Release);
    }
}

impl PackedTable {
    pub(super) fn new() -> PackedTable {
        PackedTable {
            locked: AtomicBool::new(false),
            map: UnsafeCell::new(HashMap::new()),
        }
    }

    /// The table, after at most `tries` attempts (spinning, then yielding); `None` when it
    /// stayed busy.
    pub(super) fn lock(&self, tries: u32) -> Option<PackedGuard<'_>> {
        for i in 0..tries {
            if self
                .locked
                .compare_exchange_weak(false, true, Acquire, Relaxed)
                .is_ok()
            {
                return Some(PackedGuard { t: self });
            }
            if i < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        None
    }

    /// In a forked child, before anything else runs there (the atfork child handler, where
    /// the calling thread is the process's only one): the child holds no packed allocation,
    /// so the table starts empty and unlocked. The parent's map may be mid-update: it is
    /// moved out and forgotten, never read or dropped.
    pub(super) fn reset_in_child(&self) {
        // SAFETY: only the calling thread exists in a freshly forked child; no guard of it is
        // alive (the handler runs before any of the child's code), so nothing else refers to
        // the map.
        let old = unsafe { std::mem::take(&mut *self.map.get()) };
        std::mem::forget(old);
        self.locked.store(false, Release);
    }
}
