//! A fault switch changes only what it names. Most switches turn the pool's fast path
//! (`Stitch::alloc_cached`) off, so the general path must choose as the fast path would:
//! a switch whose rule a run never reaches (kept ranges off, no runs, no lifetime classes)
//! leaves every count of the run as it is without it. Otherwise a fault demo would break
//! more than its property (and a test that shows it failing would show something else).

use vramshim_pool::replay::{self, Event, Frees, UNLIMITED};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, rmm_csv};

fn traces() -> Vec<(String, Vec<Event>)> {
    vramshim_testkit::shipped_traces()
        .into_iter()
        .map(|p| {
            let t = rmm_csv::parse_file(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into(), t.events)
        })
        .collect()
}

/// (driver calls, syncs, cache hits, peak reserved, stream waits) of a tight pool over `ev`.
fn counts(ev: &[Event], faults: Faults) -> (u64, u64, u64, u64, u64) {
    let mut dev = AccountingDevice::new(UNLIMITED);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    p.set_faults(faults);
    let r = replay::run_with(ev, &mut p, &mut dev);
    assert!(r.completed);
    assert!(r.violations.is_empty(), "{:?}", &r.violations[..1]);
    (
        r.driver_calls,
        r.syncs,
        r.stats.cache_hits,
        r.peak_reserved,
        r.stats.stream_waits,
    )
}

/// Switches of rules a default tight pool never takes (kept ranges, runs, lifetime classes
/// are off): each turns the fast path off and must change nothing else.
#[test]
fn unreached_fault_switches_change_nothing() {
    let unreached = [
        (
            "kept_over_live",
            Faults {
                kept_over_live: true,
                ..Faults::default()
            },
        ),
        (
            "stitch_run_pages",
            Faults {
                stitch_run_pages: true,
                ..Faults::default()
            },
        ),
        (
            "mix_lifetimes",
            Faults {
                mix_lifetimes: true,
                ..Faults::default()
            },
        ),
    ];
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let ev = frees.apply(&ev);
            let want = counts(&ev, Faults::default());
            for (switch, f) in unreached {
                let got = counts(&ev, f);
                eprintln!("{name} {}: {switch}: {got:?}, none: {want:?}", frees.name());
                assert_eq!(
                    got,
                    want,
                    "{name} {}: {switch} (fast path off) changed (calls, syncs, hits, peak, waits)",
                    frees.name()
                );
            }
        }
    }
}
