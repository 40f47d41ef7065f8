//! A thread's life as the kernel ends it, not by its id: [`LifeToken`], a robust mutex that a
//! thread locks for good. A thread id says which thread lives *now*: once a thread has exited,
//! a new thread of the process may get the same id (the ids wrap, and a pid namespace may hand
//! the same id out again at once), and a check by id then finds the new thread alive. The
//! kernel, when a thread ends, walks that thread's robust list and marks every robust mutex the
//! thread still holds "owner died" (`FUTEX_OWNER_DIED`), whatever became of its id; a later
//! `pthread_mutex_trylock` from any thread says `EOWNERDEAD`. So a token held by a thread tells
//! another thread whether *that* thread has ended.
//!
//! The robust list is the C library's (glibc and musl keep one per thread and register it with
//! the kernel at thread start; a forked child starts with an empty one). A token that cannot be
//! armed (an error from the C library) says nothing, and its user falls back to the id.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};

/// `state`: the mutex is not (yet) the owner's: nothing to ask.
const UNARMED: u8 = 0;
/// The owner holds the mutex.
const ARMED: u8 = 1;
/// The owner has ended (found once; the mutex is released again).
const ENDED: u8 = 2;

/// Held by one thread for its life (see the module's note). Lives at a fixed address (inside
/// a leaked structure): the owner's robust list points at it while the owner lives.
pub(crate) struct LifeToken {
    m: UnsafeCell<libc::pthread_mutex_t>,
    state: AtomicU8,
}

// SAFETY: the mutex is initialized and locked only by its owner while the token is unarmed
// (no other thread touches it then), and afterwards only reached through the C library's
// mutex functions, which are thread-safe; `ended` and `disarm` are called by one thread at a
// time (the caller's contract).
unsafe impl Sync for LifeToken {}

impl LifeToken {
    pub(crate) const fn new() -> LifeToken {
        LifeToken {
            m: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
            state: AtomicU8::new(UNARMED),
        }
    }

    /// On the thread that owns the token from now on (an unarmed token: new, or
    /// [`LifeToken::disarm`]ed): make the mutex robust and lock it for the thread's life.
    /// False when the C library refused (the token then says nothing).
    pub(crate) fn arm(&self) -> bool {
        if self.state.load(Ordering::Acquire) != UNARMED {
            return false;
        }
        let m = self.m.get();
        // SAFETY: `attr` is initialized by pthread_mutexattr_init before use and destroyed
        // after; `m` points at this token's mutex, which nothing else touches while the token
        // is unarmed, and which never moves (the token lives in leaked memory).
        let ok = unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            if libc::pthread_mutexattr_init(&mut attr) != 0 {
                return false;
            }
            let ok = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST) == 0
                && libc::pthread_mutex_init(m, &attr) == 0
                && libc::pthread_mutex_trylock(m) == 0;
            libc::pthread_mutexattr_destroy(&mut attr);
            ok
        };
        if ok {
            self.state.store(ARMED, Ordering::Release);
        }
        ok
    }

    /// From another thread: `Some(true)` once the owner has ended, `Some(false)` while it
    /// holds the token, `None` when the token says nothing (unarmed, or an answer the C
    /// library should not give). One caller at a time.
    pub(crate) fn ended(&self) -> Option<bool> {
        match self.state.load(Ordering::Acquire) {
            ENDED => return Some(true),
            ARMED => {}
            _ => return None,
        }
        let m = self.m.get();
        // SAFETY: an armed token's mutex is initialized and never moves; trylock does not
        // block.
        match unsafe { libc::pthread_mutex_trylock(m) } {
            libc::EBUSY => Some(false),
            libc::EOWNERDEAD => {
                // Ours now: mark it usable and let it go (it leaves this thread's robust list),
                // so that the next owner can take it.
                // SAFETY: this thread holds the mutex (EOWNERDEAD hands it over).
                unsafe {
                    libc::pthread_mutex_consistent(m);
                    libc::pthread_mutex_unlock(m);
                }
                self.state.store(ENDED, Ordering::Release);
                Some(true)
            }
            0 => {
                // Not held: the owner never took it or let it go; nothing to say.
                // SAFETY: this thread just took it.
                unsafe { libc::pthread_mutex_unlock(m) };
                None
            }
            _ => None,
        }
    }

    /// Before the token goes to another thread (its owner has ended): unarmed again, to be
    /// [`LifeToken::arm`]ed by the next owner. One caller at a time, not while the next
    /// owner may arm it.
    pub(crate) fn disarm(&self) {
        self.state.store(UNARMED, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::LifeToken;

    /// A thread's token says it lives while it runs and that it ended once it has, without
    /// asking for its id; the token is then taken by the next thread and says the same of it.
    #[test]
    fn a_token_says_when_its_thread_ended() {
        static T: LifeToken = LifeToken::new();
        assert_eq!(T.ended(), None, "unarmed");
        for _ in 0..2 {
            let (armed_tx, armed_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let h = std::thread::spawn(move || {
                armed_tx.send(T.arm()).unwrap();
                go_rx.recv().unwrap();
            });
            assert!(armed_rx.recv().unwrap(), "armed");
            assert_eq!(T.ended(), Some(false), "held by a running thread");
            assert_eq!(T.ended(), Some(false), "asking again changes nothing");
            go_tx.send(()).unwrap();
            h.join().unwrap();
            assert_eq!(T.ended(), Some(true), "its thread has ended");
            assert_eq!(T.ended(), Some(true), "and stays ended");
            T.disarm();
            assert_eq!(T.ended(), None, "disarmed");
        }
    }
}
