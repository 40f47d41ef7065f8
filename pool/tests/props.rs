//! Property tests: random request streams through every policy on the checking accounting
//! device never overlap two live blocks in physical bytes, never reuse a block before its
//! stream rules allow, never exceed the device, and leave nothing behind after free-all +
//! trim. Deterministic tests with fault switches show the checker does catch each broken
//! property.

mod common;

use common::{assert_clean, free_all_and_trim, free_at, mode};
use proptest::prelude::*;
use vramshim_pool::accounting::CallKind;
use vramshim_pool::stitch::{Budget, Faults, Shapes, Stitch};
use vramshim_pool::{
    AccountingDevice, Device, DeviceError, FreeMode, GIB, KIB, MIB, Policy, PolicyKind, PoolError,
    Request,
};

/// Printed in the notation of [`stream`], so that a shrunk failing case pastes into a test.
#[derive(Clone, PartialEq)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
    },
    /// free the live block at `idx % live.len()`
    Free {
        idx: usize,
        mode: FreeMode,
    },
    ProcessSync,
    Trim,
    Capture(bool),
    /// A caller in front of the pool (the interposer's thread caches) served `n` allocations
    /// from a block it kept aside, live to the pool throughout, and tells the pool
    /// (`Policy::note_aside_hits`); nothing when no block is live.
    Hits {
        n: u64,
    },
    /// The process destroys this stream (`Policy::retire_stream`, then the device); later
    /// requests on its handle are on a new stream.
    Retire(u64),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stream = |s: u64| {
            if s == vramshim_pool::ANY_STREAM {
                "*".to_string()
            } else {
                s.to_string()
            }
        };
        match self {
            Op::Alloc { size, stream: s } => write!(f, "a{size}:{}", stream(*s)),
            Op::Free {
                idx,
                mode: FreeMode::Sync,
            } => write!(f, "f{idx}"),
            Op::Free {
                idx,
                mode: FreeMode::Async { stream: s },
            } => write!(f, "f{idx}:{}", stream(*s)),
            Op::ProcessSync => write!(f, "p"),
            Op::Trim => write!(f, "t"),
            Op::Capture(on) => write!(f, "c{}", u8::from(*on)),
            Op::Hits { n } => write!(f, "h{n}"),
            Op::Retire(s) => write!(f, "r{s}"),
        }
    }
}

/// A request stream written one token an [`Op`] (the shrunk streams of the tests below, and
/// how a failing case's `Op`s print): `a<size>:<stream>` an allocation (`*`: any stream),
/// `f<idx>` a `cudaFree` and `f<idx>:<stream>` a stream-ordered free of the live block at
/// `idx % live`, `p` a process synchronization, `t` a trim, `c1` / `c0` a capture's start /
/// end, `h<n>` `n` hits served aside, `r<stream>` the stream destroyed. Blanks, commas and
/// brackets separate tokens.
fn stream(text: &str) -> Vec<Op> {
    let num = |t: &str, v: &str| -> u64 {
        v.parse()
            .unwrap_or_else(|_| panic!("{t:?}: {v:?} is not a number"))
    };
    let stream_of = |t: &str, v: &str| match v {
        "*" => vramshim_pool::ANY_STREAM,
        v => num(t, v),
    };
    text.split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']'))
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (head, rest) = t.split_at(1);
            let (value, on) = match rest.split_once(':') {
                Some((v, s)) => (v, Some(s)),
                None => (rest, None),
            };
            match (head, on) {
                ("a", Some(s)) => Op::Alloc {
                    size: num(t, value),
                    stream: stream_of(t, s),
                },
                ("f", None) => Op::Free {
                    idx: num(t, value) as usize,
                    mode: FreeMode::Sync,
                },
                ("f", Some(s)) => Op::Free {
                    idx: num(t, value) as usize,
                    mode: FreeMode::Async {
                        stream: stream_of(t, s),
                    },
                },
                ("p", None) if value.is_empty() => Op::ProcessSync,
                ("t", None) if value.is_empty() => Op::Trim,
                ("c", None) if value == "0" || value == "1" => Op::Capture(value == "1"),
                ("h", None) => Op::Hits { n: num(t, value) },
                ("r", None) => Op::Retire(num(t, value)),
                _ => panic!("{t:?} is not an op of `stream`"),
            }
        })
        .collect()
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..MIB,
        3 => MIB..8 * MIB,
        1 => 8 * MIB..300 * MIB,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size(), prop_oneof![4 => 0u64..3, 1 => Just(vramshim_pool::ANY_STREAM)])
            .prop_map(|(size, stream)| Op::Alloc { size, stream }),
        8 => (any::<usize>(), mode()).prop_map(|(idx, mode)| Op::Free { idx, mode }),
        1 => Just(Op::ProcessSync),
        1 => Just(Op::Trim),
        1 => any::<bool>().prop_map(Op::Capture),
        // a few hits, or a thread cache's batch and more (a default budget window is 65,536
        // allocations: such batches end windows in a stream of 300 operations)
        2 => prop_oneof![3 => 1u64..64, 1 => 4096u64..40_000].prop_map(|n| Op::Hits { n }),
        1 => (1u64..3).prop_map(Op::Retire),
    ]
}

/// Run `ops` through `policy` on a checking device of `capacity` bytes; return the device.
fn exercise(policy: &mut dyn Policy, ops: &[Op], capacity: u64) -> AccountingDevice {
    exercise_with(policy, ops, capacity, &mut |_, _, _, _| {})
}

/// [`exercise`], calling `after(policy, device, live bytes by the harness's count, the
/// operation)` after every operation.
fn exercise_with(
    policy: &mut dyn Policy,
    ops: &[Op],
    capacity: u64,
    after: &mut dyn FnMut(&dyn Policy, &AccountingDevice, u64, &Op),
) -> AccountingDevice {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    let mut live: Vec<(u64, u64, u64)> = Vec::new(); // (addr, size, stream)
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => match policy.alloc(&mut dev, Request { size, stream }) {
                Ok(a) => {
                    assert!(a.size >= size, "short block");
                    assert_eq!(a.addr % 512, 0, "alignment");
                    // the block owns its usable bytes (512-B rounding, unsplit slack)
                    dev.check_alloc(a.addr, a.size, stream);
                    live.push((a.addr, size, stream));
                }
                Err(PoolError::OutOfMemory { .. }) => {}
                Err(e) => panic!("unexpected error {e}"),
            },
            Op::Free { idx, mode } => {
                if !free_at(policy, &mut dev, &mut live, idx, mode) {
                    continue;
                }
            }
            Op::ProcessSync => {
                if !dev.is_capturing() {
                    dev.process_sync();
                    policy.note_process_sync();
                }
            }
            Op::Trim => {
                policy.trim(&mut dev).unwrap();
            }
            Op::Capture(on) => dev.set_capturing(on),
            Op::Hits { n } => {
                if !live.is_empty() {
                    policy.note_aside_hits(&mut dev, n);
                }
            }
            Op::Retire(stream) => {
                policy.retire_stream(&mut dev, stream);
                dev.retire_stream(stream);
            }
        }
        assert!(dev.used() <= dev.capacity(), "device exceeded");
        let live_bytes = live.iter().map(|l| l.1).sum::<u64>();
        assert_eq!(policy.stats().live, live_bytes, "live accounting");
        after(&*policy, &dev, live_bytes, op);
    }
    dev.set_capturing(false);
    free_all_and_trim(policy, &mut dev, &mut live);
    dev
}

/// [`exercise`] on a device of `capacity` bytes, then [`assert_clean`].
fn exercise_clean(policy: &mut dyn Policy, ops: &[Op], capacity: u64) {
    let dev = exercise(policy, ops, capacity);
    assert_clean(&dev, policy);
}

/// [`exercise_clean`] with the budget check ([`budget_kept`]) after every operation.
fn exercise_clean_in_budget(policy: &mut dyn Policy, ops: &[Op], capacity: u64, b: Budget) {
    let dev = exercise_with(policy, ops, capacity, &mut budget_kept(b));
    assert_clean(&dev, policy);
}

/// One case of the random short-window test (`stitch_tight_with_short_windows_keeps_its_budget`,
/// and the shrunk streams it found): stitch with the budget of a 16-allocation window, on a
/// device of `capacity` bytes, clean and within its budget throughout.
fn short_window_case(ops: &[Op], capacity: u64) {
    let b = Budget {
        window: 16,
        ..Budget::default()
    };
    exercise_clean_in_budget(&mut Stitch::new().with_budget(Some(b)), ops, capacity, b);
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(96))]

    #[test]
    fn stitch_is_safe(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean(&mut Stitch::new(), &ops, cap_mib * MIB);
    }

    #[test]
    fn stitch_with_soft_limit_is_safe(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean(&mut Stitch::new().with_headroom(Some(0.0)), &ops, cap_mib * MIB);
    }

    /// The tight pool is as safe, and keeps its promise: whenever the device holds more of
    /// its pages than the budget (recent peak live * (1 + ratio) + slack, so never more than
    /// the all-time peak live counted by the harness * (1 + ratio) + slack), nothing is cached.
    #[test]
    fn stitch_tight_is_safe_and_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean_in_budget(&mut Stitch::tight(), &ops, cap_mib * MIB, Budget::default());
    }

    /// The same with a budget window of 16 allocations: the recent peak falls often, the
    /// pool is often above its budget, and must then give back what it can (the budget check
    /// decides what it could from the device's own record, not the pool's).
    #[test]
    fn stitch_tight_with_short_windows_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        short_window_case(&ops, cap_mib * MIB);
    }

    /// Growing its arena by runs of pages under one handle, the tight pool is as safe and
    /// keeps its budget; the checking device also sees every handle mapped, unmapped and
    /// released whole (`checker_takes_a_handle_of_several_pages_only_whole`; broken on
    /// purpose in `runs.rs`).
    #[test]
    fn stitch_tight_with_runs_is_safe_and_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean_in_budget(&mut Stitch::tight().with_runs(true), &ops, cap_mib * MIB, Budget::default());
    }

    /// With kept ranges (`Stitch::with_kept`: smaller blocks carved best fit out of the
    /// places large blocks had), the tight pool is as safe and keeps its budget (a carve
    /// over a live block is caught: `kept.rs`).
    #[test]
    fn stitch_tight_with_kept_is_safe_and_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        let mut p = Stitch::tight().with_kept(true).with_runs(cap_mib % 2 == 0);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    #[test]
    fn caching_is_safe(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean(PolicyKind::Caching.build().as_mut(), &ops, cap_mib * MIB);
    }

    #[test]
    fn direct_is_safe(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        exercise_clean(PolicyKind::Direct.build().as_mut(), &ops, cap_mib * MIB);
    }

    /// Allocation under memory pressure: whenever stitch refuses, the live bytes plus the
    /// request could not have fit in whole pages anyway or the pages are pinned; at least it
    /// never refuses while the request fits in fully free device memory.
    #[test]
    fn stitch_refuses_only_when_device_is_short(sizes in proptest::collection::vec(size(), 1..60)) {
        let cap = 512 * MIB;
        let mut dev = AccountingDevice::new(cap);
        let mut p = Stitch::new();
        for s in sizes {
            match p.alloc(&mut dev, Request { size: s, stream: 0 }) {
                Ok(_) => {}
                Err(PoolError::OutOfMemory { .. }) => {
                    // the pool holds every page it could get; pages free of live bytes cannot
                    // cover the request
                    let free_dev = cap - dev.used();
                    prop_assert!(s > free_dev, "refused {s} with {free_dev} free on the device");
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}

/// The budget check: after every operation, the pages the device holds for the pool are
/// within the budget the pool promises, or no page could be given back even with its cache
/// dissolved (with nothing cached, this is checked where the pool enforces its budget: after
/// an allocation it served or a free it took, outside capture). Nothing of it is the pool's own opinion: the budget is
/// computed from the harness's peak of live bytes, and what could be given back from the
/// checking device's record of live blocks, freed bytes, mappings and synchronizations
/// ([`AccountingDevice::releasable_pages`]). The pool's published budget must not exceed
/// the promised one.
fn budget_kept(b: Budget) -> impl FnMut(&dyn Policy, &AccountingDevice, u64, &Op) {
    BudgetCheck::new(b).into_fn()
}

/// The state [`budget_kept`] follows between operations.
struct BudgetCheck {
    b: Budget,
    /// the most bytes live so far (the harness's count)
    peak: u64,
    /// the device's bytes after the previous operation
    used_before: u64,
    /// the most the device held right after growing past the budget, in this budget window
    /// and in the one before: the pool keeps pages it was forced to take past its budget for
    /// two windows (of `b.window` allocations, rolled at the first free once that many were
    /// made since the last roll)
    forced: u64,
    prev_forced: u64,
    /// allocations made (the harness's count: live bytes grew, plus the hits a caller told
    /// the pool of), and the count at which the budget's window rolls
    allocs: u64,
    next_window: u64,
    /// allocations the pool itself served (its statistics count these only)
    pool_allocs: u64,
    /// the most bytes live in the current budget window and in the one before: the budget
    /// follows these, so it falls once use shrank for two windows (windows the caller's hits
    /// end included)
    win_peak: u64,
    prev_win_peak: u64,
    /// live bytes after the previous operation
    live_before: u64,
    /// the process synchronized and the pool has not acted on it yet: blocks freed with
    /// `cudaFree` are still pending to it (the pool sees a process's synchronization at its
    /// next allocation, or at a synchronization of its own)
    unseen_sync: bool,
    /// the process synchronized and the pool has not freed since: the pool gives pages
    /// back when it enforces its budget (at a free, or an allocation that misses its cache),
    /// so pages a process's synchronization let go may still be held until then
    unacted_sync: bool,
    /// the device's synchronizations after the previous operation
    syncs: u64,
}

impl BudgetCheck {
    fn new(b: Budget) -> Self {
        BudgetCheck {
            b,
            peak: 0,
            used_before: 0,
            forced: 0,
            prev_forced: 0,
            allocs: 0,
            next_window: b.window.max(1),
            pool_allocs: 0,
            win_peak: 0,
            prev_win_peak: 0,
            live_before: 0,
            unseen_sync: false,
            unacted_sync: false,
            syncs: 0,
        }
    }

    fn into_fn(mut self) -> impl FnMut(&dyn Policy, &AccountingDevice, u64, &Op) {
        move |p, dev, live, op| self.check(p, dev, live, op)
    }

    fn check(&mut self, p: &dyn Policy, dev: &AccountingDevice, live: u64, op: &Op) {
        self.peak = self.peak.max(live);
        let s = p.stats();
        let promised = (self.peak as f64 * (1.0 + self.b.ratio)) as u64 + self.b.slack;
        assert!(
            s.budget > 0 && s.budget <= promised,
            "budget {} B above {promised} B (peak live {} B)",
            s.budget,
            self.peak
        );
        // the budget in force: the pool's own (recent peak: it falls after two windows of
        // lower use), which may not exceed the promise
        let budget = s.budget;
        let used = dev.used();
        // the pool grows past its budget only once its cache is dissolved (it places the
        // request in the bytes it holds first): then it was forced, and keeps those pages
        // until it gives pages back
        if used > self.used_before && used > budget {
            assert!(
                s.cached == 0,
                "the device grew to {used} B past a budget of {budget} B while the pool caches {} B",
                s.cached
            );
            self.forced = self.forced.max(used);
        }
        self.used_before = used;
        self.win_peak = self.win_peak.max(live);
        // a window ends at a free, or at hits a caller told of, once a window's allocations
        // were made
        // an allocation the pool served, or a free it took (a failed allocation changes
        // nothing)
        let acted = match *op {
            Op::Alloc { .. } => live > self.live_before,
            Op::Free { .. } => live < self.live_before,
            _ => false,
        };
        let window_may_end = match *op {
            Op::Alloc { .. } if live > self.live_before => {
                self.allocs += 1;
                self.pool_allocs += 1;
                false
            }
            Op::Free { .. } => live < self.live_before,
            Op::Hits { n } if live > 0 => {
                self.allocs += n;
                true
            }
            _ => false,
        };
        let window_ended = window_may_end && self.allocs >= self.next_window;
        if window_ended {
            self.prev_forced = self.forced;
            self.forced = 0;
            self.prev_win_peak = self.win_peak;
            self.win_peak = live;
            self.next_window = self.allocs + self.b.window.max(1);
        }
        self.live_before = live;
        assert_eq!(
            s.allocs, self.pool_allocs,
            "the pool counts {} allocations where it served {} (a caller's hits are no allocations of the pool's)",
            s.allocs, self.pool_allocs
        );
        let recent = self.win_peak.max(self.prev_win_peak).max(live);
        let recent_promise = (recent as f64 * (1.0 + self.b.ratio)) as u64 + self.b.slack;
        assert!(
            s.budget <= recent_promise,
            "budget {} B above {recent_promise} B (peak live {recent} B over this budget window and the one before)",
            s.budget
        );
        let syncs = dev.calls().syncs();
        match op {
            Op::ProcessSync if !dev.is_capturing() => {
                self.unseen_sync = true;
                self.unacted_sync = true;
            }
            Op::Alloc { .. } => self.unseen_sync = false,
            Op::Free { .. } => self.unacted_sync = false,
            // a trim during capture does nothing (it may not synchronize or release)
            Op::Trim if !dev.is_capturing() => self.unacted_sync = false,
            // a window the hits end is enforced as at a free
            Op::Hits { .. } if window_ended => self.unacted_sync = false,
            _ => {}
        }
        if (matches!(op, Op::Trim) && !dev.is_capturing()) || syncs != self.syncs {
            // the pool's own synchronization (or a trim's) releases its pending blocks at once
            self.unseen_sync = false;
        }
        self.syncs = syncs;
        // above the budget (and above what it was lately forced to take) the pool caches only
        // where dissolving its cache would give nothing back; and with nothing cached, an
        // allocation it served or a free it took (outside capture, where it may release
        // nothing) left no page it could give back
        let keep = budget.max(self.forced).max(self.prev_forced);
        let enforced = s.cached > 0 || (acted && !dev.is_capturing());
        if used > keep && enforced && !self.unacted_sync {
            let idle = dev.releasable_pages(self.unseen_sync);
            assert!(
                idle.is_empty(),
                "the device holds {used} B for a budget of {budget} B (forced {} B) with {} B cached, and {} of its pages could be given back (after {op:?})",
                self.forced.max(self.prev_forced),
                s.cached,
                idle.len()
            );
        }
        assert_eq!(s.reserved, used, "reserved is the device's count");
    }
}

// ---------------------------------------------------------------- repeated rounds

/// Sizes a repeated workload makes again and again (the tight pool replays the places of the
/// previous round per size and rank: a size seen once is never replayed).
fn round_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(4 * KIB),
        Just(100 * KIB),
        Just(MIB),
        Just(3 * MIB + 300 * KIB),
        Just(7 * MIB),
        Just(20 * MIB),
        Just(45 * MIB),
    ]
}

/// One round: allocations and frees, then everything freed (the tight pool ends its round
/// when nothing is live).
fn round() -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![
        10 => (round_size(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => (any::<usize>(), mode()).prop_map(|(idx, mode)| Op::Free { idx, mode }),
        1 => Just(Op::ProcessSync),
        1 => any::<bool>().prop_map(Op::Capture),
    ];
    (proptest::collection::vec(step, 60..200), mode()).prop_map(|(mut ops, mode)| {
        ops.push(Op::Capture(false));
        // enough frees for every allocation of the round (a free with nothing live is skipped)
        ops.extend((0..200).map(|_| Op::Free { idx: 0, mode }));
        ops
    })
}

/// `base` as a later round makes it, not quite the same: `bits` drop some allocations, move
/// some to another stream and change some frees' semantics.
fn varied(base: &[Op], bits: &[u8]) -> Vec<Op> {
    base.iter()
        .zip(bits.iter().cycle())
        .filter_map(|(op, &b)| match (op, b % 8) {
            (Op::Alloc { .. }, 0) => None,
            (&Op::Alloc { size, stream }, 1) => Some(Op::Alloc {
                size,
                stream: (stream + 1) % 3,
            }),
            (&Op::Free { idx, .. }, 2) => Some(Op::Free {
                idx,
                mode: FreeMode::Sync,
            }),
            (&Op::Free { idx, .. }, 3) => Some(Op::Free {
                idx,
                mode: FreeMode::Async {
                    stream: u64::from(b / 8) % 3,
                },
            }),
            (op, _) => Some(op.clone()),
        })
        .collect()
}

/// A repeated workload: one round made `repeats` times, every third time varied.
fn rounds() -> impl Strategy<Value = Vec<Op>> {
    (
        round(),
        6usize..14,
        proptest::collection::vec(any::<u8>(), 1..64),
    )
        .prop_map(|(base, repeats, bits)| {
            let mut ops = Vec::new();
            for r in 0..repeats {
                if r % 3 == 2 {
                    let shifted: Vec<u8> = bits.iter().map(|b| b.wrapping_add(r as u8)).collect();
                    ops.extend(varied(&base, &shifted));
                } else {
                    ops.extend(base.iter().cloned());
                }
            }
            ops
        })
}

/// A job that is never idle repeating a layer: one block live throughout (the weights, never
/// freed: the frees of a layer find a block among the layer's own), then a layer's steps
/// (allocations of the round sizes, frees of the layer's blocks, some living into the next
/// layer) repeated, some repeats varied (see `varied`), then everything freed. Within it the
/// tight pool has one long round, so with `Stitch::with_layers` its layer replay acts.
fn layers() -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![
        10 => (round_size(), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        7 => (1usize..64, mode()).prop_map(|(idx, mode)| Op::Free { idx, mode }),
        1 => Just(Op::ProcessSync),
    ];
    (
        proptest::collection::vec(step, 10..60),
        4usize..12,
        proptest::collection::vec(any::<u8>(), 1..64),
        mode(),
    )
        .prop_map(|(body, repeats, bits, mode)| {
            // the weights: the first live block, kept at index 0 while other blocks live
            // (`free_at` swaps the last live block into a freed one's index; a free of index
            // 0 is never drawn, and index `idx % len` is 0 only when `len` divides `idx`)
            let mut ops = vec![Op::Alloc {
                size: 20 * MIB,
                stream: 0,
            }];
            for r in 0..repeats {
                if r % 4 == 3 {
                    let shifted: Vec<u8> = bits.iter().map(|b| b.wrapping_add(r as u8)).collect();
                    ops.extend(varied(&body, &shifted));
                } else {
                    ops.extend(body.iter().cloned());
                }
            }
            ops.extend((0..200 * repeats).map(|_| Op::Free { idx: 0, mode }));
            ops
        })
}

/// `n` draws of [`layers`] from a fixed seed (the same on every run).
fn drawn_layers(n: usize) -> Vec<Vec<Op>> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n)
        .map(|_| layers().new_tree(&mut runner).unwrap().current())
        .collect()
}

/// `n` draws of [`rounds`] from a fixed seed (the same on every run).
fn drawn_rounds(n: usize) -> Vec<Vec<Op>> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n)
        .map(|_| rounds().new_tree(&mut runner).unwrap().current())
        .collect()
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(64))]

    /// The tight pool's round replay (a later round takes the places of the round before,
    /// dissolving cached blocks there and synchronizing for `cudaFree`d ones) is as safe as
    /// the rest of the pool on rounds that repeat and rounds that differ: no overlap, no early
    /// reuse, the device and the budget kept. `Faults::replay_unsynced` shows the checks
    /// catch a replay that skips its synchronization
    /// (`checker_catches_a_replay_without_its_synchronization`).
    #[test]
    fn stitch_tight_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        exercise_clean_in_budget(&mut Stitch::tight(), &ops, cap_mib * MIB, Budget::default());
    }

    /// The same with kept ranges (`Stitch::with_kept`).
    #[test]
    fn stitch_tight_with_kept_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_kept(true);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// The layer replay (`Stitch::with_layers`: a repeated sequence of large requests
    /// within one round takes the places of two periods before, or of one period before)
    /// is as safe on layers that repeat and layers that differ: no overlap, no early reuse,
    /// the device and the budget kept (a replayed place taken over a live block is caught:
    /// `checker_catches_a_layer_place_over_a_live_block`).
    #[test]
    fn stitch_tight_with_layers_replays_layers_safely(ops in layers(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_layers(true).with_runs(cap_mib % 2 == 0);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// The same on rounds (the layer replay within each round, the round replay across).
    #[test]
    fn stitch_tight_with_layers_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_layers(true);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// The layer replay's holds (`Stitch::with_layer_holds`: a large allocation that gets
    /// no place of the sequence keeps out of the places the next ones will take) are as
    /// safe on layers: no overlap, no early reuse, the device and the budget kept (a hold
    /// over a live block is caught: `checker_catches_a_hold_over_a_live_block`).
    #[test]
    fn stitch_tight_with_layer_holds_replays_layers_safely(ops in layers(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_layer_holds(true).with_runs(cap_mib % 2 == 0);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// Mappings that grow in place (`Stitch::with_grow`: a larger request maps only the
    /// pages missing at an unused mapping's end) are as safe on layers and on rounds: no
    /// overlap, no early reuse, the device and the budget kept (a mapping grown over a live
    /// block is caught: `checker_catches_a_mapping_grown_over_a_live_block`).
    #[test]
    fn stitch_tight_growing_in_place_is_safe_on_layers(ops in layers(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_grow(true).with_layers(cap_mib % 2 == 0);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// The same on rounds.
    #[test]
    fn stitch_tight_growing_in_place_is_safe_on_rounds(ops in rounds(), cap_mib in 128u64..1024) {
        let mut p = Stitch::tight().with_grow(true);
        let dev = exercise_with(&mut p, &ops, cap_mib * MIB, &mut budget_kept(Budget::default()));
        assert_clean(&dev, &p);
    }

    /// The same with the arena grown by runs of pages (`Stitch::with_runs`).
    #[test]
    fn stitch_tight_with_runs_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        exercise_clean_in_budget(&mut Stitch::tight().with_runs(true), &ops, cap_mib * MIB, Budget::default());
    }

    /// Handles sized per request (`Stitch::with_shapes`: a large request's new pages as one
    /// handle or as power-of-two handles, new mappings starting and ending in the free ends
    /// of handles mapped whole) are as safe: no overlap, no early reuse, every handle mapped,
    /// unmapped and released whole, the device and the budget kept (a block below a handle's
    /// free end is caught: `shapes.rs`).
    #[test]
    fn stitch_tight_with_shapes_is_safe_and_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        let shapes = if cap_mib % 2 == 0 { Shapes::Request } else { Shapes::Pow2 };
        exercise_clean_in_budget(&mut Stitch::tight().with_shapes(shapes), &ops, cap_mib * MIB, Budget::default());
    }

    /// The same on layers (the layer replay on).
    #[test]
    fn stitch_tight_with_shapes_replays_layers_safely(ops in layers(), cap_mib in 128u64..1024) {
        let shapes = if cap_mib % 2 == 0 { Shapes::Request } else { Shapes::Pow2 };
        exercise_clean_in_budget(&mut Stitch::tight().with_shapes(shapes), &ops, cap_mib * MIB, Budget::default());
    }

    /// The same on rounds.
    #[test]
    fn stitch_tight_with_shapes_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        let shapes = if cap_mib % 2 == 0 { Shapes::Request } else { Shapes::Pow2 };
        exercise_clean_in_budget(&mut Stitch::tight().with_shapes(shapes), &ops, cap_mib * MIB, Budget::default());
    }

    /// The shape guard (`Stitch::with_shape_guard`) on handles sized per request: random
    /// streams on the checking device with the budget check, clean.
    #[test]
    fn stitch_tight_with_shapes_and_guard_is_safe_and_keeps_its_budget(ops in proptest::collection::vec(op(), 1..300), cap_mib in 64u64..1024) {
        let p = Stitch::tight().with_shapes(Shapes::Request).with_shape_guard(true);
        exercise_clean_in_budget(&mut { p }, &ops, cap_mib * MIB, Budget::default());
    }

    /// The same on layers (the layer replay on).
    #[test]
    fn stitch_tight_with_shapes_and_guard_replays_layers_safely(ops in layers(), cap_mib in 128u64..1024) {
        let p = Stitch::tight().with_shapes(Shapes::Request).with_shape_guard(true);
        exercise_clean_in_budget(&mut { p }, &ops, cap_mib * MIB, Budget::default());
    }

    /// The same on rounds.
    #[test]
    fn stitch_tight_with_shapes_and_guard_replays_rounds_safely(ops in rounds(), cap_mib in 128u64..1024) {
        let p = Stitch::tight().with_shapes(Shapes::Request).with_shape_guard(true);
        exercise_clean_in_budget(&mut { p }, &ops, cap_mib * MIB, Budget::default());
    }
}

/// The rounds of `stitch_tight_replays_rounds_safely`, drawn from a fixed seed, through a
/// tight pool whose replay takes places that `cudaFree`d blocks hold without synchronizing:
/// the checking device sees early reuse in some of them (and none without the fault, where
/// most of them replay places: `Stitch::replays`).
#[test]
fn checker_catches_a_replay_without_its_synchronization() {
    let (mut caught, mut clean, mut replayed) = (0, 0, 0);
    for ops in drawn_rounds(64) {
        for broken in [false, true] {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                replay_unsynced: broken,
                ..Faults::default()
            });
            let dev = exercise(&mut p, &ops, GIB);
            let early = dev
                .violations()
                .iter()
                .filter(|v| v.contains("early reuse"))
                .count();
            if broken {
                caught += usize::from(early > 0);
            } else {
                assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
                clean += 1;
                replayed += usize::from(p.replays() > 0);
            }
        }
    }
    eprintln!("{replayed} of 64 replayed a place, {caught} caught with the fault");
    assert_eq!(clean, 64);
    // the rounds exercise the replay: most of them replay places
    assert!(replayed > 32, "{replayed} of 64 replayed a place");
    assert!(
        caught > 0,
        "no replay without its synchronization was caught"
    );
}

/// `ops` through `policy` on a checking device of `capacity` bytes until the device sees a
/// block overlap another (a block handed out over a live one: the run stops there, as the
/// pool's own record of that address is then the new block's); whether it did.
fn overlaps_before_the_end(policy: &mut dyn Policy, ops: &[Op], capacity: u64) -> bool {
    let mut dev = AccountingDevice::new(capacity);
    dev.set_checking(true);
    let mut live: Vec<(u64, u64, u64)> = Vec::new();
    let seen = |dev: &AccountingDevice| {
        dev.violations()
            .iter()
            .any(|v| v.contains("overlap") || v.contains("handed out twice"))
    };
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => {
                if let Ok(a) = policy.alloc(&mut dev, Request { size, stream }) {
                    dev.check_alloc(a.addr, a.size, stream);
                    live.push((a.addr, size, stream));
                }
            }
            Op::Free { idx, mode } => {
                free_at(policy, &mut dev, &mut live, idx, mode);
            }
            Op::ProcessSync => {
                dev.process_sync();
                policy.note_process_sync();
            }
            _ => {}
        }
        if seen(&dev) {
            return true;
        }
    }
    false
}

/// Drawn cases through tight pools with a rule on and off, with and without a fault.
struct Caught {
    /// cases where the rule acted (`acted`), the pool without the fault
    acted: usize,
    /// cases where the checking device saw a block overlap another with the fault, the rule
    /// on and off
    on: usize,
    off: usize,
}

/// Each of `draws` through `pool(true)` (the rule on) without a fault: clean on the checking
/// device (asserted), and whether the rule acted; then through `pool(true)` and `pool(false)`
/// with `broken`: whether the checking device saw an overlap before the end.
fn caught(
    draws: Vec<Vec<Op>>,
    pool: fn(bool) -> Stitch,
    acted: fn(&Stitch) -> bool,
    broken: Faults,
) -> Caught {
    let mut c = Caught {
        acted: 0,
        on: 0,
        off: 0,
    };
    for ops in draws {
        let mut p = pool(true);
        let dev = exercise(&mut p, &ops, GIB);
        assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
        c.acted += usize::from(acted(&p));
        for (on, n) in [(true, &mut c.on), (false, &mut c.off)] {
            let mut p = pool(on);
            p.set_faults(broken);
            *n += usize::from(overlaps_before_the_end(&mut p, &ops, GIB));
        }
    }
    c
}

/// Drawn layers (`layers`) through a tight pool with the layer replay, with and without
/// `Faults::replay_over_live` (a remembered place taken even where a live block lies): with
/// it the checking device sees overlaps in some of them; without it none, and most of them
/// replay places of earlier layers (`Stitch::layer_replays`). The same switch without layers
/// takes only the round replay's places (rounds end where the weights happen to be freed)
/// over live blocks: fewer are caught.
#[test]
fn checker_catches_a_layer_place_over_a_live_block() {
    let broken = Faults {
        replay_over_live: true,
        ..Faults::default()
    };
    let c = caught(
        drawn_layers(64),
        |on| Stitch::tight().with_layers(on),
        |p| p.layer_replays() > 0,
        broken,
    );
    eprintln!(
        "{} of 64 replayed a layer's place, {} caught with the fault ({} without layers)",
        c.acted, c.on, c.off
    );
    assert!(c.acted > 32, "{} of 64 replayed a layer's place", c.acted);
    assert!(
        c.on > c.off,
        "no layer place over a live block was caught ({}, {} without layers)",
        c.on,
        c.off
    );
}

/// Drawn layers through a tight pool with the layer replay's holds, with and without
/// `Faults::hold_over_live` (a hold takes a remembered place where a live block lies, and
/// gives its bytes back as free): without it all are clean and some place an allocation
/// outside held places (`Stitch::layer_holds`); with it the checking device sees overlaps in
/// some, and in none with the holds off.
#[test]
fn checker_catches_a_hold_over_a_live_block() {
    let broken = Faults {
        hold_over_live: true,
        ..Faults::default()
    };
    let c = caught(
        drawn_layers(64),
        |on| Stitch::tight().with_layer_holds(on),
        |p| p.layer_holds() > 0,
        broken,
    );
    eprintln!(
        "{} of 64 placed an allocation outside held places, {} caught with the fault ({} with \
         the holds off)",
        c.acted, c.on, c.off
    );
    assert!(c.acted > 0, "no draw held a place");
    assert_eq!(c.off, 0, "the fault acted with the holds off");
    assert!(c.on > 0, "no hold over a live block was caught");
}

/// Drawn layers through a tight pool with handles sized per request and the shape guard,
/// with and without `Faults::guard_over_live` (a block the arena places at a window's end,
/// where the guard looks there, one `ALIGN` higher, over the block after the window):
/// without it all are clean and the guard names places to keep clear in some
/// (`Stitch::guard_looks`); with it the checking device sees overlaps in some, and in none
/// with the guard off.
#[test]
fn checker_catches_a_guarded_window_over_a_live_block() {
    let broken = Faults {
        guard_over_live: true,
        ..Faults::default()
    };
    let c = caught(
        drawn_layers(64),
        |on| {
            Stitch::tight()
                .with_shapes(Shapes::Request)
                .with_shape_guard(on)
        },
        |p| p.guard_looks() > 0,
        broken,
    );
    eprintln!(
        "{} of 64 had the guard name places, {} caught with the fault ({} with the guard off)",
        c.acted, c.on, c.off
    );
    assert!(c.acted > 0, "the guard never named a place");
    assert_eq!(c.off, 0, "the fault acted with the guard off");
    assert!(c.on > 0, "no guarded window over a live block was caught");
}

/// Drawn layers and rounds through a tight pool growing mappings in place, with and without
/// `Faults::grow_over_live` (live and pending blocks in a mapping's pages taken for cached
/// ones): without it all are clean and some grow a mapping (`Stitch::grows`); with it the
/// checking device sees overlaps in some, and in none with the rule off.
#[test]
fn checker_catches_a_mapping_grown_over_a_live_block() {
    let broken = Faults {
        grow_over_live: true,
        ..Faults::default()
    };
    let draws = drawn_layers(64)
        .into_iter()
        .chain(drawn_rounds(64))
        .collect();
    let c = caught(
        draws,
        |on| Stitch::tight().with_grow(on),
        |p| p.grows() > 0,
        broken,
    );
    eprintln!(
        "{} of 128 grew a mapping in place, {} caught with the fault ({} with the rule off)",
        c.acted, c.on, c.off
    );
    assert!(c.acted > 0, "no draw grew a mapping in place");
    assert_eq!(c.off, 0, "the fault acted with the rule off");
    assert!(c.on > 0, "no mapping grown over a live block was caught");
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(64))]

    /// The same rounds on devices they nearly fill (48-160 MiB for blocks of up to 45 MiB):
    /// the tight pool also re-forms mappings its rounds' places are in there
    /// (`stitch/pressure.rs`) and places blocks of more than a page on page ends
    /// (`stitch/ends.rs`), and stays as safe, within the device and its budget.
    #[test]
    fn stitch_tight_replays_rounds_safely_near_the_limit(ops in rounds(), cap_mib in 48u64..160) {
        exercise_clean_in_budget(&mut Stitch::tight(), &ops, cap_mib * MIB, Budget::default());
    }
}

/// The rounds of `stitch_tight_replays_rounds_safely_near_the_limit`, drawn from a fixed
/// seed, on a 96 MiB device: without a fault some re-form a round's mapping under pressure
/// and all are clean; with `Faults::pressure_reform_used` (a round's mapping re-formed while
/// blocks use it) the checking device or the pool's own books catch the moved bytes in some.
#[test]
fn checker_catches_reforming_a_used_mapping_under_pressure() {
    let (mut caught, mut reformed) = (0, 0);
    for ops in drawn_rounds(64) {
        for broken in [false, true] {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                pressure_reform_used: broken,
                ..Faults::default()
            });
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                exercise(&mut p, &ops, 96 * MIB)
            }));
            if broken {
                caught += usize::from(run.map_or(true, |d| !d.violations().is_empty()));
            } else {
                let dev = run.unwrap();
                assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
                reformed += usize::from(p.pressure_reforms() > 0);
            }
        }
    }
    eprintln!(
        "{reformed} of 64 re-formed a round's mapping under pressure, {caught} caught with the fault"
    );
    assert!(reformed > 0, "no round re-formed a mapping under pressure");
    assert!(caught > 0, "no re-forming of a used mapping was caught");
}

/// The same drawn rounds on a 96 MiB device: without a fault some place blocks of more than a
/// page on page ends near the limit (`stitch/ends.rs`, which synchronizes before it reuses
/// the bytes of `cudaFree`d blocks) and all are clean; with `Faults::ends_unsynced` (those
/// blocks released without the synchronization) the checking device sees early reuse in
/// some.
#[test]
fn checker_catches_page_ends_reused_before_the_synchronization() {
    let (mut caught, mut placed) = (0, 0);
    for ops in drawn_rounds(64) {
        for broken in [false, true] {
            let mut p = Stitch::tight();
            p.set_faults(Faults {
                ends_unsynced: broken,
                ..Faults::default()
            });
            let dev = exercise(&mut p, &ops, 96 * MIB);
            if broken {
                caught += usize::from(!dev.violations().is_empty());
            } else {
                assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
                placed += usize::from(p.ends_places() > 0);
            }
        }
    }
    eprintln!("{placed} of 64 placed blocks on page ends, {caught} caught with the fault");
    assert!(placed > 0, "no round placed a block on page ends");
    assert!(caught > 0, "no early reuse of page ends was caught");
}

// ---------------------------------------------------------------- the checker can fail

/// Shapes that never repeat: a caching pool grows past its budget with the old shapes cached.
fn shifting_shapes() -> Vec<Op> {
    let mut ops = Vec::new();
    for round in 0..12u64 {
        for k in 0..4u64 {
            ops.push(Op::Alloc {
                size: (3 + round) * MIB + k * 300 * KIB,
                stream: 0,
            });
        }
        for _ in 0..4 {
            ops.push(Op::Free {
                idx: 0,
                mode: FreeMode::Async { stream: 0 },
            });
        }
    }
    ops
}

#[test]
fn budget_check_catches_a_pool_over_its_budget() {
    for broken in [false, true] {
        let mut p = Stitch::tight();
        p.set_faults(Faults {
            ignore_budget: broken,
            ..Faults::default()
        });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exercise_with(
                &mut p,
                &shifting_shapes(),
                GIB,
                &mut budget_kept(Budget::default()),
            )
        }));
        match (broken, r) {
            (false, Ok(dev)) => assert_clean(&dev, &p),
            (true, Err(e)) => {
                let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(msg.contains("budget"), "{msg}");
            }
            (broken, r) => panic!("broken {broken}: {:?}", r.is_ok()),
        }
    }
}

/// Where the jobs below begin, before their use shrinks: four 64 MiB blocks, then their frees
/// (stream-ordered on stream 0).
fn large_blocks_freed() -> Vec<Op> {
    let mut ops = Vec::new();
    for _ in 0..4 {
        ops.push(Op::Alloc {
            size: 64 * MIB,
            stream: 0,
        });
    }
    for _ in 0..4 {
        ops.push(Op::Free {
            idx: 0,
            mode: FreeMode::Async { stream: 0 },
        });
    }
    ops
}

/// A job whose use shrinks to a loop a caller in front of the pool serves whole: four
/// 64 MiB blocks freed and a synchronization, then one 8 KiB block live while the caller
/// serves two default budget
/// windows of hits (its thread cache's batches of 4096, told to the pool as they fill).
fn shrinking_to_hits() -> Vec<Op> {
    let mut ops = large_blocks_freed();
    ops.push(Op::ProcessSync);
    ops.push(Op::Alloc {
        size: 8 * KIB,
        stream: 0,
    });
    let window = Budget::default().window;
    for _ in 0..(2 * window).div_ceil(4096) {
        ops.push(Op::Hits { n: 4096 });
    }
    ops
}

/// Hits that end budget windows are checked as the pool's own allocations are: the pool's
/// budget falls with them and the pages above it go back (the pool then holds a few MiB
/// where it held 256), while its statistics count only what it served. A pool that counts
/// the hits as its allocations, or ends the windows they complete without keeping its
/// budget, is caught.
#[test]
fn budget_check_catches_hits_miscounted_or_unkept() {
    let cases = [
        (Faults::default(), ""),
        (
            Faults {
                hits_as_allocs: true,
                ..Faults::default()
            },
            "allocations",
        ),
        (
            Faults {
                hits_roll_unkept: true,
                ..Faults::default()
            },
            "budget",
        ),
    ];
    for (faults, caught) in cases {
        let mut p = Stitch::tight();
        p.set_faults(faults);
        let mut last_reserved = 0;
        let mut check = budget_kept(Budget::default());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exercise_with(
                &mut p,
                &shrinking_to_hits(),
                GIB,
                &mut |p, dev, live, op| {
                    check(p, dev, live, op);
                    last_reserved = p.stats().reserved;
                },
            )
        }));
        match (caught, r) {
            ("", Ok(dev)) => {
                assert_clean(&dev, &p);
                assert!(
                    last_reserved <= 4 * MIB,
                    "{last_reserved} B held for 8 KiB live"
                );
            }
            (caught, Err(e)) if !caught.is_empty() => {
                let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(msg.contains(caught), "{faults:?}: {msg}");
            }
            (_, r) => panic!("{faults:?}: ran through: {}", r.is_ok()),
        }
    }
}

/// A job whose use shrinks: four 64 MiB blocks, then (after a synchronization) two budget
/// windows of 100 KiB pairs, and a synchronization again.
fn shrinking_use() -> Vec<Op> {
    let mut ops = large_blocks_freed();
    for round in 0..2 {
        ops.push(Op::ProcessSync);
        for _ in 0..40 {
            ops.push(Op::Alloc {
                size: 100 * KIB + round * 512,
                stream: 0,
            });
            ops.push(Op::Free {
                idx: 0,
                mode: FreeMode::Async { stream: 0 },
            });
        }
    }
    ops
}

/// A tight pool that also holds one page it never uses, and says it could give nothing back
/// (what a pool whose test of "could a page go back" were wrong would say). Everything else
/// it passes on to the pool it wraps, which then acts as it would alone.
struct HoardsAPage {
    inner: Stitch,
    /// false: the plain tight pool
    hoard: bool,
    page: Option<vramshim_pool::Handle>,
    gran: u64,
}

impl Policy for HoardsAPage {
    fn name(&self) -> &'static str {
        "hoards-a-page"
    }
    fn alloc(
        &mut self,
        dev: &mut dyn Device,
        req: Request,
    ) -> Result<vramshim_pool::Alloc, PoolError> {
        if self.hoard && self.page.is_none() {
            self.page = Some(dev.create(1).unwrap());
            self.gran = dev.granularity();
        }
        self.inner.alloc(dev, req)
    }
    fn free(&mut self, dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError> {
        self.inner.free(dev, addr, mode)
    }
    fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError> {
        if let Some(h) = self.page.take() {
            dev.release(h, 1).unwrap();
        }
        self.inner.trim(dev)
    }
    fn note_process_sync(&mut self) {
        self.inner.note_process_sync()
    }
    fn owns(&self, addr: u64) -> bool {
        self.inner.owns(addr)
    }
    fn contains(&self, addr: u64) -> bool {
        self.inner.contains(addr)
    }
    fn stats(&self) -> vramshim_pool::Stats {
        let mut s = self.inner.stats();
        if self.page.is_some() {
            s.reserved += self.gran;
        }
        s
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn pinned_above_budget(&self) -> bool {
        true
    }
    fn note_aside_hits(&mut self, dev: &mut dyn Device, n: u64) {
        self.inner.note_aside_hits(dev, n)
    }
    fn round_end_watch(&self) -> u64 {
        self.inner.round_end_watch()
    }
    fn retire_stream(&mut self, dev: &mut dyn Device, stream: vramshim_pool::Stream) {
        self.inner.retire_stream(dev, stream)
    }
    fn aside_below(&self) -> u64 {
        self.inner.aside_below()
    }
    fn aside_run(&self) -> u64 {
        self.inner.aside_run()
    }
    fn thread_caches(&self) -> bool {
        self.inner.thread_caches()
    }
}

/// The budget check decides what a pool could give back from the device's own record: a pool
/// that holds an unused page above its budget while it caches blocks, and says that nothing
/// could go back, is caught (a check that asked the pool would pass it); the same pool without
/// the page passes.
#[test]
fn budget_check_sees_a_page_the_pool_says_it_cannot_give_back() {
    let b = Budget {
        window: 16,
        ..Budget::default()
    };
    for hoard in [false, true] {
        let mut p = HoardsAPage {
            inner: Stitch::new().with_budget(Some(b)),
            hoard,
            page: None,
            gran: 0,
        };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            exercise_with(&mut p, &shrinking_use(), GIB, &mut budget_kept(b))
        }));
        match (hoard, r) {
            (false, Ok(dev)) => assert!(dev.violations().is_empty(), "{:?}", dev.violations()),
            (true, Err(e)) => {
                let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(msg.contains("could be given back"), "{msg}");
            }
            (hoard, r) => panic!("hoard {hoard}: {:?}", r.is_ok()),
        }
    }
}

/// A block freed on stream 1, stream 1 destroyed, and a block of the same size asked for on
/// the stream created next with the same handle (one block live throughout).
fn reuse_after_retirement() -> Vec<Op> {
    let alloc = |size| Op::Alloc { size, stream: 1 };
    vec![
        alloc(64 * KIB),
        alloc(4 * MIB),
        Op::Free {
            idx: 1,
            mode: FreeMode::Async { stream: 1 },
        },
        Op::Retire(1),
        alloc(4 * MIB),
    ]
}

/// The stream retirements reach the pool `HoardsAPage` wraps: through it the tight pool orders
/// a retired stream's free for the new stream (clean), and a pool that ignores the
/// retirement (`Faults::ignore_retired`) is caught reusing the block early.
#[test]
fn hoards_a_page_passes_stream_retirements_on() {
    for hoard in [false, true] {
        for ignore_retired in [false, true] {
            let mut inner = Stitch::tight();
            inner.set_faults(Faults {
                ignore_retired,
                ..Faults::default()
            });
            let mut p = HoardsAPage {
                inner,
                hoard,
                page: None,
                gran: 0,
            };
            let dev = exercise(&mut p, &reuse_after_retirement(), GIB);
            let early = dev
                .violations()
                .iter()
                .any(|v| v.starts_with("early reuse"));
            assert_eq!(
                early,
                ignore_retired,
                "hoard {hoard}, ignore_retired {ignore_retired}: {:?}",
                dev.violations()
            );
        }
    }
}

fn one_dev() -> AccountingDevice {
    let mut d = AccountingDevice::new(GIB);
    d.set_checking(true);
    d
}

#[test]
fn checker_catches_early_reuse_of_cudafree() {
    for broken in [false, true] {
        let mut dev = one_dev();
        let mut p = Stitch::new();
        p.set_faults(Faults {
            reuse_sync_frees_early: broken,
            ..Faults::default()
        });
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 4 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 4 * MIB, 0);
        dev.check_free(a.addr, FreeMode::Sync);
        p.free(&mut dev, a.addr, FreeMode::Sync).unwrap();
        let b = p
            .alloc(
                &mut dev,
                Request {
                    size: 4 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(b.addr, 4 * MIB, 0);
        if broken {
            assert_eq!(b.addr, a.addr, "fault switch must reuse at once");
            assert!(
                dev.violations().iter().any(|v| v.contains("early reuse")),
                "{:?}",
                dev.violations()
            );
        } else {
            assert!(dev.violations().is_empty(), "{:?}", dev.violations());
            // reused only behind the one synchronization that covers it
            assert!(b.addr != a.addr || p.stats().syncs == 1);
        }
    }
}

#[test]
fn cudafree_block_reused_after_one_sync() {
    let mut dev = AccountingDevice::new(8 * MIB);
    dev.set_checking(true);
    let mut p = Stitch::new();
    let mut addrs = Vec::new();
    for _ in 0..3 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 2 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 2 * MIB, 0);
        addrs.push(a.addr);
    }
    for &a in &addrs {
        dev.check_free(a, FreeMode::Sync);
        p.free(&mut dev, a, FreeMode::Sync).unwrap();
    }
    // the device has 4 pages: 3 held pending; 3 more blocks need one sync, not three
    for _ in 0..3 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 2 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 2 * MIB, 0);
    }
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert_eq!(p.stats().syncs, 1, "one sync releases every pending free");
    // the process's own sync counts: no pool sync needed afterwards
    let mut dev = AccountingDevice::new(4 * MIB);
    let mut p = Stitch::new();
    let a = p
        .alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    p.free(&mut dev, a.addr, FreeMode::Sync).unwrap();
    dev.process_sync();
    p.note_process_sync();
    let b = p
        .alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    assert_eq!(b.addr, a.addr);
    assert_eq!(p.stats().syncs, 0);
}

#[test]
fn checker_catches_cross_stream_reuse_without_event() {
    for broken in [false, true] {
        let mut dev = one_dev();
        let mut p = Stitch::new();
        p.set_faults(Faults {
            ignore_streams: broken,
            ..Faults::default()
        });
        // two streams seen: frees record events
        let x = p
            .alloc(
                &mut dev,
                Request {
                    size: 512,
                    stream: 7,
                },
            )
            .unwrap();
        dev.check_alloc(x.addr, 512, 7);
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 3 * MIB,
                    stream: 1,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 3 * MIB, 1);
        dev.check_free(a.addr, FreeMode::Async { stream: 1 });
        p.free(&mut dev, a.addr, FreeMode::Async { stream: 1 })
            .unwrap();
        let b = p
            .alloc(
                &mut dev,
                Request {
                    size: 3 * MIB,
                    stream: 2,
                },
            )
            .unwrap();
        dev.check_alloc(b.addr, 3 * MIB, 2);
        assert_eq!(b.addr, a.addr, "reused across streams");
        if broken {
            assert!(
                dev.violations().iter().any(|v| v.contains("early reuse")),
                "{:?}",
                dev.violations()
            );
        } else {
            assert!(dev.violations().is_empty(), "{:?}", dev.violations());
            assert_eq!(p.stats().stream_waits, 1, "ordered by cudaStreamWaitEvent");
            assert_eq!(p.stats().syncs, 0, "no host synchronization");
        }
    }
}

#[test]
fn same_stream_async_reuse_is_immediate() {
    let mut dev = one_dev();
    let mut p = Stitch::new();
    let a = p
        .alloc(
            &mut dev,
            Request {
                size: 5 * MIB,
                stream: 3,
            },
        )
        .unwrap();
    dev.check_alloc(a.addr, 5 * MIB, 3);
    dev.check_free(a.addr, FreeMode::Async { stream: 3 });
    p.free(&mut dev, a.addr, FreeMode::Async { stream: 3 })
        .unwrap();
    let calls = dev.calls();
    let b = p
        .alloc(
            &mut dev,
            Request {
                size: 5 * MIB,
                stream: 3,
            },
        )
        .unwrap();
    dev.check_alloc(b.addr, 5 * MIB, 3);
    assert_eq!(b.addr, a.addr);
    assert_eq!(
        dev.calls(),
        calls,
        "a cache hit makes no device call at all"
    );
    assert!(dev.violations().is_empty());
}

#[test]
fn checker_catches_physical_overlap() {
    for broken in [false, true] {
        let mut dev = one_dev();
        let mut p = Stitch::new();
        p.set_faults(Faults {
            skip_take: broken,
            ..Faults::default()
        });
        for _ in 0..4 {
            let a = p
                .alloc(
                    &mut dev,
                    Request {
                        size: 100 * KIB,
                        stream: 0,
                    },
                )
                .unwrap();
            dev.check_alloc(a.addr, 100 * KIB, 0);
        }
        let found = dev
            .violations()
            .iter()
            .any(|v| v.contains("overlap") || v.contains("twice"));
        assert_eq!(found, broken, "{:?}", dev.violations());
    }
}

#[test]
fn head_and_tail_share_pages_without_overlap() {
    // 3 MiB blocks: each takes 1.5 pages; pairs share a page (suffix of one, prefix of another)
    let mut dev = one_dev();
    let mut p = Stitch::new();
    let mut v = Vec::new();
    for _ in 0..8 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 3 * MIB,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 3 * MIB, 0);
        v.push(a.addr);
    }
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    // 24 MiB live: 12 pages exactly, page tails packed
    assert_eq!(dev.used(), 24 * MIB, "page tails packed");
    // small blocks fill one page
    let mut dev = one_dev();
    let mut p = Stitch::new();
    for _ in 0..2048 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 1000,
                    stream: 0,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, 1000, 0);
    }
    assert!(dev.violations().is_empty());
    assert_eq!(
        dev.used(),
        2 * MIB,
        "2048 blocks of 1000 B (512-B units) in one page"
    );
}

#[test]
fn checker_catches_unmap_while_in_flight() {
    // unmapping memory whose stream-ordered free is not known complete is a violation
    let mut dev = one_dev();
    let va = dev.reserve(2 * MIB).unwrap();
    let h = dev.create(1).unwrap();
    dev.map(va, h, 1).unwrap();
    dev.set_access(va, 2 * MIB).unwrap();
    dev.check_alloc(va, MIB, 5);
    dev.check_free(va, FreeMode::Async { stream: 5 });
    dev.unmap(va, 2 * MIB).unwrap();
    assert!(
        dev.violations().iter().any(|v| v.contains("unmap")),
        "{:?}",
        dev.violations()
    );
}

#[test]
fn checker_takes_a_handle_of_several_pages_only_whole() {
    // one create and one map for a run of pages; a handle mapped, unmapped or released in
    // part is a violation (CUDA maps a handle at offset 0 only, and whole)
    let mut dev = one_dev();
    let va = dev.reserve(8 * MIB).unwrap();
    let h = dev.create(3).unwrap();
    assert_eq!(dev.used(), 6 * MIB);
    dev.map(va, h, 3).unwrap();
    dev.set_access(va, 6 * MIB).unwrap();
    assert_eq!(dev.calls().create + dev.calls().map, 2);
    dev.check_alloc(va + MIB, 4 * MIB, 0);
    dev.check_free(va + MIB, FreeMode::Sync);
    dev.synchronize().unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    dev.unmap(va, 2 * MIB).unwrap();
    assert!(
        dev.violations().iter().any(|v| v.contains("cuts through")),
        "{:?}",
        dev.violations()
    );
    let mut dev = one_dev();
    let va = dev.reserve(8 * MIB).unwrap();
    let h = dev.create(3).unwrap();
    assert!(dev.map(va, h, 1).is_err());
    assert!(dev.release(h, 1).is_err());
    let v = dev.violations();
    assert!(v.iter().any(|v| v.contains("mapped whole")), "{v:?}");
    assert!(v.iter().any(|v| v.contains("as 1 pages")), "{v:?}");
    dev.release(h, 3).unwrap();
    assert_eq!(dev.used(), 0);
}

#[test]
fn checker_reports_a_cut_mapping_once_per_call() {
    // an unmap that takes two of a mapping's three pages is one fault, said once; the call
    // that takes the third page later cuts it again, and is said once too
    let mut dev = one_dev();
    let va = dev.reserve(8 * MIB).unwrap();
    let h = dev.create(3).unwrap();
    dev.map(va, h, 3).unwrap();
    let cuts = |dev: &AccountingDevice| {
        dev.violations()
            .iter()
            .filter(|v| v.contains("cuts through"))
            .count()
    };
    dev.unmap(va, 4 * MIB).unwrap();
    assert_eq!(cuts(&dev), 1, "{:?}", dev.violations());
    dev.unmap(va + 4 * MIB, 2 * MIB).unwrap();
    assert_eq!(cuts(&dev), 2, "{:?}", dev.violations());
    assert_eq!(dev.violations().len(), 2, "{:?}", dev.violations());
    // two mappings cut by one call: one line each
    let h2 = dev.create(2).unwrap();
    let h3 = dev.create(2).unwrap();
    dev.map(va, h2, 2).unwrap();
    dev.map(va + 4 * MIB, h3, 2).unwrap();
    dev.unmap(va + 2 * MIB, 4 * MIB).unwrap();
    assert_eq!(cuts(&dev), 4, "{:?}", dev.violations());
}

#[test]
fn no_sync_during_capture() {
    let mut dev = AccountingDevice::new(4 * MIB);
    dev.set_checking(true);
    let mut p = Stitch::new();
    let a = p
        .alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    let b = p
        .alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    dev.check_alloc(a.addr, 2 * MIB, 0);
    dev.check_alloc(b.addr, 2 * MIB, 0);
    dev.check_free(a.addr, FreeMode::Sync);
    p.free(&mut dev, a.addr, FreeMode::Sync).unwrap();
    dev.set_capturing(true);
    // the only memory is pending a sync: refuse rather than synchronize during capture
    assert!(matches!(
        p.alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0
            }
        ),
        Err(PoolError::OutOfMemory { .. })
    ));
    assert_eq!(
        p.trim(&mut dev).unwrap(),
        0,
        "trim is deferred during capture"
    );
    dev.set_capturing(false);
    let c = p
        .alloc(
            &mut dev,
            Request {
                size: 2 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    dev.check_alloc(c.addr, 2 * MIB, 0);
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    assert_eq!(p.stats().syncs, 1);
}

#[test]
fn faults_fail_cleanly_and_later_requests_succeed() {
    for kind in [
        CallKind::Create,
        CallKind::Map,
        CallKind::Reserve,
        CallKind::SetAccess,
    ] {
        for nth in 1..6 {
            let mut dev = AccountingDevice::new(GIB);
            dev.set_checking(true);
            dev.fail_nth(kind, nth, DeviceError::Driver(2));
            let mut p = Stitch::new();
            let mut live = Vec::new();
            let mut failures = 0;
            for i in 0..12u64 {
                let size = (i % 4 + 1) * 3 * MIB / 2 + i * 4096;
                match p.alloc(&mut dev, Request { size, stream: 0 }) {
                    Ok(a) => {
                        dev.check_alloc(a.addr, size, 0);
                        live.push(a.addr);
                    }
                    Err(PoolError::Device(DeviceError::Driver(2))) => failures += 1,
                    Err(e) => panic!("{kind:?} nth {nth}: unexpected {e}"),
                }
            }
            assert!(
                failures <= 1,
                "{kind:?} nth {nth}: one injected fault, one failure"
            );
            for a in live {
                dev.check_free(a, FreeMode::Async { stream: 0 });
                p.free(&mut dev, a, FreeMode::Async { stream: 0 }).unwrap();
            }
            p.trim(&mut dev).unwrap();
            assert!(dev.violations().is_empty(), "{:?}", dev.violations());
            assert!(
                dev.leaks().is_empty(),
                "{kind:?} nth {nth}: {:?}",
                dev.leaks()
            );
        }
    }
}

#[test]
fn oom_is_reported_and_pool_recovers() {
    let mut dev = AccountingDevice::new(64 * MIB);
    let mut p = Stitch::new();
    let a = p
        .alloc(
            &mut dev,
            Request {
                size: 40 * MIB,
                stream: 0,
            },
        )
        .unwrap();
    let e = p
        .alloc(
            &mut dev,
            Request {
                size: 40 * MIB,
                stream: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(
        e,
        PoolError::OutOfMemory {
            why: DeviceError::OutOfMemory,
            ..
        }
    ));
    assert_eq!(
        dev.used(),
        40 * MIB,
        "pages created for a failed request are given back"
    );
    p.free(&mut dev, a.addr, FreeMode::Async { stream: 0 })
        .unwrap();
    // a different size now fits by dissolving the cached block (no growth)
    p.alloc(
        &mut dev,
        Request {
            size: 60 * MIB,
            stream: 0,
        },
    )
    .unwrap();
    assert!(dev.used() <= 64 * MIB);
    // the cap refuses like the device
    let mut dev = AccountingDevice::new(GIB);
    dev.set_cap(Some(32 * MIB));
    let mut p = Stitch::new();
    let e = p
        .alloc(
            &mut dev,
            Request {
                size: 40 * MIB,
                stream: 0,
            },
        )
        .unwrap_err();
    assert!(matches!(
        e,
        PoolError::OutOfMemory {
            why: DeviceError::CapExceeded,
            ..
        }
    ));
    assert_eq!(dev.used(), 0);
}

#[test]
fn cudafree_loop_batches_syncs_and_stays_bounded() {
    // cudaMalloc + cudaFree of 4 KiB, 100000 times: the pool does not grow while freed
    // blocks wait for a synchronization; one sync releases a batch (of at least 8: the
    // request then takes its freed twin)
    let mut dev = AccountingDevice::new(GIB);
    dev.set_checking(true);
    let mut p = Stitch::new();
    for _ in 0..100_000 {
        let a = p
            .alloc(
                &mut dev,
                Request {
                    size: 4096,
                    stream: vramshim_pool::ANY_STREAM,
                },
            )
            .unwrap();
        dev.check_alloc(a.addr, a.size, vramshim_pool::ANY_STREAM);
        dev.check_free(a.addr, FreeMode::Sync);
        p.free(&mut dev, a.addr, FreeMode::Sync).unwrap();
    }
    assert!(dev.violations().is_empty(), "{:?}", &dev.violations()[..1]);
    assert!(dev.used() <= 6 * MIB, "pool grew to {} B", dev.used());
    let syncs = p.stats().syncs;
    assert!(
        (1..=100_000 / 8).contains(&syncs),
        "{syncs} syncs for 100000 cudaFree"
    );
}

/// Idle release: once a job's use shrinks for two budget windows, the tight pool gives the
/// idle pages back, but only after a synchronization covers their stream-ordered frees (the
/// process's own: the pool never synchronizes for it), like CUDA's pool release threshold.
#[test]
fn tight_pool_gives_idle_memory_back_after_a_sync() {
    let mut dev = one_dev();
    let mut p = Stitch::new().with_budget(Some(Budget {
        window: 16,
        ..Budget::default()
    }));
    let s0 = Request {
        size: 64 * MIB,
        stream: 0,
    };
    let mut big = Vec::new();
    for _ in 0..4 {
        let a = p.alloc(&mut dev, s0).unwrap();
        dev.check_alloc(a.addr, a.size, 0);
        big.push(a.addr);
    }
    let held = dev.used();
    assert!(held >= 256 * MIB);
    for a in big {
        dev.check_free(a, FreeMode::Async { stream: 0 });
        p.free(&mut dev, a, FreeMode::Async { stream: 0 }).unwrap();
    }
    // two windows of small requests: the recent peak falls to what is live now
    let small = Request {
        size: 100 * KIB,
        stream: 0,
    };
    for _ in 0..40 {
        let a = p.alloc(&mut dev, small).unwrap();
        dev.check_alloc(a.addr, a.size, 0);
        dev.check_free(a.addr, FreeMode::Async { stream: 0 });
        p.free(&mut dev, a.addr, FreeMode::Async { stream: 0 })
            .unwrap();
    }
    let s = p.stats();
    assert!(s.budget < 8 * MIB, "budget {} after the windows", s.budget);
    // the freed pages still carry stream-ordered frees nobody waited for: kept, no sync made
    assert_eq!(dev.calls().syncs(), 0);
    assert!(
        dev.used() >= held,
        "released before a synchronization covered the frees"
    );
    assert!(
        s.cached == 0 || p.pinned_above_budget(),
        "above the budget blocks stay cached only while nothing could be given back"
    );
    // the process synchronizes; the next free lets the idle pages go
    dev.process_sync();
    p.note_process_sync();
    let a = p.alloc(&mut dev, small).unwrap();
    dev.check_alloc(a.addr, a.size, 0);
    dev.check_free(a.addr, FreeMode::Async { stream: 0 });
    p.free(&mut dev, a.addr, FreeMode::Async { stream: 0 })
        .unwrap();
    let s = p.stats();
    assert!(
        dev.used() <= s.budget,
        "{} B held for a budget of {} B",
        dev.used(),
        s.budget
    );
    assert!(s.releases >= 120, "{} pages released", s.releases);
    assert_eq!(dev.calls().syncs(), 0, "the pool synchronized");
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
}

/// The tight pool's arena (large blocks carved by address out of one growing mapping) keeps
/// the same rules, and the checker catches each one broken there: blocks of a new shape
/// placed over live bytes (`skip_take`), over `cudaFree`d bytes before a synchronization
/// (`reuse_sync_frees_early`), over another stream's freed bytes without ordering
/// (`ignore_streams`).
#[test]
fn checker_catches_broken_rules_in_the_arena() {
    type Case = (&'static str, fn(bool) -> Faults, FreeMode, u64);
    let cases: [Case; 3] = [
        (
            "overlap",
            |b| Faults {
                skip_take: b,
                ..Faults::default()
            },
            FreeMode::Async { stream: 1 },
            1,
        ),
        (
            "early reuse",
            |b| Faults {
                reuse_sync_frees_early: b,
                ..Faults::default()
            },
            FreeMode::Sync,
            1,
        ),
        (
            "early reuse",
            |b| Faults {
                ignore_streams: b,
                ..Faults::default()
            },
            FreeMode::Async { stream: 1 },
            2,
        ),
    ];
    for (what, faults, mode, stream2) in cases {
        for broken in [false, true] {
            let mut dev = one_dev();
            let mut p = Stitch::tight();
            p.set_faults(faults(broken));
            let mut live = Vec::new();
            // a few shapes live at once, then freed: their bytes go to new shapes (no
            // exact-size twin), carved out of the arena
            for (i, size) in [5 * MIB, 3 * MIB + 512, 7 * MIB].into_iter().enumerate() {
                let a = p.alloc(&mut dev, Request { size, stream: 1 }).unwrap();
                dev.check_alloc(a.addr, size, 1);
                live.push((a.addr, size, i));
            }
            // one growing mapping holds them all
            assert!(broken || p.mappings() == 1, "{}", p.mappings());
            for &(addr, _, i) in &live {
                if i != 1 {
                    dev.check_free(addr, mode);
                    // with overlapping blocks (one address handed out twice) the pool
                    // knows only one of them
                    let r = p.free(&mut dev, addr, mode);
                    assert!(r.is_ok() || broken, "{r:?}");
                }
            }
            for size in [6 * MIB, 4 * MIB + 1024] {
                let b = p
                    .alloc(
                        &mut dev,
                        Request {
                            size,
                            stream: stream2,
                        },
                    )
                    .unwrap();
                dev.check_alloc(b.addr, size, stream2);
            }
            // the new shapes came out of the pages held (no stitched mapping)
            assert!(broken || p.mappings() == 1, "{}", p.mappings());
            let found = dev
                .violations()
                .iter()
                .any(|v| v.contains(what) || (what == "overlap" && v.contains("twice")));
            assert_eq!(
                found,
                broken,
                "{what} (broken {broken}): {:?}",
                dev.violations()
            );
            assert_eq!(
                p.stats().syncs == 0,
                !matches!(mode, FreeMode::Sync) || broken
            );
        }
    }
}

/// 64 streams of 300 random operations (xorshift from `seed`) of the kind that put a tight
/// pool with short budget windows above its budget often: blocks of every size on three
/// streams, frees (stream-ordered, or a quarter with `cudaFree` when `sync_frees`), the
/// process's synchronizations.
fn random_streams(seed: u64, sync_frees: bool) -> Vec<Vec<Op>> {
    let mut r = vramshim_testkit::XorShift(seed);
    let mut next = move |n: u64| r.below(n);
    (0..64)
        .map(|_| {
            (0..300)
                .map(|_| match next(20) {
                    0..=9 => Op::Alloc {
                        size: match next(12) {
                            0..=3 => 1 + next(4096),
                            4..=7 => 4096 + next(MIB),
                            8..=10 => MIB + next(7 * MIB),
                            _ => 8 * MIB + next(64 * MIB),
                        },
                        stream: next(3),
                    },
                    10..=17 => Op::Free {
                        idx: next(1 << 20) as usize,
                        mode: if sync_frees && next(4) == 0 {
                            FreeMode::Sync
                        } else {
                            FreeMode::Async { stream: next(3) }
                        },
                    },
                    18 => Op::ProcessSync,
                    _ => Op::Alloc {
                        size: 4096,
                        stream: 0,
                    },
                })
                .collect()
        })
        .collect()
}

/// The stream condition of unmapping is per mapping (a block freed through a mapping
/// stream-ordered keeps that mapping's addresses mapped until a synchronization), not per
/// page (the page is in other mappings too, whose addresses no stream used for that block).
/// Broken on purpose (`Faults::unmap_busy`: a mapping is dropped, re-formed or given back
/// while a block freed through it may still be used by its stream), the checking device
/// reports the unmap in random streams of operations of the tight pool with short budget
/// windows; with the rule kept, none of the same streams shows a violation.
#[test]
fn checker_catches_unmapping_a_mapping_a_stream_may_still_use() {
    let mut caught = 0;
    for ops in random_streams(0x9e37_79b9_7f4a_7c15, true) {
        let b = Budget {
            window: 16,
            ..Budget::default()
        };
        for broken in [false, true] {
            let mut p = Stitch::new().with_budget(Some(b));
            p.set_faults(Faults {
                unmap_busy: broken,
                ..Faults::default()
            });
            let dev = exercise(&mut p, &ops, 1 << 30);
            let unmaps = dev
                .violations()
                .iter()
                .filter(|v| v.contains("may still be in use by a stream"))
                .count();
            if broken {
                caught += unmaps;
            } else {
                assert!(dev.violations().is_empty(), "{:?}", dev.violations());
            }
        }
    }
    assert!(caught > 0, "no unmap of a busy mapping was caught");
}

/// The per-mapping condition gives back what the per-page one kept: in random streams of
/// operations of the tight pool with short budget windows, a page shared with a mapping that
/// a stream may still use no longer keeps the other mappings it is in (and their pages)
/// until a synchronization. Summed over the streams, the pool holds fewer bytes after its
/// operations than with every mapping of such a page kept (`Faults::page_fenced_maps`, the
/// old rule), safely (checking device).
#[test]
fn mappings_of_a_page_freed_into_are_given_back_unless_a_stream_used_them() {
    let (mut held_new, mut held_old) = (0u128, 0u128);
    for ops in random_streams(0x2545_f491_4f6c_dd1d, false) {
        let b = Budget {
            window: 16,
            ..Budget::default()
        };
        for old in [false, true] {
            let mut p = Stitch::new().with_budget(Some(b));
            p.set_faults(Faults {
                page_fenced_maps: old,
                ..Faults::default()
            });
            let mut held = 0u128;
            let dev = exercise_with(&mut p, &ops, 1 << 30, &mut |_, dev, _, _| {
                held += dev.used() as u128;
            });
            assert!(dev.violations().is_empty(), "{:?}", dev.violations());
            if old {
                held_old += held;
            } else {
                held_new += held;
            }
        }
    }
    eprintln!(
        "bytes held after each operation, summed: {held_new} per mapping, {held_old} per page"
    );
    assert!(held_new < held_old, "{held_new} vs {held_old}");
}

/// A stream on which hits end two budget
/// windows (the budget falls to 10 MiB while the pool holds 14 MiB), frees above the budget
/// find every page pinned by live and `cudaFree`d blocks (the pool remembers that dissolving
/// its cache would free nothing), then the process synchronizes and the next allocation
/// caches the `cudaFree`d blocks: 9 MiB cached, 6 pages that could go back. The remembered
/// answer must not outlive that release (`Stitch` keys it by the epoch of its last release
/// of pending blocks too). Since stitched mappings take their addresses from the pool's chunks
/// this stream no longer reaches that state (it passes with the key reverted);
/// `a_release_of_pending_blocks_outdates_the_answer_that_nothing_can_go_back` fails then.
#[test]
fn pending_blocks_a_process_sync_releases_are_given_back_above_the_budget() {
    let ops = stream(concat!(
        "a1:0 a9986438:0 f5461228491454272122:1 f8363633106852936054:1 a981980:0 ",
        "f12697520934868491854:1 a6762143:0 a542102:0 a2775:2 a4001250:* ",
        "f7560477481768055968:0 f15176509230140336603:1 a171092:0 f16133305533954728011 a2324:2 ",
        "a3024:1 a6903591:1 f11872999117671438335:1 a1533:2 f5399215596994423618:2 a2769:0 ",
        "a1997878:2 h45 h37 f8209207302156498437 f11878329210488162334:2 f8669283101544884110 ",
        "f3070851867124967821:0 f15786390639728793754 p f4720397894211475227:0 a2879:0",
    ));
    short_window_case(&ops, 275 * MIB);
}

/// A budget that falls in two steps: at the first, the pool gives idle pages back until it is
/// within the budget and stops there; at the second (the next window's end, nothing else
/// changed), the idle pages left over the lower budget go back too. Found by the random
/// short-window test once the budget check also looked at a pool caching nothing: the pool
/// remembered the first scan as "every idle page left is pinned" although it had stopped at
/// the budget, and skipped the second (16 MiB held for a 10 MiB budget, 3 idle pages). Since
/// stitched mappings take their addresses from the pool's chunks it passes with that rule
/// reverted; `an_idle_scan_that_stopped_at_the_bytes_kept_is_not_remembered` fails then.
#[test]
fn idle_pages_go_back_when_the_budget_falls_again() {
    let mut ops = vec![Op::Alloc {
        size: 4 * KIB,
        stream: 0,
    }];
    // sixteen 1 MiB blocks; the last eight freed with `cudaFree`
    ops.extend((0..16).map(|_| Op::Alloc {
        size: MIB,
        stream: 0,
    }));
    ops.extend((0..8).map(|i| Op::Free {
        idx: 16 - i,
        mode: FreeMode::Sync,
    }));
    // small `cudaFree`d pairs end windows of 4 allocations: the budget follows the lower use
    for i in 0..12u64 {
        ops.push(Op::Alloc {
            size: 512 * (i + 1),
            stream: 0,
        });
        ops.push(Op::Free {
            idx: 9,
            mode: FreeMode::Sync,
        });
    }
    let b = Budget {
        window: 4,
        ..Budget::default()
    };
    exercise_clean_in_budget(&mut Stitch::new().with_budget(Some(b)), &ops, GIB, b);
}

/// A stream of the random short-window test (shrunk; found with the fix below reverted) on which
/// the pool's scan for idle pages stops at the bytes it keeps, and a budget window that ends
/// later, lower, finds idle pages the scan left unexamined. With the scan remembered however it
/// ended (`budget::release_idle` setting `idle_scan` unconditionally and scanning within the
/// bytes kept, a temporary edit) this fails: 288 MiB held for a 6 MiB budget, nothing cached,
/// 37 pages that could go back.
#[test]
fn an_idle_scan_that_stopped_at_the_bytes_kept_is_not_remembered() {
    let ops = stream(concat!(
        "a14849:0 f0:0 a1:0 a1:0 a1:0 a1:0 a3673:0 a114:0 a2939:1 f16854134226397539377:2 ",
        "a217098433:1 f9931357464084627234:0 a917:1 a877303:0 a5151278:1 f503545846407919875:2 ",
        "f18054491511055715963:2 a318325:2 a184484648:1 a320498:* a7186350:1 a554905:0 ",
        "f16961619514046473213:1 a720380:1 f4451353675208480323 a825254:0 f10114500218495434895:0 ",
        "f12476052835609184368:0 a281734491:0 a1991:0 f15659579919939468533:2 ",
        "f1611021055538505788 a634728:1 a2100:2 f6394150506980335449:2 f11262411286061902214:2 ",
        "a4030838:1 f17712929391611399303:0 f13538869117031490500:2 a3674:* p ",
        "f4446661154887567018:2 f8188546529624412558:2 h31 h48 a3207:0 f3660299789023440163:0 h18 ",
        "f6031730958621627445:0 a2785:* h36241 a930573:*",
    ));
    short_window_case(&ops, 759 * MIB);
}

/// A stream of the random short-window test (shrunk; found with the fix below reverted) on which
/// the counts of free pages and mappings are those of the last scan for idle pages while other
/// pages became idle: the scan must run again. With the scan keyed by (epoch, free pages,
/// mappings) instead of (epoch, `idle_gen`, pages) (a temporary edit) this fails: 20 MiB held
/// for an 8 MiB budget, nothing cached, 5 pages that could go back.
#[test]
fn the_idle_scan_is_keyed_by_what_can_free_a_page_not_by_counts() {
    let ops = stream(concat!(
        "a1:0 f968255:0 a8186571:* a941856:0 a2613081:1 a97593:0 f2543898374426637275:0 ",
        "a3221969:1 a114564:2 a1427:2 f11813870922148137865:2 a88138:* f11466436824716095044:1 ",
        "a3268:* a3310:2 a65432513:0 a530615:* a434670:* a863000:1 a2386:1 a1687:2 a2896:0 ",
        "f4667770637777871426:0 f13104819070145075953 a430:0 c1 a330817:0 a930285:0 a3079:1 ",
        "f12090088055314611082:0 f13788684752726569192:1 f7988700469131222624 a2333148:* ",
        "f16486028843747749268:2 f16368587247352559242:2 a1826:2 a3684:1 f3974220690848472423:1 ",
        "f3497868980746992145:2 f7715502518252066449:1 a695665:2 a493341:0 f6849685998671646748 ",
        "h26301 a470:1 f15688370420909865730:1 f5829178775336113891:0 a2211:1 ",
        "f1632057000828057405:1 a758:2 f3459706122216970664 f2325486580807613505:2 c0 h25 p ",
        "f16283328057715737196:2 a317002:2",
    ));
    short_window_case(&ops, 99 * MIB);
}

/// A stream of the random short-window test (shrunk; found with the fix below reverted) on which
/// the pool remembers that dissolving its cache would free no page, and a process
/// synchronization's `cudaFree`d blocks reach its cache later in the epoch (at its next
/// allocation): the answer must not outlive that release. With the answer keyed without the
/// epoch of the last release of pending blocks (`budget::release_possible`'s key, a temporary
/// edit) this fails: 38 MiB held for a 2 MiB budget, 36 MiB cached, 18 pages that could go
/// back. (`pending_blocks_a_process_sync_releases_are_given_back_above_the_budget`, the stream
/// this rule was first found by, passes without it since stitched mappings take their
/// addresses from the pool's chunks.)
#[test]
fn a_release_of_pending_blocks_outdates_the_answer_that_nothing_can_go_back() {
    let ops = stream(concat!(
        "a1:0 a1:0 a1:0 a1:0 f0 f0 f0 f0 f0 a1:0 f0 f0 f0 a1:0 a3585:0 f0 a318381:0 ",
        "f9253956928696041504 a1:0 f0 a27962026:0 f7089033974926336580 a8388608:0 a4097:0 a1:0 f0 ",
        "a1:0 f1661028685880625645 a4097:0 a1048577:0 a1:0 a1:0 f7488949955046512782 p h16 ",
        "a3585:0",
    ));
    short_window_case(&ops, 64 * MIB);
}

/// Found by the random short-window test (seed 12 of 1,500 cases): near the device's limit the
/// pool re-forms an unused mapping over other pages (`Stitch::repair_mapping`), and one page
/// moves from slot 3 to slot 0 of it. Its new slot was mapped first, then its old slot unmapped,
/// which took the mapping off the page's list although the page was still mapped there; a
/// window the caller's hits ended later gave the page back (`release of handle 1 while mapped
/// 1 times`, the checking device).
#[test]
fn a_page_moved_within_a_reformed_mapping_is_not_released_while_mapped_there() {
    let ops = stream(concat!(
        "a1:0 f0 a1997288:0 f0 a8198657:0 a24065:0 a2561:0 f6505941216198666261 f0 a161793:0 a1:0 ",
        "a4194817:0 a1:0 a6480385:0 f989211930943691068 f1360073802747487378 a100828161:0 ",
        "a2356415:0 a1:0 f15853621274391374001 a1907713:0 f8663830746510357115 ",
        "f1695267640836312141 a1:0 a1:0 f6538882803672451708 f7491288849755460819 a6481409:0 ",
        "f5161271353098290855:0 p h15",
    ));
    short_window_case(&ops, 110 * MIB);
}
