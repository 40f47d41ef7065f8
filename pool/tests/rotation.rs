//! A tight pool ends a round (dissolves its cache, forgets its layout) at an allocation that
//! finds nothing live, at most every 256 allocations and only when some allocation since the
//! last one took a place the layout did not have. The rotation `pool_bench` times (eight
//! sizes, each freed stream-ordered before the next is allocated: nothing live between two
//! pairs) is one repeated round: after the first round end, each size's first allocation
//! takes its place of the round before (a new block there: the round end dissolved the cached
//! one), and every other allocation hits the cache. Those replays are no drift: the round is
//! not ended again, and the rotation is served from the cache (no dissolving, no placement).

mod common;

use common::rotation::{last_hits, warm_up};
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, GIB};

/// Cache hits over the last 10,000 of `pairs` pairs of the rotation (after a warm-up with
/// every size live at once), every block checked by the checking device; no driver call
/// after the warm-up.
fn rotation_hits(pairs: usize) -> u64 {
    let mut dev = AccountingDevice::new(64 * GIB);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    warm_up(&mut p, &mut dev);
    let calls = dev.calls().driver_calls();
    let hits = last_hits(&mut p, &mut dev, pairs);
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    assert_eq!(
        dev.calls().driver_calls(),
        calls,
        "driver calls in the rotation"
    );
    hits
}

/// Before and after the budget's windows roll (131,072 allocations), every allocation of the
/// last 10,000 pairs hits the cache. Ended every 256 allocations, each round would miss once
/// per size: 9,688 hits.
#[test]
fn a_rotation_is_one_round_served_from_the_cache() {
    for pairs in [20_000, 150_000] {
        assert_eq!(rotation_hits(pairs), 10_000, "{pairs} pairs");
    }
}
