//! Handles sized per request (`Stitch::with_shapes`): the pages a large request grows the pool
//! by come as one handle (`Shapes::Request`) or as power-of-two handles (`Shapes::Pow2`), and
//! a new mapping may start and end in the free ends of such handles, mapped whole. On every
//! shared trace and GPU recording, under both free semantics, on the checking device: no
//! overlap, no early reuse, no handle mapped in part, nothing leaked; bert_serve's driver
//! calls in all and in its second half fall, within 1.10 x peak live at 80 GiB. Broken on
//! purpose (`Faults::run_end_over_live`: a block that starts in a handle's free end starts one
//! `ALIGN` lower), the checking device reports the overlap on bert_serve; with one handle per
//! page the switch changes nothing.

mod common;

use common::ends::pass;
use common::traces;
use vramshim_pool::replay::Frees;
use vramshim_pool::stitch::{Faults, Shapes, Stitch};

const SHAPES: [Shapes; 2] = [Shapes::Request, Shapes::Pow2];

#[test]
fn every_trace_is_safe_with_handles_sized_per_request() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            let pages = pass(&stream, None, Stitch::tight(), Faults::default(), 80 << 30);
            for shapes in SHAPES {
                let what = format!("{name} {} {shapes:?}", frees.name());
                let p = pass(
                    &stream,
                    None,
                    Stitch::tight().with_shapes(shapes),
                    Faults::default(),
                    80 << 30,
                );
                eprintln!(
                    "{what}: {} calls ({} one handle a page), {} in the second half ({}), peak \
                     reserved {} ({})",
                    p.calls,
                    pages.calls,
                    p.second_half,
                    pages.second_half,
                    p.peak_reserved,
                    pages.peak_reserved
                );
                assert!(p.violations.is_empty(), "{what}: {:?}", &p.violations[..1]);
                assert!(p.leaks.is_empty(), "{what}: {:?}", &p.leaks[..1]);
                assert!(p.calls <= pages.calls, "{what}: more calls");
            }
        }
    }
}

#[test]
fn bert_serve_calls_fall_within_the_memory_target() {
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    let live = vramshim_pool::replay::peak_live(&ev);
    for frees in Frees::BOTH {
        let stream = frees.apply(&ev);
        let pages = pass(&stream, None, Stitch::tight(), Faults::default(), 80 << 30);
        for shapes in SHAPES {
            let p = pass(
                &stream,
                None,
                Stitch::tight().with_shapes(shapes),
                Faults::default(),
                80 << 30,
            );
            let what = format!("{} {shapes:?}", frees.name());
            assert!(
                p.second_half * 2 < pages.second_half,
                "{what}: second half {} against {}",
                p.second_half,
                pages.second_half
            );
            assert!(
                p.peak_reserved as f64 <= 1.10 * live as f64,
                "{what}: {} reserved for {live} live",
                p.peak_reserved
            );
        }
    }
}

#[test]
fn checker_catches_a_block_below_a_handles_free_end_on_bert() {
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    let stream = Frees::CudaFree.apply(&ev);
    let broken = Faults {
        run_end_over_live: true,
        ..Faults::default()
    };
    let without = pass(&stream, None, Stitch::tight(), broken, 80 << 30);
    assert!(
        without.violations.is_empty(),
        "{:?}",
        &without.violations[..1]
    );
    let with = pass(
        &stream,
        None,
        Stitch::tight().with_shapes(Shapes::Request),
        broken,
        80 << 30,
    );
    assert!(
        with.violations
            .iter()
            .any(|v| v.contains("overlap") || v.contains("handed out twice")),
        "{:?}",
        &with.violations[..with.violations.len().min(1)]
    );
}

/// The shape guard (`Stitch::with_shape_guard`) on handles sized per request: on every
/// shared trace and GPU recording, both free semantics, clean on the checking device with
/// nothing leaked and never more calls than one handle a page; bert_serve's second half makes
/// fewer driver calls than with handles per request alone, within 1.10 x peak live. Broken on
/// purpose (`Faults::guard_over_live`), the checking device reports the overlap on
/// bert_serve; without the guard the switch changes nothing.
#[test]
fn the_shape_guard_is_safe_and_cuts_bert_serve_calls() {
    for (name, ev) in traces() {
        let live = vramshim_pool::replay::peak_live(&ev);
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            let what = format!("{name} {}", frees.name());
            let pages = pass(&stream, None, Stitch::tight(), Faults::default(), 80 << 30);
            let request = Stitch::tight().with_shapes(Shapes::Request);
            let alone = pass(&stream, None, request, Faults::default(), 80 << 30);
            let guarded = Stitch::tight()
                .with_shapes(Shapes::Request)
                .with_shape_guard(true);
            let p = pass(&stream, None, guarded, Faults::default(), 80 << 30);
            eprintln!(
                "{what}: second half {} calls with the guard, {} without; peak reserved {} ({})",
                p.second_half, alone.second_half, p.peak_reserved, alone.peak_reserved
            );
            assert!(p.violations.is_empty(), "{what}: {:?}", &p.violations[..1]);
            assert!(p.leaks.is_empty(), "{what}: {:?}", &p.leaks[..1]);
            assert!(p.calls <= pages.calls, "{what}: more calls");
            if name.contains("bert_serve") {
                assert!(
                    p.second_half < alone.second_half,
                    "{what}: second half {} against {}",
                    p.second_half,
                    alone.second_half
                );
                assert!(
                    p.peak_reserved as f64 <= 1.10 * live as f64,
                    "{what}: {} reserved for {live} live",
                    p.peak_reserved
                );
            }
        }
    }
}

#[test]
fn checker_catches_a_guarded_window_over_a_live_block_on_bert() {
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    let broken = Faults {
        guard_over_live: true,
        ..Faults::default()
    };
    for frees in Frees::BOTH {
        let stream = frees.apply(&ev);
        let request = Stitch::tight().with_shapes(Shapes::Request);
        let without = pass(&stream, None, request, broken, 80 << 30);
        assert!(
            without.violations.is_empty(),
            "{:?}",
            &without.violations[..1]
        );
        let guarded = Stitch::tight()
            .with_shapes(Shapes::Request)
            .with_shape_guard(true);
        let with = pass(&stream, None, guarded, broken, 80 << 30);
        assert!(
            with.violations
                .iter()
                .any(|v| v.contains("overlap") || v.contains("handed out twice")),
            "{}: {:?}",
            frees.name(),
            &with.violations[..with.violations.len().min(1)]
        );
    }
}

/// The diagnostics `pool_handles` prints (`Stitch::handle_views`) add up to what the pool
/// holds: every page in exactly one handle, every byte of it live, pending, cached or free,
/// and at least the live bytes the pool counts lie in live blocks.
#[test]
fn the_handle_views_add_up_to_the_pool() {
    use vramshim_pool::replay::Event;
    use vramshim_pool::{AccountingDevice, Device, Policy, Request};
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    for frees in Frees::BOTH {
        let mut dev = AccountingDevice::new(80 << 30);
        let g = dev.granularity();
        let mut p = Stitch::tight().with_shapes(Shapes::Request);
        let mut ids = std::collections::HashMap::new();
        let mut looked = 0;
        for (i, e) in frees.apply(&ev).into_iter().enumerate() {
            match e {
                Event::Alloc { id, size, stream } => {
                    let a = p.alloc(&mut dev, Request { size, stream }).expect("alloc");
                    ids.insert(id, a.addr);
                }
                Event::Free { id, mode } => {
                    if let Some(a) = ids.remove(&id) {
                        p.free(&mut dev, a, mode).expect("free");
                    }
                }
                Event::ProcessSync => vramshim_pool::replay::process_sync(&mut p, &mut dev),
                Event::StreamRetired { stream } => {
                    vramshim_pool::replay::retire_stream(&mut p, &mut dev, stream)
                }
            }
            if i % 97 != 0 {
                continue;
            }
            looked += 1;
            let hs = p.handle_views();
            let pages: u64 = hs.iter().map(|h| h.pages as u64).sum();
            assert_eq!(pages, p.pages(), "{}: event {i}: pages", frees.name());
            for h in &hs {
                assert_eq!(
                    h.live + h.pending + h.cached + h.free,
                    h.pages as u64 * g,
                    "{}: event {i}: handle at page {}: {h:?}",
                    frees.name(),
                    h.page
                );
                assert!(h.free_pages <= h.pages);
            }
            let live: u64 = hs.iter().map(|h| h.live).sum();
            assert!(
                live >= p.stats().live,
                "{}: event {i}: live {live} < {}",
                frees.name(),
                p.stats().live
            );
        }
        assert!(looked > 10);
    }
}
