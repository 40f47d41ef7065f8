//! The dispatcher: runs one decoded [`Request`] through the layers, outermost first:
//! cap (`crate::cap`), pool (`crate::pool`), the real function; then records the outcome
//! in the live table and counters, and hands one event to the tracer (`crate::tracer`).
//!
//! One request = one call count = one charge = one event: hooks reached again while an
//! outer hook runs on the same thread are passed straight through (see [`run_hook`]).

pub mod registry;

use crate::cuda::request::Request;
use crate::pool;
use crate::state::counters;
use crate::state::live_table::{ALLOCS, Entry, LiveTable};
use crate::sys::ids;
use crate::sys::thread::Token;
use crate::{cap, tracer};
use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use vramshim_trace::{AllocKind, Api, Event, MemOp, flags};

/// Which layer served a request (for the debug log; the cap's refusals return early).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layer {
    Pool,
    Real,
}

impl Layer {
    fn name(self) -> &'static str {
        match self {
            Layer::Pool => "pool",
            Layer::Real => "real",
        }
    }
}

/// Run a hook body: the outermost hook on this thread runs `body`; a nested one runs `pass`
/// (straight to the real function, unaccounted). A panic in either is caught and turned
/// into `panic_code` (never unwinds into C, never aborts).
#[inline(always)]
pub(crate) fn run_hook(
    name: &'static str,
    panic_code: c_int,
    pass: impl FnOnce() -> c_int,
    body: impl FnOnce(&Token) -> c_int,
) -> c_int {
    let Some(tok) = crate::sys::thread::enter() else {
        return match std::panic::catch_unwind(AssertUnwindSafe(pass)) {
            Ok(rc) => rc,
            Err(_) => panicked(name, panic_code),
        };
    };
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| body(&tok)));
    tok.leave();
    match r {
        Ok(rc) => rc,
        Err(_) => panicked(name, panic_code),
    }
}

/// [`run_hook`] for hooks whose pass-through and body share one real call: `call` goes to
/// whichever branch runs (moved, not borrowed, so that the body reaches its arguments
/// without a second indirection).
#[inline(always)]
pub(crate) fn run_hook_with<C>(
    name: &'static str,
    panic_code: c_int,
    call: C,
    pass: impl FnOnce(C) -> c_int,
    body: impl FnOnce(&Token, C) -> c_int,
) -> c_int {
    let Some(tok) = crate::sys::thread::enter() else {
        return match std::panic::catch_unwind(AssertUnwindSafe(move || pass(call))) {
            Ok(rc) => rc,
            Err(_) => panicked(name, panic_code),
        };
    };
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| body(&tok, call)));
    tok.leave();
    match r {
        Ok(rc) => rc,
        Err(_) => panicked(name, panic_code),
    }
}

/// Run a lookup or query hook that is never nested-guarded, catching panics.
#[inline(always)]
pub(crate) fn run_unguarded<T>(name: &'static str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            counters::panic_caught();
            crate::warn!("internal error (panic) in {name}; returning an error code");
            on_panic
        }
    }
}

#[cold]
fn panicked(name: &'static str, code: c_int) -> c_int {
    counters::panic_caught();
    // a section the request kept open would keep every begin waiting
    cap::real_call_returned();
    crate::warn!("internal error (panic) in {name}; returning CUDA error {code}");
    code
}

/// The layers a request meets, read once per request by the hook ([`mode`]) and handed
/// down, so that no layer's switch is read twice on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mode(u8);

impl Mode {
    /// The configuration was read (never 0 once read: 0 means "read it").
    const KNOWN: u8 = 1;
    const CAP: u8 = 2;
    const POOL: u8 = 4;
    const DEBUG: u8 = 8;
    const TRACE: u8 = 16;
    /// `VRAMSHIM_LAYERS_FAULT=no-light`: never the light path (see [`Mode::light`]).
    const NO_LIGHT: u8 = 32;
    /// `VRAMSHIM_LAYERS_FAULT=light-no-pitch`: a broken light path, for the test that
    /// compares it with the layered one: it never settles a charge to the allocation's
    /// footprint (a pitched allocation's padding, a packed allocation's shared page).
    const FAULT_NO_PITCH: u8 = 64;

    /// Nothing but pass-through: the hooks take the [`Passed`] path.
    #[inline(always)]
    pub(crate) fn pass_through(self) -> bool {
        self.0 == Self::KNOWN
    }
    #[inline(always)]
    fn cap(self) -> bool {
        self.0 & Self::CAP != 0
    }
    #[inline(always)]
    fn pool(self) -> bool {
        self.0 & Self::POOL != 0
    }
    #[inline(always)]
    fn traced(self) -> bool {
        self.0 & Self::TRACE != 0
    }
}

/// The layers on for this request: one relaxed load once they were read.
#[inline(always)]
pub(crate) fn mode() -> Mode {
    let m = crate::config::layers::cached();
    if m != 0 {
        return Mode(m);
    }
    Mode(layers_slow())
}

#[cold]
#[inline(never)]
fn layers_slow() -> u8 {
    loop {
        let traced = tracer::enabled_seqcst();
        let mut m = Mode::KNOWN;
        if traced {
            m |= Mode::TRACE;
        }
        if crate::sys::log::enabled(crate::sys::log::Level::Debug) {
            m |= Mode::DEBUG;
        }
        if pool::enabled() {
            m |= Mode::POOL;
        }
        if cap::global().is_some() {
            m |= Mode::CAP;
        }
        if m != Mode::KNOWN {
            m |= fault_bits();
        }
        crate::config::layers::store(m);
        // The first request of the process (and any after a switch changed): cold.
        registry::start();
        // The tracer switches (SeqCst) before it clears the bits: had it switched since we
        // read it, we see that here, and read again rather than keep stale bits.
        if tracer::enabled_seqcst() == traced {
            return m;
        }
    }
}

/// `VRAMSHIM_LAYERS_FAULT`: `no-light` (layered requests never take the light path) or
/// `light-no-pitch` (the light path never settles a charge to the allocation's footprint:
/// a test must notice). Read with the layers, never per request.
fn fault_bits() -> u8 {
    use crate::config::switch_on;
    let mut bits = 0;
    if switch_on("VRAMSHIM_LAYERS_FAULT", "no-light") {
        bits |= Mode::NO_LIGHT;
    }
    if switch_on("VRAMSHIM_LAYERS_FAULT", "light-no-pitch") {
        bits |= Mode::FAULT_NO_PITCH;
    }
    bits
}

// ------------------------------------------------------------------ one alloc, one free
//
// Every allocation runs [`AllocCall`]'s `run` and every free [`FreeCall`]'s; what differs between requests is
// which layers they can meet, and that is a type, [`Path`], so that each path is the same
// body with the layers it never meets compiled out:
// * [`Passed`]: nothing on (pass-through): the request is counted and recorded, no more;
// * [`Light`]: only the cap and/or the tracer (no pool, no debug log): charge and event
//   added, the real call's result read where it is;
// * [`Layered`]: anything (the pool, the debug log, `VRAMSHIM_LAYERS_FAULT=no-light`).
// A light request does what a layered one does with those layers; interposer/tests/layers.rs
// compares the traces and the answers of the two (`no-light` sends every request through
// [`Layered`]).

/// Which layers a path may meet (see the section above). Each is a unit type; the
/// constants fold, so a path pays only for its own layers.
pub(crate) trait Path {
    /// The cap and the tracer may be on (whether they are is read from the [`Mode`]).
    const CAP_TRACE: bool;
    /// The pool and the debug log may be on.
    const LAYERED: bool;
}

/// Pass-through: no layer is on ([`Mode::pass_through`]).
pub(crate) struct Passed;
/// Only the cap and/or the tracer ([`Mode::light`]).
pub(crate) struct Light;
/// Any layer.
pub(crate) struct Layered;

impl Path for Passed {
    const CAP_TRACE: bool = false;
    const LAYERED: bool = false;
}
impl Path for Light {
    const CAP_TRACE: bool = true;
    const LAYERED: bool = false;
}
impl Path for Layered {
    const CAP_TRACE: bool = true;
    const LAYERED: bool = true;
}

impl Mode {
    /// Only the cap and/or the tracer: the hooks take the [`Light`] path.
    #[inline(always)]
    pub(crate) fn light(self) -> bool {
        self.0 & (Self::POOL | Self::DEBUG | Self::NO_LIGHT) == 0
    }
}

/// A request a hook hands the pipeline ([`AllocCall`], [`FreeCall`]): run on the path its
/// mode picks by [`run`].
pub(crate) trait Call: Sized {
    /// The light path is inlined into the hook (else it runs out of line, as the layered
    /// one always does).
    const LIGHT_INLINE: bool;
    /// The request on path `P`, inlined where the path is chosen.
    fn run<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int;
    /// [`Call::run`] out of line: inlined, the paths that meet layers would make every
    /// hook's frame (pass-through's too) bigger.
    fn run_outlined<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int;
}

/// Run the request `make` builds on the path the mode read once picks: pass-through inline,
/// the paths that meet layers as [`Call`] says. Built in each branch: built before the mode
/// check, the request (and the closures in it) was stored to the stack on every request.
#[inline(always)]
pub(crate) fn run<C: Call>(tok: &Token, table: &LiveTable, make: impl FnOnce() -> C) -> c_int {
    let mode = mode();
    if mode.pass_through() {
        make().run::<Passed>(tok, mode, table)
    } else if mode.light() && C::LIGHT_INLINE {
        make().run::<Light>(tok, mode, table)
    } else if mode.light() {
        make().run_outlined::<Light>(tok, mode, table)
    } else {
        make().run_outlined::<Layered>(tok, mode, table)
    }
}

/// What an allocation hook hands the pipeline: how to build its request, make the real call
/// and read what it produced, and how to give the caller a pool pointer.
pub(crate) struct AllocCall<Q, C, R, W> {
    /// Builds the request (inside the path, where its constant fields fold).
    pub make_req: Q,
    /// The pool may serve it (plain linear allocations with a valid out-pointer).
    pub pool_ok: bool,
    /// The real call (writing the caller's out-pointers itself).
    pub call: C,
    /// The pointer and size the real call produced (after a success).
    pub read: R,
    /// Writes a pointer the pool served through the caller's out-pointer.
    pub write_pool: W,
}

impl<Q, C, R, W> Call for AllocCall<Q, C, R, W>
where
    Q: FnOnce() -> Request,
    C: FnOnce() -> c_int,
    R: FnOnce() -> (u64, u64),
    W: FnOnce(u64),
{
    const LIGHT_INLINE: bool = false;

    /// The allocation on path `P` (see [`Path`]): cap, pool, real; the live table and
    /// counters; debug log and trace.
    #[inline(always)]
    fn run<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int {
        let req = &(self.make_req)();
        // Counted before any layer can refuse it; on pass-through after the real call, which
        // keeps fewer values alive across it.
        if P::CAP_TRACE {
            counters::call_in(tok, req.api);
        }
        let traced = P::CAP_TRACE && mode.traced();
        let t0 = if traced {
            tracer::stamp()
        } else {
            tracer::Stamp::NONE
        };

        // ---- cap
        let mut charged = 0u64;
        // A request the pool may serve is charged nothing here: the pool's pages are charged
        // when it creates them (cap::pages). Anything else is charged the device's footprint.
        let poolable = P::LAYERED && mode.pool() && self.pool_ok && pool::enabled();
        let capped = P::CAP_TRACE && mode.cap() && req.charged() && req.size > 0;
        let pages_charged = poolable && capped && cap::charges_pool_pages();
        if capped && !pages_charged {
            let r = if poolable {
                // VRAMSHIM_CAP_FAULT=pool-live-bytes: the request's live bytes.
                cap::try_charge(req.device, req.size, req.api).map(|()| req.size)
            } else {
                charge_unpooled::<P>(req)
            };
            match r {
                Ok(c) => charged = c,
                Err(refusal) => return cap_refused(req, &refusal, traced, t0),
            }
        }

        // ---- pool
        let mut layer = Layer::Real;
        let mut kind = req.kind;
        let mut fl = req.flags;
        let mut served = None;
        if poolable {
            match pool::alloc(req) {
                Some(Ok(p)) => {
                    layer = Layer::Pool;
                    kind = AllocKind::Pool;
                    fl |= flags::POOLED;
                    counters::pooled();
                    served = Some((0, p));
                }
                Some(Err(code)) => {
                    if pages_charged
                        && let Some(refusal) = cap::take_pool_refusal(req.device, req.size, req.api)
                    {
                        // The cap refused the pages the request needed (after the pool
                        // dissolved what it caches): a cap refusal.
                        return cap_refused(req, &refusal, traced, t0);
                    }
                    layer = Layer::Pool;
                    served = Some((code, 0));
                }
                None => {}
            }
            // Not served by the pool after all (it fell back to pass-through): charged as any
            // unpooled allocation.
            if served.is_none() && pages_charged {
                match charge_unpooled::<P>(req) {
                    Ok(c) => charged = c,
                    Err(refusal) => return cap_refused(req, &refusal, traced, t0),
                }
            }
        }

        // ---- real
        let (rc, addr, size) = match served {
            Some((rc, addr)) => (rc, addr, req.size),
            None => {
                let rc = (self.call)();
                if !P::CAP_TRACE {
                    counters::call_in(tok, req.api);
                    if rc != 0 {
                        // No layer to tell: a failure is only counted.
                        counters::alloc_failure();
                        return rc;
                    }
                }
                let (addr, size) = if rc == 0 {
                    (self.read)()
                } else {
                    (0, req.size)
                };
                (rc, addr, size)
            }
        };

        // The charge becomes the allocation's footprint (pitched padding, packed pages); never
        // on a light path broken on purpose (`VRAMSHIM_LAYERS_FAULT=light-no-pitch`). A settle
        // of the driver's pools made for the charge kept its section open over the real call
        // (the begins on other threads wait for it): it ends here, or in `record_alloc` when
        // the call failed.
        if rc == 0 && addr != 0 && charged > 0 && layer == Layer::Real {
            if P::LAYERED || mode.0 & Mode::FAULT_NO_PITCH == 0 {
                charged = cap::settle_alloc(req.device, addr, size, charged, req.api);
            }
            cap::real_call_returned();
        }
        record_alloc(tok, req, table, rc, addr, size, kind, fl, charged);
        let addr = if rc == 0 { addr } else { 0 };

        if P::LAYERED {
            crate::debug!(
                "{} size={} dev={} stream={:#x} -> {} addr={:#x} [{}]",
                req.api.name(),
                size,
                req.device,
                req.stream,
                rc,
                addr,
                layer.name()
            );
        }
        if traced {
            // `WAITED_ON_CAP` when the charge waited for room (VRAMSHIM_ON_CAP=wait).
            emit_op(req, true, fl | cap::waited_flag(), addr, size, rc, t0);
            if layer == Layer::Pool {
                // The pool may have mapped or released pages for this request.
                tracer::pool_held(req.device, pool::held(req.device));
            }
        }
        if layer == Layer::Pool && rc == 0 {
            (self.write_pool)(addr);
        }
        rc
    }

    #[inline(never)]
    fn run_outlined<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int {
        self.run::<P>(tok, mode, table)
    }
}

/// Record a finished allocation: a success goes into the live table (and its counters); a
/// failure gives back what the cap charged for it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn record_alloc(
    tok: &Token,
    req: &Request,
    table: &LiveTable,
    rc: c_int,
    addr: u64,
    size: u64,
    kind: AllocKind,
    fl: u8,
    charged: u64,
) {
    if rc != 0 || addr == 0 {
        if charged > 0 {
            cap::uncharge(req.device, charged);
            cap::real_call_returned();
        }
        if rc != 0 {
            counters::alloc_failure();
        }
        return;
    }
    let e = Entry {
        size,
        kind,
        device: req.device,
        stream: req.stream,
        api: req.api,
        flags: fl,
        charged,
    };
    if let Some(stale) = table.insert_in(tok, addr, e) {
        // The address was handed out again without us seeing its free.
        forget(addr, stale);
    }
    counters::alloc_in(tok, req.device, kind, size);
}

/// An entry left the table without a free we passed on (stale, or dropped by a reset).
/// By value: a reference would keep the insert's result in memory on every request.
#[cold]
#[inline(never)]
fn forget(addr: u64, e: Entry) {
    counters::free(e.device, e.kind, e.size);
    if e.charged > 0 {
        cap::uncharge_entry(e.device, addr, e.charged);
    }
}

/// Charges an allocation the pool does not serve its footprint. On a layered path (the pool
/// may be on) a refusal first makes the pool give back the pages it caches (they are
/// charged too), then the charge is tried once more; never while the request's stream
/// captures (the pool's trim synchronizes).
#[inline]
fn charge_unpooled<P: Path>(req: &Request) -> Result<u64, cap::Refusal> {
    let stream = driver_stream(req);
    if !P::LAYERED {
        return cap::charge_alloc(req.device, req.size, req.api, stream);
    }
    cap::charge_alloc_or(req.device, req.size, req.api, stream, || {
        pool::enabled()
            && cap::charges_pool_pages()
            && !cap::stream_capturing(stream)
            && pool::trim() > 0
    })
}

/// The driver's handle of the request's stream (the per-thread default stream for a `_ptsz`
/// call on stream 0), for the cap's capture check before it empties the driver's pools.
#[inline(always)]
fn driver_stream(req: &Request) -> u64 {
    const CU_STREAM_PER_THREAD: u64 = 2;
    if req.stream == 0 && req.flags & vramshim_trace::flags::PER_THREAD_STREAM != 0 {
        CU_STREAM_PER_THREAD
    } else {
        req.stream
    }
}

/// The cap refused `req`: count it, make the runtime's last error say so (unless a stream
/// capture forbids the thread the call that sets it), log and trace it. Returns the code the
/// process sees.
#[cold]
#[inline(never)]
fn cap_refused(req: &Request, refusal: &cap::Refusal, traced: bool, t0: tracer::Stamp) -> c_int {
    counters::cap_refusal();
    static FIRST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    if crate::sys::log::enabled(crate::sys::log::Level::Info)
        && FIRST.swap(false, std::sync::atomic::Ordering::Relaxed)
    {
        let context = cap::global().map_or(0, |c| c.context_charged(req.device));
        crate::info!(
            "cap: first refusal on device {}: {} bytes asked; {} charged = {} of the CUDA context + {} of allocations; cap {}; later refusals are counted in the trace (VRAMSHIM_LOG=debug prints each)",
            req.device,
            req.size,
            refusal.in_use,
            context,
            refusal.in_use.saturating_sub(context),
            refusal.cap
        );
    }
    // the runtime is asked for an allocation to set its last error (no call while a capture
    // forbids this thread one: `runtime_set_last_error_oom` asks; the cap refused the request
    // before CUDA was asked, so nothing else reached the driver)
    if crate::cuda::request::is_runtime(req.api) {
        crate::cuda::real::runtime_set_last_error_oom();
    }
    crate::debug!(
        "{} size={} dev={} stream={:#x} -> {} [cap refused: in use {} + {} > cap {}]",
        req.api.name(),
        req.size,
        req.device,
        req.stream,
        vramshim_trace::codes::OUT_OF_MEMORY,
        refusal.in_use,
        req.size,
        refusal.cap
    );
    if traced {
        tracer::emit(Event::CapRefusal {
            t_ns: t0.ns,
            tid: ids::tid(),
            device: req.device,
            api: req.api,
            size: req.size,
            in_use: refusal.in_use,
            cap: refusal.cap,
        });
        emit_op(
            req,
            true,
            req.flags | flags::CAP_REFUSED | cap::waited_flag(),
            0,
            req.size,
            2,
            t0,
        );
    }
    vramshim_trace::codes::OUT_OF_MEMORY
}

/// A free a hook hands the pipeline, with its real call.
pub(crate) struct FreeCall<C> {
    pub api: Api,
    /// Pointer or handle.
    pub key: u64,
    /// `Some(stream)` for stream-ordered frees.
    pub stream: Option<u64>,
    pub flags: u8,
    /// The real call.
    pub call: C,
}

impl<C: FnOnce() -> c_int> Call for FreeCall<C> {
    /// Inline: it adds little to the hook's frame.
    const LIGHT_INLINE: bool = true;

    /// The free on path `P` (see [`Path`]): the table entry is removed first (so a
    /// concurrent allocation that gets the same address cannot be confused with it), the
    /// pool or the real function frees, and on failure the entry is restored. Unknown
    /// pointers go to the real function; its code comes back unchanged.
    #[inline(always)]
    fn run<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int {
        counters::call_in(tok, self.api);
        if self.key == 0 {
            // cudaFree(NULL) & co.: a no-op (or context initialization) for CUDA.
            return free_null(self.api, self.call);
        }
        let traced = P::CAP_TRACE && mode.traced();
        let t0 = if traced {
            tracer::stamp()
        } else {
            tracer::Stamp::NONE
        };
        let entry = table.remove_in(tok, self.key);
        let pooled = if P::LAYERED
            && mode.pool()
            && pool::enabled()
            && entry.is_none_or(|e| e.kind == AllocKind::Pool)
        {
            pool::free(
                self.key,
                self.stream.map(|s| pool::pool_stream_id(s, self.flags)),
                entry.map(|e| (e.device, e.size)),
            )
        } else {
            None
        };
        let (rc, layer) = match pooled {
            Some(rc) => (rc, Layer::Pool),
            None => {
                let rc = (self.call)();
                if rc == 0
                    && let (Some(s), Some(e)) = (self.stream, entry)
                    && e.kind == AllocKind::Pool
                {
                    pool_block_freed_by_driver(self.key, s, self.flags, e);
                }
                (rc, Layer::Real)
            }
        };
        settle_free(tok, self.key, table, rc, entry);
        if P::LAYERED {
            let (dev, _, size, _) = freed(entry, rc);
            crate::debug!(
                "{} addr={:#x} size={} dev={} -> {} [{}{}]",
                self.api.name(),
                self.key,
                size,
                dev,
                rc,
                layer.name(),
                if entry.is_none() {
                    ", unknown pointer"
                } else {
                    ""
                }
            );
        }
        if traced {
            emit_free(self.api, self.key, self.stream, self.flags, entry, rc, t0);
        }
        rc
    }

    #[inline(never)]
    fn run_outlined<P: Path>(self, tok: &Token, mode: Mode, table: &LiveTable) -> c_int {
        self.run::<P>(tok, mode, table)
    }
}

/// The real function freed `key`, a live pool block the pool passed on, stream-ordered on
/// `stream`: the free of one on a capturing stream, which the driver was expected to refuse
/// (see `pool::taken_by_graph`). Out of line: no path's frame pays for it.
#[cold]
#[inline(never)]
fn pool_block_freed_by_driver(key: u64, stream: u64, flags: u8, e: Entry) {
    pool::taken_by_graph(key, pool::pool_stream_id(stream, flags), e.device, e.size);
}

/// A free of NULL: the real function's business alone. Out of line: no path's frame pays
/// for it.
#[cold]
#[inline(never)]
fn free_null(api: Api, call: impl FnOnce() -> c_int) -> c_int {
    let rc = call();
    crate::debug!("{}(NULL) -> {} [real]", api.name(), rc);
    rc
}

/// The table and counters after a free of `key` returned `rc`: a success forgets the entry
/// for good (and gives back its charge); a failure puts it back; an unknown pointer is
/// counted. Every free path settles here.
#[inline(always)]
fn settle_free(tok: &Token, key: u64, table: &LiveTable, rc: c_int, entry: Option<Entry>) {
    match (rc, entry) {
        (0, Some(e)) => {
            counters::free_in(tok, e.device, e.kind, e.size);
            if e.charged > 0 {
                cap::uncharge_freed(e.device, key, e.charged, e.kind == AllocKind::Async);
            }
        }
        (_, Some(e)) => {
            table.insert_in(tok, key, e);
        }
        (_, None) => counters::unknown_free(),
    }
}

/// What a free's event says of the entry it settled: its device, kind and flags, and the
/// bytes the free gave back (0 when it failed or the pointer was unknown).
#[inline(always)]
fn freed(entry: Option<Entry>, rc: c_int) -> (i32, AllocKind, u64, u8) {
    match entry {
        Some(e) if rc == 0 => (e.device, e.kind, e.size, e.flags),
        Some(e) => (e.device, e.kind, 0, e.flags),
        None => (-1, AllocKind::Runtime, 0, 0),
    }
}

/// Trace a finished free of `key` (`stream`: `Some` for stream-ordered frees).
#[inline(always)]
fn emit_free(
    api: Api,
    key: u64,
    stream: Option<u64>,
    fl: u8,
    entry: Option<Entry>,
    rc: c_int,
    t0: tracer::Stamp,
) {
    let (device, kind, size, efl) = freed(entry, rc);
    let op = memop(
        t0.ns,
        api,
        kind,
        fl | (efl & flags::POOLED),
        device,
        stream.unwrap_or(0),
    );
    let op = MemOp {
        addr: key,
        size,
        result: rc,
        latency_ns: t0.latency_ns(),
        ..op
    };
    tracer::emit_memop(false, &op);
}

/// A memory-information query: `real` fills the caller's out-values and returns its code
/// and the (free, total) it wrote (None for NULL out-pointers); the cap adjusts them by API:
/// `cudaMemGetInfo`/`cuMemGetInfo_v2` with `cap::adjust_meminfo`, `cuDeviceTotalMem_v2` and
/// `totalGlobalMem` with `cap::total_for`; NVML hooks adjust in `write` themselves
/// (`cap::nvml_adjust*`). `write(device, free, total)` stores the answer back.
pub(crate) fn meminfo(
    tok: &Token,
    api: Api,
    device: impl FnOnce() -> Option<i32>,
    real: impl FnOnce() -> (c_int, Option<u64>, Option<u64>),
    write: impl FnOnce(i32, u64, u64),
) -> c_int {
    counters::call_in(tok, api);
    let (rc, f, t) = real();
    if rc != 0 {
        crate::debug!("{} -> {} [real]", api.name(), rc);
        return rc;
    }
    let dev = device().unwrap_or(-1);
    let (rf, rt) = (f.unwrap_or(0), t.unwrap_or(0));
    let (af, at) = if dev < 0 {
        (rf, rt)
    } else {
        match api {
            Api::CudaMemGetInfo | Api::CuMemGetInfo => cap::adjust_meminfo(dev, rf, rt),
            Api::CuDeviceTotalMem | Api::CudaGetDeviceProperties => {
                if t.is_some() {
                    cap::note_device_total(dev, rt);
                }
                (rf, cap::total_for(dev, rt))
            }
            _ => (rf, rt),
        }
    };
    write(dev, af, at);
    crate::debug!(
        "{} dev={} real free={} total={} -> free={} total={} [{}]",
        api.name(),
        dev,
        rf,
        rt,
        af,
        at,
        if (af, at) == (rf, rt) {
            "real"
        } else {
            "cap adjusted"
        }
    );
    if tracer::enabled() {
        tracer::emit(Event::MemInfo {
            t_ns: tracer::now_raw(),
            tid: ids::tid(),
            api,
            device: dev,
            free: af,
            total: at,
            result: rc,
        });
    }
    rc
}

/// `cudaDeviceReset` succeeded on `device`: everything the context held is gone.
pub(crate) fn device_reset(device: i32) {
    let dropped = ALLOCS.drain_where(|e| e.device == device && e.kind != AllocKind::VmmHandle);
    let traced = tracer::enabled();
    let mut bytes = 0u64;
    for (addr, e) in &dropped {
        forget(*addr, *e);
        bytes = bytes.saturating_add(e.size);
        if traced {
            let op = memop(
                tracer::now_raw(),
                Api::CudaDeviceReset,
                e.kind,
                e.flags,
                e.device,
                e.stream,
            );
            tracer::emit(Event::Free(MemOp {
                addr: *addr,
                size: e.size,
                ..op
            }));
        }
    }
    crate::debug!(
        "cudaDeviceReset dev={} -> 0 [real; dropped {} live allocations, {} bytes]",
        device,
        dropped.len(),
        bytes
    );
}

#[inline(always)]
fn emit_op(
    req: &Request,
    is_alloc: bool,
    fl: u8,
    addr: u64,
    size: u64,
    rc: c_int,
    t0: tracer::Stamp,
) {
    let op = memop(t0.ns, req.api, req.kind, fl, req.device, req.stream);
    let op = MemOp {
        addr,
        size,
        result: rc,
        latency_ns: t0.latency_ns(),
        ..op
    };
    tracer::emit_memop(is_alloc, &op);
}

/// The one place an event of a request is built: what every event of the pipeline shares
/// (the calling thread), with no address, size, result or latency yet.
#[inline(always)]
fn memop(t_ns: u64, api: Api, kind: AllocKind, flags: u8, device: i32, stream: u64) -> MemOp {
    MemOp {
        t_ns,
        tid: ids::tid(),
        api,
        kind,
        flags,
        device,
        stream,
        addr: 0,
        size: 0,
        result: 0,
        latency_ns: 0,
        stack: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_error_codes_and_nesting_passes_through() {
        // Quiet the default panic message for this deliberate panic.
        let rc = run_hook("test", 999, || 1, |_| panic!("deliberate"));
        assert_eq!(rc, 999);
        // The guard was released: the next hook is outermost again.
        let rc = run_hook("outer", 999, || 1, |_| run_hook("inner", 999, || 7, |_| 8));
        assert_eq!(rc, 7, "a hook inside a hook passes straight through");
        assert_eq!(run_unguarded("lookup", 5, || -> i32 { panic!("x") }), 5);
    }
}
