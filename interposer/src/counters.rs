//! In-process counters: calls by API, bytes and entries live per device and kind, peak.
//! Hot-path updates are relaxed atomics, striped by thread where they are plain counts, so
//! 16 threads allocating at once do not fight over one cache line. Reads sum the stripes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use vramshim_trace::{AllocKind, Api};

/// Devices 0..MAX_DEVICES have their own slot; then one for host memory and one for device
/// memory whose device is unknown (a thread with no context).
pub const MAX_DEVICES: usize = 64;
pub const HOST_SLOT: usize = MAX_DEVICES;
pub const UNKNOWN_SLOT: usize = MAX_DEVICES + 1;
const SLOTS: usize = MAX_DEVICES + 2;
const STRIPES: usize = 8;
const APIS: usize = 64;
const KINDS: usize = 8;

#[repr(align(64))]
struct Stripe {
    calls: [AtomicU64; APIS],
    /// Per slot: [allocs, frees].
    ops: [[AtomicU64; 2]; SLOTS],
    /// Per slot and kind: live entries.
    live_count: [[AtomicU64; KINDS]; SLOTS],
    /// Per slot and kind: live bytes (may go transiently "negative" per stripe: wrapping).
    live_bytes: [[AtomicU64; KINDS]; SLOTS],
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
    nested: AtomicU64,
    cap_refusals: AtomicU64,
    alloc_failures: AtomicU64,
    pooled: AtomicU64,
    panics: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const Z: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const Z2: [AtomicU64; 2] = [Z; 2];
#[allow(clippy::declare_interior_mutable_const)]
const ZK: [AtomicU64; KINDS] = [Z; KINDS];
#[allow(clippy::declare_interior_mutable_const)]
const STRIPE: Stripe = Stripe {
    calls: [Z; APIS],
    ops: [Z2; SLOTS],
    live_count: [ZK; SLOTS],
    live_bytes: [ZK; SLOTS],
};
#[allow(clippy::declare_interior_mutable_const)]
const TOTAL: Total = Total { live: Z, peak: Z };

static STRIPES_: [Stripe; STRIPES] = [STRIPE; STRIPES];
static TOTALS: [Total; SLOTS] = [TOTAL; SLOTS];
static MISC: Misc = Misc {
    unknown_frees: Z,
    nested: Z,
    cap_refusals: Z,
    alloc_failures: Z,
    pooled: Z,
    panics: Z,
};

#[inline]
fn stripe() -> &'static Stripe {
    &STRIPES_[crate::ids::tid() as usize % STRIPES]
}

/// Counter slot of a device / kind.
#[inline]
pub fn slot(device: i32, kind: AllocKind) -> usize {
    if !kind.is_device() {
        HOST_SLOT
    } else if device >= 0 && (device as usize) < MAX_DEVICES {
        device as usize
    } else {
        UNKNOWN_SLOT
    }
}

/// One request through `api` (counted once, however many of our hooks it crossed).
#[inline]
pub fn call(api: Api) {
    stripe().calls[(api as usize) % APIS].fetch_add(1, Relaxed);
}

/// A nested hook passed straight through.
#[inline]
pub fn nested() {
    MISC.nested.fetch_add(1, Relaxed);
}

/// A successful allocation became live.
#[inline]
pub fn alloc(device: i32, kind: AllocKind, size: u64) {
    let s = slot(device, kind);
    let st = stripe();
    st.ops[s][0].fetch_add(1, Relaxed);
    st.live_count[s][kind as usize % KINDS].fetch_add(1, Relaxed);
    st.live_bytes[s][kind as usize % KINDS].fetch_add(size, Relaxed);
    let t = &TOTALS[s];
    let now = t.live.fetch_add(size, Relaxed).wrapping_add(size);
    if now > t.peak.load(Relaxed) {
        t.peak.fetch_max(now, Relaxed);
    }
}

/// A live allocation was freed (or dropped by a device reset).
#[inline]
pub fn free(device: i32, kind: AllocKind, size: u64) {
    let s = slot(device, kind);
    let st = stripe();
    st.ops[s][1].fetch_add(1, Relaxed);
    st.live_count[s][kind as usize % KINDS].fetch_sub(1, Relaxed);
    st.live_bytes[s][kind as usize % KINDS].fetch_sub(size, Relaxed);
    TOTALS[s].live.fetch_sub(size, Relaxed);
}

pub fn unknown_free() {
    MISC.unknown_frees.fetch_add(1, Relaxed);
}
pub fn cap_refusal() {
    MISC.cap_refusals.fetch_add(1, Relaxed);
}
pub fn alloc_failure() {
    MISC.alloc_failures.fetch_add(1, Relaxed);
}
pub fn pooled() {
    MISC.pooled.fetch_add(1, Relaxed);
}
pub fn panic_caught() {
    MISC.panics.fetch_add(1, Relaxed);
}

// ------------------------------------------------------------------------------ reads

/// Requests through `api`.
pub fn calls(api: Api) -> u64 {
    STRIPES_
        .iter()
        .map(|s| s.calls[(api as usize) % APIS].load(Relaxed))
        .fold(0u64, u64::wrapping_add)
}

/// Live bytes of a slot (all kinds), exact.
pub fn live_bytes(slot: usize) -> u64 {
    TOTALS[slot].live.load(Relaxed)
}

/// Peak live bytes of a slot.
pub fn peak_bytes(slot: usize) -> u64 {
    TOTALS[slot].peak.load(Relaxed)
}

/// Live bytes of one kind in a slot.
pub fn live_bytes_kind(slot: usize, kind: AllocKind) -> u64 {
    STRIPES_
        .iter()
        .map(|s| s.live_bytes[slot][kind as usize % KINDS].load(Relaxed))
        .fold(0u64, u64::wrapping_add)
}

/// Live entries of one kind in a slot.
pub fn live_count_kind(slot: usize, kind: AllocKind) -> u64 {
    STRIPES_
        .iter()
        .map(|s| s.live_count[slot][kind as usize % KINDS].load(Relaxed))
        .fold(0u64, u64::wrapping_add)
}

/// Live entries of a slot (all kinds).
pub fn live_count(slot: usize) -> u64 {
    AllocKind::ALL
        .iter()
        .map(|k| live_count_kind(slot, *k))
        .fold(0u64, u64::wrapping_add)
}

/// Successful allocations (`which` = 0) or frees (1) in a slot.
pub fn ops(slot: usize, which: usize) -> u64 {
    STRIPES_
        .iter()
        .map(|s| s.ops[slot][which & 1].load(Relaxed))
        .fold(0u64, u64::wrapping_add)
}

pub fn unknown_frees() -> u64 {
    MISC.unknown_frees.load(Relaxed)
}
pub fn nested_count() -> u64 {
    MISC.nested.load(Relaxed)
}
pub fn cap_refusals() -> u64 {
    MISC.cap_refusals.load(Relaxed)
}
pub fn alloc_failures() -> u64 {
    MISC.alloc_failures.load(Relaxed)
}
pub fn pooled_count() -> u64 {
    MISC.pooled.load(Relaxed)
}
pub fn panics() -> u64 {
    MISC.panics.load(Relaxed)
}

/// Slots that have seen any allocation.
pub fn used_slots() -> impl Iterator<Item = usize> {
    (0..SLOTS).filter(|s| ops(*s, 0) != 0 || live_bytes(*s) != 0)
}

/// Zero everything (fork child: its memory starts empty).
pub(crate) fn reset() {
    for s in STRIPES_.iter() {
        s.calls.iter().for_each(|c| c.store(0, Relaxed));
        for slot in 0..SLOTS {
            s.ops[slot].iter().for_each(|c| c.store(0, Relaxed));
            s.live_count[slot].iter().for_each(|c| c.store(0, Relaxed));
            s.live_bytes[slot].iter().for_each(|c| c.store(0, Relaxed));
        }
    }
    for t in TOTALS.iter() {
        t.live.store(0, Relaxed);
        t.peak.store(0, Relaxed);
    }
    for c in [
        &MISC.unknown_frees,
        &MISC.nested,
        &MISC.cap_refusals,
        &MISC.alloc_failures,
        &MISC.pooled,
        &MISC.panics,
    ] {
        c.store(0, Relaxed);
    }
}
