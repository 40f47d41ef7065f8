//! A mapping a block was freed through stream-ordered stays mapped while the stream may still
//! use its addresses. A serving process that never synchronizes the device (it waits for its
//! own stream, or for nothing) must not keep every such mapping for good: the pool records an
//! event on the stream after the free and, once the device says the event is complete, the
//! mapping may be dropped or re-formed with no synchronization.

use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy};
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

/// A serving run whose live bytes shrink: 20,000 stream-ordered allocations of 2-40 MiB on
/// one stream, the oldest of 8 live blocks freed before each, then of 2 from the 10,000th on;
/// the process waits for its stream every `wait` allocations (never when 0) and never
/// synchronizes the device; a tight pool whose budget window is 2,048 allocations (so that it
/// follows the shrink within the run). Returns (pages at the end, most pages, budget at the
/// end, events recorded) and the device.
fn shrinking(faults: Faults, wait: u64) -> ((u64, u64, u64, u64), AccountingDevice) {
    let mut p = Stitch::new().with_budget(Some(vramshim_pool::stitch::Budget {
        window: 2048,
        ..Default::default()
    }));
    p.set_faults(faults);
    let mut dev = AccountingDevice::new(1 << 30);
    dev.set_checking(true);
    let most =
        busy_maps::serve_shrinking(&mut p, &mut dev, 20_000, (8, 10_000, 2), wait).most_pages;
    let r = (p.pages(), most, p.stats().budget, dev.calls().event_record);
    assert_eq!(p.stats().syncs, 0, "the pool synchronized");
    (r, dev)
}

/// The bytes of blocks freed stream-ordered and dissolved before a synchronization carry a
/// per-page fence; a page with one was kept until a synchronization, so a process that never
/// synchronizes the device kept, above its budget, every page such bytes touched. The events
/// the pool records on the free's stream for busy mappings now clear those fences too: pages
/// go back once the device says the stream passed the frees (checking device: no page given
/// back, and no byte reused on another stream, while the stream may still use it). With the
/// fences kept until a synchronization (`Faults::fences_until_sync`) the pool holds more pages
/// at the end.
#[test]
fn pages_of_dissolved_stream_ordered_bytes_go_back_without_a_synchronization() {
    let ((pages, most, budget, events), dev) = shrinking(Faults::default(), WAIT);
    let ((old_pages, old_most, _, old_events), old_dev) = shrinking(
        Faults {
            fences_until_sync: true,
            ..Faults::default()
        },
        WAIT,
    );
    eprintln!(
        "events: pages at the end {pages}, most {most}, budget {} MiB, events recorded {events}; \
         fences until a sync: pages at the end {old_pages}, most {old_most}, events recorded {old_events}",
        budget / MIB
    );
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    assert!(
        old_dev.violations().is_empty(),
        "{:?}",
        &old_dev.violations()[..1]
    );
    assert!(
        pages + 16 <= old_pages,
        "{pages} pages at the end, {old_pages} with fences until a sync"
    );
}

/// Never waiting for its stream, the process never lets the device say the stream passed the
/// frees: the fences stay (no page they hold goes back), and taking the events for complete
/// without asking (`Faults::busy_done_unasked`) is caught as pages given back, or bytes reused,
/// while the stream may still use them.
#[test]
fn a_fence_is_cleared_only_when_the_device_says_its_event_is_complete() {
    for broken in [false, true] {
        let ((pages, most, ..), dev) = shrinking(
            Faults {
                busy_done_unasked: broken,
                ..Faults::default()
            },
            0,
        );
        let early = dev
            .violations()
            .iter()
            .filter(|v| {
                v.contains("freed without a synchronization") || v.starts_with("early reuse")
            })
            .count();
        eprintln!("broken {broken}: pages at the end {pages}, most {most}, caught {early}");
        if broken {
            assert!(early > 0, "{:?}", dev.violations().first());
        } else {
            assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
        }
    }
}
