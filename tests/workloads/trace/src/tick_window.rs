//! Helpers of the tests that hold the trace writer's tick in a window between two of its
//! steps (`tracer::testing::on_tick`) while a thread acts, and then check the thread's events
//! in the written trace: all of them, in the order it emitted them, and its `ThreadExit`
//! record (if any) after the last of them.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use vramshim::tracer;
use vramshim::tracer::testing::TickPoint;
use vramshim_testkit::temp_dir;
use vramshim_trace::{AllocKind, Api, Event, MemOp, TraceReader};

/// The calling thread's kernel tid.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Holds the tick the first time it reaches `at` until the returned sender is sent to: the
/// receiver hears when the tick is there (the tick runs on the writer thread or, at exit, on
/// the exiting one).
pub fn hold_once(at: TickPoint) -> (Receiver<()>, SyncSender<()>) {
    let (held_tx, held_rx) = sync_channel::<()>(0);
    let (done_tx, done_rx) = sync_channel::<()>(0);
    let mut fired = false;
    tracer::testing::on_tick(Some(Box::new(move |p| {
        if p == at && !fired {
            fired = true;
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        }
    })));
    (held_rx, done_tx)
}

/// Returns once a whole periodic tick (its drain begun after this call) has run: it took
/// every event appended before the call.
pub fn whole_tick() {
    let (taken_tx, taken_rx) = sync_channel::<()>(1);
    let mut began = false;
    tracer::testing::on_tick(Some(Box::new(move |p| match p {
        TickPoint::BeforeDrain { at_exit: false } => began = true,
        TickPoint::AfterDrain { at_exit: false } if began => {
            let _ = taken_tx.try_send(());
        }
        _ => {}
    })));
    taken_rx.recv().unwrap();
    tracer::testing::on_tick(None);
}

/// Traces to `window.vramtrace` in a fresh directory named after `name`, and emits the calling
/// thread's first ten events (`0..10`), which a whole tick then takes: (the trace, the thread's
/// tid, its next event).
pub fn ten_taken(name: &str) -> (PathBuf, u32, u64) {
    let path = temp_dir(name).join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let tid = gettid();
    for i in 0..10 {
        emit(tid, i);
    }
    whole_tick();
    (path, tid, 10)
}

/// A thread whose signal handler exits (`handler`: an exit hook, then `handled` set) having
/// interrupted it inside its own trace buffer (`tracer::testing::inside_own_slot`): its first
/// ten events are taken by a whole tick, five more stay in the buffer; the trace (written to
/// a directory named after `name`) holds the ten and counts the five lost.
pub fn exit_inside_own_slot(
    name: &str,
    handler: extern "C" fn(libc::c_int),
    handled: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let (path, tid, mut next) = ten_taken(name);
    // These stay in the thread's buffer.
    for _ in 0..5 {
        emit(tid, next);
        next += 1;
    }
    // SAFETY: installs a handler for SIGUSR1 (a plain function) in this test process.
    let old = unsafe { libc::signal(libc::SIGUSR1, handler as libc::sighandler_t) };
    assert_ne!(old, libc::SIG_ERR);
    tracer::testing::inside_own_slot(|| {
        // SAFETY: raise delivers SIGUSR1 to this thread before it returns.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    });
    assert!(handled.load(Ordering::SeqCst), "the handler did not run");
    let c = check_counted(&path, tid, next);
    assert_eq!(
        (c.events, c.lost),
        (10, 5),
        "the events a tick took are written, those left in the slot counted lost"
    );
}

/// Emits the `i`-th event of the calling thread (an allocation whose size is `i`), as the
/// hooks do.
pub fn emit(tid: u32, i: u64) {
    tracer::emit(Event::Alloc(MemOp {
        t_ns: tracer::now_raw(),
        tid,
        api: Api::CudaMalloc,
        kind: AllocKind::Runtime,
        flags: 0,
        device: 0,
        stream: 0,
        addr: 0x1000 + (i << 8),
        size: i,
        result: 0,
        latency_ns: 0,
        stack: 0,
    }));
}

/// [`emit`] the dispatcher's way (`tracer::emit_memop`: the owner's window, no `Event`
/// built), as `libvramshim.so`'s hooks emit allocations.
pub fn emit_memop(tid: u32, i: u64) {
    tracer::testing::emit_memop(
        true,
        &MemOp {
            t_ns: tracer::now_raw(),
            tid,
            api: Api::CudaMalloc,
            kind: AllocKind::Runtime,
            flags: 0,
            device: 0,
            stream: 0,
            addr: 0x1000 + (i << 8),
            size: i,
            result: 0,
            latency_ns: 0,
            stack: 0,
        },
    );
}

/// Emits events from `*next` on until the calling thread's buffer has been handed over to
/// the writer (the backlog grew: the caller holds the writer's tick, so nothing takes it off
/// the queue meanwhile), then `more` events (the thread's partial buffer).
pub fn hand_over_then(tid: u32, next: &mut u64, more: u64) {
    let before = tracer::testing::backlog();
    // A buffer holds 1024 events: far fewer than this bound.
    for _ in 0..1_000_000 {
        emit(tid, *next);
        *next += 1;
        if tracer::testing::backlog() > before {
            break;
        }
    }
    assert!(
        tracer::testing::backlog() > before,
        "no buffer was handed over after {next} events"
    );
    for _ in 0..more {
        emit(tid, *next);
        *next += 1;
    }
}

/// What [`check`] found.
pub struct Checked {
    /// Events of the thread written (all of them, in order, or [`check`] panicked).
    pub events: u64,
    /// `ThreadExit` records of the thread.
    pub exits: u64,
    /// Events the trace's `Lost` records count.
    pub lost: u64,
}

/// Reads the trace at `path`: thread `tid`'s allocations are `0..n`, each once, in order, and
/// none comes after the thread's `ThreadExit` record; nothing was lost and the trace is whole.
pub fn check(path: &Path, tid: u32, n: u64) -> Checked {
    let c = check_counted(path, tid, n);
    assert_eq!(c.lost, 0, "events were counted lost");
    c
}

/// [`check`], where some of the thread's events may have been counted lost instead of
/// written: those written are `0..k`, in order, and the trace's `Lost` records (and the
/// tracer's own count) account for the rest, `n - k`: every event is written or counted.
pub fn check_counted(path: &Path, tid: u32, n: u64) -> Checked {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    let mut next = 0u64;
    let mut exits = 0u64;
    let mut lost = 0u64;
    while r.next_into(&mut e).unwrap() {
        match &e {
            Event::Alloc(m) if m.tid == tid => {
                assert_eq!(
                    exits, 0,
                    "event {} of thread {tid} written after its ThreadExit record",
                    m.size
                );
                assert_eq!(
                    m.size, next,
                    "thread {tid}: event {} written where event {next} was due (its events \
                     out of order, or some missing)",
                    m.size
                );
                next += 1;
            }
            Event::ThreadExit { tid: t, .. } if *t == tid => exits += 1,
            Event::Lost { count, .. } => lost += count,
            _ => {}
        }
    }
    assert_eq!(r.truncation(), None);
    assert_eq!(
        tracer::testing::lost(),
        lost,
        "the tracer counted a different number lost than its Lost records say"
    );
    assert_eq!(
        next + lost,
        n,
        "thread {tid}: {next} of its {n} events written and {lost} counted lost"
    );
    Checked {
        events: next,
        exits,
        lost,
    }
}

/// Holds the exit path's tick after its drain (`tracer::testing::on_tick`) while a thread
/// emits (with `emit`) more than a buffer's worth, then checks that every event of the thread
/// is written or counted lost (the tests `tick_window_exit_late*.rs`, one per way of emitting:
/// the tracer is set up once per process).
pub fn events_after_the_exit_drain(name: &str, emit: fn(u32, u64)) {
    let dir = temp_dir(name);
    let path = dir.join("window.vramtrace");
    tracer::testing::enable(path.to_str().unwrap(), 0);
    let (started_tx, started_rx) = sync_channel::<()>(0);
    let (held_rx, done_tx) = hold_once(TickPoint::AfterDrain { at_exit: true });
    let t = std::thread::spawn(move || {
        let tid = gettid();
        let mut next = 0;
        for _ in 0..10 {
            emit(tid, next);
            next += 1;
        }
        started_tx.send(()).unwrap();
        held_rx.recv().unwrap();
        // Three buffers' worth (a buffer is handed over at 1024 entries).
        for _ in 0..3000 {
            emit(tid, next);
            next += 1;
        }
        done_tx.send(()).unwrap();
        (tid, next)
    });
    started_rx.recv().unwrap();
    // Holds its tick (on this thread) after the drain until the thread is done.
    tracer::on_exit();
    let (tid, n) = t.join().unwrap();
    tracer::testing::on_tick(None);
    let c = check_counted(&path, tid, n);
    assert_eq!(
        c.events, 10,
        "thread {tid}: the events before the exit are written"
    );
}

static EXIT_AT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
static EXITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn exit_from_handler(_sig: libc::c_int) {
    // What `exit()` called from a handler runs first (the library's exit hook).
    tracer::on_exit();
    EXITED.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn point_code(p: tracer::testing::HandOverPoint) -> u8 {
    match p {
        tracer::testing::HandOverPoint::Taken => 1,
        tracer::testing::HandOverPoint::Queued => 2,
        tracer::testing::HandOverPoint::Sending => 3,
    }
}

fn raise_at(p: tracer::testing::HandOverPoint) {
    use std::sync::atomic::Ordering;
    if EXIT_AT.load(Ordering::SeqCst) == point_code(p) {
        EXIT_AT.store(0, Ordering::SeqCst);
        // SAFETY: raise delivers SIGUSR1 (its handler installed) to this thread before it
        // returns.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
    }
}

/// Installs a SIGUSR1 handler that exits (`on_exit`, what `exit()` called from a handler
/// runs first), then emits the calling thread's events from `*next` on, `hook` called at the
/// points of every hand-over, until that handler has run; fails the test if it never does
/// (a buffer is handed over every thousand events or so: far fewer than the bound).
pub fn emit_until_a_handler_exits(
    tid: u32,
    next: &mut u64,
    hook: fn(tracer::testing::HandOverPoint),
) {
    use std::sync::atomic::Ordering;
    // SAFETY: installs a handler for SIGUSR1 (a plain function) in this test process.
    let old = unsafe {
        libc::signal(
            libc::SIGUSR1,
            exit_from_handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
        )
    };
    assert_ne!(old, libc::SIG_ERR);
    tracer::testing::on_hand_over(Some(hook));
    while !EXITED.load(Ordering::SeqCst) && *next < 1_000_000 {
        emit(tid, *next);
        *next += 1;
    }
    tracer::testing::on_hand_over(None);
    assert!(
        EXITED.load(Ordering::SeqCst),
        "no handler exited in {next} events"
    );
}

/// A thread's first events are taken by a whole tick; then it emits until it hands a full
/// buffer over, and a signal handler that exits (`on_exit`) interrupts it at `at` in that
/// hand-over. Returns what [`check_counted`] found of the thread's events: each written or
/// counted lost.
pub fn exit_in_hand_over(name: &str, at: tracer::testing::HandOverPoint) -> Checked {
    let (path, tid, mut next) = ten_taken(name);
    EXIT_AT.store(point_code(at), std::sync::atomic::Ordering::SeqCst);
    emit_until_a_handler_exits(tid, &mut next, raise_at);
    check_counted(&path, tid, next)
}

/// Ends the process, saying `why` on stderr, when it still runs `secs` s from now: the failure
/// of a test whose failure is a hang (straight to the kernel: an `exit` would run the
/// library's exit path, which waits for the hung one).
pub fn watchdog(secs: u64, why: &'static str) {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        // SAFETY: writes static buffers to stderr, then ends the process.
        unsafe {
            libc::write(2, why.as_ptr().cast(), why.len());
            libc::write(2, b"\n".as_ptr().cast(), 1);
            libc::syscall(libc::SYS_exit_group, 1 as libc::c_long);
        }
    });
}
