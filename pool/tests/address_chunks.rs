//! Stitched mappings take their addresses from chunks of address space the pool reserves
//! once (`pool/src/stitch/vas.rs`), not from a reservation each: on the checking device,
//! mappings stitched one after another cost one reservation, an address just past each
//! mapping's end is never mapped (one unused page follows every range), a dropped mapping's
//! range is taken again without a reservation, `trim` gives every chunk back, and every
//! shared trace and GPU recording under both free semantics completes with no violation,
//! nothing leaked, a peak within 1.10 x its peak live bytes and at most 3 reservations (the
//! arena's, again as it doubles, and a chunk). Broken on purpose (`Faults::va_no_guard`: no unused page
//! between ranges), the address past a mapping's end is the next mapping's memory.

mod common;

use common::traces;
use vramshim_pool::replay::{self, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, Request};

/// A pool with no budget (no arena: every block of whole pages is a stitched mapping of its
/// own) serving `n` blocks of 3 pages, all live. Returns the device, the pool and the blocks.
fn stitched_blocks(n: usize, faults: Faults) -> (AccountingDevice, Stitch, Vec<u64>) {
    let mut dev = AccountingDevice::new(1 << 30);
    dev.set_checking(true);
    let mut p = Stitch::new();
    p.set_faults(faults);
    let mut out = Vec::new();
    for _ in 0..n {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 6 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 6 * MIB, 0);
        out.push(a.addr);
    }
    (dev, p, out)
}

#[test]
fn stitched_mappings_share_one_reservation_and_end_before_an_unmapped_page() {
    let (dev, p, blocks) = stitched_blocks(8, Faults::default());
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert_eq!(p.mappings(), 8, "each block is a mapping of its own");
    assert_eq!(dev.calls().reserve, 1, "eight mappings, one chunk reserved");
    for &a in &blocks {
        assert!(dev.is_mapped(a + 6 * MIB - 1));
        assert!(
            !dev.is_mapped(a + 6 * MIB),
            "the page after the mapping at {a:#x} is unmapped"
        );
    }
}

#[test]
fn without_the_unused_page_an_access_past_a_mapping_finds_memory() {
    let (dev, _p, blocks) = stitched_blocks(
        8,
        Faults {
            va_no_guard: true,
            ..Faults::default()
        },
    );
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert!(
        blocks.iter().any(|&a| dev.is_mapped(a + 6 * MIB)),
        "with the fault, mappings are adjacent: the address past one is the next one's"
    );
}

#[test]
fn dropped_ranges_are_taken_again_and_trim_gives_the_chunks_back() {
    let (mut dev, mut p, blocks) = stitched_blocks(2, Faults::default());
    let (keep, mut b) = (blocks[0], blocks[1]);
    let free = |p: &mut Stitch, dev: &mut AccountingDevice, a: u64| {
        dev.check_free(a, FreeMode::Async { stream: 0 });
        p.free(dev, a, FreeMode::Async { stream: 0 }).unwrap();
    };
    for _ in 0..4 {
        // the second block's mapping is dropped (its pages given back); the first keeps
        // the chunk in use, so the chunk stays
        free(&mut p, &mut dev, b);
        p.trim(&mut dev).unwrap();
        assert_eq!(p.mappings(), 1);
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 6 * MIB,
                    stream: 0,
                },
            )
            .unwrap()
            .addr;
        dev.check_alloc(a, 6 * MIB, 0);
        assert_eq!(a, b, "a dropped mapping's range is taken again");
        b = a;
    }
    assert_eq!(dev.calls().reserve, 1, "no reservation after the first");
    assert_eq!(dev.calls().unreserve, 0);
    // with nothing left, trim gives the chunk back
    free(&mut p, &mut dev, keep);
    free(&mut p, &mut dev, b);
    p.trim(&mut dev).unwrap();
    assert_eq!(p.mappings(), 0);
    assert_eq!(dev.reservations(), 0, "trim gives the unused chunk back");
    assert_eq!(dev.calls().unreserve, 1);
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert!(dev.leaks().is_empty(), "{:?}", dev.leaks());
}

#[test]
fn every_trace_reserves_only_the_arena_and_chunks() {
    for (name, events) in traces() {
        let live = replay::peak_live(&events);
        for frees in Frees::BOTH {
            let stream = frees.apply(&events);
            let mut dev = AccountingDevice::new(80 << 30);
            dev.set_checking(true);
            let mut p = Stitch::tight();
            let r = replay::run_with(&stream, &mut p, &mut dev);
            assert!(
                r.completed,
                "{name} {}: {:?}",
                frees.name(),
                r.first_failure
            );
            assert!(
                dev.violations().is_empty(),
                "{name} {}: {:?}",
                frees.name(),
                dev.violations()
            );
            // the arena (one reservation, again each time it doubles) and one chunk of
            // 2 GiB: these traces' stitched mappings fit one
            let c = dev.calls();
            assert!(
                c.reserve <= 3,
                "{name} {}: {} reservations",
                frees.name(),
                c.reserve
            );
            assert!(
                (r.peak_device_used as f64) <= 1.10 * live as f64,
                "{name} {}: {} over {live}",
                frees.name(),
                r.peak_device_used
            );
            p.trim(&mut dev).unwrap();
            assert!(dev.leaks().is_empty(), "{name}: {:?}", dev.leaks());
        }
    }
}
