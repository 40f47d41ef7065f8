//! `VRAMSHIM_ON_CAP=wait[:TIMEOUT]`: a request refused by a shared cap waits for the group's
//! members to free, up to the timeout, then fails as CUDA would (the out-of-memory code).
//!
//! The waiting itself is the region's (`vramshim_region::wait`): the waiter marks its slot,
//! reads the line's wake-up generation, retries, and sleeps on the generation (a futex) until
//! a member gives bytes back on the line or [`TICK`] passes. On a tick it reclaims the slots
//! of members that died (SIGKILL frees nothing and wakes nobody), then retries. Never hot.
//!
//! It fails at once, saying why, where waiting could not end well:
//! - the request is larger than the cap, or than the cap less what this process holds
//!   itself (no other member's frees can make room; another thread of the process could,
//!   but the wait would then hang on a program that waits for itself);
//! - the request's stream (or the legacy stream) is capturing a graph: capture must not
//!   block, and the capturing thread may be the one whose work would free;
//! - no other live member that holds memory on the device is free to give it back (each of
//!   them waits too) and this process began waiting last: the group would wait forever.
//!   The check runs when the wait begins and after every wake-up, so a member's death or
//!   exit that leaves only waiters ends the latest one's wait too.
//!
//! A private cap (no `VRAMSHIM_SHARED`) never waits: nobody else can free its bytes. Requests
//! the pool serves (`VRAMSHIM_POOL=stitch`) do not wait either: their pages are charged
//! under the pool's lock, and a wait there would stop the process's own frees.
//!
//! Visible: the request's trace event carries `flags::WAITED_ON_CAP` (its latency is the
//! wait), `vramshim top` shows the waiting members (the region's marks), the node registry
//! flags the process (`FLAG_WAITING`, published by the pipeline from [`waiting_now`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use vramshim_region::spec::human_bytes;
use vramshim_region::{MAX_DEVICES, ProcessKey, Region, SlotIndex};

use super::{Cap, Fault, NO_SLOT, Refusal, driver};
use crate::sys::spin::SpinLock;

pub(crate) use vramshim_region::wait::{FORMS, OnCap, parse_on_cap as parse};

/// A waiter wakes at least this often (a member may die without waking anyone).
pub(crate) const TICK: Duration = Duration::from_millis(200);

/// Why a wait ended in a refusal (for the refusal's line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    TimedOut(Duration),
    /// Every other live member holding memory on the device waits too (this many waiting).
    Deadlock(usize),
    Capturing,
    LargerThanCap,
    /// This process holds this much on the device itself.
    OwnHoldings(u64),
}

impl WaitEnd {
    fn text(self) -> String {
        match self {
            WaitEnd::TimedOut(t) => format!(
                "waited {t:?} for members of the group to free (VRAMSHIM_ON_CAP), in vain"
            ),
            WaitEnd::Deadlock(n) => format!(
                "not waiting (VRAMSHIM_ON_CAP=wait): every member of the group holding memory on the device is waiting ({n} waiting, this one last), so nobody would free it"
            ),
            WaitEnd::Capturing => "not waiting (VRAMSHIM_ON_CAP=wait): the stream is capturing a graph, which must not block".into(),
            WaitEnd::LargerThanCap => {
                "not waiting (VRAMSHIM_ON_CAP=wait): the request is larger than the cap".into()
            }
            WaitEnd::OwnHoldings(b) => format!(
                "not waiting (VRAMSHIM_ON_CAP=wait): this process holds {} of it itself, so no other member's frees can make room",
                human_bytes(b)
            ),
        }
    }

    fn kind(self) -> usize {
        match self {
            WaitEnd::TimedOut(_) => 0,
            WaitEnd::Deadlock(_) => 1,
            WaitEnd::Capturing => 2,
            WaitEnd::LargerThanCap => 3,
            WaitEnd::OwnHoldings(_) => 4,
        }
    }
}

thread_local! {
    /// The request this thread is making waited (read once by the trace event).
    static WAITED: Cell<bool> = const { Cell::new(false) };
    /// Why this thread's last wait ended in a refusal (read once by the refusal's line).
    static ENDED: Cell<Option<WaitEnd>> = const { Cell::new(None) };
}
/// Some request of the process ever waited (spares the trace path the thread-local).
static EVER_WAITED: AtomicBool = AtomicBool::new(false);

/// The waits of one cap instance.
pub(crate) struct Waits {
    /// Requests of this process waiting per region line (the region's mark is set while > 0).
    /// A spin lock, not a `Mutex`: a forked child takes it back even when a thread of the
    /// parent held it at the fork (a `Mutex` would stay locked there for good).
    per_line: SpinLock<[u32; MAX_DEVICES]>,
    /// Requests of this process waiting now.
    active: AtomicUsize,
    /// Per [`WaitEnd`] kind: its line was printed once (later ones go to the debug log).
    said: [AtomicBool; 5],
}

impl Waits {
    pub(crate) fn new() -> Waits {
        Waits {
            per_line: SpinLock::new([0; MAX_DEVICES]),
            active: AtomicUsize::new(0),
            said: [const { AtomicBool::new(false) }; 5],
        }
    }

    #[cfg(test)]
    /// The per-line counts stay locked, as when a thread of the parent held them at a fork.
    fn hold_lock_as_at_a_fork(&self) {
        std::mem::forget(self.per_line.lock());
    }

    /// In a forked child (the atfork child handler, where the calling thread is the only
    /// one): no request of it waits.
    pub(crate) fn reset_in_child(&self) {
        // SAFETY: the child's only thread, before any of its code runs: no guard is alive.
        *unsafe { self.per_line.reset_in_child() } = [0; MAX_DEVICES];
        self.active.store(0, Relaxed);
    }
}

impl Cap {
    /// The request of `bytes` on device `d` (on `stream`) was refused with `first`: with
    /// `VRAMSHIM_ON_CAP=wait` and a shared cap, wait for room (see the module docs). `Ok`:
    /// charged after all. `hold`: as for [`Cap::reserve_checked`] (a settle's section is
    /// never kept across a wait: only when the charge then fits).
    #[cold]
    #[inline(never)]
    pub(super) fn wait_for_room(
        &self,
        d: usize,
        bytes: u64,
        stream: u64,
        first: Refusal,
        hold: bool,
    ) -> Result<(), Refusal> {
        let OnCap::Wait(timeout) = self.settings.on_cap else {
            return Err(first);
        };
        let (Some(region), s) = (self.region.get(), self.slot.load(Relaxed)) else {
            return Err(first);
        };
        if self.settings.fault == Fault::NoWait || self.refuse_all.load(Relaxed) || s == NO_SLOT {
            return Err(first);
        }
        let (slot, Some(line)) = (SlotIndex(s), self.line(region, d)) else {
            return Err(first);
        };
        let cap = first.cap;
        if bytes > cap {
            return self.wait_refused(WaitEnd::LargerThanCap, first);
        }
        let own = region.slot_used(slot, line);
        if own.saturating_add(bytes) > cap {
            return self.wait_refused(WaitEnd::OwnHoldings(own), first);
        }
        if driver::capturing(stream) {
            return self.wait_refused(WaitEnd::Capturing, first);
        }
        self.enter_wait(region, slot, line);
        WAITED.with(|w| w.set(true));
        EVER_WAITED.store(true, Relaxed);
        let start = Instant::now();
        let mut last = first;
        let end = loop {
            let generation = region.wake_generation(line);
            match self.reserve_checked(d, bytes, stream, hold) {
                Ok(()) => break None,
                Err(r) => last = r,
            }
            if self.settings.fault != Fault::WaitDeadlock {
                let c = region.wait_check(slot, line);
                if !c.others_can_free && c.latest {
                    // A member that died just now is not counted, but its share may still be
                    // charged: give it back and retry before calling it a deadlock.
                    if self.settings.fault != Fault::NoReclaim
                        && let Some(me) = ProcessKey::current()
                        && self.reclaim(region, me).slots > 0
                    {
                        continue;
                    }
                    break Some(WaitEnd::Deadlock(c.waiting));
                }
            }
            let left = match timeout {
                None => TICK,
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => l.min(TICK),
                    _ => break Some(WaitEnd::TimedOut(t)),
                },
            };
            region.sleep(line, generation, left);
            if region.wake_generation(line) == generation
                && self.settings.fault != Fault::NoReclaim
                && let Some(me) = ProcessKey::current()
            {
                // Woken by the timer: members that died free nothing and wake nobody.
                self.reclaim(region, me);
            }
        };
        self.leave_wait(region, slot, line);
        match end {
            None => Ok(()),
            Some(e) => self.wait_refused(e, last),
        }
    }

    fn enter_wait(&self, region: &Region, slot: SlotIndex, line: usize) {
        self.waits.active.fetch_add(1, Relaxed);
        let mut n = self.waits.per_line.lock();
        if n[line] == 0 {
            region.begin_wait(slot, line);
        }
        n[line] += 1;
    }

    fn leave_wait(&self, region: &Region, slot: SlotIndex, line: usize) {
        let mut n = self.waits.per_line.lock();
        n[line] = n[line].saturating_sub(1);
        if n[line] == 0 {
            region.end_wait(slot, line);
        }
        drop(n);
        self.waits.active.fetch_sub(1, Relaxed);
    }

    /// The wait ends in a refusal for reason `e`: keep the reason for the refusal's line.
    fn wait_refused(&self, e: WaitEnd, r: Refusal) -> Result<(), Refusal> {
        ENDED.with(|x| x.set(Some(e)));
        Err(r)
    }

    /// The reason a wait of this thread just ended in a refusal, as a clause for the
    /// refusal's line (`first`: the process's first refusal, whose line is printed anyway),
    /// or a line of its own: printed once per reason (later ones: debug log).
    pub(super) fn wait_note(&self, first: bool) -> Option<String> {
        let e = ENDED.with(Cell::take)?;
        let seen = self.waits.said[e.kind()].swap(true, Relaxed);
        if first || !seen {
            Some(e.text())
        } else {
            crate::debug!("cap: {}", e.text());
            None
        }
    }

    /// Requests of this process waiting now.
    pub(crate) fn waiting(&self) -> usize {
        self.waits.active.load(Relaxed)
    }
}

/// Whether the request this thread is making waited on the cap (reads it once).
#[inline]
pub(crate) fn take_waited() -> bool {
    EVER_WAITED.load(Relaxed) && WAITED.with(Cell::take)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cap::tests::{capture, take_lines};
    use crate::cap::{ContextMode, DeviceQueries, Settings};
    use std::sync::{Arc, OnceLock};
    use vramshim_region::spec::parse_cap;
    use vramshim_trace::Api;

    const MIB: u64 = 1 << 20;

    fn total(_: i32) -> Option<u64> {
        Some(16 << 30)
    }
    fn one() -> Option<i32> {
        Some(1)
    }
    fn none(_: i32) -> Option<u64> {
        None
    }
    fn uuid(_: i32) -> Option<[u8; 16]> {
        Some([9; 16])
    }
    fn no_pools(_: i32, _: u64) -> Option<u64> {
        None
    }
    static QUERIES: OnceLock<DeviceQueries> = OnceLock::new();

    /// A member of group `path` (one "process" per cap; all share this test's pid and image).
    fn member(path: &std::path::Path, on_cap: OnCap, fault: Fault, image: u64) -> Cap {
        let _ = QUERIES.set(DeviceQueries {
            total,
            count: one,
            process_used: none,
            uuid,
            settle_pools: no_pools,
        });
        let mut c = Cap::new(
            Settings {
                spec: parse_cap("1GiB").unwrap(),
                cap_text: Some("1GiB".into()),
                shared: Some(("waiters".into(), path.to_path_buf())),
                shared_invalid: None,
                context: ContextMode::Exclude,
                strict: false,
                fault,
                origin: std::array::from_fn(|_| Some("VRAMSHIM_CAP=\"1GiB\"".into())),
                replaced: Vec::new(),
                dmem: Vec::new(),
                on_cap,
            },
            &QUERIES,
            capture,
        );
        c.image = image;
        c
    }

    /// A region path in a fresh directory, removed when the returned guard is dropped.
    fn group(tag: &str) -> (vramshim_testkit::TempDir, std::path::PathBuf) {
        let d = vramshim_testkit::TempDir::new(&format!("wait-{tag}"));
        let region = d.join("region");
        (d, region)
    }

    fn wait_for(secs: u64) -> OnCap {
        OnCap::Wait(Some(Duration::from_secs(secs)))
    }

    /// Waits until `c` has a request waiting (the other thread got there).
    fn until_waiting(c: &Cap) {
        while c.waiting() == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// One member holds 800 MiB of a 1 GiB group cap; another's 500 MiB request waits and is
    /// served once the first frees, flagged as having waited.
    #[test]
    fn a_waiting_request_is_served_when_a_member_frees() {
        let (_dir, path) = group("served");
        let holder = member(&path, OnCap::Fail, Fault::None, 7);
        let waiter = Arc::new(member(&path, wait_for(600), Fault::None, 7));
        holder.try_charge(0, 800 * MIB, Api::CudaMalloc).unwrap();
        let w = Arc::clone(&waiter);
        let t = std::thread::spawn(move || {
            let r = w.charge_alloc_on(0, 500 * MIB, Api::CudaMalloc, 0);
            (r, take_waited(), take_lines())
        });
        until_waiting(&waiter);
        holder.uncharge(0, 800 * MIB);
        let (r, waited, lines) = t.join().unwrap();
        assert_eq!(r, Ok(500 * MIB));
        assert!(waited, "the trace event is flagged");
        assert!(lines.is_empty(), "{lines:?}");
        assert_eq!(waiter.waiting(), 0);
        assert_eq!(waiter.in_use(0), 500 * MIB);
        let _ = std::fs::remove_file(&path);
    }

    /// Two members each hold 400 MiB and each ask for 400 MiB more: the first waits (the
    /// other could free), the second is the last to wait with nobody left to free and fails
    /// at once, saying so; when it gives its memory back the first is served. Without the
    /// check (`wait-deadlock`), the second would wait out its timeout.
    #[test]
    fn when_every_holder_waits_the_last_one_fails_at_once() {
        for fault in [Fault::None, Fault::WaitDeadlock] {
            let (_dir, path) = group(&format!("deadlock-{fault:?}"));
            let a = Arc::new(member(&path, wait_for(600), fault, 7));
            let b = member(&path, OnCap::Wait(Some(Duration::from_secs(2))), fault, 7);
            a.try_charge(0, 400 * MIB, Api::CudaMalloc).unwrap();
            b.try_charge(0, 400 * MIB, Api::CudaMalloc).unwrap();
            let a2 = Arc::clone(&a);
            let t =
                std::thread::spawn(move || a2.charge_alloc_on(0, 400 * MIB, Api::CudaMalloc, 0));
            until_waiting(&a);
            take_lines();
            let r = b.charge_alloc_on(0, 400 * MIB, Api::CuMemAlloc, 0);
            let lines = take_lines();
            assert!(r.is_err());
            match fault {
                Fault::None => {
                    assert_eq!(lines.len(), 1, "{lines:?}");
                    assert!(
                        lines[0].contains("cuMemAlloc of 400 MiB")
                            && lines[0].contains("refused")
                            && lines[0].contains("every member of the group holding memory on the device is waiting (2 waiting, this one last)"),
                        "{lines:?}"
                    );
                }
                // The timeout, not the check, ended it: what the assertions above catch.
                _ => assert!(lines[0].contains("waited 2s"), "{lines:?}"),
            }
            b.uncharge(0, 400 * MIB);
            assert_eq!(t.join().unwrap(), Ok(400 * MIB));
            let _ = std::fs::remove_file(&path);
        }
    }

    /// A child forked while another thread of the parent held the per-line counts (entering
    /// or leaving a wait) resets them without waiting for that thread, which does not exist
    /// in the child, and can then wait itself.
    #[test]
    fn a_forked_child_takes_the_wait_counts_back() {
        let (_dir, path) = group("fork");
        let c = Arc::new(member(&path, wait_for(600), Fault::None, 7));
        c.waits.hold_lock_as_at_a_fork();
        let (tx, rx) = std::sync::mpsc::channel();
        let c2 = Arc::clone(&c);
        std::thread::spawn(move || {
            c2.on_fork_child();
            let _ = tx.send(());
        });
        // A hang (the deadline is far above any run's time) fails the test.
        assert!(
            rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the child's reset waits for a lock nobody will release"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// Requests that can never be served by others' frees fail at once, saying why; a
    /// timeout ends a wait with a line saying how long it waited; a private cap never waits.
    #[test]
    fn hopeless_waits_fail_at_once_and_timeouts_say_so() {
        let (_dir, path) = group("hopeless");
        let a = member(&path, OnCap::Fail, Fault::None, 7);
        let b = member(
            &path,
            OnCap::Wait(Some(Duration::from_millis(300))),
            Fault::None,
            7,
        );
        take_lines();
        assert!(b.charge_alloc_on(0, 2 << 30, Api::CudaMalloc, 0).is_err());
        let l = take_lines();
        assert!(l[0].contains("larger than the cap"), "{l:?}");
        b.try_charge(0, 600 * MIB, Api::CudaMalloc).unwrap();
        assert!(b.charge_alloc_on(0, 500 * MIB, Api::CudaMalloc, 0).is_err());
        let l = take_lines();
        assert!(
            l.len() == 1 && l[0].contains("this process holds 600 MiB of it itself"),
            "{l:?}"
        );
        a.try_charge(0, 300 * MIB, Api::CudaMalloc).unwrap();
        assert!(b.charge_alloc_on(0, 200 * MIB, Api::CudaMalloc, 0).is_err());
        let l = take_lines();
        assert!(l.len() == 1 && l[0].contains("waited 300ms"), "{l:?}");
        // Said once per reason; later ones go to the debug log.
        assert!(b.charge_alloc_on(0, 200 * MIB, Api::CudaMalloc, 0).is_err());
        assert!(take_lines().is_empty());
        a.uncharge(0, 300 * MIB);
        b.uncharge(0, 600 * MIB);
        let _ = std::fs::remove_file(&path);
    }
}
