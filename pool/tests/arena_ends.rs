//! The arena's two ends (`Stitch::set_ends_class`) told the trace's own lifetimes: on the
//! checking device every shared trace and GPU recording, under both free semantics,
//! completes with no overlap, no early reuse and nothing leaked. Broken on purpose
//! (`Faults::ends_over_live`: a short-lived block placed one `ALIGN` over the block above its
//! window), the checking device reports the overlap on bert_serve; without the classes the
//! switch changes nothing.

mod common;

use common::ends::{classes, pass};
use common::traces;
use vramshim_pool::replay::Frees;
use vramshim_pool::stitch::{Faults, Stitch};

/// The threshold (ticks) between short- and long-lived blocks these tests tell the pool.
const T: usize = 12;

#[test]
fn every_trace_is_safe_with_two_ends() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let stream = frees.apply(&ev);
            let c = classes(&stream, T);
            let p = pass(
                &stream,
                Some(&c),
                Stitch::tight(),
                Faults::default(),
                80 << 30,
            );
            let what = format!("{name} {}", frees.name());
            eprintln!(
                "{what}: {} calls, {} in the second half",
                p.calls, p.second_half
            );
            assert!(p.violations.is_empty(), "{what}: {:?}", &p.violations[..1]);
            assert!(p.leaks.is_empty(), "{what}: {:?}", &p.leaks[..1]);
        }
    }
}

#[test]
fn checker_catches_a_two_ends_block_over_a_live_one_on_bert() {
    let (_, ev) = traces()
        .into_iter()
        .find(|(n, _)| n.contains("bert_serve"))
        .expect("bert_serve");
    let stream = Frees::CudaFree.apply(&ev);
    let broken = Faults {
        ends_over_live: true,
        ..Faults::default()
    };
    let c = classes(&stream, T);
    let without = pass(&stream, None, Stitch::tight(), broken, 80 << 30);
    assert!(
        without.violations.is_empty(),
        "{:?}",
        &without.violations[..1]
    );
    let with = pass(&stream, Some(&c), Stitch::tight(), broken, 80 << 30);
    assert!(
        with.violations
            .iter()
            .any(|v| v.contains("overlap") || v.contains("handed out twice")),
        "{:?}",
        &with.violations[..with.violations.len().min(1)]
    );
}
