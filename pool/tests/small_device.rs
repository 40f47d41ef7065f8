//! The smallest device (issue 17: <= 1.03 x peak live): every shared trace and GPU recording
//! replayed through the default pool (stitch with its budget) on the checking device of
//! 1.03 x its peak live, under both free semantics; and the rules that get the pool closer
//! (near the device's limit a round's mappings may be re-formed and cached blocks are
//! dissolved before the pool grows, `stitch/pressure.rs`; blocks of more than a page go on
//! page ends, `stitch/ends.rs`) shown to be what does it, to stay off a large device, and to
//! be caught when broken.

mod common;

use common::traces;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, MIB, Policy, PolicyKind};

const PAGE: u64 = 2 * MIB;

/// The events of the trace among `all` whose name ends with `suffix`.
fn named<'a>(all: &'a [(String, Vec<Event>)], suffix: &str) -> &'a [Event] {
    let t = all.iter().find(|t| t.0.ends_with(suffix));
    &t.unwrap_or_else(|| panic!("no trace {suffix}")).1
}

/// The largest whole-page device of at most 1.03 x the trace's peak live bytes.
fn device_1_03(events: &[Event]) -> u64 {
    let live = replay::peak_live(events);
    (live as f64 * 1.03) as u64 / PAGE * PAGE
}

/// The trace among `all` whose name ends with `suffix` and its 1.03 x device, which is the
/// `mib` MiB the test's text names.
fn on_its_1_03_device<'a>(
    all: &'a [(String, Vec<Event>)],
    suffix: &str,
    mib: u64,
) -> (&'a [Event], u64) {
    let ev = named(all, suffix);
    let capacity = device_1_03(ev);
    assert_eq!(capacity, mib * MIB, "{suffix}'s 1.03 x device");
    (ev, capacity)
}

/// Replay `events` through `pool` on a checking device of `capacity` bytes.
fn run(events: &[Event], pool: &mut dyn Policy, capacity: u64) -> replay::ReplayResult {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    let r = replay::run_with(events, pool, &mut dev);
    assert!(
        dev.peak_used() <= capacity,
        "the device's own count passed its capacity"
    );
    r
}

/// Three passes of `ev` (`replay::repeat`) under `frees` through the default pool with
/// `faults`, on a checking device of `capacity` bytes: no overlap and no early reuse either
/// way; with `fits` the passes complete with nothing lost, else the first pass completes and
/// the second is refused. Returns the pool (for its counters) and where it was refused.
fn three_passes(
    ev: &[Event],
    frees: Frees,
    faults: Faults,
    capacity: u64,
    fits: bool,
    what: &str,
) -> (Stitch, Option<usize>) {
    let one = replay::repeat(ev, 1).len();
    let stream = frees.apply(&replay::repeat(ev, 3));
    let mut p = Stitch::tight();
    p.set_faults(faults);
    let r = run(&stream, &mut p, capacity);
    let at = r.first_failure.as_ref().map(|f| f.index);
    assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
    if fits {
        assert!(r.completed, "{what}: {:?}", r.first_failure);
        assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
    } else {
        assert!(
            at.is_some_and(|i| i >= one && i < 2 * one),
            "{what}: refused at {at:?}, not in the second pass"
        );
    }
    (p, at)
}

#[test]
fn every_trace_completes_on_a_device_of_1_03_x_peak_live() {
    let mut met = 0;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            let capacity = device_1_03(&ev);
            let mut pool = PolicyKind::Stitch.build();
            let r = run(&stream, pool.as_mut(), capacity);
            let what = format!("{name} {} on {} MiB", frees.name(), capacity / MIB);
            eprintln!(
                "{what}: completed {}, {} driver calls",
                r.completed, r.driver_calls
            );
            assert!(r.completed, "{what}: {:?}", r.first_failure);
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
            met += 1;
        }
    }
    assert_eq!(met, 12, "six traces, both free semantics");
}

/// t5 on its 1.03 x device (484 MiB) is the page-ends rule's (`stitch/ends.rs`): near the
/// device's limit its blocks of more than a page take no twin's place and their remainders go
/// on page ends; with the rule off (`Faults::ends_off`) the pool is refused at its peak
/// request (event 28426, one whole page short), under both free semantics.
#[test]
fn t5_fits_1_03_x_peak_live_by_the_page_ends_rule() {
    let all = traces();
    let (ev, capacity) = on_its_1_03_device(&all, "traces/t5_train.rmm.csv", 484);
    for frees in Frees::BOTH {
        let stream = frees.apply(ev);
        for off in [false, true] {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                ends_off: off,
                ..Faults::default()
            });
            let r = run(&stream, &mut p, capacity);
            let what = format!("t5 {} on 484 MiB, rule off {off}", frees.name());
            eprintln!(
                "{what}: completed {}, {} blocks on page ends, {} driver calls",
                r.completed,
                p.ends_places(),
                r.driver_calls
            );
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            if off {
                assert!(!r.completed, "{what}: completes without the rule");
                assert_eq!(r.first_failure.as_ref().map(|f| f.index), Some(28426));
                assert_eq!(p.ends_places(), 0);
            } else {
                assert!(r.completed, "{what}: {:?}", r.first_failure);
                assert!(p.ends_places() > 0, "{what}: no block on page ends");
            }
        }
    }
}

/// Every trace, twice, both free semantics, on its 1.03 x device and 2 and 4 pages more,
/// with the pool as it is and with `broken` faults. As it is, each run stays within the
/// device's capacity with no overlap, no early reuse and nothing lost (checking device), and
/// `count` of its pool is summed; broken, a run is caught when the checking device sees a
/// violation or the pool's own books panic. Returns (the sum, the broken runs caught).
fn near_the_limit(broken: Faults, count: fn(&Stitch) -> u64) -> (u64, u64) {
    let (mut counted, mut caught) = (0, 0);
    for (name, ev) in traces() {
        let base = device_1_03(&ev);
        for frees in Frees::BOTH {
            let stream = frees.apply(&replay::repeat(&ev, 2));
            for extra in [0, 2, 4] {
                let capacity = base + extra * PAGE;
                for faults in [Faults::default(), broken] {
                    let is_broken = faults != Faults::default();
                    let mut p = Stitch::tight();
                    p.set_faults(faults);
                    let what = format!(
                        "{name} {} on {} MiB, broken {is_broken}",
                        frees.name(),
                        capacity / MIB
                    );
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let mut dev = AccountingDevice::new(capacity);
                        dev.set_checking(true);
                        let r = replay::run_with(&stream, &mut p, &mut dev);
                        assert!(
                            dev.peak_used() <= capacity,
                            "{what}: device count past capacity"
                        );
                        r
                    }));
                    if is_broken {
                        if r.as_ref().map_or(true, |r| !r.violations.is_empty()) {
                            caught += 1;
                        }
                        continue;
                    }
                    let r = r.unwrap();
                    assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
                    assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
                    counted += count(&p);
                }
            }
        }
    }
    (counted, caught)
}

/// The page-ends rule reuses the bytes of `cudaFree`d blocks only after the synchronization
/// it makes: every trace, twice, both free semantics, on its 1.03 x device and 2 and 4 pages
/// more, runs with no overlap, no early reuse and nothing lost, with blocks placed by the rule
/// (any refusal would be checked up to where it happens). With that synchronization left out (`Faults::ends_unsynced`) the checking
/// device sees bytes reused before the device finished with them: the test can fail.
#[test]
fn page_ends_reuse_nothing_early() {
    let broken = Faults {
        ends_unsynced: true,
        ..Faults::default()
    };
    let (placed, caught) = near_the_limit(broken, Stitch::ends_places);
    eprintln!("{placed} blocks placed on page ends; the broken rule caught {caught} times");
    assert!(placed > 0, "no block was placed on page ends");
    assert!(caught > 0, "the broken rule was never caught");
}

/// Devices the pool reaches only with the near-the-limit rules (MiB; one page less than
/// without them): bert behind `cudaFree` on 214 (1.023 x peak live), where round mappings
/// are re-formed; t5 stream-ordered on 486 (1.032) and the GPU recording of ViT
/// stream-ordered on 164 (1.005), where cached blocks are dissolved before the pool grows.
/// Each completes with the rules and is refused with the device's room ignored
/// (`Faults::pressure_off`).
#[test]
fn the_near_limit_rules_are_what_fit_these_devices() {
    let all = traces();
    for (trace, frees, mib) in [
        ("traces/bert_serve.rmm.csv", Frees::CudaFree, 214),
        ("traces/t5_train.rmm.csv", Frees::StreamOrdered, 486),
        ("gpu/vit_train.rmm.csv", Frees::StreamOrdered, 164),
    ] {
        let ev = named(&all, trace);
        let stream = frees.apply(ev);
        for off in [false, true] {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                pressure_off: off,
                ..Faults::default()
            });
            let r = run(&stream, &mut p, mib * MIB);
            let what = format!("{trace} {} on {mib} MiB, rules off {off}", frees.name());
            eprintln!(
                "{what}: completed {}, {} round mappings re-formed, {} driver calls",
                r.completed,
                p.pressure_reforms(),
                r.driver_calls
            );
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            if off {
                assert!(!r.completed, "{what}: completes without the rules");
                assert_eq!(p.pressure_reforms(), 0);
            } else {
                assert!(r.completed, "{what}: {:?}", r.first_failure);
                // bert's device is the re-forming rule's (the others', dissolving's)
                if trace.contains("bert") {
                    assert!(
                        p.pressure_reforms() > 0,
                        "{what}: no round mapping re-formed"
                    );
                }
            }
        }
    }
}

/// On a large device the rules never apply: every trace, both free semantics, two passes on
/// 80 GiB make exactly the driver calls they make with them switched off, no round mapping
/// is re-formed and no block placed on page ends (the steady state's zero calls are the budgeted pool's, untouched).
#[test]
fn a_large_device_never_sees_pressure() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&replay::repeat(&ev, 2));
            let mut calls = Vec::new();
            for off in [false, true] {
                let mut p = Stitch::tight();
                p.set_faults(Faults {
                    pressure_off: off,
                    ends_off: off,
                    ..Faults::default()
                });
                let r = run(&stream, &mut p, 80 << 30);
                assert!(r.completed, "{name}");
                assert_eq!(p.pressure_reforms(), 0, "{name} {}", frees.name());
                assert_eq!(p.ends_places(), 0, "{name} {}", frees.name());
                calls.push((r.driver_calls, r.syncs, r.peak_device_used));
            }
            assert_eq!(calls[0], calls[1], "{name} {}", frees.name());
        }
    }
}

/// Re-forming under pressure takes only mappings no block uses and no stream may still
/// touch: every trace (twice, both semantics) on devices from its 1.03 x device up a few
/// pages runs on the checking device with no overlap, no early reuse and nothing lost (up to
/// a refusal, where the device is too small for a second pass).
/// With the rule broken (`Faults::pressure_reform_used`: a round's mapping re-formed
/// whatever uses it, so blocks' bytes move under them) the checker or the pool's own books
/// catch it: the test can fail.
#[test]
fn reforming_under_pressure_moves_no_block() {
    let broken = Faults {
        pressure_reform_used: true,
        ..Faults::default()
    };
    let (reformed, caught) = near_the_limit(broken, Stitch::pressure_reforms);
    eprintln!(
        "{reformed} round mappings re-formed under pressure; broken rule caught {caught} times"
    );
    assert!(
        reformed > 0,
        "no round mapping was re-formed under pressure"
    );
    assert!(caught > 0, "the broken rule was never caught");
}

/// A training job repeats its step, so its smallest device is the one its passes complete
/// on, not its first pass's. Three passes of every trace (`replay::repeat`, the pool kept
/// across them), both free semantics, complete on the checking device of the smallest size
/// `examples/pool_passes.rs` measures for them (MiB), with no overlap, no early reuse and
/// nothing lost, and are refused one page below it; `replay::min_capacity_with` finds that
/// size (it once answered its unlimited run's peak, 170 MiB for the shared ViT behind
/// `cudaFree`, where the near-the-limit rules make the run fail). Every trace needs for three
/// passes what one pass needs.
#[test]
fn repeated_passes_complete_on_the_measured_device() {
    let all = traces();
    let cases = [
        ("traces/bert_serve.rmm.csv", 214, 214),
        ("traces/t5_train.rmm.csv", 484, 484),
        ("traces/vit_train.rmm.csv", 162, 162),
        ("gpu/gpt2_train.rmm.csv", 176, 176),
        ("gpu/mlp_train.rmm.csv", 164, 164),
        ("gpu/vit_train.rmm.csv", 166, 164),
    ];
    assert_eq!(all.len(), cases.len(), "every trace has its row");
    for (trace, cuda_free, stream_ordered) in cases {
        let ev = named(&all, trace);
        for (frees, mib) in [
            (Frees::CudaFree, cuda_free),
            (Frees::StreamOrdered, stream_ordered),
        ] {
            let stream = frees.apply(&replay::repeat(ev, 3));
            let what = format!("{trace} {}, 3 passes", frees.name());
            let r = run(&stream, &mut Stitch::tight(), mib * MIB);
            assert!(r.completed, "{what} on {mib} MiB: {:?}", r.first_failure);
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
            let make = || -> Box<dyn Policy> { Box::new(Stitch::tight()) };
            assert_eq!(
                replay::min_capacity_with(&stream, &make),
                mib * MIB,
                "{what}"
            );
            let below = run(&stream, &mut Stitch::tight(), (mib - 2) * MIB);
            assert!(!below.completed, "{what} completes on {} MiB", mib - 2);
            assert!(
                below.violations.is_empty(),
                "{what}: {:?}",
                &below.violations[..1]
            );
            let small = device_1_03(ev);
            if mib * MIB > small {
                // the first pass fits the 1.03 x device; the second is refused
                let on = format!("{what} on {} MiB", small / MIB);
                let (_, at) = three_passes(ev, frees, Faults::default(), small, false, &on);
                eprintln!("{on}: refused at event {at:?}");
            }
        }
    }
}

/// Near the device's limit a block of the page-ends rule takes its rank's place of the
/// previous round first (`stitch/ends.rs`, "Rounds first"): the pool enters a later pass
/// holding every page of its peak, so the rule applies from that pass's first large block on,
/// and without the round's places (`Faults::ends_skip_rounds`) the pass is laid out around
/// what the one before left. Three passes of the shared ViT (both free semantics) and of t5
/// with stream-ordered frees complete on their 1.03 x devices (164 and 484 MiB), as one pass
/// does, with no overlap, no early reuse and nothing lost; with the switch the first pass
/// completes there and the second is refused.
#[test]
fn later_passes_take_the_previous_rounds_places_near_the_limit() {
    let all = traces();
    for (trace, frees, mib) in [
        ("traces/vit_train.rmm.csv", Frees::CudaFree, 164),
        ("traces/vit_train.rmm.csv", Frees::StreamOrdered, 164),
        ("traces/t5_train.rmm.csv", Frees::StreamOrdered, 484),
    ] {
        let (ev, capacity) = on_its_1_03_device(&all, trace, mib);
        for skip in [false, true] {
            let faults = Faults {
                ends_skip_rounds: skip,
                ..Faults::default()
            };
            let what = format!(
                "{trace} {}, 3 passes on {} MiB, rounds skipped {skip}",
                frees.name(),
                capacity / MIB
            );
            let (p, at) = three_passes(ev, frees, faults, capacity, !skip, &what);
            eprintln!("{what}: refused at {at:?}, {} replays", p.replays());
        }
    }
}

/// A replayed place synchronizes where the pending frees reach their limit, as the
/// allocation that made it did (`stitch/rounds.rs`, "Hits"), so a later pass's cache hits take
/// the blocks the first pass's took. The GPU recording of GPT-2 behind `cudaFree`: on 80 GiB
/// its second and third passes make no driver call, and three passes complete on its 1.03 x
/// device (176 MiB) with no overlap, no early reuse and nothing lost. With the replay's
/// synchronization skipped (`Faults::replay_skips_sync`) the second pass makes driver calls
/// and is refused on 176 MiB.
#[test]
fn replayed_places_synchronize_as_the_first_pass_did() {
    let all = traces();
    let (ev, capacity) = on_its_1_03_device(&all, "gpu/gpt2_train.rmm.csv", 176);
    for skip in [false, true] {
        let faults = Faults {
            replay_skips_sync: skip,
            ..Faults::default()
        };
        let make = move || -> Box<dyn Policy> {
            let mut p = Stitch::tight();
            p.set_faults(faults);
            Box::new(p)
        };
        let passes = replay::calls_per_pass_with(ev, Frees::CudaFree, &make, 3);
        let what = format!("gpt2 cudaFree, replay's sync skipped {skip}");
        let (_, at) = three_passes(ev, Frees::CudaFree, faults, capacity, !skip, &what);
        eprintln!(
            "{what}: driver calls per pass {passes:?}; 3 passes on 176 MiB refused at {at:?}"
        );
        if skip {
            assert!(passes[1] > 0, "{what}: {passes:?}");
        } else {
            assert_eq!(&passes[1..], &[0, 0], "{what}: {passes:?}");
        }
    }
}

/// Near the limit a round's mappings are re-formed only when the device's room and the free
/// pages the pool holds are short together (`stitch/pressure.rs`, `reform_pressure`): three
/// passes of t5 behind `cudaFree` complete on its 1.03 x device (484 MiB), as one pass does,
/// with no overlap, no early reuse and nothing lost; counting the device's room alone
/// (`Faults::reform_without_held`) the first pass completes there and the second is refused.
#[test]
fn round_mappings_stay_while_the_pool_holds_free_pages() {
    let all = traces();
    let (ev, capacity) = on_its_1_03_device(&all, "traces/t5_train.rmm.csv", 484);
    for broken in [false, true] {
        let faults = Faults {
            reform_without_held: broken,
            ..Faults::default()
        };
        let what = format!("t5 cudaFree, 3 passes on 484 MiB, device's room alone {broken}");
        let (p, at) = three_passes(ev, Frees::CudaFree, faults, capacity, !broken, &what);
        eprintln!(
            "{what}: refused at {at:?}, {} round mappings re-formed",
            p.pressure_reforms()
        );
    }
}
