//! Trace -> report, in one streaming pass with bounded memory (the live set, the call sites and
//! a fixed-size timeline; never the event list).

pub mod by_gpu;
pub mod cap_source;
pub mod compare;
pub mod diff;
mod fast;
mod liveset;
pub mod report;
pub mod reserved;
mod sites;
pub mod steps;
pub mod timeline;
pub mod torch;

use std::collections::BTreeMap;

use vramshim_trace::{AllocKind, Api, Event, Header, MemOp, SyncKind, codes, flags};

use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::progress::Progress;
use crate::source::{Format, Opened};
use crate::symbols::{Module, Symbolizer};
use liveset::LiveSet;
pub use report::*;
use reserved::Holdings;
use sites::SiteTable;
use timeline::Timeline;

#[derive(Clone, Debug)]
pub struct Options {
    /// How many entries each "largest/top" list keeps.
    pub top: usize,
    /// Allocations freed sooner than this are "short-lived".
    pub short_lived_ns: u64,
    /// Timeline points per device.
    pub timeline_points: usize,
    /// Track in-use memory over time (the report's chart). `summary` prints no timeline and
    /// turns it off: one bucket update per Alloc/Free saved. Marks, caps and reserved figures
    /// (rare events) are kept either way.
    pub timeline: bool,
    /// Keep every change of in-use bytes per device, exactly (time, bytes): what lines up
    /// the traces of several processes on one GPU (`by_gpu`). 16 bytes per allocation and
    /// free, so only `summary` of several traces turns it on.
    pub steps: bool,
    /// Post-mortems described in detail; later ones are only counted.
    pub max_post_mortems: usize,
    /// Frames shown per stack.
    pub max_frames: usize,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            top: 10,
            short_lived_ns: 1_000_000,
            timeline_points: 2000,
            timeline: true,
            steps: false,
            max_post_mortems: 100,
            max_frames: 16,
            progress: true,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Live {
    pub size: u64,
    pub t_ns: u64,
    pub stream: u64,
    pub stack: u32,
    pub tid: u32,
    pub api: Api,
    pub kind: AllocKind,
    pub flags: u8,
}

impl Live {
    pub(crate) const EMPTY: Live = Live {
        size: 0,
        t_ns: 0,
        stream: 0,
        stack: 0,
        tid: 0,
        api: Api::Unknown,
        kind: AllocKind::Runtime,
        flags: 0,
    };
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SiteAcc {
    pub allocs: u64,
    pub bytes: u64,
    pub live: u64,
    pub live_count: u64,
    pub failed: u64,
    pub temporary: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallAcc {
    pub count: u64,
    pub failed: u64,
    /// Failures the runtime retried at once and hid (see [`Analysis::retry`]).
    pub retried: u64,
    pub bytes: u64,
}

/// The live set at one instant, reduced to its largest holders.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub live_count: u64,
    pub top_allocs: Vec<(u64, Live)>,
    pub top_sites: Vec<(u32, u64, u64)>,
}

pub(crate) struct PendingPm {
    pub pm: PostMortem,
    pub tid: u32,
    pub linked: bool,
    /// Fast path only: the reorder batch of the event, and (time, batch) of the failed Alloc
    /// that `alloc_index` names, so `fast` can renumber both exactly.
    pub batch: u64,
    pub alloc_at: (u64, u64),
}

const LIFETIME_EDGES: [u64; 9] = [
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    100_000_000_000,
];
pub const LIFETIME_LABELS: [&str; 10] = [
    "<1us", "1-10us", "10-100us", "0.1-1ms", "1-10ms", "10-100ms", "0.1-1s", "1-10s", "10-100s",
    ">=100s",
];

pub(crate) struct DevState {
    pub device: i32,
    pub live: LiveSet,
    pub sites: SiteTable,
    pub calls: Vec<CallAcc>,
    pub in_use: u64,
    pub peak: u64,
    pub peak_t: u64,
    pub peak_index: u64,
    /// Fast path only: the reorder batch of the peak's event (see `fast`).
    pub peak_batch: u64,
    pub peak_pending: bool,
    pub peak_snap: Option<Snapshot>,
    /// What the process holds from the device ([`reserved`]).
    pub held: Holdings,
    /// Peak of [`DevState::reserved`]: (bytes, time, in use then).
    pub peak_reserved: (u64, u64, u64),
    pub cap: Option<u64>,
    pub size_hist: [(u64, u64); 65],
    pub life_hist: [(u64, u64); 10],
    pub short_lived: (u64, u64),
    pub temporary: (u64, u64),
    pub last_alloc: Option<u64>,
    pub allocs: u64,
    pub frees: u64,
    pub failed: u64,
    /// Allocations that failed for want of a current context and succeeded when the same
    /// thread retried them at once: not in `failed`.
    pub retried: u64,
    pub bytes: u64,
    pub pooled: u64,
    pub unknown_frees: u64,
    pub replaced: u64,
    pub trims: (u64, u64),
    pub syncs: [u64; 5],
    pub mem_info: u64,
    pub refusals: u64,
    pub ooms: u64,
    pub post_mortems: Vec<PendingPm>,
    pub post_mortems_dropped: u64,
    pub timeline: Timeline,
    /// Every in-use change (`Options::steps`).
    pub steps: steps::StepLog,
    pub first_t: Option<u64>,
    pub last_t: u64,
}

impl DevState {
    fn new(device: i32, t0: u64, opts: &Options) -> DevState {
        DevState {
            device,
            live: LiveSet::default(),
            sites: SiteTable::default(),
            calls: vec![CallAcc::default(); 64 * 8 * 2],
            in_use: 0,
            peak: 0,
            peak_t: 0,
            peak_index: 0,
            peak_batch: 0,
            peak_pending: false,
            peak_snap: None,
            held: Holdings::default(),
            peak_reserved: (0, 0, 0),
            cap: None,
            size_hist: [(0, 0); 65],
            life_hist: [(0, 0); 10],
            short_lived: (0, 0),
            temporary: (0, 0),
            last_alloc: None,
            allocs: 0,
            frees: 0,
            failed: 0,
            retried: 0,
            bytes: 0,
            pooled: 0,
            unknown_frees: 0,
            replaced: 0,
            trims: (0, 0),
            syncs: [0; 5],
            mem_info: 0,
            refusals: 0,
            ooms: 0,
            post_mortems: Vec::new(),
            post_mortems_dropped: 0,
            timeline: Timeline::new(t0, opts.timeline_points),
            steps: steps::StepLog::default(),
            first_t: None,
            last_t: 0,
        }
    }

    #[inline]
    fn touch(&mut self, t: u64) {
        if self.first_t.is_none() {
            self.first_t = Some(t);
        }
        if t > self.last_t {
            self.last_t = t;
        }
    }

    /// What the process holds from this device now ([`reserved`]).
    #[inline]
    pub(crate) fn reserved(&self) -> u64 {
        self.held.reserved()
    }

    /// Records a change of what is held; `t` is its time.
    #[inline]
    fn held_changed(&mut self, t: u64, timeline: bool) {
        let r = self.reserved();
        if r > self.peak_reserved.0 {
            self.peak_reserved = (r, t, self.in_use);
        }
        if timeline {
            self.timeline.in_use_reserved(t, self.in_use, r);
        }
    }

    pub(crate) fn snapshot(&self, top: usize) -> Snapshot {
        let mut best: Vec<(u64, Live)> = Vec::with_capacity(top + 1);
        // The `top` largest by (size descending, address ascending): a total order, so the
        // live set's iteration order (a hash table's) does not pick among equal sizes.
        let before = |a: (u64, u64), b: (u64, u64)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0);
        for (addr, l) in self.live.iter() {
            if best.len() < top
                || best
                    .last()
                    .is_some_and(|b| before((addr, l.size), (b.0, b.1.size)))
            {
                let pos = best.partition_point(|b| before((b.0, b.1.size), (addr, l.size)));
                best.insert(pos, (addr, *l));
                best.truncate(top);
            }
        }
        let mut sites: Vec<(u32, u64, u64)> = self
            .sites
            .iter()
            .filter(|(_, s)| s.live > 0)
            .map(|(k, s)| (k, s.live, s.live_count))
            .collect();
        sites.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        sites.truncate(top);
        Snapshot {
            live_count: self.live.len() as u64,
            top_allocs: best,
            top_sites: sites,
        }
    }
}

#[inline]
fn call_slot(api: Api, kind: AllocKind, free: bool) -> usize {
    ((api as usize & 63) << 4) | ((kind as usize & 7) << 1) | free as usize
}

/// Per bit length `b` of a lifetime (values in `[2^(b-1), 2^b)`): the number of edges at or
/// below the range's start, and the one edge inside the range minus 1 (`u64::MAX`: none, which
/// no lifetime exceeds). A factor of 2 holds at most one power of 10, so one compare finishes the
/// count.
const LIFETIME_BY_BITS: ([u8; 65], [u64; 65]) = {
    let mut base = [0u8; 65];
    let mut edge = [u64::MAX; 65];
    let mut b = 0;
    while b <= 64 {
        let lo: u64 = if b == 0 { 0 } else { 1 << (b - 1) };
        let hi: u64 = if b == 64 { u64::MAX } else { (1 << b) - 1 };
        let mut i = 0;
        while i < LIFETIME_EDGES.len() {
            let e = LIFETIME_EDGES[i];
            if e <= lo {
                base[b] += 1;
            } else if e <= hi {
                edge[b] = e - 1;
            }
            i += 1;
        }
        b += 1;
    }
    (base, edge)
};

#[inline]
fn lifetime_bucket(ns: u64) -> usize {
    // The number of edges at or below `ns` from its bit length and one compare (lifetimes
    // jump between buckets from one free to the next, so no branches; `ilog10` was ~11
    // instructions).
    let b = (64 - ns.leading_zeros()) as usize;
    LIFETIME_BY_BITS.0[b] as usize + (ns > LIFETIME_BY_BITS.1[b]) as usize
}

#[inline]
fn size_bucket(size: u64) -> usize {
    (64 - size.leading_zeros()) as usize
}

/// Failed calls (`CallFailed`) kept per trace: the first ones explain the rest.
const MAX_FAILED_CALLS: usize = 16;

/// The streaming analysis of one trace.
pub struct Analysis {
    pub(crate) opts: Options,
    pub(crate) header: Header,
    pub(crate) path: String,
    pub(crate) format: Format,
    pub(crate) devices: Vec<DevState>,
    pub(crate) symbols: Symbolizer,
    pub(crate) index: u64,
    pub(crate) first_t: Option<u64>,
    pub(crate) last_t: u64,
    pub(crate) lost: u64,
    pub(crate) threads: FastMap<u32, ()>,
    pub(crate) forks: Vec<u32>,
    /// `CallFailed` records (the first [`MAX_FAILED_CALLS`]): (time, name, device, result).
    pub(crate) failed_calls: Vec<(u64, String, i32, i32)>,
    /// The pool's last statistics per device (`PoolStats` records), and the most it held.
    pub(crate) pools: std::collections::BTreeMap<i32, report::PoolReport>,
    pub(crate) out_of_order: u64,
    /// Thread ids already in `threads`, direct-mapped by the low bits (threads alternate, so
    /// "same as the last one" misses often).
    tid_seen: [u32; 64],
    /// The reorder batch of the events being fed (fast path only; see `fast`).
    pub(crate) batch: u64,
    /// The tensor level (PyTorch's caching allocator), when the trace has one.
    pub(crate) torch: torch::TorchState,
    /// Per thread (the last [`MAX_RETRY_THREADS`]), its last allocation when that failed with
    /// `CUDA_ERROR_INVALID_CONTEXT`: a retry of the same request by the same thread next makes
    /// it a hidden retry rather than a failure.
    retry_pending: Vec<PendingRetry>,
}

/// An allocation that failed for want of a current context, awaiting its thread's next one.
#[derive(Clone, Copy)]
struct PendingRetry {
    tid: u32,
    device: i32,
    api: Api,
    kind: AllocKind,
    size: u64,
    stack: u32,
}

const MAX_RETRY_THREADS: usize = 64;
/// The driver's "no context is current on this thread".
const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;

impl Analysis {
    pub fn new(opts: Options, header: Header, path: &str, format: Format) -> Analysis {
        let mut symbols = Symbolizer::default();
        symbols.set_trace_start(header.start_wall_ns);
        Analysis {
            opts,
            header,
            path: path.to_string(),
            format,
            devices: Vec::new(),
            symbols,
            index: 0,
            first_t: None,
            last_t: 0,
            lost: 0,
            threads: FastMap::default(),
            forks: Vec::new(),
            failed_calls: Vec::new(),
            pools: std::collections::BTreeMap::new(),
            out_of_order: 0,
            // Slot i starts with a value whose low bits are not i: matches no thread.
            tid_seen: std::array::from_fn(|i| i as u32 + 1),
            batch: 0,
            torch: torch::TorchState::default(),
            retry_pending: Vec::new(),
        }
    }

    #[inline]
    fn dev(&mut self, device: i32) -> &mut DevState {
        // Devices are few; the last one used is the likeliest.
        let n = self.devices.len();
        if n > 0 && self.devices[n - 1].device == device {
            return &mut self.devices[n - 1];
        }
        self.dev_slow(device)
    }

    #[cold]
    #[inline(never)]
    fn dev_slow(&mut self, device: i32) -> &mut DevState {
        if let Some(i) = self.devices.iter().position(|d| d.device == device) {
            // Move to the back so the next lookup is O(1).
            let d = self.devices.remove(i);
            self.devices.push(d);
        } else {
            let t0 = self.first_t.unwrap_or(0);
            self.devices.push(DevState::new(device, t0, &self.opts));
        }
        self.devices.last_mut().expect("just pushed")
    }

    #[inline]
    fn clock(&mut self, t: u64) {
        if self.first_t.is_none() {
            self.first_t = Some(t);
        }
        if t < self.last_t {
            self.out_of_order += 1;
        } else {
            self.last_t = t;
        }
    }

    #[inline]
    fn thread(&mut self, tid: u32) {
        let slot = &mut self.tid_seen[tid as usize & 63];
        if *slot != tid {
            *slot = tid;
            self.threads.insert(tid, ());
        }
    }

    /// Feeds one event.
    #[inline]
    pub fn feed(&mut self, ev: Event) {
        match ev {
            Event::Alloc(m) => {
                self.clock(m.t_ns);
                self.thread(m.tid);
                self.alloc(&m);
            }
            Event::Free(m) => {
                self.clock(m.t_ns);
                self.thread(m.tid);
                self.free(&m);
            }
            other => self.other(other),
        }
        self.index += 1;
    }

    #[inline(always)]
    fn alloc(&mut self, m: &MemOp) {
        let index = self.index;
        let batch = self.batch;
        let top = self.opts.top;
        let max_pm = self.opts.max_post_mortems;
        let timeline = self.opts.timeline;
        let steps = self.opts.steps;
        let failed = m.result != codes::CUDA_SUCCESS || m.addr == 0;
        let retry_of = if self.retry_pending.is_empty() && m.result != CUDA_ERROR_INVALID_CONTEXT {
            None
        } else {
            self.retry(m, failed)
        };
        let d = self.dev(m.device);
        d.touch(m.t_ns);
        let c = &mut d.calls[call_slot(m.api, m.kind, false)];
        c.count += 1;
        if failed {
            c.failed += 1;
            d.failed += 1;
            d.sites.entry(m.stack).failed += 1;
            if m.result == codes::OUT_OF_MEMORY {
                self.oom(m, index, top, max_pm);
            }
            return;
        }
        if let Some(p) = retry_of {
            // The failure just before was this request (same call, so same row), retried at
            // once: the runtime hid it.
            c.failed -= 1;
            c.retried += 1;
            d.failed -= 1;
            d.retried += 1;
            if let Some(s) = d.sites.get_mut(p.stack) {
                s.failed -= 1;
            }
        }
        c.bytes += m.size;
        d.allocs += 1;
        d.bytes += m.size;
        if m.flags & flags::POOLED != 0 {
            d.pooled += 1;
        }
        let b = size_bucket(m.size);
        d.size_hist[b].0 += 1;
        d.size_hist[b].1 += m.size;
        let live = Live {
            size: m.size,
            t_ns: m.t_ns,
            stream: m.stream,
            stack: m.stack,
            tid: m.tid,
            api: m.api,
            kind: m.kind,
            flags: m.flags,
        };
        if let Some(old) = d.live.insert(m.addr, live) {
            // The same address handed out twice: its free was not recorded.
            d.replaced += 1;
            d.in_use -= old.size;
            d.held.release(old.kind, old.flags, old.size);
            if let Some(s) = d.sites.get_mut(old.stack) {
                s.live -= old.size;
                s.live_count -= 1;
            }
        }
        let s = d.sites.entry(m.stack);
        s.allocs += 1;
        s.bytes += m.size;
        s.live += m.size;
        s.live_count += 1;
        d.in_use += m.size;
        d.held.hold(m.kind, m.flags, m.size);
        d.last_alloc = Some(m.addr);
        if d.in_use > d.peak {
            d.peak = d.in_use;
            d.peak_t = m.t_ns;
            d.peak_index = index;
            d.peak_batch = batch;
            d.peak_pending = true;
        }
        d.held_changed(m.t_ns, timeline);
        if steps {
            d.steps.push(m.t_ns, d.in_use);
        }
    }

    /// NVIDIA's runtime tries some calls before it has made its context current (a
    /// stream-ordered allocation on the default stream, first thing in a thread): the driver
    /// answers `CUDA_ERROR_INVALID_CONTEXT` (201), as a real driver does with no current
    /// context, and the runtime makes its primary context current and makes the same call
    /// again; the program only sees the retry. Records such a failure, and for the thread's
    /// next allocation says whether it was that retry (same device, call, kind and size,
    /// succeeding): then the failure is counted as retried, not failed.
    #[cold]
    fn retry(&mut self, m: &MemOp, failed: bool) -> Option<PendingRetry> {
        let i = self.retry_pending.iter().position(|p| p.tid == m.tid);
        let prev = i.map(|i| self.retry_pending.swap_remove(i));
        if failed && m.result == CUDA_ERROR_INVALID_CONTEXT {
            if self.retry_pending.len() >= MAX_RETRY_THREADS {
                self.retry_pending.remove(0);
            }
            self.retry_pending.push(PendingRetry {
                tid: m.tid,
                device: m.device,
                api: m.api,
                kind: m.kind,
                size: m.size,
                stack: m.stack,
            });
            return None;
        }
        prev.filter(|p| {
            !failed
                && p.device == m.device
                && p.api == m.api
                && p.kind == m.kind
                && p.size == m.size
        })
    }

    #[inline(always)]
    fn free(&mut self, m: &MemOp) {
        let top = self.opts.top;
        let short = self.opts.short_lived_ns;
        let timeline = self.opts.timeline;
        let steps = self.opts.steps;
        let d = self.dev(m.device);
        d.touch(m.t_ns);
        let slot = call_slot(m.api, m.kind, true);
        d.calls[slot].count += 1;
        if m.result != codes::CUDA_SUCCESS {
            d.calls[slot].failed += 1;
            return;
        }
        if m.addr == 0 {
            // cudaFree(NULL): a no-op (often used to create the context).
            return;
        }
        // The live set at a new peak is captured just before it first shrinks.
        if d.peak_pending && d.live.contains_key(&m.addr) {
            d.peak_snap = Some(d.snapshot(top));
            d.peak_pending = false;
        }
        let Some(l) = d.live.remove(&m.addr) else {
            d.unknown_frees += 1;
            d.last_alloc = None;
            return;
        };
        d.calls[slot].bytes += l.size;
        d.frees += 1;
        d.in_use -= l.size;
        d.held.release(l.kind, l.flags, l.size);
        let life = m.t_ns.saturating_sub(l.t_ns);
        let lb = lifetime_bucket(life);
        d.life_hist[lb].0 += 1;
        d.life_hist[lb].1 += l.size;
        if life < short {
            d.short_lived.0 += 1;
            d.short_lived.1 += l.size;
        }
        let temporary = d.last_alloc == Some(m.addr);
        if temporary {
            d.temporary.0 += 1;
            d.temporary.1 += l.size;
        }
        d.last_alloc = None;
        if let Some(s) = d.sites.get_mut(l.stack) {
            s.live -= l.size;
            s.live_count -= 1;
            if temporary {
                s.temporary += 1;
            }
        }
        d.held_changed(m.t_ns, timeline);
        if steps {
            d.steps.push(m.t_ns, d.in_use);
        }
    }

    #[cold]
    fn oom(&mut self, m: &MemOp, index: u64, top: usize, max_pm: usize) {
        let total = self.device_total(m.device);
        let batch = self.batch;
        let d = self.dev(m.device);
        d.ooms += 1;
        let refused = m.flags & flags::CAP_REFUSED != 0;
        if refused {
            // The CapRefusal record just before describes this request: complete it.
            if let Some(p) = d
                .post_mortems
                .iter_mut()
                .rev()
                .take(4)
                .find(|p| !p.linked && p.tid == m.tid && p.pm.size == m.size)
            {
                p.linked = true;
                p.pm.api = m.api.name().to_string();
                p.pm.kind = Some(m.kind.name().to_string());
                p.pm.stack = m.stack;
                p.pm.stream = m.stream;
                p.pm.call = (m.api, m.tid, m.flags);
                p.pm.alloc_index = Some(index);
                p.alloc_at = (m.t_ns, batch);
                return;
            }
        }
        d.timeline
            .mark(m.t_ns, if refused { "refusal" } else { "oom" }, m.size);
        if d.post_mortems.len() >= max_pm {
            d.post_mortems_dropped += 1;
            return;
        }
        let snap = d.snapshot(top);
        let mut pm = PostMortem::new(
            if refused { "cap" } else { "device" },
            index,
            m.t_ns,
            m.api,
            Some(m.kind),
            m.size,
            m.stack,
            m.stream,
            d.in_use,
            (d.device >= 0).then(|| d.reserved()),
            if refused { d.cap } else { None },
            total,
            snap,
        );
        pm.call = (m.api, m.tid, m.flags);
        d.post_mortems.push(PendingPm {
            pm,
            tid: m.tid,
            linked: true,
            batch,
            alloc_at: (m.t_ns, batch),
        });
    }

    fn device_total(&self, device: i32) -> Option<u64> {
        self.header
            .devices
            .iter()
            .find(|d| d.index == device)
            .map(|d| d.total_bytes)
            .filter(|&t| t > 0)
    }

    fn other(&mut self, ev: Event) {
        if let Some(t) = ev.t_ns() {
            self.clock(t);
        }
        let index = self.index;
        let batch = self.batch;
        let top = self.opts.top;
        let max_pm = self.opts.max_post_mortems;
        match ev {
            Event::CapRefusal {
                t_ns,
                tid,
                device,
                api,
                size,
                in_use,
                cap,
            } => {
                let total = self.device_total(device);
                let d = self.dev(device);
                d.touch(t_ns);
                d.refusals += 1;
                d.cap = Some(cap);
                d.timeline.cap(t_ns, cap);
                d.timeline.mark(t_ns, "refusal", size);
                if d.post_mortems.len() >= max_pm {
                    d.post_mortems_dropped += 1;
                    return;
                }
                let snap = d.snapshot(top);
                let mut pm = PostMortem::new(
                    "cap",
                    index,
                    t_ns,
                    api,
                    None,
                    size,
                    0,
                    0,
                    d.in_use,
                    (d.device >= 0).then(|| d.reserved()),
                    Some(cap),
                    total,
                    snap,
                );
                pm.charged = in_use;
                pm.call = (api, tid, 0);
                pm.larger_cap = Some(LargerCap::new(in_use, size, cap));
                d.post_mortems.push(PendingPm {
                    pm,
                    tid,
                    linked: false,
                    batch,
                    alloc_at: (0, 0),
                });
            }
            Event::PoolTrim {
                t_ns,
                device,
                bytes,
                ..
            } => {
                let d = self.dev(device);
                d.touch(t_ns);
                d.trims.0 += 1;
                d.trims.1 += bytes;
            }
            Event::Sync {
                t_ns,
                tid,
                device,
                kind,
                ..
            } => {
                self.threads.insert(tid, ());
                let d = self.dev(device);
                d.touch(t_ns);
                d.syncs[kind as usize] += 1;
            }
            Event::MemInfo { t_ns, device, .. } => {
                let d = self.dev(device);
                d.touch(t_ns);
                d.mem_info += 1;
            }
            Event::ThreadStart { tid, .. } | Event::ThreadExit { tid, .. } => {
                self.threads.insert(tid, ());
            }
            Event::Fork { child_pid, .. } => self.forks.push(child_pid),
            Event::Module {
                base,
                size,
                file_offset,
                path,
            } => self.symbols.add_module(Module {
                base,
                size,
                file_offset,
                path,
            }),
            Event::Stack { id, frames } => self.symbols.add_stack(id, frames),
            Event::Counter {
                t_ns,
                device,
                live_bytes,
                reserved_bytes,
                cap,
            } => {
                let _ = live_bytes;
                let timeline = self.opts.timeline;
                let d = self.dev(device);
                d.touch(t_ns);
                if d.held.pool_reports(reserved_bytes) {
                    d.held_changed(t_ns, timeline);
                }
                if cap > 0 {
                    d.cap = Some(cap);
                    d.timeline.cap(t_ns, cap);
                }
            }
            Event::PoolStats {
                device,
                reserved,
                live,
                cached,
                pending,
                budget,
                releases,
                ..
            } => {
                let p = self.pools.entry(device).or_default();
                p.device = device;
                p.peak_reserved = p.peak_reserved.max(reserved);
                p.reserved = reserved;
                p.live = live;
                p.cached = cached;
                p.pending = pending;
                p.budget = budget;
                p.releases = releases;
            }
            // what a replay needs (the stream's retirement); nothing to summarize
            Event::StreamDestroy { .. } => {}
            Event::Lost { count, .. } => self.lost += count,
            Event::CallFailed {
                t_ns,
                device,
                name,
                result,
                ..
            } => {
                if self.failed_calls.len() < MAX_FAILED_CALLS {
                    self.failed_calls.push((t_ns, name, device, result));
                }
            }
            Event::Device(info) => {
                if let Some(d) = self
                    .header
                    .devices
                    .iter_mut()
                    .find(|d| d.index == info.index)
                {
                    *d = info;
                } else {
                    self.header.devices.push(info);
                }
            }
            Event::Torch(op) => {
                if let Some(snap) = self.torch.op(&op, top) {
                    self.torch_oom(&op, snap, index, batch);
                }
            }
            Event::PyCode {
                id, file, function, ..
            } => {
                self.symbols.add_pycode(id, &file, &function);
                self.torch.code(id, file, function)
            }
            Event::PyStack { id, frames } => self.torch.stack(id, frames),
            Event::Alloc(_) | Event::Free(_) => unreachable!("handled in feed"),
        }
        let _ = index;
    }

    /// PyTorch raised an out-of-memory error: its tensor snapshot goes to the post-mortem of
    /// the device allocation that failed just before on the same thread (PyTorch's own
    /// request to the driver), else to a post-mortem of its own ("pytorch": PyTorch refused
    /// without a failed device call, e.g. under `set_per_process_memory_fraction`).
    fn torch_oom(
        &mut self,
        op: &vramshim_trace::TorchOp,
        snap: torch::TorchSnap,
        index: u64,
        batch: u64,
    ) {
        let top = self.opts.top;
        let max_pm = self.opts.max_post_mortems;
        let total = self.device_total(op.device);
        let d = self.dev(op.device);
        if let Some(p) = d.post_mortems.iter_mut().rev().find(|p| {
            p.tid == op.tid
                && p.pm.torch_snap.is_none()
                && p.pm.t_ns <= op.t_ns
                && op.t_ns - p.pm.t_ns < 10_000_000_000
        }) {
            p.pm.torch_snap = Some(snap);
            return;
        }
        if d.post_mortems.len() >= max_pm {
            d.post_mortems_dropped += 1;
            return;
        }
        let dsnap = d.snapshot(top);
        let mut pm = PostMortem::new(
            "pytorch",
            index,
            op.t_ns,
            Api::Unknown,
            None,
            op.size,
            0,
            op.stream,
            d.in_use,
            (d.device >= 0).then(|| d.reserved()),
            d.cap,
            total,
            dsnap,
        );
        pm.torch_snap = Some(snap);
        d.post_mortems.push(PendingPm {
            pm,
            tid: op.tid,
            linked: true,
            batch,
            alloc_at: (0, 0),
        });
    }

    /// Ends the pass and builds the report.
    pub fn finish(mut self, warnings: Vec<String>) -> TraceReport {
        let top = self.opts.top;
        for d in &mut self.devices {
            if d.peak_pending {
                d.peak_snap = Some(d.snapshot(top));
                d.peak_pending = false;
            }
        }
        self.torch.finish(top);
        report::build(self, warnings)
    }
}

/// Reads a whole trace and analyzes it. A `.vramtrace` already in time order takes the fast
/// path (`fast`: decoder straight into the analysis); everything else, and a trace the fast
/// path gives up on, goes through the reorder window. Both give the same report.
pub fn analyze(opened: Opened, opts: &Options) -> Result<TraceReport, InputError> {
    if opened.format == Format::VramTrace {
        let mut progress = Progress::maybe(
            &format!("reading {}", opened.path.display()),
            opened.len,
            opts.progress,
        );
        let path = opened.path.display().to_string();
        let mut a = Analysis::new(opts.clone(), opened.header.clone(), &path, opened.format);
        if let Some((warnings, torn, cut_off)) =
            fast::analyze(&opened.path, &mut a, &mut progress, opts.progress)?
        {
            progress.finish();
            let mut r = a.finish(warnings);
            r.torn = torn;
            r.cut_off = cut_off;
            return Ok(r);
        }
        progress.finish();
    }
    analyze_windowed(opened, opts)
}

/// [`analyze`]'s fast path alone: `Ok(None)` when the trace needs the reorder window (not in
/// time order, ...). For tests that check both paths agree.
pub fn analyze_in_order(opened: Opened, opts: &Options) -> Result<Option<TraceReport>, InputError> {
    let mut progress = Progress::maybe("", 0, false);
    let path = opened.path.display().to_string();
    let mut a = Analysis::new(opts.clone(), opened.header.clone(), &path, opened.format);
    Ok(
        fast::analyze(&opened.path, &mut a, &mut progress, false)?.map(
            |(warnings, torn, cut_off)| {
                let mut r = a.finish(warnings);
                r.torn = torn;
                r.cut_off = cut_off;
                r
            },
        ),
    )
}

/// [`analyze`] through the reorder window only (the reference the fast path must match).
pub fn analyze_windowed(mut opened: Opened, opts: &Options) -> Result<TraceReport, InputError> {
    let mut progress = Progress::maybe(
        &format!("reading {}", opened.path.display()),
        opened.len,
        opts.progress,
    );
    let path = opened.path.display().to_string();
    let mut a = Analysis::new(
        opts.clone(),
        std::mem::take(&mut opened.header),
        &path,
        opened.format,
    );
    let mut n: u64 = 0;
    while let Some(ev) = opened.events.next_event() {
        a.feed(ev?);
        n += 1;
        if n & 0xffff == 0 && opts.progress {
            progress.update(opened.events.position());
        }
    }
    progress.finish();
    let mut r = a.finish(opened.events.warnings());
    r.torn = opened.events.damaged();
    r.cut_off = opened.events.cut_off();
    Ok(r)
}

/// Sync counts by who asked for them.
pub(crate) fn sync_names() -> [(SyncKind, &'static str); 5] {
    [
        (SyncKind::ProcessDevice, "process-device"),
        (SyncKind::ProcessStream, "process-stream"),
        (SyncKind::ProcessEvent, "process-event"),
        (SyncKind::PoolDevice, "pool-device"),
        (SyncKind::PoolEvent, "pool-event"),
    ]
}

pub(crate) fn config_map(h: &Header) -> BTreeMap<String, String> {
    h.config.iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_bucket_counts_the_edges_below() {
        let mut v: Vec<u64> = vec![0, 1, u64::MAX];
        for e in LIFETIME_EDGES {
            v.extend([e - 1, e, e + 1, e * 3]);
        }
        // Every power of two and its neighbours (the table's range boundaries), and a spread.
        for b in 0..64 {
            v.extend([(1u64 << b) - 1, 1 << b, (1u64 << b) + 1]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x >> (x % 64));
        }
        for ns in v {
            let want = LIFETIME_EDGES.iter().filter(|&&e| ns >= e).count();
            assert_eq!(lifetime_bucket(ns), want, "{ns}");
        }
    }
}
