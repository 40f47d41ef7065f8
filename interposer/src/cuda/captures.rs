//! The stream captures the process has under way (the hooks on every begin- and end-capture
//! entry point report them), and whether the calling thread may make a call now that would
//! break one. What a real driver does is tests/workloads/sim/driver_facts.expected (an H200,
//! driver 580.159.04): `cuCtxSynchronize` is refused during any capture of the context and
//! invalidates every one, whatever the modes ([`ctx_sync_forbidden`]); the calls CUDA calls
//! potentially unsafe (`cuMemAlloc`, `cuMemFree`, an event query or synchronization, a
//! stream's synchronization or query, `cuMemPoolTrimTo`, stream-ordered calls on a stream that
//! does not capture) fail and invalidate a capture where the mode rules below forbid the
//! calling thread them ([`forbid_unsafe_calls`]); the virtual-memory calls (`cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`, ...), event creation, destruction and records, and waits on
//! streams that do not capture are allowed during any capture. The layers that make calls of
//! their own (the pool, the cap's settling of the driver's pools, the runtime's last error) ask
//! here first.
//!
//! CUDA's rules (`cuThreadExchangeStreamCaptureMode`): a thread in global mode (the default)
//! is forbidden while it has a capture of its own not begun in relaxed mode, or while any other
//! thread has a capture begun in global mode; in thread-local mode only its own captures count;
//! in relaxed mode none does. The thread's mode is read from the driver (two exchanges: there
//! is no query), only while some capture is under way.
//!
//! A stream also captures when it joined a capture (it waited on an event recorded in a
//! capturing stream); no begin call names it, so the driver is asked about it ([`capturing`]).
//! A begin call in flight is recorded as such, and the capture only once the call succeeded:
//! the library's own decisions wait for the call's outcome ([`beginning`], [`gated`]).

use crate::cuda::real;
use crate::cuda::types::{CUDA_SUCCESS, CUstream};
use crate::sys::pause;
use crate::sys::spin::SpinLock;
use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL` (== `cudaStreamCaptureModeGlobal`).
pub(crate) const MODE_GLOBAL: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
#[cfg(test)]
const MODE_THREAD_LOCAL: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub(crate) const MODE_RELAXED: c_int = 2;
/// `CU_STREAM_CAPTURE_STATUS_NONE`: the stream is not capturing.
const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
const CU_STREAM_PER_THREAD: u64 = 0x2;
/// `CU_STREAM_LEGACY`: the legacy default stream.
const CU_STREAM_LEGACY: u64 = 0x1;
/// Stream keys with this bit are per-thread default streams: `PER_THREAD_BASE | tid`.
const PER_THREAD_BASE: u64 = vramshim_pool::streams::PER_THREAD_BASE;

#[derive(Clone, Copy)]
struct Capture {
    /// The stream, as the caller keys streams (the pool's stream ids).
    stream: u64,
    mode: c_int,
    /// The thread that began it.
    tid: u32,
    /// The real begin call succeeded: the capture is under way. Until then (`beginning`) the
    /// entry only makes the library's own unsafe calls wait (see [`beginning`]).
    begun: bool,
    /// Begin hooks on the stream whose real call has not returned (the runtime's begin and
    /// the driver's it reaches are two), and the thread that makes them.
    beginning: u32,
    begin_tid: u32,
}

/// Captures under way and begins in flight (few: one per capturing stream).
static CAPTURES: SpinLock<Vec<Capture>> = SpinLock::new(Vec::new());
/// How many entries: the test every unsafe call pays while none is under way.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Begin hooks whose real call has not returned, on every thread.
static BEGINNING: AtomicUsize = AtomicUsize::new(0);
/// The thread holding the pool's lock that stopped waiting for the begins in flight (see
/// [`wait_for_begins`]); 0: none. Set and cleared under the pool's lock.
static POOL_LOCK_COUNTS: AtomicU32 = AtomicU32::new(0);
/// Threads inside [`gated`] (a decision that no capture forbids a call, and the call).
static GATED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread is inside [`gated`] (a nested section is the same one).
    static IN_GATE: Cell<bool> = const { Cell::new(false) };
    /// This thread stopped waiting for another thread's begin (see [`wait_for_begins`]): until
    /// its section ends, that begin counts as a capture under way.
    static COUNT_BEGINNING: Cell<bool> = const { Cell::new(false) };
    /// This thread holds the pool's lock around a call that may reach a [`gated`] section
    /// (see [`under_pool_lock`]).
    static UNDER_POOL_LOCK: Cell<bool> = const { Cell::new(false) };
    /// This thread's section outlived its closure ([`gated_held`]): 0 none, else
    /// [`HELD_OPEN`] or [`HELD_GAVE_UP`] (it stopped waiting for a begin on the way in).
    static HELD: Cell<u8> = const { Cell::new(0) };
}

const HELD_OPEN: u8 = 1;
const HELD_GAVE_UP: u8 = 2;

/// How long a section waits for another thread's real begin call to return before it counts
/// that capture as under way (the begin may wait on a lock of the runtime's the section's own
/// caller holds).
const BEGIN_WAIT: Duration = Duration::from_secs(1);
/// How long a begin waits for the sections in flight (a `cuCtxSynchronize` waits for the
/// device's work) before it begins anyway.
const SECTION_WAIT: Duration = Duration::from_secs(5);

/// The calling thread is about to make the real begin-capture call on `stream` in `mode`:
/// recorded as a begin in flight, not as a capture. While it is in flight, the library's own
/// unsafe calls on other threads wait for its outcome ([`wait_for_begins`], the pool's lock
/// through `pool::wait_for_requests`, [`gated`]) instead of deciding with or without it: a
/// capture that then fails to begin (the legacy stream, a stream already capturing) was never
/// seen by anyone, and one that begins is seen by every decision made after the call. The
/// caller then waits for the decisions already made ([`wait_for_sections`] and the pool's
/// lock), so that their calls land before the real begin. Returns false for a begin nested in
/// one this thread already has in flight on the stream (the runtime's begin reaching the
/// driver's): the outer one waited.
pub(crate) fn beginning(stream: u64, mode: c_int) -> bool {
    let tid = crate::sys::ids::tid();
    let mut c = CAPTURES.lock();
    let outer = if let Some(x) = c.iter_mut().find(|x| x.stream == stream) {
        let outer = !(x.beginning > 0 && x.begin_tid == tid);
        x.beginning += 1;
        x.begin_tid = tid;
        outer
    } else {
        c.push(Capture {
            stream,
            mode,
            tid,
            begun: false,
            beginning: 1,
            begin_tid: tid,
        });
        true
    };
    ACTIVE.store(c.len(), Ordering::Release);
    BEGINNING.fetch_add(1, Ordering::SeqCst);
    outer
}

/// The real begin call of [`beginning`] returned: `ok`, the capture is under way (recorded);
/// else nothing changed (a capture already under way on the stream goes on).
pub(crate) fn began(stream: u64, mode: c_int, ok: bool) {
    let tid = crate::sys::ids::tid();
    let mut c = CAPTURES.lock();
    if let Some(x) = c.iter_mut().find(|x| x.stream == stream) {
        x.beginning = x.beginning.saturating_sub(1);
        if ok {
            x.begun = true;
            x.mode = mode;
            x.tid = tid;
        }
    }
    c.retain(|x| x.begun || x.beginning > 0);
    ACTIVE.store(c.len(), Ordering::Release);
    BEGINNING.fetch_sub(1, Ordering::SeqCst);
}

/// A capture recorded as begun at once, the real call's outcome not awaited: for the begin
/// hooks' test switches only (`VRAMSHIM_POOL_DEBUG=begin-unordered`, `begin-recorded-first`,
/// see `pool`), and unit tests.
pub(crate) fn begun_now(stream: u64, mode: c_int) {
    beginning(stream, mode);
    began(stream, mode, true);
}

/// The capture of `stream` ended (or the stream was destroyed).
pub(crate) fn ended(stream: u64) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut c = CAPTURES.lock();
    for x in c.iter_mut().filter(|x| x.stream == stream) {
        x.begun = false;
    }
    c.retain(|x| x.begun || x.beginning > 0);
    ACTIVE.store(c.len(), Ordering::Release);
}

/// Whether another thread has a begin in flight (one load while none has).
fn others_beginning(me: u32) -> bool {
    BEGINNING.load(Ordering::SeqCst) != 0
        && CAPTURES
            .lock()
            .iter()
            .any(|x| x.beginning > 0 && x.begin_tid != me)
}

/// Called with none of the library's locks held, before a decision that no capture forbids a
/// call (the pool's lock taken, [`gated`]): waits until no other thread has a begin in flight,
/// so that the decision sees its outcome (the caller then takes its lock again and asks
/// again: a begin may have come meanwhile). After [`BEGIN_WAIT`] it stops waiting: the
/// begins still in flight count as captures under way for this thread until
/// [`done_counting_begins`] (the old, conservative answer, which may refuse a call for a
/// capture that never begins). True when it stopped so.
#[cold]
#[inline(never)]
pub(crate) fn wait_for_begins() -> bool {
    let me = crate::sys::ids::tid();
    if COUNT_BEGINNING.with(Cell::get) {
        return false;
    }
    pause::at(pause::Point::Request, || others_beginning(me));
    let start = Instant::now();
    let mut attempt = 0u32;
    while others_beginning(me) {
        if start.elapsed() > BEGIN_WAIT {
            COUNT_BEGINNING.with(|c| c.set(true));
            crate::debug!(
                "captures: a begin-capture call on another thread is slow to return: counted as begun"
            );
            return true;
        }
        crate::sys::spin::back_off(attempt);
        attempt = attempt.saturating_add(1);
    }
    false
}

/// Whether the pool's lock, just taken, must be let go for [`wait_for_begins`]: another thread
/// has a begin in flight that this one has not given up waiting for. One load while no begin
/// is in flight.
#[inline]
pub(crate) fn must_wait_for_begins() -> bool {
    BEGINNING.load(Ordering::SeqCst) != 0 && must_wait_cold()
}

#[cold]
#[inline(never)]
fn must_wait_cold() -> bool {
    !COUNT_BEGINNING.with(Cell::get) && others_beginning(crate::sys::ids::tid())
}

/// The pool's lock was just taken: whoever held it before no longer counts the begins in
/// flight (one store).
#[inline]
pub(crate) fn pool_lock_taken() {
    POOL_LOCK_COUNTS.store(0, Ordering::Relaxed);
}

/// The calling thread took the pool's lock after [`wait_for_begins`] stopped waiting: until
/// the lock is taken again, the begins in flight count as captures under way for it.
pub(crate) fn pool_lock_counts_begins() {
    COUNT_BEGINNING.with(|c| c.set(false));
    POOL_LOCK_COUNTS.store(crate::sys::ids::tid(), Ordering::Relaxed);
}

/// Whether the calling thread counts the begins in flight on other threads as captures.
fn counting_begins() -> bool {
    COUNT_BEGINNING.with(Cell::get)
        || POOL_LOCK_COUNTS.load(Ordering::Relaxed) == crate::sys::ids::tid()
}

/// The section that stopped waiting for a begin ([`wait_for_begins`] returned true) is over.
pub(crate) fn done_counting_begins() {
    COUNT_BEGINNING.with(|c| c.set(false));
}

/// `f`, made by the pool under its lock, may reach a [`gated`] section (the cap's charge of a
/// pool page empties the driver's pools when it would refuse): such a section neither waits
/// for a begin in flight on another thread nor is waited for. A begin that starts while the
/// lock is held waits for it before its real call (`pool::wait_for_requests`), so no capture
/// it begins can precede `f`'s calls, and waiting for it would wait for the lock this thread
/// holds; a begin already in flight when the lock was taken was waited for then, or is counted
/// as under way ([`pool_lock_counts_begins`]).
pub(crate) fn under_pool_lock<R>(f: impl FnOnce() -> R) -> R {
    let outer = UNDER_POOL_LOCK.with(|c| c.replace(true));
    let r = f();
    UNDER_POOL_LOCK.with(|c| c.set(outer));
    r
}

/// `f` decides whether a capture forbids a potentially unsafe call and makes it, outside the
/// pool's lock (the runtime's last error set with `cudaMalloc`, the cap's settling of the
/// driver's pools): a begin in flight on another thread is waited for first, and a begin that
/// starts later waits for `f` to return ([`wait_for_sections`]) before its real call, so the
/// call cannot land inside a capture `f` did not see. Nested sections on one thread are one.
pub(crate) fn gated<R>(f: impl FnOnce() -> R) -> R {
    let Some(gave_up) = open_section() else {
        return f();
    };
    let r = f();
    close_section(gave_up);
    r
}

/// [`gated`] for a section whose caller makes one more potentially unsafe call after `f`, a
/// call the section's decision was made for (the request that wanted the cap's settling of
/// the driver's pools makes its real allocation then): when `f` answers true the section
/// stays open, and a begin on another thread keeps waiting ([`wait_for_sections`]), until
/// [`release_held`] (the caller, once that call returned); false closes it as [`gated`]
/// does. Where no section of its own opens (nested in one, under the pool's lock,
/// `sections-ungated`) `f` runs as in [`gated`] and nothing is kept: the enclosing section
/// or lock orders the begins. Under `VRAMSHIM_POOL_DEBUG=settle-unheld` (testing only) the
/// section always closes with `f`, as once.
pub(crate) fn gated_held(f: impl FnOnce() -> bool) -> bool {
    let Some(gave_up) = open_section() else {
        return f();
    };
    let keep = f();
    if keep && !settle_unheld() {
        HELD.with(|h| h.set(if gave_up { HELD_GAVE_UP } else { HELD_OPEN }));
    } else {
        close_section(gave_up);
    }
    keep
}

/// Closes the section [`gated_held`] kept open on this thread, if any. One load while no
/// section is open on any thread (a kept one counts in [`GATED`], and this thread sees its
/// own count): the thread-local is read only then.
#[inline]
pub(crate) fn release_held() {
    if GATED.load(Ordering::Relaxed) != 0 {
        release_held_cold();
    }
}

#[cold]
#[inline(never)]
fn release_held_cold() {
    let held = HELD.with(|h| h.replace(0));
    if held != 0 {
        close_section(held == HELD_GAVE_UP);
    }
}

/// Opens this thread's [`gated`] section: waits for the begins in flight on other threads,
/// then counts the section (a later begin waits for it). `Some(gave_up)`: opened, and whether
/// it stopped waiting for a begin ([`wait_for_begins`]); `None`: no section of its own.
fn open_section() -> Option<bool> {
    if IN_GATE.with(Cell::get) || UNDER_POOL_LOCK.with(Cell::get) || sections_ungated() {
        return None;
    }
    IN_GATE.with(|g| g.set(true));
    let mut gave_up = false;
    loop {
        // Dekker's order with `beginning` then `wait_for_sections`: this thread's count is
        // seen by the begin, or the begin's count by this thread, or both
        GATED.fetch_add(1, Ordering::SeqCst);
        if !must_wait_for_begins() {
            break;
        }
        GATED.fetch_sub(1, Ordering::SeqCst);
        gave_up |= wait_for_begins();
    }
    Some(gave_up)
}

/// Ends the section [`open_section`] opened.
fn close_section(gave_up: bool) {
    GATED.fetch_sub(1, Ordering::Release);
    if gave_up {
        done_counting_begins();
    }
    IN_GATE.with(|g| g.set(false));
}

/// A begin recorded by [`beginning`] waits for the [`gated`] sections in flight on other
/// threads (their decisions were made without it). After [`SECTION_WAIT`] it goes on: a
/// section still in flight then may make its call inside the capture (said in the log).
pub(crate) fn wait_for_sections() {
    if GATED.load(Ordering::SeqCst) == 0 || IN_GATE.with(Cell::get) {
        return;
    }
    pause::at(pause::Point::Begin, || true);
    let start = Instant::now();
    let mut attempt = 0u32;
    while GATED.load(Ordering::SeqCst) != 0 {
        if start.elapsed() > SECTION_WAIT {
            crate::warn!(
                "a stream capture begins while a call of the library's own is still in flight on another thread; it may invalidate the capture"
            );
            return;
        }
        crate::sys::spin::back_off(attempt);
        attempt = attempt.saturating_add(1);
    }
}

/// After an end-capture call on `stream` (the handle as the caller passed it; `per_thread`:
/// through a `_ptsz` entry point) that failed: whether the capture goes on. A failed end
/// may leave it under way (an argument refused, a thread-local capture ended from another
/// thread) or end it (an invalidated capture), so the driver is asked; unsure (no query, or
/// the query failed), it goes on: forgetting a capture that goes on would let the pool make a
/// call that invalidates it.
pub(crate) fn goes_on_after_failed_end(stream: u64, per_thread: bool) -> bool {
    let Some(query) = real::cuStreamIsCapturing() else {
        return true;
    };
    // handle 0 through a `_ptsz` entry point is the thread's per-thread default stream
    let handle = if stream == 0 && per_thread {
        CU_STREAM_PER_THREAD
    } else {
        stream
    };
    let mut status: c_int = 0;
    // SAFETY: valid out-pointer; the handle is the one the caller ended.
    let rc = unsafe { query(handle as usize as CUstream, &mut status) };
    rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// Whether any capture is under way.
pub(crate) fn any() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Whether `stream` (a stream key as given to [`beginning`], of a request this thread makes) is
/// capturing: a stream a begin call named, or one that joined a capture (a stream that waits
/// on an event recorded in a capturing stream joins that capture until it ends, and its work is
/// captured; no begin call names it, so the driver is asked). One atomic load while no capture
/// is under way.
pub(crate) fn capturing(stream: u64) -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && (named(stream) || joined(stream))
}

/// Whether a begin call named `stream` and it began (or, for a thread that stopped waiting
/// for it, is in flight on another thread).
fn named(stream: u64) -> bool {
    let counting = counting_begins();
    let me = crate::sys::ids::tid();
    CAPTURES
        .lock()
        .iter()
        .any(|x| x.stream == stream && counts(x, counting, me))
}

/// Whether entry `x` is a capture under way for a thread `me` (`counting`: one that stopped
/// waiting for the begins in flight on other threads).
fn counts(x: &Capture, counting: bool, me: u32) -> bool {
    x.begun || (counting && x.beginning > 0 && x.begin_tid != me)
}

/// Whether `stream`, named by no begin call, joined a capture: the driver's answer for it
/// (`cuStreamIsCapturing`, through the real entry point; a query is allowed during any
/// capture). Unsure (no query, or the query failed) counts as capturing: the caller then
/// leaves the request to the driver, or holds a block a graph may use. The legacy stream
/// never captures (and asking about it while a blocking stream captures is refused);
/// another thread's per-thread default stream has no handle here: neither is asked.
#[cold]
#[inline(never)]
fn joined(stream: u64) -> bool {
    if joins_unseen() {
        return false;
    }
    let handle = if stream & PER_THREAD_BASE != 0 {
        if stream != PER_THREAD_BASE | u64::from(crate::sys::ids::tid()) {
            return false;
        }
        CU_STREAM_PER_THREAD
    } else if stream == 0 || stream == CU_STREAM_LEGACY {
        return false;
    } else {
        stream
    };
    let Some(query) = real::cuStreamIsCapturing() else {
        return true;
    };
    let mut status: c_int = 0;
    // SAFETY: valid out-pointer; the handle is the request's stream.
    let rc = unsafe { query(handle as usize as CUstream, &mut status) };
    rc != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=sections-ungated`): [`gated`] runs its section as it
/// comes, and no begin waits for it, as once.
fn sections_ungated() -> bool {
    static READ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ.get_or_init(|| crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "sections-ungated"))
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=settle-unheld`): [`gated_held`] closes its section
/// with its closure, as [`gated`] does, as once: the call made after it is no part of it.
fn settle_unheld() -> bool {
    static READ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ.get_or_init(|| crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "settle-unheld"))
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=joins-unseen`): only the streams a begin call named
/// capture, as once: a stream that joined a capture is served by the pool.
fn joins_unseen() -> bool {
    static READ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ.get_or_init(|| crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "joins-unseen"))
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=sync-by-mode`): the library's own synchronizations are
/// decided by the mode rules and the request's stream ([`forbid_unsafe_calls`]), as once, not
/// by [`ctx_sync_forbidden`].
pub(crate) fn syncs_by_mode() -> bool {
    static READ: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READ.get_or_init(|| crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "sync-by-mode"))
}

/// Whether a `cuCtxSynchronize` of the library's own would break a capture: one is under way
/// in the process, whatever its mode and thread and the caller's. The driver refuses the
/// synchronization during any capture of the context and invalidates every one, relaxed and
/// thread-local ones of other threads included: it would wait for the capturing stream itself
/// (tests/workloads/sim/driver_facts.expected, `ctx_sync`). The mode rules
/// ([`forbid_unsafe_calls`]) do not apply to it. A begin in flight on another thread counts
/// as [`forbid_unsafe_calls`] counts it: where the caller stopped waiting for it
/// ([`wait_for_begins`]); else it was waited for, or it waits for the caller (the pool's lock,
/// [`gated`]) before its real call. One atomic load while none is under way.
#[inline]
pub(crate) fn ctx_sync_forbidden() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && any_counted()
}

#[cold]
#[inline(never)]
fn any_counted() -> bool {
    let me = crate::sys::ids::tid();
    let counting = counting_begins();
    CAPTURES.lock().iter().any(|x| counts(x, counting, me))
}

/// The calling thread's capture interaction mode (global without the driver's exchange).
fn thread_mode() -> c_int {
    let Some(exchange) = real::cuThreadExchangeStreamCaptureMode() else {
        return MODE_GLOBAL;
    };
    let mut mode = MODE_RELAXED;
    // SAFETY: valid in/out pointer; the second exchange puts the thread's mode back.
    unsafe {
        if exchange(&mut mode) != 0 {
            return MODE_GLOBAL;
        }
        let mut back = mode;
        exchange(&mut back);
    }
    mode
}

/// Whether a capture under way forbids the calling thread potentially unsafe calls now
/// (CUDA's rules, above). One atomic load while no capture is under way.
pub(crate) fn forbid_unsafe_calls() -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let mode = thread_mode();
    if mode == MODE_RELAXED {
        return false;
    }
    let me = crate::sys::ids::tid();
    let counting = counting_begins();
    let c = CAPTURES.lock();
    let under_way = c
        .iter()
        .filter(|x| counts(x, counting, me))
        .map(|x| Capture {
            tid: if x.begun { x.tid } else { x.begin_tid },
            ..*x
        });
    forbidden(mode, me, under_way)
}

/// The rule, for a thread `me` in `mode` among `captures`.
fn forbidden(mode: c_int, me: u32, captures: impl IntoIterator<Item = Capture>) -> bool {
    mode != MODE_RELAXED
        && captures.into_iter().any(|c| {
            (c.tid == me && c.mode != MODE_RELAXED)
                || (mode == MODE_GLOBAL && c.mode == MODE_GLOBAL)
        })
}

/// A forked child has no capture under way (its CUDA is not the parent's).
pub(crate) fn on_fork_child() {
    // SAFETY: the atfork child handler runs on the child's only thread, holding no guard.
    let c = unsafe { CAPTURES.reset_in_child() };
    std::mem::forget(std::mem::take(c));
    ACTIVE.store(0, Ordering::Relaxed);
    BEGINNING.store(0, Ordering::Relaxed);
    GATED.store(0, Ordering::Relaxed);
    HELD.with(|h| h.set(0));
    POOL_LOCK_COUNTS.store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(stream: u64, mode: c_int, tid: u32) -> Capture {
        Capture {
            stream,
            mode,
            tid,
            begun: true,
            beginning: 0,
            begin_tid: 0,
        }
    }

    #[test]
    fn the_thread_s_mode_decides_which_captures_forbid_it() {
        let other_global = [cap(7, MODE_GLOBAL, 2)];
        let other_local = [cap(7, MODE_THREAD_LOCAL, 2)];
        let own_local = [cap(7, MODE_THREAD_LOCAL, 1)];
        let own_relaxed = [cap(7, MODE_RELAXED, 1)];
        // global: another thread's global capture, and its own not begun relaxed
        assert!(forbidden(MODE_GLOBAL, 1, other_global));
        assert!(!forbidden(MODE_GLOBAL, 1, other_local));
        assert!(forbidden(MODE_GLOBAL, 1, own_local));
        assert!(!forbidden(MODE_GLOBAL, 1, own_relaxed));
        // thread-local: only its own
        assert!(!forbidden(MODE_THREAD_LOCAL, 1, other_global));
        assert!(forbidden(MODE_THREAD_LOCAL, 1, own_local));
        assert!(!forbidden(MODE_THREAD_LOCAL, 1, own_relaxed));
        // relaxed: none
        assert!(!forbidden(MODE_RELAXED, 1, other_global));
        assert!(!forbidden(MODE_RELAXED, 1, own_local));
        assert!(!forbidden(MODE_GLOBAL, 1, []));
    }
}
