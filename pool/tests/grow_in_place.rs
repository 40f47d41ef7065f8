//! Mappings that grow in place (`Stitch::with_grow`): a request larger than an unused stitched
//! mapping maps only the pages missing at its end. On the checking device every shared trace
//! and GPU recording, under both free semantics, completes with no overlap, no early reuse, no
//! access outside a mapping and nothing leaked, within 1.10 x peak live on an 80 GiB device, on
//! a device no larger than the pool without it needs, with no driver call after the first of
//! three passes where the pool without it makes none, and no more calls in the second half of
//! one pass; bert_serve grows mappings in place and makes fewer calls there under both free
//! semantics.
//! Broken on purpose (`Faults::grow_over_live`: live and pending blocks in a mapping's pages
//! taken for cached ones), the checking device reports the new block's overlap on bert_serve,
//! which the same switch without the rule leaves clean.

mod common;

use common::{later_pass_calls, run_clean_within_1_10, traces};
use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, Policy};

fn growing() -> Box<dyn Policy> {
    Box::new(Stitch::tight().with_grow(true))
}

fn plain() -> Box<dyn Policy> {
    Box::new(Stitch::tight())
}

#[test]
fn every_trace_is_safe_growing_in_place_and_keeps_the_memory_targets() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let what = format!("{name} {}", frees.name());
            let stream = frees.apply(&ev);
            let mut p = Stitch::tight().with_grow(true);
            let held = run_clean_within_1_10(&stream, &mut p, &what);
            let later = |m: &dyn Fn() -> Box<dyn Policy>| later_pass_calls(&ev, frees, m);
            let (l, base) = (later(&growing), later(&plain));
            let (min_g, min_base) = (
                replay::min_capacity_with(&stream, &growing),
                replay::min_capacity_with(&stream, &plain),
            );
            let (half_g, half_base) = (
                replay::second_half_calls_per_1000(&ev, frees, &growing),
                replay::second_half_calls_per_1000(&ev, frees, &plain),
            );
            eprintln!(
                "{what}: {} grown in place, {held:.3} x peak live, smallest device {min_g} \
                 (without {min_base}), later passes {l} (without {base}), second half \
                 {half_g:.1} per 1000 (without {half_base:.1})",
                p.grows()
            );
            assert!(
                min_g <= min_base,
                "{what}: smallest device {min_g} > {min_base}"
            );
            if base == 0 {
                assert_eq!(l, 0, "{what}: later passes make driver calls");
            }
            assert!(
                half_g <= half_base,
                "{what}: second half {half_g:.1} per 1000, without growing {half_base:.1}"
            );
            if name.contains("bert_serve") {
                assert!(p.grows() > 0, "{what}: nothing grown in place");
                assert!(
                    half_g < half_base,
                    "{what}: second half {half_g:.1} per 1000, without growing {half_base:.1}"
                );
            }
        }
    }
}

#[test]
fn checker_catches_a_mapping_grown_over_a_live_block_on_bert() {
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    let broken = Faults {
        grow_over_live: true,
        ..Faults::default()
    };
    for frees in Frees::BOTH {
        let stream = frees.apply(&ev);
        let run = |grow: bool| {
            let mut dev = AccountingDevice::new(80 << 30);
            dev.set_checking(true);
            let mut p = Stitch::tight().with_grow(grow);
            p.set_faults(broken);
            let r = replay::run_with(&stream, &mut p, &mut dev);
            (r.violations, p.grows())
        };
        let (without, _) = run(false);
        assert!(without.is_empty(), "{:?}", &without[..1]);
        let (with, grows) = run(true);
        assert!(grows > 0);
        assert!(
            with.iter()
                .any(|v| v.contains("overlap") || v.contains("handed out twice")),
            "{} {:?}",
            frees.name(),
            with.first()
        );
    }
}
