//! The tight pool's replay of the previous round's places (`stitch::rounds`), on random
//! workloads whose rounds repeat with changes (sizes changed, frees reordered): every replayed
//! place is checked by the checking device (no overlap, no early reuse of `cudaFree`d or
//! other streams' memory, nothing lost), and taking a place that a live block holds
//! (`Faults::replay_over_live`) is caught.

use proptest::prelude::*;
use vramshim_pool::stitch::{Faults, Stitch};
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, PoolError, Request};

/// One allocation of a round: its size, stream, and how its free is ordered and made.
#[derive(Clone, Debug)]
struct Alloc {
    size: u64,
    stream: u64,
    /// the block is freed once this many later allocations of the round were made
    life: usize,
    mode: FreeMode,
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1u64..4096,
        3 => 4096u64..MIB,
        3 => MIB..8 * MIB,
        1 => 8 * MIB..40 * MIB,
    ]
}

fn mode() -> impl Strategy<Value = FreeMode> {
    prop_oneof![
        1 => Just(FreeMode::Sync),
        3 => (0u64..2).prop_map(|stream| FreeMode::Async { stream }),
    ]
}

fn alloc() -> impl Strategy<Value = Alloc> {
    (size(), 0u64..2, 0usize..12, mode()).prop_map(|(size, stream, life, mode)| Alloc {
        size,
        stream,
        life,
        mode,
    })
}

/// A change of one allocation in a later round.
#[derive(Clone, Debug)]
struct Change {
    at: usize,
    size: u64,
    life: usize,
}

fn change() -> impl Strategy<Value = Change> {
    (any::<usize>(), size(), 0usize..12).prop_map(|(at, size, life)| Change { at, size, life })
}

/// Replay `rounds` rounds of `base` (round r with `changes[r]` applied), each round ending
/// with every block freed, through `p` on a checking device. Returns the device, or the
/// panic's message if the pool's own books caught something.
fn run(
    p: &mut Stitch,
    base: &[Alloc],
    changes: &[Vec<Change>],
) -> Result<AccountingDevice, String> {
    let mut dev = AccountingDevice::new(4096 * MIB);
    dev.set_checking(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for ch in changes {
            let mut round = base.to_vec();
            for c in ch {
                let i = c.at % round.len();
                round[i].size = c.size;
                round[i].life = c.life;
            }
            // (free at allocation index, address, mode)
            let mut live: Vec<(usize, u64, FreeMode)> = Vec::new();
            for (i, a) in round.iter().enumerate() {
                live.retain(|&(at, addr, mode)| {
                    if at <= i {
                        dev.check_free(addr, mode);
                        p.free(&mut dev, addr, mode).unwrap();
                        false
                    } else {
                        true
                    }
                });
                let req = Request {
                    size: a.size,
                    stream: a.stream,
                };
                match p.alloc(&mut dev, req) {
                    Ok(b) => {
                        dev.check_alloc(b.addr, b.size, a.stream);
                        let mode = match a.mode {
                            FreeMode::Async { .. } => FreeMode::Async { stream: a.stream },
                            m => m,
                        };
                        live.push((i + 1 + a.life, b.addr, mode));
                    }
                    Err(PoolError::OutOfMemory { .. }) => {}
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            for (_, addr, mode) in live {
                dev.check_free(addr, mode);
                p.free(&mut dev, addr, mode).unwrap();
            }
        }
        p.trim(&mut dev).unwrap();
    }));
    match r {
        Ok(()) => Ok(dev),
        Err(e) => Err(e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()),
    }
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(48))]

    /// Rounds that repeat with changes: replayed places never overlap a live block, never
    /// reuse memory early, and everything is given back.
    #[test]
    fn replayed_places_are_safe(
        base in proptest::collection::vec(alloc(), 140..300),
        changes in proptest::collection::vec(proptest::collection::vec(change(), 0..12), 4..7),
    ) {
        let mut p = Stitch::tight();
        let dev = run(&mut p, &base, &changes).unwrap();
        prop_assert!(
            dev.violations().is_empty(),
            "violations: {:#?}",
            &dev.violations()[..dev.violations().len().min(5)]
        );
        prop_assert_eq!(dev.leaks(), Vec::<String>::new());
        prop_assert_eq!(p.stats().live, 0);
        prop_assert!(p.replays() > 0, "nothing was replayed");
    }
}

/// With `Faults::replay_over_live` a replayed place is taken even where a live block is:
/// on rounds that differ, the checker (or the pool's own books) catches it; the same rounds
/// replay places without the fault, safely.
#[test]
fn replaying_over_a_live_block_is_caught() {
    let base: Vec<Alloc> = (0..300u64)
        .map(|i| Alloc {
            size: [3000, 70_000, 900_000, 3 * MIB + 5000, 9 * MIB + 100][(i % 5) as usize],
            stream: 0,
            life: (i * 7 % 11) as usize,
            mode: FreeMode::Async { stream: 0 },
        })
        .collect();
    // later rounds keep some blocks longer than the first did: their places are still
    // live when the next block of the first round's layout comes for its place
    let changes: Vec<Vec<Change>> = (0..5usize)
        .map(|r| {
            (0..30usize)
                .map(|j| Change {
                    at: j * 10 + r,
                    size: base[(j * 10 + r) % base.len()].size,
                    life: 11,
                })
                .collect()
        })
        .collect();
    let mut p = Stitch::tight();
    let dev = run(&mut p, &base, &changes).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    assert!(p.replays() > 0, "nothing was replayed");
    let mut p = Stitch::tight();
    p.set_faults(Faults {
        replay_over_live: true,
        ..Faults::default()
    });
    let caught = match run(&mut p, &base, &changes) {
        Ok(dev) => !dev.violations().is_empty(),
        Err(_) => true,
    };
    assert!(caught, "a place taken over a live block went unseen");
}
