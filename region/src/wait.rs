//! Waiting for a group's members to free (`VRAMSHIM_ON_CAP=wait`): the shared half.
//!
//! A member whose request does not fit marks its slot ([`Region::begin_wait`]), reads the
//! line's wake-up generation ([`Region::wake_generation`]), retries the charge, and if it
//! still does not fit sleeps on the generation ([`Region::sleep`], a futex with a bounded
//! timeout). Whoever gives bytes back on a line with waiters bumps the generation and wakes
//! them (the region's uncharge, clean exit, reclaim and recount do it). Reading the
//! generation before the retry is what makes a wake-up impossible to miss: a free that the
//! retry did not see comes after the read, so it changes the generation the sleep checks.
//!
//! The waiter count of a line is only a hint for the free path (so that frees make no system
//! call while nobody waits). A waiter killed between its two bookkeeping steps can leave it
//! one low (a waiter then wakes on its timer instead), never high: the slot's bit is set
//! before the count rises and the count falls before the bit clears, and whoever clears a
//! bit (the waiter, or whoever reclaims a dead waiter's slot) lowers the count once.
//!
//! [`Region::wait_check`] tells a waiter whether anyone else could still make room (a live
//! member that holds bytes on the line and is not waiting itself) and whether it is the
//! latest of the live waiters: when nobody could and it is the latest, waiting would never
//! end, and the waiter fails at once. Liveness follows the region's rules (pid and start
//! time); a killed waiter's slot stops counting as soon as its death is seen.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use crate::{MAX_DEVICES, ProcessKey, REAP_FLAG, Region, Slot, SlotIndex, sys};

/// What a refused request does (`VRAMSHIM_ON_CAP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnCap {
    /// Fail at once (default).
    Fail,
    /// Wait for members to free, at most this long (None: no limit).
    Wait(Option<Duration>),
}

/// `VRAMSHIM_ON_CAP=wait` without a timeout waits this long.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest a timeout may be (a typo in the unit should not mean a year).
const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The accepted forms, for messages.
pub const FORMS: &str = "accepted: fail (default: refuse at once), wait (wait up to 60 s for members of VRAMSHIM_SHARED to free), wait:TIMEOUT (e.g. wait:30s, wait:500ms, wait:2m, wait:1h; a number alone is seconds; at most 7 days) or wait:forever";

/// Parses a `VRAMSHIM_ON_CAP` value (or `vramshim run --on-cap`); the error is the reason,
/// for one line.
pub fn parse_on_cap(v: &str) -> Result<OnCap, String> {
    let v = v.trim().to_ascii_lowercase();
    match v.as_str() {
        "fail" => return Ok(OnCap::Fail),
        "wait" => return Ok(OnCap::Wait(Some(DEFAULT_WAIT))),
        "wait:forever" => return Ok(OnCap::Wait(None)),
        _ => {}
    }
    let Some(t) = v.strip_prefix("wait:") else {
        return Err("neither fail nor wait[:TIMEOUT]".into());
    };
    parse_duration(t.trim()).map(|d| OnCap::Wait(Some(d)))
}

fn parse_duration(t: &str) -> Result<Duration, String> {
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("timeout \"{t}\" is not a number with a unit"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => return Err(format!("timeout unit \"{u}\" is not one of ms, s, m, h")),
    };
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("timeout \"{t}\" is not above 0"));
    }
    if secs > MAX_WAIT.as_secs_f64() {
        return Err(format!("timeout \"{t}\" is above 7 days"));
    }
    Ok(Duration::from_secs_f64(secs).max(Duration::from_millis(1)))
}

/// What a waiter needs to know about the others (see [`Region::wait_check`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCheck {
    /// A live member other than the caller holds bytes on the line and is not waiting: its
    /// frees (or its exit) can make room.
    pub others_can_free: bool,
    /// The caller began waiting after every other live waiter (ties broken by slot).
    pub latest: bool,
    /// Live members waiting (the caller included).
    pub waiting: usize,
}

impl Region {
    /// Slot `s` has a request waiting on line `line` (call once per line per process, when
    /// its first request starts waiting there).
    pub fn begin_wait(&self, s: SlotIndex, line: usize) {
        let (Some(l), slot) = (self.layout().header.devices.get(line), self.slot(s)) else {
            return;
        };
        if slot.waiting.load(SeqCst) == 0 {
            slot.wait_since.store(sys::monotonic_ns().max(1), SeqCst);
        }
        slot.waiting.fetch_or(1 << line, SeqCst);
        l.waiters.fetch_add(1, SeqCst);
    }

    /// Slot `s` no longer has a request waiting on `line`.
    pub fn end_wait(&self, s: SlotIndex, line: usize) {
        let (Some(l), slot) = (self.layout().header.devices.get(line), self.slot(s)) else {
            return;
        };
        if slot.waiting.load(SeqCst) & (1 << line) != 0 {
            dec_saturating(&l.waiters);
            slot.waiting.fetch_and(!(1 << line), SeqCst);
        }
    }

    /// Clears every wait mark of a slot that goes (its owner exits or is reclaimed).
    pub(crate) fn drop_waits(&self, slot: &Slot) {
        let bits = slot.waiting.swap(0, SeqCst);
        for (d, l) in self.layout().header.devices.iter().enumerate() {
            if bits & (1 << d) != 0 {
                dec_saturating(&l.waiters);
            }
        }
    }

    /// The wake-up generation of `line`: read it before retrying, then [`Region::sleep`] on it.
    pub fn wake_generation(&self, line: usize) -> u32 {
        self.layout()
            .header
            .devices
            .get(line)
            .map_or(0, |l| l.wake.load(SeqCst) as u32)
    }

    /// Sleeps until the generation of `line` moves past `generation` (a member gave bytes
    /// back), at most `timeout`. May return early (a signal); the caller retries either way.
    pub fn sleep(&self, line: usize, generation: u32, timeout: Duration) {
        if let Some(l) = self.layout().header.devices.get(line) {
            sys::futex_wait(&l.wake, generation, timeout);
        }
    }

    /// Test switch: this process's frees never wake waiters (they wake on their timers
    /// only), to show the tests catch a lost wake-up.
    pub fn set_no_wake(&self, on: bool) {
        self.no_wake.store(on, Relaxed);
    }

    /// Bytes came back on line `d`: wake its waiters, if any.
    pub(crate) fn wake_line(&self, d: usize) {
        let Some(l) = self.layout().header.devices.get(d) else {
            return;
        };
        if self.no_wake.load(Relaxed) {
            return;
        }
        if l.waiters.load(SeqCst) != 0 {
            l.wake.fetch_add(1, SeqCst);
            sys::futex_wake(&l.wake);
        }
    }

    /// Members waiting on `line` (the hint the free path reads).
    pub fn waiters(&self, line: usize) -> u64 {
        self.layout()
            .header
            .devices
            .get(line)
            .map_or(0, |l| l.waiters.load(Relaxed))
    }

    /// What waiter `me` needs to decide whether to go on waiting on `line`; liveness by
    /// [`ProcessKey::is_dead`] (only proof of death counts).
    pub fn wait_check(&self, me: SlotIndex, line: usize) -> WaitCheck {
        self.wait_check_with(me, line, &|k| !k.is_dead())
    }

    /// [`Region::wait_check`] with a custom liveness test.
    pub fn wait_check_with(
        &self,
        me: SlotIndex,
        line: usize,
        alive: &dyn Fn(ProcessKey) -> bool,
    ) -> WaitCheck {
        let lay = self.layout();
        let mine = &lay.slots[me.0];
        let my_since = (mine.wait_since.load(SeqCst), me.0);
        let mut out = WaitCheck {
            others_can_free: false,
            latest: true,
            waiting: usize::from(mine.waiting.load(SeqCst) != 0),
        };
        if line >= MAX_DEVICES {
            return out;
        }
        for (i, s) in lay.slots.iter().enumerate() {
            if i == me.0 {
                continue;
            }
            let k = s.key.load(SeqCst);
            if k == 0 || k & REAP_FLAG != 0 {
                continue;
            }
            let waiting = s.waiting.load(SeqCst);
            let holds = s.used[line].load(SeqCst) > 0;
            if waiting == 0 && !holds {
                continue;
            }
            let Some(owner) = ProcessKey::from_word(k) else {
                continue;
            };
            if !alive(owner) {
                continue;
            }
            if waiting == 0 {
                out.others_can_free = true;
            } else {
                out.waiting += 1;
                if (s.wait_since.load(SeqCst), i) > my_since {
                    out.latest = false;
                }
            }
        }
        out
    }
}

fn dec_saturating(w: &std::sync::atomic::AtomicU64) {
    let _ = w.fetch_update(SeqCst, SeqCst, |n| Some(n.saturating_sub(1)));
}

#[cfg(test)]
#[path = "wait_tests.rs"]
mod tests;
