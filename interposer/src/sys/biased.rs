//! The one biased lock: for data that one thread (its owner) changes on almost every call
//! and other threads need rarely (a thread's part of the live table, a thread's trace
//! buffer). The owner's way in costs two plain stores and a load, no locked instruction (an
//! uncontended `lock cmpxchg` and its release cost ~15-30 ns on a VM, more than the rest of
//! a traced call): it raises `busy` and checks `lock`. The rare side takes `lock`, then pays
//! for both sides with one [`membarrier::all_threads`](super::membarrier::all_threads)
//! (every running thread of the process executes a full memory barrier before it returns)
//! and waits for `busy` to drop. With the barrier between the locker's store and its load,
//! the two cannot both miss each other: either the owner sees the lock (and takes it like
//! anyone else), or the locker sees the owner busy (and waits for it). This is Dekker's
//! mutual exclusion with the owner's barrier paid by the rare side.
//!
//! Without `membarrier` (old kernel, seccomp) the owner may not use the window: it takes the
//! lock every time (`owner_enter(false)`), and lockers skip the barrier.

use std::sync::atomic::{AtomicBool, Ordering, compiler_fence};

use super::spin::back_off;

pub(crate) struct BiasedLock {
    /// Held by a locker, or by the owner outside its window.
    lock: AtomicBool,
    /// The owner is inside its window (changing the data without the lock).
    busy: AtomicBool,
}

impl Default for BiasedLock {
    fn default() -> Self {
        Self::new()
    }
}

impl BiasedLock {
    pub(crate) const fn new() -> BiasedLock {
        BiasedLock {
            lock: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        }
    }

    /// The owner's window: true when it is in (no one holds the lock; leave with
    /// [`BiasedLock::leave_window`]), false when a locker holds the lock (nothing held).
    #[inline(always)]
    pub(crate) fn try_window(&self) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        // Keeps the compiler from moving the lock's load above the flag's store; the CPU's
        // store-load order is enforced by the locker's membarrier.
        compiler_fence(Ordering::SeqCst);
        if !self.lock.load(Ordering::Acquire) {
            return true;
        }
        self.busy.store(false, Ordering::Release);
        false
    }

    #[inline(always)]
    pub(crate) fn leave_window(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// The owner's way in: its window where `window` allows it and no one holds the lock
    /// (returns true), else the lock (false). Leave with [`BiasedLock::owner_leave`].
    #[inline(always)]
    pub(crate) fn owner_enter(&self, window: bool) -> bool {
        if window && self.try_window() {
            return true;
        }
        self.lock();
        false
    }

    /// Leave what [`BiasedLock::owner_enter`] returned: the window (true) or the lock.
    #[inline(always)]
    pub(crate) fn owner_leave(&self, in_window: bool) {
        if in_window {
            self.leave_window();
        } else {
            self.unlock();
        }
    }

    /// Take the lock, however long it takes (spinning, then yielding). A locker that must
    /// exclude the owner's window then runs the barrier and [`BiasedLock::wait_owner`].
    pub(crate) fn lock(&self) {
        let mut attempt = 0u32;
        while self.lock.swap(true, Ordering::Acquire) {
            while self.lock.load(Ordering::Relaxed) {
                back_off(attempt);
                attempt = attempt.saturating_add(1);
            }
        }
    }

    /// Take the lock, calling `again` (which waits) after each failed attempt until it says
    /// to give up (false: the lock stayed held, nothing taken).
    pub(crate) fn try_lock_with(&self, mut again: impl FnMut() -> bool) -> bool {
        loop {
            if !self.lock.swap(true, Ordering::Acquire) {
                return true;
            }
            if !again() {
                return false;
            }
        }
    }

    #[inline(always)]
    pub(crate) fn unlock(&self) {
        self.lock.store(false, Ordering::Release);
    }

    /// With the lock held and the barrier run: wait until the owner has left its window.
    pub(crate) fn wait_owner(&self) {
        let mut attempt = 0u32;
        while self.busy.load(Ordering::Acquire) {
            back_off(attempt);
            attempt = attempt.saturating_add(1);
        }
    }

    /// Asked by the owner about itself: true when it is inside (its window, or the lock),
    /// which it can only be while running something that interrupted it there (a signal
    /// handler). Then it cannot leave while it asks: waiting for it would wait for nothing.
    /// Only meaningful where no other thread takes the lock meanwhile (the exit path holds
    /// the trace writer's lock, which every other locker holds first).
    pub(crate) fn owner_is_inside(&self) -> bool {
        self.busy.load(Ordering::Relaxed) || self.lock.load(Ordering::Relaxed)
    }

    /// [`BiasedLock::wait_owner`], calling `again` (which waits) between looks until it says
    /// to give up (false: the owner stayed in its window; a thread stopped there: the caller
    /// must not touch the data).
    pub(crate) fn owner_left_with(&self, mut again: impl FnMut() -> bool) -> bool {
        loop {
            if !self.busy.load(Ordering::Acquire) {
                return true;
            }
            if !again() {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BiasedLock;
    use std::cell::UnsafeCell;

    struct Shared {
        lock: BiasedLock,
        n: UnsafeCell<u64>,
    }
    // SAFETY: `n` is only touched inside the owner's window or under the lock with the
    // owner waited for (the protocol under test).
    unsafe impl Sync for Shared {}

    /// `*n += 1` as a read, a pause and a write, so that two sides inside at once lose an
    /// update.
    ///
    /// # Safety
    /// `n` is valid, and the caller holds the protocol's exclusion.
    unsafe fn add_slowly(n: *mut u64) {
        // SAFETY: per the caller.
        let v = unsafe { std::ptr::read_volatile(n) };
        for _ in 0..20 {
            std::hint::spin_loop();
        }
        // SAFETY: per the caller.
        unsafe { std::ptr::write_volatile(n, v + 1) };
    }

    /// The owner adds in its window, a locker adds under the lock after the barrier: no
    /// update is lost (a plain read-modify-write on each side). Without membarrier the owner
    /// takes the lock, and so does this test.
    #[test]
    fn owner_and_locker_exclude_each_other() {
        static S: Shared = Shared {
            lock: BiasedLock::new(),
            n: UnsafeCell::new(0),
        };
        let window = crate::sys::membarrier::available();
        const EACH: u64 = 200_000;
        let owner = std::thread::spawn(move || {
            for _ in 0..EACH {
                let w = S.lock.owner_enter(window);
                // SAFETY: inside the window or holding the lock.
                unsafe { add_slowly(S.n.get()) };
                S.lock.owner_leave(w);
            }
        });
        let mut locked = 0u64;
        while !owner.is_finished() || locked < 1000 {
            S.lock.lock();
            if window {
                assert!(crate::sys::membarrier::all_threads());
                S.lock.wait_owner();
            }
            // SAFETY: the lock is held and the owner is out of its window.
            unsafe { add_slowly(S.n.get()) };
            S.lock.unlock();
            locked += 1;
            if locked.is_multiple_of(16) {
                std::thread::yield_now();
            }
        }
        owner.join().unwrap();
        // SAFETY: both threads are done.
        assert_eq!(unsafe { *S.n.get() }, EACH + locked);
    }

    #[test]
    fn bounded_ways_in_give_up() {
        let l = BiasedLock::new();
        let mut asked = 0;
        assert!(l.try_lock_with(|| unreachable!("the lock was free")));
        assert!(!l.try_lock_with(|| {
            asked += 1;
            asked < 100
        }));
        assert_eq!(
            asked, 100,
            "asked after each failed attempt until told to stop"
        );
        assert!(!l.try_window());
        l.unlock();
        assert!(l.try_window());
        asked = 0;
        assert!(!l.owner_left_with(|| {
            asked += 1;
            asked < 100
        }));
        assert_eq!(asked, 100);
        l.leave_window();
        assert!(l.owner_left_with(|| unreachable!("the owner had left")));
    }
}
