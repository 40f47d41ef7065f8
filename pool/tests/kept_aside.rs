//! A caller that keeps stream-ordered frees aside and serves its own same-size requests from
//! them (the interposer's per-thread caches, `interposer/src/pool/tcache.rs`) makes the tight
//! pool's decisions those it makes without such a caller when it follows the pool's protocol:
//! give back what it keeps before every pool allocation and free, in free order, and whenever
//! the bytes it keeps reach `Stitch::round_end_watch` (a round could end: everything live is
//! kept aside; or the pool is above its budget). Checked on every shared trace, in one pass and
//! in three, on the checking device (no overlap, no early reuse); without the watch the
//! pool's rounds do not end where they should and the driver calls differ.

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{ANY_STREAM, AccountingDevice, FreeMode, Policy, Request};

/// Frees a caller keeps, at most (as a thread cache).
const SLOTS: usize = 8;

/// (address, requested size, stream freed on)
type Kept = (u64, u64, u64);

/// How the caller follows the protocol, and the pool it is in front of.
#[derive(Clone, Copy)]
struct Caller {
    /// give back what it keeps when the bytes kept reach `Stitch::round_end_watch`
    watch: bool,
    /// ask `Stitch::aside_may_serve` before serving and tell `Stitch::note_aside_hit` after
    ranks: bool,
    /// the pool's arena grows by runs (`Stitch::with_runs`)
    runs: bool,
}

/// The caller as the interposer's thread caches are before runs: the watch, no ranks.
const WATCHED: Caller = Caller {
    watch: true,
    ranks: false,
    runs: false,
};

/// Driver calls of `events` (already given their free semantics) through a tight pool behind
/// a caller that keeps frees aside; panics on a violation.
fn behind_cache(events: &[Event], c: Caller) -> u64 {
    let mut dev = AccountingDevice::new(replay::UNLIMITED);
    dev.set_checking(true);
    let mut p = Stitch::tight().with_runs(c.runs);
    let mut kept: Vec<Kept> = Vec::new();
    let mut ids: HashMap<u64, (u64, u64)> = HashMap::new();
    let give_back = |p: &mut Stitch, dev: &mut AccountingDevice, kept: &mut Vec<Kept>| {
        for (a, _, s) in kept.drain(..) {
            p.free(dev, a, FreeMode::Async { stream: s }).unwrap();
        }
    };
    for ev in events {
        match *ev {
            Event::Alloc { id, size, stream } => {
                let mine = (stream != ANY_STREAM && (!c.ranks || p.aside_may_serve(size)))
                    .then(|| {
                        kept.iter()
                            .rposition(|&(_, sz, s)| sz == size && s == stream)
                    })
                    .flatten();
                let addr = match mine {
                    Some(i) => {
                        if c.ranks {
                            p.note_aside_hit(size);
                        }
                        kept.remove(i).0
                    }
                    None => {
                        give_back(&mut p, &mut dev, &mut kept);
                        match p.alloc_cached(size, stream) {
                            Some(a) => a,
                            None => p.alloc(&mut dev, Request { size, stream }).unwrap().addr,
                        }
                    }
                };
                dev.check_alloc(addr, size, stream);
                ids.insert(id, (addr, size));
            }
            Event::Free { id, mode } => {
                let Some((addr, size)) = ids.remove(&id) else {
                    continue;
                };
                dev.check_free(addr, mode);
                if let FreeMode::Async { stream } = mode
                    && kept.len() < SLOTS
                {
                    kept.push((addr, size, stream));
                    let w = p.round_end_watch();
                    let bytes: u64 = kept.iter().map(|k| k.1).sum();
                    if c.watch && w != u64::MAX && bytes >= w {
                        give_back(&mut p, &mut dev, &mut kept);
                    }
                    continue;
                }
                give_back(&mut p, &mut dev, &mut kept);
                p.free(&mut dev, addr, mode).unwrap();
            }
            Event::ProcessSync => {
                dev.process_sync();
                p.note_process_sync();
            }
        }
    }
    give_back(&mut p, &mut dev, &mut kept);
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    dev.calls().driver_calls()
}

#[test]
fn a_caller_keeping_frees_aside_leaves_the_pools_driver_calls_unchanged() {
    let make = || -> Box<dyn Policy> { Box::new(Stitch::tight()) };
    let mut differs_unwatched = false;
    for trace in vramshim_testkit::shipped_traces() {
        let t = vramshim_pool::rmm_csv::parse_file(&trace).unwrap();
        for passes in [1, 3] {
            let model: u64 =
                replay::calls_per_pass_with(&t.events, Frees::StreamOrdered, &make, passes)
                    .iter()
                    .sum();
            let stream = Frees::StreamOrdered.apply(&replay::repeat(&t.events, passes));
            let watched = behind_cache(&stream, WATCHED);
            let unwatched = behind_cache(
                &stream,
                Caller {
                    watch: false,
                    ..WATCHED
                },
            );
            eprintln!(
                "{} x{passes}: model {model}, behind a cache {watched}, round ends not watched {unwatched}",
                trace.display()
            );
            assert_eq!(watched, model, "{} x{passes}", trace.display());
            differs_unwatched |= unwatched != model;
        }
    }
    assert!(
        differs_unwatched,
        "without the watch every trace still made the model's calls: the test cannot fail"
    );
}

/// With the arena grown by runs (`Stitch::with_runs`), the caller also counts the hits it
/// serves into the pool's per-size ranks and leaves a rank the pool replays to the pool
/// (`Stitch::aside_may_serve`, `Stitch::note_aside_hit`): every shared trace, in one pass and
/// in three, then makes the model's driver calls (as it does without runs, ranks or not). Without the ranks some trace leaves the
/// model (t5 in three passes: its later passes' replayed places are taken by blocks of other
/// ranks), so the test can fail.
#[test]
fn a_caller_counting_its_hits_into_the_ranks_leaves_the_pools_calls_unchanged_with_runs() {
    let make = || -> Box<dyn Policy> { Box::new(Stitch::tight().with_runs(true)) };
    let mut differs_unranked = false;
    for trace in vramshim_testkit::shipped_traces() {
        let t = vramshim_pool::rmm_csv::parse_file(&trace).unwrap();
        for passes in [1, 3] {
            let model: u64 =
                replay::calls_per_pass_with(&t.events, Frees::StreamOrdered, &make, passes)
                    .iter()
                    .sum();
            let stream = Frees::StreamOrdered.apply(&replay::repeat(&t.events, passes));
            let ranked = behind_cache(
                &stream,
                Caller {
                    watch: true,
                    ranks: true,
                    runs: true,
                },
            );
            let unranked = behind_cache(
                &stream,
                Caller {
                    watch: true,
                    ranks: false,
                    runs: true,
                },
            );
            eprintln!(
                "{} x{passes}, runs: model {model}, behind a cache counting its hits {ranked}, not counting them {unranked}",
                trace.display()
            );
            assert_eq!(ranked, model, "{} x{passes}", trace.display());
            differs_unranked |= unranked != model;
            // the ranks change nothing where the pool grows a handle per page
            let plain = || -> Box<dyn Policy> { Box::new(Stitch::tight()) };
            let model: u64 =
                replay::calls_per_pass_with(&t.events, Frees::StreamOrdered, &plain, passes)
                    .iter()
                    .sum();
            let ranked = behind_cache(
                &stream,
                Caller {
                    ranks: true,
                    ..WATCHED
                },
            );
            assert_eq!(ranked, model, "{} x{passes}, no runs", trace.display());
        }
    }
    assert!(
        differs_unranked,
        "without the ranks every trace still made the model's calls: the test cannot fail"
    );
}
