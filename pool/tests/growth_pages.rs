//! Growth creates only the pages a new mapping takes: a request's whole pages, and a page for
//! its remainder only where no partly used page's free end holds it (`Stitch::fresh_pages_for`;
//! the placement then starts or ends the mapping in that page). Before, growth created the
//! remainder's page too and gave it back in the same allocation: a create and a release for
//! nothing (bert_serve's peak request at its second layer, t5 ten times), and a page more at
//! the peak. On the checking device, every shared trace and GPU recording under both free
//! semantics: no allocation both creates and releases a page, and nothing overlaps or is
//! reused early. Broken on purpose (`Faults::remainder_page`: the rule before), bert_serve and
//! t5 make such allocations again.

mod common;

use common::checked::replay_checked;
use common::traces;
use vramshim_pool::replay::Frees;
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, Policy};

/// Allocations of `ev` (under `frees`) whose driver calls both create and release a page, on
/// a checking 80 GiB device, with `faults`; and the pool's peak reserved bytes.
fn created_and_released(
    ev: &[vramshim_pool::replay::Event],
    frees: Frees,
    faults: Faults,
) -> (u64, u64) {
    let mut dev = AccountingDevice::new(80 << 30);
    dev.set_checking(true);
    let mut p = Stitch::tight();
    p.set_faults(faults);
    let mut both = 0;
    replay_checked(
        &frees.apply(ev),
        &mut p,
        &mut dev,
        |p, dev, _, req| {
            let before = dev.calls();
            let a = p.alloc(dev, req)?;
            let d = dev.calls().since(&before);
            if d.create > 0 && d.release > 0 {
                both += 1;
            }
            Ok::<_, vramshim_pool::PoolError>((a.addr, req.size))
        },
        |_| {},
    )
    .unwrap();
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    (both, p.stats().peak_reserved)
}

#[test]
fn growth_gives_back_no_page_it_created() {
    for (name, ev) in traces() {
        for frees in Frees::BOTH {
            let (both, peak) = created_and_released(&ev, frees, Faults::default());
            let (before, peak_before) = created_and_released(
                &ev,
                frees,
                Faults {
                    remainder_page: true,
                    ..Faults::default()
                },
            );
            eprintln!(
                "{name} {}: allocations creating and releasing a page {both} (the rule before: \
                 {before}), peak reserved {peak} ({peak_before})",
                frees.name()
            );
            assert_eq!(both, 0, "{name} {}", frees.name());
            assert!(
                peak <= peak_before,
                "{name} {}: {peak} > {peak_before}",
                frees.name()
            );
            if name.ends_with("bert_serve.rmm.csv") || name.ends_with("t5_train.rmm.csv") {
                assert!(before > 0, "{name} {}: the fault is reached", frees.name());
            }
        }
    }
}
