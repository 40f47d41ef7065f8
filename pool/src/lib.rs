//! Allocation policies over a [`Device`] trait. No FFI, no `unsafe`: the same code runs
//! inside the interposer (over the CUDA virtual-memory API) and inside `vramshim replay`
//! (over the [`AccountingDevice`]), so a what-if answer is the production algorithm's answer.
//!
//! # Public API (stable; used by `vramshim replay`)
//!
//! ```text
//! // Policies behind one interface
//! trait Policy {                       // object safe: Box<dyn Policy>
//!     fn name(&self) -> &'static str;
//!     fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError>;
//!     fn free(&mut self, dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError>;
//!     fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError>;
//!     fn note_process_sync(&mut self);
//!     fn retire_stream(&mut self, dev: &mut dyn Device, stream: Stream);  // cudaStreamDestroy
//!     fn owns(&self, addr: u64) -> bool;            // addr is the base of a live block
//!     fn contains(&self, addr: u64) -> bool;        // addr lies in memory the pool holds
//!     fn stats(&self) -> Stats;
//!     fn reset(&mut self);                          // forget all (device reset, fork child)
//! }
//! enum PolicyKind { Stitch, Caching, Direct }       // FromStr "stitch"|"caching"|"direct"
//!                                                   // Stitch builds Stitch::tight()
//! PolicyKind::build(self) -> Box<dyn Policy>
//! PolicyKind::ALL: [PolicyKind; 3]
//!
//! // Requests: Request { size, stream }  (stream = ANY_STREAM for cudaMalloc/cuMemAlloc,
//! //   i.e. not stream-ordered; the CUstream value for cudaMallocAsync)
//! // Frees: FreeMode::Sync (cudaFree) | FreeMode::Async { stream } (cudaFreeAsync)
//! const ANY_STREAM: Stream = u64::MAX
//!
//! // Replay (deterministic)
//! enum replay::Event { Alloc { id, size, stream }, Free { id, mode: FreeMode }, ProcessSync,
//!                     StreamRetired { stream } }
//! replay::run(events: &[Event], policy: PolicyKind, device_capacity: u64, cap: Option<u64>) -> ReplayResult
//! replay::run_checked(events, policy, device_capacity, cap) -> ReplayResult  // + safety checker
//! replay::run_with(events, policy: &mut dyn Policy, dev: &mut AccountingDevice) -> ReplayResult
//!                                  // behind the live library's thread caches when
//!                                  // policy.thread_caches() (Stitch: on unless configured
//!                                  // with faults, runs or kept ranges, or with_thread_caches(false))
//! thread_cache::{ThreadCache, Rules, run, run_observed}  // those caches as pure code
//! replay::as_seen_by(events, policy) -> Cow<[Event]>  // caching: cudaFree = stream-ordered release
//!                                                    // (run, run_checked, min_capacity apply it)
//! replay::stream_ordered(events) -> Vec<Event>       // every cudaFree -> cudaFreeAsync on its alloc stream
//! replay::cuda_freed(events) -> Vec<Event>           // every free -> cudaFree
//! enum replay::Frees { CudaFree, StreamOrdered }     // Frees::BOTH, name(), apply(events)
//! replay::run_on(events, policy, frees, device_capacity, cap) -> ReplayResult  // same stream for every policy
//! replay::compare(events, policies, device_capacity, cap) -> Vec<Compared { frees, result }>  // both semantics
//! replay::calls_per_pass_with(events, frees, make: &dyn Fn() -> Box<dyn Policy>, passes) -> Vec<u64>
//! replay::second_half_calls_per_1000(events, frees, make) -> f64
//! replay::min_capacity(events: &[Event], policy: PolicyKind) -> u64   // bytes, whole pages
//! replay::min_capacity_with(events, make: &dyn Fn() -> Box<dyn Policy>) -> u64
//! replay::UNLIMITED: u64  // 1 PiB, the "unlimited" device of what-if runs
//! replay::peak_live(events: &[Event]) -> u64
//! replay::repeat(events: &[Event], times: usize) -> Vec<Event>   // loop: frees leftovers per pass
//! replay::driver_calls_per_pass(events, policy, passes) -> Vec<u64>
//! struct ReplayResult { policy, completed, allocs_done, first_failure: Option<Failure{index,size,stream,why}>,
//!                       peak_reserved, peak_live, peak_device_used, driver_calls, syncs, thread_cache_hits,
//!                       calls: CallCounts, stats: Stats, violations: Vec<String>, leaks: Vec<String> }
//!
//! // RMM CSV (Thread,Time,Action,Pointer,Size,Stream)
//! rmm_csv::parse(text: &str) -> Result<ParsedTrace, ParseError>
//! rmm_csv::parse_file(path) -> Result<ParsedTrace, ParseError>
//! struct ParsedTrace { events: Vec<Event>, allocs, frees, skipped_frees, failed_allocs, threads }
//! struct ParseError { line: usize, msg: String }   // Display: "line N: msg"
//! rmm_csv::Reader::new(r: impl BufRead) -> Result<Reader, ParseError>  // checks the header
//! Reader::next_row() -> Option<Result<Row { thread, t_ns, action: Action, ptr, size, stream }, ParseError>>
//! rmm_csv::HEADER, rmm_csv::format_time(ns, &mut String), rmm_csv::parse_time(s)
//!
//! // Configured stitch: stitch::Stitch::new().with_headroom(Some(h)) (soft limit: dissolve
//! //   cached blocks before growing beyond peak_live * (1 + h); default None = cache until
//! //   the device or cap refuses)
//! // Tight stitch (PolicyKind::Stitch, the interposer's VRAMSHIM_POOL=stitch):
//! //   stitch::Stitch::tight() = Stitch::new().with_budget(Some(Budget::default()));
//! //   Stitch::new() alone has no budget (VRAMSHIM_POOL_BUDGET=off)
//! //   (reserved <= recent peak live * (1 + ratio) + slack while anything is cached; cached
//! //   blocks dissolved and idle pages released beyond it; Stats::{cached, budget, releases})
//! //   (large blocks carved by address out of one growing mapping, the arena, first)
//!
//! // Accounting device: AccountingDevice::new(capacity), set_cap, set_checking,
//! //   set_capturing, fail_nth(CallKind, n, DeviceError), process_sync, calls() -> CallCounts,
//! //   used/peak_used/handles/mapped_pages/reservations/mallocs, violations(), leaks(),
//! //   check_alloc(addr, size, stream), check_free(addr, mode)
//! ```
//!
//! # Policies
//! - [`stitch::Stitch`] (ours): 2 MiB physical pages mapped into reserved ranges, page tails
//!   packed (a block may take a shared page's free suffix as its head and another's free
//!   prefix as its tail; blocks under a page go anywhere in a shared page), freed blocks
//!   cached by size and mappings reused so a repeating workload makes no driver calls.
//! - [`caching::Caching`]: PyTorch's `CUDACachingAllocator` rules.
//! - [`direct::Direct`]: one driver call per request (`cudaMalloc`/`cudaFree`).
//!
//! # Stream semantics (all policies)
//! A block freed with [`FreeMode::Sync`] (`cudaFree`) is handed out again only after a
//! synchronization covers it (the pool's own, or the process's: [`Policy::note_process_sync`]).
//! A block freed with [`FreeMode::Async`] (`cudaFreeAsync(p, s)`) is reusable at once on `s`,
//! and on another stream after a synchronization, or once the new stream waits on an event
//! recorded on `s` (stitch records it when the block changes streams, so it covers the free;
//! caching records it at the free, as PyTorch's `record_stream`). Requests on [`ANY_STREAM`]
//! only get memory a synchronization covers. No policy synchronizes during stream capture.
//! A destroyed stream's handle may name a new stream later ([`Policy::retire_stream`]): what
//! was freed on the old one is then ordered by an event recorded on it before it went, never
//! reused on the new one as "the same stream".

pub mod accounting;
mod blocks;
pub mod caching;
pub mod device;
pub mod direct;
mod fxhash;
pub mod replay;
pub mod rmm_csv;
pub mod stitch;
pub mod streams;
pub mod thread_cache;

pub use accounting::AccountingDevice;
pub use device::{CallCounts, Device, DeviceError, EventId, Handle, Stream};

/// Every pointer handed out is aligned to (at least) this, and sizes are rounded to it.
pub const ALIGN: u64 = 512;
pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The stream of a request that is not stream-ordered (`cudaMalloc`, `cuMemAlloc`): the
/// block must be usable on any stream at once, so only memory that a synchronization covers
/// is handed out (never a block still ordered behind another stream's work).
pub const ANY_STREAM: Stream = u64::MAX;

/// One allocation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Requested bytes (0 is served as 1).
    pub size: u64,
    /// Stream the allocation is ordered on (0 = legacy default stream), or [`ANY_STREAM`].
    pub stream: Stream,
}

/// A block handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    pub addr: u64,
    /// Usable bytes (>= requested).
    pub size: u64,
}

/// How a block is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FreeMode {
    /// `cudaFree`: the caller may have work in flight on any stream.
    Sync,
    /// `cudaFreeAsync(p, stream)`: stream-ordered.
    Async { stream: Stream },
}

/// Why a policy call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// Not enough memory even after synchronizing and releasing cached memory.
    OutOfMemory {
        requested: u64,
        reserved: u64,
        live: u64,
        /// The device's refusal (out of memory or cap).
        why: DeviceError,
    },
    /// A device call failed for another reason; nothing leaked.
    Device(DeviceError),
    /// `free` of an address that is not a live block of this policy.
    UnknownPointer(u64),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::OutOfMemory {
                requested,
                reserved,
                live,
                why,
            } => write!(
                f,
                "out of memory ({why}): requested {requested} B with {live} B live and {reserved} B reserved"
            ),
            PoolError::Device(e) => write!(f, "device error: {e}"),
            PoolError::UnknownPointer(p) => write!(f, "free of unknown pointer {p:#x}"),
        }
    }
}

impl std::error::Error for PoolError {}

/// Policy-level numbers. Driver-call counts live in the device ([`CallCounts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes obtained from the device (physical pages for stitch, segments for caching,
    /// driver-rounded allocations for direct).
    pub reserved: u64,
    /// Requested bytes of live blocks.
    pub live: u64,
    pub peak_reserved: u64,
    pub peak_live: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Allocations served without any device call.
    pub cache_hits: u64,
    /// Device synchronizations the policy asked for.
    pub syncs: u64,
    /// Synchronizations the process made itself (`note_process_sync`).
    pub process_syncs: u64,
    pub events_recorded: u64,
    pub stream_waits: u64,
    pub trims: u64,
    /// Allocations that needed the out-of-memory path (release cached, retry).
    pub oom_retries: u64,
    /// stitch: mapped ranges held (cached or in use).
    pub mappings: u64,
    /// stitch: bytes of freed blocks kept formed for reuse (the cache), part of `reserved`.
    pub cached: u64,
    /// stitch: bytes of blocks freed with `cudaFree` that wait for a synchronization.
    pub pending: u64,
    /// stitch: the most the pool promises to hold with blocks cached (0: no budget; see
    /// `stitch::Budget`). Above it nothing stays cached, and reserved bytes above it are
    /// pages that live or pending blocks pin.
    pub budget: u64,
    /// Largest live bytes over the budget's recent windows (what the budget is a share of).
    pub recent_peak_live: u64,
    /// Pages (or allocations) given back to the device by the budget and by trims.
    pub releases: u64,
}

impl Stats {
    pub(crate) fn set_reserved(&mut self, r: u64) {
        self.reserved = r;
        self.peak_reserved = self.peak_reserved.max(r);
    }
    #[inline]
    pub(crate) fn add_live(&mut self, n: u64) {
        self.live += n;
        self.peak_live = self.peak_live.max(self.live);
        self.recent_peak_live = self.recent_peak_live.max(self.live);
    }
}

/// One allocation policy. Object safe.
pub trait Policy: Send {
    fn name(&self) -> &'static str;
    /// Hand out a block of at least `req.size` bytes, 512-B aligned.
    fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError>;
    /// Give back the block at `addr`; returns its requested size.
    fn free(&mut self, dev: &mut dyn Device, addr: u64, mode: FreeMode) -> Result<u64, PoolError>;
    /// Return every cached byte the policy can to the device (synchronizing once if needed,
    /// never during capture). Returns the bytes given back.
    fn trim(&mut self, dev: &mut dyn Device) -> Result<u64, PoolError>;
    /// The process synchronized the whole device itself.
    fn note_process_sync(&mut self);
    /// `addr` is the base of a live block of this policy.
    fn owns(&self, addr: u64) -> bool;
    /// `addr` lies inside memory this policy holds (live or cached).
    fn contains(&self, addr: u64) -> bool;
    fn stats(&self) -> Stats;
    /// Forget everything without device calls (the device was reset, or this is a forked
    /// child whose device state is gone).
    fn reset(&mut self);
    /// Whether the policy holds cached blocks above its budget because no page it holds
    /// could be given back even with its cache dissolved (checks of a budget: such a cache
    /// holds no byte more than none). Recomputed from the pool's state on each call.
    #[doc(hidden)]
    fn pinned_above_budget(&self) -> bool {
        false
    }
    /// A caller served `n` allocations from blocks of this policy it kept aside (live to the
    /// policy throughout): a policy whose budget follows its allocations counts them toward
    /// its windows (`Stitch::note_aside_hits`); the others have nothing to count them into.
    fn note_aside_hits(&mut self, _dev: &mut dyn Device, _n: u64) {}
    /// The live bytes at which a caller keeping frees aside must give them back, because
    /// the policy's next allocation could then find nothing live and end a round (or 0: it
    /// must see every free now; `u64::MAX`: never). See `Stitch::round_end_watch`.
    fn round_end_watch(&self) -> u64 {
        u64::MAX
    }
    /// The program destroys stream `stream` (told just before the driver's destroy, while
    /// the handle still names it): the destroy returns while its work may still run, and a
    /// stream created later may get the same handle value, so nothing freed on it may be
    /// reused "on the same stream" by a request naming that handle from now on. Policies
    /// that key freed memory on streams order it by an event recorded on `stream` now (or
    /// leave it to a synchronization).
    fn retire_stream(&mut self, _dev: &mut dyn Device, _stream: Stream) {}
    /// The requested sizes a caller keeping frees aside may keep: those under this (see
    /// [`thread_cache`]); `u64::MAX`: any. `Stitch` with its layer replay acting asks to see
    /// every free of a page or more (`Stitch::aside_below`).
    fn aside_below(&self) -> u64 {
        u64::MAX
    }
    /// A size (as the policy rounds requests: [`ALIGN`]) whose frees a caller may keep aside
    /// too, whatever [`Policy::aside_below`] says; 0: none. `Stitch` names the size of a run
    /// of one large request too long for its layer replay to find a period in, whose next
    /// allocations its own fast path serves unremembered (`Stitch::aside_run`). Like
    /// `aside_below` it changes only in an allocation the policy's general path serves (the
    /// interposer publishes both after each), so a caller's caches and the model of them
    /// (`thread_cache`) decide alike.
    fn aside_run(&self) -> u64 {
        0
    }
    /// Whether the live library keeps per-thread caches of stream-ordered frees in front of
    /// this policy as configured ([`thread_cache`]): `replay::run_with` then runs them in
    /// front of it, so that it predicts what the library does. Only the interposer's pool
    /// (`Stitch`) has them.
    fn thread_caches(&self) -> bool {
        false
    }
}

/// The policies, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Stitch,
    Caching,
    Direct,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [PolicyKind::Stitch, PolicyKind::Caching, PolicyKind::Direct];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Stitch => "stitch",
            PolicyKind::Caching => "caching",
            PolicyKind::Direct => "direct",
        }
    }

    /// A fresh policy with default settings.
    pub fn build(self) -> Box<dyn Policy> {
        match self {
            // the budget keeps reserved bytes near live ones whatever the device's size
            PolicyKind::Stitch => Box::new(stitch::Stitch::tight()),
            PolicyKind::Caching => Box::new(caching::Caching::new()),
            PolicyKind::Direct => Box::new(direct::Direct::new()),
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stitch" => Ok(PolicyKind::Stitch),
            "caching" => Ok(PolicyKind::Caching),
            "direct" => Ok(PolicyKind::Direct),
            _ => Err(format!(
                "unknown pool policy {s:?} (expected stitch, caching or direct)"
            )),
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Round `n` up to a multiple of `a` (a power of two). Sizes reach it only up to
/// [`MAX_REQUEST`] (see [`refuse_oversized`]); past that it saturates instead of wrapping.
#[inline]
pub(crate) fn round_up(n: u64, a: u64) -> u64 {
    n.saturating_add(a - 1) & !(a - 1)
}

/// The largest request a policy considers (4 EiB): no device comes near it, and every
/// rounding and sum of sizes below it stays inside 64 bits. A larger request (a garbage size
/// in a log, `cudaMalloc((size_t)-1)`) is refused as out of memory, as the driver would.
pub const MAX_REQUEST: u64 = 1 << 62;

/// The out-of-memory refusal of a request past [`MAX_REQUEST`], or `None`.
pub(crate) fn refuse_oversized(req: &Request, stats: &Stats) -> Option<PoolError> {
    (req.size > MAX_REQUEST).then_some(PoolError::OutOfMemory {
        requested: req.size,
        reserved: stats.reserved,
        live: stats.live,
        why: DeviceError::OutOfMemory,
    })
}
