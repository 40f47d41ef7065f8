//! What the pool's tests share: the free modes the property tests draw, the end of a run
//! (every live block freed, then trim) and the checks that a run left nothing behind; the
//! rotation `pool_bench` times ([`rotation`]); every shared trace and GPU recording
//! ([`traces`]); each allocation's lifetime class ([`lifetimes`]); the arena's two ends told
//! lifetimes ([`ends`]). Each test file uses a part of it.
#![allow(dead_code)]

pub mod checked;
pub mod ends;
pub mod lifetimes;
pub mod rotation;

use proptest::prelude::*;
use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::{AccountingDevice, FreeMode, Policy, rmm_csv};

/// A free mode: synchronous, or stream-ordered on one of streams 0 to 2.
pub fn mode() -> impl Strategy<Value = FreeMode> {
    prop_oneof![
        1 => Just(FreeMode::Sync),
        3 => (0u64..3).prop_map(|stream| FreeMode::Async { stream }),
    ]
}

/// Frees the block of `live` (`(addr, size, stream)`) at `idx % live.len()` in `mode`, checked
/// by the device; the pool must answer the size it was asked for. False when nothing is live.
pub fn free_at(
    policy: &mut dyn Policy,
    dev: &mut AccountingDevice,
    live: &mut Vec<(u64, u64, u64)>,
    idx: usize,
    mode: FreeMode,
) -> bool {
    if live.is_empty() {
        return false;
    }
    let (addr, size, _) = live.swap_remove(idx % live.len());
    dev.check_free(addr, mode);
    assert_eq!(policy.free(dev, addr, mode).unwrap(), size);
    true
}

/// Frees every block of `live` (`(addr, size, stream)`: stream-ordered on its stream, a
/// block of `ANY_STREAM` synchronously), each checked by the device, then trims the pool.
pub fn free_all_and_trim(
    policy: &mut dyn Policy,
    dev: &mut AccountingDevice,
    live: &mut Vec<(u64, u64, u64)>,
) {
    for (addr, _, stream) in live.drain(..) {
        let mode = if stream == vramshim_pool::ANY_STREAM {
            FreeMode::Sync
        } else {
            FreeMode::Async { stream }
        };
        dev.check_free(addr, mode);
        policy.free(dev, addr, mode).unwrap();
    }
    policy.trim(dev).unwrap();
}

/// No violation recorded by the checking device, no leak, and nothing live or reserved in
/// the pool (after [`free_all_and_trim`]).
pub fn assert_clean(dev: &AccountingDevice, policy: &dyn Policy) {
    assert!(
        dev.violations().is_empty(),
        "violations: {:#?}",
        &dev.violations()[..dev.violations().len().min(5)]
    );
    assert_eq!(dev.leaks(), Vec::<String>::new(), "leaks");
    assert_eq!(policy.stats().live, 0);
    assert_eq!(policy.stats().reserved, 0, "reserved after trim");
}

/// Every shared trace and GPU recording, named `directory/file`, with its events.
pub fn traces() -> Vec<(String, Vec<Event>)> {
    let mut files = vramshim_testkit::shipped_traces();
    let gpu = vramshim_testkit::repo_root().join("tests/workloads/traces/gpu");
    files.extend(vramshim_testkit::rmm_logs_in(&gpu, "the GPU recordings"));
    files
        .into_iter()
        .map(|p| {
            let t = rmm_csv::parse_file(&p).unwrap();
            let dir = p.parent().unwrap().file_name().unwrap().to_string_lossy();
            let name = p.file_name().unwrap().to_string_lossy();
            (format!("{dir}/{name}"), t.events)
        })
        .collect()
}

/// One pass of `stream` through `p` on a checking 80 GiB device: it completes with no overlap,
/// no early reuse and nothing leaked, within 1.10 x peak live (the targets of every pool
/// variant); returns its peak device use over peak live.
pub fn run_clean_within_1_10(stream: &[Event], p: &mut dyn Policy, what: &str) -> f64 {
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let r = replay::run_with(stream, p, &mut dev);
    assert!(r.completed, "{what}: {:?}", r.first_failure);
    assert!(r.violations.is_empty(), "{what}: {:?}", &r.violations[..1]);
    assert!(r.leaks.is_empty(), "{what}: {:?}", &r.leaks[..1]);
    let held = r.peak_device_used as f64 / r.peak_live as f64;
    assert!(held <= 1.10, "{what}: {held:.3} x peak live");
    held
}

/// Driver calls of passes 2 and 3 of `ev` repeated three times under `frees`.
pub fn later_pass_calls(ev: &[Event], frees: Frees, make: &dyn Fn() -> Box<dyn Policy>) -> u64 {
    replay::calls_per_pass_with(ev, frees, make, 3)[1..]
        .iter()
        .sum()
}
