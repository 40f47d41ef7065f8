//! A caller that keeps stream-ordered frees aside and serves its own same-size requests from
//! them (the interposer's per-thread caches, `interposer/src/pool/tcache.rs`) makes the tight
//! pool's decisions those it makes without such a caller when it follows the pool's protocol:
//! give back what it keeps before every pool allocation and free, in free order, and whenever
//! the bytes it keeps reach `Stitch::round_end_watch` (a round could end: everything live is
//! kept aside; or the pool is above its budget and the pages it keeps). Checked on every
//! shared trace and GPU recording, in one pass and in three, with the arena grown a page or a
//! run at a time, on the checking device (no overlap, no early reuse); without the watch the
//! pool's rounds do not end where they should and the driver calls differ. The caller is
//! `vramshim_pool::thread_cache` (the rules the interposer's caches follow, with the switches
//! that break them), which `replay::run_with` runs in front of the pool: on repeated random
//! rounds, where it changes the pool's calls, replay makes its calls.

mod common;

use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Budget, Stitch};
use vramshim_pool::thread_cache::{self, Rules, Step, ThreadCache};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy};
use vramshim_testkit::{RoundStep, XorShift, one_stream_round};

/// How the caller follows the protocol (its rules: `thread_cache::Rules`), and the pool it
/// is in front of.
#[derive(Clone, Copy)]
struct Caller {
    /// frees it keeps, when the bytes kept reach `Stitch::round_end_watch` it gives them back
    /// (`round_watch`), it counts the hits it serves into the pool (`count_hits`)
    rules: Rules,
    /// the pool's arena grows by runs (`Stitch::with_runs`)
    runs: bool,
}

/// The caller as the interposer's thread caches are: the watches, in front of the default
/// pool.
const WATCHED: Caller = Caller {
    rules: Rules::LIVE,
    runs: false,
};

/// No caller: every free reaches the pool.
const MODEL: Caller = Caller {
    rules: Rules::NONE,
    ..WATCHED
};

/// What a stream did to the pool behind a caller.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// driver calls
    calls: u64,
    /// bytes the pool held after the last event (before the caller gives back what it keeps)
    reserved: u64,
    /// frees the caller kept aside while the pool held more than its budget
    above: u64,
}

/// `events` (already given their free semantics) through a tight pool behind a caller that
/// keeps frees aside (`thread_cache::run_observed`); panics on a violation of the checking
/// device.
fn behind_cache(events: &[Event], c: Caller) -> Outcome {
    let mut dev = AccountingDevice::new(replay::UNLIMITED);
    dev.set_checking(true);
    let mut p = Stitch::tight().with_runs(c.runs);
    let mut above = 0;
    let mut cache = ThreadCache::new(c.rules);
    thread_cache::run_observed(events, &mut p, &mut dev, &mut cache, |step, p| {
        if step == (Step::Kept { given_back: false }) && p.stats().reserved > p.stats().budget {
            // above the budget only by the pages it keeps: it keeps its cache
            assert!(
                p.cached_blocks() == 0 || p.pinned_above_budget(),
                "a free kept aside where the pool would dissolve its cache"
            );
            above += 1;
        }
    })
    .unwrap();
    let reserved = p.stats().reserved;
    cache.give_back(&mut p, &mut dev).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    Outcome {
        calls: dev.calls().driver_calls(),
        reserved,
        above,
    }
}

#[test]
fn a_caller_keeping_frees_aside_leaves_the_pools_driver_calls_unchanged() {
    let mut differs_unwatched = false;
    let mut kept_above = 0;
    for (name, events) in common::traces() {
        for runs in [false, true] {
            // the model: every free reaching the pool (replay without the thread caches)
            let make = move || -> Box<dyn Policy> {
                Box::new(Stitch::tight().with_runs(runs).with_thread_caches(false))
            };
            let caller = Caller { runs, ..WATCHED };
            for passes in [1, 3] {
                let model: u64 =
                    replay::calls_per_pass_with(&events, Frees::StreamOrdered, &make, passes)
                        .iter()
                        .sum();
                let stream = Frees::StreamOrdered.apply(&replay::repeat(&events, passes));
                let Outcome {
                    calls: watched,
                    above,
                    ..
                } = behind_cache(&stream, caller);
                let unwatched = behind_cache(
                    &stream,
                    Caller {
                        rules: Rules {
                            round_watch: false,
                            ..caller.rules
                        },
                        ..caller
                    },
                )
                .calls;
                eprintln!(
                    "{name} x{passes}{}: model {model}, behind a cache {watched} ({above} frees kept aside above the budget), round ends not watched {unwatched}",
                    if runs { ", runs" } else { "" }
                );
                assert_eq!(watched, model, "{name} x{passes} runs {runs}");
                differs_unwatched |= unwatched != model;
                if !runs {
                    kept_above += above;
                }
            }
        }
    }
    assert!(
        differs_unwatched,
        "without the watch every trace still made the model's calls: the test cannot fail"
    );
    // Above its budget only by the pages it was lately forced to take, which it keeps (and
    // its cache with them), the pool gives nothing back at a free: a caller may keep frees
    // aside there too (t5 does: 2693 frees, in its first pass). The watch is 0 only above those pages.
    assert!(
        kept_above > 0,
        "no free was kept aside above the budget: the watch sends every free to the pool there"
    );
}

/// A program whose use shrinks for good to a loop the caller serves whole (one size freed and
/// asked again on its stream) gets the pages of its old peak back, as it does when every free
/// reaches the pool: the caller counts its hits into the pool, so the budget's windows end
/// and the budget follows the new peak. Not counted, the pool never ends a window and keeps
/// the old peak's pages (checked too, so the test can fail).
#[test]
fn a_caller_serving_a_shrunk_loop_lets_the_pool_give_the_old_peak_back() {
    let mut ev = Vec::new();
    let peak = 64;
    for id in 0..peak {
        ev.push(Event::Alloc {
            id,
            size: MIB,
            stream: 0,
        });
    }
    for id in 0..peak {
        ev.push(Event::Free {
            id,
            mode: FreeMode::Async { stream: 0 },
        });
    }
    // one small block stays live throughout: the loop never finds nothing live
    ev.push(Event::Alloc {
        id: peak,
        size: 4096,
        stream: 0,
    });
    let pairs = 3 * Budget::default().window;
    for id in peak + 1..peak + 1 + pairs {
        ev.push(Event::Alloc {
            id,
            size: 8192,
            stream: 0,
        });
        ev.push(Event::Free {
            id,
            mode: FreeMode::Async { stream: 0 },
        });
        // the process synchronizes now and then (pages freed stream-ordered go back then)
        if id % 1000 == 0 {
            ev.push(Event::ProcessSync);
        }
    }
    let model = behind_cache(&ev, MODEL);
    let counted = behind_cache(&ev, WATCHED);
    let uncounted = behind_cache(
        &ev,
        Caller {
            rules: Rules {
                count_hits: false,
                ..Rules::LIVE
            },
            ..WATCHED
        },
    );
    eprintln!(
        "model {model:?}, behind a caller counting its hits {counted:?}, not counting them {uncounted:?}"
    );
    assert!(
        model.reserved < 8 * MIB,
        "the model kept {} B of a {peak} MiB peak",
        model.reserved
    );
    assert_eq!(
        (counted.calls, counted.reserved),
        (model.calls, model.reserved),
        "behind the caller counting its hits"
    );
    assert!(
        uncounted.reserved >= peak * MIB,
        "hits not counted, the pool still gave the old peak back: the test cannot fail"
    );
}

/// `replay::run_with` (what `vramshim replay` runs) replays the tight pool behind the live
/// library's thread caches: on random one-stream repeated rounds (stream-ordered frees) it
/// makes the driver calls and reserves the peak of `thread_cache::run`, and without them
/// (`Stitch::with_thread_caches(false)`) those of a caller that keeps nothing; the two differ
/// on some rounds (so replay without the caches would leave the live library: the live
/// tests on cuda-sim show the library makes the first). A pool with a fault switch, runs or
/// kept ranges has no caches in front, as the interposer turns them off under those switches.
#[test]
fn replay_runs_the_thread_caches_in_front_of_the_tight_pool() {
    let mut r = XorShift(0x9E37_79B9_7F4A_7C15);
    let sizes = [
        4096,
        100 << 10,
        MIB,
        3 * MIB + (300 << 10),
        7 * MIB,
        20 * MIB,
    ];
    let (mut differ, mut served) = (0, 0);
    for _ in 0..40 {
        let round: Vec<Event> = one_stream_round(&mut r, &sizes)
            .into_iter()
            .map(|s| match s {
                RoundStep::Alloc { id, size } => Event::Alloc {
                    id,
                    size,
                    stream: 0,
                },
                RoundStep::Free { id, .. } => Event::Free {
                    id,
                    mode: FreeMode::Async { stream: 0 },
                },
            })
            .collect();
        let events = replay::repeat(&round, 6 + r.below(8) as usize);
        let replayed = |p: &mut Stitch| {
            let mut dev = AccountingDevice::new(replay::UNLIMITED);
            dev.set_checking(true);
            let r = replay::run_with(&events, p, &mut dev);
            assert!(r.completed && r.violations.is_empty(), "{:?}", r.violations);
            (r.driver_calls, r.peak_reserved, r.thread_cache_hits)
        };
        let behind = |rules: Rules| {
            let mut dev = AccountingDevice::new(replay::UNLIMITED);
            let mut p = Stitch::tight();
            let mut c = ThreadCache::new(rules);
            thread_cache::run_observed(&events, &mut p, &mut dev, &mut c, |_, _| {}).unwrap();
            let peak = p.stats().peak_reserved;
            c.give_back(&mut p, &mut dev).unwrap();
            (dev.calls().driver_calls(), peak, c.hits())
        };
        let with = replayed(&mut Stitch::tight());
        let without = replayed(&mut Stitch::tight().with_thread_caches(false));
        assert_eq!(with, behind(Rules::LIVE));
        assert_eq!(without, behind(Rules::NONE));
        // (with the layer replay the caches keep only frees under a page: a round whose small
        // blocks never meet their twins on the stream gets no hit)
        served += u32::from(with.2 > 0);
        assert_eq!(without.2, 0);
        differ += u32::from(with.0 != without.0);
    }
    eprintln!("of 40 rounds: the caches served {served}, changed the calls of {differ}");
    assert!(served > 0, "the caches served nothing");
    assert!(differ > 0, "the caches changed no round's driver calls");
    let mut faulty = Stitch::tight();
    faulty.set_faults(vramshim_pool::stitch::Faults {
        forget_rounds: true,
        ..Default::default()
    });
    for (name, p) in [
        ("tight", Stitch::tight()),
        ("no budget", Stitch::new()),
        ("runs", Stitch::tight().with_runs(true)),
        ("kept", Stitch::tight().with_kept(true)),
        ("a fault", faulty),
        ("off", Stitch::tight().with_thread_caches(false)),
    ] {
        let on = matches!(name, "tight" | "no budget");
        assert_eq!(p.thread_caches(), on, "{name}");
    }
}
