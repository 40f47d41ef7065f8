//! Retired streams: a stream the program destroys may still run its work, and a stream created
//! later may get the same handle value. What was freed on the old stream must then be ordered
//! (an event recorded on it before it went) for a request on the new one, never reused as "the
//! same stream". Each case runs on the checking device, which re-keys the old stream's frees
//! at the retirement as the program's driver would see them (`AccountingDevice::retire_stream`):
//! clean as the pool is, caught with the pool's notice ignored (`Faults::ignore_retired`) or
//! with the thread caches keeping their frees across it (`Rules::give_back_at_retire` off).

use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::thread_cache::{self, Rules, ThreadCache};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, PolicyKind, Stream};

/// The destroyed stream, and the handle value the new stream gets (the same).
const S: Stream = 0x7f00_1000;

fn alloc(id: u64, size: u64) -> Event {
    Event::Alloc {
        id,
        size,
        stream: S,
    }
}

fn free(id: u64) -> Event {
    Event::Free {
        id,
        mode: FreeMode::Async { stream: S },
    }
}

/// A block freed on S, S destroyed, the same size asked for on the new S: the exact-size
/// cache's block (and the thread cache's, in front of a pool that has them).
fn same_size() -> Vec<Event> {
    same_size_of(4 * MIB)
}

/// [`same_size`] with a block of `size` bytes (a 64 KiB block stays live throughout; the thread
/// caches keep only blocks under a page while the tight pool's layer replay acts, as by
/// default).
fn same_size_of(size: u64) -> Vec<Event> {
    vec![
        alloc(1, size),
        alloc(2, 64 * 1024),
        free(1),
        Event::StreamRetired { stream: S },
        alloc(3, size),
        free(3),
        free(2),
    ]
}

/// A block freed on S and dissolved into its pages after S is destroyed (the device holds
/// nothing more): its bytes carry the old stream's page fences into another size's block.
fn dissolved() -> Vec<Event> {
    vec![
        alloc(1, 4 * MIB),
        free(1),
        Event::StreamRetired { stream: S },
        alloc(2, 3 * MIB),
        free(2),
    ]
}

/// `events` through `p` on a checking device of `capacity` bytes; the violations.
fn violations(events: &[Event], p: &mut dyn Policy, capacity: u64) -> Vec<String> {
    run(events, p, capacity).violations
}

fn run(events: &[Event], p: &mut dyn Policy, capacity: u64) -> replay::ReplayResult {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    let r = replay::run_with(events, p, &mut dev);
    assert!(r.completed, "{:?}", r.first_failure);
    r
}

fn stitch(faults: Faults, tight: bool) -> Stitch {
    let mut p = if tight {
        Stitch::tight()
    } else {
        Stitch::new()
    };
    p.set_faults(faults);
    p.with_thread_caches(false)
}

fn ignored() -> Faults {
    Faults {
        ignore_retired: true,
        ..Faults::default()
    }
}

#[test]
fn a_block_freed_on_a_retired_stream_waits_for_its_event_on_the_new_stream() {
    for tight in [false, true] {
        let mut p = stitch(Faults::default(), tight);
        let r = run(&same_size(), &mut p, 1 << 40);
        assert!(r.violations.is_empty(), "tight {tight}: {:?}", r.violations);
        // reused behind the event recorded at the retirement, not avoided, and with no
        // synchronization (before the replay's final trim)
        assert_eq!(r.stats.stream_waits, 1, "tight {tight}: {:?}", r.stats);
        assert_eq!(r.stats.syncs, 0, "tight {tight}");
        let mut p = stitch(ignored(), tight);
        let v = violations(&same_size(), &mut p, 1 << 40);
        assert!(
            v.iter().any(|v| v.starts_with("early reuse")),
            "tight {tight}: the retirement ignored is not caught: {v:?}"
        );
    }
}

#[test]
fn bytes_dissolved_after_a_retirement_carry_its_event() {
    // 2 pages: the 3 MiB block can only take the dissolved 4 MiB block's bytes
    let cap = 4 * MIB;
    let mut p = stitch(Faults::default(), false);
    let v = violations(&dissolved(), &mut p, cap);
    assert!(v.is_empty(), "{v:?}");
    assert!(p.stats().stream_waits >= 1, "{:?}", p.stats());
    let mut p = stitch(ignored(), false);
    let v = violations(&dissolved(), &mut p, cap);
    assert!(
        v.iter().any(|v| v.starts_with("early reuse")),
        "the retirement ignored is not caught: {v:?}"
    );
}

/// [`same_size_of`] after a loop of 100 stream-ordered pairs of `size` on S beside a block live
/// throughout: with the layer replay on, a run of one large size it has no period for, whose
/// frees the caches keep too (`Policy::aside_run`).
fn same_size_after_a_loop_of(size: u64) -> Vec<Event> {
    let mut ev = vec![alloc(1000, 4096)];
    for i in 0..100 {
        ev.extend([alloc(2000 + i, size), free(2000 + i)]);
    }
    ev.extend(same_size_of(size));
    ev.push(free(1000));
    ev
}

/// The caches keep frees of the sizes the pool lets them (`Policy::aside_below`,
/// `Policy::aside_run`): under a page with the layer replay on (the default), a large size
/// after a loop of it, any size without it. Each case with a block they keep.
#[test]
fn the_thread_caches_give_back_before_a_retirement() {
    for (size, layers, looped) in [
        (256 * 1024, true, false),
        (4 * MIB, false, false),
        (4 * MIB, true, true),
    ] {
        for rules in [
            Rules::LIVE,
            Rules {
                give_back_at_retire: false,
                ..Rules::LIVE
            },
        ] {
            let what = format!("{size} bytes, layers {layers}, after a loop {looped}");
            let mut p = Stitch::tight().with_layers(layers);
            let mut dev = AccountingDevice::new(1 << 40);
            dev.set_checking(true);
            let mut c = ThreadCache::new(rules);
            let events = if looped {
                same_size_after_a_loop_of(size)
            } else {
                same_size_of(size)
            };
            // hits from the retirement on (the loop's own are not this test's)
            let retired_at = events
                .iter()
                .position(|e| matches!(e, Event::StreamRetired { .. }))
                .unwrap();
            let allocs_before = events[..retired_at]
                .iter()
                .filter(|e| matches!(e, Event::Alloc { .. }))
                .count();
            let (mut allocs, mut hits) = (0, 0);
            thread_cache::run_observed(&events, &mut p, &mut dev, &mut c, |s, _| {
                if let thread_cache::Step::Alloc { hit, .. } = s {
                    allocs += 1;
                    hits += u64::from(hit && allocs > allocs_before);
                }
            })
            .unwrap();
            let early = dev
                .violations()
                .iter()
                .any(|v| v.starts_with("early reuse"));
            if rules.give_back_at_retire {
                assert!(!early, "{what}: {:?}", dev.violations());
                assert_eq!(
                    hits, 0,
                    "{what}: a cache served a block of the retired stream"
                );
            } else {
                assert!(early, "{what}: a cache keeping its frees is not caught");
                assert_eq!(hits, 1, "{what}");
            }
        }
    }
    // `replay::run_with` runs the live caches in front of the default tight pool
    for ev in [
        same_size_of(256 * 1024),
        same_size_of(4 * MIB),
        same_size_after_a_loop_of(4 * MIB),
    ] {
        let mut p = PolicyKind::Stitch.build();
        assert!(p.thread_caches());
        let v = violations(&ev, p.as_mut(), 1 << 40);
        assert!(v.is_empty(), "{ev:?}: {v:?}");
    }
}

#[test]
fn the_caching_model_orders_a_retired_stream_s_free_blocks_too() {
    for ev in [same_size(), dissolved()] {
        let mut p = PolicyKind::Caching.build();
        let v = violations(
            &replay::as_seen_by(&ev, PolicyKind::Caching),
            p.as_mut(),
            1 << 40,
        );
        assert!(v.is_empty(), "{v:?}");
    }
}

/// A retirement during a capture records no event: what was freed on the old stream waits
/// for a synchronization (none may be made during the capture; the pool grows instead).
#[test]
fn a_retirement_during_a_capture_leaves_the_old_stream_s_frees_to_a_synchronization() {
    let mut p = stitch(Faults::default(), false);
    let mut dev = AccountingDevice::new(1 << 40);
    dev.set_checking(true);
    let req = |stream| vramshim_pool::Request {
        size: 4 * MIB,
        stream,
    };
    let a = p.alloc(&mut dev, req(S)).unwrap();
    dev.check_alloc(a.addr, a.size, S);
    dev.check_free(a.addr, FreeMode::Async { stream: S });
    p.free(&mut dev, a.addr, FreeMode::Async { stream: S })
        .unwrap();
    dev.set_capturing(true);
    p.retire_stream(&mut dev, S);
    dev.retire_stream(S);
    let b = p.alloc(&mut dev, req(S)).unwrap();
    dev.check_alloc(b.addr, b.size, S);
    assert_ne!(b.addr, a.addr, "taken with no event and no synchronization");
    dev.set_capturing(false);
    dev.check_free(b.addr, FreeMode::Async { stream: S });
    p.free(&mut dev, b.addr, FreeMode::Async { stream: S })
        .unwrap();
    // after the capture the pool synchronizes for it when it must
    let c = p.alloc(&mut dev, req(ANY)).unwrap();
    dev.check_alloc(c.addr, c.size, ANY);
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
}

const ANY: Stream = vramshim_pool::ANY_STREAM;
