//! Streams, events and stream capture.
//!
//! Each stream is a worker thread draining a FIFO of operations; an operation may wait on
//! other streams' work or on events first, then sleeps the injected delay
//! (`VRAMSIM_STREAM_DELAY` plus its own), then runs. The legacy default stream synchronises
//! with the blocking streams of its device as CUDA's does: work on it waits for everything
//! already submitted to blocking streams, and work on a blocking stream waits for everything
//! already submitted to it. The per-thread default stream is a blocking stream per thread.
//!
//! Capture only tracks status: work submitted to a capturing stream is recorded as captured
//! (counted) and not executed, and a potentially unsafe call (a synchronization, an event
//! query, cuMemAlloc, cuMemFree, a stream-ordered allocation or free on a stream that does not
//! capture, cuMemPoolTrimTo) made while a capture applies to the calling thread (by the
//! thread's interaction mode, see `capture_unsafe_check`) invalidates it and returns
//! CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as CUDA does. cuCtxSynchronize would wait for every
//! capturing stream of the context itself: it is refused while any capture of its device is
//! active, whatever the modes, and invalidates them all (`ctx_sync_check`). The virtual-memory
//! calls are not checked: the driver allows them during any capture. While a blocking stream
//! captures, any use of its device's legacy stream (work on it, its synchronization or query,
//! a synchronous copy or memset) would make the legacy stream depend on the capture: CUDA
//! refuses it with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates those captures
//! (`legacy_check`). A capturing stream may wait only on an event recorded in a capture (an
//! event recorded outside one needs `CU_EVENT_WAIT_EXTERNAL`: else
//! CUDA_ERROR_STREAM_CAPTURE_ISOLATION, the capture invalidated), and a stream that does not
//! capture joins the capture an event it waits on was recorded in (its status active, the
//! same capture id, its work captured into the same graph) until that capture ends. An event
//! last recorded in a capture that has ended is a node of a graph, not work of a stream: a wait
//! on it is refused with CUDA_ERROR_INVALID_VALUE (and invalidates the waiting stream's
//! capture, if it captures). A capturing stream may not wait on an event recorded in another
//! capture that is still under way (that would merge two capture sequences:
//! CUDA_ERROR_STREAM_CAPTURE_MERGE, and both captures invalidated) (`wait_check`). A joined
//! stream must be joined back: ending the capture while a joined stream has captured work after
//! the last event of its that the origin stream waited on fails with
//! CUDA_ERROR_STREAM_CAPTURE_UNJOINED and no graph, the capture ended for every stream of it
//! (`end_capture`). Only the origin's waits join a stream back: a stream joined back through
//! another joined stream (a wait of one joined stream on another's event) counts as unjoined.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::config::CONFIG;
use crate::ctx;
use crate::inject::delay;

const STREAM_BASE: usize = 0x7c5e_0000_0000;
const EVENT_BASE: usize = 0x7cee_0000_0000;
const STEP: usize = 0x100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Legacy,
    PerThread,
    User,
}

type Work = Box<dyn FnOnce() + Send>;

pub enum Dep {
    Stream(Arc<Stream>, u64),
    Event(Arc<Event>, u64),
}

struct Op {
    ticket: u64,
    deps: Vec<Dep>,
    delay: Duration,
    work: Work,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    closing: bool,
}

#[derive(Clone, Copy, Default)]
pub struct Capture {
    pub status: c_int,
    pub id: u64,
    pub mode: c_int,
    pub thread: i32,
    pub captured_ops: u64,
    /// The graph captured into (`cuStreamBeginCaptureToGraph`), 0: a new one.
    pub into: usize,
    /// The stream joined capture `id`, begun on another stream, by waiting on an event
    /// recorded in it: it captures until that capture ends, and cannot end it.
    pub joined: bool,
    /// Of a joined stream: how many of its captured operations the origin stream depends on
    /// (it waited on an event this stream recorded after them); more captured is unjoined.
    pub joined_through: u64,
}

pub struct Stream {
    pub handle: usize,
    pub dev: i32,
    pub flags: u32,
    pub priority: i32,
    pub kind: StreamKind,
    q: Mutex<Queue>,
    cv: Condvar,
    capture: Mutex<Capture>,
    /// While it captures: the captured work of other streams of its capture it depends on
    /// (stream handle, how many of that stream's captured operations), learned through waits on
    /// events recorded in the capture, directly or through other streams' waits.
    depends_on: Mutex<Vec<(usize, u64)>>,
}

pub struct Event {
    pub flags: u32,
    st: Mutex<EvState>,
    cv: Condvar,
}

#[derive(Default)]
struct EvState {
    recorded: u64,
    completed: u64,
    time: Option<Instant>,
    /// Last recorded in a capture (its id): waits on it join that capture.
    captured_in: Option<u64>,
    /// That record's stream (its handle) and how many operations that stream had captured.
    captured_by: usize,
    captured_at: u64,
    /// What that stream depended on at the record (see `Stream::depends_on`): a wait on the
    /// event depends on it too.
    captured_deps: Vec<(usize, u64)>,
}

/// Adds `more` to `deps`, keeping the larger count per stream.
fn merge_deps(deps: &mut Vec<(usize, u64)>, more: &[(usize, u64)]) {
    for &(h, n) in more {
        match deps.iter_mut().find(|d| d.0 == h) {
            Some(d) => d.1 = d.1.max(n),
            None => deps.push((h, n)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Registry {
    streams: HashMap<usize, Arc<Stream>>,
    /// Destroyed streams whose work may still run: a device-wide synchronization waits for
    /// it, and the legacy stream orders after it (dropped once idle).
    retiring: Vec<Arc<Stream>>,
    /// Handle values of destroyed streams, the most recent last: a new stream takes the last
    /// one, as a driver's freed stream object's address is reused (a program must never take
    /// a handle value for a stream's identity beyond its destroy).
    free_handles: Vec<usize>,
    legacy: HashMap<i32, Arc<Stream>>,
    per_thread: HashMap<(i32, i32), Arc<Stream>>,
    events: HashMap<usize, Arc<Event>>,
}

static REG: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        streams: HashMap::new(),
        retiring: Vec::new(),
        free_handles: Vec::new(),
        legacy: HashMap::new(),
        per_thread: HashMap::new(),
        events: HashMap::new(),
    })
});
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static ACTIVE_CAPTURES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(CU_STREAM_CAPTURE_MODE_GLOBAL) };
}

fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

impl Stream {
    fn spawn(dev: i32, flags: u32, priority: i32, kind: StreamKind) -> Arc<Stream> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize;
        Self::spawn_as(STREAM_BASE + id * STEP, id, dev, flags, priority, kind)
    }

    fn spawn_as(
        handle: usize,
        id: usize,
        dev: i32,
        flags: u32,
        priority: i32,
        kind: StreamKind,
    ) -> Arc<Stream> {
        let s = Arc::new(Stream {
            handle,
            dev,
            flags,
            priority,
            kind,
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            capture: Mutex::new(Capture::default()),
            depends_on: Mutex::new(Vec::new()),
        });
        let w = s.clone();
        std::thread::Builder::new()
            .name(format!("vramsim-stream-{id}"))
            .spawn(move || w.run())
            .expect("spawn stream worker");
        s
    }

    fn run(&self) {
        loop {
            let op = {
                let mut q = lock(&self.q);
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.closing {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            for d in &op.deps {
                match d {
                    Dep::Stream(s, t) => s.wait_for(*t),
                    Dep::Event(e, g) => e.wait_for(*g),
                }
            }
            delay(CONFIG.stream_delay + op.delay);
            (op.work)();
            lock(&self.q).completed = op.ticket;
            // Notified with the lock released, as a device wakes its waiters: a waiter woken
            // with the lock still held would block on it again at once. No wake-up is lost:
            // a waiter tests `completed` under the lock before it waits, so it either saw
            // this ticket or was waiting when the notification came.
            self.cv.notify_all();
        }
    }

    pub fn wait_for(&self, ticket: u64) {
        let mut q = lock(&self.q);
        while q.completed < ticket {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn blocking(&self) -> bool {
        self.flags & CU_STREAM_NON_BLOCKING == 0
    }

    fn pending_ticket(&self) -> Option<u64> {
        let q = lock(&self.q);
        (q.submitted > q.completed).then_some(q.submitted)
    }

    pub fn capture(&self) -> Capture {
        *lock(&self.capture)
    }

    /// A node of its capture's graph made on the stream other than by `submit` (a graph
    /// allocation or free): captured work, as submitted work is.
    pub fn captured_node(&self) {
        let mut c = lock(&self.capture);
        if c.status != CU_STREAM_CAPTURE_STATUS_NONE {
            c.captured_ops += 1;
        }
    }

    /// Queues `work` after the implicit dependencies of the legacy stream semantics. Returns
    /// the op's ticket, or None when the stream is capturing (the work is not executed).
    pub fn submit(
        self: &Arc<Self>,
        mut deps: Vec<Dep>,
        extra: Duration,
        work: Work,
    ) -> Option<u64> {
        {
            let mut c = lock(&self.capture);
            if c.status != CU_STREAM_CAPTURE_STATUS_NONE {
                c.captured_ops += 1;
                return None;
            }
        }
        if self.kind == StreamKind::Legacy {
            for s in blocking_streams(self.dev) {
                if let Some(t) = s.pending_ticket() {
                    deps.push(Dep::Stream(s, t));
                }
            }
        } else if self.blocking()
            && let Some(l) = lock(&REG).legacy.get(&self.dev).cloned()
            && let Some(t) = l.pending_ticket()
        {
            deps.push(Dep::Stream(l, t));
        }
        let mut q = lock(&self.q);
        q.submitted += 1;
        let ticket = q.submitted;
        q.ops.push_back(Op {
            ticket,
            deps,
            delay: extra,
            work,
        });
        drop(q);
        self.cv.notify_all();
        Some(ticket)
    }

    pub fn synchronize(&self) {
        let t = lock(&self.q).submitted;
        self.wait_for(t);
    }

    pub fn idle(&self) -> bool {
        let q = lock(&self.q);
        q.completed >= q.submitted
    }

    fn close(&self) {
        lock(&self.q).closing = true;
        self.cv.notify_all();
    }
}

fn blocking_streams(dev: i32) -> Vec<Arc<Stream>> {
    let mut r = lock(&REG);
    r.retiring.retain(|s| !s.idle());
    r.streams
        .values()
        .chain(r.per_thread.values())
        .chain(r.retiring.iter())
        .filter(|s| s.dev == dev && s.blocking())
        .cloned()
        .collect()
}

fn all_streams() -> Vec<Arc<Stream>> {
    let mut r = lock(&REG);
    r.retiring.retain(|s| !s.idle());
    r.streams
        .values()
        .chain(r.per_thread.values())
        .chain(r.legacy.values())
        .chain(r.retiring.iter())
        .cloned()
        .collect()
}

pub fn legacy(dev: i32) -> Arc<Stream> {
    let mut r = lock(&REG);
    r.legacy
        .entry(dev)
        .or_insert_with(|| Stream::spawn(dev, 0, 0, StreamKind::Legacy))
        .clone()
}

pub fn per_thread(dev: i32) -> Arc<Stream> {
    let mut r = lock(&REG);
    r.per_thread
        .entry((tid(), dev))
        .or_insert_with(|| Stream::spawn(dev, 0, 0, StreamKind::PerThread))
        .clone()
}

/// Resolves a stream handle; `ptds` is set for the `_ptsz`/`_ptds` entry points, where the
/// NULL stream means the per-thread default stream.
pub fn resolve(h: CUstream, ptds: bool) -> Result<Arc<Stream>, CUresult> {
    match h as usize {
        0 if ptds => Ok(per_thread(ctx::current_device()?)),
        0 | CU_STREAM_LEGACY => Ok(legacy(ctx::current_device()?)),
        CU_STREAM_PER_THREAD => Ok(per_thread(ctx::current_device()?)),
        v => lock(&REG)
            .streams
            .get(&v)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_HANDLE),
    }
}

pub fn create(flags: u32, priority: i32) -> Result<CUstream, CUresult> {
    let dev = ctx::current_device()?;
    let mut r = lock(&REG);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize;
    let h = r.free_handles.pop().unwrap_or(STREAM_BASE + id * STEP);
    let s = Stream::spawn_as(h, id, dev, flags, priority.clamp(-5, 0), StreamKind::User);
    r.streams.insert(h, s);
    Ok(h as CUstream)
}

/// Returns at once, as CUDA's does: the stream's work still runs (on its worker, which ends
/// after it), and its handle value may be given to the next stream created.
pub fn destroy(h: CUstream) -> Res {
    let mut r = lock(&REG);
    let s = r
        .streams
        .remove(&(h as usize))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let c = s.capture();
    if c.status != CU_STREAM_CAPTURE_STATUS_NONE {
        ACTIVE_CAPTURES.fetch_sub(1, Ordering::AcqRel);
        if !c.joined {
            let joined: Vec<Arc<Stream>> = r
                .streams
                .values()
                .chain(r.per_thread.values())
                .cloned()
                .collect();
            end_joined(c.id, &joined);
            crate::graph::capture_ended(c.id, false, c.into);
        }
    }
    s.close();
    r.free_handles.push(h as usize);
    if !s.idle() {
        r.retiring.push(s);
    }
    Ok(())
}

/// Waits until every stream of the process is idle (cuCtxSynchronize, cuMemFree).
pub fn synchronize_all() {
    for s in all_streams() {
        s.synchronize();
    }
}

/// Submits `work` and waits for it (synchronous copies and memsets).
pub fn run_sync(s: &Arc<Stream>, work: Work) -> Res {
    legacy_check(s)?;
    capture_unsafe_check(Some(s))?;
    if let Some(t) = s.submit(Vec::new(), Duration::ZERO, work) {
        s.wait_for(t);
    }
    Ok(())
}

/// Submits `work` asynchronously.
pub fn run_async(s: &Arc<Stream>, extra: Duration, work: Work) -> Res {
    legacy_check(s)?;
    s.submit(Vec::new(), extra, work);
    Ok(())
}

// ---- capture ----

/// A use of `s`: when it is a legacy stream while a blocking stream of its device captures,
/// the legacy stream would depend on the capture: those captures are invalidated and the use
/// refused with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, as CUDA does.
pub fn legacy_check(s: &Arc<Stream>) -> Res {
    if s.kind != StreamKind::Legacy || ACTIVE_CAPTURES.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    if invalidate_where(blocking_streams(s.dev), |_| true) {
        Err(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    } else {
        Ok(())
    }
}

/// Every active capture among `streams` that `applies` picks is invalidated; true if there was
/// one. Takes each stream's capture lock alone; the caller holds none.
fn invalidate_where(streams: Vec<Arc<Stream>>, applies: impl Fn(&Capture) -> bool) -> bool {
    let mut hit = false;
    for s in streams {
        let mut c = lock(&s.capture);
        if c.status == CU_STREAM_CAPTURE_STATUS_ACTIVE && applies(&c) {
            c.status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            hit = true;
        }
    }
    hit
}

/// `cuStreamWaitEvent(s, e, flags)`: what capture allows. A capturing stream waits on an event
/// recorded in a capture (joining it), or on one recorded outside only with
/// `CU_EVENT_WAIT_EXTERNAL` (an external event node); an event never recorded is no
/// dependency. Otherwise the capture is invalidated: CUDA_ERROR_STREAM_CAPTURE_ISOLATION. An
/// event recorded in another capture under way would merge the two: both are invalidated,
/// CUDA_ERROR_STREAM_CAPTURE_MERGE. An event last recorded in a capture that has ended is
/// refused with CUDA_ERROR_INVALID_VALUE, by a capturing stream (its capture invalidated) and
/// by one that does not capture alike. A stream that does not capture may not use
/// `CU_EVENT_WAIT_EXTERNAL` (CUDA_ERROR_INVALID_VALUE).
pub fn wait_check(s: &Arc<Stream>, e: &Event, flags: c_uint) -> Res {
    let (captured_in, by, at, mut deps) = {
        let st = lock(&e.st);
        (
            st.captured_in,
            st.captured_by,
            st.captured_at,
            st.captured_deps.clone(),
        )
    };
    merge_deps(&mut deps, &[(by, at)]);
    let recorded = lock(&e.st).recorded > 0 || captured_in.is_some();
    // the capture the event was recorded in, if it is still under way (looked up before this
    // stream's capture is locked: each stream's capture lock is taken alone)
    let origin = captured_in.and_then(|id| {
        all_streams().into_iter().find_map(|o| {
            let c = o.capture();
            (c.id == id && c.status != CU_STREAM_CAPTURE_STATUS_NONE && !c.joined).then_some(c)
        })
    });
    let mut c = lock(&s.capture);
    match c.status {
        CU_STREAM_CAPTURE_STATUS_NONE => {
            if flags & CU_EVENT_WAIT_EXTERNAL != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            match (captured_in, origin) {
                (None, _) => Ok(()),
                // the legacy stream cannot capture
                (Some(_), Some(_)) if s.kind == StreamKind::Legacy => {
                    Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
                }
                (Some(_), Some(o)) => {
                    *c = Capture {
                        captured_ops: 0,
                        joined: true,
                        joined_through: 0,
                        ..o
                    };
                    drop(c);
                    *lock(&s.depends_on) = deps;
                    ACTIVE_CAPTURES.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                }
                // recorded in a capture that has ended: a node of its graph, nothing a
                // stream can wait for
                (Some(_), None) => Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        CU_STREAM_CAPTURE_STATUS_INVALIDATED => Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        _ => match captured_in {
            Some(id) if id == c.id => {
                let origin = !c.joined;
                drop(c);
                // the waiting stream now depends on what the recording stream depended on at
                // the record, and on its work up to it: joins relayed through other streams
                // count when the origin waits
                deps.retain(|d| d.0 != s.handle);
                merge_deps(&mut lock(&s.depends_on), &deps);
                if origin {
                    for (h, n) in deps {
                        joined_back(id, h, n);
                    }
                }
                Ok(())
            }
            // recorded in another capture still under way: the wait would merge the two
            // sequences, and both are invalidated
            Some(other) if origin.is_some() => {
                let mine = c.id;
                drop(c);
                invalidate_capture(mine);
                invalidate_capture(other);
                Err(CUDA_ERROR_STREAM_CAPTURE_MERGE)
            }
            // recorded in a capture that has ended: refused as outside a capture, and the
            // refusal invalidates this one
            Some(_) => {
                let mine = c.id;
                drop(c);
                invalidate_capture(mine);
                Err(CUDA_ERROR_INVALID_VALUE)
            }
            None if !recorded || flags & CU_EVENT_WAIT_EXTERNAL != 0 => Ok(()),
            None => {
                c.status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
                Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            }
        },
    }
}

/// Every stream of capture `id` (its origin and the streams that joined it) still active
/// is invalidated: the capture's status is one for all of them. Takes each stream's capture
/// lock alone; the caller holds none.
fn invalidate_capture(id: u64) {
    invalidate_where(all_streams(), |c| c.id == id);
}

/// The origin stream of capture `id` waited on an event stream `by` recorded after capturing
/// `at` operations: when `by` joined the capture, the origin depends on those.
fn joined_back(id: u64, by: usize, at: u64) {
    if let Some(j) = all_streams().into_iter().find(|j| j.handle == by) {
        let mut c = lock(&j.capture);
        if c.joined && c.id == id {
            c.joined_through = c.joined_through.max(at);
        }
    }
}

pub fn begin_capture(s: &Arc<Stream>, mode: c_int) -> Res {
    begin_capture_into(s, mode, 0)
}

/// Begins a capture of `s` in `mode` into graph `into` (0: a new graph at the end).
pub fn begin_capture_into(s: &Arc<Stream>, mode: c_int, into: usize) -> Res {
    if s.kind == StreamKind::Legacy {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if !(0..=2).contains(&mode) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut c = lock(&s.capture);
    if c.status != CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    *c = Capture {
        status: CU_STREAM_CAPTURE_STATUS_ACTIVE,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        mode,
        thread: tid(),
        captured_ops: 0,
        into,
        joined: false,
        joined_through: 0,
    };
    drop(c);
    lock(&s.depends_on).clear();
    ACTIVE_CAPTURES.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

pub const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;

/// Ends a capture; returns its graph (see `graph`).
pub fn end_capture(s: &Arc<Stream>) -> Result<*mut c_void, CUresult> {
    let prev = {
        let mut c = lock(&s.capture);
        let prev = *c;
        if prev.status == CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        if prev.joined {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if prev.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && prev.thread != tid() {
            return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        *c = Capture::default();
        prev
    };
    lock(&s.depends_on).clear();
    ACTIVE_CAPTURES.fetch_sub(1, Ordering::AcqRel);
    // the streams that joined it leave it; work of theirs made invalid is the capture's, and
    // so is work of theirs the origin does not depend on (a fork never joined back)
    let joined = end_joined(prev.id, &all_streams());
    let valid = prev.status != CU_STREAM_CAPTURE_STATUS_INVALIDATED && joined.valid;
    let graph = crate::graph::capture_ended(prev.id, valid && !joined.unjoined, prev.into);
    if !valid {
        return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    if joined.unjoined {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    }
    Ok(graph)
}

/// What the streams that had joined an ended capture leave to it.
struct Joined {
    /// None of them was invalidated.
    valid: bool,
    /// One of them captured work after its last event the origin waited on.
    unjoined: bool,
}

/// Capture `id` ended: every stream among `streams` that joined it stops capturing.
fn end_joined(id: u64, streams: &[Arc<Stream>]) -> Joined {
    let mut out = Joined {
        valid: true,
        unjoined: false,
    };
    for j in streams {
        let mut c = lock(&j.capture);
        if c.joined && c.id == id && c.status != CU_STREAM_CAPTURE_STATUS_NONE {
            out.valid &= c.status != CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            out.unjoined |= c.captured_ops > c.joined_through;
            *c = Capture::default();
            drop(c);
            lock(&j.depends_on).clear();
            ACTIVE_CAPTURES.fetch_sub(1, Ordering::AcqRel);
        }
    }
    out
}

pub fn exchange_capture_mode(mode: c_int) -> Result<c_int, CUresult> {
    if !(0..=2).contains(&mode) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(CAPTURE_MODE.with(|m| m.replace(mode)))
}

/// A potentially unsafe call (synchronization, allocation, free) during capture: invalidates
/// the captures it would break and fails, as CUDA does. `on` is the stream the call targets.
pub fn capture_unsafe_check(on: Option<&Arc<Stream>>) -> Res {
    if ACTIVE_CAPTURES.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    if let Some(s) = on {
        let mut c = lock(&s.capture);
        if c.status == CU_STREAM_CAPTURE_STATUS_ACTIVE && s.kind != StreamKind::Legacy {
            c.status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
    }
    // The calling thread's interaction mode decides which captures apply (CUDA's rules of
    // cuThreadExchangeStreamCaptureMode): relaxed, none; thread-local, its own captures not
    // begun relaxed; global (the default), those and every other thread's global captures.
    let mode = CAPTURE_MODE
        .try_with(|m| m.get())
        .unwrap_or(CU_STREAM_CAPTURE_MODE_GLOBAL);
    if mode == CU_STREAM_CAPTURE_MODE_RELAXED {
        return Ok(());
    }
    let me = tid();
    let applies = |c: &Capture| {
        let own = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        let others =
            mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        own || others
    };
    if invalidate_where(all_streams(), applies) {
        Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// cuCtxSynchronize of device `dev`'s context: it would wait for every stream of the context,
/// capturing ones included, whose captured work never runs. While any capture of the device is
/// active, whatever its mode, whichever thread began it and whatever the calling thread's mode
/// (relaxed included; streams that joined a capture count), it is refused with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and every active capture of the device is
/// invalidated, as the driver does; a capture invalidated and not yet ended refuses it too.
pub fn ctx_sync_check(dev: i32) -> Res {
    if ACTIVE_CAPTURES.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let of_dev: Vec<_> = all_streams().into_iter().filter(|s| s.dev == dev).collect();
    // An invalidated capture is still a capture until its end: the stream stays in capture
    // mode and cannot be waited for.
    let invalidated = of_dev
        .iter()
        .any(|s| lock(&s.capture).status == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    if invalidate_where(of_dev, |_| true) || invalidated {
        Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

// ---- events ----

pub fn event_create(flags: u32) -> CUevent {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as usize;
    let h = EVENT_BASE + id * STEP;
    let e = Arc::new(Event {
        flags,
        st: Mutex::new(EvState::default()),
        cv: Condvar::new(),
    });
    lock(&REG).events.insert(h, e);
    h as CUevent
}

pub fn event(h: CUevent) -> Result<Arc<Event>, CUresult> {
    lock(&REG)
        .events
        .get(&(h as usize))
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

pub fn event_destroy(h: CUevent) -> Res {
    lock(&REG)
        .events
        .remove(&(h as usize))
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

impl Event {
    fn wait_for(&self, gen_: u64) {
        let mut st = lock(&self.st);
        while st.completed < gen_ {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn record(self: &Arc<Self>, s: &Arc<Stream>) {
        let c = s.capture();
        if c.status != CU_STREAM_CAPTURE_STATUS_NONE {
            let deps = lock(&s.depends_on).clone();
            let mut st = lock(&self.st);
            st.captured_in = Some(c.id);
            st.captured_by = s.handle;
            st.captured_at = c.captured_ops;
            st.captured_deps = deps;
            return;
        }
        let g = {
            let mut st = lock(&self.st);
            st.captured_in = None;
            st.recorded += 1;
            st.recorded
        };
        let e = self.clone();
        let queued = s.submit(
            Vec::new(),
            Duration::ZERO,
            Box::new(move || {
                {
                    let mut st = lock(&e.st);
                    if st.completed < g {
                        st.completed = g;
                        st.time = Some(Instant::now());
                    }
                }
                // Outside the lock, as the stream's own notification.
                e.cv.notify_all();
            }),
        );
        if queued.is_none() {
            // Lost a race with a capture starting: nothing will complete it.
            let mut st = lock(&self.st);
            st.completed = st.completed.max(g);
        }
    }

    pub fn is_complete(&self) -> bool {
        let st = lock(&self.st);
        st.completed >= st.recorded
    }

    pub fn synchronize(&self) {
        let g = lock(&self.st).recorded;
        self.wait_for(g);
    }

    /// Makes `s` wait for the event's latest record.
    pub fn wait_on(self: &Arc<Self>, s: &Arc<Stream>) {
        let (g, captured) = {
            let st = lock(&self.st);
            (st.recorded, st.captured_in.is_some())
        };
        // a wait on an event recorded in a capture is an edge of that capture's graph, not
        // captured work of the waiting stream
        if g == 0 || captured {
            return;
        }
        s.submit(
            vec![Dep::Event(self.clone(), g)],
            Duration::ZERO,
            Box::new(|| {}),
        );
    }

    pub fn time(&self) -> Result<Instant, CUresult> {
        let st = lock(&self.st);
        if st.recorded == 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if st.completed < st.recorded {
            return Err(CUDA_ERROR_NOT_READY);
        }
        st.time.ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

/// Host pointers carried to a worker thread.
#[derive(Clone, Copy)]
pub struct SendPtr(pub usize);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Many threads waiting on one stream's tickets and on an event recorded on it, while
    /// its work is submitted and run: every waiter wakes for every ticket it waits for (the
    /// notifications come after the lock is released, none may be lost).
    #[test]
    fn every_waiter_wakes_for_every_ticket() {
        const OPS: u64 = 400;
        const WAITERS: u64 = 48;
        let s = Stream::spawn(0, CU_STREAM_NON_BLOCKING, 0, StreamKind::User);
        let e = Arc::new(Event {
            flags: 0,
            st: Mutex::new(EvState::default()),
            cv: Condvar::new(),
        });
        let ran = Arc::new(AtomicU64::new(0));
        let (done, woke) = mpsc::channel();
        for w in 0..WAITERS {
            let (s, e, ran, done) = (s.clone(), e.clone(), ran.clone(), done.clone());
            std::thread::spawn(move || {
                // Each waiter its own tickets: every one, every third, or only the events.
                let mut t = 1 + w % 3;
                while t <= OPS {
                    if w % 4 == 3 {
                        e.wait_for(t / 2);
                    } else {
                        s.wait_for(t);
                        // The work ops are those of even index: (t + 1) / 2 of the first t.
                        assert!(ran.load(Ordering::Acquire) >= t.div_ceil(2));
                    }
                    t += 1 + w % 3;
                }
                done.send(w).unwrap();
            });
        }
        drop(done);
        for i in 0..OPS {
            let ran = ran.clone();
            if i % 2 == 1 {
                e.record(&s);
            } else {
                s.submit(
                    Vec::new(),
                    Duration::ZERO,
                    Box::new(move || {
                        ran.fetch_add(1, Ordering::AcqRel);
                    }),
                );
            }
            if i % 16 == 0 {
                std::thread::yield_now();
            }
        }
        for _ in 0..WAITERS {
            woke.recv_timeout(Duration::from_secs(30))
                .expect("a waiter never woke: a notification was lost");
        }
        s.close();
    }
}
