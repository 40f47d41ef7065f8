//! Per-thread event buffers and their registry.
//!
//! Each thread that emits owns one [`Slot`] (found through a const, non-Drop thread-local
//! pointer). The calling thread only appends its events as they are ([`Raw`]: a fixed-size
//! entry, a few plain stores); the writer thread encodes them into records ([`encode`]) when it
//! takes the buffer, so the delta/varint encoding costs the application's threads nothing. Slots are leaked and linked into a lock-free list, never freed: the writer
//! thread can take a slot's partial buffer at any time (every tick, and at exit), so the
//! events of threads that have exited are never lost. A slot's buffer is guarded by a spin
//! flag that only its owner and the writer ever take; where `membarrier` is available the
//! owner does not take it at all: it marks the slot busy with a plain store and checks that
//! the writer has not claimed it ([`super::barrier`]), and the writer pays the barrier.

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{
    AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, compiler_fence,
};

use vramshim_trace::{AllocKind, Api, Event, MemOp, RecordEncoder, TorchFields, TorchOp};

use super::entries::Entries;
use super::patience::Patience;
use super::{barrier, stacks, writer};
use crate::sys::biased::BiasedLock;
use crate::sys::life::LifeToken;

/// Devices whose live bytes the slots count for `Counter` records.
pub(crate) const MAX_DEV: usize = 16;
/// A buffer of this many entries (64 KiB) is handed to the writer.
pub(crate) const SEND_AT: usize = (64 << 10) / std::mem::size_of::<Raw>();
/// If the writer cannot take buffers, a thread keeps at most this many entries (4 MiB), then
/// throttles.
pub(crate) const MAX_BUF: usize = (4 << 20) / std::mem::size_of::<Raw>();
/// A buffer the writer could not take is offered again after this many more entries.
const RETRY_AFTER: usize = SEND_AT / 4;
/// Longest a thread yields to the writer (channel full, buffer at `MAX_BUF`) before dropping
/// its buffer (counted in a `Lost` record). Bounded: the application is slowed, never blocked.
const THROTTLE_NS: u64 = 100_000_000;
/// Backlog (bytes queued for the writer) above which a thread handing over a buffer waits.
const HIGH_WATER: usize = 8 << 20;

/// One entry of a thread's buffer: an allocation or a free as the calling thread left it (the
/// caller's `MemOp`, not yet encoded), a context, or the place of another event (kept in
/// [`Buf::others`]). `repr(C)` and a plain struct, so the hot path writes the `MemOp` straight
/// into the buffer with a few wide moves (an enum holding an `Event` is built on the stack
/// and copied).
#[repr(C)]
pub(crate) struct Raw {
    kind: Kind,
    op: MemOp,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Kind {
    /// The following events are thread `op.tid`'s (a `Context` record: delta state reset).
    Context,
    Alloc,
    Free,
    /// The next event of [`Buf::others`] (a `Stack` just before the MemOp that refers to it).
    Other,
    /// A `Torch` event, its fields in the `MemOp`'s places ([`torch_entry`]).
    Torch,
}

/// A thread's events, in order, not yet encoded. A buffer in use always starts with a
/// `Context` (the thread whose events follow), as an encoded run of records starts with a
/// `Context` record; [`encode`] turns one into the other.
#[derive(Default)]
pub(crate) struct Buf {
    raw: Entries<Raw>,
    others: Vec<Event>,
    /// Entries that are not events (`Context`s, and `Other`s holding a `Stack` record), and
    /// the index of the last of them, in one word ([`extra_word`]): the buffer's events are
    /// `raw.len()` less those among its first `raw.len()` entries ([`nonevents`]), known from
    /// two atomic words without reading an entry ([`Slot::events_left`]). Counted where those
    /// entries are appended (slow paths only: the hot path appends events), in one store
    /// before the append, so that a reader that interrupts the append anywhere (a signal
    /// handler on the owner's thread) or finds the owner stopped in it counts exactly.
    extra: AtomicU64,
}

/// The [`Buf::extra`] word: `n` entries that are not events, the last of them at `at`.
fn extra_word(n: u64, at: usize) -> u64 {
    n << 32 | (at.min(u32::MAX as usize) as u64)
}

/// The entries that are not events among the first `len`, from the [`Buf::extra`] word: the
/// last one counted is not among them until the length includes its index.
fn nonevents(word: u64, len: usize) -> u64 {
    let (n, at) = (word >> 32, (word & u32::MAX as u64) as usize);
    if n > 0 && at >= len { n - 1 } else { n }
}

impl Buf {
    pub(crate) fn with_capacity(n: usize) -> Buf {
        Buf {
            raw: Entries::with_capacity(n),
            others: Vec::new(),
            extra: AtomicU64::new(0),
        }
    }

    /// Entries (the backlog's and the hand-over's measure).
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Events (entries that are events), from two lengths ([`Buf::extra`]).
    pub(crate) fn events(&self) -> u64 {
        let len = self.raw.len();
        (len as u64).saturating_sub(nonevents(self.extra.load(Ordering::Relaxed), len))
    }

    pub(crate) fn clear(&mut self) {
        self.raw.clear();
        self.others.clear();
        self.extra.store(0, Ordering::Relaxed);
    }

    /// Counts an entry that is not an event, appended next (see [`Buf::extra`]).
    fn nonevent_next(&mut self) {
        let n = self.extra.load(Ordering::Relaxed) >> 32;
        self.extra
            .store(extra_word(n + 1, self.raw.len()), Ordering::Release);
        compiler_fence(Ordering::SeqCst);
    }

    fn context(&mut self, tid: u32) {
        self.nonevent_next();
        self.raw.push(Raw {
            kind: Kind::Context,
            op: blank_op(tid),
        });
    }

    /// Appends `ev` (after the buffer's leading `Context` when it is empty).
    fn put(&mut self, slot: &Slot, ev: Event) {
        if self.raw.is_empty() {
            self.start(slot);
        }
        let (kind, op) = match ev {
            Event::Alloc(m) => (Kind::Alloc, m),
            Event::Free(m) => (Kind::Free, m),
            ev => {
                if matches!(ev, Event::Stack { .. }) {
                    self.nonevent_next();
                }
                self.others.push(ev);
                self.raw.push(Raw {
                    kind: Kind::Other,
                    op: blank_op(0),
                });
                return;
            }
        };
        self.raw.push(Raw { kind, op });
    }

    /// [`Buf::put`] of an allocation or a free: the hot path, a few plain stores.
    #[inline(always)]
    fn put_op<const ALLOC: bool>(&mut self, slot: &Slot, m: &MemOp) {
        if self.raw.is_empty() {
            self.start(slot);
        }
        let len = self.raw.len();
        if len == self.raw.capacity() {
            self.grow();
        }
        // SAFETY: len < capacity (grown above), so the entry at `len` lies inside the
        // allocation; both fields are written before the length counts it.
        unsafe {
            let p = self.raw.as_mut_ptr().add(len);
            ptr::addr_of_mut!((*p).kind).write(if ALLOC { Kind::Alloc } else { Kind::Free });
            ptr::addr_of_mut!((*p).op).write(MemOp { ..*m });
            self.raw.set_len(len + 1);
        }
    }

    /// [`Buf::put`] of a `Torch` event, stored as [`torch_entry`] lays it out.
    #[inline(always)]
    fn put_torch(&mut self, slot: &Slot, m: MemOp) {
        if self.raw.is_empty() {
            self.start(slot);
        }
        if self.raw.len() == self.raw.capacity() {
            self.grow();
        }
        self.raw.push(Raw {
            kind: Kind::Torch,
            op: m,
        });
    }

    #[cold]
    #[inline(never)]
    fn start(&mut self, slot: &Slot) {
        self.context(slot.owner.load(Ordering::Relaxed));
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        self.raw.reserve(RETRY_AFTER);
    }
}

/// The `MemOp` of an entry that is not one.
fn blank_op(tid: u32) -> MemOp {
    MemOp {
        t_ns: 0,
        tid,
        api: Api::CudaMalloc,
        kind: AllocKind::Runtime,
        flags: 0,
        device: 0,
        stream: 0,
        addr: 0,
        size: 0,
        result: 0,
        latency_ns: 0,
        stack: 0,
    }
}

/// Encodes a thread's buffer into whole records (starting with a `Context` record): the
/// bytes the calling thread's encoder wrote before the encoding moved to the writer. Event
/// times are raw trace times until here ([`super::clock::ToNs`]).
pub(crate) fn encode(enc: &mut RecordEncoder, b: &mut Buf) {
    enc.clear();
    let mut ns = super::clock::ToNs::new();
    let mut live = [0i64; MAX_DEV];
    let mut others = b.others.iter_mut();
    let mut i = 0;
    // The thread of the entries that follow (the last `Context`'s).
    let mut tid = 0;
    while let Some(r) = b.raw.get(i) {
        if i == 0 && r.kind != Kind::Context {
            // Never built that way; a run of records must start with a context.
            enc.context(0);
        }
        i += 1;
        match r.kind {
            // The thread's `TorchRun` model continues from its previous buffer (format v5):
            // the first events of a buffer are predicted too.
            Kind::Context => {
                tid = r.op.tid;
                enc.context_chained(tid)
            }
            Kind::Alloc | Kind::Free => {
                if let Some((d, v)) = live_delta(r.kind, &r.op) {
                    live[d] = live[d].wrapping_add(v);
                }
                let mut op = MemOp { ..r.op };
                op.t_ns = ns.get(op.t_ns);
                enc.push_memop(r.kind == Kind::Alloc, &op);
            }
            Kind::Torch => {
                // This entry and the `Torch` entries after it: their times converted and
                // their thread filled in where they lie (the buffer is coded once, then
                // recycled), then coded in one call (one run header, the coder reading each
                // entry's fields in place: `push_torch_all`).
                let start = i - 1;
                let mut end = start;
                while let Some(r) = b.raw.get_mut(end) {
                    if r.kind != Kind::Torch {
                        break;
                    }
                    if r.op.tid == OWN_THREAD {
                        // The tracker's: this buffer's thread ([`OWN_THREAD`]).
                        r.op.tid = tid;
                    }
                    end += 1;
                }
                let row = &mut b.raw[start..end];
                ns.convert_all(row, |r| &mut r.op.t_ns);
                enc.push_torch_all(&*row);
                i = end;
            }
            Kind::Other => {
                if let Some(e) = others.next() {
                    if let Some(t) = time_of(e) {
                        *t = ns.get(*t);
                    }
                    enc.push(e);
                }
            }
        }
    }
    add_live(&live);
}

fn time_of(e: &mut Event) -> Option<&mut u64> {
    match e {
        Event::Alloc(m) | Event::Free(m) => Some(&mut m.t_ns),
        Event::CapRefusal { t_ns, .. }
        | Event::PoolTrim { t_ns, .. }
        | Event::Sync { t_ns, .. }
        | Event::MemInfo { t_ns, .. }
        | Event::ThreadStart { t_ns, .. }
        | Event::ThreadExit { t_ns, .. }
        | Event::Fork { t_ns, .. }
        | Event::Counter { t_ns, .. }
        | Event::PoolStats { t_ns, .. }
        | Event::StreamDestroy { t_ns, .. }
        | Event::Lost { t_ns, .. }
        | Event::CallFailed { t_ns, .. } => Some(t_ns),
        Event::Torch(op) => Some(&mut op.t_ns),
        Event::Module { .. }
        | Event::Stack { .. }
        | Event::Device(_)
        | Event::PyCode { .. }
        | Event::PyStack { .. } => None,
    }
}

/// Events (calls to `emit`) in a buffer, for exact loss accounting.
fn events_in(b: &Buf) -> u64 {
    let ops = b
        .raw
        .iter()
        .filter(|r| matches!(r.kind, Kind::Alloc | Kind::Free | Kind::Torch))
        .count();
    let others = b
        .others
        .iter()
        .filter(|e| !matches!(e, Event::Stack { .. }))
        .count();
    (ops + others) as u64
}

pub(crate) struct Slot {
    next: AtomicPtr<Slot>,
    /// The owner appends in its window (asymmetric protocol, see [`super::barrier`]); the
    /// writer takes the buffer under the lock, which the owner then waits for.
    bias: BiasedLock,
    /// Kernel tid of the owning thread; 0 = free for reuse.
    pub owner: AtomicU32,
    /// Held by the owning thread for its life: says when *that* thread has ended, where its
    /// tid may already be another thread's ([`dead_threads`]).
    life: LifeToken,
    /// The hand-over under way (see [`hand_over`]): while the owner has taken its full buffer
    /// out of the slot to queue it for the writer, that buffer's events plus one (0: none
    /// out), the one word an exit that interrupts the owner there goes by.
    out_events: AtomicU64,
    /// The number of that hand-over (the slot's hand-overs so far).
    out_seq: AtomicU64,
    /// The number of the last hand-over the writer has written (or counted lost): a buffer
    /// out of the slot with a number up to this one is accounted for.
    done_seq: AtomicU64,
    inner: UnsafeCell<Inner>,
}

/// A buffer handed over from a slot: which slot, and which of its hand-overs (the writer marks
/// it written, [`Handed::written`]).
pub(crate) struct Handed {
    slot: &'static Slot,
    seq: u64,
}

impl Handed {
    /// The writer has written the buffer, or counted its events lost.
    pub(crate) fn written(&self) {
        self.slot.done_seq.fetch_max(self.seq, Ordering::Release);
    }
}

struct Inner {
    buf: Buf,
    /// Try handing the buffer over when it holds this many entries.
    next_try: usize,
}

// SAFETY: `inner` is only accessed through a `Guard`: with the lock held, or by the owner in
// its window with the lock free (the writer, having locked, waits for the owner to leave the
// window before touching it; see `super::barrier`); everything else is atomic.
unsafe impl Sync for Slot {}

static HEAD: AtomicPtr<Slot> = AtomicPtr::new(ptr::null_mut());

/// This thread's slot, kept in the hooks' thread state (`guard::State::trace_slot`: static
/// TLS reached without a `__tls_get_addr` call, zero in every new thread, no destructor).
#[inline(always)]
fn my_slot_ptr() -> &'static std::cell::Cell<*const ()> {
    &crate::sys::thread::state().trace_slot
}

/// Exclusive access to a slot's buffer.
struct Guard<'a> {
    slot: &'a Slot,
    how: Held,
}

#[derive(Clone, Copy, PartialEq)]
enum Held {
    /// The owner, in its window.
    Window,
    /// The lock.
    Lock,
    /// The writer: the lock, taken while owners use their window (then one
    /// [`barrier::heavy`] and [`Guard::settle`] before the buffer is touched).
    Claim,
}

impl Slot {
    /// The owner's way in: its window when the asymmetric protocol is available and the
    /// writer is not taking the buffer, else the lock.
    #[inline]
    fn enter(&self) -> Guard<'_> {
        let how = if self.bias.owner_enter(barrier::available()) {
            Held::Window
        } else {
            Held::Lock
        };
        Guard { slot: self, how }
    }

    #[inline]
    fn lock(&self) -> Guard<'_> {
        self.bias.lock();
        Guard {
            slot: self,
            how: Held::Lock,
        }
    }

    /// The writer's first step in, bounded by `patience` (exit path: a thread may have died
    /// holding nothing, but never block): the lock, which owners check before their window.
    /// The caller then runs one [`barrier::heavy`] for all the slots it claimed and
    /// [`Guard::settle`]s.
    fn try_claim(&self, patience: &mut Patience) -> Option<Guard<'_>> {
        if !self.bias.try_lock_with(|| patience.again()) {
            return None;
        }
        let how = if barrier::available() {
            Held::Claim
        } else {
            Held::Lock
        };
        Some(Guard { slot: self, how })
    }
}

impl Slot {
    /// The events this slot's buffer holds, for one the drain gives up on (its owner inside,
    /// see [`drain`]): counted from the buffer's two atomic words, its length and its count
    /// of entries that are not events ([`Buf::extra`]); no entry is read and nothing the
    /// buffer points to is touched, so an owner interrupted while its buffer grows (its
    /// entries being moved, the old ones freed) costs nothing more than a count. Exact for an
    /// owner that is not running (stopped, or interrupted by the signal handler that runs
    /// this on its thread): each word is read whole, and every change the owner makes to the
    /// count is one store of one of them (an append not finished is not counted: it is not in
    /// the length). An owner still running may change them between the two loads: the count
    /// is then the one at some point of its appends, give or take the append under way.
    fn events_left(&self) -> u64 {
        let inner = self.inner.get();
        // SAFETY: `inner` points into a leaked slot (valid for good); only the two atomic
        // words are read, through a pointer (no reference to the buffer's other fields, which
        // the owner may hold mutably), and the buffer (swapped only by the owner's hand-over,
        // which `unaccounted` reads first, or under the writer's claim, which the caller is)
        // stays where it is.
        let (len, word) = unsafe {
            let buf = ptr::addr_of!((*inner).buf);
            let len = (*ptr::addr_of!((*buf).raw))
                .len_word()
                .load(Ordering::Acquire);
            let word = (*ptr::addr_of!((*buf).extra)).load(Ordering::Acquire);
            (len, word)
        };
        (len as u64).saturating_sub(nonevents(word, len))
    }
}

impl Slot {
    /// The events of this slot that nothing writes or counts, for a slot a drain gave up on:
    /// the buffer its owner is handing over when it is out of the slot (`out`: the fault
    /// switch `hand-over-uncounted` leaves it out) and not yet written, else the slot's.
    fn unaccounted(&self, out: bool) -> u64 {
        let n = self.out_events.load(Ordering::Acquire);
        if n != 0 && out {
            let seq = self.out_seq.load(Ordering::Relaxed);
            return if self.done_seq.load(Ordering::Acquire) >= seq {
                0
            } else {
                n - 1
            };
        }
        self.events_left()
    }
}

impl Guard<'_> {
    /// After the heavy barrier: wait (bounded by `patience`) for an owner still in its window.
    fn settle(&self, patience: &mut Patience) -> bool {
        self.how != Held::Claim || self.slot.bias.owner_left_with(|| patience.again())
    }
}

impl Guard<'_> {
    #[inline]
    #[allow(clippy::mut_from_ref)]
    fn inner(&self) -> &mut Inner {
        // SAFETY: the guard is exclusive for its lifetime (see `Slot`'s Sync note); only one
        // guard exists at a time.
        unsafe { &mut *self.slot.inner.get() }
    }
}

impl Drop for Guard<'_> {
    #[inline]
    fn drop(&mut self) {
        match self.how {
            Held::Window => self.slot.bias.leave_window(),
            Held::Lock | Held::Claim => self.slot.bias.unlock(),
        }
    }
}

/// Iterate over all slots of this process's registry.
pub(crate) fn for_each(mut f: impl FnMut(&'static Slot)) {
    // SeqCst: see `claim` (a slot linked before the exit path's close is listed here).
    let mut p = HEAD.load(Ordering::SeqCst);
    while !p.is_null() {
        // SAFETY: slots are leaked and never freed.
        let s: &'static Slot = unsafe { &*p };
        f(s);
        p = s.next.load(Ordering::Acquire);
    }
}

#[cold]
#[inline(never)]
fn claim(tid: u32) -> &'static Slot {
    // Reuse a slot freed by the writer (its thread exited).
    let mut found: Option<&'static Slot> = None;
    for_each(|s| {
        if found.is_none()
            && s.owner.load(Ordering::Relaxed) == 0
            && s.owner
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            found = Some(s);
        }
    });
    let slot = match found {
        Some(s) => s,
        None => {
            let s: &'static Slot = Box::leak(Box::new(Slot {
                next: AtomicPtr::new(ptr::null_mut()),
                bias: BiasedLock::new(),
                owner: AtomicU32::new(tid),
                life: LifeToken::new(),
                out_events: AtomicU64::new(0),
                out_seq: AtomicU64::new(0),
                done_seq: AtomicU64::new(0),
                inner: UnsafeCell::new(Inner {
                    buf: Buf::with_capacity(SEND_AT + RETRY_AFTER),
                    next_try: SEND_AT,
                }),
            }));
            let mut head = HEAD.load(Ordering::Relaxed);
            loop {
                s.next.store(head, Ordering::Relaxed);
                match HEAD.compare_exchange_weak(
                    head,
                    s as *const Slot as *mut Slot,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(h) => head = h,
                }
            }
            s
        }
    };
    my_slot_ptr().set(slot as *const Slot as *const ());
    // Unarmed (new, or disarmed when its last thread's slot was freed); if the C library
    // refuses, or this runs in a signal handler that interrupted an operation on the thread's
    // robust list (`sys::life`), the reaper goes by the tid alone.
    slot.life.arm(fault_arm_in_op());
    {
        let g = slot.lock();
        let inner = g.inner();
        // Checked after linking the slot (SeqCst, as the exit path's close): either the exit
        // path's drain lists this slot, or this sees the writer closing.
        if !writer::running_seqcst() {
            writer::refused(1);
            return slot;
        }
        // A reused slot may still hold its previous thread's events: a new context either way.
        inner.buf.context(tid);
        inner.buf.put(
            slot,
            Event::ThreadStart {
                t_ns: super::clock::now_raw(),
                tid,
            },
        );
    }
    slot
}

/// Fault switch (`VRAMSHIM_TRACE_FAULT=arm-in-op`): a slot's life token is armed without
/// looking whether the thread is inside an operation on its robust list, to show that the
/// test that interrupts one (`tests/workloads/trace/tests/robust_list.rs`) catches it.
fn fault_arm_in_op() -> bool {
    crate::config::switch_on("VRAMSHIM_TRACE_FAULT", "arm-in-op")
}

#[inline]
fn my_slot() -> &'static Slot {
    let p = my_slot_ptr().get() as *const Slot;
    if p.is_null() {
        return claim(crate::sys::ids::tid());
    }
    // SAFETY: slots are leaked and never freed.
    unsafe { &*p }
}

/// The hot path: append `ev` to the caller's buffer.
#[inline]
pub(crate) fn emit(mut ev: Event) {
    if !writer::ensure_started() {
        writer::refused(1);
        return;
    }
    let slot = my_slot();
    let depth = super::stack_depth();
    let mut records = Vec::new();
    if depth > 0
        && let Event::Alloc(m) | Event::Free(m) = &mut ev
        && m.stack == 0
        && let Some((id, new)) = stacks::capture(depth)
    {
        m.stack = id;
        records = new;
    }
    put_after(slot, records, ev);
}

/// Appends `records` (a newly seen call stack's), then `ev`, to `slot`'s buffer, and hands
/// the buffer over when due.
#[inline]
fn put_after(slot: &'static Slot, records: Vec<Event>, ev: Event) {
    let g = slot.enter();
    if !writer::running() {
        // Checked inside the slot: the exit path may have taken the last buffers since
        // `ensure_started` (its `Stack` records are not events).
        writer::refused(1);
        return;
    }
    let inner = g.inner();
    for r in records {
        inner.buf.put(slot, r);
    }
    inner.buf.put(slot, ev);
    if inner.buf.len() >= inner.next_try {
        hand_over(slot, inner);
    }
}

/// [`emit`] of an allocation or a free, from a `MemOp` the caller keeps (nothing copied
/// into an `Event`; kept out of line so the dispatcher's frames stay small).
///
/// The common case (writer running, slot claimed, no stacks, the asymmetric protocol, room
/// in the buffer, no hand-over due) makes no call, so the function saves no registers; every
/// other case goes to [`emit_memop_slow`] as a tail call, before anything is written.
#[inline(never)]
pub(crate) fn emit_memop<const ALLOC: bool>(m: &MemOp) {
    if super::stack_depth() > 0
        || !put_fast(if ALLOC { Kind::Alloc } else { Kind::Free }, || MemOp {
            ..*m
        })
    {
        emit_memop_slow::<ALLOC>(m)
    }
}

/// The owner's fast path of [`emit_memop`] and [`emit_torch`]: appends one `kind` entry
/// holding `op()` to the caller's buffer when the writer runs, the caller's slot is claimed,
/// the asymmetric protocol is there ([`Slot::enter`]'s owner side, inline), the buffer has
/// room and no hand-over is due; else writes nothing and says so (the caller takes its
/// slow path).
#[inline(always)]
fn put_fast(kind: Kind, op: impl FnOnce() -> MemOp) -> bool {
    if !barrier::available() {
        return false;
    }
    let p = my_slot_ptr().get() as *const Slot;
    if p.is_null() {
        return false;
    }
    // SAFETY: slots are leaked and never freed.
    let slot = unsafe { &*p };
    if !slot.bias.try_window() {
        return false;
    }
    // SAFETY: in the window, the writer not holding the lock: the owner has the buffer to
    // itself until it leaves the window (see `Slot`'s Sync note).
    let inner = unsafe { &mut *slot.inner.get() };
    let raw = &mut inner.buf.raw;
    let len = raw.len();
    // The writer's state is read inside the window: a window opened after the exit path's
    // barrier sees it closing (the slow path then counts the event), and one opened before
    // is waited for by its drain, which takes what it appended.
    if !writer::running() || len == 0 || len == raw.capacity() || len + 1 >= inner.next_try {
        slot.bias.leave_window();
        return false;
    }
    // SAFETY: len < capacity (checked above), so the entry at `len` lies inside the
    // allocation; both fields are written before the length counts it.
    unsafe {
        let e = raw.as_mut_ptr().add(len);
        ptr::addr_of_mut!((*e).kind).write(kind);
        ptr::addr_of_mut!((*e).op).write(op());
        raw.set_len(len + 1);
    }
    slot.bias.leave_window();
    true
}

/// [`emit_memop`], every case.
#[inline(never)]
fn emit_memop_slow<const ALLOC: bool>(m: &MemOp) {
    if !writer::ensure_started() {
        writer::refused(1);
        return;
    }
    let slot = my_slot();
    if super::stack_depth() > 0 && m.stack == 0 {
        return emit_memop_stack(slot, ALLOC, m);
    }
    let g = slot.enter();
    if !writer::running() {
        writer::refused(1);
        return;
    }
    let inner = g.inner();
    inner.buf.put_op::<ALLOC>(slot, m);
    if inner.buf.len() >= inner.next_try {
        hand_over(slot, inner);
    }
}

/// [`emit_memop`] with a call stack captured (`VRAMSHIM_STACKS`): its own frame, so that the
/// stack buffer costs the stackless path nothing.
#[inline(never)]
fn emit_memop_stack(slot: &'static Slot, alloc: bool, m: &MemOp) {
    let mut with = MemOp { ..*m };
    let mut records = Vec::new();
    if let Some((id, new)) = stacks::capture(super::stack_depth()) {
        with.stack = id;
        records = new;
    }
    let ev = if alloc {
        Event::Alloc(with)
    } else {
        Event::Free(with)
    };
    put_after(slot, records, ev);
}

/// A `Torch` event's `tid` that stands for the thread whose buffer holds it (the tracker's
/// events: always its own thread's), filled in by [`encode`] from the buffer's `Context`,
/// so the allocating thread neither reads nor stores its id (a kernel tid is never 0).
pub(crate) const OWN_THREAD: u32 = 0;

/// A `Torch` event as a buffer entry: its fields in a `MemOp`'s places (the action in
/// `flags`, the segment's base in `result` and `latency_ns`, its low and high halves), so
/// the allocating thread stores it with the same few moves as an allocation, and builds,
/// moves and drops no `Event` ([`emit_torch`]). Its [`TorchFields`] read it back.
#[inline(always)]
fn torch_entry(t: &TorchOp) -> MemOp {
    MemOp {
        t_ns: t.t_ns,
        tid: t.tid,
        api: Api::CudaMalloc,
        kind: AllocKind::Runtime,
        flags: t.action,
        device: t.device,
        stream: t.stream,
        addr: t.addr,
        size: t.size,
        result: t.segment as u32 as i32,
        latency_ns: (t.segment >> 32) as u32,
        stack: t.stack,
    }
}

/// A `Torch` entry as the coder reads it, field by field ([`torch_entry`]'s places).
impl TorchFields for Raw {
    #[inline(always)]
    fn t_ns(&self) -> u64 {
        self.op.t_ns
    }
    #[inline(always)]
    fn tid(&self) -> u32 {
        self.op.tid
    }
    #[inline(always)]
    fn action(&self) -> u8 {
        self.op.flags
    }
    #[inline(always)]
    fn device(&self) -> i32 {
        self.op.device
    }
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.op.addr
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.op.size
    }
    #[inline(always)]
    fn stream(&self) -> u64 {
        self.op.stream
    }
    #[inline(always)]
    fn segment(&self) -> u64 {
        self.op.result as u32 as u64 | (self.op.latency_ns as u64) << 32
    }
    #[inline(always)]
    fn stack(&self) -> u32 {
        self.op.stack
    }
}

/// [`emit`] of `Event::Torch(*t)`: one entry in the caller's buffer ([`torch_entry`]),
/// nothing in [`Buf::others`]. Such an event carries no native stack (its `stack` is the
/// Python stack the tracker found), so the common case is [`emit_memop`]'s ([`put_fast`]:
/// no call, a few stores in the owner's window); every other case goes to
/// [`emit_torch_slow`]. Inlined into the tracker, which then stores the entry's fields
/// where they are, without a `TorchOp` in between.
#[inline(always)]
pub(crate) fn emit_torch(t: &TorchOp) {
    if !put_fast(Kind::Torch, || torch_entry(t)) {
        // A copy made here: the caller's `TorchOp` is then never in memory on the fast path.
        emit_torch_slow(&t.clone())
    }
}

/// [`emit_torch`], every case.
#[inline(never)]
fn emit_torch_slow(t: &TorchOp) {
    if !writer::ensure_started() {
        writer::refused(1);
        return;
    }
    let slot = my_slot();
    let g = slot.enter();
    if !writer::running() {
        writer::refused(1);
        return;
    }
    let inner = g.inner();
    inner.buf.put_torch(slot, torch_entry(t));
    if inner.buf.len() >= inner.next_try {
        hand_over(slot, inner);
    }
}

/// Live device bytes (allocated minus freed) per device, for `Counter` records: counted
/// where the events are encoded (and where a buffer is dropped), not on the hot path.
static LIVE: [AtomicI64; MAX_DEV] = [const { AtomicI64::new(0) }; MAX_DEV];

/// What an allocation or a free changes in the live bytes of its device, if anything.
#[inline]
fn live_delta(kind: Kind, m: &MemOp) -> Option<(usize, i64)> {
    let sign = match kind {
        Kind::Alloc if m.addr != 0 => 1i64,
        Kind::Free => -1i64,
        _ => return None,
    };
    // A negative device becomes a huge index: one compare covers both ends.
    let d = m.device as u32 as usize;
    if m.result != 0 || !m.kind.is_device() || d >= MAX_DEV {
        return None;
    }
    Some((d, sign.wrapping_mul(m.size as i64)))
}

/// Adds the live-byte changes of `deltas` (per device) to the process's counts.
fn add_live(deltas: &[i64; MAX_DEV]) {
    for (c, &v) in LIVE.iter().zip(deltas) {
        if v != 0 {
            c.fetch_add(v, Ordering::Relaxed);
        }
    }
}

/// Counts a buffer that is dropped unencoded (its events are lost, not its live bytes).
fn count_live_of(b: &Buf) {
    let mut deltas = [0i64; MAX_DEV];
    for r in b.raw.iter() {
        if let Some((d, v)) = live_delta(r.kind, &r.op) {
            deltas[d] = deltas[d].wrapping_add(v);
        }
    }
    add_live(&deltas);
}

/// Where a hand-over is when it calls the test seam ([`on_hand_over`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOverPoint {
    /// The full buffer is out of the slot, not yet queued for the writer.
    Taken,
    /// Inside the send to the writer ([`writer::send`]), signals blocked, just before the
    /// channel's own send.
    Sending,
    /// The buffer is queued; the slot has not yet got its new one.
    Queued,
}

/// The test seam's function (`fn(HandOverPoint)`), 0 when unset.
static HAND_OVER_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Tests: `hook` is called on the owner's thread at the points of every hand-over (None:
/// removed), where a signal handler may interrupt it.
pub(crate) fn on_hand_over(hook: Option<fn(HandOverPoint)>) {
    HAND_OVER_HOOK.store(hook.map_or(0, |f| f as usize), Ordering::Release);
}

#[inline]
pub(crate) fn hand_over_at(p: HandOverPoint) {
    let f = HAND_OVER_HOOK.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: a non-zero value was stored from a `fn(HandOverPoint)` by `on_hand_over`.
        let f: fn(HandOverPoint) = unsafe { std::mem::transmute::<usize, fn(HandOverPoint)>(f) };
        f(p);
    }
}

/// Hands the slot's full buffer to the writer (or keeps it when the writer is busy).
///
/// The buffer is out of the slot meanwhile, on this thread's stack: an exit run by a signal
/// handler that interrupted this thread here (or one that gives up on the slot of a thread
/// stopped here) finds its events by `out_events`, set before the buffer leaves the slot and
/// cleared once the slot has a buffer again, each a single store (the handler sees this
/// thread's stores in order: `compiler_fence`). Once the buffer is queued, the writer marks it
/// written (`done_seq`), so an exit that finds it queued and then written does not count it too
/// ([`Slot::unaccounted`]).
#[cold]
#[inline(never)]
fn hand_over(slot: &'static Slot, inner: &mut Inner) {
    let seq = slot.out_seq.load(Ordering::Relaxed) + 1;
    slot.out_seq.store(seq, Ordering::Relaxed);
    slot.out_events
        .store(inner.buf.events() + 1, Ordering::Release);
    compiler_fence(Ordering::SeqCst);
    let buf = std::mem::take(&mut inner.buf);
    hand_over_at(HandOverPoint::Taken);
    let from = || Handed { slot, seq };
    match writer::send(buf, from()) {
        Ok(spare) => {
            hand_over_at(HandOverPoint::Queued);
            inner.buf = spare;
            inner.next_try = SEND_AT;
            back_in(slot);
            if writer::backlog() > HIGH_WATER {
                wait_for_writer();
            }
        }
        Err(buf) if buf.len() >= MAX_BUF => match throttle(buf, from) {
            Ok(spare) => {
                inner.buf = spare;
                inner.next_try = SEND_AT;
                back_in(slot);
            }
            Err(mut buf) => {
                // The writer has not taken anything for a long while: drop, and count it
                // (counted before it is marked done: an exit in between counts it twice,
                // never not at all).
                writer::count_lost(events_in(&buf));
                from().written();
                count_live_of(&buf);
                buf.clear();
                inner.buf = buf;
                inner.next_try = SEND_AT;
                back_in(slot);
            }
        },
        Err(buf) => {
            // Writer busy: keep the events and try again a little later.
            inner.next_try = buf.len() + RETRY_AFTER;
            inner.buf = buf;
            back_in(slot);
        }
    }
}

/// The end of [`hand_over`]: the slot holds its buffer again (whatever it holds is in it).
#[inline]
fn back_in(slot: &Slot) {
    compiler_fence(Ordering::SeqCst);
    slot.out_events.store(0, Ordering::Release);
}

/// Many busy threads on few cores starve the writer thread: step aside (short sleeps, at
/// most `THROTTLE_NS` per full buffer) so it gets the CPU, before dropping anything, as
/// bytehound throttles its producers. Only a thread that has `MAX_BUF` unwritten events while
/// the channel is full ever gets here.
#[cold]
fn throttle(mut buf: Buf, from: impl Fn() -> Handed) -> Result<Buf, Buf> {
    let deadline = crate::sys::clock::now_ns() + THROTTLE_NS;
    loop {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000,
        };
        // SAFETY: ts is a valid timespec; the remainder pointer may be null.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        match writer::send(buf, from()) {
            Ok(spare) => return Ok(spare),
            Err(back) => buf = back,
        }
        if crate::sys::clock::now_ns() > deadline {
            return Err(buf);
        }
    }
}

/// The writer is far behind: sleep (bounded) until its backlog is under the high-water mark.
#[cold]
fn wait_for_writer() {
    let deadline = crate::sys::clock::now_ns() + THROTTLE_NS;
    while writer::backlog() > HIGH_WATER && crate::sys::clock::now_ns() < deadline {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000,
        };
        // SAFETY: ts is a valid timespec; the remainder pointer may be null.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

/// Writer side: take every slot's partial buffer. `f` gets `None` first, while the slots the
/// buffers came from are still held (to write the buffers their owners handed over before:
/// older than the partial ones), then each buffer (to [`encode`]). See [`Drained`] for what it
/// says. `patience` bounds the waits for owners inside their slots, all slots together.
/// `probe` (a tick after one whose barrier failed): the barrier is tried alone first, and
/// while it still fails nothing is claimed ([`drain`]).
/// `exiting`: the slot of the thread whose exit this drain serves (given up at once when that
/// thread is inside it, see [`drain`]); the calling thread's own ([`own_slot`]) but for the
/// writer thread finishing the trace for an `_exit`.
pub(crate) fn drain_all(
    f: impl FnMut(Option<Buf>),
    patience: Patience,
    wait_own: bool,
    probe: bool,
    exiting: SlotRef,
) -> Drained {
    let mut all = Vec::new();
    for_each(|s| all.push(s));
    drain_for(&all, f, patience, wait_own, probe, exiting.0.cast())
}

/// A thread's slot as a plain address (null: the thread has none), for naming one thread's
/// slot to a drain run by another ([`drain_all`]'s `exiting`).
#[derive(Clone, Copy)]
pub(crate) struct SlotRef(*const ());

impl SlotRef {
    pub(crate) fn from_raw(p: *mut ()) -> SlotRef {
        SlotRef(p)
    }

    pub(crate) fn into_raw(self) -> *mut () {
        self.0.cast_mut()
    }
}

/// The calling thread's slot (one thread-local load).
pub(crate) fn own_slot() -> SlotRef {
    SlotRef(my_slot_ptr().get())
}

/// What [`drain`] did.
#[derive(Default)]
pub(crate) struct Drained {
    /// False when nothing could be taken (the barrier failed: the buffers wait for the next
    /// time).
    pub taken: bool,
    /// The slots whose buffers were not taken: the calling thread's own, when it is inside it
    /// (a signal handler interrupted it there and exits: it will never finish the append nor
    /// hand the buffer over), those whose owners stayed inside through the drain's patience,
    /// and every slot claimed when the barrier failed. At exit nothing takes them later: the
    /// caller counts their events lost ([`unaccounted`], once the buffers handed over before
    /// are written).
    pub given_up: Vec<&'static Slot>,
    /// Waits made for owners inside their slots (the tests count them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub waits: u64,
}

/// Events that the slots `given_up` by a drain hold and that nothing else will write or count.
/// No entry is read (see [`Slot::unaccounted`]).
pub(crate) fn unaccounted(given_up: &[&'static Slot]) -> u64 {
    let out = !fault_hand_over_uncounted();
    given_up.iter().map(|s| s.unaccounted(out)).sum()
}

/// Fault switch of the drain (`VRAMSHIM_SLOTS_FAULT=barrier-drop`, read by the test that shows
/// it catches it): no slot is given up when the barrier fails (their buffers, untaken, are
/// then neither written nor counted at exit).
fn fault_barrier_drop() -> bool {
    crate::config::switch_on("VRAMSHIM_SLOTS_FAULT", "barrier-drop")
}

/// Fault switch of the drain (`VRAMSHIM_SLOTS_FAULT=barrier-no-settle`, read by the test that
/// shows it catches it): when the barrier fails, the claimed slots are given up at once, their
/// owners not waited for (one in its window then appends after its slot was counted).
fn fault_barrier_no_settle() -> bool {
    crate::config::switch_on("VRAMSHIM_SLOTS_FAULT", "barrier-no-settle")
}

/// The barrier failed: no owner is known to be out of its window (the owner raises its flag
/// with a plain store, then reads the lock; the barrier is what orders the two for the
/// drain). Waits a millisecond, after which an owner's flag raised before it read the lock is
/// in practice visible (store buffers drain in far less; a thread switched out has drained
/// its own), then, bounded by `patience`, for each claimed slot's owner to leave. An owner
/// that stays is counted as it is ([`Slot::events_left`]: exact while it does not run).
fn settle_unseen(held: &[Guard<'static>], patience: &mut Patience) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: ts is a valid timespec; the remainder pointer may be null.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    for g in held.iter().filter(|g| g.how == Held::Claim) {
        patience.next_slot();
        let _ = g.slot.bias.owner_left_with(|| patience.again());
    }
}

/// Fault switch of the drain (`VRAMSHIM_SLOTS_FAULT=hand-over-uncounted`): a given-up slot's
/// buffer is counted, not the one its owner was handing over (an exit that interrupted the
/// hand-over then counts nothing of it).
fn fault_hand_over_uncounted() -> bool {
    crate::config::switch_on("VRAMSHIM_SLOTS_FAULT", "hand-over-uncounted")
}

/// [`drain_for`] with the calling thread's own slot as the exiting one (the unit tests' way).
#[cfg(test)]
fn drain(
    slots: &[&'static Slot],
    f: impl FnMut(Option<Buf>),
    patience: Patience,
    wait_own: bool,
    probe: bool,
) -> Drained {
    let mine = my_slot_ptr().get() as *const Slot;
    drain_for(slots, f, patience, wait_own, probe, mine)
}

/// Claim every slot, one barrier for all of them, take each buffer, then hand them to `f`
/// (after `f(None)`, see [`drain_all`]).
///
/// Order: an owner may hand a full buffer over (into the writer's queue) just before its
/// partial one is taken here. Writing the partial one first would put a thread's later
/// events before its earlier ones; so the queue is emptied (`f(None)`) while every slot a
/// buffer was taken from is still held, when no owner of one can hand anything over.
///
/// The exiting thread's slot (`mine`: the calling thread's own, or the one of the thread whose
/// `_exit` the writer thread serves), when that thread is inside it, is given up at once: it
/// cannot leave while it runs or waits for this (`wait_own`, under the fault switch
/// `own-wait`: it is waited for like any other, through all of `patience`, in vain).
///
/// `probe`: the barrier is tried alone first, and while it fails nothing is claimed (taken:
/// false, nothing given up). For a tick after one whose barrier failed: nothing could be
/// taken, and claiming the slots would make every owner that comes wait through the drain's
/// settling (a millisecond and more) for nothing; the buffers wait for a tick where the
/// barrier works. Never at exit, where every slot is claimed and given up counted.
fn drain_for(
    slots: &[&'static Slot],
    mut f: impl FnMut(Option<Buf>),
    mut patience: Patience,
    wait_own: bool,
    probe: bool,
    mine: *const Slot,
) -> Drained {
    if probe && !barrier::heavy() {
        return Drained::default();
    }
    let mut given_up: Vec<&'static Slot> = Vec::new();
    let held: Vec<Guard<'static>> = slots
        .iter()
        .filter_map(|&s| {
            if !wait_own && ptr::eq(s, mine) && s.bias.owner_is_inside() {
                given_up.push(s);
                return None;
            }
            patience.next_slot();
            let g = s.try_claim(&mut patience);
            if g.is_none() {
                given_up.push(s);
            }
            g
        })
        .collect();
    if held.iter().any(|g| g.how == Held::Claim) && !barrier::heavy() {
        // The guards' drops withdraw the claims; the buffers wait for next time, and at exit,
        // where there is none, they are counted (they cannot be taken without the barrier:
        // an owner may be in its window unseen).
        if !fault_barrier_drop() {
            // Given up once their owners are out: one in its window unseen would otherwise
            // append (or hand its buffer over) after the count, neither written nor counted.
            // The claims are still held (an owner that comes now takes the lock, and waits);
            // then what they handed over meanwhile is taken off the queue (`f(None)`, as below).
            if !fault_barrier_no_settle() {
                settle_unseen(&held, &mut patience);
                f(None);
            }
            given_up.extend(held.iter().map(|g| g.slot));
        }
        return Drained {
            taken: false,
            given_up,
            waits: patience.used,
        };
    }
    // Swap the buffers out quickly (owners that meet a claim wait on the lock), write after.
    let mut taken = Vec::with_capacity(held.len());
    let mut holding = Vec::with_capacity(held.len());
    for g in held {
        patience.next_slot();
        if !g.settle(&mut patience) {
            given_up.push(g.slot);
            continue;
        }
        let inner = g.inner();
        if inner.buf.is_empty() {
            continue;
        }
        let spare = writer::spare_buffer();
        taken.push(std::mem::replace(&mut inner.buf, spare));
        inner.next_try = SEND_AT;
        holding.push(g);
    }
    f(None);
    drop(holding);
    for buf in taken {
        f(Some(buf));
    }
    Drained {
        taken: true,
        given_up,
        waits: patience.used,
    }
}

/// Runs `f` with the calling thread inside its own slot (its window, or the lock where the
/// window is not available), where a signal handler that interrupted one of its appends runs
/// (`tracer::testing::inside_own_slot`). Starts the writer and claims a slot if need be.
pub(crate) fn inside_own_slot(f: impl FnOnce()) {
    if !writer::ensure_started() {
        return f();
    }
    let _inside = my_slot().enter();
    f();
}

/// Live bytes per device of every event encoded (or dropped) so far.
pub(crate) fn live_totals() -> [i64; MAX_DEV] {
    std::array::from_fn(|d| LIVE[d].load(Ordering::Relaxed))
}

/// The slots of threads that no longer exist, with their tids, for [`free_dead`]. Asked
/// before the tick takes the buffers: a thread found alive here may append its last events
/// and exit before they are taken, and its `ThreadExit` record would then be written before
/// them; its slot waits for the next time instead.
///
/// A slot's thread is the one holding its [`LifeToken`], not whichever thread has its tid
/// now: a thread that exited and whose tid a new thread got before this look is found ended
/// by its token (by the tid it would look alive until the new thread exits, and both
/// `ThreadExit` records would come then). The tid decides only when the token says nothing
/// (`by_tid_only`: the fault switch that looks by the tid alone), and a tid that no longer
/// exists is an ended thread either way. One caller at a time (the writer, under its lock).
pub(crate) fn dead_threads(pid: u32, by_tid_only: bool) -> Vec<(&'static Slot, u32)> {
    let mut dead = Vec::new();
    for_each(|s| {
        let tid = s.owner.load(Ordering::Acquire);
        if tid == 0 || tid == pid {
            return;
        }
        if !by_tid_only && s.life.ended() == Some(true) {
            dead.push((s, tid));
            return;
        }
        // SAFETY: tgkill with signal 0 only checks that the thread exists.
        let r = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                pid as libc::c_long,
                tid as libc::c_long,
                0,
            )
        };
        if r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            dead.push((s, tid));
        }
    });
    dead
}

/// Frees the slots [`dead_threads`] found, once their buffers have been taken (their
/// threads are gone: nothing was appended since). `on_dead` gets each tid freed.
pub(crate) fn free_dead(dead: &[(&'static Slot, u32)], mut on_dead: impl FnMut(u32)) {
    for &(s, tid) in dead {
        // Its thread has ended: the token goes to the slot's next thread.
        s.life.disarm();
        if s.owner
            .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            on_dead(tid);
        }
    }
}

/// Forked child: the parent's slots belong to threads that do not exist here and may be
/// locked forever. Forget them all (leaked), without touching their locks.
pub(crate) fn on_fork_child() {
    HEAD.store(ptr::null_mut(), Ordering::Relaxed);
    for c in &LIVE {
        c.store(0, Ordering::Relaxed);
    }
    my_slot_ptr().set(ptr::null());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn new_slot() -> &'static Slot {
        Box::leak(Box::new(Slot {
            next: AtomicPtr::new(ptr::null_mut()),
            bias: BiasedLock::new(),
            owner: AtomicU32::new(1),
            life: LifeToken::new(),
            out_events: AtomicU64::new(0),
            out_seq: AtomicU64::new(0),
            done_seq: AtomicU64::new(0),
            inner: UnsafeCell::new(Inner {
                buf: Buf::with_capacity(SEND_AT),
                next_try: usize::MAX,
            }),
        }))
    }

    /// The owner appends (the hot path's way in) while another thread drains the slot as fast
    /// as it can (the writer's way): every event arrives once, in order, in whole records.
    /// `VRAMSHIM_SLOTS_FAULT=nowait` makes the drain skip waiting for the owner: this fails.
    #[test]
    fn drains_racing_the_owner_tear_and_lose_nothing() {
        barrier::init();
        let broken = crate::config::switch_on("VRAMSHIM_SLOTS_FAULT", "nowait");
        let slot = new_slot();
        const N: u64 = 2_000_000;
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let owner = {
            let done = done.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    let g = slot.enter();
                    let inner = g.inner();
                    inner.buf.put(
                        slot,
                        Event::Alloc(MemOp {
                            t_ns: i,
                            tid: 1,
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
                        }),
                    );
                }
                done.store(true, Ordering::Release);
            })
        };
        let mut chunks = Vec::new();
        let mut drains = 0u64;
        while !done.load(Ordering::Acquire) {
            if broken {
                // The race the protocol prevents: take the buffer while the owner may write.
                if let Some(g) = slot.try_claim(&mut patient()) {
                    let inner = g.inner();
                    if !inner.buf.is_empty() {
                        chunks.push(std::mem::replace(
                            &mut inner.buf,
                            Buf::with_capacity(SEND_AT),
                        ));
                    }
                }
            } else {
                drain(&[slot], |b| chunks.extend(b), patient(), false, false);
            }
            drains += 1;
            // The writer drains every 50 ms, not back to back: a drainer spinning without
            // pause against a spinning owner, with the other tests' threads on the same two
            // cores, made this test take 2-7 minutes in CI instead of 7 s alone.
            std::thread::yield_now();
        }
        owner.join().unwrap();
        drain(&[slot], |b| chunks.extend(b), patient(), false, false);
        let mut file = Vec::new();
        {
            let mut w = vramshim_trace::TraceWriter::new(&mut file, &Default::default()).unwrap();
            let mut enc = RecordEncoder::new();
            for b in &mut chunks {
                encode(&mut enc, b);
                w.write_records(enc.bytes(), enc.stats()).unwrap();
            }
            w.finish().unwrap();
        }
        let mut r = vramshim_trace::TraceReader::from_reader(std::io::Cursor::new(file)).unwrap();
        let mut e = Event::Lost { t_ns: 0, count: 0 };
        let mut next = 0u64;
        let mut prev_t = 0u64;
        while r.next_into(&mut e).unwrap() {
            if let Event::Alloc(m) = &e {
                // Times are raw until encoded (converted then): in order, not equal to `i`.
                assert!(m.t_ns >= prev_t, "event {next}: time went backward");
                prev_t = m.t_ns;
                assert_eq!((m.size, m.addr), (next, 0x1000 + (next << 8)));
                next += 1;
            }
        }
        assert_eq!(next, N, "events decoded after {drains} drains");
        assert!(drains > 10, "the drains raced the owner ({drains})");
    }

    /// A `Torch` event stored as a buffer entry ([`torch_entry`]) decodes to the event a
    /// generic `emit` would have written, every field (the segment's high half included),
    /// in its place among the other entries.
    #[test]
    fn torch_entries_decode_to_their_events() {
        let t = TorchOp {
            t_ns: 0,
            tid: 77,
            action: vramshim_trace::torch_action::OOM,
            device: -3,
            addr: 0xdead_beef_0123,
            size: u64::MAX - 5,
            stream: 0x7f00_0000_1234,
            segment: 0xffff_8000_0000_0001,
            stack: u32::MAX,
        };
        let raw = Raw {
            kind: Kind::Torch,
            op: torch_entry(&t),
        };
        assert_eq!(raw.to_op(), t);
        let slot = new_slot();
        let mut b = Buf::with_capacity(8);
        b.put_torch(slot, torch_entry(&t));
        b.put(
            slot,
            Event::Torch(TorchOp {
                stack: 1,
                ..t.clone()
            }),
        );
        b.put_torch(
            slot,
            torch_entry(&TorchOp {
                stack: 2,
                ..t.clone()
            }),
        );
        assert_eq!(events_in(&b), 3);
        let got = torch_ops_written(&mut b);
        let want: Vec<TorchOp> = (0..3)
            .map(|s| TorchOp {
                stack: [u32::MAX, 1, 2][s],
                ..t.clone()
            })
            .collect();
        assert_eq!(got, want);
    }

    /// The tracker's `Torch` entries carry no thread ([`OWN_THREAD`]): each decodes with the
    /// thread of the buffer that holds it (its slot's owner, as a buffer taken over by a
    /// new thread has the new one's), while an event given its own thread keeps it.
    #[test]
    fn torch_entries_of_no_thread_are_their_buffers() {
        let t = TorchOp {
            t_ns: 0,
            tid: OWN_THREAD,
            action: vramshim_trace::torch_action::ALLOC,
            device: 0,
            addr: 0x7f00_0000_1000,
            size: 512,
            stream: 0,
            segment: 0x7f00_0000_0000,
            stack: 3,
        };
        let slot = new_slot();
        slot.owner.store(4242, Ordering::Relaxed);
        let mut b = Buf::with_capacity(8);
        b.put_torch(slot, torch_entry(&t));
        b.put_torch(
            slot,
            torch_entry(&TorchOp {
                tid: 77,
                ..t.clone()
            }),
        );
        b.put_torch(slot, torch_entry(&t));
        let tids: Vec<u32> = torch_ops_written(&mut b).iter().map(|o| o.tid).collect();
        assert_eq!(tids, [4242, 77, 4242]);
        // The slot's next owner: a buffer started afresh names it.
        slot.owner.store(4343, Ordering::Relaxed);
        let mut b = Buf::with_capacity(8);
        b.put_torch(slot, torch_entry(&t));
        let tids: Vec<u32> = torch_ops_written(&mut b).iter().map(|o| o.tid).collect();
        assert_eq!(tids, [4343]);
    }

    /// The `Torch` events of `b` as the writer thread encodes them and a reader reads them
    /// back (their times zeroed).
    fn torch_ops_written(b: &mut Buf) -> Vec<TorchOp> {
        let mut file = Vec::new();
        {
            let mut w = vramshim_trace::TraceWriter::new(&mut file, &Default::default()).unwrap();
            let mut enc = RecordEncoder::new();
            encode(&mut enc, b);
            w.write_records(enc.bytes(), enc.stats()).unwrap();
            w.finish().unwrap();
        }
        let mut r = vramshim_trace::TraceReader::from_reader(std::io::Cursor::new(file)).unwrap();
        let mut e = Event::Lost { t_ns: 0, count: 0 };
        let mut got = Vec::new();
        while r.next_into(&mut e).unwrap() {
            if let Event::Torch(op) = &e {
                got.push(TorchOp {
                    t_ns: 0,
                    ..op.clone()
                });
            }
        }
        got
    }

    /// Rows of `Torch` entries (coded in one call each) with other entries between them
    /// decode to the events in their order, every field.
    #[test]
    fn rows_of_torch_entries_decode_in_order() {
        let slot = new_slot();
        let mut b = Buf::with_capacity(64);
        let mut want = Vec::new();
        for i in 0..40u64 {
            let t = TorchOp {
                t_ns: 0,
                tid: 77,
                action: (i % 3) as u8,
                device: 0,
                addr: 0x7f00_0000_0000 + (i % 7) * 512,
                size: 512 << (i % 4),
                stream: 0,
                segment: 0x7f00_0000_0000,
                stack: (i % 5) as u32,
            };
            if i % 9 == 4 {
                b.put(slot, Event::Torch(t.clone()));
            } else {
                b.put_torch(slot, torch_entry(&t));
            }
            want.push(t);
        }
        let got = torch_ops_written(&mut b);
        assert_eq!(got, want);
    }

    /// Not a check, a measure (`scripts/bench writer`): the writer thread's coding of a
    /// real run's PyTorch events as its buffers hold them (a GPT-2 run's tensor events, each
    /// thread's in buffers of 245 entries, about a native step's, coded as consecutive
    /// chained contexts, the whole run 8 times over; times raw TSC values when the trace
    /// clock runs on the TSC, as in a traced process). Under callgrind with `--toggle-collect='*code_buffers*'`, the count
    /// divided by the events printed is the writer's instructions an event, from the entry
    /// in the buffer to the coded bytes.
    #[test]
    #[ignore]
    fn writer_cost_of_gpt2_buffers() {
        super::super::clock::init();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../trace/examples/data/gpt2-tensors.vramtrace"
        );
        let r = vramshim_trace::TraceReader::open(path).unwrap();
        let ops: Vec<TorchOp> = r
            .filter_map(|e| match e.unwrap() {
                Event::Torch(op) => Some(op),
                _ => None,
            })
            .collect();
        let raw0 = super::super::clock::now_raw();
        let t0 = ops[0].t_ns;
        let mut by_tid: std::collections::BTreeMap<u32, Vec<TorchOp>> = Default::default();
        for op in &ops {
            by_tid.entry(op.tid).or_default().push(op.clone());
        }
        let slot = new_slot();
        // The buffers as the writer gets them (it converts their times in place: each
        // round codes buffers made afresh).
        let make = || {
            let (mut bufs, mut events) = (Vec::new(), 0);
            for (tid, ops) in &by_tid {
                for chunk in ops.chunks(245) {
                    let mut b = Buf::with_capacity(chunk.len() + 1);
                    b.context(*tid);
                    for op in chunk {
                        let mut t = op.clone();
                        // About 2.5 TSC ticks a ns.
                        t.t_ns = raw0 + op.t_ns.wrapping_sub(t0) * 5 / 2;
                        b.put_torch(slot, torch_entry(&t));
                        events += 1;
                    }
                    bufs.push(b);
                }
            }
            (bufs, events)
        };
        let mut enc = RecordEncoder::new();
        let (mut bytes, mut events, mut n) = (0, 0, 0);
        for _ in 0..8 {
            let (mut bufs, e) = make();
            bytes += code_buffers(&mut enc, &mut bufs);
            events += e;
            n += bufs.len();
        }
        println!(
            "{events} events in {n} buffers, {:.2} bytes an event, TSC clock: {}",
            bytes as f64 / events as f64,
            super::super::clock::name()
        );
    }

    #[inline(never)]
    fn code_buffers(enc: &mut RecordEncoder, bufs: &mut [Buf]) -> usize {
        let mut bytes = 0;
        for b in bufs.iter_mut() {
            encode(enc, b);
            bytes += enc.bytes().len();
        }
        bytes
    }

    fn alloc(i: u64) -> Event {
        Event::Alloc(MemOp {
            t_ns: i,
            tid: 1,
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
        })
    }

    /// A slot whose buffer holds `n` events (a `ThreadStart`, allocations), with entries that
    /// are not events among them (two `Context`s, a `Stack` record before each allocation).
    fn slot_holding(n: u64) -> &'static Slot {
        let slot = new_slot();
        let g = slot.lock();
        let b = &mut g.inner().buf;
        b.put(slot, Event::ThreadStart { t_ns: 0, tid: 1 });
        b.context(1);
        for i in 1..n {
            b.put(
                slot,
                Event::Stack {
                    id: i as u32,
                    frames: vec![0x10],
                },
            );
            b.put(slot, alloc(i));
        }
        drop(g);
        slot
    }

    /// The calling thread's slot is `slot` for the rest of `f`.
    fn as_mine<R>(slot: &'static Slot, f: impl FnOnce() -> R) -> R {
        let old = my_slot_ptr().replace(slot as *const Slot as *const ());
        let r = f();
        my_slot_ptr().set(old);
        r
    }

    /// The exit drain's patience without its time limit.
    fn patient() -> Patience {
        Patience::new(1 << 20, None)
    }

    /// A drain's result: whether it took the buffers, and the events of those it gave up on.
    fn drained(d: Drained) -> (bool, u64) {
        (d.taken, unaccounted(&d.given_up))
    }

    fn taken_events(mut bufs: Vec<Buf>) -> u64 {
        bufs.iter_mut().map(|b| events_in(b)).sum()
    }

    /// A buffer's events counted from its two lengths are those its entries hold.
    #[test]
    fn events_left_counts_events_not_entries() {
        let slot = slot_holding(9);
        let g = slot.lock();
        let b = &g.inner().buf;
        assert_eq!(events_in(b), 9);
        assert!(b.len() > 9);
        drop(g);
        assert_eq!(slot.events_left(), 9);
    }

    /// An owner stopped, or interrupted by the handler that runs the exit, at any point of
    /// appending an entry that is not an event (its count stored, the entry not yet in the
    /// length) is counted exactly: the count is one store, and the length says whether the
    /// entry it counts is there yet. (Counting it before the length includes it, as a plain
    /// count of such entries did, undercounts by one there.)
    #[test]
    fn a_count_taken_mid_append_is_exact() {
        let slot = slot_holding(4);
        let g = slot.lock();
        let b = &mut g.inner().buf;
        assert_eq!(slot.events_left(), 4);
        // Stopped between counting a `Context` and appending it.
        b.nonevent_next();
        assert_eq!(slot.events_left(), 4, "counted, not yet appended");
        b.raw.push(Raw {
            kind: Kind::Context,
            op: blank_op(1),
        });
        assert_eq!(slot.events_left(), 4, "appended");
        b.put(
            slot,
            Event::Stack {
                id: 99,
                frames: vec![0x10],
            },
        );
        assert_eq!(slot.events_left(), 4, "a Stack record is no event");
        b.put(slot, alloc(99));
        assert_eq!(slot.events_left(), 5);
        assert_eq!(events_in(b), 5);
        drop(g);
    }

    /// The calling thread inside its own slot (a signal handler that exits interrupted it
    /// there: here the window or the lock is held by this thread, as the handler would find
    /// it) is given up at once, its events reported for counting; outside it, its buffer is
    /// taken like any other's.
    #[test]
    fn the_callers_own_slot_is_given_up_while_it_is_inside() {
        barrier::init();
        for how in ["window", "lock"] {
            let slot = slot_holding(7);
            let mut bufs = Vec::new();
            let d = as_mine(slot, || {
                let inside = if how == "window" {
                    slot.enter()
                } else {
                    slot.lock()
                };
                // Endless patience: a drain that waited for this slot would not return.
                let d = drain(
                    &[slot],
                    |b| bufs.extend(b),
                    Patience::new(u32::MAX, None),
                    false,
                    false,
                );
                drop(inside);
                drained(d)
            });
            assert_eq!(d, (true, 7), "{how}");
            assert!(bufs.is_empty(), "{how}: a buffer was taken");
            // Out of it, the same thread's slot is drained as usual.
            let d = as_mine(slot, || {
                drain(&[slot], |b| bufs.extend(b), patient(), false, false)
            });
            assert_eq!(drained(d), (true, 0), "{how}");
            assert_eq!(taken_events(bufs), 7, "{how}");
        }
    }

    /// A slot whose owner stays inside (its window or the lock) through every attempt is
    /// given up, and its events are reported for counting, not dropped silently.
    #[test]
    fn a_slot_given_up_after_the_attempts_is_counted() {
        barrier::init();
        for how in ["window", "lock"] {
            let slot = slot_holding(5);
            let (inside_tx, inside_rx) = std::sync::mpsc::sync_channel::<()>(0);
            let (done_tx, done_rx) = std::sync::mpsc::sync_channel::<()>(0);
            let owner = std::thread::spawn(move || {
                let inside = if how == "window" {
                    slot.enter()
                } else {
                    slot.lock()
                };
                inside_tx.send(()).unwrap();
                done_rx.recv().unwrap();
                drop(inside);
            });
            inside_rx.recv().unwrap();
            let mut bufs = Vec::new();
            let d = drain(
                &[slot],
                |b| bufs.extend(b),
                Patience::new(1 << 8, None),
                false,
                false,
            );
            done_tx.send(()).unwrap();
            owner.join().unwrap();
            let d = drained(d);
            if how == "window" && !barrier::available() {
                // Without the window the owner took the lock: given up the same way.
                assert_eq!(d.1, 5, "{how}");
                continue;
            }
            assert_eq!(d, (true, 5), "{how}");
            assert!(bufs.is_empty(), "{how}: a buffer was taken");
        }
    }

    /// Owner threads that stay inside their slots (their window or their lock) until told
    /// to leave; each slot holds `events` events.
    struct Stuck {
        slots: Vec<&'static Slot>,
        leave: Vec<std::sync::mpsc::SyncSender<()>>,
        owners: Vec<std::thread::JoinHandle<()>>,
    }

    impl Stuck {
        fn new(n: usize, events: u64) -> Stuck {
            let mut st = Stuck {
                slots: Vec::new(),
                leave: Vec::new(),
                owners: Vec::new(),
            };
            for i in 0..n {
                let slot = slot_holding(events);
                let (inside_tx, inside_rx) = std::sync::mpsc::sync_channel::<()>(0);
                let (leave_tx, leave_rx) = std::sync::mpsc::sync_channel::<()>(0);
                st.owners.push(std::thread::spawn(move || {
                    let inside = if i % 2 == 0 {
                        slot.enter()
                    } else {
                        slot.lock()
                    };
                    inside_tx.send(()).unwrap();
                    leave_rx.recv().unwrap();
                    drop(inside);
                }));
                inside_rx.recv().unwrap();
                st.slots.push(slot);
                st.leave.push(leave_tx);
            }
            st
        }

        fn release(self) {
            for l in self.leave {
                l.send(()).unwrap();
            }
            for o in self.owners {
                o.join().unwrap();
            }
        }
    }

    /// A drain that finds several threads stuck inside their slots waits for them no longer,
    /// in all, than its patience allows (each slot's first few waits, then one shared budget),
    /// not that much for each: an exit with many stopped threads must not take many times the
    /// wait for one. Their events are counted. With `VRAMSHIM_SLOTS_FAULT=per-slot-wait` (each
    /// slot gets the whole budget, as before) the count is several budgets: this fails.
    #[test]
    fn stuck_slots_share_one_budget() {
        barrier::init();
        const WAITS: u32 = 4096;
        let stuck = Stuck::new(4, 3);
        let mut bufs = Vec::new();
        let d = drain(
            &stuck.slots,
            |b| bufs.extend(b),
            Patience::new(WAITS, None),
            false,
            false,
        );
        let (waits, given_up) = (d.waits, d.given_up.len());
        let lost = unaccounted(&d.given_up);
        stuck.release();
        assert_eq!(
            (given_up, lost),
            (4, 12),
            "every stuck slot given up and counted"
        );
        assert!(bufs.is_empty(), "a buffer was taken");
        assert!(
            waits <= Patience::bound(4, WAITS),
            "{waits} waits for 4 stuck slots with a budget of {WAITS} (at most {})",
            Patience::bound(4, WAITS)
        );
        // Past its time limit a drain waits for no slot beyond its first few.
        let stuck = Stuck::new(3, 1);
        let d = drain(
            &stuck.slots,
            |_| {},
            Patience::new(u32::MAX, Some(0)),
            false,
            false,
        );
        let waits = d.waits;
        stuck.release();
        assert!(
            waits <= Patience::bound(3, 0),
            "{waits} waits past the limit"
        );
    }

    /// When the barrier fails, an owner may be in its window unseen (the barrier is what makes
    /// it seen): the drain, still holding the slots it claimed, waits for their owners to leave
    /// before it gives them up, so that what such an owner appends (and hands over) is in the
    /// count, not appended after it. Here the owner, in its window when the drain claims its
    /// slot, appends one event a little later. With `VRAMSHIM_SLOTS_FAULT=barrier-no-settle`
    /// (the slots given up at once) the event is neither taken nor counted: this
    /// fails.
    #[test]
    fn a_failed_barrier_counts_what_an_owner_in_its_window_appends() {
        barrier::init();
        if !barrier::available() {
            // No window, no barrier: nothing to fail.
            return;
        }
        let slot = slot_holding(5);
        let (inside_tx, inside_rx) = std::sync::mpsc::sync_channel::<()>(0);
        let owner = std::thread::spawn(move || {
            let g = slot.enter();
            assert!(g.how == Held::Window, "the owner took its window");
            inside_tx.send(()).unwrap();
            // Long enough for a drain that does not wait to be done with the slot.
            std::thread::sleep(std::time::Duration::from_millis(100));
            g.inner().buf.put(slot, alloc(5));
            drop(g);
        });
        inside_rx.recv().unwrap();
        let mut bufs = Vec::new();
        barrier::FAILS.set(true);
        // Patience that outlasts the owner's sleep on any machine (`patient()`'s million
        // yields take 0.1-0.2 s where a yield is a fast system call: about the sleep itself).
        let d = drain(
            &[slot],
            |b| bufs.extend(b),
            Patience::new(u32::MAX, None),
            false,
            false,
        );
        barrier::FAILS.set(false);
        let (taken, lost) = drained(d);
        owner.join().unwrap();
        assert!(
            !taken && bufs.is_empty(),
            "a buffer was taken without the barrier"
        );
        assert_eq!(lost, 6, "the event appended in the window is counted");
    }

    /// When the barrier fails, the slots the drain claimed are given up, so that at exit
    /// (where nothing takes them later) their events are counted, not dropped; the next drain
    /// with a working barrier takes them. With `VRAMSHIM_SLOTS_FAULT=barrier-drop` (none given
    /// up, as before) their events are neither taken nor counted: this fails.
    #[test]
    fn a_failed_barrier_gives_the_claimed_slots_up_counted() {
        barrier::init();
        if !barrier::available() {
            // No window, no barrier: nothing to fail.
            return;
        }
        let slots = [slot_holding(5), slot_holding(4)];
        let mut bufs = Vec::new();
        barrier::FAILS.set(true);
        let d = drain(&slots, |b| bufs.extend(b), patient(), false, false);
        barrier::FAILS.set(false);
        assert_eq!(drained(d), (false, 9), "the claimed slots' events counted");
        assert!(bufs.is_empty(), "a buffer was taken without the barrier");
        let d = drain(&slots, |b| bufs.extend(b), patient(), false, false);
        assert_eq!(drained(d), (true, 0));
        assert_eq!(taken_events(bufs), 9);
    }

    /// A tick after one whose barrier failed tries the barrier alone first (`probe`): while
    /// it still fails, no slot is claimed, so no owner is waited for nor made to wait (an
    /// owner in its window, another holding its lock: not a single wait), nothing is given
    /// up and nothing taken; once it works the buffers are taken. Without the probe (broken
    /// on purpose: the first lines of `drain` removed) the same drain claims the slots,
    /// waits for both owners and gives them up: this fails.
    #[test]
    fn a_tick_after_a_failed_barrier_claims_nothing_while_it_still_fails() {
        barrier::init();
        if !barrier::available() {
            // No window, no barrier: nothing to fail.
            return;
        }
        let stuck = Stuck::new(2, 3);
        let mut bufs = Vec::new();
        barrier::FAILS.set(true);
        let d = drain(
            &stuck.slots,
            |b| bufs.extend(b),
            Patience::new(1 << 8, None),
            false,
            true,
        );
        barrier::FAILS.set(false);
        let (waits, given_up, taken) = (d.waits, d.given_up.len(), d.taken);
        let slots = stuck.slots.clone();
        stuck.release();
        assert_eq!(
            (taken, given_up, waits),
            (false, 0, 0),
            "a drain whose probe failed claimed slots"
        );
        assert!(bufs.is_empty());
        let d = drain(&slots, |b| bufs.extend(b), patient(), false, true);
        assert_eq!(drained(d), (true, 0));
        assert_eq!(taken_events(bufs), 6);
    }
}
