//! Lifetime classes (`Stitch::set_lifetime_class`): random request streams with random
//! classes stay safe on the checking accounting device (no physical overlap, no reuse before
//! the stream rules allow, the device never exceeded, nothing left after free-all + trim), and
//! no page ever holds blocks of two classes; with `Faults::mix_lifetimes` the class check
//! fails, so it can.

mod common;

use std::collections::HashMap;

use common::{assert_clean, free_all_and_trim, free_at, mode};
use proptest::prelude::*;
use vramshim_pool::stitch::{Budget, Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, KIB, MIB, Policy, PoolError, Request};

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u64, class: u8 },
    Free { idx: usize, mode: FreeMode },
    ProcessSync,
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..MIB,
        3 => MIB..8 * MIB,
        1 => 8 * MIB..64 * MIB,
    ];
    prop_oneof![
        10 => (size, 0u64..3, 0u8..3).prop_map(|(size, stream, class)| Op::Alloc { size, stream, class }),
        8 => (any::<usize>(), mode()).prop_map(|(idx, mode)| Op::Free { idx, mode }),
        1 => Just(Op::ProcessSync),
        1 => Just(Op::Trim),
    ]
}

/// The first page holding blocks of two lifetime classes, as `(page, classes)`; `class_of`
/// maps a block's address to the class it was allocated with.
fn mixed_page(p: &Stitch, class_of: &HashMap<u64, u8>) -> Option<(u32, Vec<u8>)> {
    for v in p.used_pages() {
        let mut seen: Vec<u8> = v
            .blocks
            .iter()
            .filter_map(|b| class_of.get(&b.2).copied())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() > 1 || seen.first().is_some_and(|&c| c != v.life) {
            return Some((v.page, seen));
        }
    }
    None
}

/// Run `ops` on a checking device of `capacity` bytes; `Err` names the first page that mixed
/// classes (checked after every operation, when `check_classes`).
fn run(
    p: &mut Stitch,
    ops: &[Op],
    capacity: u64,
    check_classes: bool,
) -> Result<AccountingDevice, String> {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    let mut class_of: HashMap<u64, u8> = HashMap::new();
    for op in ops {
        match *op {
            Op::Alloc {
                size,
                stream,
                class,
            } => {
                p.set_lifetime_class(class);
                match p.alloc(&mut dev, Request { size, stream }) {
                    Ok(a) => {
                        dev.check_alloc(a.addr, a.size, stream);
                        live.push((a.addr, size, stream));
                        class_of.insert(a.addr, class);
                    }
                    Err(PoolError::OutOfMemory { .. }) => {}
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Op::Free { idx, mode } => {
                if !free_at(p, &mut dev, &mut live, idx, mode) {
                    continue;
                }
            }
            Op::ProcessSync => {
                dev.process_sync();
                p.note_process_sync();
            }
            Op::Trim => {
                p.trim(&mut dev).unwrap();
            }
        }
        assert!(dev.used() <= dev.capacity(), "device exceeded");
        if check_classes && let Some((page, classes)) = mixed_page(p, &class_of) {
            return Err(format!("page {page} holds blocks of classes {classes:?}"));
        }
    }
    // Streams 0 to 2 only: every block is freed stream-ordered on its stream.
    free_all_and_trim(p, &mut dev, &mut live);
    Ok(dev)
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(96))]

    #[test]
    fn stitch_keeps_lifetime_classes_apart_and_is_safe(
        ops in proptest::collection::vec(op(), 1..300),
        cap_mib in 64u64..1024,
    ) {
        let mut p = Stitch::new();
        let dev = run(&mut p, &ops, cap_mib * MIB, true).unwrap();
        assert_clean(&dev, &p);
    }

    /// With a budget the arena and the round replay do not look at classes: only the safety
    /// rules are checked.
    #[test]
    fn stitch_tight_with_lifetime_classes_is_safe(
        ops in proptest::collection::vec(op(), 1..300),
        cap_mib in 64u64..1024,
    ) {
        let mut p = Stitch::new().with_budget(Some(Budget::default()));
        let dev = run(&mut p, &ops, cap_mib * MIB, false).unwrap();
        assert_clean(&dev, &p);
    }
}

/// Two half-page blocks of different classes: apart (two pages), and with
/// `Faults::mix_lifetimes` in one page, which the check names.
#[test]
fn classes_keep_pages_apart_and_the_check_can_fail() {
    let ops = [
        Op::Alloc {
            size: 512 * KIB,
            stream: 0,
            class: 1,
        },
        Op::Alloc {
            size: 512 * KIB,
            stream: 0,
            class: 0,
        },
    ];
    let mut p = Stitch::new();
    let dev = run(&mut p, &ops, 64 * MIB, true).expect("classes kept apart");
    assert_clean(&dev, &p);

    let mut p = Stitch::new();
    p.set_faults(Faults {
        mix_lifetimes: true,
        ..Default::default()
    });
    let Err(err) = run(&mut p, &ops, 64 * MIB, true) else {
        panic!("the classes share a page under Faults::mix_lifetimes");
    };
    assert!(err.contains("classes [0, 1]"), "{err}");
}
