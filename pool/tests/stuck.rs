//! A tight pool above its budget whose idle pages cannot be given back (they sit in the
//! arena's mapping, fenced by this epoch's stream-ordered frees) keeps caching: dissolving its
//! cache would free no byte of the device. The rotation `pool_bench` times: eight sizes, each
//! freed stream-ordered before the next is allocated, after a warm-up that had all eight live
//! at once, so that the budget, two windows on, follows the lower peak and the pool is above it
//! for good (no synchronization is ever made).

mod common;

use common::rotation::{last_hits, warm_up};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, GIB, Policy};

/// (cache hits over the last 10,000 pairs, blocks cached at the end, device bytes, budget)
/// after `pairs` pairs of the rotation following the warm-up; every block is checked by the
/// checking device.
fn rotate(faults: Faults, pairs: usize) -> (u64, usize, u64, u64) {
    let mut dev = AccountingDevice::new(64 * GIB);
    let mut p = Stitch::tight();
    p.set_faults(faults);
    warm_up(&mut p, &mut dev);
    let hits = last_hits(&mut p, &mut dev, pairs);
    let s = p.stats();
    assert_eq!(dev.calls().syncs(), 0, "the rotation never synchronizes");
    assert_eq!(s.reserved, dev.used(), "reserved is the device's count");
    (hits, p.cached_blocks(), dev.used(), s.budget)
}

/// Past the budget's two windows (131,072 allocations) the pool is above its budget with
/// nothing it can give back: it still serves the rotation from its cache (the last 10,000
/// pairs), and holds no page more than before (the warm-up's pages, never grown).
#[test]
fn stuck_above_budget_keeps_caching() {
    let pairs = 150_000;
    let (hits, cached, used, budget) = rotate(Faults::default(), pairs);
    assert!(
        used > budget,
        "the pool is above its budget ({used} B for {budget} B)"
    );
    assert!(
        cached > 0,
        "nothing cached above a budget it cannot get under"
    );
    // the rotation is one round, served from the cache (see rotation.rs)
    assert!(
        hits >= 9_000,
        "{hits} cache hits in the last 10,000 pairs: every pair placed and dissolved again"
    );
    // the old rule (dissolve at every free above the budget) caches nothing and hits nothing
    let (hits, cached, used_old, _) = rotate(
        Faults {
            dissolve_when_stuck: true,
            ..Faults::default()
        },
        pairs,
    );
    assert_eq!(
        (hits, cached),
        (0, 0),
        "the fault switch keeps the old rule"
    );
    assert_eq!(used, used_old, "caching held no page more than dissolving");
}
