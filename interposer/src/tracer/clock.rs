//! The trace clock: the process's one clock (`sys::clock`, `CLOCK_MONOTONIC` nanoseconds),
//! read on the hot path from the TSC that this module calibrates against it.
//!
//! `clock_gettime` costs ~25-30 ns on this kind of VM and a traced call needs two (entry time
//! and latency); `rdtsc` costs ~12. Where the TSC is invariant and is the kernel's clocksource
//! (then the kernel keeps it synchronised across CPUs), a timestamp is
//! `base_ns + (tsc - base_tsc) * rate + correction`, with the parameters kept on
//! `CLOCK_MONOTONIC` by re-anchoring every `RECAL_NS`: whichever thread first finds the
//! parameters older than that takes a fresh (tsc, monotonic ns) anchor and publishes new ones
//! (`recalibrate`), the writer thread included. The new function starts where the old one
//! was at the anchor (continuous, so times never go backward) and steers the difference to the
//! anchor away over the next `RECAL_NS` (a phase-locked loop, the way the kernel itself
//! slews). So times stay `CLOCK_MONOTONIC` within the anchor's precision (tens of ns; the test
//! below states the bound), comparable across threads and across processes, over any run
//! length; the file format does not change.
//!
//! The application's threads do not convert: a traced call's [`stamp`] is the raw TSC (one
//! `rdtsc` and one relaxed load of the current rate, for the latency), and the writer thread
//! converts each event's time when it encodes it ([`ToNs`]), with the parameter set that
//! was in force at that TSC (the sets of the last `SETS_KEPT` re-anchorings, ~3 s, are kept
//! for that). The file holds `CLOCK_MONOTONIC` ns as before.
//!
//! Elsewhere (no invariant TSC, another clocksource, not x86-64, or
//! `VRAMSHIM_TRACE_CLOCK=monotonic`) every read is a plain `clock_gettime(CLOCK_MONOTONIC)`,
//! and [`ToNs`] is the identity.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use crate::sys::clock::{now_ns as mono_ns, tsc, tsc_usable};

/// Re-anchor on the monotonic clock this often.
const RECAL_NS: u64 = 50_000_000;
/// The writer thread re-anchors every tick (`RECAL_NS`); an application thread does it
/// itself only when the parameters are this many periods old (writer starved or not started).
const STALE_AFTER: u64 = 2;
/// An anchor whose two TSC reads (around `clock_gettime`) are further apart than this was
/// interrupted: retry (or keep the old parameters).
const ANCHOR_MAX_SPREAD_NS: u64 = 20_000;
/// Length of the first calibration at start (the rate until the first re-anchoring).
const FIRST_CALIBRATION_NS: u64 = 1_000_000;
/// Fixed-point shift of the rates (ns per tick).
const SHIFT: u32 = 32;

/// Whether the trace reads the calibrated TSC (else `clock_gettime` on every read).
static TSC: AtomicBool = AtomicBool::new(false);
/// [`init`] has chosen the clock.
static CHOSEN: AtomicBool = AtomicBool::new(false);

/// Whether the trace reads the TSC (one relaxed load: the hot path's check).
#[inline(always)]
fn tsc_mode() -> bool {
    TSC.load(Ordering::Relaxed)
}

/// Parameter sets kept: the newest is what `now_ns` uses; older ones convert the raw times
/// of events still in buffers when a re-anchoring happened (`ToNs`).
const SETS_KEPT: usize = 64;
/// Reads of the newest set a reader tries before it does without (a read fails only when
/// the reader was preempted through `SETS_KEPT - 1` re-anchorings; each try reads the new
/// newest, so the second succeeds but under a pathological schedule).
const LOOKUP_TRIES: u32 = 4;

/// Conversion parameters, in `SETS_KEPT` sets (a reader uses the newest, or the one in force
/// at its TSC; the writer of new parameters fills the oldest, never the one readers are on,
/// so nobody waits on a preempted writer).
struct Params {
    /// Odd while being written.
    seq: AtomicU64,
    base_tsc: AtomicU64,
    base_ns: AtomicU64,
    /// ns per tick << SHIFT.
    rate: AtomicU64,
    /// Correction slope (signed, ns per tick << SHIFT), applied for `corr_ticks` ticks.
    corr: AtomicU64,
    corr_ticks: AtomicU64,
    /// Ticks after `base_tsc` at which these parameters are stale.
    stale_ticks: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const PARAMS0: Params = Params {
    seq: AtomicU64::new(0),
    base_tsc: AtomicU64::new(0),
    base_ns: AtomicU64::new(0),
    rate: AtomicU64::new(0),
    corr: AtomicU64::new(0),
    corr_ticks: AtomicU64::new(0),
    stale_ticks: AtomicU64::new(u64::MAX),
};
static SETS: [Params; SETS_KEPT] = [PARAMS0; SETS_KEPT];
/// Generation of the newest set (`SETS[GEN % SETS_KEPT]`).
static GEN: AtomicU64 = AtomicU64::new(0);
/// The newest set's rate (ns per tick << SHIFT): all a traced call needs for its latency.
static RATE: AtomicU64 = AtomicU64::new(0);
/// Held by the thread that re-anchors (others go on with the current parameters).
static RECALIBRATING: AtomicBool = AtomicBool::new(false);
/// Last anchor (tsc, ns): the rate is measured between consecutive anchors.
static LAST_ANCHOR_TSC: AtomicU64 = AtomicU64::new(0);
static LAST_ANCHOR_NS: AtomicU64 = AtomicU64::new(0);
/// Fault switch (`VRAMSHIM_TRACE_CLOCK_FAULT=drift`): the rate is 0.1% fast and never
/// corrected, so times drift off `CLOCK_MONOTONIC` (proves the clock test can fail).
static FAULT_DRIFT: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy)]
struct Snapshot {
    base_tsc: u64,
    base_ns: u64,
    rate: u64,
    corr: i64,
    corr_ticks: u64,
    stale_ticks: u64,
}

/// A traced call's start: its time, and what its latency is measured from.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    /// Trace time of the start, as events carry it until the writer encodes them: the raw
    /// TSC where the TSC is the trace clock, else monotonic ns ([`ToNs`] gives ns).
    pub ns: u64,
    tsc: u64,
    /// ns per tick << SHIFT (0: `tsc` holds monotonic ns, read the clock again).
    rate: u64,
}

impl Stamp {
    /// Placeholder where tracing is off (never emitted).
    pub(crate) const NONE: Stamp = Stamp {
        ns: 0,
        tsc: 0,
        rate: 0,
    };

    /// Nanoseconds since the start (one more clock read), saturated to `u32`.
    #[inline]
    pub fn latency_ns(&self) -> u32 {
        let d = if self.rate != 0 {
            let ticks = tsc().wrapping_sub(self.tsc);
            if ticks as i64 <= 0 {
                0
            } else {
                ((ticks as u128 * self.rate as u128) >> SHIFT) as u64
            }
        } else {
            mono_ns().saturating_sub(self.tsc)
        };
        d.min(u32::MAX as u64) as u32
    }
}

/// Monotonic ns now (trace clock), converted here (the writer's own records).
#[inline]
pub fn now_ns() -> u64 {
    stamp_ns().ns
}

/// Trace time now, for an event handed to `emit` (raw: see [`Stamp::ns`]): [`stamp`]'s
/// time without its rate (one load fewer on the tensor tracker's path).
#[inline]
pub fn now_raw() -> u64 {
    if tsc_mode() { tsc() } else { mono_ns() }
}

/// The start of a traced call: one `rdtsc` and one relaxed load (the conversion to ns is
/// the writer's, [`ToNs`]). Always inlined: a call would cost as much as the rest of it.
#[inline(always)]
pub fn stamp() -> Stamp {
    if tsc_mode() {
        let tsc = tsc();
        return Stamp {
            ns: tsc,
            tsc,
            rate: RATE.load(Ordering::Relaxed),
        };
    }
    let ns = mono_ns();
    Stamp {
        ns,
        tsc: ns,
        rate: 0,
    }
}

/// Converts raw trace times to monotonic ns: each with the parameter set in force at its TSC
/// (the newest whose anchor is not after it), as [`now_ns`] would have converted it then.
/// Times older than every kept set use the oldest, backward. Remembers the last set found,
/// so a buffer's times cost one lookup per set.
pub(crate) struct ToNs {
    tsc: bool,
    p: Option<Snapshot>,
    /// `p` holds for raw times in `lo..hi`.
    lo: u64,
    hi: u64,
}

impl Default for ToNs {
    fn default() -> Self {
        Self::new()
    }
}

impl ToNs {
    pub(crate) fn new() -> ToNs {
        ToNs {
            tsc: tsc_mode(),
            p: None,
            lo: 0,
            hi: 0,
        }
    }

    #[inline]
    pub(crate) fn get(&mut self, raw: u64) -> u64 {
        if !self.tsc {
            return raw;
        }
        if let Some(p) = &self.p
            && raw >= self.lo
            && raw < self.hi
        {
            return convert(p, raw);
        }
        self.lookup(raw)
    }

    /// [`Self::get`] of each time `time` finds in `items`, in place. The set in force for the
    /// last time converted stays in registers: a time in its range costs the conversion
    /// alone (a writer's buffer holds a few milliseconds of times, one or two sets').
    pub(crate) fn convert_all<T>(&mut self, items: &mut [T], time: impl Fn(&mut T) -> &mut u64) {
        if !self.tsc {
            return;
        }
        let mut it = items.iter_mut();
        while let Some(item) = it.next() {
            let t = time(item);
            *t = self.get(*t);
            let (Some(p), lo, hi) = (self.p, self.lo, self.hi) else {
                continue;
            };
            // `lo` is `p`'s anchor: a time from it on is `convert`'s forward line.
            let span = hi.wrapping_sub(lo);
            for item in it.by_ref() {
                let t = time(item);
                let dt = t.wrapping_sub(lo);
                if dt >= span || dt > i64::MAX as u64 {
                    *t = self.get(*t);
                    break;
                }
                *t = convert_forward(&p, dt);
            }
        }
    }

    /// Finds the set for `raw`. A walk that reads no set at all lost the newest one to a
    /// rewrite (this thread was preempted through `SETS_KEPT - 1` re-anchorings between
    /// reading `GEN` and the set): walk again from the new newest, at most `LOOKUP_TRIES`
    /// times (this can run on an application thread, which must never spin unboundedly),
    /// then give the monotonic clock's now, the one time left that is on the trace's clock.
    #[inline(never)]
    fn lookup(&mut self, raw: u64) -> u64 {
        for _ in 0..LOOKUP_TRIES {
            if let Some(ns) = self.walk(raw) {
                return ns;
            }
        }
        self.p = None;
        mono_ns()
    }

    /// One walk over the kept sets from the newest (None: not even the newest read whole).
    fn walk(&mut self, raw: u64) -> Option<u64> {
        let g = GEN.load(Ordering::Acquire);
        #[cfg(test)]
        tests::rewrite_race();
        let mut found: Option<Snapshot> = None;
        let mut hi = u64::MAX;
        // The oldest slot may be refilled under us: leave it out.
        for k in 0..(SETS_KEPT as u64 - 1).min(g) {
            // Unreadable: refilled since `GEN` was read, and so are all older ones.
            let Some(p) = read_set(g - k) else { break };
            if let Some(newer) = found {
                hi = newer.base_tsc;
            }
            found = Some(p);
            if raw >= p.base_tsc {
                self.p = found;
                self.lo = p.base_tsc;
                self.hi = hi;
                return Some(convert(&p, raw));
            }
        }
        // Older than every set still kept: the oldest found, backward.
        self.p = None;
        found.map(|p| convert(&p, raw))
    }
}

impl Params {
    /// One seqlock read of the set: (seq before, the values, seq after). The values are
    /// consistent when both seqs are equal and even.
    #[inline(always)]
    fn read(&self) -> (u64, Snapshot, u64) {
        let s1 = self.seq.load(Ordering::Acquire);
        let snap = Snapshot {
            base_tsc: self.base_tsc.load(Ordering::Relaxed),
            base_ns: self.base_ns.load(Ordering::Relaxed),
            rate: self.rate.load(Ordering::Relaxed),
            corr: self.corr.load(Ordering::Relaxed) as i64,
            corr_ticks: self.corr_ticks.load(Ordering::Relaxed),
            stale_ticks: self.stale_ticks.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        (s1, snap, self.seq.load(Ordering::Relaxed))
    }
}

/// The seq of generation `generation`'s slot once it is written: generation `generation`
/// (from 1) is its slot's `((generation - 1) / SETS_KEPT + 1)`-th fill, 2 per fill (odd
/// while one is being written).
fn filled_seq(generation: u64) -> u64 {
    2 * ((generation.max(1) - 1) / SETS_KEPT as u64 + 1)
}

/// Set `generation`, if it is still that generation's (not refilled since) and calibrated.
fn read_set(generation: u64) -> Option<Snapshot> {
    let (s1, snap, s2) = SETS[(generation % SETS_KEPT as u64) as usize].read();
    (s1 == s2 && s1 == filled_seq(generation) && snap.rate != 0).then_some(snap)
}

/// [`stamp`] converted at once (the re-anchoring falls to the caller when the writer has
/// not done it for a while).
#[inline]
fn stamp_ns() -> Stamp {
    if tsc_mode() {
        let tsc = tsc();
        if let Some(p) = snapshot() {
            // Negative: read before a re-anchoring another thread just published; fine.
            if (tsc.wrapping_sub(p.base_tsc) as i64) < p.stale_ticks as i64 {
                return Stamp {
                    ns: convert(&p, tsc),
                    tsc,
                    rate: p.rate,
                };
            }
        }
        return stamp_slow(tsc);
    }
    let ns = mono_ns();
    Stamp {
        ns,
        tsc: ns,
        rate: 0,
    }
}

#[cold]
#[inline(never)]
fn stamp_slow(tsc: u64) -> Stamp {
    if tsc_mode() {
        recalibrate();
        if let Some(p) = snapshot() {
            return Stamp {
                ns: convert(&p, tsc),
                tsc,
                rate: p.rate,
            };
        }
    }
    let ns = mono_ns();
    Stamp {
        ns,
        tsc: ns,
        rate: 0,
    }
}

/// `p` evaluated at `tsc` (which may lie a little before `p.base_tsc`).
#[inline]
fn convert(p: &Snapshot, tsc: u64) -> u64 {
    let dt = tsc.wrapping_sub(p.base_tsc) as i64;
    if dt <= 0 {
        // Read before a re-anchoring published by another thread: the new line, backward.
        let back = ((dt.unsigned_abs() as u128 * p.rate as u128) >> SHIFT) as u64;
        return p.base_ns.saturating_sub(back);
    }
    convert_forward(p, dt as u64)
}

/// [`convert`] of a TSC `dt` ticks after the anchor (`dt` under 2^63; at 0 both lines give
/// the anchor's ns).
#[inline(always)]
fn convert_forward(p: &Snapshot, dt: u64) -> u64 {
    let lin = ((dt as u128 * p.rate as u128) >> SHIFT) as u64;
    let ct = dt.min(p.corr_ticks);
    let corr = ((ct as i128 * p.corr as i128) >> SHIFT) as i64;
    p.base_ns.wrapping_add(lin).wrapping_add(corr as u64)
}

/// The newest parameters (None before calibration, or when `LOOKUP_TRIES` reads were each
/// overtaken by a refill: the callers then read the monotonic clock itself).
#[inline]
fn snapshot() -> Option<Snapshot> {
    for _ in 0..LOOKUP_TRIES {
        let g = GEN.load(Ordering::Acquire);
        let (s1, snap, s2) = SETS[(g % SETS_KEPT as u64) as usize].read();
        if s1 == s2 && s1.is_multiple_of(2) {
            return (snap.rate != 0).then_some(snap);
        }
        // This set is being refilled: this reader was preempted for `SETS_KEPT - 1`
        // re-anchorings.
        std::hint::spin_loop();
    }
    None
}

fn publish(p: Snapshot) {
    let g = GEN.load(Ordering::Relaxed).wrapping_add(1);
    fill(g, p);
    GEN.store(g, Ordering::Release);
    RATE.store(p.rate, Ordering::Relaxed);
}

/// Writes generation `g`'s set. Its seq comes from `g`, not from the slot's last seq: a child
/// forked while its parent was in here (the slot half written, or written but `GEN` not yet
/// moved) fills the same generation again, and must leave the seq [`read_set`] expects.
fn fill(g: u64, p: Snapshot) {
    let s = &SETS[(g % SETS_KEPT as u64) as usize];
    let seq = filled_seq(g);
    s.seq.store(seq - 1, Ordering::Relaxed);
    fence(Ordering::Release);
    s.base_tsc.store(p.base_tsc, Ordering::Relaxed);
    s.base_ns.store(p.base_ns, Ordering::Relaxed);
    s.rate.store(p.rate, Ordering::Relaxed);
    s.corr.store(p.corr as u64, Ordering::Relaxed);
    s.corr_ticks.store(p.corr_ticks, Ordering::Relaxed);
    s.stale_ticks.store(p.stale_ticks, Ordering::Relaxed);
    s.seq.store(seq, Ordering::Release);
}

/// A (tsc, monotonic ns) pair: the midpoint of two TSC reads around `clock_gettime`, the
/// tightest of a few tries; None when every try was interrupted.
fn anchor() -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..4 {
        let a = tsc();
        let ns = mono_ns();
        let b = tsc();
        if b < a {
            continue;
        }
        let spread = b - a;
        if best.is_none_or(|(s, _, _)| spread < s) {
            best = Some((spread, a + spread / 2, ns));
        }
    }
    let (spread, tsc, ns) = best?;
    // Compare the spread in ns (rate unknown at the first anchor: assume >= 0.1 GHz).
    let rate = SETS[(GEN.load(Ordering::Relaxed) % SETS_KEPT as u64) as usize]
        .rate
        .load(Ordering::Relaxed);
    let spread_ns = if rate != 0 {
        ((spread as u128 * rate as u128) >> SHIFT) as u64
    } else {
        spread / 10
    };
    (spread_ns <= ANCHOR_MAX_SPREAD_NS).then_some((tsc, ns))
}

/// Take a new anchor and publish parameters that steer onto it (one thread at a time).
pub(crate) fn recalibrate() {
    if !tsc_mode()
        || RECALIBRATING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    recalibrate_locked();
    RECALIBRATING.store(false, Ordering::Release);
}

fn recalibrate_locked() {
    let Some(old) = snapshot() else { return };
    let Some((t, m)) = anchor() else {
        // Interrupted every time: keep the parameters a little longer.
        return;
    };
    let (lt, lm) = (
        LAST_ANCHOR_TSC.load(Ordering::Relaxed),
        LAST_ANCHOR_NS.load(Ordering::Relaxed),
    );
    if t <= lt || m <= lm {
        return;
    }
    // The rate between the last two anchors (with a 10 ms baseline at least; else keep it).
    let rate = if m - lm >= 10_000_000 && !FAULT_DRIFT.load(Ordering::Relaxed) {
        (((m - lm) as u128) << SHIFT) / (t - lt) as u128
    } else {
        old.rate as u128
    };
    let rate = rate.clamp(1, u64::MAX as u128 / 2) as u64;
    let f = convert(&old, t);
    let recal_ticks = ((RECAL_NS as u128) << SHIFT) / rate as u128;
    let recal_ticks = recal_ticks.clamp(1, u64::MAX as u128 / 4) as u64;
    let err = m as i128 - f as i128;
    let (base_ns, corr) = if FAULT_DRIFT.load(Ordering::Relaxed) {
        (f, 0i64)
    } else if err > 1_000_000 {
        // Far behind (first use after a long pause, a suspended VM): jump forward.
        (m, 0)
    } else {
        // Steer the error away over the next period; never slower than half the rate (so
        // times keep moving forward even when the old line ran far ahead).
        let c = (err << SHIFT) / recal_ticks as i128;
        let c = c.clamp(-(rate as i128) / 2, rate as i128);
        (f, c as i64)
    };
    publish(Snapshot {
        base_tsc: t,
        base_ns,
        rate,
        corr,
        corr_ticks: recal_ticks,
        stale_ticks: STALE_AFTER * recal_ticks,
    });
    LAST_ANCHOR_TSC.store(t, Ordering::Relaxed);
    LAST_ANCHOR_NS.store(m, Ordering::Relaxed);
}

/// Chooses the clock and calibrates the TSC (~1 ms, only when tracing is configured).
pub(crate) fn init() {
    if CHOSEN.load(Ordering::Relaxed) {
        return;
    }
    let want_mono =
        crate::config::var("VRAMSHIM_TRACE_CLOCK").is_some_and(|v| v.trim() == "monotonic");
    FAULT_DRIFT.store(
        crate::config::switch_on("VRAMSHIM_TRACE_CLOCK_FAULT", "drift"),
        Ordering::Relaxed,
    );
    TSC.store(!want_mono && tsc_usable() && calibrate(), Ordering::Relaxed);
    CHOSEN.store(true, Ordering::Relaxed);
}

/// Which clock the trace uses ("tsc" or "monotonic"), for the header's configuration.
pub(crate) fn name() -> &'static str {
    if tsc_mode() { "tsc" } else { "monotonic" }
}

/// First rate: two anchors `FIRST_CALIBRATION_NS` apart.
fn calibrate() -> bool {
    let Some((t0, m0)) = anchor() else {
        return false;
    };
    let (t1, m1) = loop {
        let Some((t1, m1)) = anchor() else {
            return false;
        };
        if m1 >= m0 + FIRST_CALIBRATION_NS {
            break (t1, m1);
        }
        std::hint::spin_loop();
    };
    if t1 <= t0 {
        return false;
    }
    let mut rate = (((m1 - m0) as u128) << SHIFT) / (t1 - t0) as u128;
    // Plausible TSC: 0.1 to 20 GHz.
    if !((1u128 << SHIFT) / 20..=(10u128 << SHIFT)).contains(&rate) {
        return false;
    }
    if FAULT_DRIFT.load(Ordering::Relaxed) {
        rate += rate / 1000;
    }
    let rate = rate as u64;
    let recal_ticks = (((RECAL_NS as u128) << SHIFT) / rate as u128) as u64;
    publish(Snapshot {
        base_tsc: t1,
        base_ns: m1,
        rate,
        corr: 0,
        corr_ticks: 0,
        stale_ticks: STALE_AFTER * recal_ticks,
    });
    LAST_ANCHOR_TSC.store(t1, Ordering::Relaxed);
    LAST_ANCHOR_NS.store(m1, Ordering::Relaxed);
    true
}

/// Forked child: a re-anchoring the parent's other threads had under way is never finished
/// here; the parameters themselves stay valid (same TSC, same clock). A set it left half
/// written is the one after `GEN`'s, read by nobody until the child's own next re-anchoring
/// fills it again ([`fill`]).
pub(crate) fn on_fork_child() {
    RECALIBRATING.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::Mutex;

    /// The tests that rewrite the kept sets or time the clock, one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// The TSC clock chosen, and this test alone on it (None: no usable TSC here, said once).
    fn tsc_or_skip() -> Option<std::sync::MutexGuard<'static, ()>> {
        let s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        init();
        if name() != "tsc" {
            eprintln!("no usable TSC here: the trace clock is clock_gettime itself");
            return None;
        }
        Some(s)
    }

    /// Becomes the one thread that re-anchors (as `recalibrate` does, but waiting its turn).
    fn hold_recalibration() {
        while RECALIBRATING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    thread_local! {
        /// Rewrite races to force on this thread's next walks (see [`rewrite_race`]).
        static RACES: Cell<u32> = const { Cell::new(0) };
        /// Walks this thread made.
        static WALKS: Cell<u32> = const { Cell::new(0) };
    }

    /// The test hook at the top of [`ToNs::walk`], after it read `GEN`: where this thread has
    /// races to force, every kept set is refilled (with the newest parameters again, so that
    /// other threads' times do not move) before the walk reads any, as if this thread were
    /// preempted through `SETS_KEPT` re-anchorings.
    pub(super) fn rewrite_race() {
        WALKS.with(|w| w.set(w.get() + 1));
        let race = RACES.with(|r| {
            let n = r.get();
            r.set(n.saturating_sub(1));
            n > 0
        });
        if !race {
            return;
        }
        hold_recalibration();
        if let Some(p) = snapshot() {
            for _ in 0..SETS_KEPT {
                publish(p);
            }
        }
        RECALIBRATING.store(false, Ordering::Release);
    }

    /// A raw time taken now, with the monotonic clock read around it; then 20 ms pass, so that
    /// a conversion that answers "now" instead lies far outside.
    fn raw_then_wait() -> (u64, u64, u64) {
        let a = mono_ns();
        let r = now_raw();
        let b = mono_ns();
        std::thread::sleep(std::time::Duration::from_millis(20));
        (a, r, b)
    }

    /// A conversion whose first walk finds every set rewritten under it walks again and
    /// converts with the set in force: the time of the event, not the time of the conversion.
    #[test]
    fn a_lookup_overtaken_by_a_rewrite_walks_again() {
        let Some(_s) = tsc_or_skip() else { return };
        let (a, r, b) = raw_then_wait();
        RACES.with(|x| x.set(1));
        WALKS.with(|w| w.set(0));
        let t = ToNs::new().get(r);
        assert_eq!(RACES.with(Cell::get), 0, "the race was not forced");
        assert!(
            outside(t, a, b) <= BOUND_NS,
            "converted {t}, the event was between {a} and {b} (off by {} ns)",
            outside(t, a, b)
        );
        assert_eq!(
            WALKS.with(Cell::get),
            2,
            "one walk overtaken, one that read"
        );
    }

    /// Overtaken on every walk (a schedule that never lets it read), a conversion gives up
    /// after `LOOKUP_TRIES` walks with the monotonic clock's now: it never spins unboundedly.
    #[test]
    fn a_lookup_always_overtaken_gives_up_after_bounded_walks() {
        let Some(_s) = tsc_or_skip() else { return };
        let (a, r, _) = raw_then_wait();
        RACES.with(|x| x.set(u32::MAX));
        WALKS.with(|w| w.set(0));
        let t = ToNs::new().get(r);
        let c = mono_ns();
        RACES.with(|x| x.set(0));
        assert_eq!(WALKS.with(Cell::get), LOOKUP_TRIES);
        assert!(t >= a && t <= c, "{t} outside [{a}, {c}]");
    }

    /// A child forked while its parent was publishing a set (half written, or written with
    /// `GEN` not yet moved) publishes that generation again at its next re-anchoring: the set
    /// must then read whole, or every conversion in the child that needs it would fail.
    #[test]
    fn a_set_cut_off_by_a_fork_reads_once_the_child_fills_it() {
        let Some(_s) = tsc_or_skip() else { return };
        for half_written in [false, true] {
            hold_recalibration();
            let p = snapshot().expect("calibrated");
            let g = GEN.load(Ordering::Relaxed) + 1;
            // The parent's publish of generation g, cut off by the fork.
            fill(g, p);
            let slot = &SETS[(g % SETS_KEPT as u64) as usize];
            if half_written {
                slot.seq.fetch_sub(1, Ordering::Relaxed);
            }
            // The child.
            on_fork_child();
            hold_recalibration();
            publish(p);
            let now = GEN.load(Ordering::Relaxed);
            let read = read_set(now).is_some();
            RECALIBRATING.store(false, Ordering::Release);
            assert!(
                read,
                "generation {now} unreadable after the child filled it (half written: {half_written})"
            );
        }
    }

    /// Converted TSC times match `clock_gettime(CLOCK_MONOTONIC)` read around them, over
    /// several re-anchorings, on every thread, and never go backward on a thread: converted
    /// at once, and raw times converted after all the re-anchorings (`ToNs`, the writer's
    /// way).
    #[test]
    fn tsc_times_track_the_monotonic_clock() {
        let Some(_s) = tsc_or_skip() else { return };
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut worst = 0i64;
                    let mut prev = 0u64;
                    // Raw times with the monotonic clock around them, converted at the end
                    // (after every re-anchoring), as the writer converts buffered events.
                    let mut raws: Vec<(u64, u64, u64)> = Vec::new();
                    let end = mono_ns() + 4 * RECAL_NS;
                    let mut n = 0u64;
                    loop {
                        let a = mono_ns();
                        let t = now_ns();
                        let b = mono_ns();
                        assert!(t >= prev, "time went backward: {t} after {prev}");
                        prev = t;
                        worst = worst.max(outside(t, a, b));
                        n += 1;
                        if n.is_multiple_of(64) {
                            let a = mono_ns();
                            let r = now_raw();
                            raws.push((a, r, mono_ns()));
                        }
                        if a > end {
                            break;
                        }
                        if n.is_multiple_of(1024) {
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                    }
                    let mut conv = ToNs::new();
                    let mut prev = 0u64;
                    for (a, r, b) in raws {
                        let t = conv.get(r);
                        assert!(t >= prev, "converted time went backward: {t} after {prev}");
                        prev = t;
                        worst = worst.max(outside(t, a, b));
                    }
                    worst
                })
            })
            .collect();
        let worst = threads
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap();
        eprintln!("worst distance from clock_gettime: {worst} ns");
        assert!(
            worst <= BOUND_NS,
            "trace clock off CLOCK_MONOTONIC by {worst} ns (bound {BOUND_NS})"
        );
    }

    /// A buffer's times converted together (`convert_all`, the writer's way for a row of
    /// tensor events) are each what `get` gives it: across re-anchorings (several kept
    /// sets), at the anchors themselves and a tick either side, before every kept set and far
    /// after the newest, in order, backward and shuffled.
    #[test]
    fn times_converted_together_are_each_times_conversion() {
        let Some(_s) = tsc_or_skip() else { return };
        let mut raws = vec![0, 1, u64::MAX / 2, u64::MAX - 1];
        for _ in 0..4 {
            for _ in 0..20 {
                raws.push(now_raw());
            }
            hold_recalibration();
            recalibrate_locked();
            RECALIBRATING.store(false, Ordering::Release);
            let anchor = LAST_ANCHOR_TSC.load(Ordering::Relaxed);
            raws.extend([anchor - 1, anchor, anchor + 1]);
            std::thread::sleep(std::time::Duration::from_millis(11));
        }
        raws.push(now_raw() + (1 << 40));
        let mut orders = vec![raws.clone()];
        let mut sorted = raws.clone();
        sorted.sort_unstable();
        orders.push(sorted.clone());
        sorted.reverse();
        orders.push(sorted);
        let mut rng = vramshim_testkit::XorShift(0x9e37_79b9_7f4a_7c15);
        let mut shuffled = raws.clone();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.below(i as u64 + 1) as usize);
        }
        orders.push(shuffled);
        for order in orders {
            let want: Vec<u64> = order.iter().map(|&r| ToNs::new().get(r)).collect();
            let mut got = order.clone();
            ToNs::new().convert_all(&mut got, |t| t);
            assert_eq!(got, want, "raw times {order:?}");
        }
    }

    /// How far `t` lies outside `[a, b]`, the monotonic clock read around it (preemption only
    /// widens the window).
    fn outside(t: u64, a: u64, b: u64) -> i64 {
        a.saturating_sub(t).max(t.saturating_sub(b)) as i64
    }

    /// What the docs promise: within 10 us of `CLOCK_MONOTONIC` (typically < 100 ns).
    const BOUND_NS: i64 = 10_000;

    #[test]
    fn latency_matches_the_monotonic_clock() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        init();
        // The monotonic clock read around the stamp and around the latency: a thread
        // descheduled between any two reads only widens the window the latency must fall
        // in, never moves it out.
        let z = mono_ns();
        let s = stamp();
        let a = mono_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = mono_ns();
        let l = s.latency_ns() as u64;
        let c = mono_ns();
        assert!(
            l >= (b - a).saturating_sub(BOUND_NS as u64),
            "latency {l} < {}",
            b - a
        );
        assert!(
            l <= c - z + BOUND_NS as u64,
            "latency {l} longer than the {} ns from before the stamp to after the latency",
            c - z
        );
    }
}
