//! The writer thread: takes event buffers from the channel (and, every tick, from every
//! thread's slot), encodes them into records ([`slots::encode`]), compresses those into
//! frames and writes them; plus the exit path, which
//! does the same on the exiting thread and writes the end record.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use vramshim_trace::output_file::{self, Opened, Refusal, TRACE};
use vramshim_trace::{DeviceInfo, Event, RecordEncoder, TraceWriter};

use super::modules::ModuleMap;
use super::patience::Patience;
use super::slots::{self, Buf, MAX_DEV, SEND_AT};
use super::tick_hook::{self, TickPoint};

/// Buffers in flight between the application threads and the writer (64 KiB each, up to
/// 4 MiB when the writer lags); `QUEUED` bounds the bytes.
const CHANNEL_BUFFERS: usize = 1024;
/// Above this backlog the writer compresses with a fast level (-1 instead of `LEVEL`).
const FAST_ABOVE: usize = 2 << 20;
/// Recycled buffers kept for the application threads.
const SPARE_BUFFERS: usize = CHANNEL_BUFFERS;
/// The writer takes partial buffers and writes a frame this often (half the 100 ms promise).
const TICK: Duration = Duration::from_millis(50);
/// Check for exited threads every this many ticks.
const REAP_EVERY: u32 = 20;
/// The exit drain's waits for threads inside their slots, all threads together: at most this
/// many beyond each slot's first few ([`Patience`]), and no longer than `EXIT_WAIT_NS` (an
/// owner in its window leaves within microseconds unless it is stopped or preempted).
const EXIT_WAITS: u32 = 1 << 20;
const EXIT_WAIT_NS: u64 = 100_000_000;
/// A tick's waits, all threads together (a slot it skips waits for the next tick).
const TICK_WAITS: u32 = 1 << 12;
/// zstd level (single-threaded) of frames of 1 KiB and more (smaller ones take -1 or are
/// stored: `TraceWriter`). Measured per event in large frames (`trace/examples/frame_cost.rs`
/// under callgrind): level 1 costs 8% fewer instructions than 3 on allocation/free records for
/// 1% more bytes (and cost 21% fewer on PyTorch allocator events while zstd compressed them;
/// since format v4 their `TorchRun` payloads are stored as coded, not compressed).
const LEVEL: i32 = 1;

/// The writer's life, held in `STATE` as `u8`: idle until the first event starts it,
/// closing while the exit path takes the last buffers, done once the trace is finished (or
/// could not start); a forked child begins idle again.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    Idle,
    Starting,
    Running,
    /// The exit path is taking the last buffers: threads append nothing more, and what they
    /// would have appended is counted in the `Lost` record that comes before the end record
    /// ([`refused`]).
    Closing,
    Done,
}
use Life::{Closing, Done, Idle, Running, Starting};

static STATE: AtomicU8 = AtomicU8::new(Idle as u8);

#[inline]
fn life_is(l: Life) -> bool {
    STATE.load(Ordering::Acquire) == l as u8
}
static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
static LOST: AtomicU64 = AtomicU64::new(0);
/// Bytes handed to the writer and not yet written (back-pressure signal).
static QUEUED: AtomicUsize = AtomicUsize::new(0);
static FORKED: AtomicBool = AtomicBool::new(false);
/// Pid of the process whose writer this is (a vfork child shares our memory, not our pid).
static OWNER: AtomicU32 = AtomicU32::new(0);
static PATTERN_OVERRIDE: AtomicPtr<String> = AtomicPtr::new(std::ptr::null_mut());

struct Chunk {
    raw: Buf,
    /// Its slot and hand-over, marked written once it is ([`slots::Handed`]).
    from: slots::Handed,
}

/// Bytes a buffer of `n` entries holds (the backlog's unit).
fn raw_bytes(n: usize) -> usize {
    n * std::mem::size_of::<slots::Raw>()
}

/// Leaked once per process (a forked child leaks its parent's and makes its own).
struct Shared {
    tx: Sender<Chunk>,
    rx: Receiver<Chunk>,
    spare_tx: Sender<Buf>,
    spare_rx: Receiver<Buf>,
    out: Mutex<Option<Out>>,
    /// The writer thread, unparked by [`send`] when it hands over a full buffer.
    writer: OnceLock<std::thread::Thread>,
}

struct Out {
    w: TraceWriter<File>,
    path: String,
    /// Set by the first failed write: why, and where the trace was cut back to. From then
    /// on events are counted in `LOST`, not written.
    failed: Option<(std::io::Error, u64)>,
    wenc: RecordEncoder,
    /// Encodes the application threads' buffers.
    renc: RecordEncoder,
    events: Vec<Event>,
    modules: ModuleMap,
    /// Last (live, reserved, cap) written per device.
    counters: [(u64, u64, u64); MAX_DEV],
    /// The pool statistics last written per device (a `PoolStats` record when they change).
    pool_stats: [[u64; 6]; MAX_DEV],
    /// Device sizes, for resolving fractional caps (0 = unknown).
    dev_totals: [u64; MAX_DEV],
    lost_written: u64,
    devices_known: bool,
    ticks: u32,
    /// The last tick's drain found the barrier failing (the next one tries it alone first:
    /// [`slots::drain_all`]'s `probe`).
    barrier_failed: bool,
    pid: u32,
    finished: bool,
    /// Compressing at the fast level (backlog above `FAST_ABOVE`).
    fast: bool,
}

fn shared() -> Option<&'static Shared> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: a published Shared is leaked and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

pub(crate) fn set_pattern_override(p: &str) {
    let b = Box::into_raw(Box::new(p.to_string()));
    PATTERN_OVERRIDE.store(b, Ordering::Release);
}

fn pattern() -> Option<String> {
    let p = PATTERN_OVERRIDE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaked by set_pattern_override, never freed.
        return Some(unsafe { &*p }.clone());
    }
    super::pattern().map(str::to_string)
}

pub(crate) fn lost_total() -> u64 {
    LOST.load(Ordering::Relaxed)
}

pub(crate) fn count_lost(n: u64) {
    LOST.fetch_add(n, Ordering::Relaxed);
}

/// An application thread did not append `events` events because the writer no longer takes
/// any (its check inside the slot, [`running`], said so). While the exit path is taking the
/// last buffers they are counted lost (the `Lost` record before the end record says so);
/// once the trace is finished they come after its end, like events after `disable`.
#[cold]
pub(crate) fn refused(events: u64) {
    if life_is(Closing) {
        count_lost(events);
    }
}

/// The exit path, before it takes the last buffers: from now on threads append nothing
/// (they check [`running`] inside their slot, which the drain's claim and barrier order after
/// this store), so nothing is appended after the drain and left unwritten and uncounted.
/// SeqCst: a thread linking a new slot checks after linking, and the drain lists the slots
/// after this store, so either the drain finds the slot or the thread sees the close.
fn close() {
    let _ = STATE.compare_exchange(
        Running as u8,
        Closing as u8,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
}

/// True when no record was ever made (the writer was never asked to start).
pub(crate) fn never_started() -> bool {
    life_is(Idle)
}

/// True when the writer runs (starting it on the first call).
#[inline]
pub(crate) fn ensure_started() -> bool {
    life_is(Running) || start_slow()
}

#[cold]
#[inline(never)]
fn start_slow() -> bool {
    loop {
        match STATE.compare_exchange(
            Idle as u8,
            Starting as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                let ok = start();
                STATE.store(if ok { Running } else { Done } as u8, Ordering::Release);
                if !ok {
                    super::disable();
                }
                return ok;
            }
            Err(s) if s == Starting as u8 => std::thread::yield_now(),
            Err(s) => return s == Running as u8,
        }
    }
}

/// Opens the file (on the calling thread, so a bad path is reported at once) and starts the
/// writer thread, which writes the header and then frames.
fn start() -> bool {
    let Some(pat) = pattern() else {
        return false;
    };
    let mono = crate::sys::clock::now_ns();
    let wall = crate::sys::clock::wall_ns();
    let pid = crate::sys::ids::pid();
    let path = super::header::expand(&pat, pid, wall, FORKED.load(Ordering::Relaxed));
    let Some((file, path)) = open_trace(path, pid) else {
        return false;
    };
    crate::info!("trace: writing {path}");
    // Header, module map and devices are written here, once, before the first frame.
    let header = super::header::build(wall, mono);
    // Devices in the header still get `Device` records at a flush: only those carry the
    // UUID (the header's device list has no field for it).
    let devices_known = false;
    let mut dev_totals = [0u64; MAX_DEV];
    for d in &header.devices {
        if let Some(t) = dev_totals.get_mut(d.index as usize) {
            *t = d.total_bytes;
        }
    }
    let w = match TraceWriter::with_level(file, &header, LEVEL) {
        Ok(w) => w,
        Err(e) => {
            crate::warn!("VRAMSHIM_TRACE: cannot write {path:?}: {e}; tracing is off");
            return false;
        }
    };
    let mut out = Out {
        w,
        path,
        failed: None,
        wenc: RecordEncoder::with_capacity(4096),
        renc: RecordEncoder::with_capacity(SEND_AT * 16),
        events: Vec::new(),
        modules: ModuleMap::default(),
        counters: [(0, 0, 0); MAX_DEV],
        pool_stats: [[0; 6]; MAX_DEV],
        dev_totals,
        lost_written: 0,
        devices_known,
        ticks: 0,
        barrier_failed: false,
        pid,
        finished: false,
        fast: false,
    };
    out.modules.scan(&mut out.events, true);
    super::barrier::init();
    let (tx, rx) = bounded(CHANNEL_BUFFERS);
    let (spare_tx, spare_rx) = bounded(SPARE_BUFFERS);
    let sh: &'static Shared = Box::leak(Box::new(Shared {
        tx,
        rx,
        spare_tx,
        spare_rx,
        out: Mutex::new(Some(out)),
        writer: OnceLock::new(),
    }));
    OWNER.store(pid, Ordering::Relaxed);
    SHARED.store(sh as *const Shared as *mut Shared, Ordering::Release);
    match std::thread::Builder::new()
        .name("vramshim-trace".into())
        .spawn(move || writer_main(sh))
    {
        Ok(_) => true,
        Err(e) => {
            crate::warn!("VRAMSHIM_TRACE: cannot start the writer thread: {e}; tracing is off");
            SHARED.store(std::ptr::null_mut(), Ordering::Release);
            false
        }
    }
}

/// Opens the trace file at `path` (or `path.<pid>` when `path` is the trace of a running
/// process) under the rules of [`output_file`]: nothing planted at the path is followed,
/// blocked on or overwritten, and only an earlier trace of ours is replaced. Anything else
/// gets one line and tracing stays off; the program runs on untouched.
fn open_trace(mut path: String, pid: u32) -> Option<(File, String)> {
    if fault_unsafe_open() {
        return open_trace_unsafely(path, pid);
    }
    let mut opened = output_file::open(Path::new(&path), TRACE);
    if let Ok(Opened::Existing(f)) = &opened
        && let Some(other) = live_writer(f, pid)
    {
        // Several processes with one pattern and no %p (ranks, exec'd children): never
        // truncate the trace of a process that is still running.
        crate::warn!(
            "VRAMSHIM_TRACE: {path:?} belongs to running process {other}; writing {path}.{pid}"
        );
        path = format!("{path}.{pid}");
        opened = output_file::open(Path::new(&path), TRACE);
    }
    match opened.and_then(|o| o.truncate().map_err(Refusal::from)) {
        Ok(f) => Some((f, path)),
        Err(why) => {
            crate::warn!(
                "VRAMSHIM_TRACE: {path:?} {why}; tracing is off (the program runs untraced)"
            );
            None
        }
    }
}

/// The pid in the header of the existing trace `f`, if that process is alive and not us.
fn live_writer(f: &File, me: u32) -> Option<u32> {
    let r = vramshim_trace::TraceReader::from_reader(f).ok()?;
    let pid = r.header().pid;
    (pid != me && pid != 0 && Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}

/// Fault switch (`VRAMSHIM_TRACE_FAULT=unsafe-open`): the trace path opened the naive way
/// (read by path to find a live writer, then create-and-truncate, following symlinks and
/// blocking on FIFOs), to show that the hostile-path tests catch it.
fn fault_unsafe_open() -> bool {
    crate::config::switch_on("VRAMSHIM_TRACE_FAULT", "unsafe-open")
}

fn open_trace_unsafely(mut path: String, pid: u32) -> Option<(File, String)> {
    if let Ok(r) = vramshim_trace::TraceReader::open(&path) {
        let other = r.header().pid;
        if other != pid && other != 0 && Path::new(&format!("/proc/{other}")).exists() {
            path = format!("{path}.{pid}");
        }
    }
    match File::create(&path) {
        Ok(f) => Some((f, path)),
        Err(e) => {
            crate::warn!("VRAMSHIM_TRACE: cannot create {path:?}: {e}; tracing is off");
            None
        }
    }
}

fn lock(sh: &'static Shared) -> MutexGuard<'static, Option<Out>> {
    sh.out.lock().unwrap_or_else(|p| p.into_inner())
}

fn block_signals() {
    // SAFETY: a zeroed sigset filled by sigfillset; pthread_sigmask on the current thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// The drain period: `TICK`, or an hour under `VRAMSHIM_TRACE_FAULT=no-tick` (the periodic
/// drain switched off, to show that the SIGKILL test catches a writer that does not drain),
/// or `VRAMSHIM_TRACE_TICK_MS` milliseconds: a benchmark switch, so that a run slowed down
/// by an instruction counter (valgrind: 50-100x) ticks as often per unit of its work as a
/// native run does (a SIGKILL then loses up to two such periods).
fn tick_period() -> Duration {
    if crate::config::switch_on("VRAMSHIM_TRACE_FAULT", "no-tick") {
        return Duration::from_secs(3600);
    }
    match crate::config::var("VRAMSHIM_TRACE_TICK_MS") {
        None => TICK,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(ms @ 1..=TICK_MS_MAX) => Duration::from_millis(ms),
            _ => {
                crate::warn!(
                    "VRAMSHIM_TRACE_TICK_MS={v:?} is not a whole number of milliseconds from 1 to {TICK_MS_MAX}; the trace writer drains every {} ms",
                    TICK.as_millis()
                );
                TICK
            }
        },
    }
}

/// Longest drain period `VRAMSHIM_TRACE_TICK_MS` may set (a minute).
const TICK_MS_MAX: u64 = 60_000;

fn writer_main(sh: &'static Shared) {
    // Process-directed signals must go to the application's threads, not to us.
    block_signals();
    WRITER_TID.store(crate::sys::ids::tid(), Ordering::Release);
    let _gone = WriterGone;
    // Senders before this point find no thread to unpark: the next tick takes their buffers.
    let _ = sh.writer.set(std::thread::current());
    let period = tick_period();
    let hold = fault_hold();
    let mut next = Instant::now() + period;
    loop {
        if EXIT_ASK.load(Ordering::Acquire) == ASK_WAITING {
            serve_exit(sh);
            return;
        }
        let now = Instant::now();
        if now >= next {
            if !tick(sh, false) {
                return;
            }
            next = Instant::now() + period;
            continue;
        }
        // Wait for a buffer without taking it, and take it only under the lock: a buffer in
        // this thread's hands while the exit path holds the lock and finishes the trace
        // would be lost without a trace (seen: one buffer of 10M events).
        if hold {
            // The loop as it was: a buffer taken, then the lock awaited.
            if let Ok(c) = sh.rx.recv_timeout(next - now) {
                std::thread::sleep(Duration::from_millis(200));
                let mut g = lock(sh);
                let Some(out) = g.as_mut() else { return };
                if out.finished {
                    return;
                }
                write_chunk(sh, out, c);
            }
            continue;
        }
        // `send` unparks this thread after queueing a buffer (an unpark that comes before
        // the park makes it return at once), so parking until the tick misses nothing, and
        // costs a few hundred instructions where a channel wait (`Select`, registering and
        // unregistering a waker) costs ~2 k, on every tick.
        if sh.rx.is_empty() {
            std::thread::park_timeout(next - now);
        }
        if !sh.rx.is_empty() {
            let mut g = lock(sh);
            let Some(out) = g.as_mut() else { return };
            if out.finished {
                return;
            }
            // Take whatever is queued while we hold the lock.
            while let Ok(c) = sh.rx.try_recv() {
                write_chunk(sh, out, c);
            }
        }
    }
}

/// Order faults (`VRAMSHIM_TRACE_FAULT`), read once per writer: each restores a tick's steps
/// as they were before a fix, to show that the tests holding a tick in that window
/// (`tests/workloads/trace/tests/tick_window_*.rs`) catch the wrong order.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum OrderFault {
    None = 1,
    /// `partials-first`: the partial buffers are written before the buffers their threads
    /// handed over while the tick took them (those wait in the queue: after the thread's later
    /// events, or never at exit).
    PartialsFirst,
    /// `late-reap`: exited threads are looked for after their buffers were taken, so a thread
    /// that appends and exits in between gets its `ThreadExit` record before its last events.
    LateReap,
    /// `late-close`: the exit path lets threads append until after the end record (they are
    /// stopped only then), so what they append after its drain is neither written nor
    /// counted.
    LateClose,
    /// `tid-only`: a slot's thread is looked for by its tid alone, so a thread whose tid a new
    /// thread got gets its `ThreadExit` record only once that thread exits too (two records
    /// for one tid then).
    TidOnly,
    /// `own-wait`: the exit path's drain waits for the exiting thread's own slot like any
    /// other's (in vain when a signal handler that exits interrupted the thread inside it:
    /// the exit drain's whole patience), and the slots it gives up on are dropped uncounted.
    OwnWait,
    /// `nested-exit-waits`: an exit run by a signal handler that interrupted the same thread's
    /// exit path waits for the writer's lock, which that exit path holds: it hangs.
    NestedExitWaits,
}

static ORDER_FAULT: AtomicU8 = AtomicU8::new(0);

fn order_fault() -> OrderFault {
    match ORDER_FAULT.load(Ordering::Relaxed) {
        0 => {
            use crate::config::switch_on;
            // One at a time: the first named, in this order.
            let f = if switch_on("VRAMSHIM_TRACE_FAULT", "partials-first") {
                OrderFault::PartialsFirst
            } else if switch_on("VRAMSHIM_TRACE_FAULT", "late-reap") {
                OrderFault::LateReap
            } else if switch_on("VRAMSHIM_TRACE_FAULT", "late-close") {
                OrderFault::LateClose
            } else if switch_on("VRAMSHIM_TRACE_FAULT", "tid-only") {
                OrderFault::TidOnly
            } else if switch_on("VRAMSHIM_TRACE_FAULT", "own-wait") {
                OrderFault::OwnWait
            } else if switch_on("VRAMSHIM_TRACE_FAULT", "nested-exit-waits") {
                OrderFault::NestedExitWaits
            } else {
                OrderFault::None
            };
            ORDER_FAULT.store(f as u8, Ordering::Relaxed);
            f
        }
        2 => OrderFault::PartialsFirst,
        3 => OrderFault::LateReap,
        4 => OrderFault::LateClose,
        5 => OrderFault::TidOnly,
        6 => OrderFault::OwnWait,
        7 => OrderFault::NestedExitWaits,
        _ => OrderFault::None,
    }
}

/// Fault switch (`VRAMSHIM_TRACE_WRITER_FAULT=hold`): the writer thread takes a buffer off
/// the channel before it has the lock, and holds it 200 ms (proves the exit-race test can
/// fail).
fn fault_hold() -> bool {
    crate::config::switch_on("VRAMSHIM_TRACE_WRITER_FAULT", "hold")
}

fn write_chunk(sh: &Shared, out: &mut Out, mut c: Chunk) {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    // Under back-pressure, trade ratio for speed (the level applies from the next frame).
    let fast = QUEUED.load(Ordering::Relaxed) > FAST_ABOVE;
    if fast != out.fast {
        out.fast = fast;
        let _ = out.w.set_level(if fast { -1 } else { LEVEL });
    }
    write_raw(out, &mut c.raw);
    c.from.written();
    QUEUED.fetch_sub(raw_bytes(c.raw.len()), Ordering::Relaxed);
    recycle_into(sh, c.raw);
}

/// Encode a thread's buffer and add its records to the frame (after a failed write: count
/// its events as lost).
fn write_raw(out: &mut Out, raw: &mut Buf) {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    if out.failed.is_some() {
        count_lost(raw.events());
        return;
    }
    slots::encode(&mut out.renc, raw);
    if let Err(e) = out.w.write_encoded(&out.renc) {
        write_failed(out, e);
    }
}

/// Bytes queued for the writer.
pub(crate) fn backlog() -> usize {
    QUEUED.load(Ordering::Relaxed)
}

/// A write failed (disk full, quota, I/O error): cut the file back to its last whole frame
/// (a torn frame would hide what comes after it), count the records of the frame that did
/// not make it as lost, and from now on count events instead of writing them. At exit the
/// count goes into the trace as a `Lost` record when the disk takes it ([`finish_failed`]).
fn write_failed(out: &mut Out, e: std::io::Error) {
    if out.finished || out.failed.is_some() {
        return;
    }
    let good = out.w.stats().file_bytes;
    let lost = out.w.discard_open_frame();
    count_lost(lost);
    out.events.clear();
    let f = out.w.get_mut();
    let cut = f.set_len(good).and_then(|_| f.seek(SeekFrom::Start(good)));
    let cut = match cut {
        Ok(_) => format!("the trace is cut back to its last whole frame ({good} bytes)"),
        Err(c) => format!("the trace could not be cut back to its last whole frame ({c})"),
    };
    crate::warn!(
        "VRAMSHIM_TRACE: writing {:?} failed: {e}; {lost} records lost so far, {cut}; events from now on are counted, not written",
        out.path
    );
    out.failed = Some((e, good));
}

/// Exit after a failed write: try to add the `Lost` count and the end record (space may have
/// come back, and cutting the torn frame freed some); say on stderr what was lost either way.
fn finish_failed(out: &mut Out, now: u64) -> bool {
    let lost = LOST.load(Ordering::Relaxed);
    let (why, good) = match &out.failed {
        Some((e, good)) => (e.to_string(), *good),
        None => return false,
    };
    let mut enc = RecordEncoder::with_capacity(64);
    enc.begin(0);
    enc.push(&Event::Lost {
        t_ns: now,
        count: lost - out.lost_written.min(lost),
    });
    let written = out
        .w
        .write_records(enc.bytes(), enc.stats())
        .and_then(|_| out.w.finish_in_place(now))
        .is_ok();
    if !written {
        out.w.discard_open_frame();
        let f = out.w.get_mut();
        let _ = f.set_len(good);
    }
    crate::warn!(
        "VRAMSHIM_TRACE: {:?}: {lost} events were not written (write failed: {why}); {}",
        out.path,
        if written {
            "the trace ends with a Lost record that says so"
        } else {
            "the trace is cut off (no end record): analyses of it say so"
        }
    );
    out.finished = true;
    written
}

/// One flush cycle. Returns false once the trace is finished.
fn tick(sh: &'static Shared, at_exit: bool) -> bool {
    let mut g = lock(sh);
    tick_locked(sh, &mut g, at_exit, slots::own_slot())
}

/// One flush cycle with the writer's lock held. `exiting`: the slot of the thread that is
/// exiting (its own when it runs this; the asking thread's when the writer finishes the trace
/// for an `_exit`), given up at once when that thread is inside it.
fn tick_locked(
    sh: &'static Shared,
    g: &mut MutexGuard<'static, Option<Out>>,
    at_exit: bool,
    exiting: slots::SlotRef,
) -> bool {
    let Some(out) = g.as_mut() else {
        return false;
    };
    if out.finished {
        return false;
    }
    while let Ok(c) = sh.rx.try_recv() {
        write_chunk(sh, out, c);
    }
    tick_hook::at(TickPoint::BeforeDrain { at_exit });
    // At exit the waits for threads inside their slots are bounded in all, not per thread:
    // the library must never be why a job hangs (a tick's skipped slots wait for the next).
    let patience = if at_exit {
        Patience::new(EXIT_WAITS, Some(EXIT_WAIT_NS))
    } else {
        Patience::new(TICK_WAITS, None)
    };
    let fault = order_fault();
    if at_exit && fault != OrderFault::LateClose {
        close();
    }
    let reaps = !at_exit && out.ticks.wrapping_add(1) % REAP_EVERY == 0;
    // Threads gone before their buffers are taken (their last events are in what is taken
    // now, so their `ThreadExit` records, written below, come after them).
    let by_tid = fault == OrderFault::TidOnly;
    let mut dead = if reaps && fault != OrderFault::LateReap {
        slots::dead_threads(out.pid, by_tid)
    } else {
        Vec::new()
    };
    // Handed over since the queue was emptied above and before the partial buffers were
    // taken: those threads' earlier events, written before the partial buffers. Only taken
    // off the queue while the slots are held (owners wait meanwhile), written after.
    let mut older = Vec::new();
    let probe = !at_exit && out.barrier_failed;
    let drained = slots::drain_all(
        |b| match b {
            None if fault == OrderFault::PartialsFirst => {}
            None => older.extend(sh.rx.try_iter()),
            Some(mut raw) => {
                for c in older.drain(..) {
                    write_chunk(sh, out, c);
                }
                write_raw(out, &mut raw);
                recycle_into(sh, raw);
            }
        },
        patience,
        fault == OrderFault::OwnWait,
        probe,
        exiting,
    );
    PROGRESS.fetch_add(1, Ordering::Relaxed);
    for c in older {
        write_chunk(sh, out, c);
    }
    // At exit nothing takes the buffers given up on later: their events are lost, and the
    // `Lost` record below says how many (at a tick they wait for the next one). Counted once
    // every buffer handed over before is written.
    if at_exit && fault != OrderFault::OwnWait {
        count_lost(slots::unaccounted(&drained.given_up));
    }
    let drained = drained.taken;
    out.barrier_failed = !drained;
    tick_hook::at(TickPoint::AfterDrain { at_exit });
    super::clock::recalibrate();
    let now = super::clock::now_ns();
    out.ticks = out.ticks.wrapping_add(1);
    if reaps {
        tick_hook::at(TickPoint::BeforeReap);
        if fault == OrderFault::LateReap {
            dead = slots::dead_threads(out.pid, by_tid);
        }
        if drained || fault == OrderFault::LateReap {
            let events = &mut out.events;
            slots::free_dead(&dead, |tid| {
                events.push(Event::ThreadExit { t_ns: now, tid });
            });
        }
    }
    out.modules.scan(&mut out.events, false);
    if !out.devices_known && (out.ticks % 4 == 0 || at_exit) {
        let devs: Vec<DeviceInfo> = super::header::devices();
        if !devs.is_empty() {
            out.devices_known = true;
            for d in &devs {
                if let Some(t) = out.dev_totals.get_mut(d.index as usize) {
                    *t = d.total_bytes;
                }
            }
            out.events.extend(devs.into_iter().map(Event::Device));
        }
    }
    let totals = slots::live_totals();
    for (d, &v) in totals.iter().enumerate() {
        let live = v.max(0) as u64;
        // Reserved: what vramshim's pool holds from the device, when it serves this device;
        // otherwise the process's live bytes are what the device holds for it.
        let view = super::device_view();
        let pool = (view.pool_reserved)(d as i32);
        // Only devices that exist: a cap applies to every ordinal, but a device shows up in
        // the trace when the driver described it or the process used it.
        if live == 0 && out.dev_totals.get(d).is_none_or(|&t| t == 0) && pool.is_none() {
            continue;
        }
        let reserved = pool.unwrap_or(live);
        let cap = (view.cap)(d as i32, out.dev_totals[d]);
        // the pool's own figures (why it holds what it holds), when they changed
        if let Some(v) = (view.pool_stats)(d as i32)
            && v != out.pool_stats[d]
        {
            out.pool_stats[d] = v;
            out.events.push(Event::PoolStats {
                t_ns: now,
                device: d as i32,
                reserved: v[0],
                live: v[1],
                cached: v[2],
                pending: v[3],
                budget: v[4],
                releases: v[5],
            });
        }
        let c = (live, reserved, cap);
        if c != out.counters[d] {
            out.counters[d] = c;
            out.events.push(Event::Counter {
                t_ns: now,
                device: d as i32,
                live_bytes: live,
                reserved_bytes: reserved,
                cap,
            });
        }
    }
    if out.failed.is_some() {
        out.events.clear();
        if at_exit {
            return finish_failed(out, now);
        }
        return true;
    }
    let lost = LOST.load(Ordering::Relaxed);
    if lost > out.lost_written {
        out.events.push(Event::Lost {
            t_ns: now,
            count: lost - out.lost_written,
        });
        out.lost_written = lost;
    }
    if !out.events.is_empty() {
        out.wenc.begin(0);
        for e in out.events.drain(..) {
            out.wenc.push(&e);
        }
        let stats = out.wenc.stats();
        if let Err(e) = out.w.write_records(out.wenc.bytes(), stats) {
            write_failed(out, e);
        }
    }
    if at_exit {
        if out.failed.is_some() {
            return finish_failed(out, now);
        }
        if let Err(e) = out.w.finish_in_place(super::clock::now_ns()) {
            write_failed(out, e);
            return finish_failed(out, now);
        }
        out.finished = true;
        return true;
    }
    if let Err(e) = out.w.flush_frame() {
        write_failed(out, e);
    }
    !out.finished
}

fn recycle_into(sh: &Shared, mut v: Buf) {
    if v.capacity() >= SEND_AT && v.capacity() <= 4 * SEND_AT {
        v.clear();
        let _ = sh.spare_tx.try_send(v);
    }
}

/// A cleared buffer for the writer's own use (the drain; recycled when possible).
pub(crate) fn spare_buffer() -> Buf {
    match shared() {
        Some(sh) => spare_of(sh),
        None => new_buffer(),
    }
}

fn spare_of(sh: &Shared) -> Buf {
    sh.spare_rx.try_recv().unwrap_or_else(|_| new_buffer())
}

fn new_buffer() -> Buf {
    Buf::with_capacity(SEND_AT + (SEND_AT >> 2))
}

/// Hands a full buffer (`from` a slot) to the writer without blocking, and takes a cleared
/// buffer for the slot in its place: `Ok(that buffer)`, or `Err(the full one back)` when the
/// channel is full.
///
/// The asynchronous signals are blocked on the calling thread across the two channel
/// operations. Each
/// claims a place in its channel, then fills it (or empties it) and marks it done; a thread
/// that never got from the claim to the mark would leave a place that every later receiver
/// (or sender, a lap later) of that channel spins on for ever. A signal handler that exits
/// from inside the send did that: the exit path, and the writer thread holding the lock it
/// waits for, hung on the half-written place. Blocked, a signal that comes meanwhile is
/// handled once both operations are done (two system calls per buffer of about a thousand
/// events). Under the fault switch `VRAMSHIM_TRACE_FAULT=send-unmasked` they are not
/// blocked.
pub(crate) fn send(raw: Buf, from: slots::Handed) -> Result<Buf, Buf> {
    let Some(sh) = shared() else {
        return Err(raw);
    };
    let n = raw_bytes(raw.len());
    QUEUED.fetch_add(n, Ordering::Relaxed);
    let masked = (!fault_send_unmasked()).then(crate::sys::life::BlockSignals::asynchronous);
    slots::hand_over_at(slots::HandOverPoint::Sending);
    match sh.tx.try_send(Chunk { raw, from }) {
        Ok(()) => {
            let spare = spare_of(sh);
            drop(masked);
            if let Some(t) = sh.writer.get() {
                t.unpark();
            }
            Ok(spare)
        }
        Err(TrySendError::Full(c)) | Err(TrySendError::Disconnected(c)) => {
            drop(masked);
            QUEUED.fetch_sub(n, Ordering::Relaxed);
            Err(c.raw)
        }
    }
}

/// Fault switch (`VRAMSHIM_TRACE_FAULT=send-unmasked`): [`send`] leaves signals unblocked, to
/// show that `tests/workloads/trace/tests/tick_window_exit_in_send.rs` (a handler that exits
/// from inside the channel's send) catches the hang. Read once: every hand-over asks.
fn fault_send_unmasked() -> bool {
    static UNMASKED: AtomicU8 = AtomicU8::new(0);
    match UNMASKED.load(Ordering::Relaxed) {
        0 => {
            let on = crate::config::switch_on("VRAMSHIM_TRACE_FAULT", "send-unmasked");
            UNMASKED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        v => v == 2,
    }
}

/// Buffers queued for the writer (tests: see `tracer::testing::queued_buffers`).
pub(crate) fn queued_buffers() -> usize {
    shared().map_or(0, |sh| sh.tx.len())
}

/// The thread running the exit path (its kernel tid; 0: none).
static EXITING: AtomicU32 = AtomicU32::new(0);

/// The calling thread runs the exit path until this is dropped.
struct ExitMark {
    mine: bool,
}

/// Marks the calling thread as running the exit path; `None` when it already is: a signal
/// handler that exits interrupted its own exit path, which may hold the writer's lock, so
/// waiting for the lock would wait for itself for ever (the library must never hang a job).
/// The trace is then left without its end record, as a crash leaves it. Another thread's
/// exit path is waited for as before (it finishes the trace). Under the fault switch
/// `nested-exit-waits` the thread waits anyway (and hangs).
fn enter_exit() -> Option<ExitMark> {
    let me = crate::sys::ids::tid();
    if EXITING.load(Ordering::Acquire) == me && order_fault() != OrderFault::NestedExitWaits {
        return None;
    }
    let mine = EXITING
        .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    Some(ExitMark { mine })
}

impl Drop for ExitMark {
    fn drop(&mut self) {
        if self.mine {
            EXITING.store(0, Ordering::Release);
        }
    }
}

/// Exit path, on the exiting thread: drain everything, write the end record, stop tracing.
pub(crate) fn finish() {
    if !life_is(Running) {
        return;
    }
    let Some(sh) = shared() else { return };
    let Some(_exiting) = enter_exit() else { return };
    tick(sh, true);
    super::disable();
    STATE.store(Done as u8, Ordering::Release);
}

/// The writer runs in this process and takes events. Checked by an appending thread inside
/// its slot (see [`close`]).
#[inline]
pub(crate) fn running() -> bool {
    life_is(Running)
}

/// [`running`], ordered with the slot registry's list (see [`close`]).
pub(crate) fn running_seqcst() -> bool {
    STATE.load(Ordering::SeqCst) == Running as u8
}

/// The `_exit` hand-off ([`finish_before_exit`] asks, the writer thread serves): nothing
/// asked, asked, served with the end record written, served without it.
static EXIT_ASK: AtomicU8 = AtomicU8::new(ASK_NONE);
const ASK_NONE: u8 = 0;
const ASK_WAITING: u8 = 1;
const ASK_ENDED: u8 = 2;
const ASK_NOT_ENDED: u8 = 3;
/// The slot of the thread that asked (see [`tick_locked`]'s `exiting`).
static EXIT_ASKER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());
/// Counts the writer's steps (a buffer written, a drain done, an ask taken up): an `_exit`
/// waiting for the writer gives up once this stops moving for `EXIT_STALL_NS`.
static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// The writer thread's kernel tid (0: not started yet).
static WRITER_TID: AtomicU32 = AtomicU32::new(0);
/// The writer thread has returned (the trace is finished, or could not go on).
static WRITER_GONE: AtomicBool = AtomicBool::new(false);
/// How long an `_exit` waits for a writer that makes no step: longer than the exit drain's
/// own bound on its waits for threads inside their slots (`EXIT_WAIT_NS`), so a drain that
/// waits is not taken for a stuck writer.
const EXIT_STALL_NS: u64 = 500_000_000;

/// Marks the writer thread gone when it returns (or unwinds).
struct WriterGone;

impl Drop for WriterGone {
    fn drop(&mut self) {
        WRITER_GONE.store(true, Ordering::Release);
    }
}

/// On the writer thread: finish the trace for the thread that asked in
/// [`finish_before_exit`], then say how it went.
fn serve_exit(sh: &'static Shared) {
    let exiting = slots::SlotRef::from_raw(EXIT_ASKER.load(Ordering::Acquire));
    let ended = {
        let mut g = lock(sh);
        PROGRESS.fetch_add(1, Ordering::Relaxed);
        tick_locked(sh, &mut g, true, exiting)
    };
    super::disable();
    STATE.store(Done as u8, Ordering::Release);
    let said = if ended { ASK_ENDED } else { ASK_NOT_ENDED };
    EXIT_ASK.store(said, Ordering::Release);
}

/// `_exit` path: what [`finish`] does, but async-signal-safe on the calling thread, for
/// `_exit` is (a signal handler may call it having interrupted `malloc` or `free` on this
/// thread, with the allocator's lock held: a flush here, which allocates, would wait for that
/// lock for ever). So this thread only asks the writer thread to finish the trace (atomics
/// and a futex wake) and sleeps until it has, giving up when the writer makes no step for
/// `EXIT_STALL_NS` (it may itself wait for a lock the interrupted code holds): the trace then
/// ends at the writer's last flush, without its end record. Never in a process that does not
/// own the writer (a vfork child). True when the end record was written.
///
/// On the writer thread itself (whose signals are blocked), and under the fault switch
/// `VRAMSHIM_TRACE_FAULT=exit-inline`, the calling thread flushes as before the hand-off,
/// waiting at most 200 ms for the writer's lock (and, under the fault, hanging when a handler
/// interrupted the allocator).
pub(crate) fn finish_before_exit() -> bool {
    if !life_is(Running) || OWNER.load(Ordering::Relaxed) != crate::sys::ids::pid() {
        return false;
    }
    let Some(sh) = shared() else { return false };
    let Some(_exiting) = enter_exit() else {
        return false;
    };
    let me = crate::sys::ids::tid();
    if WRITER_TID.load(Ordering::Acquire) == me
        || crate::config::switch_on("VRAMSHIM_TRACE_FAULT", "exit-inline")
    {
        return finish_here(sh);
    }
    if WRITER_GONE.load(Ordering::Acquire) {
        return false;
    }
    // A second thread's `_exit` meanwhile waits for the first one's answer (the first one's
    // slot is the one the drain gives up at once).
    let _ = EXIT_ASKER.compare_exchange(
        std::ptr::null_mut(),
        slots::own_slot().into_raw(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    let _ = EXIT_ASK.compare_exchange(ASK_NONE, ASK_WAITING, Ordering::AcqRel, Ordering::Acquire);
    if let Some(t) = sh.writer.get() {
        t.unpark();
    }
    wait_for_the_writer()
}

/// Sleeps until the writer answers the `_exit`'s ask, or stops making steps (see
/// [`finish_before_exit`]). Plain loads, `nanosleep` and `clock_gettime`: nothing that
/// allocates or locks.
fn wait_for_the_writer() -> bool {
    let answer = || match EXIT_ASK.load(Ordering::Acquire) {
        ASK_ENDED => Some(true),
        ASK_NOT_ENDED => Some(false),
        _ => None,
    };
    let mut seen = PROGRESS.load(Ordering::Relaxed);
    let mut since = crate::sys::clock::now_ns();
    loop {
        if let Some(ended) = answer() {
            return ended;
        }
        if WRITER_GONE.load(Ordering::Acquire) {
            // Gone after answering, or before it saw the ask.
            return answer().unwrap_or(false);
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 500_000,
        };
        // SAFETY: ts is a valid timespec; the remainder pointer may be null.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        let now = crate::sys::clock::now_ns();
        let p = PROGRESS.load(Ordering::Relaxed);
        if p != seen {
            seen = p;
            since = now;
        } else if now.saturating_sub(since) > EXIT_STALL_NS {
            return false;
        }
    }
}

/// The calling thread finishes the trace itself (see [`finish_before_exit`]).
fn finish_here(sh: &'static Shared) -> bool {
    let deadline = Instant::now() + Duration::from_millis(200);
    let mut g = loop {
        match sh.out.try_lock() {
            Ok(g) => break g,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => return false,
        }
    };
    let ok = tick_locked(sh, &mut g, true, slots::own_slot());
    drop(g);
    super::disable();
    STATE.store(Done as u8, Ordering::Release);
    ok
}

/// Forked child: forget the parent's writer (its thread does not exist here, its locks may be
/// held forever). Plain stores only.
pub(crate) fn on_fork_child() {
    SHARED.store(std::ptr::null_mut(), Ordering::Relaxed);
    EXITING.store(0, Ordering::Relaxed);
    EXIT_ASK.store(ASK_NONE, Ordering::Relaxed);
    EXIT_ASKER.store(std::ptr::null_mut(), Ordering::Relaxed);
    WRITER_TID.store(0, Ordering::Relaxed);
    WRITER_GONE.store(false, Ordering::Relaxed);
    OWNER.store(0, Ordering::Relaxed);
    LOST.store(0, Ordering::Relaxed);
    QUEUED.store(0, Ordering::Relaxed);
    FORKED.store(true, Ordering::Relaxed);
    if STATE.load(Ordering::Relaxed) != Idle as u8 {
        STATE.store(Idle as u8, Ordering::Relaxed);
    }
    // Tracing stays enabled if it was configured: the child starts its own file lazily.
    if super::pattern().is_some() || !PATTERN_OVERRIDE.load(Ordering::Relaxed).is_null() {
        super::set_enabled(true);
    }
}
