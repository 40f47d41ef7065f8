//! In-process counters: calls by API (in per-thread blocks, so 16 threads allocating at once
//! do not fight over one cache line), bytes live per device (the sum of every block's net
//! bytes, see [`live_bytes`]) and their peak. Entries and bytes per kind are not counted on the hot path: reads scan the
//! live table.
//!
//! The peak follows a per-device running total. Each thread keeps, per device, its own net
//! bytes (allocations minus frees on that thread) and the part of them it has published to
//! the total; it publishes (one atomic add) when its net rises above what it published, and
//! when it has freed more than `SLACK` bytes below it (and at thread exit). A thread churning
//! allocations and frees below its own high-water mark therefore does no atomic
//! read-modify-write at all. With one allocating thread the running total equals the true
//! live bytes at every new high, so the peak is exact; with several, the total may still
//! count up to `SLACK` bytes per thread that a thread freed and did not publish yet: the
//! peak is then an upper bound within that much. Live bytes are always exact (the sum of
//! the nets, whatever the publishing); the cap keeps its own exact accounting.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering, Ordering::Relaxed};
use vramshim_trace::{AllocKind, Api};

/// Devices 0..MAX_DEVICES have their own slot; then one for host memory and one for device
/// memory whose device is unknown (a thread with no context).
pub(crate) const MAX_DEVICES: usize = crate::cuda::MAX_DEVICES;
pub(crate) const HOST_SLOT: usize = MAX_DEVICES;
pub(crate) const UNKNOWN_SLOT: usize = MAX_DEVICES + 1;
pub(crate) const SLOTS: usize = MAX_DEVICES + 2;
const STRIPES: usize = 8;
const APIS: usize = 64;

#[repr(align(64))]
struct Stripe {
    calls: [AtomicU64; APIS],
}

#[repr(align(64))]
struct Total {
    live: AtomicU64,
    peak: AtomicU64,
}

/// Global counters that are rarely touched.
#[repr(align(64))]
struct Misc {
    unknown_frees: AtomicU64,
    cap_refusals: AtomicU64,
    alloc_failures: AtomicU64,
    pooled: AtomicU64,
    panics: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const Z: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const STRIPE: Stripe = Stripe { calls: [Z; APIS] };
#[allow(clippy::declare_interior_mutable_const)]
const TOTAL: Total = Total { live: Z, peak: Z };

static STRIPES_: [Stripe; STRIPES] = [STRIPE; STRIPES];
static TOTALS: [Total; SLOTS] = [TOTAL; SLOTS];
/// Net bytes per slot counted outside any thread's block (no hook token, a thread past its
/// exit handler, entries dropped by a reset): with the blocks' `net`, the exact bytes live.
static EXTRA: [AtomicU64; SLOTS] = [Z; SLOTS];
static MISC: Misc = Misc {
    unknown_frees: Z,
    cap_refusals: Z,
    alloc_failures: Z,
    pooled: Z,
    panics: Z,
};

#[inline]
fn stripe() -> &'static Stripe {
    &STRIPES_[crate::sys::ids::tid() as usize % STRIPES]
}

/// Counter slot of a device / kind.
#[inline]
pub(crate) fn slot(device: i32, kind: AllocKind) -> usize {
    if !kind.is_device() {
        HOST_SLOT
    } else if device >= 0 && (device as usize) < MAX_DEVICES {
        device as usize
    } else {
        UNKNOWN_SLOT
    }
}

/// One request through `api` (counted once, however many of our hooks it crossed), from a
/// thread without a hook token (rare paths).
#[inline]
pub(crate) fn call(api: Api) {
    stripe().calls[(api as usize) % APIS].fetch_add(1, Relaxed);
}

/// One request through `api`, counted in the calling thread's own block: a plain load and
/// store, no atomic read-modify-write (each block has one writer).
#[inline(always)]
pub(crate) fn call_in(tok: &crate::sys::thread::Token, api: Api) {
    let st = tok.state();
    let mut b = st.calls.get();
    if b.is_null() && !st.exited.get() {
        b = register(st);
    }
    // SAFETY: blocks are leaked, never freed; this thread is the block's only writer.
    if let Some(b) = unsafe { (b as *const CallBlock).as_ref() } {
        let c = &b.calls[(api as usize) % APIS];
        c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
        return;
    }
    call(api);
}

// ------------------------------------------------------------------- per-thread blocks

/// Call counters of one thread. Blocks live forever in a push-only list; a thread claims
/// a free one on its first counted call and gives it back at thread exit (a pthread key
/// destructor), so there are at most as many blocks as threads ever alive at once. Counts
/// stay in the block when it changes hands: totals remain exact.
#[repr(align(64))]
pub(crate) struct CallBlock {
    calls: [AtomicU64; APIS],
    /// This thread's net bytes per slot (allocations minus frees; wrapping: a thread that
    /// frees what others allocated goes below zero).
    net: [AtomicU64; SLOTS],
    /// The part of `net` published to the running totals.
    published: [AtomicU64; SLOTS],
    in_use: AtomicBool,
    next: AtomicPtr<CallBlock>,
}

static BLOCKS: AtomicPtr<CallBlock> = AtomicPtr::new(std::ptr::null_mut());

fn blocks() -> impl Iterator<Item = &'static CallBlock> {
    let mut p = BLOCKS.load(Ordering::Acquire);
    std::iter::from_fn(move || {
        // SAFETY: list nodes are leaked boxes, never freed.
        let b = unsafe { p.as_ref() }?;
        p = b.next.load(Ordering::Acquire);
        Some(b)
    })
}

/// The calling thread is exiting (see `sys::thread::at_thread_exit`): publish its block's
/// bytes and give the block back; late calls on this thread take the shared stripes.
fn on_thread_exit(st: &crate::sys::thread::State) {
    let p = st.calls.replace(std::ptr::null());
    // SAFETY: p is the CallBlock this thread claimed (blocks are leaked, never freed).
    if let Some(b) = unsafe { (p as *const CallBlock).as_ref() } {
        publish_all(b);
        b.in_use.store(false, Ordering::Release);
    }
}

#[cold]
fn register(st: &crate::sys::thread::State) -> *const () {
    let b = claim() as *const ();
    st.calls.set(b);
    crate::sys::thread::at_thread_exit(st, on_thread_exit);
    b
}

fn claim() -> *const CallBlock {
    for b in blocks() {
        if !b.in_use.load(Relaxed)
            && b.in_use
                .compare_exchange(false, true, Ordering::AcqRel, Relaxed)
                .is_ok()
        {
            return b;
        }
    }
    let b: &'static CallBlock = Box::leak(Box::new(CallBlock {
        calls: [Z; APIS],
        net: [Z; SLOTS],
        published: [Z; SLOTS],
        in_use: AtomicBool::new(true),
        next: AtomicPtr::new(std::ptr::null_mut()),
    }));
    let bp = b as *const CallBlock as *mut CallBlock;
    let mut head = BLOCKS.load(Ordering::Acquire);
    loop {
        b.next.store(head, Ordering::Release);
        match BLOCKS.compare_exchange_weak(head, bp, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return b,
            Err(h) => head = h,
        }
    }
}

/// This thread's counter block, if it has one.
#[inline(always)]
fn block(tok: &crate::sys::thread::Token) -> Option<&'static CallBlock> {
    // SAFETY: blocks are leaked, never freed.
    unsafe { (tok.state().calls.get() as *const CallBlock).as_ref() }
}

/// Bytes a thread may have freed below what it published before it tells the running total.
pub(crate) const SLACK: u64 = 1 << 20;

/// This thread's block, the slot of (`device`, `kind`) and its net count after adding
/// `delta` (wrapping: a free adds the negated size); `None` without a block (the caller counts
/// in the totals). Plain load and store: only the owner thread writes its block.
#[inline(always)]
fn add_net(
    tok: &crate::sys::thread::Token,
    device: i32,
    kind: AllocKind,
    delta: u64,
) -> Option<(&'static CallBlock, usize, u64)> {
    let s = slot(device, kind);
    let b = block(tok)?;
    let net = b.net[s].load(Relaxed).wrapping_add(delta);
    b.net[s].store(net, Relaxed);
    Some((b, s, net))
}

/// A successful allocation became live: counted in this thread's block; published (one
/// atomic add, and the peak raised) only when the thread goes above what it published.
#[inline(always)]
pub(crate) fn alloc_in(tok: &crate::sys::thread::Token, device: i32, kind: AllocKind, size: u64) {
    let Some((b, s, net)) = add_net(tok, device, kind, size) else {
        return alloc(device, kind, size);
    };
    let up = net.wrapping_sub(b.published[s].load(Relaxed)) as i64;
    if up > 0 {
        b.published[s].store(net, Relaxed);
        raise(&TOTALS[s], up as u64);
    }
}

#[inline(always)]
fn raise(t: &Total, delta: u64) {
    let now = t.live.fetch_add(delta, Relaxed).wrapping_add(delta);
    if now > t.peak.load(Relaxed) && (now as i64) > 0 {
        t.peak.fetch_max(now, Relaxed);
    }
}

/// A live allocation was freed: counted in this thread's block; published only once the
/// thread is `SLACK` bytes below what it published.
#[inline(always)]
pub(crate) fn free_in(tok: &crate::sys::thread::Token, device: i32, kind: AllocKind, size: u64) {
    let Some((b, s, net)) = add_net(tok, device, kind, size.wrapping_neg()) else {
        return free(device, kind, size);
    };
    let down = b.published[s].load(Relaxed).wrapping_sub(net) as i64;
    if down > SLACK as i64 {
        b.published[s].store(net, Relaxed);
        TOTALS[s].live.fetch_sub(down as u64, Relaxed);
    }
}

/// Bring the running totals up to date with a block (thread exit).
fn publish_all(b: &CallBlock) {
    for ((t, n), p) in TOTALS.iter().zip(b.net.iter()).zip(b.published.iter()) {
        let n = n.load(Relaxed);
        let d = n.wrapping_sub(p.load(Relaxed));
        if d != 0 {
            p.store(n, Relaxed);
            raise(t, d);
        }
    }
}

/// An allocation became live outside a hook (no thread block at hand).
#[inline]
pub(crate) fn alloc(device: i32, kind: AllocKind, size: u64) {
    let s = slot(device, kind);
    EXTRA[s].fetch_add(size, Relaxed);
    raise(&TOTALS[s], size);
}

/// A live allocation was freed or dropped outside the hot path (stale entries, device
/// reset): taken off the running total at once.
#[inline]
pub(crate) fn free(device: i32, kind: AllocKind, size: u64) {
    let s = slot(device, kind);
    EXTRA[s].fetch_sub(size, Relaxed);
    TOTALS[s].live.fetch_sub(size, Relaxed);
}

pub(crate) fn unknown_free() {
    MISC.unknown_frees.fetch_add(1, Relaxed);
}
pub(crate) fn cap_refusal() {
    MISC.cap_refusals.fetch_add(1, Relaxed);
}
pub(crate) fn alloc_failure() {
    MISC.alloc_failures.fetch_add(1, Relaxed);
}
pub(crate) fn pooled() {
    MISC.pooled.fetch_add(1, Relaxed);
}
pub(crate) fn panic_caught() {
    MISC.panics.fetch_add(1, Relaxed);
}

// ------------------------------------------------------------------------------ reads

/// Requests through `api`.
pub(crate) fn calls(api: Api) -> u64 {
    let i = (api as usize) % APIS;
    STRIPES_
        .iter()
        .map(|s| s.calls[i].load(Relaxed))
        .chain(blocks().map(|b| b.calls[i].load(Relaxed)))
        .fold(0u64, u64::wrapping_add)
}

/// Live bytes of a slot (all kinds): every thread's net bytes plus those counted outside
/// the blocks, exact whenever no request is in flight (each entry that enters or leaves the
/// live tables is counted exactly once, by the thread that moved it).
pub(crate) fn live_bytes(slot: usize) -> u64 {
    blocks()
        .map(|b| b.net[slot].load(Relaxed))
        .fold(EXTRA[slot].load(Relaxed), u64::wrapping_add)
}

/// Peak live bytes of a slot.
pub(crate) fn peak_bytes(slot: usize) -> u64 {
    TOTALS[slot].peak.load(Relaxed)
}

pub(crate) fn unknown_frees() -> u64 {
    MISC.unknown_frees.load(Relaxed)
}
pub(crate) fn cap_refusals() -> u64 {
    MISC.cap_refusals.load(Relaxed)
}
pub(crate) fn alloc_failures() -> u64 {
    MISC.alloc_failures.load(Relaxed)
}
pub(crate) fn pooled_count() -> u64 {
    MISC.pooled.load(Relaxed)
}
pub(crate) fn panics() -> u64 {
    MISC.panics.load(Relaxed)
}

/// Slots that have held anything.
pub(crate) fn used_slots() -> impl Iterator<Item = usize> {
    (0..SLOTS).filter(|s| peak_bytes(*s) != 0 || live_bytes(*s) != 0)
}

/// Zero everything (fork child: its memory starts empty).
pub(crate) fn reset() {
    for s in STRIPES_.iter() {
        s.calls.iter().for_each(|c| c.store(0, Relaxed));
    }
    // Only the forking thread exists in the child: every other block is free again.
    let mine = crate::sys::thread::with_state(|s| s.calls.get()).unwrap_or(std::ptr::null());
    for b in blocks() {
        b.calls.iter().for_each(|c| c.store(0, Relaxed));
        b.net.iter().for_each(|c| c.store(0, Relaxed));
        b.published.iter().for_each(|c| c.store(0, Relaxed));
        if !std::ptr::eq(b as *const CallBlock as *const (), mine) {
            b.in_use.store(false, Relaxed);
        }
    }
    for t in TOTALS.iter() {
        t.live.store(0, Relaxed);
        t.peak.store(0, Relaxed);
    }
    EXTRA.iter().for_each(|c| c.store(0, Relaxed));
    for c in [
        &MISC.unknown_frees,
        &MISC.cap_refusals,
        &MISC.alloc_failures,
        &MISC.pooled,
        &MISC.panics,
    ] {
        c.store(0, Relaxed);
    }
}
