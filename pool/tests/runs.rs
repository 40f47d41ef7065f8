//! Runs: the tight pool's arena grown by one handle of several pages (`Stitch::with_runs`)
//! instead of a handle per page. On every shared trace and GPU recording, under both free
//! semantics, on the checking device: fewer driver calls in all and in the second half of a
//! pass, the same smallest device (a pool that would hold more than a quarter of what the device
//! could give grows a handle per page), at most 1.10 x peak live on an 80 GiB device, and no
//! driver call after the first pass where the pool without runs makes none. Broken on
//! purpose: grown a handle per page (`Faults::page_handles`) the calls are the old ones, so
//! the "fewer" assertions can fail; a page of a run stitched alone
//! (`Faults::stitch_run_pages`) is a partial mapping of a handle, which the checking device
//! reports.

mod common;

use common::traces;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, Policy};

type Make = Box<dyn Fn() -> Box<dyn Policy>>;

/// The tight pool without the layer replay (runs are off by default, and measured against
/// the pool as it was when they were built: with layers, runs hold bert_serve stream-ordered at
/// 1.147 x peak live).
fn tight(runs: bool, faults: Faults) -> Make {
    Box::new(move || -> Box<dyn Policy> {
        let mut p = Stitch::tight().with_runs(runs).with_layers(false);
        p.set_faults(faults);
        Box::new(p)
    })
}

/// What the comparisons look at, for one trace, free semantics and pool.
#[derive(Debug, PartialEq)]
struct Seen {
    calls: u64,
    half: f64,
    later_passes: u64,
    reserved_over_live: f64,
    min_device: u64,
}

fn seen(ev: &[Event], frees: Frees, make: &Make, name: &str) -> Seen {
    let stream = frees.apply(ev);
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = make();
    let r = replay::run_with(&stream, p.as_mut(), &mut dev);
    assert!(r.completed, "{name}: {:?}", r.first_failure);
    assert!(r.violations.is_empty(), "{name}: {:?}", &r.violations[..1]);
    let passes = replay::calls_per_pass_with(ev, frees, make, 3);
    Seen {
        calls: r.driver_calls,
        half: replay::second_half_calls_per_1000(ev, frees, make),
        later_passes: passes[1..].iter().sum(),
        reserved_over_live: r.peak_device_used as f64 / r.peak_live as f64,
        min_device: replay::min_capacity_with(&stream, make),
    }
}

#[test]
fn runs_cut_driver_calls_and_keep_the_memory_targets() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let what = format!("{name} {}", frees.name());
            let pages = seen(&ev, frees, &tight(false, Faults::default()), &what);
            let runs = seen(&ev, frees, &tight(true, Faults::default()), &what);
            let broken = seen(
                &ev,
                frees,
                &tight(
                    true,
                    Faults {
                        page_handles: true,
                        ..Faults::default()
                    },
                ),
                &what,
            );
            eprintln!("{what}: a handle per page {pages:?}, runs {runs:?}");
            assert!(runs.calls < pages.calls, "{what}: {runs:?} vs {pages:?}");
            assert!(runs.half <= pages.half, "{what}: {runs:?} vs {pages:?}");
            assert!(runs.reserved_over_live <= 1.10, "{what}: {runs:?}");
            assert_eq!(runs.min_device, pages.min_device, "{what}");
            assert!(runs.later_passes <= pages.later_passes, "{what}: {runs:?}");
            // grown a handle per page, the pool makes the calls it makes without runs:
            // `runs.calls < pages.calls` above fails for it
            assert_eq!(
                broken, pages,
                "{what}: page_handles is the pool without runs"
            );
        }
    }
}

/// A page of a run stitched into a new mapping alone is a mapping of part of a handle: the
/// checking device reports it on some trace (bert_serve's stitched layers), and never
/// without the fault (`runs_cut_driver_calls_and_keep_the_memory_targets`).
#[test]
fn checker_catches_a_page_of_a_run_mapped_alone() {
    let mut caught = false;
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let mut dev = AccountingDevice::new(80 << 30);
            dev.set_checking(true);
            let mut p = Stitch::tight().with_runs(true);
            p.set_faults(Faults {
                stitch_run_pages: true,
                ..Faults::default()
            });
            let r = replay::run_with(&frees.apply(&ev), &mut p, &mut dev);
            let bad = r.violations.iter().any(|v| v.contains("mapped whole"));
            eprintln!(
                "{name} {}: completed {}, partial mapping reported {bad}",
                frees.name(),
                r.completed
            );
            caught |= bad;
        }
    }
    assert!(
        caught,
        "no trace mapped a page of a run alone under the fault"
    );
}
