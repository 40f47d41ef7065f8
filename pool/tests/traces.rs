//! The real allocation streams (shared/traces or their copies in tests/workloads/traces, RMM CSV) through every policy:
//! safety on the checking device, the stitch tightness target, steady state.

use vramshim_pool::replay::{self, Event, UNLIMITED};
use vramshim_pool::{FreeMode, MIB, PolicyKind, rmm_csv};

fn traces() -> Vec<(String, Vec<Event>)> {
    vramshim_testkit::shipped_traces()
        .into_iter()
        .map(|p| {
            let t = rmm_csv::parse_file(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into(), t.events)
        })
        .collect()
}

#[test]
fn every_policy_replays_every_trace_safely() {
    for (name, ev) in traces() {
        for kind in PolicyKind::ALL {
            let r = replay::run_checked(&ev, kind, UNLIMITED, None);
            assert!(r.completed, "{name} {kind}: {:?}", r.first_failure);
            assert!(
                r.violations.is_empty(),
                "{name} {kind}: {:?}",
                &r.violations[..1]
            );
            assert!(r.leaks.is_empty(), "{name} {kind}: {:?}", r.leaks);
            assert_eq!(r.peak_live, replay::peak_live(&ev));
        }
    }
}

#[test]
fn stitch_fits_within_5_percent_of_peak_live() {
    for (name, ev) in traces() {
        let live = replay::peak_live(&ev);
        // without its budget too
        let (_, no_budget) = stitch_pools()[1];
        let plain = replay::min_capacity_with(&ev, &no_budget);
        assert!(
            plain as f64 <= live as f64 * 1.05,
            "{name}: stitch without a budget needs {plain} B for {live} B live"
        );
        let stitch = replay::min_capacity(&ev, PolicyKind::Stitch);
        let caching = replay::min_capacity(&ev, PolicyKind::Caching);
        let direct = replay::min_capacity(&ev, PolicyKind::Direct);
        eprintln!(
            "{name}: peak live {:.1} MiB; min device stitch {:.3}x caching {:.3}x direct {:.3}x",
            live as f64 / MIB as f64,
            stitch as f64 / live as f64,
            caching as f64 / live as f64,
            direct as f64 / live as f64
        );
        assert!(
            stitch as f64 <= live as f64 * 1.05,
            "{name}: stitch needs {stitch} B for {live} B live"
        );
        assert!(stitch <= caching && stitch <= direct, "{name}");
        // at its minimum device size the replay completes, checked, and one page less fails
        let r = replay::run_checked(&ev, PolicyKind::Stitch, stitch, None);
        assert!(
            r.completed && r.violations.is_empty() && r.leaks.is_empty(),
            "{name}: {r:?}"
        );
        let r = replay::run(&ev, PolicyKind::Stitch, stitch - 2 * MIB, None);
        assert!(!r.completed, "{name}");
        let f = r.first_failure.unwrap();
        assert!(f.why.contains("out of memory"), "{}", f.why);
        // the cap refuses like a smaller device
        let r = replay::run(&ev, PolicyKind::Stitch, UNLIMITED, Some(stitch - 2 * MIB));
        assert!(
            !r.completed && r.first_failure.unwrap().why.contains("cap"),
            "{name}"
        );
    }
}

/// A training-like loop: per step, activations of a few sizes that vary by step parity
/// (two batch shapes), parameter-sized gradients, small scalars; everything but the weights
/// freed at the end of the step.
fn training_loop(steps: u64) -> Vec<Event> {
    let mut ev = Vec::new();
    let mut id = 0;
    let mut alloc = |ev: &mut Vec<Event>, size: u64| {
        id += 1;
        ev.push(Event::Alloc {
            id,
            size,
            stream: 0,
        });
        id
    };
    let weights: Vec<u64> = [40 * MIB, 3 * MIB + 123, 700_000, 1024, 9 * MIB]
        .iter()
        .map(|&s| alloc(&mut ev, s))
        .collect();
    let _ = weights;
    for step in 0..steps {
        let batch = if step % 2 == 0 { 16 } else { 12 };
        let mut step_ids = Vec::new();
        for layer in 0..6u64 {
            step_ids.push(alloc(&mut ev, batch * 1_300_000 + layer * 4096));
            step_ids.push(alloc(&mut ev, batch * 70_000));
            let t = alloc(&mut ev, 4);
            ev.push(Event::Free {
                id: t,
                mode: FreeMode::Async { stream: 0 },
            });
        }
        for g in 0..5u64 {
            step_ids.push(alloc(&mut ev, (g + 1) * 2 * MIB + 512 * g));
        }
        for id in step_ids.into_iter().rev() {
            ev.push(Event::Free {
                id,
                mode: FreeMode::Async { stream: 0 },
            });
        }
    }
    ev
}

/// Makes a new pool.
type Make = fn() -> Box<dyn vramshim_pool::Policy>;

/// The stitch pool as `PolicyKind::Stitch` builds it (with its budget) and without a budget
/// (`Stitch::new()`, `VRAMSHIM_POOL_BUDGET=off`).
fn stitch_pools() -> [(&'static str, Make); 2] {
    [
        ("stitch", || PolicyKind::Stitch.build()),
        ("stitch, budget off", || {
            Box::new(vramshim_pool::stitch::Stitch::new())
        }),
    ]
}

#[test]
fn steady_state_makes_no_driver_calls() {
    for (label, make) in stitch_pools() {
        steady_state_of(label, make);
    }
}

fn steady_state_of(label: &str, make: Make) {
    // a repeating loop: after the first step (two shapes: two steps) no driver call at all
    let ev = training_loop(20);
    let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
    let mut p = make();
    let mut ids = std::collections::HashMap::new();
    let mut calls_after_warmup = None;
    let mut allocs = 0;
    for e in &ev {
        match *e {
            Event::Alloc { id, size, stream } => {
                let a = p
                    .alloc(&mut dev, vramshim_pool::Request { size, stream })
                    .unwrap();
                ids.insert(id, a.addr);
                allocs += 1;
                // 5 weights + 2 steps of 6*3+5 allocations
                if allocs == 5 + 2 * 23 {
                    calls_after_warmup = Some(dev.calls());
                }
            }
            Event::Free { id, mode } => {
                p.free(&mut dev, ids.remove(&id).unwrap(), mode).unwrap();
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    let c = dev.calls().since(&calls_after_warmup.unwrap());
    assert_eq!(c.driver_calls(), 0, "{label}: {c:?}");
    assert_eq!(c.syncs(), 0, "{label}");
    // real traces replayed as a loop (cudaMalloc/cudaFree, as the log-replay workload
    // issues them): from the second pass on, no driver call at all
    for (name, ev) in traces() {
        let passes = replay::calls_per_pass_with(&ev, replay::Frees::CudaFree, &make, 3);
        eprintln!("{name} {label}: driver calls per pass {passes:?}");
        assert!(passes[0] > 0, "{name} {label}: {passes:?}");
        assert_eq!(&passes[1..], &[0, 0], "{name} {label}: {passes:?}");
    }
}

#[test]
fn soft_limit_keeps_reserved_close_to_live() {
    use vramshim_pool::stitch::Stitch;
    for (name, ev) in traces() {
        let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
        let mut p = Stitch::new().with_headroom(Some(0.0));
        let r = replay::run_with(&ev, &mut p, &mut dev);
        assert!(r.completed);
        let ratio = r.peak_device_used as f64 / r.peak_live as f64;
        eprintln!("{name}: soft limit 0: peak reserved / peak live {ratio:.3}");
        assert!(ratio < 1.10, "{name}: {ratio}");
    }
}

/// Every policy on the same free semantics (every free a `cudaFree`, then every free
/// stream-ordered): completes safely on the checking device; behind stream-ordered frees no
/// policy synchronizes.
#[test]
fn every_policy_on_the_same_free_semantics() {
    use vramshim_pool::replay::Frees;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            for kind in PolicyKind::ALL {
                let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
                dev.set_checking(true);
                let mut p = kind.build();
                let r = replay::run_with(&stream, p.as_mut(), &mut dev);
                let what = format!("{name} {kind} {}", frees.name());
                assert!(r.completed, "{what}: {:?}", r.first_failure);
                assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
                assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
                if frees == Frees::StreamOrdered && kind != PolicyKind::Direct {
                    assert_eq!(r.syncs, 0, "{what}");
                }
            }
        }
        let both = replay::compare(&ev, &PolicyKind::ALL, UNLIMITED, None);
        assert_eq!(both.len(), 6);
        assert!(both[..3].iter().all(|c| c.frees == Frees::CudaFree));
    }
}

/// The tight pool (`Stitch::tight()`) on an unlimited device: peak reserved within 10% of
/// peak live under both free semantics, at or below the caching model on the same stream,
/// safe on the checking device, and no synchronization behind stream-ordered frees.
#[test]
fn tight_stitch_tracks_live_on_a_large_device() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::Stitch;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
            dev.set_checking(true);
            let mut p = Stitch::tight();
            let r = replay::run_with(&stream, &mut p, &mut dev);
            let what = format!("{name} {}", frees.name());
            assert!(r.completed, "{what}: {:?}", r.first_failure);
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
            let ratio = r.peak_device_used as f64 / r.peak_live as f64;
            let caching = replay::run_on(&ev, PolicyKind::Caching, frees, UNLIMITED, None);
            eprintln!(
                "{what}: tight stitch peak reserved / peak live {ratio:.3} (caching {:.3}), {} driver calls, {} syncs",
                caching.peak_device_used as f64 / r.peak_live as f64,
                r.driver_calls,
                r.syncs
            );
            assert!(ratio <= 1.10, "{what}: {ratio}");
            assert!(r.peak_device_used <= caching.peak_device_used, "{what}");
            if frees == Frees::StreamOrdered {
                assert_eq!(r.syncs, 0, "{what}");
            }
        }
    }
}

/// The tight pool re-forms a mapping for a new block by remapping only the pages that
/// differ (bert, whose largest blocks need 23 contiguous pages that the budget leaves no
/// spare for: in the second pass their free pages are rarely the ones an earlier mapping
/// holds): each trace replayed twice under both free semantics completes on the checking
/// device with no overlap, no early reuse and nothing lost. With the mappings that blocks
/// still use re-formed too (`Faults::repair_used`, their bytes move under them), the checker
/// reports it: the test can fail.
#[test]
fn tight_pool_reforms_mappings_safely() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::{Faults, Stitch};
    let (mut repaired, mut broken_caught) = (0, 0);
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&replay::repeat(&ev, 2));
            for broken in [false, true] {
                let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
                dev.set_checking(true);
                // the tight pool re-forms no mapping that a place of its current or previous
                // round, or of its layers, is in (a repeated round or layer replays those
                // places); re-forming is what it does when it keeps neither, as here
                let mut p = Stitch::tight().with_layers(false);
                p.set_faults(Faults {
                    repair_used: broken,
                    forget_rounds: true,
                    ..Faults::default()
                });
                let what = format!("{name} {} broken {broken}", frees.name());
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    replay::run_with(&stream, &mut p, &mut dev)
                }));
                if broken {
                    // caught by the checker (overlap) or by the pool's own books (a block's
                    // bytes are no longer where it was placed)
                    let caught = run.as_ref().map_or(true, |r| !r.violations.is_empty());
                    eprintln!("{what}: {} repairs, caught {caught}", p.repairs());
                    if p.repairs() > 0 {
                        assert!(caught, "{what}: nothing saw the moved blocks");
                        broken_caught += 1;
                    }
                    continue;
                }
                let r = run.unwrap();
                eprintln!("{what}: {} repairs", p.repairs());
                assert!(r.completed, "{what}: {:?}", r.first_failure);
                assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
                assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
                repaired += p.repairs();
            }
        }
    }
    assert!(repaired > 0, "no mapping was re-formed");
    assert!(
        broken_caught > 0,
        "the broken rule never re-formed a mapping in use"
    );
}

/// Pages the tight pool was forced to take past its budget (a block no held range fits) stay
/// for two budget windows rather than going back at the next free (no cached block is kept
/// above the budget, so the promise holds): a repeated workload behind `cudaFree` then stops
/// taking and giving back the same pages every pass. Passes 2-6 of bert make fewer driver
/// calls than with the pages given back at once (vit no more) (`Faults::release_forced`),
/// t5's six passes fewer in all (its first pass 847 against 928; its passes 2-6 170 against
/// 129: a cache kept over forced pages serves exact repeats, where dissolving it lets later
/// requests be placed in its bytes), and the most the pool holds over the six passes is no
/// more than with them given back (t5: within 1.10 x peak live, 1.066 against 1.053). Run with
/// the rounds forgotten (`Faults::forget_rounds`): replaying the previous round's places, the
/// later passes force no growth at all (`tight_pool_replays_rounds_without_driver_calls`),
/// so there are no forced pages to keep; keeping them serves a workload whose rounds differ.
/// Likewise without the layer replay, which takes bert's layers' earlier places instead.
#[test]
fn tight_pool_keeps_pages_it_was_forced_to_take() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::{Faults, Stitch};
    for (name, ev) in traces() {
        let calls = |release_forced: bool| {
            let make = || -> Box<dyn vramshim_pool::Policy> {
                let mut p = Stitch::tight().with_layers(false);
                p.set_faults(Faults {
                    release_forced,
                    forget_rounds: true,
                    ..Faults::default()
                });
                Box::new(p)
            };
            let passes = replay::calls_per_pass_with(&ev, Frees::CudaFree, &make, 6);
            (passes[1..].iter().sum::<u64>(), passes.iter().sum::<u64>())
        };
        let ((kept, kept_all), (given_back, given_back_all)) = (calls(false), calls(true));
        eprintln!(
            "{name}: passes 2-6 make {kept} driver calls ({given_back} giving the pages back at once), all six {kept_all} ({given_back_all})"
        );
        // vit's later passes no longer force growth once the layout is forgotten when
        // nothing is live (7 calls in passes 2-6 either way); bert's and t5's still do
        if name.starts_with("t5") {
            assert!(
                kept_all < given_back_all,
                "{name}: {kept_all} vs {given_back_all}"
            );
        } else {
            assert!(kept <= given_back, "{name}: {kept} vs {given_back}");
        }
        if name.starts_with("bert") {
            assert!(kept < given_back, "{name}: {kept} vs {given_back}");
        }
        let peak = |release_forced: bool| {
            let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
            dev.set_checking(true);
            let mut p = Stitch::tight().with_layers(false);
            p.set_faults(Faults {
                release_forced,
                forget_rounds: true,
                ..Faults::default()
            });
            let r = replay::run_with(&replay::repeat(&ev, 6), &mut p, &mut dev);
            assert!(r.completed, "{name}");
            assert!(r.violations.is_empty(), "{name}: {:?}", &r.violations[..1]);
            r.peak_device_used as f64 / r.peak_live as f64
        };
        let (kept, given_back) = (peak(false), peak(true));
        eprintln!(
            "{name}: 6 passes hold at most {kept:.3} x peak live ({given_back:.3} giving the pages back at once)"
        );
        // t5 holds more so (1.066 against 1.053): the cache it keeps over its forced pages
        // is bytes later requests are not placed in (still within the 1.10 target)
        if name.starts_with("t5") {
            assert!(kept <= 1.10, "{name}: {kept}");
        } else {
            assert!(kept <= given_back, "{name}: {kept} vs {given_back}");
        }
    }
}

/// The tight pool's peak does not creep over repeated passes: after 8 passes of every trace,
/// under both free semantics, it has held at most 1.10 x peak live (the target of one pass),
/// safely (checking device). It forgets its layout when nothing is live; keeping it
/// (`Faults::keep_layout`) lets the layout drift and vit behind `cudaFree` creep past 1.10
/// (1.134 after 8 passes), which the second half checks, so the first half can fail.
#[test]
fn tight_pool_does_not_creep_over_passes() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::{Faults, Stitch};
    let held = |ev: &[Event], frees: Frees, keep_layout: bool| {
        let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
        dev.set_checking(true);
        let mut p = Stitch::tight();
        p.set_faults(Faults {
            keep_layout,
            ..Faults::default()
        });
        let r = replay::run_with(&frees.apply(&replay::repeat(ev, 8)), &mut p, &mut dev);
        assert!(r.completed, "{:?}", r.first_failure);
        assert!(r.violations.is_empty(), "{:?}", &r.violations[..1]);
        assert!(r.leaks.is_empty(), "{:?}", r.leaks);
        r.peak_device_used as f64 / r.peak_live as f64
    };
    let mut worst_kept = 0f64;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let h = held(&ev, frees, false);
            eprintln!(
                "{name} {}: 8 passes hold at most {h:.3} x peak live",
                frees.name()
            );
            assert!(h <= 1.10, "{name} {}: {h:.3}", frees.name());
        }
        if name.starts_with("vit") {
            worst_kept = worst_kept.max(held(&ev, Frees::CudaFree, true));
        }
    }
    eprintln!("vit behind cudaFree keeping its layout: {worst_kept:.3} x peak live");
    assert!(
        worst_kept > 1.10,
        "the broken rule did not creep: {worst_kept:.3}"
    );
}

/// The tight pool replays the previous round's layout (`stitch::rounds`): a repeated
/// workload's later rounds take the places of the round before, so from the second pass on
/// no pass of any trace, under either free semantics, makes a driver call, safely (checking
/// device, the replay of 4 passes; no synchronization behind stream-ordered frees). With the
/// rounds forgotten (`Faults::forget_rounds`) the later passes of bert stitch ranges anew,
/// which the second half checks, so the first half can fail.
#[test]
fn tight_pool_replays_rounds_without_driver_calls() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::{Faults, Stitch};
    let make = |forget_rounds: bool| {
        move || -> Box<dyn vramshim_pool::Policy> {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                forget_rounds,
                ..Faults::default()
            });
            Box::new(p)
        }
    };
    let mut forgotten = 0;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let what = format!("{name} {}", frees.name());
            let passes = replay::calls_per_pass_with(&ev, frees, &make(false), 4);
            eprintln!("{what}: driver calls per pass {passes:?}");
            assert!(passes[0] > 0, "{what}: {passes:?}");
            assert_eq!(&passes[1..], &[0, 0, 0], "{what}: {passes:?}");
            let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
            dev.set_checking(true);
            let mut p = make(false)();
            let r = replay::run_with(&frees.apply(&replay::repeat(&ev, 4)), p.as_mut(), &mut dev);
            assert!(r.completed, "{what}: {:?}", r.first_failure);
            assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
            assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
            if frees == Frees::StreamOrdered {
                assert_eq!(r.syncs, 0, "{what}");
            }
            if name.starts_with("bert") {
                let passes = replay::calls_per_pass_with(&ev, frees, &make(true), 4);
                eprintln!("{what}, rounds forgotten: driver calls per pass {passes:?}");
                forgotten += passes[1..].iter().sum::<u64>();
            }
        }
    }
    assert!(forgotten > 0, "forgetting the rounds made no driver call");
}

/// The round replay never takes a remembered place before what holds it may be reused: where
/// blocks freed with `cudaFree` still wait there, it synchronizes first (checking device, the
/// traces replayed 3 times behind `cudaFree`). With the synchronization left out
/// (`Faults::replay_unsynced`) the device sees those blocks' bytes reused early.
#[test]
fn tight_pool_replays_no_place_before_its_sync() {
    use vramshim_pool::replay::Frees;
    use vramshim_pool::stitch::{Faults, Stitch};
    let mut caught = 0;
    for (name, ev) in traces() {
        let ev = Frees::CudaFree.apply(&replay::repeat(&ev, 3));
        for broken in [false, true] {
            let mut dev = vramshim_pool::AccountingDevice::new(UNLIMITED);
            dev.set_checking(true);
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                replay_unsynced: broken,
                ..Faults::default()
            });
            let r = replay::run_with(&ev, &mut p, &mut dev);
            let what = format!("{name} broken {broken}");
            assert!(r.completed, "{what}: {:?}", r.first_failure);
            if broken {
                caught += r
                    .violations
                    .iter()
                    .filter(|v| v.contains("early reuse"))
                    .count();
            } else {
                assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
                assert!(r.leaks.is_empty(), "{what}: {:?}", r.leaks);
            }
        }
    }
    assert!(
        caught > 0,
        "a replay without its synchronization went unnoticed"
    );
}
