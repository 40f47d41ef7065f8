//! Record encoding inside a frame (see `docs/trace-format.md`, "Records").
//!
//! A record is `tag: u8`, `len: varint`, `payload: len bytes`. Timed records carry their time
//! as a zigzag delta from the previous timed record of the same *context*; a context starts at
//! the beginning of every frame and at every `Context` record, where all delta state resets.

use crate::columns::TimeCursor;
use crate::event::{AllocKind, Api, DeviceInfo, Event, MemOp, PyFrame, SyncKind, TorchOp};
use crate::torch_run::{self, Model, TorchFields};
use crate::wire::put_varint_at as wv;
use crate::wire::{Cur, put_str, put_varint, torch_offset_of, torch_size_of, unzigzag, zigzag};
pub use crate::wire::{MAX_STACK_FRAMES, MAX_STRING, RecordError, mask, tag, torch_head};

/// Per-slot "previous values" of the MemOp encoding (one slot for allocs, one for frees).
#[derive(Clone, Copy, Default, Debug)]
struct OpSlot {
    api: u16,
    kind: u8,
    flags: u8,
}

/// Entries of the recent-allocation table (`FreeRef` records point into it).
pub const LIVE_TABLE: usize = 256;

/// Entries of the recently-freed ring (`AllocReuse` records point into it).
pub const FREED: usize = 16;
/// `AllocReuse` flag: the size is the freed block's (not written).
const REUSE_SAME_SIZE: u8 = 0x10;

/// Table slot of an address: the top 8 bits of `addr * 0x9E3779B97F4A7C15` (wrapping).
#[inline]
pub fn live_slot(addr: u64) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize
}

#[derive(Clone, Copy, Default, Debug)]
struct LiveEnt {
    addr: u64,
    size: u64,
    /// Valid only when equal to the state's generation.
    generation: u32,
}

/// The delta state shared by encoder and decoder. Resets at frame start and at `CONTEXT`.
#[derive(Clone, Debug)]
pub(crate) struct DeltaState {
    pub tid: u32,
    /// End of the previous timed record (`t_ns + latency_ns` for MemOps).
    pub t: u64,
    addr: u64,
    device: i32,
    stream: u64,
    slots: [OpSlot; 2],
    generation: u32,
    live: [LiveEnt; LIVE_TABLE],
    /// The last `FREED` frees (address, size), newest at `freed_head - 1`.
    freed: [LiveEnt; FREED],
    freed_head: usize,
    /// `TorchDelta` records: the three most recent segments (most recent first), and the
    /// previous record's device and stream.
    torch_segments: [u64; 3],
    torch_device: i32,
    torch_stream: u64,
}

impl Default for DeltaState {
    fn default() -> Self {
        DeltaState {
            tid: 0,
            t: 0,
            addr: 0,
            device: 0,
            stream: 0,
            slots: [OpSlot::default(); 2],
            generation: 1,
            live: [LiveEnt::default(); LIVE_TABLE],
            freed: [LiveEnt::default(); FREED],
            freed_head: 0,
            torch_segments: [0; 3],
            torch_device: 0,
            torch_stream: 0,
        }
    }
}

impl DeltaState {
    /// Makes recent segment `k` (or, for `k` = 3, the new segment `seg`) the most recent.
    #[inline]
    fn torch_segment_used(&mut self, k: u8, seg: u64) {
        let s = &mut self.torch_segments;
        match k {
            0 => {}
            1 => s.swap(0, 1),
            2 => *s = [s[2], s[0], s[1]],
            _ => *s = [seg, s[0], s[1]],
        }
    }

    #[inline]
    fn note_free(&mut self, addr: u64, size: u64) {
        if addr != 0 {
            self.freed[self.freed_head % FREED] = LiveEnt {
                addr,
                size,
                generation: self.generation,
            };
            self.freed_head = self.freed_head.wrapping_add(1);
        }
    }

    /// Ring distance (0 = newest) of a recent free of `addr`: the definition the encoder's
    /// mirror ([`find_freed`]) is tested against.
    #[cfg(test)]
    fn find_freed(&self, addr: u64) -> Option<(usize, LiveEnt)> {
        for j in 0..FREED {
            let e = self.freed[self.freed_head.wrapping_sub(1 + j) % FREED];
            if e.generation != self.generation {
                return None;
            }
            if e.addr == addr {
                return Some((j, e));
            }
        }
        None
    }

    fn reset(&mut self, tid: u32) {
        self.tid = tid;
        self.t = 0;
        self.addr = 0;
        self.device = 0;
        self.stream = 0;
        self.slots = [OpSlot::default(); 2];
        self.torch_segments = [0; 3];
        self.torch_device = 0;
        self.torch_stream = 0;
        // Invalidate the table without touching its 6 KiB.
        self.generation = self.generation.wrapping_add(1);
        self.freed_head = 0;
        if self.generation == 0 {
            self.live = [LiveEnt::default(); LIVE_TABLE];
            self.freed = [LiveEnt::default(); FREED];
            self.generation = 1;
        }
    }
}

/// Encodes events into a byte buffer of whole records: the buffer-level encoder.
///
/// The interposer's tracer keeps one per thread: [`RecordEncoder::begin`] writes a
/// `Context` record (delta state reset + thread id) so that any number of buffers can be
/// concatenated into one frame, in any order. [`crate::TraceWriter::write_records`] takes
/// the finished bytes.
#[derive(Default, Debug)]
pub struct RecordEncoder {
    buf: Vec<u8>,
    st: DeltaState,
    records: u32,
    t_min: u64,
    t_max: u64,
    /// The freed ring's addresses, newest-first by rotation (entry of the `t`-th free since
    /// the context at `15 - t % 16`; 0 = empty), and a one-byte tag of each, so an alloc finds
    /// a recent free of its address with one 16-byte compare instead of a walk. Encoder only.
    freed_addr: [u64; FREED],
    /// Tag of entry `k` in byte `k % 8` of word `k / 8`.
    freed_tag: [u64; 2],
    /// The `TorchRun` model of the context (allocated at its first PyTorch event).
    model: Option<Box<Model>>,
    /// The open `TorchRun` record: where its tag is, and the buffer's length after its last
    /// event (a new record starts a new run: the buffer then no longer ends there);
    /// [`NO_RUN`] when none is open (an empty buffer is no open run).
    run_at: usize,
    run_end: usize,
    /// Bytes of `TorchRun` payloads in the buffer (the writer stores them uncompressed).
    torch_bytes: usize,
    /// The models of chained contexts ([`RecordEncoder::context_chained`], format v5), one
    /// per model slot, and the slot whose model is in `model` now (the context's).
    chains: Vec<Chain>,
    chain_cur: Option<usize>,
    /// Counts chained contexts (which slot was used least recently).
    chain_clock: u64,
}

/// Model slots a `Context` record may name (format v5): a reader keeps at most this many
/// models between frames.
pub const MODEL_SLOTS: usize = 64;
/// A chained slot's model starts afresh at least every this many contexts that name it, and
/// at its first context after it coded this many bytes of `TorchRun` events: what a lost or
/// damaged frame costs a reader is bounded by them (`docs/trace-format.md` 4.1).
pub const FRESH_CONTEXTS: u32 = 16;
pub const FRESH_BYTES: usize = 1 << 20;

/// One model slot of the chained contexts: whose it is and where its chain stands.
#[derive(Debug, Default)]
struct Chain {
    tid: u32,
    /// Contexts that named this slot so far (the next one's number: never repeats).
    named: u64,
    /// Contexts since the model started afresh (0: it must start afresh next).
    since_fresh: u32,
    /// `TorchRun` bytes coded since then.
    bytes: usize,
    used: u64,
    /// The slot's model while another context's is in use (`None`: none yet, i.e. fresh).
    model: Option<Box<Model>>,
}

/// A finished run of records, as produced by [`RecordEncoder`].
#[derive(Debug, Clone, Copy)]
pub struct RecordStats {
    /// Number of records (including the leading `Context`).
    pub records: u32,
    /// Smallest and largest timestamp of the timed records (`u64::MAX`, 0 when none).
    pub t_min: u64,
    pub t_max: u64,
}

impl RecordEncoder {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    pub fn with_capacity(cap: usize) -> Self {
        RecordEncoder {
            buf: Vec::with_capacity(cap),
            st: DeltaState::default(),
            records: 0,
            t_min: u64::MAX,
            t_max: 0,
            freed_addr: [0; FREED],
            freed_tag: [0; 2],
            model: None,
            run_at: 0,
            run_end: NO_RUN,
            torch_bytes: 0,
            chains: Vec::new(),
            chain_cur: None,
            chain_clock: 0,
        }
    }

    /// Clears the buffer and starts a new context for thread `tid` (writes a `Context` record).
    pub fn begin(&mut self, tid: u32) {
        self.buf.clear();
        self.torch_bytes = 0;
        self.records = 0;
        self.t_min = u64::MAX;
        self.t_max = 0;
        self.context(tid);
    }

    /// Writes a `Context` record: resets the delta state and sets the current thread.
    pub fn context(&mut self, tid: u32) {
        self.park_model();
        self.buf.push(tag::CONTEXT);
        let at = self.buf.len();
        self.buf.push(0);
        put_varint(&mut self.buf, tid as u64);
        self.buf[at] = (self.buf.len() - at - 1) as u8;
        self.st.reset(tid);
        self.freed_addr = [0; FREED];
        self.freed_tag = [0; 2];
        self.reset_model();
        self.records += 1;
    }

    /// Writes a `Context` record for thread `tid` whose `TorchRun` model continues the one the
    /// last context of `tid` from this encoder left (format v5: the record names a model slot
    /// and its count, `docs/trace-format.md` 4.1), so that a thread's events are predicted
    /// from its earlier buffers' too. The slot's model starts afresh (the record says so) at
    /// a thread's first context, at least every [`FRESH_CONTEXTS`] contexts and after
    /// [`FRESH_BYTES`] of coded events; [`MODEL_SLOTS`] threads at most keep theirs (the
    /// least recently used slot goes to a new thread). Only for a writer whose contexts reach
    /// the file in the order encoded (a reader follows the chain in file order).
    pub fn context_chained(&mut self, tid: u32) {
        self.park_model();
        self.chain_clock += 1;
        let k = match self.chains.iter().position(|c| c.tid == tid) {
            Some(k) => k,
            None if self.chains.len() < MODEL_SLOTS => {
                self.chains.push(Chain {
                    tid,
                    ..Chain::default()
                });
                self.chains.len() - 1
            }
            None => {
                let k = (0..self.chains.len())
                    .min_by_key(|&k| self.chains[k].used)
                    .unwrap_or(0);
                let c = &mut self.chains[k];
                c.tid = tid;
                c.since_fresh = 0;
                k
            }
        };
        let c = &mut self.chains[k];
        let fresh = c.since_fresh == 0 || c.since_fresh >= FRESH_CONTEXTS || c.bytes >= FRESH_BYTES;
        let n = c.named;
        c.named += 1;
        c.used = self.chain_clock;
        if fresh {
            c.since_fresh = 1;
            c.bytes = 0;
            if let Some(m) = &mut c.model {
                m.reset();
            }
        } else {
            c.since_fresh += 1;
        }
        self.buf.push(tag::CONTEXT);
        let at = self.buf.len();
        self.buf.push(0);
        put_varint(&mut self.buf, tid as u64);
        put_varint(&mut self.buf, n << 7 | (k as u64) << 1 | fresh as u64);
        self.buf[at] = (self.buf.len() - at - 1) as u8;
        self.st.reset(tid);
        self.freed_addr = [0; FREED];
        self.freed_tag = [0; 2];
        self.run_end = NO_RUN;
        std::mem::swap(&mut self.model, &mut self.chains[k].model);
        self.chain_cur = Some(k);
        self.records += 1;
    }

    /// Puts a chained context's model back in its slot (the context ends).
    #[inline]
    fn park_model(&mut self) {
        if let Some(k) = self.chain_cur.take()
            && let Some(c) = self.chains.get_mut(k)
        {
            std::mem::swap(&mut self.model, &mut c.model);
        }
    }

    #[inline]
    fn reset_model(&mut self) {
        if let Some(m) = &mut self.model {
            m.reset();
        }
        self.run_end = NO_RUN;
    }

    /// Bytes of `TorchRun` payloads (coded PyTorch allocator events) in the buffer.
    pub fn torch_bytes(&self) -> usize {
        self.torch_bytes
    }

    /// Bytes encoded so far (whole records only).
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    pub fn stats(&self) -> RecordStats {
        RecordStats {
            records: self.records,
            t_min: self.t_min,
            t_max: self.t_max,
        }
    }

    /// Takes the encoded bytes out (leaving an empty buffer with no capacity) and the stats.
    pub fn take(&mut self) -> (Vec<u8>, RecordStats) {
        let stats = self.stats();
        self.records = 0;
        self.t_min = u64::MAX;
        self.t_max = 0;
        self.torch_bytes = 0;
        self.run_end = NO_RUN;
        (std::mem::take(&mut self.buf), stats)
    }

    /// Replaces the (empty) buffer with `buf` (cleared), so capacity can be recycled.
    pub fn set_buffer(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        self.buf = buf;
        self.torch_bytes = 0;
        self.run_end = NO_RUN;
        self.records = 0;
        self.t_min = u64::MAX;
        self.t_max = 0;
    }

    /// Clears the buffer (keeping its capacity) without writing a `Context` record.
    pub fn clear(&mut self) {
        self.park_model();
        self.buf.clear();
        self.records = 0;
        self.t_min = u64::MAX;
        self.t_max = 0;
        self.torch_bytes = 0;
        self.st.reset(0);
        self.freed_addr = [0; FREED];
        self.freed_tag = [0; 2];
        self.reset_model();
    }

    /// Appends whole records encoded by another `RecordEncoder` (starting with a `Context`).
    /// The caller must write a `Context` before pushing more events (the delta state of the
    /// appended records is unknown here).
    pub fn append_raw(&mut self, bytes: &[u8], stats: RecordStats) {
        self.run_end = NO_RUN;
        self.buf.extend_from_slice(bytes);
        self.records += stats.records;
        self.t_min = self.t_min.min(stats.t_min);
        self.t_max = self.t_max.max(stats.t_max);
    }

    /// [`RecordEncoder::append_raw`] of everything `other` encoded (its records start with a
    /// `Context`), keeping count of its `TorchRun` payloads.
    pub fn append_encoded(&mut self, other: &RecordEncoder) {
        self.append_raw(&other.buf, other.stats());
        self.torch_bytes += other.torch_bytes;
    }

    /// Puts back a buffer taken with [`RecordEncoder::take`] (when it could not be handed
    /// over), keeping the delta state, so encoding continues where it left off.
    pub fn restore(&mut self, buf: Vec<u8>, stats: RecordStats) {
        self.run_end = NO_RUN;
        self.buf = buf;
        self.records = stats.records;
        self.t_min = stats.t_min;
        self.t_max = stats.t_max;
    }

    /// Appends a `Stack` record without building an [`Event`] (no allocation).
    pub fn push_stack(&mut self, id: u32, frames: &[u64]) {
        self.records += 1;
        self.buf.push(tag::STACK);
        let at = self.buf.len();
        self.buf.push(0);
        let b = &mut self.buf;
        put_varint(b, id as u64);
        let frames = &frames[..frames.len().min(MAX_STACK_FRAMES)];
        put_varint(b, frames.len() as u64);
        let mut prev = 0u64;
        for f in frames {
            put_varint(b, zigzag(f.wrapping_sub(prev) as i64));
            prev = *f;
        }
        self.fix_len(at);
    }

    /// The thread id of the current context.
    pub fn tid(&self) -> u32 {
        self.st.tid
    }

    #[inline]
    fn time(&mut self, t: u64) {
        let d = t.wrapping_sub(self.st.t) as i64;
        put_varint(&mut self.buf, zigzag(d));
        self.st.t = t;
        if t < self.t_min {
            self.t_min = t;
        }
        if t > self.t_max {
            self.t_max = t;
        }
    }

    /// Appends the record of an allocation (`alloc`) or a free: [`Self::push`] of
    /// `Event::Alloc(*m)` / `Event::Free(*m)`, for callers that have the `MemOp` at hand
    /// (no `Event` is built or copied).
    #[inline]
    pub fn push_memop(&mut self, alloc: bool, m: &MemOp) {
        if alloc {
            self.memop(tag::ALLOC, 0, m)
        } else {
            self.memop(tag::FREE, 1, m)
        }
    }

    /// Appends one record for `ev`. Never fails; strings longer than 64 KiB and stacks deeper
    /// than 1024 frames are cut.
    #[inline]
    pub fn push(&mut self, ev: &Event) {
        match ev {
            Event::Alloc(m) => self.memop(tag::ALLOC, 0, m),
            Event::Free(m) => self.memop(tag::FREE, 1, m),
            Event::Torch(op) => self.push_torch(op),
            _ => self.push_other(ev),
        }
    }

    /// Appends a PyTorch allocator event to the context's open `TorchRun` record (tag 25;
    /// a new one when the last record is not one): coded against the context's model of the
    /// events before it ([`crate::torch_run`]): predicted (action, size, stack), the address
    /// as a distance into a ring of recent places, the time in 1-3 bytes; ~5 bytes an event
    /// on a training loop. The writer stores these bytes as they are (no zstd). Offsets and
    /// sizes no `TorchRun` can hold (from 2^62) get a `Torch` record. A caller with several
    /// such events in a row gives them to [`Self::push_torch_all`] (the same bytes, fewer
    /// instructions an event).
    #[inline]
    pub fn push_torch(&mut self, op: &TorchOp) {
        self.push_torch_all(std::iter::once(op));
    }

    /// [`Self::push_torch`] of each of `ops`, in order, with the same bytes as a result: the
    /// run's header is written once (its length patched at the end, not after every event),
    /// the buffer grows once for many events (the coder writes into slack past the end with
    /// fixed-size stores; the slack is cut off at the end), and the record statistics stay
    /// in registers meanwhile. Returns how many events it took (all of `ops`).
    #[inline]
    pub fn push_torch_all<'a, I, T>(&mut self, ops: I) -> usize
    where
        I: IntoIterator<Item = &'a T>,
        T: TorchFields + 'a,
    {
        let mut ops = ops.into_iter();
        let torch_bytes_before = self.torch_bytes;
        let mut pos = self.buf.len();
        // The open run continues when nothing was written after it.
        let mut run = if self.run_end == pos && pos - self.run_at <= RUN_MAX {
            self.run_at
        } else {
            NO_RUN
        };
        let (mut t_min, mut t_max) = (self.t_min, self.t_max);
        let mut events = 0usize;
        // Of them, those not coded in the run (`Torch` records count themselves).
        let mut v2s = 0usize;
        // The open run's bytes that `torch_bytes` counts already.
        let mut counted = if run == NO_RUN {
            0
        } else {
            pos - run - RUN_HEAD
        };
        let mut m = self.model.take().unwrap_or_default();
        m.cx = torch_run::Ctx {
            tid: self.st.tid,
            t: self.st.t,
        };
        // The one test of the usual event: `pos < stop` says a run is open with room for
        // the event (under `RUN_MAX`) and the buffer has `EV_MAX` bytes of slack at `pos`.
        let mut stop = 0;
        while let Some(op) = ops.next() {
            events += 1;
            if !torch_run::holds(op) {
                // The rare event no `TorchRun` holds: the run so far closed, a `Torch`
                // record, and a new run for the events after it.
                self.torch_bytes += close_run(&mut self.buf, run, pos) - counted;
                counted = 0;
                self.buf.truncate(pos);
                self.st.tid = m.cx.tid;
                self.st.t = m.cx.t;
                (self.t_min, self.t_max) = (t_min, t_max);
                v2s += 1;
                self.push_torch_v2(&op.to_op());
                (t_min, t_max) = (self.t_min, self.t_max);
                pos = self.buf.len();
                m.cx.t = self.st.t;
                run = NO_RUN;
                stop = 0;
                continue;
            }
            if pos >= stop {
                if run == NO_RUN || pos - run > RUN_MAX {
                    self.torch_bytes += close_run(&mut self.buf, run, pos) - counted;
                    counted = 0;
                    self.buf.truncate(pos);
                    self.buf
                        .extend_from_slice(&[tag::TORCH_RUN, 0x80, 0x80, 0x00]);
                    run = pos;
                    pos += RUN_HEAD;
                }
                if self.buf.len() < pos + torch_run::EV_MAX {
                    // Room for this event and, at about 8 bytes each, those still to come.
                    let left = ops.size_hint().1.unwrap_or(SLACK_EVENTS);
                    let more = left.min(SLACK_EVENTS) * 8;
                    self.buf.resize(pos + torch_run::EV_MAX + more, 0);
                }
                stop = (run + RUN_MAX + 1).min(self.buf.len() + 1 - torch_run::EV_MAX);
            }
            let Some(b) = self
                .buf
                .get_mut(pos..pos + torch_run::EV_MAX)
                .and_then(|b| <&mut [u8; torch_run::EV_MAX]>::try_from(b).ok())
            else {
                // Never: the buffer was grown above. (Taken, not coded.)
                v2s += 1;
                break;
            };
            pos += torch_run::encode(&mut m, op, b);
            t_min = t_min.min(op.t_ns());
            t_max = t_max.max(op.t_ns());
        }
        self.torch_bytes += close_run(&mut self.buf, run, pos) - counted;
        self.buf.truncate(pos);
        self.st.tid = m.cx.tid;
        self.st.t = m.cx.t;
        self.model = Some(m);
        self.run_at = run;
        self.run_end = if run == NO_RUN { NO_RUN } else { pos };
        self.records += (events - v2s) as u32;
        self.t_min = t_min;
        self.t_max = t_max;
        if let Some(c) = self.chain_cur.and_then(|k| self.chains.get_mut(k)) {
            c.bytes += self.torch_bytes - torch_bytes_before;
        }
        events
    }

    /// A `Torch` record (tag 20, every field in full): for the events a `TorchDelta` cannot
    /// hold. Leaves the `TorchDelta` state alone, as its decoder does.
    #[cold]
    #[inline(never)]
    fn push_torch_v2(&mut self, op: &TorchOp) {
        self.records += 1;
        self.buf.push(tag::TORCH);
        let at = self.buf.len();
        self.buf.push(0);
        self.time(op.t_ns);
        let b = &mut self.buf;
        put_varint(b, op.tid as u64);
        b.push(op.action);
        put_varint(b, zigzag(op.device as i64));
        put_varint(b, op.addr);
        put_varint(b, op.size);
        put_varint(b, op.stream);
        put_varint(b, op.segment);
        put_varint(b, op.stack as u64);
        self.fix_len(at);
    }

    /// Every record but the MemOps (rare: kept out of line).
    #[inline(never)]
    fn push_other(&mut self, ev: &Event) {
        self.records += 1;
        self.buf.push(record_tag(ev));
        let at = self.buf.len();
        // One length byte; most payloads are < 128 bytes. Widened by fix_len when not.
        self.buf.push(0);
        match ev {
            Event::Alloc(_) | Event::Free(_) => {}
            Event::CapRefusal {
                t_ns,
                tid,
                device,
                api,
                size,
                in_use,
                cap,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, *tid as u64);
                put_varint(b, zigzag(*device as i64));
                put_varint(b, *api as u64);
                put_varint(b, *size);
                put_varint(b, *in_use);
                put_varint(b, *cap);
            }
            Event::PoolTrim {
                t_ns,
                device,
                bytes,
                reason,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, zigzag(*device as i64));
                put_varint(b, *bytes);
                b.push(*reason);
            }
            Event::Sync {
                t_ns,
                tid,
                device,
                kind,
                stream,
                latency_ns,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, *tid as u64);
                put_varint(b, zigzag(*device as i64));
                b.push(*kind as u8);
                put_varint(b, *stream);
                put_varint(b, *latency_ns as u64);
            }
            Event::MemInfo {
                t_ns,
                tid,
                api,
                device,
                free,
                total,
                result,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, *tid as u64);
                put_varint(b, *api as u64);
                put_varint(b, zigzag(*device as i64));
                put_varint(b, *free);
                put_varint(b, *total);
                put_varint(b, zigzag(*result as i64));
            }
            Event::ThreadStart { t_ns, tid } | Event::ThreadExit { t_ns, tid } => {
                self.time(*t_ns);
                put_varint(&mut self.buf, *tid as u64);
            }
            Event::Fork { t_ns, child_pid } => {
                self.time(*t_ns);
                put_varint(&mut self.buf, *child_pid as u64);
            }
            Event::Module {
                base,
                size,
                file_offset,
                path,
            } => {
                let b = &mut self.buf;
                put_varint(b, *base);
                put_varint(b, *size);
                put_varint(b, *file_offset);
                put_str(b, path);
            }
            Event::Stack { id, frames } => {
                // Undo the generic header: push_stack writes its own.
                self.buf.truncate(at - 1);
                self.records -= 1;
                return self.push_stack(*id, frames);
            }
            Event::Counter {
                t_ns,
                device,
                live_bytes,
                reserved_bytes,
                cap,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, zigzag(*device as i64));
                put_varint(b, *live_bytes);
                put_varint(b, *reserved_bytes);
                put_varint(b, *cap);
            }
            Event::PoolStats {
                t_ns,
                device,
                reserved,
                live,
                cached,
                pending,
                budget,
                releases,
            } => {
                // the time in full, not a delta: a reader that skips the record (one written
                // before it existed) keeps the same delta state as the writer
                let b = &mut self.buf;
                put_varint(b, *t_ns);
                put_varint(b, zigzag(*device as i64));
                for v in [reserved, live, cached, pending, budget, releases] {
                    put_varint(b, *v);
                }
            }
            Event::StreamDestroy {
                t_ns,
                tid,
                device,
                stream,
            } => {
                // the time in full, as `PoolStats`: a reader written before the record skips
                // it and keeps the writer's delta state
                if *t_ns < self.t_min {
                    self.t_min = *t_ns;
                }
                if *t_ns > self.t_max {
                    self.t_max = *t_ns;
                }
                let b = &mut self.buf;
                put_varint(b, *t_ns);
                put_varint(b, *tid as u64);
                put_varint(b, zigzag(*device as i64));
                put_varint(b, *stream);
            }
            Event::Lost { t_ns, count } => {
                self.time(*t_ns);
                put_varint(&mut self.buf, *count);
            }
            Event::CallFailed {
                t_ns,
                tid,
                device,
                name,
                result,
            } => {
                self.time(*t_ns);
                let b = &mut self.buf;
                put_varint(b, *tid as u64);
                put_varint(b, zigzag(*device as i64));
                put_varint(b, zigzag(*result as i64));
                put_str(b, name);
            }
            Event::Device(d) => {
                let b = &mut self.buf;
                put_varint(b, zigzag(d.index as i64));
                put_varint(b, d.total_bytes);
                put_str(b, &d.name);
                if let Some(u) = &d.uuid {
                    b.extend_from_slice(u);
                }
            }
            Event::Torch(_) => {
                // push_torch writes its own record (never reached through push).
                self.buf.truncate(at - 1);
                self.records -= 1;
                if let Event::Torch(op) = ev {
                    self.push_torch(op);
                }
                return;
            }
            Event::PyCode {
                id,
                file,
                function,
                first_line,
            } => {
                let b = &mut self.buf;
                put_varint(b, *id as u64);
                put_str(b, file);
                put_str(b, function);
                put_varint(b, *first_line as u64);
            }
            Event::PyStack { id, frames } => {
                let b = &mut self.buf;
                put_varint(b, *id as u64);
                let frames = &frames[..frames.len().min(MAX_STACK_FRAMES)];
                put_varint(b, frames.len() as u64);
                for f in frames {
                    put_varint(b, f.code as u64);
                    put_varint(b, f.line as u64);
                }
            }
        }
        self.fix_len(at);
    }

    /// Writes an `END` record (clean end of trace at monotonic time `t_ns`).
    pub fn end(&mut self, t_ns: u64) {
        self.records += 1;
        self.buf.push(tag::END);
        let at = self.buf.len();
        self.buf.push(0);
        self.time(t_ns);
        self.fix_len(at);
    }

    /// Patches the one-byte length placeholder at `at`; widens it when the payload is long.
    #[inline]
    fn fix_len(&mut self, at: usize) {
        let len = self.buf.len() - at - 1;
        if len < 0x80 {
            self.buf[at] = len as u8;
        } else {
            let mut tmp = Vec::with_capacity(10);
            put_varint(&mut tmp, len as u64);
            // tmp.len() >= 2: make room for the extra bytes.
            let extra = tmp.len() - 1;
            self.buf
                .splice(at..at + 1, std::iter::repeat_n(0u8, extra + 1));
            self.buf[at..at + tmp.len()].copy_from_slice(&tmp);
        }
    }

    // Always inlined: the caller's frame is the only one on the tracer's hot path.
    #[inline(always)]
    fn memop(&mut self, tag_: u8, slot: usize, m: &MemOp) {
        let st = &mut self.st;
        let s = st.slots[slot];
        let api = m.api as u16;
        let kind = m.kind as u8;
        let mut mk = 0u8;
        if api != s.api {
            mk |= mask::API;
        }
        if kind != s.kind {
            mk |= mask::KIND;
        }
        if m.flags != s.flags {
            mk |= mask::FLAGS;
        }
        if m.device != st.device {
            mk |= mask::DEVICE;
        }
        if m.stream != st.stream {
            mk |= mask::STREAM;
        }
        if m.result != 0 {
            mk |= mask::RESULT;
        }
        if m.stack != 0 {
            mk |= mask::STACK;
        }
        if m.tid != st.tid {
            mk |= mask::TID;
        }
        // A free of a recently allocated block of the same size refers to it by table slot.
        let ls = live_slot(m.addr);
        let by_ref = slot == 1 && m.addr != 0 && {
            let e = st.live[ls];
            e.generation == st.generation && e.addr == m.addr && e.size == m.size
        };
        let reuse = if slot == 0 && m.addr != 0 {
            find_freed(&self.freed_addr, &self.freed_tag, st, m.addr)
        } else {
            None
        };
        // Every field fits: the payload is at most 71 bytes, so the length is one byte. The
        // record is written in place (REC zeroed bytes, cut to its length after): fixed-size
        // stores, no call to memcpy; positions are taken modulo REC (never reached: at most
        // 73 bytes are written), which spares a bounds check per byte.
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0u8; REC]);
        let Ok(b) = <&mut [u8; REC]>::try_from(&mut self.buf[at..at + REC]) else {
            return;
        };
        b[0] = if by_ref {
            tag::FREE_REF
        } else if reuse.is_some() {
            tag::ALLOC_REUSE
        } else {
            tag_
        };
        b[2] = mk;
        // Usually nothing but address, size and timing changes: the mask is 0.
        let mut n = if mk == 0 { 3 } else { changed_fields(b, mk, m) };
        // Repetitive fields first, the noisy timing fields last: zstd then finds the former
        // repeating across loop iterations as one match.
        if by_ref {
            b[n % REC] = ls as u8;
            n += 1;
        } else if let Some((j, f)) = reuse {
            if f.size == m.size {
                b[n % REC] = j as u8 | REUSE_SAME_SIZE;
                n += 1;
            } else {
                b[n % REC] = j as u8;
                n = wv(b, n + 1, m.size);
            }
            st.addr = m.addr;
        } else {
            n = wv(b, n, zigzag(m.addr.wrapping_sub(st.addr) as i64));
            n = wv(b, n, m.size);
            st.addr = m.addr;
        }
        n = wv(b, n, zigzag(m.t_ns.wrapping_sub(st.t) as i64));
        n = wv(b, n, m.latency_ns as u64);
        b[1] = (n - 2) as u8;
        self.buf.truncate(at + n);
        self.records += 1;
        if slot == 0 && m.addr != 0 {
            st.live[ls] = LiveEnt {
                addr: m.addr,
                size: m.size,
                generation: st.generation,
            };
        } else if slot == 1 {
            if m.addr != 0 {
                let k = 15 - st.freed_head % FREED;
                self.freed_addr[k] = m.addr;
                let (w, sh) = (k / 8, (k % 8) * 8);
                self.freed_tag[w] =
                    (self.freed_tag[w] & !(0xff << sh)) | ((freed_tag(m.addr) as u64) << sh);
            }
            st.note_free(m.addr, m.size);
        }
        st.slots[slot] = OpSlot {
            api,
            kind,
            flags: m.flags,
        };
        st.device = m.device;
        st.stream = m.stream;
        st.tid = m.tid;
        st.t = m.t_ns.wrapping_add(m.latency_ns as u64);
        if m.t_ns < self.t_min {
            self.t_min = m.t_ns;
        }
        if m.t_ns > self.t_max {
            self.t_max = m.t_ns;
        }
    }
}

/// One-byte tag of a freed address (candidates for the full compare).
#[inline(always)]
fn freed_tag(addr: u64) -> u8 {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// Bit `i` set for every zero byte `i` of `v` (and possibly for bytes above a zero byte:
/// candidates only, the caller compares the full addresses).
#[inline(always)]
fn zero_bytes(v: u64) -> u32 {
    let z = v.wrapping_sub(0x0101_0101_0101_0101) & !v & 0x8080_8080_8080_8080;
    ((z >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

/// [`DeltaState::find_freed`] through the encoder's mirror: the ring distance (0 = newest) of
/// the newest recent free of `addr` (not 0), and that free.
#[inline(always)]
fn find_freed(
    mirror: &[u64; FREED],
    tags: &[u64; 2],
    st: &DeltaState,
    addr: u64,
) -> Option<(usize, LiveEnt)> {
    let t = freed_tag(addr) as u64 * 0x0101_0101_0101_0101;
    let cand = zero_bytes(tags[0] ^ t) | zero_bytes(tags[1] ^ t) << 8;
    // The newest free sits at `newest`; older ones follow at increasing positions (mod 16).
    // Candidates are visited newest first and the first full match is the answer: a loop
    // that frees and reallocates one address (every ring entry is that address) stops at
    // the first candidate instead of comparing all 16.
    let newest = (15 - st.freed_head.wrapping_sub(1) % FREED) as u32;
    let mut by_age = (cand as u16).rotate_right(newest);
    while by_age != 0 {
        let j = by_age.trailing_zeros() as usize;
        if mirror[(j + newest as usize) % FREED] == addr {
            return Some((j, st.freed[st.freed_head.wrapping_sub(1 + j) % FREED]));
        }
        by_age &= by_age - 1;
    }
    None
}

/// The fields a MemOp's mask says changed, from `b[3]` on; returns the new position.
#[inline(never)]
fn changed_fields(b: &mut [u8; REC], mk: u8, m: &MemOp) -> usize {
    let mut n = 3;
    if mk & mask::API != 0 {
        n = wv(b, n, m.api as u16 as u64);
    }
    if mk & mask::KIND != 0 {
        b[n % REC] = m.kind as u8;
        n += 1;
    }
    if mk & mask::FLAGS != 0 {
        b[n % REC] = m.flags;
        n += 1;
    }
    if mk & mask::DEVICE != 0 {
        n = wv(b, n, zigzag(m.device as i64));
    }
    if mk & mask::STREAM != 0 {
        n = wv(b, n, m.stream);
    }
    if mk & mask::RESULT != 0 {
        n = wv(b, n, zigzag(m.result as i64));
    }
    if mk & mask::STACK != 0 {
        n = wv(b, n, m.stack as u64);
    }
    if mk & mask::TID != 0 {
        n = wv(b, n, m.tid as u64);
    }
    n
}

/// A `TorchRun` record's header: the tag, then its length as a varint padded to 3 bytes.
const RUN_HEAD: usize = 4;
/// `RecordEncoder::run_end` when no run is open: no buffer ever ends there.
const NO_RUN: usize = usize::MAX;
/// A run is closed before its payload could pass what 3 varint bytes hold (2^21 - 1).
const RUN_MAX: usize = (1 << 21) - 2 * torch_run::EV_MAX;

/// Slack the buffer grows by for the events still to come in [`RecordEncoder::push_torch_all`]
/// is for at most this many of them (8 bytes each).
const SLACK_EVENTS: usize = 32;

/// Writes the length of the `TorchRun` record at `run` (if any) whose payload ends at `end`;
/// returns that length (0 without a run).
#[inline]
fn close_run(buf: &mut [u8], run: usize, end: usize) -> usize {
    if run == NO_RUN {
        return 0;
    }
    let len = end - run - RUN_HEAD;
    if let Some(h) = buf.get_mut(run + 1..run + RUN_HEAD) {
        h[0] = len as u8 | 0x80;
        h[1] = (len >> 7) as u8 | 0x80;
        h[2] = (len >> 14) as u8;
    }
    len
}

/// Scratch size of one MemOp record (a power of two above its largest size, 73 bytes).
const REC: usize = 128;

fn record_tag(ev: &Event) -> u8 {
    match ev {
        Event::Alloc(_) => tag::ALLOC,
        Event::Free(_) => tag::FREE,
        Event::CapRefusal { .. } => tag::CAP_REFUSAL,
        Event::PoolTrim { .. } => tag::POOL_TRIM,
        Event::Sync { .. } => tag::SYNC,
        Event::MemInfo { .. } => tag::MEM_INFO,
        Event::ThreadStart { .. } => tag::THREAD_START,
        Event::ThreadExit { .. } => tag::THREAD_EXIT,
        Event::Fork { .. } => tag::FORK,
        Event::Module { .. } => tag::MODULE,
        Event::Stack { .. } => tag::STACK,
        Event::Counter { .. } => tag::COUNTER,
        Event::PoolStats { .. } => tag::POOL_STATS,
        Event::StreamDestroy { .. } => tag::STREAM_DESTROY,
        Event::Lost { .. } => tag::LOST,
        Event::Device(_) => tag::DEVICE,
        Event::CallFailed { .. } => tag::CALL_FAILED,
        Event::Torch(_) => tag::TORCH_RUN,
        Event::PyCode { .. } => tag::PY_CODE,
        Event::PyStack { .. } => tag::PY_STACK,
    }
}

// ---------------------------------------------------------------------------------------
// Decoding

// ---------------------------------------------------------------------------------------
// Decoding

fn api_of(v: u64) -> Result<Api, RecordError> {
    u16::try_from(v)
        .ok()
        .and_then(Api::from_u16)
        .ok_or(RecordError::BadValue("api"))
}

#[inline]
fn kind_of(v: u8) -> Result<AllocKind, RecordError> {
    AllocKind::from_u8(v).ok_or(RecordError::BadValue("allocation kind"))
}

/// The control byte and (for an event the model did not predict) the head byte of every
/// event in `payload`: the `TorchRun` payloads of one context, concatenated in order, decoded
/// from a fresh context. For tests that check which forms a fixture holds.
#[doc(hidden)]
pub fn torch_run_layout(payload: &[u8]) -> Result<Vec<(u8, Option<u8>)>, RecordError> {
    let mut d = RecordDecoder::default();
    let mut c = Cur::new(payload);
    let mut out = Event::Lost { t_ns: 0, count: 0 };
    let mut v = Vec::new();
    while c.p < payload.len() {
        let ctrl = payload[c.p];
        let head = (ctrl & torch_run::CTRL_EXPLICIT != 0).then(|| payload.get(c.p + 1).copied());
        d.torch_run_event(&mut c, &mut out)?;
        v.push((ctrl, head.flatten()));
    }
    Ok(v)
}

/// Outcome of decoding one record.
pub(crate) enum Decoded {
    /// An event was written into the output.
    Event,
    /// A `CONTEXT` record (state reset), or an unknown record type (skipped).
    Nothing,
    /// The `END` record.
    End(u64),
}

/// The record-level decoder: delta state plus a small cache for `api`/`kind` lookups.
pub(crate) struct RecordDecoder {
    pub st: DeltaState,
    /// Each slot's `api`/`kind` as checked enums, while `typed_ok` (cleared with the delta
    /// state): records that carry neither field skip the lookups.
    typed: [(Api, AllocKind); 2],
    typed_ok: [bool; 2],
    /// The context's `TorchRun` model (allocated at its first run).
    model: Option<Box<Model>>,
    /// Format v5 and later: a `Context` record may name a model slot (`chain`).
    chained: bool,
    /// The models of the slots named so far (at most [`MODEL_SLOTS`]), kept across frames.
    slots: Vec<SlotModel>,
    /// Which model the current context's `TorchRun` events use.
    using: Using,
}

/// A model slot as the reader follows it (format v5).
#[derive(Default)]
struct SlotModel {
    model: Option<Box<Model>>,
    /// The count of the last context read that named the slot.
    last: u64,
    /// The model is the one the writer had after that context: every context of the chain
    /// since it started afresh was read whole.
    ok: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Using {
    /// The context's own model (reset with it).
    Own,
    /// The model of a slot.
    Slot(usize),
    /// A slot's model that this reader does not have (a context of its chain was not read).
    Unknown,
}

impl Default for RecordDecoder {
    fn default() -> Self {
        RecordDecoder {
            st: DeltaState::default(),
            typed: [(Api::Unknown, AllocKind::Runtime); 2],
            typed_ok: [false; 2],
            model: None,
            chained: false,
            slots: Vec::new(),
            using: Using::Own,
        }
    }
}

impl RecordDecoder {
    /// A decoder for a file whose `Context` records may name a model slot (format v5) or not.
    pub fn chained(chained: bool) -> Self {
        RecordDecoder {
            chained,
            ..RecordDecoder::default()
        }
    }

    pub fn reset(&mut self) {
        self.st.reset(0);
        self.typed_ok = [false; 2];
        if let Some(m) = &mut self.model {
            m.reset();
        }
        self.using = Using::Own;
    }

    /// A `Context` record's `chain` field (format v5): `count << 7 | slot << 1 | fresh`.
    fn chain(&mut self, v: u64) {
        let k = (v >> 1) as usize & (MODEL_SLOTS - 1);
        let n = v >> 7;
        if self.slots.len() <= k {
            self.slots.resize_with(k + 1, SlotModel::default);
        }
        let s = &mut self.slots[k];
        if v & 1 != 0 {
            if let Some(m) = &mut s.model {
                m.reset();
            }
            s.ok = true;
            s.last = n;
            self.using = Using::Slot(k);
        } else if s.ok && s.last.checked_add(1) == Some(n) {
            s.last = n;
            self.using = Using::Slot(k);
        } else {
            // A context of this chain was not read (or not whole): its model is unknown until
            // the chain starts afresh.
            s.ok = false;
            self.using = Using::Unknown;
        }
    }

    /// The current context's `TorchRun` events cannot be decoded: it continues a model
    /// this reader does not have.
    #[inline]
    pub fn model_unknown(&self) -> bool {
        self.using == Using::Unknown
    }

    /// The rest of the current context will not be read (a corrupt record): a slot model it
    /// was updating is no longer the writer's.
    pub fn abandon(&mut self) {
        if let Using::Slot(k) = self.using
            && let Some(s) = self.slots.get_mut(k)
        {
            s.ok = false;
        }
        self.using = Using::Own;
    }

    /// Decodes the `TorchRun` event at `c` (inside a run's payload) into `out`.
    #[inline]
    pub fn torch_run_event(&mut self, c: &mut Cur, out: &mut Event) -> Result<(), RecordError> {
        let m = match self.using {
            Using::Own => self.model.get_or_insert_with(Box::default),
            Using::Slot(k) => match self.slots.get_mut(k) {
                Some(s) => s.model.get_or_insert_with(Box::default),
                None => return Err(RecordError::ModelUnknown),
            },
            Using::Unknown => return Err(RecordError::ModelUnknown),
        };
        let st = &mut self.st;
        let mut cx = torch_run::Ctx {
            tid: st.tid,
            t: st.t,
        };
        let r = torch_run::decode(m, &mut cx, c);
        st.tid = cx.tid;
        st.t = cx.t;
        let op = r?;
        match out {
            Event::Torch(o) => *o = op,
            _ => *out = Event::Torch(op),
        }
        Ok(())
    }

    #[inline]
    fn time(&mut self, c: &mut Cur) -> Result<u64, RecordError> {
        let d = unzigzag(c.varint()?);
        let t = self.st.t.wrapping_add(d as u64);
        self.st.t = t;
        Ok(t)
    }

    /// Decodes one record's payload. `out` is overwritten when an event results.
    #[inline]
    pub fn decode(
        &mut self,
        tag: u8,
        payload: &[u8],
        out: &mut Event,
    ) -> Result<Decoded, RecordError> {
        let mut c = Cur::new(payload);
        match tag {
            tag::ALLOC | tag::FREE | tag::FREE_REF | tag::ALLOC_REUSE => {
                self.decode_memop(tag, &mut c, None, out)?;
                Ok(Decoded::Event)
            }
            tag::CONTEXT => {
                let tid = c.u32v()?;
                self.reset();
                self.st.tid = tid;
                if self.chained && c.p < c.b.len() {
                    let v = c.varint()?;
                    self.chain(v);
                }
                Ok(Decoded::Nothing)
            }
            tag::END => Ok(Decoded::End(self.time(&mut c)?)),
            tag::CAP_REFUSAL => {
                let t_ns = self.time(&mut c)?;
                *out = Event::CapRefusal {
                    t_ns,
                    tid: c.u32v()?,
                    device: c.i32z()?,
                    api: api_of(c.varint()?)?,
                    size: c.varint()?,
                    in_use: c.varint()?,
                    cap: c.varint()?,
                };
                Ok(Decoded::Event)
            }
            tag::POOL_TRIM => {
                let t_ns = self.time(&mut c)?;
                *out = Event::PoolTrim {
                    t_ns,
                    device: c.i32z()?,
                    bytes: c.varint()?,
                    reason: c.u8()?,
                };
                Ok(Decoded::Event)
            }
            tag::SYNC => {
                let t_ns = self.time(&mut c)?;
                *out = Event::Sync {
                    t_ns,
                    tid: c.u32v()?,
                    device: c.i32z()?,
                    kind: SyncKind::from_u8(c.u8()?).ok_or(RecordError::BadValue("sync kind"))?,
                    stream: c.varint()?,
                    latency_ns: c.u32v()?,
                };
                Ok(Decoded::Event)
            }
            tag::MEM_INFO => {
                let t_ns = self.time(&mut c)?;
                *out = Event::MemInfo {
                    t_ns,
                    tid: c.u32v()?,
                    api: api_of(c.varint()?)?,
                    device: c.i32z()?,
                    free: c.varint()?,
                    total: c.varint()?,
                    result: c.i32z()?,
                };
                Ok(Decoded::Event)
            }
            tag::THREAD_START => {
                let t_ns = self.time(&mut c)?;
                *out = Event::ThreadStart {
                    t_ns,
                    tid: c.u32v()?,
                };
                Ok(Decoded::Event)
            }
            tag::THREAD_EXIT => {
                let t_ns = self.time(&mut c)?;
                *out = Event::ThreadExit {
                    t_ns,
                    tid: c.u32v()?,
                };
                Ok(Decoded::Event)
            }
            tag::FORK => {
                let t_ns = self.time(&mut c)?;
                *out = Event::Fork {
                    t_ns,
                    child_pid: c.u32v()?,
                };
                Ok(Decoded::Event)
            }
            tag::MODULE => {
                *out = Event::Module {
                    base: c.varint()?,
                    size: c.varint()?,
                    file_offset: c.varint()?,
                    path: c.string()?,
                };
                Ok(Decoded::Event)
            }
            tag::STACK => {
                let id = c.u32v()?;
                let n = c.varint()?;
                // Each frame takes at least one byte: bounds the allocation by the payload.
                if n > MAX_STACK_FRAMES as u64 || n as usize > payload.len() {
                    return Err(RecordError::BadValue("stack depth"));
                }
                // Reuse the Vec when `out` already is a Stack.
                let mut frames = match std::mem::replace(out, Event::Lost { t_ns: 0, count: 0 }) {
                    Event::Stack { mut frames, .. } => {
                        frames.clear();
                        frames
                    }
                    _ => Vec::with_capacity(n as usize),
                };
                let mut prev = 0u64;
                for _ in 0..n {
                    prev = prev.wrapping_add(unzigzag(c.varint()?) as u64);
                    frames.push(prev);
                }
                *out = Event::Stack { id, frames };
                Ok(Decoded::Event)
            }
            tag::COUNTER => {
                let t_ns = self.time(&mut c)?;
                *out = Event::Counter {
                    t_ns,
                    device: c.i32z()?,
                    live_bytes: c.varint()?,
                    reserved_bytes: c.varint()?,
                    cap: c.varint()?,
                };
                Ok(Decoded::Event)
            }
            tag::POOL_STATS => {
                // absolute time: the delta state is left alone (see the encoder)
                let t_ns = c.varint()?;
                *out = Event::PoolStats {
                    t_ns,
                    device: c.i32z()?,
                    reserved: c.varint()?,
                    live: c.varint()?,
                    cached: c.varint()?,
                    pending: c.varint()?,
                    budget: c.varint()?,
                    releases: c.varint()?,
                };
                Ok(Decoded::Event)
            }
            tag::STREAM_DESTROY => {
                // absolute time: the delta state is left alone (see the encoder)
                let t_ns = c.varint()?;
                *out = Event::StreamDestroy {
                    t_ns,
                    tid: c.u32v()?,
                    device: c.i32z()?,
                    stream: c.varint()?,
                };
                Ok(Decoded::Event)
            }
            tag::LOST => {
                let t_ns = self.time(&mut c)?;
                *out = Event::Lost {
                    t_ns,
                    count: c.varint()?,
                };
                Ok(Decoded::Event)
            }
            tag::CALL_FAILED => {
                let t_ns = self.time(&mut c)?;
                *out = Event::CallFailed {
                    t_ns,
                    tid: c.u32v()?,
                    device: c.i32z()?,
                    result: c.i32z()?,
                    name: c.string()?,
                };
                Ok(Decoded::Event)
            }
            tag::DEVICE => {
                let index = c.i32z()?;
                let total_bytes = c.varint()?;
                let name = c.string()?;
                // Optional trailing field (older writers end the record after the name).
                let uuid = if c.b.len() - c.p >= 16 {
                    <[u8; 16]>::try_from(c.bytes(16)?).ok()
                } else {
                    None
                };
                *out = Event::Device(DeviceInfo {
                    index,
                    name,
                    total_bytes,
                    uuid,
                });
                Ok(Decoded::Event)
            }
            tag::TORCH => {
                let t_ns = self.time(&mut c)?;
                *out = Event::Torch(TorchOp {
                    t_ns,
                    tid: c.u32v()?,
                    action: c.u8()?,
                    device: c.i32z()?,
                    addr: c.varint()?,
                    size: c.varint()?,
                    stream: c.varint()?,
                    segment: c.varint()?,
                    stack: c.u32v()?,
                });
                Ok(Decoded::Event)
            }
            tag::TORCH_DELTA => {
                let head = c.u8()?;
                let action = match head & torch_head::ACTION_ESCAPE {
                    torch_head::ACTION_ESCAPE => c.u8()?,
                    a => a,
                };
                let st = &mut self.st;
                if head & torch_head::TID != 0 {
                    st.tid = c.u32v()?;
                }
                if head & torch_head::PLACE != 0 {
                    st.torch_device = c.i32z()?;
                    st.torch_stream = c.varint()?;
                }
                let k = (head & torch_head::SEGMENT_MASK) >> torch_head::SEGMENT_SHIFT;
                let seg = if k == torch_head::SEGMENT_NEW {
                    st.torch_segments[0].wrapping_add(unzigzag(c.varint()?) as u64)
                } else {
                    st.torch_segments[k as usize]
                };
                st.torch_segment_used(k, seg);
                let stack = if head & torch_head::STACK != 0 {
                    c.u32v()?
                } else {
                    0
                };
                let addr = seg.wrapping_add(torch_offset_of(c.varint()?));
                let size = torch_size_of(c.varint()?);
                let t_ns = self.time(&mut c)?;
                let st = &self.st;
                *out = Event::Torch(TorchOp {
                    t_ns,
                    tid: st.tid,
                    action,
                    device: st.torch_device,
                    addr,
                    size,
                    stream: st.torch_stream,
                    segment: seg,
                    stack,
                });
                Ok(Decoded::Event)
            }
            tag::PY_CODE => {
                *out = Event::PyCode {
                    id: c.u32v()?,
                    file: c.string()?,
                    function: c.string()?,
                    first_line: c.u32v()?,
                };
                Ok(Decoded::Event)
            }
            tag::PY_STACK => {
                let id = c.u32v()?;
                let n = c.varint()?;
                // Each frame takes at least two bytes: bounds the allocation by the payload.
                if n > MAX_STACK_FRAMES as u64 || n as usize > payload.len() / 2 {
                    return Err(RecordError::BadValue("python stack depth"));
                }
                let mut frames = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    frames.push(PyFrame {
                        code: c.u32v()?,
                        line: c.u32v()?,
                    });
                }
                *out = Event::PyStack { id, frames };
                Ok(Decoded::Event)
            }
            _ => Ok(Decoded::Nothing),
        }
    }

    /// Decodes a MemOp record's fields from `c` into `out`; its timing fields come from `c`
    /// (row frames) or from the timing streams of a columnar frame (`cols`).
    #[inline]
    pub fn decode_memop(
        &mut self,
        tag_: u8,
        c: &mut Cur,
        cols: Option<(&[u8], &mut TimeCursor)>,
        out: &mut Event,
    ) -> Result<(), RecordError> {
        let m = self.memop(tag_, c, cols)?;
        let alloc = tag_ == tag::ALLOC || tag_ == tag::ALLOC_REUSE;
        // In place when `out` already holds a MemOp (the common case): no drop, no move.
        match out {
            Event::Alloc(o) if alloc => *o = m,
            Event::Free(o) if !alloc => *o = m,
            _ => {
                *out = if alloc {
                    Event::Alloc(m)
                } else {
                    Event::Free(m)
                }
            }
        }
        Ok(())
    }

    /// The MemOp of one record (row or columnar), without building an [`Event`].
    #[inline(always)]
    pub fn memop_fields(
        &mut self,
        tag_: u8,
        c: &mut Cur,
        cols: Option<(&[u8], &mut TimeCursor)>,
    ) -> Result<MemOp, RecordError> {
        self.memop(tag_, c, cols)
    }

    /// The MemOp fields from `mask` up to the address part, for any mask: updates the slot's
    /// and the context's values; returns (api, kind, flags, result, stack).
    #[inline(always)]
    fn memop_context(
        &mut self,
        mk: u8,
        slot: usize,
        c: &mut Cur,
    ) -> Result<(Api, AllocKind, u8, i32, u32), RecordError> {
        let st = &mut self.st;
        let s = &mut st.slots[slot];
        if mk & mask::API != 0 {
            let v = c.varint()?;
            s.api = u16::try_from(v).map_err(|_| RecordError::BadValue("api"))?;
        }
        if mk & mask::KIND != 0 {
            s.kind = c.u8()?;
        }
        if mk & mask::FLAGS != 0 {
            s.flags = c.u8()?;
        }
        let s = *s;
        let (api, kind) = if mk & (mask::API | mask::KIND) == 0 && self.typed_ok[slot] {
            self.typed[slot]
        } else {
            let api = Api::from_u16(s.api).ok_or(RecordError::BadValue("api"))?;
            let kind = kind_of(s.kind)?;
            self.typed[slot] = (api, kind);
            self.typed_ok[slot] = true;
            (api, kind)
        };
        if mk & mask::DEVICE != 0 {
            st.device = c.i32z()?;
        }
        if mk & mask::STREAM != 0 {
            st.stream = c.varint()?;
        }
        let result = if mk & mask::RESULT != 0 { c.i32z()? } else { 0 };
        let stack = if mk & mask::STACK != 0 { c.u32v()? } else { 0 };
        if mk & mask::TID != 0 {
            st.tid = c.u32v()?;
        }
        Ok((api, kind, s.flags, result, stack))
    }

    #[inline(always)]
    fn memop(
        &mut self,
        tag_: u8,
        c: &mut Cur,
        cols: Option<(&[u8], &mut TimeCursor)>,
    ) -> Result<MemOp, RecordError> {
        let is_alloc = tag_ == tag::ALLOC || tag_ == tag::ALLOC_REUSE;
        let slot = (!is_alloc) as usize;
        let mk = c.u8()?;
        // Most MemOps carry at most a stack id: everything else repeats the slot's and the
        // context's values. One test instead of eight.
        let (api, kind, flags, result, stack) = if mk & !mask::STACK == 0 && self.typed_ok[slot] {
            let (api, kind) = self.typed[slot];
            let stack = if mk != 0 { c.u32v()? } else { 0 };
            (api, kind, self.st.slots[slot].flags, 0, stack)
        } else {
            self.memop_context(mk, slot, c)?
        };
        let st = &mut self.st;
        let (addr, size) = if tag_ == tag::FREE_REF {
            let e = st.live[c.u8()? as usize];
            if e.generation != st.generation {
                return Err(RecordError::BadValue("free reference (empty table slot)"));
            }
            (e.addr, e.size)
        } else if tag_ == tag::ALLOC_REUSE {
            let r = c.u8()?;
            let j = (r & 0x0f) as usize;
            let e = st.freed[st.freed_head.wrapping_sub(1 + j) % FREED];
            if e.generation != st.generation || r & !(0x0f | REUSE_SAME_SIZE) != 0 {
                return Err(RecordError::BadValue("reuse reference (empty ring entry)"));
            }
            st.addr = e.addr;
            let size = if r & REUSE_SAME_SIZE != 0 {
                e.size
            } else {
                c.varint()?
            };
            (e.addr, size)
        } else {
            let addr = st.addr.wrapping_add(unzigzag(c.varint_wide()?) as u64);
            st.addr = addr;
            (addr, c.varint_wide()?)
        };
        let (gap, lat) = match cols {
            None => (c.varint()?, c.varint()?),
            // The timing class is the slot: 0 for Alloc/AllocReuse, 1 for Free/FreeRef.
            Some((raw, tc)) => tc.next(raw, slot)?,
        };
        let t_ns = st.t.wrapping_add(unzigzag(gap) as u64);
        let latency_ns = u32::try_from(lat).map_err(|_| RecordError::BadValue("32-bit field"))?;
        if is_alloc && addr != 0 {
            st.live[live_slot(addr)] = LiveEnt {
                addr,
                size,
                generation: st.generation,
            };
        } else if !is_alloc {
            st.note_free(addr, size);
        }
        st.t = t_ns.wrapping_add(latency_ns as u64);
        Ok(MemOp {
            t_ns,
            tid: st.tid,
            api,
            kind,
            flags,
            device: st.device,
            stream: st.stream,
            addr,
            size,
            result,
            latency_ns,
            stack,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoder's mirror finds exactly what a walk of the freed ring finds, across frees,
    /// allocs, contexts and ring wrap-around (few distinct addresses, so matches are common).
    #[test]
    fn freed_mirror_matches_the_ring_walk() {
        let mut enc = RecordEncoder::new();
        enc.begin(1);
        let mut rng = vramshim_testkit::XorShift(0x2545_f491_4f6c_dd1d);
        for i in 0..200_000u64 {
            let x = rng.next_u64();
            let addr = if x.is_multiple_of(11) {
                0
            } else {
                0x1000 * (x % 37)
            };
            if i % 5000 == 0 {
                enc.context(1);
            }
            let want = enc.st.find_freed(addr).map(|(j, e)| (j, e.addr, e.size));
            let got = if addr == 0 {
                None
            } else {
                find_freed(&enc.freed_addr, &enc.freed_tag, &enc.st, addr)
                    .map(|(j, e)| (j, e.addr, e.size))
            };
            if addr != 0 {
                assert_eq!(got, want, "step {i}, addr {addr:#x}");
            }
            let op = MemOp {
                t_ns: i,
                tid: 1,
                api: Api::CudaMalloc,
                kind: AllocKind::Runtime,
                flags: 0,
                device: 0,
                stream: 0,
                addr,
                size: x % 5,
                result: 0,
                latency_ns: 1,
                stack: 0,
            };
            enc.push(&if x.is_multiple_of(3) {
                Event::Alloc(op)
            } else {
                Event::Free(op)
            });
            if enc.len() > 1 << 20 {
                enc.begin(1);
            }
        }
    }
}
