//! Kept ranges (`Stitch::with_kept`): the places of large blocks stay units that smaller
//! requests are carved from, best fit. On the checking device: a smaller block is carved into
//! the free bytes of a range that a live block partly holds, never over that block; every
//! shared trace and GPU recording, under both free semantics, completes with no overlap, no
//! early reuse and nothing leaked, within 1.10 x peak live on an 80 GiB device and with no
//! driver call after the first of three passes where the pool without kept ranges makes none.
//! Broken on purpose (`Faults::kept_over_live`: a carve ignores the live blocks in a range),
//! the checking device reports the overlap.

mod common;

use common::{later_pass_calls, run_clean_within_1_10, traces};
use vramshim_pool::replay::Frees;
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, Request};

/// Two 8 MiB blocks fill the arena; the first is freed (a kept range with its cached block);
/// a 3 MiB block is carved at the range's start (no free window elsewhere); a 6 MiB block
/// then finds no 6 MiB window in the range's 5 MiB left and must go elsewhere. Returns the
/// checking device, the pool, and whether the 3 MiB block went to the range's start.
fn carve_next_to_a_live_block(faults: Faults) -> (AccountingDevice, Stitch, bool) {
    let mut dev = AccountingDevice::new(1 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight().with_kept(true);
    p.set_faults(faults);
    let s = 0;
    let alloc = |p: &mut Stitch, dev: &mut AccountingDevice, size: u64| {
        let a = p.alloc(dev, Request { size, stream: s }).unwrap();
        dev.check_alloc(a.addr, size, s);
        a.addr
    };
    let a = alloc(&mut p, &mut dev, 8 * MIB);
    let _d = alloc(&mut p, &mut dev, 8 * MIB);
    dev.check_free(a, FreeMode::Async { stream: s });
    p.free(&mut dev, a, FreeMode::Async { stream: s }).unwrap();
    let b = alloc(&mut p, &mut dev, 3 * MIB);
    let _c = alloc(&mut p, &mut dev, 6 * MIB);
    (dev, p, b == a)
}

#[test]
fn a_carve_from_a_kept_range_leaves_its_live_blocks_alone() {
    let (dev, p, at_start) = carve_next_to_a_live_block(Faults::default());
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert!(
        at_start,
        "the 3 MiB block is carved at the kept range's start"
    );
    // the 6 MiB block did not fit next to the live 3 MiB one: placed elsewhere
    assert_eq!(p.kept_carves(), 1);
}

#[test]
fn checker_catches_a_carve_over_a_live_block() {
    let (dev, p, _) = carve_next_to_a_live_block(Faults {
        kept_over_live: true,
        ..Faults::default()
    });
    // the fault carved over a live block (the 3 MiB block over the live 8 MiB one, whose
    // range is as free as the other to it, or the 6 MiB block over the 3 MiB one): the
    // checking device sees the overlap at the allocation
    assert!(p.kept_carves() >= 1);
    assert!(
        dev.violations()
            .iter()
            .any(|v| v.contains("overlap") || v.contains("handed out twice")),
        "{:?}",
        dev.violations()
    );
}

#[test]
fn every_trace_is_safe_with_kept_ranges_and_keeps_the_memory_targets() {
    let mut carved = 0;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let what = format!("{name} {}", frees.name());
            let stream = frees.apply(&ev);
            let mut p = Stitch::tight().with_kept(true);
            let held = run_clean_within_1_10(&stream, &mut p, &what);
            let make_kept = || -> Box<dyn Policy> { Box::new(Stitch::tight().with_kept(true)) };
            let make = || -> Box<dyn Policy> { Box::new(Stitch::tight()) };
            let later = |m: &dyn Fn() -> Box<dyn Policy>| later_pass_calls(&ev, frees, m);
            let (k, base) = (later(&make_kept), later(&make));
            eprintln!(
                "{what}: {} carves, {held:.3} x peak live, later passes {k} (without {base})",
                p.kept_carves()
            );
            if base == 0 {
                assert_eq!(k, 0, "{what}: later passes make driver calls");
            }
            carved += p.kept_carves();
        }
    }
    assert!(carved > 0, "no trace carved a block out of a kept range");
}
