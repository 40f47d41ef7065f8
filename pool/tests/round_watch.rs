//! The round watch (`Stitch::round_end_watch`) behind a thread cache (`thread_cache`): above
//! the budget and the pages the pool keeps past it, every free reaches the pool at once.
//!
//! Why: a free there is where the pool gives memory back (it dissolves its cache and releases
//! the idle pages no stream may still use). A free the cache keeps aside reaches the pool only
//! at the thread's next call into it, which may come much later or never (a program that goes
//! idle, or waits on another process's memory): until then the pool holds what it would have
//! given back. `pool/tests/kept_aside.rs` checks the other half of the rule (within the pages
//! the pool keeps past its budget a free changes nothing, so the cache may keep it).

use std::collections::HashMap;
use vramshim_pool::replay::{self, Event};
use vramshim_pool::stitch::{Budget, Faults, Stitch};
use vramshim_pool::thread_cache::{Rules, ThreadCache};
use vramshim_pool::{AccountingDevice, FreeMode, KIB, MIB, Policy, Request};

/// What the pool held after each event (device bytes), and whether the pool was above its
/// budget with the watch at 0 before some free.
struct Run {
    held: Vec<u64>,
    watched_above: bool,
}

/// `events` by one thread through a tight pool (budget windows of 2 allocations) behind a
/// thread cache (`cache`) or with every free reaching the pool (the model), on the checking
/// device; `faults` set in the pool.
fn run(events: &[Event], cache: bool, faults: Faults) -> Run {
    let mut p = Stitch::new().with_budget(Some(Budget {
        window: 2,
        ..Budget::default()
    }));
    p.set_faults(faults);
    let mut dev = AccountingDevice::new(1 << 40);
    dev.set_checking(true);
    let mut c = ThreadCache::new(if cache { Rules::LIVE } else { Rules::NONE });
    let mut ids: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    let mut out = Run {
        held: Vec::new(),
        watched_above: false,
    };
    for ev in events {
        match *ev {
            Event::Alloc { id, size, stream } => {
                let (a, _) = c.alloc(&mut p, &mut dev, Request { size, stream }).unwrap();
                dev.check_alloc(a.addr, a.size, stream);
                ids.insert(id, (a.addr, size, a.size));
            }
            Event::Free { id, mode } => {
                let (addr, size, granted) = ids.remove(&id).unwrap();
                dev.check_free(addr, mode);
                let s = p.stats();
                out.watched_above |= s.reserved > s.budget && p.round_end_watch() == 0;
                c.free(&mut p, &mut dev, addr, size, granted, mode).unwrap();
            }
            Event::ProcessSync => replay::process_sync(&mut p, &mut dev),
            Event::StreamRetired { stream } => {
                c.retire_stream(&mut p, &mut dev, stream).unwrap();
                dev.retire_stream(stream);
            }
        }
        assert_eq!(
            p.stats().reserved,
            dev.used(),
            "reserved is the device's count"
        );
        out.held.push(dev.used());
    }
    c.give_back(&mut p, &mut dev).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    out
}

/// A 20 MiB block freed stream-ordered, then small pairs until two budget windows passed: the
/// budget falls to 2 MiB, but the 20 MiB cannot go back (a stream may still use them: no
/// synchronization since their free), and the pool was never forced past its budget, so it
/// keeps no page past it. The process synchronizes; the next free lets the pool give the
/// 20 MiB back, behind the thread cache as without it: the watch is 0 there, so the cache
/// gives the free to the pool at once. With the watch never 0 there (`Faults::watch_never_zero`)
/// the cache keeps the free and the pool holds 22 MiB after it.
#[test]
fn a_free_above_the_budget_reaches_the_pool_behind_the_thread_cache() {
    let alloc = |id, size| Event::Alloc {
        id,
        size,
        stream: 0,
    };
    let free = |id| Event::Free {
        id,
        mode: FreeMode::Async { stream: 0 },
    };
    let mut ev = vec![alloc(0, 4 * KIB), alloc(1, 20 * MIB), free(1)];
    // pairs of sizes the cache never serves (each size once): every allocation is the pool's
    for i in 0..6 {
        ev.push(alloc(10 + i, 4 * KIB * (i + 2)));
        ev.push(free(10 + i));
    }
    ev.push(alloc(20, 8 * KIB));
    ev.push(Event::ProcessSync);
    ev.push(free(20));

    let model = run(&ev, false, Faults::default());
    let behind = run(&ev, true, Faults::default());
    let blind = run(
        &ev,
        true,
        Faults {
            watch_never_zero: true,
            ..Faults::default()
        },
    );
    let last = |r: &Run| *r.held.last().unwrap();
    eprintln!(
        "held after the last free: model {} MiB, behind the cache {} MiB, watch never 0 {} MiB",
        last(&model) / MIB,
        last(&behind) / MIB,
        last(&blind) / MIB
    );
    assert!(
        behind.watched_above,
        "the pool was never above its budget with the watch at 0: the stream tests nothing"
    );
    assert!(
        last(&model) <= 2 * MIB,
        "the model held {} B after the free that follows the synchronization",
        last(&model)
    );
    assert_eq!(
        behind.held, model.held,
        "behind the thread cache the pool held other bytes than the model after some event"
    );
    assert!(
        last(&blind) >= 22 * MIB,
        "with the watch never 0 the pool still gave the 20 MiB back at once: the test cannot fail"
    );
}
