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
//!
//! Arming adds the token to that list, and a token is armed on a thread's first traced call,
//! which may run in a signal handler; the handler may have interrupted the same thread inside
//! the C library's lock or unlock of another robust mutex, between its reads and writes of the
//! list: an insertion then would be overwritten or would unlink a neighbour (a mutex left
//! listed after it was freed: the kernel walks that memory at the thread's exit). Both C
//! libraries change the list only while the list's `list_op_pending` word (the kernel's
//! `struct robust_list_head`, the address `get_robust_list` gives) names the mutex being
//! changed, and clear it after (glibc's `ENQUEUE_MUTEX`/`DEQUEUE_MUTEX` in
//! `pthread_mutex_lock`/`trylock`/`unlock`, musl's `robust_list.pending`). So [`LifeToken::arm`]
//! reads that word with every signal blocked and arms only when it is clear: no operation on
//! the list is under way on this thread, and none can begin until the arming is done. Where the
//! word is set (or the kernel does not say where the list is) the token stays unarmed.

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
    /// False when the C library refused, or when this thread is inside an operation on its
    /// robust list (a signal handler interrupted it there; see the module's note): the token
    /// then says nothing. `unchecked` (a fault switch's) arms without looking.
    pub(crate) fn arm(&self, unchecked: bool) -> bool {
        if self.state.load(Ordering::Acquire) != UNARMED {
            return false;
        }
        let _blocked = BlockSignals::new();
        if !unchecked && !list_is_idle() {
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

/// The kernel's `struct robust_list_head` (`linux/futex.h`): the list, the offset of a
/// mutex's futex word from its list entry, and the entry being locked or unlocked.
#[repr(C)]
pub(crate) struct RobustListHead {
    pub list: *mut libc::c_void,
    pub futex_offset: libc::c_long,
    pub list_op_pending: *mut libc::c_void,
}

/// The robust list head the C library registered for the calling thread, if the kernel says.
pub(crate) fn robust_list_head() -> Option<*mut RobustListHead> {
    let mut head: *mut RobustListHead = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: get_robust_list(0, ..) writes the calling thread's head pointer and its size to
    // the two locals.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            0 as libc::c_long,
            &mut head as *mut *mut RobustListHead,
            &mut len as *mut libc::size_t,
        )
    };
    (r == 0 && !head.is_null() && len == std::mem::size_of::<RobustListHead>()).then_some(head)
}

/// No operation on the calling thread's robust list is under way: its `list_op_pending` is
/// clear. Call with signals blocked (nothing on this thread can begin one meanwhile).
fn list_is_idle() -> bool {
    let Some(head) = robust_list_head() else {
        return false;
    };
    // SAFETY: the head is the C library's, in the calling thread's descriptor, valid while
    // the thread lives; only this thread writes it, and it is not running anything else now
    // (a handler that interrupted a write sees it done or not done, both whole words).
    let pending = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*head).list_op_pending)) };
    pending.is_null()
}

/// Every signal blocked on the calling thread until dropped (the old mask restored).
pub(crate) struct BlockSignals(libc::sigset_t);

impl BlockSignals {
    pub(crate) fn new() -> BlockSignals {
        // SAFETY: both sets are plain data, filled by sigfillset / pthread_sigmask.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            BlockSignals(old)
        }
    }

    /// Every signal but those the kernel raises on the thread for what it executes (a fault,
    /// a trap: blocked, they would end the process instead of reaching their handler) blocked
    /// until dropped.
    pub(crate) fn asynchronous() -> BlockSignals {
        // SAFETY: both sets are plain data, filled by sigfillset / sigdelset / pthread_sigmask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for s in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
                libc::SIGSYS,
            ] {
                libc::sigdelset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            BlockSignals(old)
        }
    }
}

impl Drop for BlockSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new` on this thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
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
                armed_tx.send(T.arm(false)).unwrap();
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
