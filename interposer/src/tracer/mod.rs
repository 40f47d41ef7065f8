//! Tracer layer (owner: trace): `VRAMSHIM_TRACE=path` records every event the interposer core
//! hands to [`emit`] into a `.vramtrace` file (`docs/trace-format.md`).
//!
//! Data path:
//! - The calling thread appends the event as it is to its own buffer (a [`slots::Slot`],
//!   found through a const, non-Drop thread-local pointer; an allocation or a free is one
//!   64-byte entry, a few plain stores; no allocation except the buffer itself). Slots live
//!   in a lock-free registry and are never freed, so the events of exited threads are not
//!   lost, and nothing happens in a TLS destructor.
//! - A full buffer (64 KiB, 1024 events) goes over a bounded `crossbeam-channel` (`try_send`:
//!   the app never blocks) to one writer thread (started on the first event, not in the
//!   constructor), which encodes the events into records (delta/varint encoding, reuse
//!   lookups: work the calling thread did before session 5, same bytes) and compresses them
//!   with zstd (level 3, single-threaded) into frames and writes them.
//! - Every 50 ms the writer also takes the partial buffers of every thread, adds `Counter`,
//!   `Lost` and new `Module` records, and writes a frame: everything an application did is on
//!   disk within 100 ms (a SIGKILL loses at most that).
//! - If a buffer cannot be handed over (channel full) the thread keeps appending up to 4 MiB
//!   (65536 events), then yields to the writer (at most 100 ms); beyond that the buffer is
//!   dropped and its events counted in a `Lost` record.
//! - At exit (`atexit`, which also covers `exit()` from any thread and the end of `main`) the
//!   exiting thread takes the writer, drains everything and writes the `End` record itself.
//!   `_exit`/`_Exit` (which skip atexit, and may be called from a signal handler) hand that
//!   work to the writer thread from their hooks (`hooks/process.rs`) and wait for it without
//!   allocating or locking, except in a vfork child (the writer belongs to the parent); the
//!   wait ends when the writer makes no step for 500 ms (it may need a lock the interrupted
//!   code holds), and there is none with `VRAMSHIM_TRACE_EXIT_FLUSH=0`; then the periodic
//!   flush bounds what is lost to the last 50–100 ms.
//! - `fork()` in a traced process writes a `Fork` record (child pid) to the parent's trace.
//! - A forked child ([`on_fork_child`]) forgets the parent's writer, channel and buffers
//!   without touching any lock, and lazily starts its own writer and file on its first event.
//!   A pattern without `%p` gets `.<pid>` appended in the child.
//!
//! Timestamps come from [`clock`]: `CLOCK_MONOTONIC` ns, read from the TSC where it is
//! invariant (two reads per traced call cost ~25 ns instead of ~55), kept on the monotonic
//! clock by re-anchoring every 50 ms. The calling thread keeps the raw TSC; the writer
//! converts it to ns when it encodes the event.
//!
//! `VRAMSHIM_STACKS=N` captures up to N return addresses per alloc/free with libgcc's
//! `_Unwind_Backtrace` (works without frame pointers), deduplicated at capture: each distinct
//! stack is written once as a `Stack` record and events refer to its id. The module map
//! (`dl_iterate_phdr`) is written at start and whenever the loader reports new objects, so
//! `vramshim` symbolizes after the fact.

mod barrier;
mod clock;
mod elf_syms;
mod entries;
mod header;
mod modules;
mod patience;
mod pyframes;
mod slots;
mod stack_keys;
mod stacks;
mod tick_hook;
pub mod torch;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::sys::wired::Wired;
use vramshim_trace::Event;

/// Trace time now for an event handed to [`emit`] (raw TSC where that is the trace clock;
/// the writer converts it to ns: see `clock`).
pub use clock::now_raw;
pub use clock::{Stamp, stamp};

/// Tracing is configured and not finished. Read with one relaxed load.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Frames per call stack (0 = no stacks).
static STACK_DEPTH: AtomicU32 = AtomicU32::new(0);

/// What the writer reads of the layers beside this one for its per-device `Counter`
/// records. Set at load by the layer that wires the others together (`lifecycle`), as this
/// layer imports neither the pool nor the cap; until then, no pool and no cap.
pub(crate) struct DeviceView {
    /// Bytes the pool holds from the device (`None`: no pool serves it).
    pub pool_reserved: fn(i32) -> Option<u64>,
    /// The pool's figures for `PoolStats` records: reserved, live, cached, pending, budget,
    /// releases (`None`: no pool serves the device).
    pub pool_stats: fn(i32) -> Option<[u64; 6]>,
    /// The device's cap, given its real total (0: not capped).
    pub cap: fn(i32, u64) -> u64,
    /// The cap's limits in force, for the header's configuration (`cap.limit` entries).
    pub cap_limits: fn() -> Vec<(String, String)>,
}

static DEVICE_VIEW: Wired<DeviceView> = Wired::new(DeviceView {
    pool_reserved: |_| None,
    pool_stats: |_| None,
    cap: |_, _| 0,
    cap_limits: Vec::new,
});

/// Wire in the pool's and the cap's view of each device (see [`DeviceView`]).
pub(crate) fn set_device_view(v: DeviceView) {
    DEVICE_VIEW.set(v);
}

pub(crate) fn device_view() -> &'static DeviceView {
    DEVICE_VIEW.get()
}

/// One relaxed atomic load on the hot path.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// [`enabled`], ordered with [`crate::config::layers::changed`] (the dispatcher's check
/// that the layer bits it cached are not stale; not for the hot path).
pub(crate) fn enabled_seqcst() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Append one event to the calling thread's buffer. Its times must be trace times
/// ([`now_raw`], [`stamp`]): the writer converts them to ns when it encodes the event.
#[inline]
pub fn emit(ev: Event) {
    if !enabled() {
        return;
    }
    slots::emit(ev);
}

/// Append one allocation (`alloc`) or free record to the calling thread's buffer: [`emit`]
/// of `Event::Alloc(*m)` / `Event::Free(*m)` without building or moving an `Event` (the
/// dispatcher's hot path).
#[inline(always)]
pub(crate) fn emit_memop(alloc: bool, m: &vramshim_trace::MemOp) {
    if !enabled() {
        return;
    }
    // Two copies, each with its kind fixed: no branch on it in the encoder (callers pass a
    // constant, so this choice folds away).
    if alloc {
        slots::emit_memop::<true>(m);
    } else {
        slots::emit_memop::<false>(m);
    }
}

/// Append one `Torch` event (PyTorch's allocator, `torch`) to the calling thread's buffer:
/// [`emit`] of `Event::Torch(*t)` without building or moving an `Event`.
#[inline(always)]
pub(crate) fn emit_torch(t: &vramshim_trace::TorchOp) {
    if !enabled() {
        return;
    }
    slots::emit_torch(t);
}

/// Called in a forked child before it does anything else: touch no lock, forget the parent's
/// writer and buffers; the child starts its own file on its first event.
pub(crate) fn on_fork_child() {
    clock::on_fork_child();
    barrier::on_fork_child();
    writer::on_fork_child();
    slots::on_fork_child();
    stacks::on_fork_child();
    tick_hook::on_fork_child();
    torch::on_fork_child();
    pyframes::reset_in_child();
}

/// Called at process exit: flush everything and write the end record on this thread.
pub fn on_exit() {
    writer::finish();
}

/// Whether tracing is on and nothing was recorded yet.
pub(crate) fn nothing_recorded() -> bool {
    enabled() && writer::never_started()
}

/// What the pool holds on `device` after a pooled request (`held`: now, `peak`: the most so
/// far, which one decision may pass through): `Counter` records when either changed, so the
/// trace's reserved figure is exact at every change, peak included, not only at the writer's
/// periodic samples.
pub(crate) fn pool_held(device: i32, (held, peak): (u64, u64)) {
    use std::sync::atomic::AtomicU64;
    static SHOWN: [AtomicU64; slots::MAX_DEV] = [const { AtomicU64::new(0) }; slots::MAX_DEV];
    static SHOWN_PEAK: [AtomicU64; slots::MAX_DEV] = [const { AtomicU64::new(0) }; slots::MAX_DEV];
    let Some(d) = usize::try_from(device).ok().filter(|&d| d < slots::MAX_DEV) else {
        return;
    };
    // A peak passed inside the decision (above what is held after it) is recorded first.
    let new_peak = SHOWN_PEAK[d].fetch_max(peak, Ordering::Relaxed) < peak && peak > held;
    let changed = SHOWN[d].swap(held, Ordering::Relaxed) != held;
    if !new_peak && !changed {
        return;
    }
    let live = slots::live_totals().get(d).map_or(0, |&v| v.max(0) as u64);
    let t_ns = stamp().ns;
    let counter = |reserved_bytes| Event::Counter {
        t_ns,
        device,
        live_bytes: live,
        reserved_bytes,
        // Not restated here: the writer's own records carry the cap.
        cap: 0,
    };
    if new_peak {
        emit(counter(peak));
    }
    emit(counter(held));
}

/// Starts the writer now (a trace with no event yet), when tracing is on.
pub(crate) fn start_now() {
    if enabled() {
        writer::ensure_started();
    }
}

/// Records a failed call that explains what followed (the driver's start-up, a context's
/// creation), and says it at `VRAMSHIM_LOG=info`.
pub(crate) fn call_failed(name: &str, device: i32, result: i32) {
    if device >= 0 {
        crate::info!("{name} failed on device {device}: CUDA error {result}");
    } else {
        crate::info!("{name} failed: CUDA error {result}");
    }
    if !enabled() {
        return;
    }
    emit(Event::CallFailed {
        t_ns: stamp().ns,
        tid: crate::sys::ids::tid(),
        device,
        name: name.to_string(),
        result,
    });
}

/// Called by the `_exit`/`_Exit` hooks: the same flush, run by the writer thread while the
/// exiting thread waits (bounded, and async-signal-safe: no allocation, no lock), only in the
/// process that owns the writer (never in a vfork child), and not at all with
/// `VRAMSHIM_TRACE_EXIT_FLUSH=0`.
pub(crate) fn on_quick_exit() {
    if config_var("VRAMSHIM_TRACE_EXIT_FLUSH").is_some_and(|v| v.trim() == "0") {
        return;
    }
    writer::finish_before_exit();
}

/// Tracing is on and this process's writer already runs (so a record costs no new file).
pub(crate) fn running() -> bool {
    enabled() && writer::running()
}

/// Configured path pattern (`VRAMSHIM_TRACE`), if tracing is on.
fn pattern() -> Option<&'static str> {
    config_var("VRAMSHIM_TRACE").filter(|s| !s.is_empty())
}

fn config_var(name: &str) -> Option<&'static str> {
    crate::config::var(name)
}

/// Reads the configuration (once, at load: the library's constructor in `lifecycle`).
pub(crate) fn init() {
    if pattern().is_none() {
        return;
    }
    if let Some(v) = config_var("VRAMSHIM_STACKS") {
        match v.trim().parse::<u32>() {
            Ok(n) if n as usize <= stacks::MAX_FRAMES => STACK_DEPTH.store(n, Ordering::Relaxed),
            Ok(n) => {
                crate::warn!(
                    "VRAMSHIM_STACKS={v:?} asks for more frames than the {} kept; {}; keeping {}",
                    stacks::MAX_FRAMES,
                    crate::config::forms("VRAMSHIM_STACKS"),
                    stacks::MAX_FRAMES
                );
                STACK_DEPTH.store(n.min(stacks::MAX_FRAMES as u32), Ordering::Relaxed)
            }
            Err(_) => crate::warn!(
                "VRAMSHIM_STACKS={v:?} is not a number of frames; {}; stacks are off",
                crate::config::forms("VRAMSHIM_STACKS")
            ),
        }
    }
    // Switches whose other values would be ignored silently: one line each.
    for (name, ok) in [
        ("VRAMSHIM_TRACE_CLOCK", &["monotonic"][..]),
        ("VRAMSHIM_TRACE_LOCKS", &["0", "1"][..]),
        ("VRAMSHIM_TRACE_EXIT_FLUSH", &["0", "1"][..]),
        ("VRAMSHIM_PY_STACKS", &["0", "1"][..]),
    ] {
        if let Some(v) = config_var(name)
            && !v.trim().is_empty()
            && !ok.contains(&v.trim())
        {
            crate::warn!(
                "{name}={v:?} is not understood; {}; using the default",
                crate::config::forms(name)
            );
        }
    }
    clock::init();
    stacks::init();
    set_enabled(true);
}

/// Turn tracing on or off, and tell the dispatcher, which caches which layers are on.
fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
    crate::config::layers::changed();
}

/// Stop tracing for good (unusable output file, or finished).
fn disable() {
    set_enabled(false);
}

fn stack_depth() -> usize {
    STACK_DEPTH.load(Ordering::Relaxed) as usize
}

/// Test hooks: start tracing to `pattern` from inside a test binary.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// Turn tracing on with an explicit path pattern and stack depth (tests only; the library
    /// reads `VRAMSHIM_TRACE` at load).
    pub fn enable(pattern: &str, stacks: u32) {
        writer::set_pattern_override(pattern);
        clock::init();
        stacks::init();
        STACK_DEPTH.store(stacks, Ordering::Relaxed);
        set_enabled(true);
    }

    /// Keep every frame of a stack (none is skipped as libvramshim's own): for a benchmark
    /// binary that links the tracer in, where "own" would be the whole binary.
    pub fn keep_own_frames() {
        stacks::keep_own_frames();
    }

    /// [`super::emit_memop`] (the dispatcher's way: the owner's window, no `Event` built),
    /// for tests of what a thread appends that way.
    pub fn emit_memop(alloc: bool, m: &vramshim_trace::MemOp) {
        super::emit_memop(alloc, m);
    }

    /// Runs `f` with the calling thread inside its own trace buffer's window (or its lock),
    /// as a signal handler that interrupted an append there runs: `f` may raise a signal
    /// whose handler exits (`on_exit`), as a handler that calls `exit()` does.
    pub fn inside_own_slot(f: impl FnOnce()) {
        slots::inside_own_slot(f);
    }

    /// What the `_exit`/`_Exit` hooks run before the real call (the writer thread finishes
    /// the trace while the calling thread waits): for a signal handler in a test that exits
    /// that way without ending the test process.
    pub fn quick_exit() {
        super::on_quick_exit();
    }

    /// What the writer counted as lost so far.
    pub fn lost() -> u64 {
        writer::lost_total()
    }

    pub use super::tick_hook::TickPoint;

    pub use super::slots::HandOverPoint;

    /// Calls `hook` on the handing thread at the points of every hand-over of a full buffer
    /// (see [`HandOverPoint`]) until it is removed (`None`): a test raises a signal there whose
    /// handler exits, as one may interrupt a thread anywhere.
    pub fn on_hand_over(hook: Option<fn(HandOverPoint)>) {
        slots::on_hand_over(hook);
    }

    /// Calls `hook` at the points of every tick of the trace writer (see [`TickPoint`]), on
    /// the thread running the tick with the writer's lock held, until it is removed (`None`);
    /// a test holds a tick there (the hook waits) while its threads act, to hit a window
    /// between the tick's steps every time. The hook must not emit events or exit.
    pub fn on_tick(hook: Option<Box<dyn FnMut(TickPoint) + Send>>) {
        super::tick_hook::set(hook);
    }

    /// Bytes handed over to the writer and not yet written (a thread's full buffer adds 64 KiB
    /// when it is handed over).
    pub fn backlog() -> usize {
        writer::backlog()
    }

    /// Buffers in the writer's channel, counting one whose send has claimed its place and
    /// not yet filled it (the test that interrupts a send there watches this).
    pub fn queued_buffers() -> usize {
        writer::queued_buffers()
    }
}
