//! What-if questions answered by replaying a trace through the pool crate's policies on its
//! accounting device: `vramshim replay`, and the "would stitch have served it" line of every
//! post-mortem.

use std::path::Path;

use serde::Serialize;
use vramshim_pool::replay::{self, Event as Op};
use vramshim_pool::{FreeMode, PolicyKind};
use vramshim_trace::{Api, Event, Header, SyncKind, codes};

use crate::analysis::{StitchVerdict, TraceReport};
use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::input::{self, Opened};
use crate::units::bytes;

/// A device's allocation stream in the pool crate's vocabulary, with where each op came from.
pub struct Stream {
    pub device: i32,
    pub ops: Vec<Op>,
    /// For each op: (trace event index, t_ns).
    pub origin: Vec<(u64, u64)>,
    /// Failed requests (out of memory): trace event index -> (op position, size, stream the
    /// pool would order it on).
    pub failures: Vec<(u64, usize, u64, u64)>,
    pub header: Header,
    pub t0: u64,
    /// What could not be read (a torn last frame, a frame that failed its checksum), when the
    /// input was damaged: the replay used everything else.
    pub damage: Vec<String>,
}

fn is_sync_free(api: Api) -> bool {
    !matches!(api, Api::CudaFreeAsync | Api::CuMemFreeAsync)
}

/// The stream the live pool keys a recorded allocation (`alloc`) or stream-ordered free on
/// (`vramshim_pool::streams`, which the interposer shares): any stream for an allocation that
/// is not stream-ordered (`cudaMalloc`, `cuMemAlloc` and their pitched, 3D and managed
/// kinds), and a stream-ordered call's handle as the interposer translates it (the legacy
/// handle is stream 0's, the per-thread default stream the calling thread's own). An imported
/// log's allocation keeps the stream it names.
fn pool_stream(m: &vramshim_trace::MemOp, alloc: bool) -> u64 {
    request_stream((m.api, m.tid, m.flags), m.stream, alloc)
}

/// [`pool_stream`] of a call `(api, tid, flags)` on handle `stream`.
fn request_stream((api, tid, flags): (Api, u32, u8), stream: u64, alloc: bool) -> u64 {
    let per_thread = flags & vramshim_trace::flags::PER_THREAD_STREAM != 0;
    let ordered = || vramshim_pool::streams::ordered_on(stream, per_thread, || tid);
    if !alloc {
        return ordered();
    }
    match api {
        Api::CudaMalloc
        | Api::CuMemAlloc
        | Api::CudaMallocPitch
        | Api::CudaMalloc3D
        | Api::CuMemAllocPitch
        | Api::CudaMallocManaged
        | Api::CuMemAllocManaged => vramshim_pool::ANY_STREAM,
        Api::CudaMallocAsync
        | Api::CuMemAllocAsync
        | Api::CudaMallocFromPoolAsync
        | Api::CuMemAllocFromPoolAsync => ordered(),
        _ => stream,
    }
}

/// Reads the allocation stream of `device` (None: the device with the most allocations).
pub fn read_stream(mut opened: Opened, device: Option<i32>) -> Result<Stream, InputError> {
    let header = opened.header.clone();
    let mut per: FastMap<i32, Stream> = FastMap::default();
    let mut live: FastMap<(i32, u64), ()> = FastMap::default();
    let mut index = 0u64;
    let mut t0 = None;
    // Every device the trace asked for memory on (failed requests too), to name them when
    // the device asked for is not one of them.
    let mut seen: Vec<i32> = Vec::new();
    let new = |d: i32| Stream {
        device: d,
        ops: Vec::new(),
        origin: Vec::new(),
        failures: Vec::new(),
        header: Header::default(),
        t0: 0,
        damage: Vec::new(),
    };
    while let Some(ev) = opened.events.next_event() {
        let ev = ev?;
        if t0.is_none() {
            t0 = ev.t_ns();
        }
        if let Event::Alloc(m) = &ev
            && m.kind.is_device()
            && !seen.contains(&m.device)
        {
            seen.push(m.device);
        }
        match &ev {
            Event::Alloc(m) if m.kind.is_device() && device.is_none_or(|d| d == m.device) => {
                let s = per.entry(m.device).or_insert_with(|| new(m.device));
                if m.result == codes::CUDA_SUCCESS && m.addr != 0 {
                    live.insert((m.device, m.addr), ());
                    s.ops.push(Op::Alloc {
                        id: m.addr,
                        size: m.size,
                        stream: pool_stream(m, true),
                    });
                    s.origin.push((index, m.t_ns));
                } else if m.result == codes::OUT_OF_MEMORY {
                    s.failures
                        .push((index, s.ops.len(), m.size, pool_stream(m, true)));
                }
            }
            Event::Free(m)
                if m.kind.is_device()
                    && m.result == codes::CUDA_SUCCESS
                    && device.is_none_or(|d| d == m.device)
                    && live.remove(&(m.device, m.addr)).is_some() =>
            {
                let s = per.entry(m.device).or_insert_with(|| new(m.device));
                let mode = if is_sync_free(m.api) {
                    FreeMode::Sync
                } else {
                    FreeMode::Async {
                        stream: pool_stream(m, false),
                    }
                };
                s.ops.push(Op::Free { id: m.addr, mode });
                s.origin.push((index, m.t_ns));
            }
            Event::Sync {
                device: d,
                kind: SyncKind::ProcessDevice,
                t_ns,
                ..
            } => {
                for (dev, s) in per.iter_mut() {
                    if *d < 0 || *d == *dev {
                        s.ops.push(Op::ProcessSync);
                        s.origin.push((index, *t_ns));
                    }
                }
            }
            // the live pool retires a destroyed stream in every device's pool (a stream
            // created later may get its handle value)
            Event::StreamDestroy { stream, t_ns, .. } => {
                for s in per.values_mut() {
                    s.ops.push(Op::StreamRetired { stream: *stream });
                    s.origin.push((index, *t_ns));
                }
            }
            _ => {}
        }
        index += 1;
    }
    let chosen = match device {
        Some(d) if !seen.contains(&d) && !seen.is_empty() => {
            seen.sort_unstable();
            let list: Vec<String> = seen.iter().map(|d| d.to_string()).collect();
            return Err(InputError::new(
                &opened.path,
                None,
                format!(
                    "no device allocation on device {d} in this trace; --device accepts the \
                     devices it has: {}",
                    list.join(", ")
                ),
            ));
        }
        Some(d) => per.remove(&d).unwrap_or_else(|| new(d)),
        None => {
            let best = per
                .iter()
                .max_by_key(|(d, s)| (s.ops.len(), -(**d as i64)))
                .map(|(d, _)| *d)
                .unwrap_or(0);
            per.remove(&best).unwrap_or_else(|| new(best))
        }
    };
    let damage = if opened.events.damaged() {
        opened.events.warnings()
    } else {
        Vec::new()
    };
    Ok(Stream {
        header,
        t0: t0.unwrap_or(0),
        damage,
        ..chosen
    })
}

/// How many post-mortems per device get a replay (each replays the trace up to its failure).
pub const MAX_JUDGED: usize = 10;

/// The entry points vramshim's pool serves (the others go to the driver even with the pool on).
fn pool_serves(api: &str) -> bool {
    matches!(
        api,
        "cudaMalloc" | "cuMemAlloc" | "cudaMallocAsync" | "cuMemAllocAsync"
    )
}

/// What the stitch replay of one failure may use, counted as the real run counted.
struct Budget {
    /// Bytes the replayed pool may hold.
    limit: u64,
    /// How that was worked out, for the verdict's line.
    why: String,
}

/// The memory a stitch replay of `pm` may hold, counted as the real run counted it: under a
/// cap, the cap less what the cap charged beyond the trace's live bytes (the context and the
/// cap's rounding); after a device refusal, what the process demonstrably held when the device
/// refused (the device had less room than that plus the request, whatever its size, because
/// of the context and other processes). `None`: the trace does not say.
fn budget(pm: &crate::analysis::PostMortem) -> Option<Budget> {
    if pm.cause == "cap" {
        let cap = pm.cap?;
        let overhead = pm.charged.saturating_sub(pm.in_use);
        let limit = cap.saturating_sub(overhead);
        let why = if overhead > 0 {
            format!(
                "the {} cap less the {} it charged beyond the live allocations (context, rounding)",
                bytes(cap),
                bytes(overhead)
            )
        } else {
            format!("the {} cap", bytes(cap))
        };
        return Some(Budget {
            limit: pm.device_total.map_or(limit, |t| limit.min(t)),
            why,
        });
    }
    let held = pm.reserved.unwrap_or(pm.in_use);
    if held == 0 && pm.device_total.is_none() {
        return None;
    }
    Some(Budget {
        limit: held,
        why: format!(
            "the {} the process held when the device refused it (the device had no more room for it)",
            bytes(held)
        ),
    })
}

/// Where `pm`'s failed request goes in `stream` (the ops before it), and the request: at its
/// failure record, or failing that (a cap refusal with no allocation record after it) at the
/// first op after the refusal, on the stream the live pool would order it on, as the ops
/// before it (the failure record's, or the recorded call's: never the raw handle).
fn failed_request(stream: &Stream, pm: &crate::analysis::PostMortem) -> (usize, Op) {
    let idx = pm.alloc_index.unwrap_or(pm.event_index);
    let failed = stream.failures.iter().find(|f| f.0 == idx);
    let pos = failed
        .map(|f| f.1)
        .unwrap_or_else(|| stream.origin.partition_point(|o| o.0 < idx));
    let on = failed.map_or_else(|| request_stream(pm.call, pm.stream, true), |f| f.3);
    (
        pos,
        Op::Alloc {
            id: u64::MAX,
            size: pm.size,
            stream: on,
        },
    )
}

/// Fills each post-mortem's `stitch` verdict: replays the device's stream up to the failed
/// request through `stitch` within what the process could hold then ([`budget`]), then asks
/// for the request. A request that the run's own stitch pool failed is answered from the run.
pub fn judge_post_mortems(path: &Path, report: &mut TraceReport) -> Result<(), InputError> {
    for d in report.devices.iter_mut() {
        if d.post_mortems.is_empty() || d.device < 0 {
            continue;
        }
        let pool_ran = d.pooled_allocs > 0;
        let needs_replay = d
            .post_mortems
            .iter()
            .take(MAX_JUDGED)
            .any(|pm| !(pool_ran && pool_serves(&pm.api)) && budget(pm).is_some());
        let stream = if needs_replay {
            read_stream(input::open(path)?, Some(d.device))?
        } else {
            Stream {
                device: d.device,
                ops: vec![],
                origin: vec![],
                failures: vec![],
                header: Header::default(),
                t0: 0,
                damage: Vec::new(),
            }
        };
        for (i, pm) in d.post_mortems.iter_mut().enumerate() {
            if i >= MAX_JUDGED {
                pm.stitch = Some(StitchVerdict {
                    served: None,
                    capacity_bytes: None,
                    detail: format!("not replayed (only the first {MAX_JUDGED} failures are)"),
                });
                continue;
            }
            if pool_ran && pool_serves(&pm.api) {
                pm.stitch = Some(StitchVerdict {
                    served: Some(false),
                    capacity_bytes: None,
                    detail: "this run used the stitch pool, and it could not serve the request"
                        .into(),
                });
                continue;
            }
            let Some(b) = budget(pm) else {
                pm.stitch = Some(StitchVerdict {
                    served: None,
                    capacity_bytes: None,
                    detail: "the trace does not say how large the device was".into(),
                });
                continue;
            };
            if pm.size > b.limit {
                pm.stitch = Some(StitchVerdict {
                    served: Some(false),
                    capacity_bytes: Some(b.limit),
                    detail: format!(
                        "the request alone ({}) is larger than {}",
                        bytes(pm.size),
                        b.why
                    ),
                });
                continue;
            }
            let (pos, request) = failed_request(&stream, pm);
            let mut ops = stream.ops[..pos].to_vec();
            ops.push(request);
            let r = replay::run(&ops, PolicyKind::Stitch, b.limit, None);
            let served = r.completed;
            let detail = if served {
                format!(
                    "replayed {} requests within {}: stitch reserved at most {}",
                    pos + 1,
                    b.why,
                    bytes(r.peak_reserved)
                )
            } else {
                let why = r.first_failure.map(|f| f.why).unwrap_or_default();
                format!("replayed {} requests within {}: {}", pos + 1, b.why, why)
            };
            pm.stitch = Some(StitchVerdict {
                served: Some(served),
                capacity_bytes: Some(b.limit),
                detail,
            });
        }
    }
    Ok(())
}

#[derive(Clone, Debug, Serialize)]
pub struct FailureReport {
    /// Index of the request in the trace (events counted from 0).
    pub event_index: u64,
    pub t_ns: u64,
    pub offset_ns: u64,
    pub size: u64,
    /// The stream the live pool orders the request on (`vramshim_pool::streams`; u64::MAX:
    /// any stream, a request that is not stream-ordered).
    pub stream: u64,
    pub why: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct PolicyReport {
    pub policy: String,
    pub completed: bool,
    pub allocs_done: u64,
    pub first_failure: Option<FailureReport>,
    pub peak_reserved: u64,
    pub peak_live: u64,
    pub peak_device_used: u64,
    /// 1 - peak live / peak reserved.
    pub fragmentation: f64,
    pub driver_calls: u64,
    pub syncs: u64,
    pub cache_hits: u64,
    /// Allocations the live library's per-thread caches of stream-ordered frees served in
    /// front of the policy (`vramshim_pool::thread_cache`; stitch only), not in `cache_hits`.
    pub thread_cache_hits: u64,
    /// Smallest device (bytes) on which this policy completes (with --min-capacity).
    pub min_capacity: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub schema: &'static str,
    pub file: String,
    pub device: i32,
    pub device_memory: u64,
    pub device_memory_source: String,
    pub cap: Option<u64>,
    pub requests: u64,
    pub frees: u64,
    /// Largest sum of live requested bytes: no policy completes on less.
    pub peak_live: u64,
    pub policies: Vec<PolicyReport>,
    /// The same policies with every free given the same semantics (every free a `cudaFree`,
    /// then every free stream-ordered), so no policy is judged on easier rules.
    pub same_frees: Vec<SameFreesReport>,
    /// The damaged input's problems (see [`Stream::damage`]): exit status 3.
    #[serde(skip)]
    pub damage: Vec<String>,
}

/// One policy under one free semantics (`vramshim_pool::replay::compare`).
#[derive(Clone, Debug, Serialize)]
pub struct SameFreesReport {
    /// "cudaFree" or "stream-ordered".
    pub frees: &'static str,
    pub policy: String,
    pub completed: bool,
    pub peak_reserved: u64,
    pub peak_device_used: u64,
    pub driver_calls: u64,
    pub syncs: u64,
    /// See [`PolicyReport::thread_cache_hits`].
    pub thread_cache_hits: u64,
}

pub const REPLAY_SCHEMA: &str = "vramshim.replay/1";

pub fn replay(
    path: &Path,
    policies: &[PolicyKind],
    device: Option<i32>,
    device_memory: Option<u64>,
    cap: Option<u64>,
    min_capacity: bool,
) -> Result<ReplayReport, InputError> {
    let s = read_stream(input::open(path)?, device)?;
    let (mem, source) = match device_memory {
        Some(m) => (m, "--device-memory".to_string()),
        None => match s
            .header
            .devices
            .iter()
            .find(|d| d.index == s.device)
            .map(|d| d.total_bytes)
            .filter(|&t| t > 0)
        {
            Some(t) => (t, "trace header".to_string()),
            None => (
                80 << 30,
                "default (the trace does not say; use --device-memory)".to_string(),
            ),
        },
    };
    let requests = s
        .ops
        .iter()
        .filter(|o| matches!(o, Op::Alloc { .. }))
        .count() as u64;
    let frees = s
        .ops
        .iter()
        .filter(|o| matches!(o, Op::Free { .. }))
        .count() as u64;
    let mut out = Vec::new();
    for &p in policies {
        let r = replay::run(&s.ops, p, mem, cap);
        let first_failure = r.first_failure.map(|f| {
            let (idx, t) = s.origin.get(f.index).copied().unwrap_or((0, 0));
            FailureReport {
                event_index: idx,
                t_ns: t,
                offset_ns: t.saturating_sub(s.t0),
                size: f.size,
                stream: f.stream,
                why: f.why,
            }
        });
        out.push(PolicyReport {
            policy: r.policy.to_string(),
            completed: r.completed,
            allocs_done: r.allocs_done,
            first_failure,
            peak_reserved: r.peak_reserved,
            peak_live: r.peak_live,
            peak_device_used: r.peak_device_used,
            fragmentation: if r.peak_reserved > 0 {
                1.0 - r.peak_live as f64 / r.peak_reserved as f64
            } else {
                0.0
            },
            driver_calls: r.driver_calls,
            syncs: r.syncs,
            cache_hits: r.stats.cache_hits,
            thread_cache_hits: r.thread_cache_hits,
            min_capacity: if min_capacity {
                Some(replay::min_capacity(&s.ops, p))
            } else {
                None
            },
        });
    }
    let same_frees = replay::compare(&s.ops, policies, mem, cap)
        .into_iter()
        .map(|c| SameFreesReport {
            frees: c.frees.name(),
            policy: c.result.policy.to_string(),
            completed: c.result.completed,
            peak_reserved: c.result.peak_reserved,
            peak_device_used: c.result.peak_device_used,
            driver_calls: c.result.driver_calls,
            syncs: c.result.syncs,
            thread_cache_hits: c.result.thread_cache_hits,
        })
        .collect();
    Ok(ReplayReport {
        schema: REPLAY_SCHEMA,
        same_frees,
        file: path.display().to_string(),
        device: s.device,
        device_memory: mem,
        device_memory_source: source,
        cap,
        requests,
        frees,
        peak_live: replay::peak_live(&s.ops),
        policies: out,
        damage: s.damage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramshim_testkit::records::{memop, write_trace};
    use vramshim_trace::{AllocKind, MemOp};

    const MIB: u64 = 1 << 20;

    fn op(t_ns: u64, api: Api, addr: u64, stream: u64, result: i32) -> MemOp {
        MemOp {
            tid: 5,
            kind: AllocKind::Async,
            stream,
            ..memop(t_ns, api, addr, 4 * MIB, result)
        }
    }

    /// A post-mortem's failed request is replayed on the stream the live pool would order it
    /// on, with or without its failure record: a `cudaMalloc` the cap refused with no
    /// allocation record after the refusal is on any stream (not stream 0, the refusal
    /// record's "no stream", where a block freed on stream 0 would be its at once), and a
    /// failed `cudaMallocAsync` on `cudaStreamPerThread` on the thread's own stream.
    #[test]
    fn a_failed_request_is_replayed_on_the_pool_s_stream_key() {
        let events = [
            Event::Alloc(op(1_000, Api::CudaMallocAsync, 0x7000_0000, 0, 0)),
            Event::Free(op(2_000, Api::CudaFreeAsync, 0x7000_0000, 0, 0)),
            Event::CapRefusal {
                t_ns: 3_000,
                tid: 5,
                device: 0,
                api: Api::CudaMalloc,
                size: 4 * MIB,
                in_use: 0,
                cap: 8 * MIB,
            },
            Event::Alloc(op(4_000, Api::CudaMallocAsync, 0, 2, codes::OUT_OF_MEMORY)),
        ];
        let dir = vramshim_testkit::TempDir::new("whatif-stream-key");
        let path = write_trace(&dir, "whatif", &events);
        let opts = crate::analysis::Options {
            progress: false,
            ..Default::default()
        };
        let report = crate::analysis::analyze(input::open(&path).unwrap(), &opts).unwrap();
        let stream = read_stream(input::open(&path).unwrap(), Some(0)).unwrap();
        let pms = &report.devices[0].post_mortems;
        assert_eq!(pms.len(), 2, "{pms:?}");
        let on = |pm| match failed_request(&stream, pm) {
            (pos, Op::Alloc { stream, size, .. }) => (pos, stream, size),
            other => panic!("{other:?}"),
        };
        // no failure record: after the two ops, on any stream
        assert_eq!(pms[0].cause, "cap");
        assert_eq!(on(&pms[0]), (2, vramshim_pool::ANY_STREAM, 4 * MIB));
        // its failure record: the thread's own per-thread stream
        assert_eq!(
            on(&pms[1]),
            (2, vramshim_pool::streams::PER_THREAD_BASE | 5, 4 * MIB)
        );
    }

    /// A stream's destroy in the trace is the stream's retirement in the replay, where it
    /// happened: a block freed on the stream and a request on a stream created later with the
    /// same handle value are then on two streams (the model's check sees the new stream take
    /// the block only behind the event the pool records at the retirement: no early reuse),
    /// as in the live pool.
    #[test]
    fn a_stream_s_destroy_is_replayed_as_its_retirement() {
        let s = 0x7c5e_0000_0200;
        let events = [
            Event::Alloc(op(1_000, Api::CudaMallocAsync, 0x7000_0000, s, 0)),
            Event::Free(op(2_000, Api::CudaFreeAsync, 0x7000_0000, s, 0)),
            Event::StreamDestroy {
                t_ns: 3_000,
                tid: 5,
                device: 0,
                stream: s,
            },
            Event::Alloc(op(4_000, Api::CudaMallocAsync, 0x7000_0000, s, 0)),
        ];
        let dir = vramshim_testkit::TempDir::new("whatif-stream-destroy");
        let path = write_trace(&dir, "whatif", &events);
        let st = read_stream(input::open(&path).unwrap(), Some(0)).unwrap();
        assert_eq!(st.ops[2], Op::StreamRetired { stream: s }, "{:?}", st.ops);
        assert_eq!(st.ops.len(), 4);
        assert_eq!(st.origin[2], (2, 3_000));
    }
}
