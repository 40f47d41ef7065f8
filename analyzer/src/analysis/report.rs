//! The report of one trace: plain data, serializable as the documented `--json` schema
//! (docs/analyzer.md).

use std::collections::BTreeMap;

use serde::Serialize;
use vramshim_trace::{AllocKind, Api};

use super::timeline::Timeline;
use super::{Analysis, LIFETIME_LABELS, Live, Snapshot, config_map, sync_names};

pub const SCHEMA: &str = "vramshim.summary/1";

#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub file: String,
    pub format: String,
    pub process: Process,
    pub events: u64,
    pub lost_events: u64,
    pub out_of_order_events: u64,
    pub warnings: Vec<String>,
    /// The file was cut inside its last frame (everything before it was read).
    pub torn: bool,
    /// The file ends before its writer finished it (no end record, or torn): allocations live
    /// at its end may have been freed after it, so they are not reported as leaks.
    #[serde(skip)]
    pub cut_off: bool,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    pub duration_ns: u64,
    pub threads: u64,
    pub forks: Vec<u32>,
    /// CUDA calls other than allocations that failed and explain what followed (the driver's
    /// start-up, a context's creation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed_calls: Vec<FailedCall>,
    /// vramshim's pool per device as its last `PoolStats` record left it (traces written
    /// with the pool on; empty otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolReport>,
    pub stacks: u64,
    pub config: BTreeMap<String, String>,
    /// The cap's limits in force as the header lists them (`config` keeps one value per
    /// name, so only the last of them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cap_limits: Vec<super::cap_source::CapLimit>,
    pub devices: Vec<DeviceReport>,
    #[serde(skip)]
    pub timelines: Vec<(i32, Timeline)>,
    /// Every in-use change per device, (monotonic ns, bytes), when `Options::steps` was on.
    #[serde(skip)]
    pub steps: Vec<(i32, super::steps::StepLog)>,
    /// The header's monotonic start, which `start_wall_ns` is the wall-clock time of.
    #[serde(skip)]
    pub start_mono_ns: u64,
}

/// The pool's statistics on one device, from the trace's last `PoolStats` record of it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolReport {
    pub device: i32,
    /// Bytes of physical pages held.
    pub reserved: u64,
    /// The most `reserved` seen in the records.
    pub peak_reserved: u64,
    pub live: u64,
    pub cached: u64,
    pub pending: u64,
    /// 0: no budget.
    pub budget: u64,
    /// Pages given back to the driver.
    pub releases: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct FailedCall {
    pub t_ns: u64,
    pub offset_ns: u64,
    pub name: String,
    /// -1: no device concerned.
    pub device: i32,
    pub result: i32,
    /// The code's name and what it means, when known.
    pub meaning: String,
}

impl FailedCall {
    /// `cuInit returned 100 (CUDA_ERROR_NO_DEVICE: no CUDA-capable device is visible)`.
    pub fn describe(&self) -> String {
        let on = if self.device >= 0 {
            format!(" on device {}", self.device)
        } else {
            String::new()
        };
        if self.meaning.is_empty() {
            format!("{}{on} returned {}", self.name, self.result)
        } else {
            format!(
                "{}{on} returned {} ({})",
                self.name, self.result, self.meaning
            )
        }
    }
}

/// The name and meaning of the driver's start-up codes (`CUresult`).
pub fn cuda_error_meaning(code: i32) -> &'static str {
    match code {
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY: no room on the device for the context",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY: the CUDA driver library is a stub, not a real driver",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE: the device is busy or unavailable (exclusive mode?)",
        100 => "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is visible (CUDA_VISIBLE_DEVICES?)",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        303 => "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: the driver and the kernel module differ",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "",
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub host: String,
    pub cmdline: Vec<String>,
    pub start_wall_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    /// Device ordinal; -1 is host (pinned) memory.
    pub device: i32,
    pub name: String,
    pub total_bytes: Option<u64>,
    /// `GPU-...`, when the trace recorded the device's UUID (lines up ranks' traces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    pub first_ns: Option<u64>,
    pub last_ns: u64,
    pub calls: Vec<CallRow>,
    pub allocs: u64,
    pub frees: u64,
    pub failed_allocs: u64,
    /// Allocations that failed with CUDA_ERROR_INVALID_CONTEXT (no current context) and that
    /// the same thread's next allocation repeated successfully: NVIDIA's runtime makes its
    /// context current and retries, and the program never sees the failure. Not in
    /// `failed_allocs`.
    #[serde(skip_serializing_if = "is_zero")]
    pub retried_allocs: u64,
    pub pooled_allocs: u64,
    pub bytes_allocated: u64,
    pub unknown_frees: u64,
    pub reused_addresses: u64,
    pub in_use_at_exit: u64,
    pub peak_in_use: Peak,
    pub peak_reserved: Option<PeakReserved>,
    pub fragmentation: Option<f64>,
    pub cap: Option<u64>,
    /// What set the cap (`CUDA_DEVICE_MEMORY_LIMIT_0="256m"`, a cgroup's `dmem.max`...), when
    /// the trace lists its limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_source: Option<String>,
    pub size_histogram: Vec<SizeBucket>,
    pub lifetimes: Vec<LifetimeBucket>,
    pub short_lived: Churn,
    pub temporary: Churn,
    pub leaks: Leaks,
    pub top_sites: Vec<Site>,
    pub syncs: BTreeMap<String, u64>,
    pub pool_trims: u64,
    pub pool_trimmed_bytes: u64,
    pub mem_info_queries: u64,
    pub refusals: u64,
    pub ooms: u64,
    pub post_mortems: Vec<PostMortem>,
    pub post_mortems_not_shown: u64,
    /// PyTorch's tensors at its peak of allocated bytes (traces with tensor-level events;
    /// absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_peak: Option<super::torch::TorchView>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Serialize)]
pub struct CallRow {
    pub api: String,
    pub kind: String,
    /// "alloc" or "free".
    pub op: String,
    pub count: u64,
    pub failed: u64,
    /// Failures for want of a current context that the runtime retried at once (not in
    /// `failed`).
    #[serde(skip_serializing_if = "is_zero")]
    pub retried: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, Default)]
pub struct Peak {
    pub bytes: u64,
    pub t_ns: u64,
    /// Nanoseconds since the first event of the trace.
    pub offset_ns: u64,
    pub event_index: u64,
    pub live_allocations: u64,
    pub top_allocations: Vec<Holder>,
    pub top_sites: Vec<SiteHolder>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PeakReserved {
    pub bytes: u64,
    pub t_ns: u64,
    pub offset_ns: u64,
    /// In use when reserved peaked.
    pub in_use_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub addr: String,
    pub size: u64,
    pub t_ns: u64,
    pub api: String,
    pub kind: String,
    pub stream: u64,
    pub tid: u32,
    pub pooled: bool,
    pub stack: u32,
    pub site: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteHolder {
    pub stack: u32,
    pub site: String,
    pub bytes: u64,
    pub allocations: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SizeBucket {
    /// Sizes in [min, max] (powers of two).
    pub min: u64,
    pub max: u64,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LifetimeBucket {
    pub label: String,
    /// Upper bound in ns (exclusive); null for the last bucket.
    pub below_ns: Option<u64>,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Churn {
    pub count: u64,
    pub bytes: u64,
    /// Of all allocations.
    pub fraction: f64,
    pub threshold_ns: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Leaks {
    pub count: u64,
    pub bytes: u64,
    pub top_allocations: Vec<Holder>,
    pub top_sites: Vec<SiteHolder>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Site {
    pub stack: u32,
    pub site: String,
    pub frames: Vec<String>,
    pub allocs: u64,
    pub bytes: u64,
    pub failed: u64,
    pub temporary: u64,
    /// Bytes this site held at the in-use peak.
    pub peak_bytes: u64,
    /// Bytes still live at exit.
    pub leaked_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LargerCap {
    /// The cap that would have let this request through (charged bytes + request).
    pub needed_bytes: u64,
    /// How much more than the cap in force that is.
    pub extra_bytes: u64,
}

impl LargerCap {
    pub fn new(charged: u64, size: u64, cap: u64) -> LargerCap {
        let needed = charged.saturating_add(size);
        LargerCap {
            needed_bytes: needed,
            extra_bytes: needed.saturating_sub(cap),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct StitchVerdict {
    /// Whether the stitch pool, replaying the trace up to this request on the same device size
    /// and cap, would have served it. None when it could not be judged.
    pub served: Option<bool>,
    pub capacity_bytes: Option<u64>,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct PostMortem {
    /// "cap" (vramshim's cap refused it) or "device" (the driver ran out).
    pub cause: String,
    pub event_index: u64,
    pub alloc_index: Option<u64>,
    pub t_ns: u64,
    pub offset_ns: u64,
    pub api: String,
    pub kind: Option<String>,
    pub size: u64,
    pub stream: u64,
    pub stack: u32,
    pub site: String,
    pub frames: Vec<String>,
    /// Live bytes the trace accounts for at that moment.
    pub in_use: u64,
    /// Bytes the cap charged (pooled: reserved); equals in_use otherwise.
    pub charged: u64,
    pub reserved: Option<u64>,
    /// Reserved but not in use (pool cache).
    pub cached: Option<u64>,
    pub cap: Option<u64>,
    /// What set the cap, when the trace lists its limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_source: Option<String>,
    pub device_total: Option<u64>,
    pub live_allocations: u64,
    pub top_allocations: Vec<Holder>,
    pub top_sites: Vec<SiteHolder>,
    pub larger_cap: Option<LargerCap>,
    /// What would have served it with a larger device (device OOMs).
    pub larger_device: Option<LargerCap>,
    pub stitch: Option<StitchVerdict>,
    /// The call as the trace recorded it: API, thread and flags (with `stream`, what the
    /// stitch what-if keys the request on when no failure record names its stream).
    #[serde(skip)]
    pub(crate) call: (Api, u32, u8),
    /// PyTorch's tensors at the failure (traces with tensor-level events; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch: Option<super::torch::TorchView>,
    #[serde(skip)]
    pub(crate) snap: Option<Snapshot>,
    #[serde(skip)]
    pub(crate) torch_snap: Option<super::torch::TorchSnap>,
}

impl PostMortem {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cause: &str,
        index: u64,
        t_ns: u64,
        api: Api,
        kind: Option<AllocKind>,
        size: u64,
        stack: u32,
        stream: u64,
        in_use: u64,
        reserved: Option<u64>,
        cap: Option<u64>,
        total: Option<u64>,
        snap: Snapshot,
    ) -> PostMortem {
        let charged = reserved.unwrap_or(in_use).max(in_use);
        PostMortem {
            cause: cause.to_string(),
            event_index: index,
            alloc_index: if cause == "device" { Some(index) } else { None },
            t_ns,
            offset_ns: 0,
            api: api.name().to_string(),
            kind: kind.map(|k| k.name().to_string()),
            size,
            stream,
            stack,
            site: String::new(),
            frames: vec![],
            in_use,
            charged,
            reserved,
            cached: reserved.map(|r| r.saturating_sub(in_use)),
            cap,
            cap_source: None,
            device_total: total,
            live_allocations: snap.live_count,
            top_allocations: vec![],
            top_sites: vec![],
            larger_cap: cap.map(|c| LargerCap::new(charged, size, c)),
            larger_device: if cause == "device" {
                total.map(|t| LargerCap::new(charged, size, t))
            } else {
                None
            },
            stitch: None,
            call: (api, 0, 0),
            torch: None,
            snap: Some(snap),
            torch_snap: None,
        }
    }
}

fn holder(a: &mut Analysis, addr: u64, l: &Live) -> Holder {
    Holder {
        addr: format!("0x{addr:x}"),
        size: l.size,
        t_ns: l.t_ns,
        api: l.api.name().to_string(),
        kind: l.kind.name().to_string(),
        stream: l.stream,
        tid: l.tid,
        pooled: l.flags & vramshim_trace::flags::POOLED != 0,
        stack: l.stack,
        site: a.symbols.label(l.stack),
    }
}

fn site_holders(a: &mut Analysis, sites: &[(u32, u64, u64)]) -> Vec<SiteHolder> {
    sites
        .iter()
        .map(|&(stack, bytes, n)| SiteHolder {
            stack,
            site: a.symbols.label(stack),
            bytes,
            allocations: n,
        })
        .collect()
}

pub(crate) fn build(mut a: Analysis, warnings: Vec<String>) -> TraceReport {
    let t0 = a.first_t.unwrap_or(0);
    let mut devices = Vec::new();
    let mut timelines = Vec::new();
    let mut steps = Vec::new();
    let mut devs = std::mem::take(&mut a.devices);
    devs.sort_by_key(|d| d.device);
    let top = a.opts.top;
    let max_frames = a.opts.max_frames;
    for mut d in devs {
        let info = a
            .header
            .devices
            .iter()
            .find(|i| i.index == d.device)
            .cloned();
        let mut calls = Vec::new();
        for (i, c) in d.calls.iter().enumerate() {
            if c.count == 0 {
                continue;
            }
            let api = Api::from_u16((i >> 4) as u16).unwrap_or(Api::Unknown);
            let kind = AllocKind::from_u8(((i >> 1) & 7) as u8).unwrap_or(AllocKind::Runtime);
            calls.push(CallRow {
                api: api.name().to_string(),
                kind: kind.name().to_string(),
                op: if i & 1 == 1 { "free" } else { "alloc" }.to_string(),
                count: c.count,
                failed: c.failed,
                retried: c.retried,
                bytes: c.bytes,
            });
        }
        calls.sort_by(|x, y| {
            y.count
                .cmp(&x.count)
                .then(x.api.cmp(&y.api))
                .then(x.op.cmp(&y.op))
        });
        let snap = d.peak_snap.take().unwrap_or_default();
        let peak = Peak {
            bytes: d.peak,
            t_ns: d.peak_t,
            offset_ns: d.peak_t.saturating_sub(t0),
            event_index: d.peak_index,
            live_allocations: snap.live_count,
            top_allocations: snap
                .top_allocs
                .iter()
                .map(|(addr, l)| holder(&mut a, *addr, l))
                .collect(),
            top_sites: site_holders(&mut a, &snap.top_sites),
        };
        let peak_sites: BTreeMap<u32, u64> = snap.top_sites.iter().map(|s| (s.0, s.1)).collect();
        // Host memory (device -1) is held by no device.
        let held = Some(d.peak_reserved).filter(|p| d.device >= 0 && p.0 > 0);
        let peak_reserved = held.map(|(bytes, t, inuse)| PeakReserved {
            bytes,
            t_ns: t,
            offset_ns: t.saturating_sub(t0),
            in_use_bytes: inuse,
        });
        let fragmentation =
            held.map(|(r, _, inuse)| (1.0 - inuse as f64 / r as f64).clamp(0.0, 1.0));
        let size_histogram = d
            .size_hist
            .iter()
            .enumerate()
            .filter(|(_, b)| b.0 > 0)
            .map(|(i, b)| SizeBucket {
                min: if i == 0 { 0 } else { 1u64 << (i - 1) },
                max: if i == 0 {
                    0
                } else if i == 64 {
                    u64::MAX
                } else {
                    (1u64 << i) - 1
                },
                count: b.0,
                bytes: b.1,
            })
            .collect();
        let lifetimes = d
            .life_hist
            .iter()
            .enumerate()
            .map(|(i, b)| LifetimeBucket {
                label: LIFETIME_LABELS[i].to_string(),
                below_ns: super::LIFETIME_EDGES.get(i).copied(),
                count: b.0,
                bytes: b.1,
            })
            .collect();
        let frac = |n: u64| {
            if d.allocs > 0 {
                n as f64 / d.allocs as f64
            } else {
                0.0
            }
        };
        // Leaks: what is still live at exit.
        let exit = d.snapshot(top);
        let leaks = Leaks {
            count: exit.live_count,
            bytes: d.in_use,
            top_allocations: exit
                .top_allocs
                .iter()
                .map(|(addr, l)| holder(&mut a, *addr, l))
                .collect(),
            top_sites: site_holders(&mut a, &exit.top_sites),
        };
        let mut site_list: Vec<(u32, super::SiteAcc)> =
            d.sites.iter().map(|(k, v)| (k, *v)).collect();
        site_list.sort_unstable_by(|x, y| {
            let px = peak_sites.get(&x.0).copied().unwrap_or(0);
            let py = peak_sites.get(&y.0).copied().unwrap_or(0);
            py.cmp(&px)
                .then(y.1.bytes.cmp(&x.1.bytes))
                .then(x.0.cmp(&y.0))
        });
        let top_sites = site_list
            .iter()
            .filter(|(_, s)| s.allocs > 0 || s.failed > 0)
            .take(top)
            .map(|(k, s)| Site {
                stack: *k,
                site: a.symbols.label(*k),
                frames: a.symbols.frames(*k, max_frames),
                allocs: s.allocs,
                bytes: s.bytes,
                failed: s.failed,
                temporary: s.temporary,
                peak_bytes: peak_sites.get(k).copied().unwrap_or(0),
                leaked_bytes: s.live,
            })
            .collect();
        let mut syncs = BTreeMap::new();
        for (k, name) in sync_names() {
            if d.syncs[k as usize] > 0 {
                syncs.insert(name.to_string(), d.syncs[k as usize]);
            }
        }
        let mut post_mortems = Vec::new();
        for p in std::mem::take(&mut d.post_mortems) {
            let mut pm = p.pm;
            pm.offset_ns = pm.t_ns.saturating_sub(t0);
            pm.site = a.symbols.label(pm.stack);
            pm.cap_source = pm
                .cap
                .and_then(|c| super::cap_source::cap_source(&a.header, d.device, c));
            pm.frames = a.symbols.frames(pm.stack, max_frames);
            if let Some(s) = pm.snap.take() {
                pm.top_allocations = s
                    .top_allocs
                    .iter()
                    .map(|(addr, l)| holder(&mut a, *addr, l))
                    .collect();
                pm.top_sites = site_holders(&mut a, &s.top_sites);
            }
            if let Some(s) = pm.torch_snap.take() {
                let v = a.torch.view(&s, t0, max_frames);
                // The Python line that asked names the failure.
                if let Some(f) = &v.failed {
                    pm.site = f.site.clone();
                }
                pm.torch = Some(v);
            }
            post_mortems.push(pm);
        }
        devices.push(DeviceReport {
            device: d.device,
            name: info.as_ref().map(|i| i.name.clone()).unwrap_or_else(|| {
                if d.device < 0 {
                    "host".into()
                } else {
                    format!("device {}", d.device)
                }
            }),
            uuid: info.as_ref().and_then(|i| i.uuid_text()),
            total_bytes: info.map(|i| i.total_bytes).filter(|&t| t > 0),
            first_ns: d.first_t,
            last_ns: d.last_t,
            calls,
            allocs: d.allocs,
            frees: d.frees,
            failed_allocs: d.failed,
            retried_allocs: d.retried,
            pooled_allocs: d.pooled,
            bytes_allocated: d.bytes,
            unknown_frees: d.unknown_frees,
            reused_addresses: d.replaced,
            in_use_at_exit: d.in_use,
            peak_in_use: peak,
            peak_reserved,
            fragmentation,
            cap: d.cap,
            cap_source: d
                .cap
                .and_then(|c| super::cap_source::cap_source(&a.header, d.device, c)),
            size_histogram,
            lifetimes,
            short_lived: Churn {
                count: d.short_lived.0,
                bytes: d.short_lived.1,
                fraction: frac(d.short_lived.0),
                threshold_ns: Some(a.opts.short_lived_ns),
            },
            temporary: Churn {
                count: d.temporary.0,
                bytes: d.temporary.1,
                fraction: frac(d.temporary.0),
                threshold_ns: None,
            },
            leaks,
            top_sites,
            syncs,
            pool_trims: d.trims.0,
            pool_trimmed_bytes: d.trims.1,
            mem_info_queries: d.mem_info,
            refusals: d.refusals,
            ooms: d.ooms,
            post_mortems,
            post_mortems_not_shown: d.post_mortems_dropped,
            torch_peak: a
                .torch
                .peak(d.device)
                .map(|s| a.torch.view(&s, t0, max_frames)),
        });
        timelines.push((d.device, d.timeline));
        // Only a device with a UUID can be lined up with another trace's: drop the others'
        // logs now rather than holding them through the next traces.
        let has_uuid = devices
            .last()
            .is_some_and(|r: &DeviceReport| r.uuid.is_some());
        steps.push((
            d.device,
            if has_uuid {
                std::mem::take(&mut d.steps)
            } else {
                Default::default()
            },
        ));
    }
    let h = &a.header;
    let mut warnings = warnings;
    if a.lost > 0 {
        warnings.push(format!(
            "{} events were lost by the writer (the figures undercount)",
            a.lost
        ));
    }
    if a.out_of_order > 0 {
        warnings.push(format!(
            "{} events had a time earlier than the one before",
            a.out_of_order
        ));
    }
    TraceReport {
        file: a.path.clone(),
        format: a.format.name().to_string(),
        process: Process {
            pid: h.pid,
            ppid: h.ppid,
            host: h.host.clone(),
            cmdline: h.cmdline.clone(),
            start_wall_ns: h.start_wall_ns,
        },
        events: a.index,
        lost_events: a.lost,
        out_of_order_events: a.out_of_order,
        warnings,
        torn: false,
        cut_off: false,
        first_ns: a.first_t,
        last_ns: a.first_t.map(|_| a.last_t),
        duration_ns: a.last_t.saturating_sub(t0),
        threads: a.threads.len() as u64,
        forks: a.forks.clone(),
        failed_calls: a
            .failed_calls
            .iter()
            .map(|(t, name, device, result)| FailedCall {
                t_ns: *t,
                offset_ns: t.saturating_sub(a.first_t.unwrap_or(0)),
                name: name.clone(),
                device: *device,
                result: *result,
                meaning: cuda_error_meaning(*result).to_string(),
            })
            .collect(),
        pools: a.pools.values().cloned().collect(),
        stacks: a.symbols.stack_count() as u64,
        config: config_map(h),
        cap_limits: super::cap_source::limits(h),
        devices,
        timelines,
        steps,
        start_mono_ns: h.start_mono_ns,
    }
}

impl TraceReport {
    /// The device (not host) peak in use, summed over devices.
    pub fn peak_in_use(&self) -> u64 {
        self.devices
            .iter()
            .filter(|d| d.device >= 0)
            .map(|d| d.peak_in_use.bytes)
            .sum()
    }
    pub fn peak_reserved(&self) -> Option<u64> {
        let v: Vec<u64> = self
            .devices
            .iter()
            .filter(|d| d.device >= 0)
            .filter_map(|d| d.peak_reserved.as_ref().map(|p| p.bytes))
            .collect();
        if v.is_empty() {
            None
        } else {
            Some(v.iter().sum())
        }
    }
    pub fn allocs(&self) -> u64 {
        self.devices.iter().map(|d| d.allocs).sum()
    }
    pub fn bytes_allocated(&self) -> u64 {
        self.devices.iter().map(|d| d.bytes_allocated).sum()
    }
    pub fn label(&self) -> String {
        let name = std::path::Path::new(&self.file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        name.unwrap_or_else(|| self.file.clone())
    }
}
