//! A mapping a block was freed through stream-ordered stays mapped while the stream may still
//! use its addresses. A serving process that never synchronizes the device (it waits for its
//! own stream, or for nothing) must not keep every such mapping for good: the pool records an
//! event on the stream after the free and, once the device says the event is complete, the
//! mapping may be dropped or re-formed with no synchronization.

use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, Policy};
use vramshim_testkit::busy_maps::{self, STREAM};

/// Allocations between two waits for the stream.
const WAIT: u64 = 64;

/// The busy-mappings workload (`vramshim_testkit::busy_maps`: blocks of 2-40 MiB on one
/// stream, the oldest of `window` live blocks freed on the stream before each allocation) run
/// for `steps` allocations on a device of `device` bytes, with no device synchronization; the
/// process waits for its stream every `wait_every` allocations (never when 0). Returns the
/// most mappings the pool held, its pages at the end, the device (checking on) and the blocks
/// still live.
fn serve(
    p: &mut Stitch,
    device: u64,
    window: usize,
    steps: usize,
    wait_every: usize,
) -> (u64, u64, AccountingDevice, Vec<u64>) {
    let mut dev = AccountingDevice::new(device);
    dev.set_checking(true);
    let (most, live) = busy_maps::serve(p, &mut dev, steps as u64, window, wait_every as u64);
    (most, p.pages(), dev, live)
}

/// The pile-up and its end, on the tight pool (the default) and on stitch with no budget: 20,000
/// allocations of changing shapes on one stream, the process waiting for its stream every 64
/// allocations and never synchronizing the device. With busy mappings ended only by a
/// synchronization (`Faults::busy_until_sync`) every mapping a block was freed through stays mapped: the
/// mappings pass the cleanup limit (2 per page + 64) and keep growing. With the events, the
/// pool sees the stream past those frees and keeps its mappings near the limit (the tight
/// pool one over, while its first event is in flight; with no budget, the mappings made over
/// two waits for the stream at most), safely
/// (checking device: nothing unmapped that the stream may still use) and with no
/// synchronization.
#[test]
fn mappings_freed_through_do_not_pile_up_without_a_synchronization() {
    for (tight, device, window) in [(true, 1u64 << 30, 8usize), (false, 1 << 30, 8)] {
        for old in [true, false] {
            let mut p = if tight {
                Stitch::tight()
            } else {
                Stitch::new()
            };
            p.set_faults(Faults {
                busy_until_sync: old,
                ..Faults::default()
            });
            let (most, pages, dev, _) = serve(&mut p, device, window, 20_000, WAIT as usize);
            let limit = 2 * pages + 64;
            eprintln!(
                "tight {tight}, busy until a sync {old}: most mappings {most}, at the end {}, pages {pages} (limit {limit}); events recorded {}, queried {}",
                p.mappings(),
                dev.calls().event_record,
                dev.calls().event_query
            );
            assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
            assert_eq!(p.stats().syncs, 0, "the pool synchronized");
            assert_eq!(dev.calls().syncs(), 0);
            if old {
                assert!(most > limit, "{most} mappings, limit {limit}");
            } else {
                // an event recorded at a look past the limit is seen complete after the next
                // wait for the stream, and covers the frees before it: the mappings made
                // meanwhile (at most one per allocation, over two waits) wait with it
                assert!(
                    most <= limit + 2 * WAIT + 1,
                    "{most} mappings, limit {limit}"
                );
                if tight {
                    assert!(most <= limit + 1, "{most} mappings, limit {limit}");
                }
            }
        }
    }
}

/// Without any wait for the stream, the checking device never sees it past the frees: the
/// pool keeps those mappings (it cannot know better), and taking their events for complete
/// without asking (`Faults::busy_done_unasked`) is caught as an unmap of addresses the stream
/// may still use.
#[test]
fn a_busy_mapping_is_dropped_only_when_the_device_says_its_events_are_complete() {
    for broken in [false, true] {
        let mut p = Stitch::tight();
        p.set_faults(Faults {
            busy_done_unasked: broken,
            ..Faults::default()
        });
        let (most, pages, dev, _) = serve(&mut p, 1 << 30, 8, 20_000, 0);
        let unsafe_unmaps = dev
            .violations()
            .iter()
            .filter(|v| v.contains("may still be in use by a stream"))
            .count();
        eprintln!(
            "broken {broken}: most mappings {most}, pages {pages}, unsafe unmaps {unsafe_unmaps}"
        );
        if broken {
            assert!(unsafe_unmaps > 0, "{:?}", dev.violations().first());
        } else {
            assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
            assert!(most > 2 * pages + 64, "{most} mappings, {pages} pages");
        }
    }
}

/// Everything freed and trimmed, the pool holds no event, nor anything else.
#[test]
fn trim_leaves_no_event_behind() {
    let mut p = Stitch::tight();
    let (_, _, mut dev, live) = serve(&mut p, 1 << 30, 8, 20_000, 64);
    assert!(dev.live_events() > 0, "no event held");
    for a in live {
        dev.check_free(a, FreeMode::Async { stream: STREAM });
        p.free(&mut dev, a, FreeMode::Async { stream: STREAM })
            .unwrap();
    }
    p.trim(&mut dev).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    assert_eq!(dev.leaks(), Vec::<String>::new());
}
