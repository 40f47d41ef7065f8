//! One-time set-up that a forked child can take back: [`Setup`] runs a set-up once and keeps
//! its answer, [`SetupCell`] holds a value the set-up produced.
//!
//! `std::sync::Mutex` and `OnceLock` cannot be used for a set-up that may run while the
//! process forks: when another thread of the parent is inside it at the fork, that thread
//! does not exist in the child, the mutex stays locked there and the `OnceLock` stays
//! "being initialized" for good, and the child's first call that needs the set-up blocks
//! forever. Here the state is one atomic word (not started / running, with the running
//! thread's id / done, with the answer) that the atfork child handler puts back to "not
//! started" when the parent's set-up was running; the values are atomic pointers to leaked
//! boxes, which the child forgets (never reads or frees) in the same case.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Not started (or given back by a panic, or by a fork while it ran).
const IDLE: u64 = 0;
/// Done: the set-up answered true.
const ON: u64 = 1;
/// Done: the set-up answered false.
const OFF: u64 = 2;
/// Running (low two bits), on the thread whose id is in the bits above.
const RUNNING: u64 = 3;

/// A set-up run once per process (once more in a child forked while it ran).
pub(crate) struct Setup {
    state: AtomicU64,
}

impl Default for Setup {
    fn default() -> Self {
        Self::new()
    }
}

impl Setup {
    pub(crate) const fn new() -> Setup {
        Setup {
            state: AtomicU64::new(IDLE),
        }
    }

    /// The set-up's answer: once it is done, one acquire load (what it wrote before it
    /// answered is visible); before, what `set_up` says (which calls [`Setup::run`], out of
    /// line). Two compares of the one word: an `Option<bool>` made of it compiled to a dozen
    /// instructions on every capped request.
    #[inline(always)]
    pub(crate) fn answer(&self, set_up: impl FnOnce() -> bool) -> bool {
        match self.state.load(Ordering::Acquire) {
            ON => true,
            OFF => false,
            _ => set_up(),
        }
    }

    /// Whether the set-up is done and answered true (never runs it).
    #[inline(always)]
    pub(crate) fn is_on(&self) -> bool {
        self.state.load(Ordering::Acquire) == ON
    }

    /// The answer once done, `None` before.
    #[cfg(test)]
    pub(crate) fn done(&self) -> Option<bool> {
        match self.state.load(Ordering::Acquire) {
            ON => Some(true),
            OFF => Some(false),
            _ => None,
        }
    }

    /// The set-up's answer, running `f` for it on this thread when no thread has. A thread
    /// that finds another one running it waits for that one; one that finds itself running it
    /// (reached again from inside `f`) gets false at once, as if the set-up were off. A panic
    /// in `f` leaves it not started (the next call tries again) and unwinds.
    #[cold]
    pub(crate) fn run(&self, f: impl FnOnce() -> bool) -> bool {
        let me = (u64::from(super::ids::tid()) << 2) | RUNNING;
        let mut attempt = 0u32;
        loop {
            match self
                .state
                .compare_exchange(IDLE, me, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(ON) => return true,
                Err(OFF) => return false,
                Err(s) if s == me => return false,
                Err(_) => {
                    wait(attempt);
                    attempt = attempt.saturating_add(1);
                }
            }
        }
        struct GiveBack<'a>(&'a AtomicU64);
        impl Drop for GiveBack<'_> {
            fn drop(&mut self) {
                self.0.store(IDLE, Ordering::Release);
            }
        }
        let unwinding = GiveBack(&self.state);
        let ok = f();
        std::mem::forget(unwinding);
        self.state
            .store(if ok { ON } else { OFF }, Ordering::Release);
        ok
    }

    /// Whether a thread is running the set-up now.
    pub(crate) fn running(&self) -> bool {
        self.state.load(Ordering::Acquire) & 3 == RUNNING
    }

    /// In a forked child, before anything else runs there (the atfork child handler): a
    /// set-up that a thread of the parent was running is not done and never will be here, so
    /// it goes back to not started; the child's first use runs it again. The caller forgets
    /// the values that set-up may have left half made (see [`SetupCell::forget_in_child`]).
    /// Returns whether it was running.
    pub(crate) fn reset_in_child(&self) -> bool {
        if self.running() {
            self.state.store(IDLE, Ordering::Release);
            return true;
        }
        false
    }
}

/// Waiting for another thread's set-up, which may take long (a shared file created, the
/// driver asked): a few spins, then yields, then short sleeps, so that waiters do not keep
/// the CPU from the thread they wait for.
fn wait(attempt: u32) {
    if attempt < 64 {
        std::hint::spin_loop();
    } else if attempt < 128 {
        std::thread::yield_now();
    } else {
        let us = 50u64 << ((attempt - 128).min(4));
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

/// A value a [`Setup`] writes once and readers read after its answer (`get` never blocks):
/// a pointer to a leaked box, so that a child forked while the set-up was writing it can
/// forget it without reading what may be half made.
pub(crate) struct SetupCell<T> {
    ptr: AtomicPtr<T>,
}

impl<T> Default for SetupCell<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> SetupCell<T> {
    pub(crate) const fn new() -> SetupCell<T> {
        SetupCell {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        // SAFETY: a non-null pointer is a box that `set` leaked and only `Drop` (with `&mut
        // self`, so no reference handed out here is alive) frees.
        unsafe { self.ptr.load(Ordering::Acquire).as_ref() }
    }

    /// Stores `v` unless a value is there already (then `v` comes back). Called by the
    /// thread running the set-up.
    pub(crate) fn set(&self, v: T) -> Result<(), T> {
        let p = Box::into_raw(Box::new(v));
        match self.ptr.compare_exchange(
            std::ptr::null_mut(),
            p,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            // SAFETY: `p` came from `Box::into_raw` above and was not published.
            Err(_) => Err(*unsafe { Box::from_raw(p) }),
        }
    }

    /// The value, made by `f` and stored when there is none yet (by the thread running the
    /// set-up: no two threads make it at once).
    pub(crate) fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        if let Some(v) = self.get() {
            return v;
        }
        let _ = self.set(f());
        self.get().expect("a value was just stored")
    }

    /// In a forked child whose [`Setup`] was running at the fork: the value (maybe half
    /// written, or not at all) is forgotten: never read, never freed.
    pub(crate) fn forget_in_child(&self) {
        self.ptr.store(std::ptr::null_mut(), Ordering::Release);
    }
}

impl<T> Drop for SetupCell<T> {
    fn drop(&mut self) {
        let p = *self.ptr.get_mut();
        if !p.is_null() {
            // SAFETY: `p` is the box `set` leaked; `&mut self` means no reference from `get`
            // is alive.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

// SAFETY: the cell hands out `&T` to any thread and moves a `T` in from the setting thread.
unsafe impl<T: Send + Sync> Sync for SetupCell<T> {}
// SAFETY: as above; the cell owns its box.
unsafe impl<T: Send> Send for SetupCell<T> {}

/// For the tests of a set-up a forked child must take back: a thread runs `setup` with `f`,
/// paused inside it while this thread forks; the child runs `child` (the atfork reset, then
/// its checks: true when they hold) and exits. Returns the child's exit code (None: it hung
/// and was killed after 60 s) and the parent's answer once `f` went on.
#[cfg(test)]
pub(crate) fn fork_during_setup(
    setup: &'static Setup,
    f: fn() -> bool,
    child: fn() -> bool,
) -> (Option<i32>, bool) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let finder = std::thread::spawn(move || {
        setup.run(|| {
            held_tx.send(()).unwrap();
            let _ = go_rx.recv();
            f()
        })
    });
    held_rx.recv().unwrap();
    // SAFETY: fork has no memory preconditions; the child runs only `child` (no panics, no
    // locks of the test harness) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = child();
        // SAFETY: ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }
    let code = wait_child_bounded(pid, std::time::Duration::from_secs(60));
    go_tx.send(()).unwrap();
    (code, finder.join().unwrap())
}

/// For the tests that fork while a thread is inside something a child must take back: waits
/// for child `pid` at most `limit` and kills it past that. Its exit code, or None when it had
/// to be killed (it hung) or did not exit normally.
#[cfg(test)]
pub(crate) fn wait_child_bounded(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let end = std::time::Instant::now() + limit;
    let mut status = 0;
    loop {
        // SAFETY: the caller's own child; a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if std::time::Instant::now() > end {
            // SAFETY: the caller's own child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn runs_once_and_keeps_its_answer() {
        let s = Setup::new();
        let runs = AtomicU32::new(0);
        assert_eq!(s.done(), None);
        assert!(!s.run(|| {
            runs.fetch_add(1, Ordering::Relaxed);
            false
        }));
        assert!(!s.run(|| {
            runs.fetch_add(1, Ordering::Relaxed);
            true
        }));
        assert_eq!((s.done(), runs.load(Ordering::Relaxed)), (Some(false), 1));
    }

    #[test]
    fn waiters_get_the_running_threads_answer_and_reentry_does_not_wait() {
        static S: Setup = Setup::new();
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let hs: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    S.run(|| {
                        RUNS.fetch_add(1, Ordering::Relaxed);
                        // Reached again from inside: false at once, not a deadlock.
                        assert!(!S.run(|| true));
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        true
                    })
                })
            })
            .collect();
        for h in hs {
            assert!(h.join().unwrap());
        }
        assert_eq!(RUNS.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_panic_leaves_it_not_started() {
        let s = Setup::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.run(|| panic!("set-up"));
        }));
        assert!(r.is_err());
        assert_eq!(s.done(), None);
        assert!(s.run(|| true));
    }

    /// A set-up left running (as by a thread of the parent at a fork) is taken back and run
    /// again; its half-made value is forgotten.
    #[test]
    fn a_child_takes_a_running_setup_back() {
        let s = Setup::new();
        let cell = SetupCell::new();
        // Another thread's set-up, running.
        s.state.store((12345 << 2) | RUNNING, Ordering::Relaxed);
        cell.set(7u32).unwrap();
        assert!(s.running());
        assert!(s.reset_in_child());
        cell.forget_in_child();
        assert!(cell.get().is_none());
        assert!(s.run(|| cell.set(8).is_ok()));
        assert_eq!(cell.get(), Some(&8));
        // Done: nothing to take back.
        assert!(!s.reset_in_child());
        assert_eq!(s.done(), Some(true));
    }

    #[test]
    fn a_cell_is_set_once() {
        let c = SetupCell::new();
        assert_eq!(*c.get_or_init(|| String::from("a")), "a");
        assert_eq!(c.set(String::from("b")), Err(String::from("b")));
        assert_eq!(*c.get_or_init(|| String::from("c")), "a");
    }
}
