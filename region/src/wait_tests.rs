use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::{Check, ProcessKey, Region, spec};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn region() -> Arc<Region> {
    Arc::new(Region::anonymous(&spec::parse_cap("1GiB").unwrap()).unwrap())
}

fn me() -> ProcessKey {
    ProcessKey::current().unwrap()
}

/// A key for a process that does not exist (a member killed since).
fn ghost(n: u32) -> ProcessKey {
    ProcessKey::new(u32::MAX - n, 1)
}

/// Sleeps on line 0 as a waiter does while another thread frees `bytes` of `holder`;
/// returns whether the generation moved (a wake-up, not the timer) and the retry's result.
fn wait_while_freed(r: &Arc<Region>, timeout: Duration) -> (bool, Result<u64, u64>) {
    let line = r.line_for(crate::DeviceId::ordinal(0)).unwrap();
    let holder = r.claim_slot(me(), 1).unwrap();
    let waiter = r.claim_slot(me(), 1).unwrap();
    r.charge(holder, line, 800 * MIB, GIB, Check::Atomic)
        .unwrap();
    r.begin_wait(waiter, line);
    let g = r.wake_generation(line);
    assert!(
        r.charge(waiter, line, 500 * MIB, GIB, Check::Atomic)
            .is_err()
    );
    let freer = {
        let r = Arc::clone(r);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            r.uncharge(holder, line, 800 * MIB);
        })
    };
    r.sleep(line, g, timeout);
    let woken = r.wake_generation(line) != g;
    freer.join().unwrap();
    let got = r.charge(waiter, line, 500 * MIB, GIB, Check::Atomic);
    r.end_wait(waiter, line);
    assert_eq!(r.waiters(line), 0);
    (woken, got)
}

/// A free on a line with a waiter bumps the generation and wakes the sleeper (it does not
/// sleep out its timeout); the retry is served.
#[test]
fn a_free_wakes_a_sleeping_waiter() {
    let r = region();
    let (woken, got) = wait_while_freed(&r, Duration::from_secs(30));
    assert!(woken, "the free must wake the waiter, not its timer");
    assert_eq!(got, Ok(500 * MIB));
}

/// The same with the frees' wake-up switched off (the test switch behind
/// `VRAMSHIM_CAP_FAULT=no-wake`): the sleeper sleeps out its timeout, the generation never
/// moved. This is what `a_free_wakes_a_sleeping_waiter` catches.
#[test]
fn without_the_wake_a_waiter_sleeps_out_its_timeout() {
    let r = region();
    r.set_no_wake(true);
    let (woken, got) = wait_while_freed(&r, Duration::from_millis(300));
    assert!(!woken);
    // The timer is the safety net: the retry after it is served all the same.
    assert_eq!(got, Ok(500 * MIB));
}

/// With nobody waiting a free bumps nothing (and makes no system call).
#[test]
fn frees_without_waiters_leave_the_generation_alone() {
    let r = region();
    let line = r.line_for(crate::DeviceId::ordinal(0)).unwrap();
    let s = r.claim_slot(me(), 1).unwrap();
    let g = r.wake_generation(line);
    r.charge(s, line, 10 * MIB, GIB, Check::Atomic).unwrap();
    r.uncharge(s, line, 10 * MIB);
    assert_eq!(r.wake_generation(line), g);
    // A clean exit of a member while another waits wakes it.
    let w = r.claim_slot(me(), 1).unwrap();
    r.charge(s, line, 10 * MIB, GIB, Check::Atomic).unwrap();
    r.begin_wait(w, line);
    r.release_slot(s);
    assert_ne!(r.wake_generation(line), g);
    r.end_wait(w, line);
}

/// Whether anyone could still make room, and who waited last.
#[test]
fn wait_check_sees_holders_and_orders_waiters() {
    let r = region();
    let line = r.line_for(crate::DeviceId::ordinal(0)).unwrap();
    let a = r.claim_slot(me(), 1).unwrap();
    let b = r.claim_slot(me(), 1).unwrap();
    r.charge(a, line, 400 * MIB, GIB, Check::Atomic).unwrap();
    r.charge(b, line, 400 * MIB, GIB, Check::Atomic).unwrap();
    r.begin_wait(b, line);
    let c = r.wait_check(b, line);
    assert!(c.others_can_free && c.latest && c.waiting == 1, "{c:?}");
    // A waits too, after B: nobody is left to free, and A is the latest.
    std::thread::sleep(Duration::from_millis(2));
    r.begin_wait(a, line);
    let ca = r.wait_check(a, line);
    let cb = r.wait_check(b, line);
    assert!(
        !ca.others_can_free && ca.latest && ca.waiting == 2,
        "{ca:?}"
    );
    assert!(!cb.others_can_free && !cb.latest, "{cb:?}");
    assert_eq!(r.waiters(line), 2);
    // The snapshot shows who waits.
    let snap = r.snapshot();
    assert!(snap.processes.iter().all(|p| p.waiting == 1 << line));
    r.end_wait(a, line);
    assert!(r.wait_check(b, line).others_can_free);
    r.end_wait(b, line);
    assert_eq!(r.waiters(line), 0);
}

/// A waiter killed while waiting: never counted as waiting (its pid and start time are
/// gone), and its marks go with its slot when it is reclaimed. Judged alive by pid alone
/// (`alive = true` below, standing for a broken liveness test) it would be counted.
#[test]
fn a_killed_waiter_is_not_counted() {
    let r = region();
    let line = r.line_for(crate::DeviceId::ordinal(0)).unwrap();
    let live = r.claim_slot(me(), 1).unwrap();
    let dead = r.claim_slot(ghost(7), 1).unwrap();
    r.charge(dead, line, 300 * MIB, GIB, Check::Atomic).unwrap();
    r.charge(live, line, 300 * MIB, GIB, Check::Atomic).unwrap();
    r.begin_wait(dead, line);
    r.begin_wait(live, line);
    assert_eq!(r.waiters(line), 2);
    let c = r.wait_check(live, line);
    assert_eq!((c.waiting, c.latest, c.others_can_free), (1, true, false));
    let broken = r.wait_check_with(live, line, &|_| true);
    assert_eq!(
        broken.waiting, 2,
        "the broken liveness test counts the dead waiter"
    );
    let got = r.reclaim(me());
    assert_eq!((got.slots, got.bytes), (1, 300 * MIB));
    assert_eq!(
        r.waiters(line),
        1,
        "the dead waiter's mark went with its slot"
    );
    assert_eq!(r.wait_check_with(live, line, &|_| true).waiting, 1);
    r.end_wait(live, line);
    assert_eq!(r.waiters(line), 0);
}
#[test]
fn on_cap_values() {
    assert_eq!(parse_on_cap("fail"), Ok(OnCap::Fail));
    assert_eq!(parse_on_cap(" WAIT "), Ok(OnCap::Wait(Some(DEFAULT_WAIT))));
    assert_eq!(parse_on_cap("wait:forever"), Ok(OnCap::Wait(None)));
    let secs = |s: f64| Ok(OnCap::Wait(Some(Duration::from_secs_f64(s))));
    assert_eq!(parse_on_cap("wait:30s"), secs(30.0));
    assert_eq!(parse_on_cap("wait:30"), secs(30.0));
    assert_eq!(parse_on_cap("wait:500ms"), secs(0.5));
    assert_eq!(parse_on_cap("wait:2m"), secs(120.0));
    assert_eq!(parse_on_cap("wait:1.5h"), secs(5400.0));
    for bad in [
        "", "block", "wait:", "wait:0", "wait:-1s", "wait:5x", "wait:8d", "wait:1e9",
    ] {
        assert!(parse_on_cap(bad).is_err(), "{bad}");
    }
    assert!(parse_on_cap("wait:10000h").unwrap_err().contains("7 days"));
}
