//! The layer replay (`Stitch::with_layers`, on by default): within one round, a repeated
//! sequence of large requests takes the places of two periods before (else of one period
//! before). On the
//! checking device every shared trace and GPU recording, under both free semantics, completes
//! with no overlap, no early reuse and nothing leaked, within 1.10 x peak live on an 80 GiB
//! device, on a device no smaller than the pool without it needs, and with no driver call
//! after the first of three passes where the pool without it makes none, and no more calls in
//! the second half of one pass; bert_serve (one long round of repeated layers) makes fewer
//! there under both free semantics.
//! Broken on purpose (`Faults::replay_over_live` with layers on: a remembered place taken over
//! a live block), the checking device reports the overlap on bert_serve, which the same
//! switch without layers leaves clean (its one long round has no round to replay).
//! With its holds (`Stitch::with_layer_holds`) every trace is as safe and within the same
//! targets, and bert_serve's second half makes fewer calls; a hold over a live block
//! (`Faults::hold_over_live`) is caught on bert_serve.
//! The thread caches keep only frees under a page while it acts (`Policy::aside_below`): on
//! bert_serve stream-ordered, caches that keep every size (`Rules::keep_large`) make more calls.
//! They also keep the frees of a loop of one large size too long for any period
//! (`Policy::aside_run`), and serve most of it, with the layers after it replayed as before.

mod common;

use common::{later_pass_calls, run_clean_within_1_10, traces};
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::thread_cache::{self, Rules, ThreadCache};
use vramshim_pool::{AccountingDevice, Policy};

/// bert_serve's events.
fn bert() -> Vec<Event> {
    traces()
        .into_iter()
        .find(|(n, _)| n.ends_with("bert_serve.rmm.csv"))
        .expect("bert_serve is shared")
        .1
}

/// One trace under one free semantics through a pool with a rule (`with`) and without it.
struct Against {
    what: String,
    /// what the rule did in the run on the checking device (`acted`)
    acted: u64,
    /// driver calls per 1000 allocations in the second half of a pass, with and without
    half: (f64, f64),
}

/// Every trace under both free semantics through the pool `with` makes: complete with no
/// overlap, no early reuse and nothing leaked within 1.10 x peak live on an 80 GiB device, on
/// a smallest device no larger than the pool `without` makes needs, with no driver call after
/// the first of three passes where `without` makes none, and no more calls in the second half
/// of one pass. `acted` counts what the rule did in the checked run.
fn every_trace_keeps_the_targets(
    with: fn() -> Stitch,
    without: fn() -> Stitch,
    acted: fn(&Stitch) -> u64,
) -> Vec<Against> {
    let make = |f: fn() -> Stitch| move || -> Box<dyn Policy> { Box::new(f()) };
    let (on, off) = (make(with), make(without));
    let mut out = Vec::new();
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let what = format!("{name} {}", frees.name());
            let stream = frees.apply(&ev);
            let mut p = with();
            let held = run_clean_within_1_10(&stream, &mut p, &what);
            let later = (
                later_pass_calls(&ev, frees, &on),
                later_pass_calls(&ev, frees, &off),
            );
            let min = (
                replay::min_capacity_with(&stream, &on),
                replay::min_capacity_with(&stream, &off),
            );
            let half = (
                replay::second_half_calls_per_1000(&ev, frees, &on),
                replay::second_half_calls_per_1000(&ev, frees, &off),
            );
            eprintln!(
                "{what}: acted {}, {held:.3} x peak live, smallest device {} (without {}), \
                 later passes {} (without {}), second half {:.1} per 1000 (without {:.1})",
                acted(&p),
                min.0,
                min.1,
                later.0,
                later.1,
                half.0,
                half.1
            );
            assert!(min.0 <= min.1, "{what}: smallest device {min:?}");
            if later.1 == 0 {
                assert_eq!(later.0, 0, "{what}: later passes make driver calls");
            }
            assert!(half.0 <= half.1, "{what}: second half per 1000 {half:?}");
            out.push(Against {
                what,
                acted: acted(&p),
                half,
            });
        }
    }
    out
}

#[test]
fn every_trace_is_safe_with_layers_and_keeps_the_memory_targets() {
    for r in every_trace_keeps_the_targets(
        || Stitch::tight().with_layers(true),
        || Stitch::tight().with_layers(false),
        Stitch::layer_replays,
    ) {
        if r.what.contains("bert_serve") {
            assert!(r.acted > 0, "{}: no layer replayed", r.what);
            assert!(r.half.0 < r.half.1 * 0.8, "{}: {:?}", r.what, r.half);
        }
    }
}

/// bert_serve behind `cudaFree` on the checking device through `pool(false)` and `pool(true)`
/// (a rule off and on), both with the `broken` faults: clean with the rule off, an overlap (a
/// block handed out over a live one) with it on. Returns what the rule did (`acted`) there.
fn bert_caught_only_with_the_rule(
    pool: fn(bool) -> Stitch,
    broken: Faults,
    acted: fn(&Stitch) -> u64,
) -> u64 {
    let stream = Frees::CudaFree.apply(&bert());
    let run = |on: bool| {
        let mut dev = AccountingDevice::new(80 << 30);
        dev.set_checking(true);
        let mut p = pool(on);
        p.set_faults(broken);
        let r = replay::run_with(&stream, &mut p, &mut dev);
        (r.violations, acted(&p))
    };
    let (without, _) = run(false);
    assert!(without.is_empty(), "{:?}", &without[..1]);
    let (with, acted) = run(true);
    assert!(
        with.iter()
            .any(|v| v.contains("overlap") || v.contains("handed out twice")),
        "{:?}",
        with.first()
    );
    acted
}

#[test]
fn checker_catches_a_layer_place_over_a_live_block_on_bert() {
    let broken = Faults {
        replay_over_live: true,
        ..Faults::default()
    };
    let replays = bert_caught_only_with_the_rule(
        |on| Stitch::tight().with_layers(on),
        broken,
        Stitch::layer_replays,
    );
    assert!(replays > 0);
}

/// The holds (`Stitch::with_layer_holds`): every trace safe and within its targets as with
/// the layer replay alone (the smallest device no larger, no calls in later passes where it
/// makes none, no more in the second half); bert_serve's second half makes fewer calls under
/// both free semantics (layer 4 of its 21.47 MiB request replays layer 2 instead of
/// stitching).
#[test]
fn every_trace_is_safe_with_layer_holds_and_keeps_the_memory_targets() {
    for r in every_trace_keeps_the_targets(
        || Stitch::tight().with_layer_holds(true),
        Stitch::tight,
        Stitch::layer_holds,
    ) {
        if r.what.contains("bert_serve") {
            assert!(r.acted > 0, "{}: nothing placed outside holds", r.what);
            assert!(r.half.0 < r.half.1, "{}: {:?}", r.what, r.half);
        }
    }
}

/// `Faults::hold_over_live` (a hold takes a remembered place where a live block lies and
/// gives its bytes back as free): with the holds on bert_serve's blocks overlap on the
/// checking device; with them off the switch changes nothing.
#[test]
fn checker_catches_a_hold_over_a_live_block_on_bert() {
    let broken = Faults {
        hold_over_live: true,
        ..Faults::default()
    };
    bert_caught_only_with_the_rule(
        |on| Stitch::tight().with_layer_holds(on),
        broken,
        Stitch::layer_holds,
    );
}

/// bert_serve stream-ordered, one pass on the checking device behind one thread's cache
/// following `rules`: (driver calls, layer replays, hits).
fn bert_behind(rules: Rules) -> (u64, u64, u64) {
    let stream = Frees::StreamOrdered.apply(&bert());
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    let mut c = ThreadCache::new(rules);
    thread_cache::run_observed(&stream, &mut p, &mut dev, &mut c, |_, _| {}).unwrap();
    c.give_back(&mut p, &mut dev).unwrap();
    assert!(
        dev.violations().is_empty(),
        "{:?}",
        dev.violations().first()
    );
    (dev.calls().driver_calls(), p.layer_replays(), c.hits())
}

/// With the layer replay acting, a thread's cache keeps only frees under a page: every large
/// allocation reaches the pool, so behind the live caches bert_serve stream-ordered makes the
/// calls it makes with every free reaching the pool (489 a pass), while caches keeping every
/// size serve the large blocks of layers the rule never sees (616, the pool without layers
/// making 618). The small blocks are still served by the caches.
#[test]
fn thread_caches_leave_large_frees_to_the_layer_replay() {
    let live = bert_behind(Rules::LIVE);
    let none = bert_behind(Rules::NONE);
    let large = bert_behind(Rules {
        keep_large: true,
        ..Rules::LIVE
    });
    eprintln!(
        "bert_serve stream-ordered (calls, layer replays, hits): live caches {live:?}, no caches {none:?}, caches keeping every size {large:?}"
    );
    assert!(live.2 > 0, "the caches served nothing");
    assert_eq!(live.0, none.0, "live caches against no caches");
    assert!(
        live.0 < large.0,
        "caches keeping every size: {} calls, under a page: {}",
        large.0,
        live.0
    );
}

/// A loop of one large size (a run longer than any period the layer replay looks for) takes
/// the fast path again: the pool declines it only for the first allocations of the run. When
/// another size breaks the run, the loop's size is kept off the fast path again, so a layered
/// sequence of the two sizes after the loop is remembered whole and replayed. On the checking
/// device: no overlap, no early reuse.
#[test]
fn a_loop_of_one_large_size_takes_the_fast_path_and_layers_after_it_replay() {
    use vramshim_pool::{FreeMode, MIB, Request};
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    let free = FreeMode::Async { stream: 0 };
    let alloc = |p: &mut Stitch, dev: &mut AccountingDevice, size: u64| -> (u64, bool) {
        let (a, fast) = match p.alloc_cached(size, 0) {
            Some(a) => (a, true),
            None => (
                p.alloc_missed(dev, Request { size, stream: 0 })
                    .unwrap()
                    .addr,
                false,
            ),
        };
        dev.check_alloc(a, size, 0);
        (a, fast)
    };
    // a block live throughout: no round ends
    let _anchor = alloc(&mut p, &mut dev, 4096);
    // four at a time: four freed blocks of the loop's size stay cached after it, which the
    // fast path would keep handing to the layers below if the size were not kept off it again
    let mut declined = 0;
    for _ in 0..125 {
        let mut four = Vec::new();
        for _ in 0..4 {
            let (a, fast) = alloc(&mut p, &mut dev, 8 * MIB);
            declined += u32::from(!fast);
            four.push(a);
        }
        for a in four {
            dev.check_free(a, free);
            p.free(&mut dev, a, free).unwrap();
        }
    }
    // layers of two sizes, the second block of each living into the next layer
    let mut prev: Option<u64> = None;
    for _ in 0..12 {
        let (a, _) = alloc(&mut p, &mut dev, 6 * MIB);
        let (b, _) = alloc(&mut p, &mut dev, 8 * MIB);
        for x in prev.into_iter().chain([a]) {
            dev.check_free(x, free);
            p.free(&mut dev, x, free).unwrap();
        }
        prev = Some(b);
    }
    eprintln!(
        "the loop's 500 allocations: {declined} declined by the fast path; then {} layer replays",
        p.layer_replays()
    );
    assert!(
        dev.violations().is_empty(),
        "{:?}",
        dev.violations().first()
    );
    assert!(declined < 100, "{declined} of 500 declined");
    assert!(
        p.layer_replays() > 0,
        "the layers after the loop were not replayed"
    );
}

/// The loop and the layers of the test above, stream-ordered on one stream behind one thread's
/// cache following `rules`, on the checking device: (hits during the loop, the pool's
/// allocations during the loop, layer replays after it, driver calls, peak reserved bytes).
fn loop_then_layers_behind(rules: Rules) -> (u64, u64, u64, u64, u64) {
    use vramshim_pool::{FreeMode, MIB, Request};
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    let mut c = ThreadCache::new(rules);
    let free = FreeMode::Async { stream: 5 };
    let alloc = |p: &mut Stitch, dev: &mut AccountingDevice, c: &mut ThreadCache, size: u64| {
        let (a, _) = c.alloc(p, dev, Request { size, stream: 5 }).unwrap();
        dev.check_alloc(a.addr, size, 5);
        (a.addr, a.size)
    };
    let put =
        |p: &mut Stitch, dev: &mut AccountingDevice, c: &mut ThreadCache, b: (u64, u64, u64)| {
            dev.check_free(b.0, free);
            c.free(p, dev, b.0, b.1, b.2, free).unwrap();
        };
    let _anchor = alloc(&mut p, &mut dev, &mut c, 4096);
    let allocs0 = p.stats().allocs;
    for _ in 0..125 {
        let four: Vec<(u64, u64, u64)> = (0..4)
            .map(|_| {
                let (a, g) = alloc(&mut p, &mut dev, &mut c, 8 * MIB);
                (a, 8 * MIB, g)
            })
            .collect();
        for b in four {
            put(&mut p, &mut dev, &mut c, b);
        }
    }
    let (loop_hits, loop_allocs) = (c.hits(), p.stats().allocs - allocs0);
    let mut prev: Option<(u64, u64, u64)> = None;
    for _ in 0..12 {
        let (a, ga) = alloc(&mut p, &mut dev, &mut c, 6 * MIB);
        let (b, gb) = alloc(&mut p, &mut dev, &mut c, 8 * MIB);
        for x in prev.into_iter().chain([(a, 6 * MIB, ga)]) {
            put(&mut p, &mut dev, &mut c, x);
        }
        prev = Some((b, 8 * MIB, gb));
    }
    c.give_back(&mut p, &mut dev).unwrap();
    assert!(
        dev.violations().is_empty(),
        "{:?}",
        dev.violations().first()
    );
    (
        loop_hits,
        loop_allocs,
        p.layer_replays(),
        dev.calls().driver_calls(),
        p.stats().peak_reserved,
    )
}

/// Behind a thread's cache, a loop of one large size stream-ordered (a run longer than any
/// period) is served by the cache once the run is long enough (`Policy::aside_run`): most of
/// the loop's 500 allocations never reach the pool, where caches keeping no large free
/// (`Rules::keep_run` off, as before the rule) leave every one to it. The layers after the loop
/// are replayed exactly as often, with the same driver calls and the same peak: their first
/// allocation, of another size, is a miss that gives the cache back and breaks the run, so
/// the rule sees the layers whole. On the checking device: no overlap, no early reuse.
#[test]
fn a_loop_of_one_large_size_is_served_by_the_thread_cache_and_layers_after_it_replay() {
    let live = loop_then_layers_behind(Rules::LIVE);
    let before = loop_then_layers_behind(Rules {
        keep_run: false,
        ..Rules::LIVE
    });
    eprintln!(
        "(loop hits, loop pool allocations, layer replays, driver calls, peak reserved): keeping the run's frees {live:?}, keeping none {before:?}"
    );
    assert_eq!((before.0, before.1), (0, 500), "keeping no large free");
    assert!(
        live.0 >= 400,
        "the cache served {} of the loop's 500",
        live.0
    );
    assert_eq!(live.0 + live.1, 500);
    assert!(live.2 > 0, "the layers after the loop were not replayed");
    assert_eq!(
        (live.2, live.3, live.4),
        (before.2, before.3, before.4),
        "layer replays, driver calls, peak reserved: keeping the run's frees against keeping none"
    );
}

/// Serve bert_serve's events behind `cudaFree` up to (not including) allocation `stop` on a
/// checking 80 GiB device, asking `Stitch::layer_places` before every allocation of at least
/// a page when `ask`: the pool, the device, and the size of allocation `stop`.
fn bert_until(stop: usize, ask: bool) -> (Stitch, AccountingDevice, u64) {
    use std::collections::HashMap;
    use vramshim_pool::Request;
    let ev = bert();
    let mut p = Stitch::tight();
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut ids = HashMap::new();
    let mut n = 0;
    for e in Frees::CudaFree.apply(&ev) {
        match e {
            Event::Alloc { id, size, stream } => {
                n += 1;
                if n == stop {
                    return (p, dev, size);
                }
                if ask && size >= 2 << 20 {
                    p.layer_places(size);
                }
                let a = p.alloc(&mut dev, Request { size, stream }).unwrap();
                dev.check_alloc(a.addr, size, stream);
                ids.insert(id, a.addr);
            }
            Event::Free { id, mode } => {
                if let Some(a) = ids.remove(&id) {
                    dev.check_free(a, mode);
                    p.free(&mut dev, a, mode).unwrap();
                }
            }
            Event::ProcessSync => replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => replay::retire_stream(&mut p, &mut dev, stream),
        }
    }
    panic!("bert_serve has fewer than {stop} allocations");
}

/// What keeps the layer replay from the trace's peak request's places in its third layer
/// (bert_serve behind `cudaFree`, allocation 2040, 44.53 MiB: stitched anew, 24 calls):
/// `Stitch::layer_places` names both places (two periods and one period back) and a live
/// block in each, and asking it at every large allocation changes no driver call.
#[test]
fn layer_places_name_the_live_blocks_that_keep_the_peak_request_from_its_places() {
    let (p, dev, size) = bert_until(2040, false);
    assert!(size > 44 << 20, "allocation 2040 is the peak request's");
    let places = p.layer_places(size);
    eprintln!("{places:?}");
    assert_eq!(places.len(), 2);
    assert_eq!((places[0].back, places[1].back), (24, 12));
    for lp in &places {
        assert!(!lp.gone);
        assert!(
            lp.blockers.iter().any(|b| b.2 == "live"),
            "a live block in {lp:?}"
        );
    }
    let (_, asked, _) = bert_until(2040, true);
    assert_eq!(asked.calls(), dev.calls());
    assert!(dev.violations().is_empty());
}
