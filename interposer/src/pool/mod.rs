//! Pool layer (owner: pool). `VRAMSHIM_POOL=stitch` (default `off`) serves plain device
//! allocations (`cudaMalloc`, `cuMemAlloc_v2`, `cudaMallocAsync`, `cuMemAllocAsync` and their
//! `_ptsz` forms) from `vramshim_pool::stitch::Stitch` over the CUDA virtual-memory API
//! ([`cuda_device::CudaDevice`], one pool per device ordinal, one lock around all of them;
//! a thread serves its own same-stream reuse of `cudaFreeAsync`d blocks from a small cache
//! of its own without that lock, see [`tcache`]).
//!
//! Semantics (DESIGN.md section 4): `cudaFree`d blocks wait for a synchronization (batched,
//! the process's own syncs count through [`note_process_sync`]); `cudaFreeAsync(p, s)` blocks
//! are reusable at once on `s` and on other streams behind an event; requests that are not
//! stream-ordered (`cudaMalloc`) only get memory a synchronization covers; no synchronization
//! while any stream capture is under way in the process, whatever its mode and thread (the
//! driver refuses it and invalidates the capture: the pool grows instead, its virtual-memory
//! calls being allowed during any capture); a stream-ordered request on a capturing stream goes to the real
//! function, which makes it an allocation node of the graph, and so does a stream-ordered free
//! of a pool block on a capturing stream, which the driver refuses (see [`not_a_graph_free`]);
//! pointers the pool does not own go to the real function; if
//! the virtual-memory API is missing the layer falls back to pass-through with one warning.
//! A device refusal (real out-of-memory) makes the pool dissolve its cached blocks and retry
//! before the process sees `CUDA_ERROR_OUT_OF_MEMORY` / `cudaErrorMemoryAllocation`.
//!
//! Cap: the pool's pages are charged to the cap where [`cuda_device::CudaDevice`] creates
//! them and given back where it releases them (`cap::pages`), and the dispatcher charges the
//! requests the pool serves nothing more: what the device holds for the pool, cached or live,
//! counts against the cap. A refused page is refused growth, and the pool dissolves cached
//! blocks instead (as at a device refusal).
//!
//! Budget: the pool bounds what it keeps cached to a budget over its recent peak of live bytes
//! and gives idle pages back (`vramshim_pool::stitch::Budget`, 5% by default;
//! `VRAMSHIM_POOL_BUDGET=RATIO` sets another, `off` none: the pool then caches until the
//! device or the cap refuses; see [`budget_setting`]). `VRAMSHIM_POOL=stitch-tight` is
//! accepted as another name of `stitch`.

pub(crate) mod c_stats;
mod cuda_device;
mod tcache;
#[cfg(test)]
mod tests;

use crate::cuda::request::{self, is_runtime};
use crate::cuda::types::*;
use crate::sys::spin::{SpinGuard, SpinLock};
use crate::sys::wired::Wired;
use cuda_device::CudaDevice;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use vramshim_pool::stitch::{Budget, Stitch};
use vramshim_pool::{ANY_STREAM, DeviceError, FreeMode, Policy, PoolError, Request, Stats};
use vramshim_trace::Api;

/// Pool stream ids with this bit are per-thread default streams: `PTDS_BASE | tid`.
pub(crate) const PTDS_BASE: u64 = vramshim_pool::streams::PER_THREAD_BASE;

/// The stream a stream-ordered request is ordered on, as the pool keys its free lists
/// (`vramshim_pool::streams::ordered_on`, which `vramshim replay` shares).
pub(crate) fn pool_stream_id(stream: u64, flags: u8) -> u64 {
    vramshim_pool::streams::ordered_on(
        stream,
        flags & vramshim_trace::flags::PER_THREAD_STREAM != 0,
        crate::sys::ids::tid,
    )
}

const UNREAD: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
/// Configured on, but the virtual-memory API is missing: pass-through.
const FALLBACK: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(UNREAD);

/// What the pool asks of the cap about its pages. The cap stands beside the pool, not
/// below it, so the layer that wires the layers together (`lifecycle`) hands these in at
/// load; until then, and in a process without a cap, the answers of no cap.
pub(crate) struct CapView {
    /// Whether each page is charged to the cap as the pool creates it.
    pub charges_pages: fn() -> bool,
    /// Charge a page of `bytes` on `device`, for a request ordered on `stream`; false:
    /// refused.
    pub charge_page: fn(i32, u64, u64) -> bool,
    /// Give back `bytes` of pages on `device`.
    pub uncharge_pages: fn(i32, u64),
    /// Forget the calling thread's last refused page.
    pub clear_refusal: fn(),
    /// What the process may see of a device's memory, given its real total.
    pub visible_total: fn(i32, u64) -> u64,
    /// Bytes the cap still allows on a device (None: uncapped there).
    pub headroom: fn(i32) -> Option<u64>,
}

static CAP_VIEW: Wired<CapView> = Wired::new(CapView {
    charges_pages: || false,
    charge_page: |_, _, _| true,
    uncharge_pages: |_, _| {},
    clear_refusal: || {},
    visible_total: |_, total| total,
    headroom: |_| None,
});

/// Wire in the cap (see [`CapView`]).
pub(crate) fn set_cap_view(v: CapView) {
    CAP_VIEW.set(v);
}

fn cap_view() -> &'static CapView {
    CAP_VIEW.get()
}

/// What the pool tells the trace of its own waits. The tracer stands beside the pool, so
/// `lifecycle` hands this in at load; until then, and in an untraced process, a wait is only
/// made. Without it a pooled job's trace would count only the program's own
/// synchronizations, and `summary` would miss the ones the pool adds.
pub(crate) struct WaitView {
    /// Make a wait of the pool's on `device` (`run`; its CUDA result is returned) and record
    /// it: a device-wide synchronization (`on_event` false), or stream `stream` made to wait
    /// on an event before it reuses bytes another stream freed (`on_event` true).
    pub wait: fn(device: i32, on_event: bool, stream: u64, run: &mut dyn FnMut() -> c_int) -> c_int,
}

static WAIT_VIEW: Wired<WaitView> = Wired::new(WaitView {
    wait: |_, _, _, run| run(),
});

/// Wire in the trace's record of the pool's waits (see [`WaitView`]).
pub(crate) fn set_wait_view(v: WaitView) {
    WAIT_VIEW.set(v);
}

fn wait_view() -> &'static WaitView {
    WAIT_VIEW.get()
}

/// Reads the pool's budget ratio once: a [`Setup`](crate::sys::setup::Setup), not a
/// `OnceLock`, because a thread may be reading it (the environment, maybe a warning) while
/// another forks, and a child's `OnceLock` would then stay "being initialized" for good: its
/// first pool would wait forever. The child reads it again ([`on_fork_child`]).
static BUDGET_READ: crate::sys::setup::Setup = crate::sys::setup::Setup::new();
/// The ratio read (`None`: no budget).
static BUDGET_RATIO: crate::sys::setup::SetupCell<Option<f64>> =
    crate::sys::setup::SetupCell::new();

/// The budget ratio the pool runs with: `VRAMSHIM_POOL_BUDGET` when set (a bad value: one
/// warning, then the default), else the default budget.
fn budget_setting() -> Option<f64> {
    let default = Some(Budget::default().ratio);
    match crate::config::var("VRAMSHIM_POOL_BUDGET").map(str::trim) {
        None | Some("") => default,
        Some(v) => match Budget::parse_ratio(v) {
            Ok(r) => r,
            Err(accepted) => {
                let fallback = Budget::default().ratio;
                crate::warn!(
                    "VRAMSHIM_POOL_BUDGET={v:?} is not understood (accepted: {accepted}); the pool keeps {:.0}% over its recent peak",
                    fallback * 100.0
                );
                Some(fallback)
            }
        },
    }
}

/// The budget the pools are made with (`None`: none); the first call reads the variable (and
/// warns once about a bad value).
fn configured_budget() -> Option<Budget> {
    BUDGET_READ.answer(|| BUDGET_READ.run(read_budget));
    let ratio = BUDGET_RATIO.get().copied().flatten();
    ratio.map(|ratio| Budget {
        ratio,
        ..Budget::default()
    })
}

/// The set-up of [`BUDGET_READ`]: reads the variables (and warns once about a bad value).
fn read_budget() -> bool {
    let _ = BUDGET_RATIO.set(budget_setting());
    true
}

/// Device ordinals served (others pass through).
const MAX_DEVICES: usize = 64;

/// Is the pool on? (One relaxed load once the configuration was read.)
#[inline]
pub(crate) fn enabled() -> bool {
    match MODE.load(Ordering::Relaxed) {
        ON => true,
        UNREAD => read_mode(),
        _ => false,
    }
}

#[cold]
fn read_mode() -> bool {
    let m = match crate::config::var("VRAMSHIM_POOL").map(str::trim) {
        None | Some("") | Some("off") => OFF,
        Some("stitch") | Some("stitch-tight") => {
            // read (and judged) now, not at the first allocation
            let _ = configured_budget();
            ON
        }
        Some(other) => {
            crate::warn!(
                "VRAMSHIM_POOL={other:?} is not understood (accepted: stitch, stitch-tight, off); the pool stays off"
            );
            OFF
        }
    };
    if m == ON {
        // per-thread caches of stream-ordered frees: off under the pool's fault switches
        // (their tests exercise the pool's own rules); the `tcache-*` names break the caches
        // themselves instead, and may be combined
        let any_stream = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-any-stream");
        let no_drain = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-no-drain");
        let no_round_end = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-no-round-end");
        let no_hits = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-no-hits");
        let keep_retired = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-keep-retired");
        let no_run = crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "tcache-no-run");
        if any_stream {
            // testing only: break stream order in the thread caches
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-any-stream: freed blocks are reused on any stream (testing only)"
            );
        }
        if no_drain {
            // testing only: the pool never sees the threads' freed blocks
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-no-drain: the thread caches are never drained (testing only)"
            );
        }
        if no_round_end {
            // testing only: rounds of a tight pool end only where the caches are drained
            // for another reason
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-no-round-end: the thread caches are not given back at a round end (testing only)"
            );
            tcache::configure_no_round_end();
        }
        if no_hits {
            // testing only: the pool's budget windows end only by the allocations it serves
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-no-hits: the thread caches' hits are not counted into the pool (testing only)"
            );
            tcache::configure_no_hits();
        }
        if crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "begin-unordered") {
            // testing only: a capture may begin while a request that decided without it
            // makes the calls it forbids
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=begin-unordered: a capture begins without waiting for the pool's requests (testing only)"
            );
            BEGIN_UNORDERED.store(true, Ordering::Relaxed);
        }
        if crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "begin-recorded-first") {
            // testing only: a begin that fails is seen by other threads as a capture while
            // its real call runs
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=begin-recorded-first: a capture is recorded before its begin call succeeds (testing only)"
            );
            BEGIN_RECORDED_FIRST.store(true, Ordering::Relaxed);
        }
        if keep_retired {
            // testing only: a destroyed stream's frees stay in the thread caches
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-keep-retired: the thread caches keep their frees when a stream is destroyed (testing only)"
            );
            KEEP_RETIRED.store(true, Ordering::Relaxed);
        }
        if no_run {
            // not a fault: the caches as they were before they kept a large run's frees (to
            // measure the rule, and to show the live pool then leaves the model)
            crate::warn!(
                "VRAMSHIM_POOL_DEBUG=tcache-no-run: the thread caches keep no free of a page or more while the layer replay acts (testing only)"
            );
            NO_RUN.store(true, Ordering::Relaxed);
        }
        // `no-layers` alone leaves them on: the pool as it was before its layer replay; so
        // do the pause points, which break nothing (`sys::pause`)
        if any_stream || no_drain {
            tcache::configure(true, any_stream, no_drain);
        } else if !no_round_end
            && !no_hits
            && !keep_retired
            && !no_run
            && crate::config::switch_names("VRAMSHIM_POOL_DEBUG").any(|n| {
                !matches!(
                    n,
                    "no-layers" | "pause-begin" | "pause-request" | "pause-settled"
                )
            })
        {
            tcache::configure(false, false, false);
        }
    }
    let _ = MODE.compare_exchange(UNREAD, m, Ordering::Relaxed, Ordering::Relaxed);
    MODE.load(Ordering::Relaxed) == ON
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=begin-unordered`): the begin-capture hooks record the
/// capture after the real call, without waiting for the pool's requests in flight.
static BEGIN_UNORDERED: AtomicBool = AtomicBool::new(false);

/// Whether a begin-capture hook records the capture first and waits for the pool's requests
/// in flight before the real call ([`wait_for_requests`]).
pub(crate) fn begin_waits_for_requests() -> bool {
    !BEGIN_UNORDERED.load(Ordering::Relaxed)
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=begin-recorded-first`): the begin-capture hooks record
/// the capture as under way before the real call, and forget it if the call fails: requests
/// on other threads meanwhile act on a capture that may never begin.
static BEGIN_RECORDED_FIRST: AtomicBool = AtomicBool::new(false);

/// Whether a begin-capture hook records the capture before the real call (testing only).
pub(crate) fn begin_recorded_first() -> bool {
    BEGIN_RECORDED_FIRST.load(Ordering::Relaxed)
}

/// A capture is about to begin (recorded in `cuda::captures` already): waits until no request
/// is in flight in any pool. Each request decides under the pool's lock whether a capture
/// forbids its unsafe calls and makes them under it, so one that decided before the record
/// is done when this returns, and every later one sees the record (the lock orders them).
/// Never called with the pool's lock held: the pool makes only real driver calls, none of
/// which reaches a begin-capture hook.
///
/// Whatever the pool's mode reads here: a request may be under the lock while it reads
/// otherwise (the process's first request sets the mode just before it takes the lock, and
/// this thread may read the mode from before that store while the request reads the captures
/// from before the record; a pool falling back to pass-through finishes the requests already
/// under the lock). With the pool off nothing holds the lock: one uncontended lock a capture.
pub(crate) fn wait_for_requests() {
    crate::sys::pause::at(crate::sys::pause::Point::Begin, || {
        POOLS.lock_within(1).is_none()
    });
    drop(POOLS.lock());
}

#[cold]
fn fall_back(why: &str) {
    if MODE.swap(FALLBACK, Ordering::Relaxed) == ON {
        crate::warn!("VRAMSHIM_POOL=stitch: {why}; the pool is off (pass-through)");
    }
}

struct DevicePool {
    policy: Stitch,
    dev: CudaDevice,
    /// The policy has a budget (only then can its rounds end: see [`publish_watch`]).
    tight: bool,
    /// Blocks a driver took as free nodes of a graph (`(address, requested size)`): see
    /// [`taken_by_graph`]. They stay live in the policy for good.
    graph_freed: Vec<(u64, u64)>,
}

struct Pools {
    devs: Vec<Option<DevicePool>>,
}

/// Every device's pool, behind a lock a forked child can take back.
static POOLS: SpinLock<Pools> = SpinLock::new(Pools { devs: Vec::new() });

/// `f` under the pool's lock ([`lock_pools`]).
fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    f(&mut lock_pools())
}

/// The pool's lock. A begin-capture call in flight on another thread is waited for first
/// (`captures::beginning`): what is done under the lock may decide whether a capture forbids
/// its calls, and the begin's outcome decides that.
#[inline]
fn lock_pools() -> SpinGuard<'static, Pools> {
    let g = POOLS.lock();
    crate::cuda::captures::pool_lock_taken();
    if crate::cuda::captures::must_wait_for_begins() {
        return relock_after_begins(g);
    }
    g
}

/// The pool's lock let go until the begins in flight on other threads returned, then taken
/// again (a begin waits for the lock before its real call). Out of line: the usual path stays
/// as small.
#[cold]
#[inline(never)]
fn relock_after_begins(mut g: SpinGuard<'static, Pools>) -> SpinGuard<'static, Pools> {
    loop {
        drop(g);
        let gave_up = crate::cuda::captures::wait_for_begins();
        g = POOLS.lock();
        if gave_up {
            // until the lock is taken again, the begins in flight count as captures here
            crate::cuda::captures::pool_lock_counts_begins();
            return g;
        }
        if !crate::cuda::captures::must_wait_for_begins() {
            return g;
        }
    }
}

/// The pool stream for a request, or `None` if the pool does not serve this kind.
fn pool_stream(req: &request::Request) -> Option<u64> {
    if req.size == 0 || req.device < 0 || req.device as usize >= MAX_DEVICES {
        return None;
    }
    match req.api {
        Api::CudaMalloc | Api::CuMemAlloc => Some(ANY_STREAM),
        Api::CudaMallocAsync | Api::CuMemAllocAsync => Some(pool_stream_id(req.stream, req.flags)),
        _ => None,
    }
}

/// Runtime requests may arrive before the runtime made its primary context current on this
/// thread (it would do so inside the real call): do what it would do, once per thread, before
/// the pool's first driver call for such a request ([`CudaDevice`] calls it; a cache hit
/// makes no driver call and needs no context).
fn ensure_context_once(device: i32) {
    thread_local! {
        static CTX_CHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !CTX_CHECKED.with(|c| c.replace(true)) {
        ensure_context(device);
    }
}

fn ensure_context(device: i32) {
    let (Some(get), Some(retain), Some(set)) = (
        crate::cuda::real::cuCtxGetCurrent(),
        crate::cuda::real::cuDevicePrimaryCtxRetain(),
        crate::cuda::real::cuCtxSetCurrent(),
    ) else {
        return;
    };
    let mut cur: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the primary context is retained for the process lifetime,
    // as the runtime does.
    unsafe {
        if get(&mut cur) == CUDA_SUCCESS && cur.is_null() {
            let mut ctx: CUcontext = std::ptr::null_mut();
            if retain(&mut ctx, device) == CUDA_SUCCESS && !ctx.is_null() {
                set(ctx);
            }
        }
    }
}

/// Bytes each device's pool holds from the device (its mapped pages), as of the pool's last
/// decision that could change it: what the trace records, exactly when it changes.
static HELD: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// The most each device's pool ever held (inside one decision it may map pages and release
/// others).
static HELD_PEAK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Bytes `device`'s pool holds from the device now and at most so far (0: none, or no pool).
pub(crate) fn held(device: i32) -> (u64, u64) {
    let Some(d) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else {
        return (0, 0);
    };
    (
        HELD[d].load(Ordering::Relaxed),
        HELD_PEAK[d].load(Ordering::Relaxed),
    )
}

fn publish_held(d: usize, p: &DevicePool) {
    if d < MAX_DEVICES {
        let s = p.policy.stats();
        HELD[d].store(s.reserved, Ordering::Relaxed);
        HELD_PEAK[d].fetch_max(s.peak_reserved, Ordering::Relaxed);
    }
}

/// Per device: the requested sizes a thread's cache may keep when freed, those under this
/// (`Policy::aside_below`: under a page while the tight pool's layer replay acts, which must
/// see every large allocation), as of the pool's last allocation it served itself (the first
/// is one: no block of the device is freed before it).
static KEEP_BELOW: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(u64::MAX) }; MAX_DEVICES];

/// Per device: a size (rounded as the pool rounds requests) a thread's cache may keep frees of
/// too, 0: none (`Policy::aside_run`: the size of a run of one large request the layer replay
/// has no period for, whose next allocations the pool's fast path serves unremembered), as of
/// the pool's last allocation it served itself, as [`KEEP_BELOW`]. Both change only there, so
/// between the pool's operations they are what the pool (and the model's caches, which ask
/// it) would answer. A thread that read the run's size just before another thread's
/// allocation broke the run keeps one more free of it: the pool then misses one allocation of
/// that size in its layer sequence, which costs at worst a place not replayed, never a byte
/// reused early (the cache is still per stream).
static KEEP_RUN: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Testing only (`VRAMSHIM_POOL_DEBUG=tcache-no-run`): [`KEEP_RUN`] stays 0, the caches keeping
/// no free of a page or more while the layer replay acts (the model's `Rules::keep_run` off).
static NO_RUN: AtomicBool = AtomicBool::new(false);

/// Per device: the live bytes at which the pool's round could end
/// (`Stitch::round_end_watch`, `u64::MAX`: none), as of the pool's last operation. A
/// stream-ordered free kept by the thread's cache compares the bytes the caches keep with it
/// (see `tcache`, "Round ends").
static ROUND_WATCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(u64::MAX) }; MAX_DEVICES];

#[inline]
fn publish_watch(d: usize, p: &DevicePool) {
    // a program that never kept a free in a thread's cache never reads it (that global
    // test first: it is what a program of plain `cudaMalloc`/`cudaFree` pairs stops at)
    if tcache::used()
        && p.tight
        && let Some(w) = ROUND_WATCH.get(d)
    {
        w.store(p.policy.round_end_watch(), Ordering::Relaxed);
    }
}

/// The first free a thread cache kept (see `tcache::Kept::First`): until now no pool published
/// its round watch (a program whose frees all reach the pool never reads it); publish every
/// tight pool's now, then mark the caches used, so that this free is compared with it.
#[cold]
#[inline(never)]
fn first_kept() {
    with_pools(|pools| {
        for (d, p) in pools.devs.iter().enumerate() {
            if let Some(p) = p
                && p.tight
                && let Some(w) = ROUND_WATCH.get(d)
            {
                w.store(p.policy.round_end_watch(), Ordering::Relaxed);
            }
        }
        tcache::set_used();
    });
}

/// A free was kept by this thread's cache while the device's pool could end its round when
/// `watch` bytes are all it has live: if the caches keep that much, everything live is kept
/// there: give them back, so that the next allocation finds nothing live.
#[cold]
#[inline(never)]
fn watch_round_end(device: i32, watch: u64) {
    if !tcache::round_ends() {
        return;
    }
    let kept = tcache::kept_mine(device);
    if kept >= watch || (tcache::others_nonempty() && kept + tcache::others_kept(device) >= watch) {
        end_round(device);
    }
}

#[cold]
#[inline(never)]
fn end_round(device: i32) {
    with_pools(|pools| {
        drain_tcaches(pools);
        if let Some(Some(p)) = pools.devs.get(device as usize) {
            publish_watch(device as usize, p);
        }
    });
}

/// `None`: not for the pool, take the real path. `Some(Ok(ptr))` / `Some(Err(cuda_code))` otherwise.
pub(crate) fn alloc(req: &request::Request) -> Option<Result<u64, i32>> {
    let stream = pool_stream(req)?;
    if MODE.load(Ordering::Relaxed) != ON {
        return None;
    }
    // A stream-ordered request on a capturing stream goes to the driver, which makes it an
    // allocation node of the graph, as without the pool: the graph's memory is the graph's for
    // as long as the graph may be launched. A pool block would be used by every launch while
    // the pool, given it back by the capture's free, hands it out again.
    if stream != ANY_STREAM && crate::cuda::captures::any() && graph_alloc(req, stream) {
        return None;
    }
    if stream != ANY_STREAM
        && let Some((addr, due)) = tcache::take(req.device, req.size, stream)
    {
        if due {
            count_hits();
        }
        return Some(Ok(addr));
    }
    let r = with_pools(|pools| {
        let d = req.device as usize;
        if !matches!(pools.devs.get(d), Some(Some(_))) {
            create_pool(pools, req)?;
        }
        // The pool decides as it would with no thread caches: every block they keep is given
        // back first, in the order it was freed (the pool's cache hits are decided with them
        // in view, and its cached blocks dissolve in free order); nothing to give back in a
        // program whose frees all reach the pool. (A tight pool then sees its round ends as
        // without the caches: see `tcache`, "Round ends".)
        drain_tcaches(pools);
        let Some(Some(p)) = pools.devs.get_mut(d) else {
            return Err("internal error: no pool after its creation".to_string());
        };
        if let Some(addr) = p.policy.alloc_cached(req.size, stream) {
            publish_watch(d, p);
            return Ok(Ok(vramshim_pool::Alloc {
                addr,
                size: req.size,
            }));
        }
        p.dev.begin(stream, is_runtime(req.api));
        let r = Request {
            size: req.size,
            stream,
        };
        // the threads' caches were drained before the fast path declined: nothing changed since
        let r = p.policy.alloc_missed(&mut p.dev, r);
        KEEP_BELOW[d].store(p.policy.aside_below(), Ordering::Relaxed);
        let run = if NO_RUN.load(Ordering::Relaxed) {
            0
        } else {
            p.policy.aside_run()
        };
        KEEP_RUN[d].store(run, Ordering::Relaxed);
        publish_held(d, p);
        publish_watch(d, p);
        Ok(r)
    });
    let r = match r {
        Ok(r) => r,
        Err(why) => {
            fall_back(&why);
            return None;
        }
    };
    match r {
        Ok(a) => Some(Ok(a.addr)),
        Err(e) => refused(req, e),
    }
}

/// Whether `req`, stream-ordered on `stream` while some capture is under way, is a graph
/// allocation (its stream captures) that goes to the driver (see [`alloc`]). Out of line: the
/// allocations no capture concerns pay one load for it.
#[cold]
#[inline(never)]
fn graph_alloc(req: &request::Request, stream: u64) -> bool {
    if !crate::cuda::captures::capturing(stream) || graph_allocs_refused() {
        return false;
    }
    crate::debug!(
        "pool: {} bytes on device {} on a capturing stream: a graph allocation, the driver's",
        req.size,
        req.device
    );
    true
}

/// The pool refused `req`: the code the process sees (`None`: pass through after all).
#[cold]
#[inline(never)]
fn refused(req: &request::Request, e: PoolError) -> Option<Result<u64, i32>> {
    crate::debug!("pool: {} bytes on device {}: {e}", req.size, req.device);
    let code = match e {
        PoolError::OutOfMemory { .. } => CUDA_ERROR_OUT_OF_MEMORY,
        PoolError::Device(DeviceError::Unsupported) => {
            fall_back("the virtual-memory API refused (unsupported)");
            return None;
        }
        _ if is_runtime(req.api) => cudaErrorMemoryAllocation,
        PoolError::Device(DeviceError::Driver(c)) => c,
        PoolError::Device(_) => CUDA_ERROR_OUT_OF_MEMORY,
        PoolError::UnknownPointer(_) => CUDA_ERROR_INVALID_VALUE,
    };
    // the runtime is asked for an allocation to set its last error (no call while a capture
    // forbids this thread one: `runtime_set_last_error_oom` asks)
    if is_runtime(req.api) && code == cudaErrorMemoryAllocation {
        crate::cuda::real::runtime_set_last_error_oom();
    }
    Some(Err(code))
}

/// The first request for device `req.device`: make its pool (or say why not).
#[cold]
#[inline(never)]
fn create_pool(pools: &mut Pools, req: &request::Request) -> Result<(), String> {
    let d = req.device as usize;
    if pools.devs.len() <= d {
        pools.devs.resize_with(d + 1, || None);
    }
    if pools.devs[d].is_none() {
        if is_runtime(req.api) {
            ensure_context_once(req.device);
        }
        match CudaDevice::new(req.device, peers_of(req.device)) {
            Ok(dev) => {
                let mut policy = Stitch::new();
                let mut rules = DebugRules::default();
                if let Some((faults, r)) = debug_faults() {
                    policy.set_faults(faults);
                    rules = r;
                }
                let budget = configured_budget();
                let policy = policy
                    .with_budget(budget)
                    .with_runs(rules.runs)
                    .with_kept(rules.kept)
                    .with_layers(!rules.no_layers)
                    .with_event_settles(rules.event_settles);
                pools.devs[d] = Some(DevicePool {
                    policy,
                    dev,
                    tight: budget.is_some(),
                    graph_freed: Vec::new(),
                });
                HAS_POOL.fetch_or(1 << d, Ordering::Relaxed);
            }
            Err(why) => return Err(why),
        }
    }
    Ok(())
}

/// Testing only (`VRAMSHIM_POOL_DEBUG`): the pool's rules broken on purpose, to prove the
/// tests that check them can fail; said once per pool made. Several may be named, separated
/// by commas (`lazy-sync,pressure-off`), with other readers' names (`config::switch_on`);
/// none of these: none.
/// Also says whether the arena grows by runs of pages under one handle
/// (`Stitch::with_runs`, off by default: `runs` turns it on to test the multi-page handles
/// live, `stitch-run-pages` with the rule that such a page is mapped only with its run broken),
/// and whether smaller blocks are carved out of kept ranges (`Stitch::with_kept`, off by
/// default: `kept` turns it on to test it live, `kept-over-live` with the rule that a carve
/// leaves a range's live blocks alone broken), and whether repeated layers take the places of
/// two layers before (`Stitch::with_layers`, on by default: `no-layers` turns it off, the pool
/// as it was before it, `layers-over-live` breaks the rule that a replayed place holds no
/// live block).
fn debug_faults() -> Option<(vramshim_pool::stitch::Faults, DebugRules)> {
    use crate::config::switch_on;
    use vramshim_pool::stitch::Faults;
    let mut f = Faults::default();
    let DebugRules {
        mut runs,
        mut kept,
        mut no_layers,
        mut event_settles,
    } = DebugRules::default();
    let mut what = Vec::new();
    // Above its budget the pool asks its streams' events whether they passed the frees of
    // busy mappings and page fences (`Stitch::with_event_settles`, off by default).
    if switch_on("VRAMSHIM_POOL_DEBUG", "event-settles") {
        event_settles = true;
        what.push("asks its streams' events above its budget");
    }
    // The layer replay (a repeated sequence of large requests within one round takes the
    // places of two periods before) off: the pool as before it, thread caches kept.
    if switch_on("VRAMSHIM_POOL_DEBUG", "no-layers") {
        no_layers = true;
        what.push("does not replay repeated layers' places");
    }
    // Its places taken over live blocks: the test that a replayed place holds none.
    if switch_on("VRAMSHIM_POOL_DEBUG", "layers-over-live") {
        f.replay_over_live = true;
        what.push("replays places over live blocks");
    }
    // Kept ranges (smaller blocks carved best fit out of the places large blocks had): their
    // live test.
    if switch_on("VRAMSHIM_POOL_DEBUG", "kept") {
        kept = true;
        what.push("carves blocks out of kept ranges");
    }
    // ... and carved over the live blocks of a range: the test that a carve leaves them alone.
    if switch_on("VRAMSHIM_POOL_DEBUG", "kept-over-live") {
        kept = true;
        f.kept_over_live = true;
        what.push("carves over live blocks of kept ranges");
    }
    // The arena grows by runs (one handle of several pages): the multi-page handles' live
    // tests.
    if switch_on("VRAMSHIM_POOL_DEBUG", "runs") {
        runs = true;
        what.push("grows its arena by runs of pages");
    }
    // ... and maps a page of a run alone (the handle's first page, in fact): the test that a
    // run is only ever mapped whole.
    if switch_on("VRAMSHIM_POOL_DEBUG", "stitch-run-pages") {
        runs = true;
        f.stitch_run_pages = true;
        what.push("maps pages of a run alone");
    }
    // The old synchronization choices (looser packing): the tightness test.
    if switch_on("VRAMSHIM_POOL_DEBUG", "lazy-sync") {
        f.lazy_sync = true;
        what.push("packs as before its tightness fix");
    }
    // The reuse rules: the early-reuse tests.
    if switch_on("VRAMSHIM_POOL_DEBUG", "reuse-early") {
        f.reuse_sync_frees_early = true;
        f.ignore_streams = true;
        what.push("reuses freed memory too early");
    }
    // Lays a repeated round out afresh instead of replaying the previous round's places: the
    // steady-state test (no driver call after the first pass).
    if switch_on("VRAMSHIM_POOL_DEBUG", "forget-rounds") {
        f.forget_rounds = true;
        what.push("does not replay a repeated round's places");
    }
    // Grows and caches as if there were no budget: the budget's test.
    if switch_on("VRAMSHIM_POOL_DEBUG", "ignore-budget") {
        f.ignore_budget = true;
        what.push("ignores its budget");
    }
    // Never looks at the device's room: the smallest-device tests (near the limit the pool
    // re-forms its rounds' mappings and dissolves before it grows).
    if switch_on("VRAMSHIM_POOL_DEBUG", "pressure-off") {
        f.pressure_off = true;
        what.push("ignores how close the device is to full");
    }
    // Keeps a mapping a block was freed through stream-ordered until a device
    // synchronization, whatever its stream's events say: the test that such mappings do not
    // pile up in a process that never synchronizes the device.
    if switch_on("VRAMSHIM_POOL_DEBUG", "busy-until-sync") {
        f.busy_until_sync = true;
        what.push("keeps mappings freed through until a synchronization");
    }
    // Keeps the page fences of dissolved stream-ordered bytes until a device synchronization,
    // whatever the events recorded on their streams say: the test that such pages go back
    // under the budget in a process that never synchronizes the device.
    if switch_on("VRAMSHIM_POOL_DEBUG", "fences-until-sync") {
        f.fences_until_sync = true;
        what.push("keeps pages of stream-ordered frees until a synchronization");
    }
    // Takes no notice of a destroyed stream: what was freed on it stays reusable at once by a
    // request on its handle, which may name a new stream: the test that such a stream never
    // gets the old one's freed memory unordered.
    if switch_on("VRAMSHIM_POOL_DEBUG", "ignore-retired") {
        f.ignore_retired = true;
        what.push("ignores destroyed streams");
    }
    // Synchronizes where the mode rules forbid the thread nothing and the request's stream
    // does not capture, as it did: the test that a synchronization of the pool never breaks
    // a capture of any mode on another thread (the driver refuses `cuCtxSynchronize` during
    // any capture and invalidates it).
    // (read by `captures::syncs_by_mode`, which the cap's settling of the driver's pools
    // shares)
    if switch_on("VRAMSHIM_POOL_DEBUG", "sync-by-mode") {
        what.push("synchronizes by the capture modes");
    }
    // Serves a stream-ordered request on a capturing stream itself, as it did: the test that
    // such a request (a graph allocation) reaches the driver.
    if switch_on("VRAMSHIM_POOL_DEBUG", "refuse-graph-allocs") {
        GRAPH_ALLOCS_REFUSED.store(true, Ordering::Relaxed);
        what.push("serves graph allocations itself");
    }
    // Takes back a block freed on a capturing stream at the capture's free, as it once did:
    // the test that such a block (still the caller's: CUDA refuses the free) is not handed
    // out again.
    if switch_on("VRAMSHIM_POOL_DEBUG", "graph-frees-reused") {
        GRAPH_FREES_REUSED.store(true, Ordering::Relaxed);
        what.push("reuses blocks freed on a capturing stream");
    }
    // Places blocks of more than a page near the limit as far from it: the test of the
    // smallest device the page-ends rule reaches (t5 on 1.03 x its peak live).
    if switch_on("VRAMSHIM_POOL_DEBUG", "ends-off") {
        f.ends_off = true;
        what.push("places large blocks near the limit as far from it");
    }
    if what.is_empty() {
        return None;
    }
    crate::warn!(
        "VRAMSHIM_POOL_DEBUG={}: the pool {} (testing only)",
        // Escaped: it comes from the environment and goes to the job's terminal.
        crate::config::var("VRAMSHIM_POOL_DEBUG")
            .unwrap_or("")
            .escape_debug(),
        what.join(" and ")
    );
    Some((
        f,
        DebugRules {
            runs,
            kept,
            no_layers,
            event_settles,
        },
    ))
}

/// The pool's rules that are off by default, turned on by `VRAMSHIM_POOL_DEBUG` for their
/// live tests, and the layer replay, on by default, turned off (see [`debug_faults`]).
#[derive(Clone, Copy, Default)]
struct DebugRules {
    runs: bool,
    kept: bool,
    no_layers: bool,
    event_settles: bool,
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=refuse-graph-allocs`): a stream-ordered request on a
/// capturing stream is the pool's instead of going to the driver.
static GRAPH_ALLOCS_REFUSED: AtomicBool = AtomicBool::new(false);

fn graph_allocs_refused() -> bool {
    GRAPH_ALLOCS_REFUSED.load(Ordering::Relaxed)
}

/// Bit `d`: device `d` has a pool (set when made, cleared when reset).
static HAS_POOL: AtomicU64 = AtomicU64::new(0);

/// Free every block the threads keep into its pool (pool lock held); blocks of a device
/// whose pool is gone are dropped.
#[inline]
fn drain_tcaches(pools: &mut Pools) {
    if tcache::any() {
        drain_tcaches_now(pools);
    }
}

#[inline(never)]
fn drain_tcaches_now(pools: &mut Pools) {
    tcache::drain(|d| match d {
        tcache::Drained::Freed(f) => {
            if let Some(Some(p)) = pools.devs.get_mut(f.device as usize) {
                p.dev.begin(f.stream, false);
                let _ = p
                    .policy
                    .free(&mut p.dev, f.addr, FreeMode::Async { stream: f.stream });
                publish_watch(f.device as usize, p);
            }
        }
        tcache::Drained::Hits(device, hits) => {
            if let Some(Some(p)) = pools.devs.get_mut(device as usize) {
                // a window they complete ends here: above the budget, idle pages go back
                p.dev.begin(ANY_STREAM, false);
                p.policy.note_aside_hits(&mut p.dev, hits);
                publish_held(device as usize, p);
                publish_watch(device as usize, p);
            }
        }
    });
}

/// This thread's cache served `tcache::HIT_BATCH` hits since the last drain: every cache's
/// hits and frees go to the pools.
#[cold]
#[inline(never)]
fn count_hits() {
    with_pools(|pools| {
        drain_tcaches(pools);
        for (d, p) in pools.devs.iter().enumerate() {
            if let Some(p) = p {
                publish_watch(d, p);
            }
        }
    });
}

/// `None`: not pool memory, take the real path. `stream` is `Some` for stream-ordered frees.
/// `pooled`: `(device, requested size)` when the dispatcher's live table says `ptr` is a
/// live pool block (a stream-ordered free of one may stay with the thread, see `tcache`).
pub(crate) fn free(ptr: u64, stream: Option<u64>, pooled: Option<(i32, u64)>) -> Option<i32> {
    if MODE.load(Ordering::Relaxed) != ON {
        return None;
    }
    if let (Some(s), Some((device, _))) = (stream, pooled)
        && crate::cuda::captures::any()
        && not_a_graph_free(ptr, s, device)
    {
        return None;
    }
    if let (Some(s), Some((device, size))) = (stream, pooled)
        && (0..MAX_DEVICES as i32).contains(&device)
        && HAS_POOL.load(Ordering::Relaxed) & (1 << device) != 0
        && vramshim_pool::thread_cache::may_keep(
            size,
            KEEP_BELOW[device as usize].load(Ordering::Relaxed),
            || KEEP_RUN[device as usize].load(Ordering::Relaxed),
        )
        && let kept @ (tcache::Kept::Yes | tcache::Kept::First) = tcache::put(tcache::Freed {
            device,
            addr: ptr,
            size,
            stream: s,
        })
    {
        if kept == tcache::Kept::First {
            first_kept();
        }
        let watch = ROUND_WATCH[device as usize].load(Ordering::Relaxed);
        if watch != u64::MAX {
            watch_round_end(device, watch);
        }
        return Some(CUDA_SUCCESS);
    }
    with_pools(|pools| {
        let mode = match stream {
            Some(s) => FreeMode::Async { stream: s },
            None => FreeMode::Sync,
        };
        // the blocks the threads keep reach the pool first, in the order they were freed
        // (as in `alloc`); and for a pointer that is not a live pool block by the live table
        // (an unknown pointer, or one freed twice) no pool may take a block a thread keeps as
        // freed for live
        drain_tcaches(pools);
        // `free` answers UnknownPointer for a block it does not own, without touching
        // anything: one lookup per pool instead of `owns` then `free`
        for (d, p) in pools.devs.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            // a block a graph freed is the graph's: a free of it again is a free of a pointer
            // the process no longer owns, which the real function answers
            if !p.graph_freed.is_empty() && p.graph_freed.iter().any(|&(a, _)| a == ptr) {
                return None;
            }
            p.dev.begin(stream.unwrap_or(ANY_STREAM), false);
            match p.policy.free(&mut p.dev, ptr, mode) {
                Ok(_) => {
                    publish_watch(d, p);
                    return Some(CUDA_SUCCESS);
                }
                Err(PoolError::UnknownPointer(_)) => continue,
                Err(_) => return Some(CUDA_ERROR_INVALID_VALUE),
            }
        }
        None
    })
}

/// A stream-ordered free of the live pool block `ptr` on `device` on `stream` while some
/// capture is under way: whether `stream` captures, so that the free is one CUDA refuses and
/// the real function must answer it.
///
/// CUDA's rule: on a capturing stream `cuMemFreeAsync` / `cudaFreeAsync` makes a free node of
/// the graph, and a free node takes only the address of a graph allocation (an allocation node
/// of a capture). The driver API's `cuMemFreeAsync` says "During stream capture, this function
/// results in the creation of a free node and must therefore be passed the address of a graph
/// allocation", and `cuGraphAddMemFreeNode` returns `CUDA_ERROR_INVALID_VALUE` for "an address
/// that was not returned by an allocation node"; the real driver refuses it so and leaves the
/// capture valid (an argument refused is no invalid operation of the capture:
/// tests/workloads/sim/driver_facts.expected, `capture_free_stream_ordered`). A pool
/// block is never a graph allocation: the pool serves no stream-ordered request on a capturing
/// stream (see [`graph_alloc`]), and its blocks lie in its own mappings whichever call
/// (`cudaMallocAsync`, `cudaMalloc`) they served. So the free goes to the real function with
/// the caller's pointer and stream, and the driver answers it: the same code, and the same
/// capture status, as without the library, the runtime's last error set by the runtime. The block is not freed: it stays the caller's, live, in no free list, and the
/// caller may free it after the capture. A capture that ends between this answer and the real
/// call leaves a stream-ordered free of mapped memory outside any capture, which the driver
/// refuses too (`CUDA_ERROR_INVALID_VALUE`): the block stays the caller's. Should a driver
/// take the free, [`taken_by_graph`] holds the block for good. Out of line: the frees no
/// capture concerns pay one load for it.
#[cold]
#[inline(never)]
fn not_a_graph_free(ptr: u64, stream: u64, device: i32) -> bool {
    if !crate::cuda::captures::capturing(stream) || graph_frees_reused() {
        return false;
    }
    crate::debug!(
        "pool: block {ptr:#x} of device {device} freed on a capturing stream: not a graph allocation, the driver answers (the block stays the caller's)"
    );
    true
}

/// The real function answered a stream-ordered free on `stream` of the live pool block `ptr`
/// (`size` bytes on `device`) with success, the pool having passed it on ([`free`] returned `None`, see
/// [`not_a_graph_free`]): a free node of a graph CUDA's documentation says the driver refuses.
/// Had a driver taken it, the graph's work may use the block until the graph's first launch
/// has run, and the pool does not follow launches: the block stays live in the policy for
/// good, counted as freed in a graph (`graph_freed`), and a later free of it goes to the real
/// function.
#[cold]
#[inline(never)]
pub(crate) fn taken_by_graph(ptr: u64, stream: u64, device: i32, size: u64) {
    if MODE.load(Ordering::Relaxed) != ON {
        return;
    }
    let held = with_pools(|pools| {
        let p = pools
            .devs
            .get_mut(usize::try_from(device).ok()?)?
            .as_mut()?;
        if !p.policy.contains(ptr) {
            return None;
        }
        p.graph_freed.push((ptr, size));
        Some(())
    });
    if held.is_some() {
        crate::warn!(
            "pool: the driver took block {ptr:#x} of device {device} ({size} bytes) freed on stream {stream:#x} as a free node of a graph: the graph's for good, never reused"
        );
    }
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=graph-frees-reused`): a block freed on a capturing
/// stream goes back to the pool's free lists at the capture's free and the free succeeds, as
/// it once did.
static GRAPH_FREES_REUSED: AtomicBool = AtomicBool::new(false);

fn graph_frees_reused() -> bool {
    GRAPH_FREES_REUSED.load(Ordering::Relaxed)
}

/// Testing only (`VRAMSHIM_POOL_DEBUG=tcache-keep-retired`): [`retire_stream`] leaves the
/// thread caches' frees where they are.
static KEEP_RETIRED: AtomicBool = AtomicBool::new(false);

/// The process destroys stream `stream` (called before the real destroy, while the handle
/// still names it): a stream created later may get the same handle value, and the destroyed
/// one's work may still run. Every thread cache gives its frees to the pools first (some may
/// be of that stream, which a cache would hand to the new stream as "the same stream"), then
/// each pool retires the stream (`Stitch::retire_stream`: what was freed on it becomes ordered
/// by an event recorded on it now).
pub(crate) fn retire_stream(stream: u64) {
    if MODE.load(Ordering::Relaxed) != ON {
        return;
    }
    with_pools(|pools| {
        if !KEEP_RETIRED.load(Ordering::Relaxed) {
            drain_tcaches(pools);
        }
        for (d, p) in pools.devs.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            p.dev.begin(stream, false);
            p.policy.retire_stream(&mut p.dev, stream);
            publish_held(d, p);
            publish_watch(d, p);
        }
    })
}

/// Does `addr` lie in memory the pool holds (live or cached)? For refusing legacy IPC
/// (`cudaIpcGetMemHandle`) and similar unsupported uses of pool memory.
pub(crate) fn owns_address(addr: u64) -> bool {
    if MODE.load(Ordering::Relaxed) != ON {
        return false;
    }
    with_pools(|pools| pools.devs.iter().flatten().any(|p| p.policy.contains(addr)))
}

/// `Some(code)`: refuse `cudaIpcGetMemHandle`/`cuIpcGetMemHandle` on `addr`, a pool address
/// (a legacy IPC handle of a stitched mapping would expose the wrong memory). Warns once.
pub(crate) fn refuse_ipc(addr: u64) -> Option<i32> {
    if !owns_address(addr) {
        return None;
    }
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        crate::warn!(
            "legacy IPC (cudaIpcGetMemHandle) on memory of VRAMSHIM_POOL=stitch is not supported; \
             run this process with VRAMSHIM_POOL=off to share its memory"
        );
    }
    Some(CUDA_ERROR_INVALID_VALUE)
}

/// The process synchronized the whole device itself (`cudaDeviceSynchronize`,
/// `cuCtxSynchronize`): every pending `cudaFree`d block is reusable.
pub(crate) fn note_process_sync() {
    if MODE.load(Ordering::Relaxed) != ON {
        return;
    }
    with_pools(|pools| {
        for p in pools.devs.iter_mut().flatten() {
            p.policy.note_process_sync();
        }
    })
}

/// Give every cached page back (before a real allocation is retried after an
/// out-of-memory, or when asked). Returns the bytes released.
pub(crate) fn trim() -> u64 {
    if MODE.load(Ordering::Relaxed) != ON {
        return 0;
    }
    with_pools(|pools| {
        drain_tcaches(pools);
        let mut n = 0;
        for (d, p) in pools.devs.iter_mut().enumerate() {
            if let Some(p) = p {
                p.dev.begin(ANY_STREAM, false);
                n += p.policy.trim(&mut p.dev).unwrap_or(0);
                publish_held(d, p);
            }
        }
        n
    })
}

/// `cudaDeviceReset` (or a primary-context reset) destroyed `device`'s memory: forget its
/// pool without driver calls.
pub(crate) fn on_device_reset(device: i32) {
    if MODE.load(Ordering::Relaxed) != ON || device < 0 {
        return;
    }
    with_pools(|pools| {
        // the context and its peer grants are gone
        if let Some(p) = PEERS.get(device as usize) {
            p.store(0, Ordering::Relaxed);
        }
        for p in &PEERS {
            p.fetch_and(!(1u64 << device.min(63)), Ordering::Relaxed);
        }
        // the thread caches' blocks of other devices go back to their pools; this
        // device's are dropped with its pool
        if let Some(slot) = pools.devs.get_mut(device as usize)
            && let Some(p) = slot.take()
        {
            HAS_POOL.fetch_and(!(1u64 << device.min(63)), Ordering::Relaxed);
            if let Some(w) = ROUND_WATCH.get(device as usize) {
                w.store(u64::MAX, Ordering::Relaxed);
            }
            if let Some(r) = KEEP_RUN.get(device as usize) {
                r.store(0, Ordering::Relaxed);
            }
            drain_tcaches(pools);
            let mut p = p;
            p.policy.reset();
            if let Some(h) = HELD.get(device as usize) {
                h.store(0, Ordering::Relaxed);
            }
        }
    })
}

/// `PEERS[o]` bit `a`: the program granted device `a` peer access to device `o`'s memory
/// (`cudaDeviceEnablePeerAccess`, `cuCtxEnablePeerAccess`). Kept whether or not `o` has a
/// pool yet, so a pool created later maps for its peers from the start.
static PEERS: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// The devices (besides the owner) every mapping of `owner`'s pool must be accessible from.
fn peers_of(owner: i32) -> u64 {
    PEERS
        .get(owner as usize)
        .map_or(0, |p| p.load(Ordering::Relaxed))
}

/// Device `accessor` was granted peer access to `owner`'s memory: a pool mapping is virtual
/// memory, which peer access does not reach (only `cuMemSetAccess` does), so grant it on
/// every range `owner`'s pool has mapped, and on every future mapping.
pub(crate) fn on_peer_access(owner: i32, accessor: i32) {
    if MODE.load(Ordering::Relaxed) != ON
        || owner == accessor
        || !(0..MAX_DEVICES as i32).contains(&owner)
        || !(0..64).contains(&accessor)
    {
        return;
    }
    if crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "no-peer") {
        // testing only: ignore the grant, to prove the peer-access test can fail
        crate::warn!("VRAMSHIM_POOL_DEBUG=no-peer: the pool ignores peer access (testing only)");
        return;
    }
    let bit = 1u64 << accessor;
    if PEERS[owner as usize].fetch_or(bit, Ordering::Relaxed) & bit != 0 {
        return;
    }
    // at once, whatever captures are under way (see `CudaDevice::grant_peers`)
    with_pools(|pools| {
        let Some(Some(p)) = pools.devs.get_mut(owner as usize) else {
            return;
        };
        p.dev.begin(ANY_STREAM, false);
        if let Err(e) = p.dev.grant_peers(peers_of(owner)) {
            crate::warn!(
                "pool: granting device {accessor} access to device {owner}'s pool failed ({e:?}); \
                 its kernels may not reach pooled memory"
            );
        }
    });
    crate::debug!("pool: device {accessor} may access device {owner}'s pool");
}

/// Statistics of `device`'s pool, if it has one.
pub(crate) fn stats(device: i32) -> Option<Stats> {
    with_device_pool(device, |p| p.policy.stats())
}

/// `read` of `device`'s pool under the pools' lock, if the pool is on and the device has one.
fn with_device_pool<T>(device: i32, read: impl FnOnce(&DevicePool) -> T) -> Option<T> {
    if MODE.load(Ordering::Relaxed) != ON || device < 0 {
        return None;
    }
    with_pools(|pools| {
        pools
            .devs
            .get(device as usize)
            .and_then(|s| s.as_ref())
            .map(read)
    })
}

/// Blocks of `device`'s pool freed in a graph (see [`taken_by_graph`]): how many, and their
/// requested bytes.
fn graph_freed(p: &DevicePool) -> (u64, u64) {
    (
        p.graph_freed.len() as u64,
        p.graph_freed.iter().map(|&(_, size)| size).sum(),
    )
}

/// [`stats`] with [`graph_freed`], one snapshot.
pub(crate) fn stats_with_graph_freed(device: i32) -> Option<(Stats, (u64, u64))> {
    with_device_pool(device, |p| (p.policy.stats(), graph_freed(p)))
}

/// Called in a forked child before it does anything else: the parent's device memory is
/// not the child's; forget every pool (no driver call) and reset the lock.
pub(crate) fn on_fork_child() {
    // SAFETY: the atfork child handler runs on the child's only thread, holding no guard.
    let pools = unsafe { POOLS.reset_in_child() };
    // The parent's map may be mid-update: moved out and forgotten, never read or dropped.
    std::mem::forget(std::mem::take(&mut pools.devs));
    HAS_POOL.store(0, Ordering::Relaxed);
    if BUDGET_READ.reset_in_child() {
        BUDGET_RATIO.forget_in_child();
    }
    for w in &ROUND_WATCH {
        w.store(u64::MAX, Ordering::Relaxed);
    }
    tcache::on_fork_child();
    for p in &PEERS {
        p.store(0, Ordering::Relaxed);
    }
}
