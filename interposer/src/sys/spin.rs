//! The one spin lock, for data that every holder keeps for a short update and that a forked
//! child must be able to take back: a thread of the parent may hold the lock at the fork, in
//! the middle of an update, and that thread does not exist in the child (a
//! `std::sync::Mutex` would stay locked there for good). It spins a little, then yields, so
//! a holder that was preempted gets the CPU back.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Attempts that spin before the waiter starts yielding.
const SPINS: u32 = 64;

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: `value` is only reached through a `SpinGuard`, which only the thread that set
// `locked` holds, or by the only thread of a freshly forked child (`reset_in_child`).
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// The lock, held until dropped (also when the holder panics: the lock is released).
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline(always)]
    fn try_acquire(&self) -> bool {
        self.locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The lock, however long it takes.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        let mut attempt = 0u32;
        while !self.try_acquire() {
            back_off(attempt);
            attempt = attempt.saturating_add(1);
        }
        SpinGuard { lock: self }
    }

    /// The lock after at most `attempts` attempts; `None` when it stayed busy.
    #[inline]
    pub(crate) fn lock_within(&self, attempts: u32) -> Option<SpinGuard<'_, T>> {
        for attempt in 0..attempts {
            if self.try_acquire() {
                return Some(SpinGuard { lock: self });
            }
            back_off(attempt);
        }
        None
    }

    /// In a forked child, before anything else runs there (the atfork child handler, where
    /// the calling thread is the process's only one): the lock is released and the value
    /// handed to the caller to reset, whatever state a vanished holder left it in.
    ///
    /// # Safety
    /// The calling thread is the only one and holds no guard of this lock.
    #[allow(clippy::mut_from_ref)] // the caller's contract makes it the only reference
    pub(crate) unsafe fn reset_in_child(&self) -> &mut T {
        self.locked.store(false, Ordering::Release);
        // SAFETY: the caller is the only thread and holds no guard: nothing else refers to
        // the value.
        unsafe { &mut *self.value.get() }
    }
}

/// One wait of a spin, the `attempt`-th: a pause instruction first, a yield later.
#[inline]
pub(crate) fn back_off(attempt: u32) {
    if attempt < SPINS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, so this is the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;

    /// Mutual exclusion: threads that each add to a plain (non-atomic) counter under the lock
    /// lose no increment, read-modify-write spread over a yield so a broken lock shows.
    #[test]
    fn no_update_is_lost() {
        static L: SpinLock<u64> = SpinLock::new(0);
        const THREADS: u64 = 4;
        const EACH: u64 = 2000;
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        if t % 2 == 0 {
                            let mut g = L.lock();
                            let v = *g;
                            if i % 64 == 0 {
                                std::thread::yield_now();
                            }
                            *g = v + 1;
                        } else {
                            let mut g = L.lock_within(u32::MAX).unwrap();
                            let v = *g;
                            if i % 64 == 0 {
                                std::thread::yield_now();
                            }
                            *g = v + 1;
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*L.lock(), THREADS * EACH);
    }

    #[test]
    fn a_busy_lock_is_given_up_and_a_child_takes_it_back() {
        let l = SpinLock::new(7u32);
        let g = l.lock();
        assert!(l.lock_within(100).is_none());
        std::mem::forget(g);
        // SAFETY: this thread holds no guard (forgotten) and no other thread uses `l`.
        *unsafe { l.reset_in_child() } = 0;
        assert_eq!(*l.lock_within(1).unwrap(), 0);
    }

    #[test]
    fn a_panicking_holder_releases_the_lock() {
        let l = SpinLock::new(0u32);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock();
            panic!("holder");
        }));
        assert!(r.is_err());
        assert!(l.lock_within(1).is_some());
    }
}
