//! A test seam in the writer's tick ([`super::testing::on_tick`]): a hook the tick calls at
//! named points, on the thread that runs the tick and with the writer's lock held, so that a
//! test can hold the tick between two of its steps while other threads act. The windows
//! between a tick's steps are microseconds wide; a test that waits for a thread to land in one
//! by chance catches a wrong order once in dozens of loaded runs, one that holds the tick
//! there catches it every time.
//!
//! Unset (every real job), a tick pays one relaxed load per point.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a tick is when it calls the hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickPoint {
    /// The tick has written the buffers the threads handed over so far and is about to take
    /// every thread's partial buffer (`at_exit`: the exit path's tick, on the exiting
    /// thread).
    BeforeDrain { at_exit: bool },
    /// The tick has taken and written every thread's partial buffer (and what was handed
    /// over meanwhile), and is about to add its own records (`Lost` among them) and, at exit,
    /// the end record.
    AfterDrain { at_exit: bool },
    /// A tick that frees the slots of exited threads (one in 20, never at exit) has taken
    /// and written the partial buffers, and is about to free those slots and write their
    /// `ThreadExit` records.
    BeforeReap,
}

type Hook = Box<dyn FnMut(TickPoint) + Send>;

static SET: AtomicBool = AtomicBool::new(false);
static HOOK: Mutex<Option<Hook>> = Mutex::new(None);

/// Installs `hook` (None: removes it). A hook may call this itself (to remove or replace
/// itself): it is taken out of its place while it runs.
pub(crate) fn set(hook: Option<Hook>) {
    let mut g = HOOK.lock().unwrap_or_else(|p| p.into_inner());
    SET.store(hook.is_some(), Ordering::Release);
    *g = hook;
}

/// The tick is at `p`.
#[inline]
pub(crate) fn at(p: TickPoint) {
    if SET.load(Ordering::Relaxed) {
        call(p);
    }
}

#[cold]
#[inline(never)]
fn call(p: TickPoint) {
    let taken = HOOK.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(mut h) = taken else { return };
    h(p);
    let mut g = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    // Put back unless the hook removed or replaced itself meanwhile.
    if g.is_none() && SET.load(Ordering::Acquire) {
        *g = Some(h);
    }
}

/// Forked child: the parent's hook belongs to the parent's test (and its lock may be held by
/// a thread that does not exist here). A plain store.
pub(crate) fn on_fork_child() {
    SET.store(false, Ordering::Relaxed);
}
