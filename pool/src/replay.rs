//! Deterministic replay of an allocation stream through a policy on the accounting device.

use crate::accounting::AccountingDevice;
use crate::device::{CallCounts, Stream};
use crate::fxhash::FxMap;
use crate::thread_cache::{self, ThreadCache};
use crate::{Alloc, FreeMode, Policy, PolicyKind, PoolError, Request, Stats};

/// One event of an allocation stream. Ids are chosen by the producer (unique among live
/// allocations; an id may be reused after its free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Alloc {
        id: u64,
        size: u64,
        stream: Stream,
    },
    Free {
        id: u64,
        mode: FreeMode,
    },
    /// The process synchronized the device itself (`cudaDeviceSynchronize`).
    ProcessSync,
    /// The process destroyed a stream (`cudaStreamDestroy`): a stream created later may get
    /// its handle value (see `Policy::retire_stream`).
    StreamRetired {
        stream: Stream,
    },
}

/// The first allocation that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Index of the event in the stream.
    pub index: usize,
    pub size: u64,
    pub stream: Stream,
    pub why: String,
}

/// What a replay did.
#[derive(Clone, Debug)]
pub struct ReplayResult {
    pub policy: &'static str,
    /// Every event was replayed (no allocation failed).
    pub completed: bool,
    /// Allocations served.
    pub allocs_done: u64,
    pub first_failure: Option<Failure>,
    /// Largest `Stats::reserved` seen (the policy's view).
    pub peak_reserved: u64,
    /// Largest sum of live requested bytes.
    pub peak_live: u64,
    /// Largest device usage (whole pages, the device's view: includes driver rounding).
    pub peak_device_used: u64,
    /// Memory-management driver calls (see [`CallCounts::driver_calls`]).
    pub driver_calls: u64,
    /// Device synchronizations (explicit + implied by `cudaFree`-like frees).
    pub syncs: u64,
    /// Allocations the live library's thread caches served in front of the policy (0 when
    /// it has none: [`Policy::thread_caches`]); the policy's own `stats.cache_hits` do not
    /// count them, as the live pool's do not.
    pub thread_cache_hits: u64,
    pub calls: CallCounts,
    pub stats: Stats,
    /// Safety violations found by the checker (empty unless checking was on).
    pub violations: Vec<String>,
    /// What the device still held after freeing everything and trimming.
    pub leaks: Vec<String>,
}

/// Replay `events` through a fresh `policy` on an accounting device of `device_capacity`
/// bytes, with vramshim's cap at `cap` bytes if set. Stops at the first failed allocation,
/// then frees everything still live and trims (so `leaks` is meaningful either way).
pub fn run(
    events: &[Event],
    policy: PolicyKind,
    device_capacity: u64,
    cap: Option<u64>,
) -> ReplayResult {
    let mut dev = AccountingDevice::new(device_capacity);
    dev.set_cap(cap);
    let mut p = policy.build();
    run_with(&as_seen_by(events, policy), p.as_mut(), &mut dev)
}

/// The stream as `policy` receives it. PyTorch's caching allocator never calls `cudaFree`
/// for a tensor: a program's free returns the block to the allocator's cache, ordered on the
/// block's allocation stream. So for `caching` a `cudaFree` ([`FreeMode::Sync`]) becomes
/// that stream-ordered release (the stream of the block's allocation; stream 0 for a request
/// on [`crate::ANY_STREAM`]); `stitch` and `direct` get the stream as it is (they sit under
/// `cudaFree` itself).
pub fn as_seen_by(events: &[Event], policy: PolicyKind) -> std::borrow::Cow<'_, [Event]> {
    if policy != PolicyKind::Caching
        || !events.iter().any(|e| {
            matches!(
                e,
                Event::Free {
                    mode: FreeMode::Sync,
                    ..
                }
            )
        })
    {
        return std::borrow::Cow::Borrowed(events);
    }
    std::borrow::Cow::Owned(stream_ordered(events))
}

/// The stream with every `cudaFree` ([`FreeMode::Sync`]) made a stream-ordered release on
/// its block's allocation stream (stream 0 for a request on [`crate::ANY_STREAM`]): the same
/// log as a `cudaFreeAsync` (or RMM `deallocate`) user issues it.
pub fn stream_ordered(events: &[Event]) -> Vec<Event> {
    let mut streams: FxMap<u64, Stream> = FxMap::default();
    events
        .iter()
        .map(|e| match *e {
            Event::Alloc { id, stream, .. } => {
                let s = if stream == crate::ANY_STREAM {
                    0
                } else {
                    stream
                };
                streams.insert(id, s);
                *e
            }
            Event::Free {
                id,
                mode: FreeMode::Sync,
            } => Event::Free {
                id,
                mode: FreeMode::Async {
                    stream: streams.get(&id).copied().unwrap_or(0),
                },
            },
            _ => *e,
        })
        .collect()
}

/// The free semantics every policy is judged on in a side-by-side comparison: the same
/// stream for all, so no policy is measured on easier rules than another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frees {
    /// Every free is a `cudaFree` ([`FreeMode::Sync`]): the block may be reused only behind a
    /// synchronization.
    CudaFree,
    /// Every free is stream-ordered on its block's allocation stream (`cudaFreeAsync`; stream
    /// 0 for a request on [`crate::ANY_STREAM`]).
    StreamOrdered,
}

impl Frees {
    pub const BOTH: [Frees; 2] = [Frees::CudaFree, Frees::StreamOrdered];

    pub fn name(self) -> &'static str {
        match self {
            Frees::CudaFree => "cudaFree",
            Frees::StreamOrdered => "stream-ordered",
        }
    }

    /// `events` with every free given these semantics.
    pub fn apply(self, events: &[Event]) -> Vec<Event> {
        match self {
            Frees::CudaFree => cuda_freed(events),
            Frees::StreamOrdered => stream_ordered(events),
        }
    }
}

/// The stream with every free made a `cudaFree` ([`FreeMode::Sync`]).
pub fn cuda_freed(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .map(|e| match *e {
            Event::Free { id, .. } => Event::Free {
                id,
                mode: FreeMode::Sync,
            },
            _ => *e,
        })
        .collect()
}

/// Replay `events` with every free given the semantics `frees`, the same for every policy
/// (unlike [`run`], no policy gets its own view of the stream).
pub fn run_on(
    events: &[Event],
    policy: PolicyKind,
    frees: Frees,
    device_capacity: u64,
    cap: Option<u64>,
) -> ReplayResult {
    let mut dev = AccountingDevice::new(device_capacity);
    dev.set_cap(cap);
    let mut p = policy.build();
    run_with(&frees.apply(events), p.as_mut(), &mut dev)
}

/// One policy's line of a same-semantics comparison.
#[derive(Clone, Debug)]
pub struct Compared {
    pub frees: Frees,
    pub result: ReplayResult,
}

/// Every policy of `policies` under both free semantics: `[cudaFree results...,
/// stream-ordered results...]`, each on a fresh device of `device_capacity` bytes.
pub fn compare(
    events: &[Event],
    policies: &[PolicyKind],
    device_capacity: u64,
    cap: Option<u64>,
) -> Vec<Compared> {
    let mut out = Vec::new();
    for frees in Frees::BOTH {
        let ev = frees.apply(events);
        for &policy in policies {
            let mut dev = AccountingDevice::new(device_capacity);
            dev.set_cap(cap);
            let mut p = policy.build();
            out.push(Compared {
                frees,
                result: run_with(&ev, p.as_mut(), &mut dev),
            });
        }
    }
    out
}

/// Like [`run`], with checking on: `violations` lists every safety problem found.
pub fn run_checked(
    events: &[Event],
    policy: PolicyKind,
    device_capacity: u64,
    cap: Option<u64>,
) -> ReplayResult {
    let mut dev = AccountingDevice::new(device_capacity);
    dev.set_cap(cap);
    dev.set_checking(true);
    let mut p = policy.build();
    run_with(&as_seen_by(events, policy), p.as_mut(), &mut dev)
}

/// What sits in front of the policy in a replay: the live library's thread caches
/// ([`thread_cache`]) when the policy says it has them ([`Policy::thread_caches`]), else
/// nothing (every request and free reaches the policy).
struct Front(Option<ThreadCache>);

impl Front {
    fn of(policy: &dyn Policy) -> Front {
        Front(
            policy
                .thread_caches()
                .then(|| ThreadCache::new(thread_cache::Rules::LIVE)),
        )
    }

    fn alloc(
        &mut self,
        policy: &mut dyn Policy,
        dev: &mut AccountingDevice,
        req: Request,
    ) -> Result<Alloc, PoolError> {
        match &mut self.0 {
            Some(c) => c.alloc(policy, dev, req).map(|(a, _)| a),
            None => policy.alloc(dev, req),
        }
    }

    /// Free a block of `size` requested bytes, `granted` handed out (errors are the
    /// program's: a replay goes on).
    fn free(
        &mut self,
        policy: &mut dyn Policy,
        dev: &mut AccountingDevice,
        addr: u64,
        (size, granted): (u64, u64),
        mode: FreeMode,
    ) {
        let _ = match &mut self.0 {
            Some(c) => c.free(policy, dev, addr, size, granted, mode).map(|_| ()),
            None => policy.free(dev, addr, mode).map(|_| ()),
        };
    }

    fn process_sync(&mut self, policy: &mut dyn Policy, dev: &mut AccountingDevice) {
        if let Some(c) = &mut self.0 {
            let _ = c.process_sync(policy, dev);
        }
        process_sync(policy, dev);
    }

    /// The process destroyed `stream`: the caches give back what they keep (as the live
    /// library drains them before it tells its pools), the policy and then the device are told.
    fn retire_stream(
        &mut self,
        policy: &mut dyn Policy,
        dev: &mut AccountingDevice,
        stream: Stream,
    ) {
        match &mut self.0 {
            Some(c) => {
                let _ = c.retire_stream(policy, dev, stream);
                dev.retire_stream(stream);
            }
            None => retire_stream(policy, dev, stream),
        }
    }

    fn give_back(&mut self, policy: &mut dyn Policy, dev: &mut AccountingDevice) {
        if let Some(c) = &mut self.0 {
            let _ = c.give_back(policy, dev);
        }
    }

    fn hits(&self) -> u64 {
        self.0.as_ref().map_or(0, ThreadCache::hits)
    }
}

/// The process synchronized the device ([`Event::ProcessSync`]) with every free reaching
/// `policy`: the device completes its work, then the policy is told.
pub fn process_sync(policy: &mut dyn Policy, dev: &mut AccountingDevice) {
    dev.process_sync();
    policy.note_process_sync();
}

/// The process destroyed `stream` ([`Event::StreamRetired`]) with every free reaching
/// `policy`: the policy is told first, while the handle still names the stream (it may record
/// an event there), then the device.
pub fn retire_stream(policy: &mut dyn Policy, dev: &mut AccountingDevice, stream: Stream) {
    policy.retire_stream(dev, stream);
    dev.retire_stream(stream);
}

/// Replay through a given policy and device (set the device's capacity, cap, checking and
/// faults before calling), behind the live library's thread caches where the policy has
/// them ([`Policy::thread_caches`]: `stitch` as `libvramshim.so` runs it).
pub fn run_with(
    events: &[Event],
    policy: &mut dyn Policy,
    dev: &mut AccountingDevice,
) -> ReplayResult {
    let mut front = Front::of(policy);
    // id -> (address, requested size, size handed out, stream)
    let mut ids: FxMap<u64, (u64, u64, u64, Stream)> = FxMap::default();
    let mut first_failure = None;
    let mut allocs_done = 0;
    let mut live = 0u64;
    let mut peak_live = 0u64;
    for (index, ev) in events.iter().enumerate() {
        match *ev {
            Event::Alloc { id, size, stream } => {
                match front.alloc(policy, dev, Request { size, stream }) {
                    Ok(a) => {
                        dev.check_alloc(a.addr, a.size, stream);
                        if let Some((old, osz, og, _)) =
                            ids.insert(id, (a.addr, size, a.size, stream))
                        {
                            // producer reused a live id: the old block leaks in the process
                            // too; free it so the replay stays bounded.
                            front.free(policy, dev, old, (osz, og), FreeMode::Sync);
                            dev.check_free(old, FreeMode::Sync);
                            live = live.saturating_sub(osz);
                        }
                        allocs_done += 1;
                        live = live.saturating_add(size);
                        peak_live = peak_live.max(live);
                    }
                    Err(e) => {
                        first_failure = Some(Failure {
                            index,
                            size,
                            stream,
                            why: e.to_string(),
                        });
                        break;
                    }
                }
            }
            Event::Free { id, mode } => {
                if let Some((addr, size, granted, _)) = ids.remove(&id) {
                    dev.check_free(addr, mode);
                    front.free(policy, dev, addr, (size, granted), mode);
                    live = live.saturating_sub(size);
                }
            }
            Event::ProcessSync => front.process_sync(policy, dev),
            Event::StreamRetired { stream } => front.retire_stream(policy, dev, stream),
        }
    }
    // as the live pool's statistics read at the end (the blocks the caches keep are live
    // to it)
    let stats_at_end = policy.stats();
    let calls = dev.calls();
    // Clean up: give back what the caches keep, free what is left (in address order,
    // deterministic), trim, look for leaks.
    front.give_back(policy, dev);
    let mut rest: Vec<(u64, Stream)> = ids.values().map(|&(a, _, _, s)| (a, s)).collect();
    rest.sort_unstable();
    for (addr, s) in rest {
        let mode = FreeMode::Async { stream: s };
        dev.check_free(addr, mode);
        let _ = policy.free(dev, addr, mode);
    }
    let _ = policy.trim(dev);
    let leaks = dev.leaks();
    ReplayResult {
        policy: policy.name(),
        completed: first_failure.is_none(),
        allocs_done,
        first_failure,
        peak_reserved: stats_at_end.peak_reserved,
        peak_live,
        peak_device_used: dev.peak_used(),
        driver_calls: calls.driver_calls(),
        syncs: calls.syncs(),
        thread_cache_hits: front.hits(),
        calls,
        stats: stats_at_end,
        violations: dev.violations().to_vec(),
        leaks,
    }
}

/// Largest sum of live requested bytes over the stream (the physical limit).
pub fn peak_live(events: &[Event]) -> u64 {
    let mut sizes: FxMap<u64, u64> = FxMap::default();
    let (mut live, mut peak) = (0u64, 0u64);
    for ev in events {
        match *ev {
            Event::Alloc { id, size, .. } => {
                // Saturating: sizes come from input files, and their sum may pass 64 bits.
                if let Some(o) = sizes.insert(id, size) {
                    live = live.saturating_sub(o);
                }
                live = live.saturating_add(size);
                peak = peak.max(live);
            }
            Event::Free { id, .. } => {
                if let Some(s) = sizes.remove(&id) {
                    live = live.saturating_sub(s);
                }
            }
            Event::ProcessSync | Event::StreamRetired { .. } => {}
        }
    }
    peak
}

/// The smallest device (bytes, a whole number of 2 MiB pages) on which `policy` completes
/// the stream. Deterministic binary search between the physical limit and the device use of
/// an unlimited run.
pub fn min_capacity(events: &[Event], policy: PolicyKind) -> u64 {
    min_capacity_with(&as_seen_by(events, policy), &|| policy.build())
}

/// [`min_capacity`] for a policy built by `make` (e.g. a configured `Stitch`).
pub fn min_capacity_with(events: &[Event], make: &dyn Fn() -> Box<dyn Policy>) -> u64 {
    let gran = 2 << 20;
    let try_cap = |cap: u64| {
        let mut dev = AccountingDevice::new(cap);
        let mut p = make();
        run_with(events, p.as_mut(), &mut dev)
    };
    let unlimited = try_cap(UNLIMITED);
    if !unlimited.completed {
        // cannot complete at any size (should not happen for valid streams)
        return u64::MAX;
    }
    let mut hi = unlimited.peak_device_used.div_ceil(gran).max(1);
    // A pool that reads the device's room (near-the-limit rules) lays blocks out otherwise on
    // a device its unlimited run just fits than on an unlimited one, and may be refused
    // there: the search starts from a size that completes.
    while !try_cap(hi * gran).completed {
        hi += 1;
    }
    let mut lo = peak_live(events) / gran; // lo * gran <= peak live: fails unless 0
    if lo >= hi {
        return hi * gran;
    }
    if lo == 0 && try_cap(0).completed {
        return 0;
    }
    // invariant: lo fails, hi completes
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if try_cap(mid * gran).completed {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * gran
}

/// `events` repeated `times` times as a loop: each pass frees (`cudaFree`) what it left
/// live, and ids are renumbered per pass.
pub fn repeat(events: &[Event], times: usize) -> Vec<Event> {
    let max_id = events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc { id, .. } | Event::Free { id, .. } => Some(*id),
            Event::ProcessSync | Event::StreamRetired { .. } => None,
        })
        .max()
        .unwrap_or(0)
        + 1;
    let mut out = Vec::with_capacity(events.len() * times + 16);
    for pass in 0..times as u64 {
        let off = pass * max_id;
        let mut live: Vec<(u64, Stream)> = Vec::new();
        let mut pos: FxMap<u64, usize> = FxMap::default();
        for ev in events {
            match *ev {
                Event::Alloc { id, size, stream } => {
                    pos.insert(id, live.len());
                    live.push((id, stream));
                    out.push(Event::Alloc {
                        id: id + off,
                        size,
                        stream,
                    });
                }
                Event::Free { id, mode } => {
                    if let Some(i) = pos.remove(&id) {
                        live[i].0 = u64::MAX;
                    }
                    out.push(Event::Free { id: id + off, mode });
                }
                e @ (Event::ProcessSync | Event::StreamRetired { .. }) => out.push(e),
            }
        }
        for (id, _stream) in live {
            if id != u64::MAX && pos.contains_key(&id) {
                pos.remove(&id);
                // as the log-replay workload's --repeat: cudaFree what the pass left live
                out.push(Event::Free {
                    id: id + off,
                    mode: FreeMode::Sync,
                });
            }
        }
    }
    out
}

/// Driver calls made during each pass of `repeat(events, passes)` on an unlimited device.
pub fn driver_calls_per_pass(events: &[Event], policy: PolicyKind, passes: usize) -> Vec<u64> {
    let all = as_seen_by(&repeat(events, passes), policy).into_owned();
    calls_of_each_pass(events, &all, passes, policy.build())
}

/// Driver calls of each of the `passes` passes of `all` (`repeat(events, passes)` with its
/// frees as the caller wants them) through `p`, on an unlimited device.
fn calls_of_each_pass(
    events: &[Event],
    all: &[Event],
    passes: usize,
    mut p: Box<dyn Policy>,
) -> Vec<u64> {
    let one = repeat(events, 1).len();
    let mut dev = AccountingDevice::new(UNLIMITED);
    // the thread caches, if any, carry over from pass to pass as in the live library
    let mut front = Front::of(p.as_ref());
    let mut out = Vec::new();
    for pass in 0..passes {
        let before = dev.calls().driver_calls();
        // ids are unique within a pass, and nothing stays live across one
        let mut ids = FxMap::default();
        replay_into(
            &all[pass * one..(pass + 1) * one],
            p.as_mut(),
            &mut dev,
            &mut front,
            &mut ids,
        );
        out.push(dev.calls().driver_calls() - before);
    }
    out
}

/// Driver calls made during each pass of `repeat(events, passes)` with every free given the
/// semantics `frees`, through a policy built by `make`, on an unlimited device.
pub fn calls_per_pass_with(
    events: &[Event],
    frees: Frees,
    make: &dyn Fn() -> Box<dyn Policy>,
    passes: usize,
) -> Vec<u64> {
    let all = frees.apply(&repeat(events, passes));
    calls_of_each_pass(events, &all, passes, make())
}

/// Driver calls per 1000 allocations in the second half of the stream (by allocation count),
/// with every free given the semantics `frees`, through a policy built by `make`, on an
/// unlimited device: what a long-running job's settled state costs.
pub fn second_half_calls_per_1000(
    events: &[Event],
    frees: Frees,
    make: &dyn Fn() -> Box<dyn Policy>,
) -> f64 {
    let ev = frees.apply(events);
    let allocs = ev
        .iter()
        .filter(|e| matches!(e, Event::Alloc { .. }))
        .count();
    let mut seen = 0;
    let split = ev
        .iter()
        .position(|e| {
            if matches!(e, Event::Alloc { .. }) {
                seen += 1;
            }
            seen > allocs / 2
        })
        .unwrap_or(ev.len());
    let mut dev = AccountingDevice::new(UNLIMITED);
    let mut p = make();
    let mut front = Front::of(p.as_ref());
    let mut ids = FxMap::default();
    replay_into(&ev[..split], p.as_mut(), &mut dev, &mut front, &mut ids);
    let before = dev.calls().driver_calls();
    replay_into(&ev[split..], p.as_mut(), &mut dev, &mut front, &mut ids);
    let n = allocs - allocs / 2;
    (dev.calls().driver_calls() - before) as f64 * 1000.0 / n.max(1) as f64
}

/// Replay without cleanup, behind `front`, with the live ids (id -> address, requested
/// size, size handed out) carried in `ids`.
fn replay_into(
    events: &[Event],
    policy: &mut dyn Policy,
    dev: &mut AccountingDevice,
    front: &mut Front,
    ids: &mut FxMap<u64, (u64, u64, u64)>,
) {
    for ev in events {
        match *ev {
            Event::Alloc { id, size, stream } => {
                if let Ok(a) = front.alloc(policy, dev, Request { size, stream }) {
                    ids.insert(id, (a.addr, size, a.size));
                }
            }
            Event::Free { id, mode } => {
                if let Some((a, size, granted)) = ids.remove(&id) {
                    front.free(policy, dev, a, (size, granted), mode);
                }
            }
            Event::ProcessSync => front.process_sync(policy, dev),
            Event::StreamRetired { stream } => front.retire_stream(policy, dev, stream),
        }
    }
}

/// A default "unlimited" device size for what-if runs (1 PiB).
pub const UNLIMITED: u64 = 1 << 50;
