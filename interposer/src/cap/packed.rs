//! The cap's table of live packed (sub-page) allocations per (device, 2 MiB page), behind a
//! lock a forked child can reset: a thread of the parent may hold it at the fork, in the
//! middle of an update, and that thread does not exist in the child (a `std::sync::Mutex`
//! would stay locked there for good, and every free of a packed allocation would wait on it).

use std::collections::HashMap;

use crate::sys::spin::{SpinGuard, SpinLock};

type Map = HashMap<(usize, u64), u32>;

pub(super) type PackedGuard<'a> = SpinGuard<'a, Map>;

pub(super) struct PackedTable(SpinLock<Map>);

impl PackedTable {
    pub(super) fn new() -> PackedTable {
        PackedTable(SpinLock::new(HashMap::new()))
    }

    /// The table, after at most `tries` attempts (spinning, then yielding); `None` when it
    /// stayed busy. The lock is only ever held for one map update.
    #[inline]
    pub(super) fn lock(&self, tries: u32) -> Option<PackedGuard<'_>> {
        self.0.lock_within(tries)
    }

    /// In a forked child, before anything else runs there (the atfork child handler, where
    /// the calling thread is the process's only one): the child holds no packed allocation,
    /// so the table starts empty and unlocked. The parent's map may be mid-update: it is
    /// moved out and forgotten, never read or dropped.
    pub(super) fn reset_in_child(&self) {
        // SAFETY: only the calling thread exists in a freshly forked child; no guard of it is
        // alive (the handler runs before any of the child's code).
        let map = unsafe { self.0.reset_in_child() };
        std::mem::forget(std::mem::take(map));
    }
}
