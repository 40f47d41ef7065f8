//! How long a drain of the threads' slots ([`super::slots`]) waits for owners that are inside
//! them, in all: one budget shared by every slot of the drain, so that an exit that finds
//! several threads stopped inside their slots (a debugger, a job scheduler's SIGSTOP, a thread
//! preempted for long on a loaded machine) waits no longer than it would for one. Each slot
//! still gets its first few waits (pauses: an owner in its window leaves within nanoseconds),
//! so that a stuck thread does not make the drain give up on the others that are merely busy.

use crate::sys::spin::back_off;

/// Waits every slot gets before the shared budget is drawn on (pauses, no yield).
const FIRST: u32 = 64;

pub(crate) struct Patience {
    /// Waits left beyond each slot's first [`FIRST`] (shared by every slot of one drain).
    left: u32,
    /// Clock time (`sys::clock::now_ns`) after which no slot waits beyond its first few.
    deadline: u64,
    /// The budget each slot gets anew under the fault switch `per-slot-wait` (the drain as it
    /// was: every stuck thread costs the whole budget).
    per_slot: Option<u32>,
    /// Waits for the current slot so far.
    here: u32,
    /// Waits in all (what the tests count).
    pub used: u64,
}

impl Patience {
    /// `waits` waits in all beyond each slot's first few, and none after `max_ns` from now
    /// (`None`: no time limit).
    pub(crate) fn new(waits: u32, max_ns: Option<u64>) -> Patience {
        Patience {
            left: waits,
            deadline: max_ns.map_or(u64::MAX, |ns| {
                crate::sys::clock::now_ns().saturating_add(ns)
            }),
            per_slot: fault_per_slot().then_some(waits),
            here: 0,
            used: 0,
        }
    }

    /// The drain moves on to another slot.
    pub(crate) fn next_slot(&mut self) {
        self.here = 0;
        if let Some(n) = self.per_slot {
            self.left = n;
            self.deadline = u64::MAX;
        }
    }

    /// Waits once more for the current slot; false when the drain must give it up.
    pub(crate) fn again(&mut self) -> bool {
        if self.here >= FIRST {
            if self.left == 0 || crate::sys::clock::now_ns() > self.deadline {
                self.left = 0;
                return false;
            }
            self.left -= 1;
        }
        back_off(self.here);
        self.here += 1;
        self.used += 1;
        true
    }

    /// The most waits a drain of `slots` slots may make with a budget of `waits`.
    #[cfg(test)]
    pub(crate) fn bound(slots: usize, waits: u32) -> u64 {
        slots as u64 * FIRST as u64 + waits as u64
    }
}

/// Fault switch (`VRAMSHIM_SLOTS_FAULT=per-slot-wait`): each slot gets the whole budget and no
/// time limit, as before the budget was shared, to show that the test counting a drain's waits
/// (`slots::tests::stuck_slots_share_one_budget`) catches it.
/// Read once: every writer tick makes a `Patience`, and a look-up of the switch scans the
/// configuration's list of names.
fn fault_per_slot() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    static PER_SLOT: AtomicU8 = AtomicU8::new(0);
    match PER_SLOT.load(Relaxed) {
        0 => {
            let on = crate::config::switch_on("VRAMSHIM_SLOTS_FAULT", "per-slot-wait");
            PER_SLOT.store(if on { 2 } else { 1 }, Relaxed);
            on
        }
        v => v == 2,
    }
}
