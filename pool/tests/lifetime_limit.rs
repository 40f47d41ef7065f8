//! What lifetimes are worth to the budgeted pool near the device's limit: told, at each
//! allocation, whether the block dies before the trace's peak of live bytes (an oracle read
//! from the trace, as `examples/pool_lifetimes.rs` computes it), the default pool (stitch with
//! its budget) completes t5 on the whole-page device of 1.03 x its peak live under both free
//! semantics, on the checking device (no overlap, no early reuse, nothing left after the
//! trace, the device's own count under its capacity). It gets there only because near the
//! limit large blocks skip the arena, which places across classes
//! (`Stitch::lifetimes_near_limit`): with the arena kept (`Faults::arena_mixes_lifetimes`) the
//! same replay is refused, so the test can fail.

mod common;

use vramshim_pool::replay::{self, Event, Frees};
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, MIB, Policy, rmm_csv};

const PAGE: u64 = 2 * MIB;

/// Replay `events` through `p` with the classes told, on a checking device of `capacity`
/// bytes: `Ok(())` when every allocation is served, `Err(event index)` at the first refused.
fn replay_told(events: &[Event], class: &[u8], p: &mut Stitch, capacity: u64) -> Result<(), usize> {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    common::checked::replay_checked(
        events,
        p,
        &mut dev,
        |p, dev, i, req| {
            p.set_lifetime_class(class[i]);
            let a = p.alloc(dev, req).map_err(|_| i)?;
            Ok::<_, usize>((a.addr, a.size))
        },
        |dev| {
            assert!(
                dev.used() <= capacity,
                "the device's own count passed its capacity"
            )
        },
    )?;
    assert!(
        dev.violations().is_empty(),
        "event stream checked: {:?}",
        &dev.violations()[..1]
    );
    Ok(())
}

/// t5 (both free semantics) on the 1.03 x device (484 MiB); the rule is what does it on its
/// own smallest devices: behind `cudaFree` 482 MiB (1.023 x; the classes alone reach 484),
/// stream-ordered 480 MiB (1.019 x; the classes alone reach 484).
#[test]
fn lifetime_classes_fit_t5_on_1_03_x_peak_live_with_the_arena_set_aside() {
    let path = vramshim_testkit::repo_root().join("tests/workloads/traces/t5_train.rmm.csv");
    let t = rmm_csv::parse_file(&path).unwrap();
    let device = (replay::peak_live(&t.events) as f64 * 1.03) as u64 / PAGE * PAGE;
    assert_eq!(device, 484 * MIB);
    for (frees, mib, kept) in [
        (Frees::CudaFree, 484, false),
        (Frees::CudaFree, 482, false),
        (Frees::CudaFree, 482, true),
        (Frees::StreamOrdered, 484, false),
        (Frees::StreamOrdered, 480, false),
        (Frees::StreamOrdered, 480, true),
    ] {
        let events = frees.apply(&t.events);
        let (class, _) = common::lifetimes::classes(&events);
        let mut p = Stitch::tight();
        p.set_faults(Faults {
            arena_mixes_lifetimes: kept,
            ..Faults::default()
        });
        let r = replay_told(&events, &class, &mut p, mib * MIB);
        let what = format!("t5 {} on {mib} MiB, arena kept {kept}", frees.name());
        eprintln!("{what}: {r:?}");
        if kept {
            assert!(
                r.is_err(),
                "{what}: completes with the arena across classes"
            );
        } else {
            assert_eq!(r, Ok(()), "{what}: refused at this event");
        }
    }
}
