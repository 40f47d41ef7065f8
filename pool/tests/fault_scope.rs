//! A fault switch changes only what it names: a switch whose rule a run never reaches (kept
//! ranges off, no runs, no lifetime classes) leaves every block handed out and every count of
//! the run as it is without it. Otherwise a fault demo would break more than its property
//! (and a test that shows it failing would show something else): a switch that turned the
//! pool's fast path (`Stitch::alloc_cached`) off let the general path take other blocks.

mod common;

use vramshim_pool::replay::{self, Event, Frees, UNLIMITED};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, Policy};

/// (driver calls, syncs, cache hits, peak reserved, stream waits, a digest of every address
/// handed out in order) of a tight pool over `ev`, two passes (the second replays the first
/// round's places).
/// `split`: each allocation as the interposer makes it (`Stitch::alloc_cached`, then
/// `Stitch::alloc_missed` when it declines) instead of `Policy::alloc`.
fn counts(ev: &[Event], faults: Faults, split: bool) -> (u64, u64, u64, u64, u64, u64) {
    let mut dev = AccountingDevice::new(UNLIMITED);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    p.set_faults(faults);
    let ev = replay::repeat(ev, 2);
    let mut digest = 0u64;
    common::checked::replay_checked(
        &ev,
        &mut p,
        &mut dev,
        |p, dev, _, req| {
            let a = match split
                .then(|| p.alloc_cached(req.size, req.stream))
                .flatten()
            {
                Some(a) => a,
                None if split => p.alloc_missed(dev, req).unwrap().addr,
                None => p.alloc(dev, req).unwrap().addr,
            };
            digest = digest.rotate_left(7) ^ a;
            Ok::<_, ()>((a, req.size))
        },
        |_| {},
    )
    .unwrap();
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    let s = p.stats();
    let calls = dev.calls();
    (
        calls.driver_calls(),
        calls.syncs(),
        s.cache_hits,
        s.peak_reserved,
        s.stream_waits,
        digest,
    )
}

/// Switches of rules a default tight pool never takes (kept ranges, runs, lifetime classes
/// are off; no trace has it look past its mappings' limit while some are busy; nothing is near
/// the limit of an unlimited device) change nothing: not the blocks handed out, nor any count.
/// And the interposer's sequence (fast path, then the general path told it declined) hands
/// out the blocks `Policy::alloc` does.
#[test]
fn unreached_fault_switches_change_nothing() {
    let unreached = [
        (
            "kept_over_live",
            Faults {
                kept_over_live: true,
                ..Faults::default()
            },
        ),
        (
            "stitch_run_pages",
            Faults {
                stitch_run_pages: true,
                ..Faults::default()
            },
        ),
        (
            "mix_lifetimes",
            Faults {
                mix_lifetimes: true,
                ..Faults::default()
            },
        ),
        (
            "arena_mixes_lifetimes",
            Faults {
                arena_mixes_lifetimes: true,
                ..Faults::default()
            },
        ),
        // no trace makes the pool look past its mappings' limit while some are busy
        (
            "busy_until_sync",
            Faults {
                busy_until_sync: true,
                ..Faults::default()
            },
        ),
        (
            "busy_done_unasked",
            Faults {
                busy_done_unasked: true,
                ..Faults::default()
            },
        ),
        // the events of page fences are asked only with `Stitch::with_event_settles`
        (
            "fences_until_sync",
            Faults {
                fences_until_sync: true,
                ..Faults::default()
            },
        ),
        // no trace destroys a stream
        (
            "ignore_retired",
            Faults {
                ignore_retired: true,
                ..Faults::default()
            },
        ),
        (
            "ends_off",
            Faults {
                ends_off: true,
                ..Faults::default()
            },
        ),
        (
            "ends_unsynced",
            Faults {
                ends_unsynced: true,
                ..Faults::default()
            },
        ),
        (
            "ends_skip_rounds",
            Faults {
                ends_skip_rounds: true,
                ..Faults::default()
            },
        ),
        (
            "reform_without_held",
            Faults {
                reform_without_held: true,
                ..Faults::default()
            },
        ),
        // mappings grow in place only with `Stitch::with_grow`
        (
            "grow_over_live",
            Faults {
                grow_over_live: true,
                ..Faults::default()
            },
        ),
        // the layer replay holds places only with `Stitch::with_layer_holds`
        (
            "hold_over_live",
            Faults {
                hold_over_live: true,
                ..Faults::default()
            },
        ),
        // the arena places by two ends only when told classes (`Stitch::set_ends_class`)
        (
            "ends_over_live",
            Faults {
                ends_over_live: true,
                ..Faults::default()
            },
        ),
        // handles sized per request only with `Stitch::with_shapes`
        (
            "run_end_over_live",
            Faults {
                run_end_over_live: true,
                ..Faults::default()
            },
        ),
        // the shape guard only with `Stitch::with_shape_guard`
        (
            "guard_over_live",
            Faults {
                guard_over_live: true,
                ..Faults::default()
            },
        ),
        (
            "run_ends_near_limit",
            Faults {
                run_ends_near_limit: true,
                ..Faults::default()
            },
        ),
        (
            "shapes_near_limit",
            Faults {
                shapes_near_limit: true,
                ..Faults::default()
            },
        ),
    ];
    for (name, ev) in common::traces() {
        for frees in Frees::BOTH {
            let ev = frees.apply(&ev);
            let want = counts(&ev, Faults::default(), false);
            let split = counts(&ev, Faults::default(), true);
            assert_eq!(
                split,
                want,
                "{name} {}: the interposer's sequence differs from Policy::alloc",
                frees.name()
            );
            for (switch, f) in unreached {
                let got = counts(&ev, f, false);
                eprintln!("{name} {}: {switch}: {got:?}, none: {want:?}", frees.name());
                assert_eq!(
                    got,
                    want,
                    "{name} {}: {switch} changed (calls, syncs, hits, peak, waits, addresses)",
                    frees.name()
                );
            }
        }
    }
}
