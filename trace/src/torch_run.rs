//! `TorchRun` records (format v4, tag 25): runs of PyTorch allocator events coded against a
//! model of the context's earlier events, instead of records that zstd then compresses.
//!
//! A training step repeats: the same sequence of (action, size, Python stack) recurs each
//! step (and each layer within a step), and a block is usually freed soon after it was
//! allocated and reallocated soon after it was freed. The model keeps, per context (it resets
//! with the delta state, at every frame start and `Context` record):
//!
//! * a table indexed by a hash of the last three events' (action, size, stack), holding the
//!   (action, size, stack) that followed that context last time: a *predicted* event takes
//!   none of those fields;
//! * two rings of the last 32 places (address, segment): of blocks freed (where an
//!   allocation looks for its address) and of blocks allocated (where every other action
//!   looks): an address found among the newest 28 is written as its distance, in the
//!   control byte's spare bits. (The decoder keeps the rings; the encoder finds the distance
//!   through an index of its own, which names the same places: [`Model::find`].)
//!
//! The time is the only field written for every event, as 1-3 little-endian bytes (its length
//! in the control byte). Measured on a GPT-2 run's events: ~5 bytes an event, against ~12
//! raw bytes for a `TorchDelta` record that zstd brought to ~7. See `docs/trace-format.md`,
//! "TorchRun" for the layout; the coder is written so that an event costs a few dozen
//! instructions: fixed-size stores, one table probe, one ring probe.

use crate::event::TorchOp;
use crate::wire::{
    Cur, RecordError, put_varint_at as wv, torch_head, torch_offset, torch_size, unzigzag,
};

/// Places per ring (a power of two), and how many of the newest a control byte can name.
const RING: usize = 32;
pub(crate) const RING_REFS: u8 = 28;
/// Prediction table: 2^TABLE_BITS entries.
const TABLE_BITS: u32 = 10;
const TABLE: usize = 1 << TABLE_BITS;
/// Encoder-side index of each ring (address hash -> the place and its push number).
const FIND_BITS: u32 = 6;

/// Control byte: bits 0-1 the time's form, bit 2 the event is not predicted (its fields
/// follow), bits 3-7 the place: a ring distance (0-27) or `RING_REFS + k` (an explicit
/// address in recent segment k, k = 3 a new segment).
pub(crate) const CTRL_TIME: u8 = 0x03;
pub(crate) const CTRL_EXPLICIT: u8 = 0x04;
pub(crate) const CTRL_PLACE_SHIFT: u8 = 3;
/// Time form 3: a zigzag varint (negative or 2^24 ns and more); 0-2: 1-3 bytes.
pub(crate) const TIME_VARINT: u8 = 3;

/// A prediction: the size, and the stack, action and the model's epoch packed in one word
/// (stack in bits 0-31, action in 32-39, epoch in 40-63), so a probe is two compares.
#[derive(Clone, Copy, Default, Debug)]
struct Pred {
    size: u64,
    meta: u64,
}

#[inline(always)]
fn meta(stack: u32, action: u8, epoch: u32) -> u64 {
    stack as u64 | (action as u64) << 32 | (epoch as u64) << 40
}

/// Epochs live in 24 bits of [`Pred::meta`]; the table is cleared when they wrap.
const EPOCH_MASK: u32 = (1 << 24) - 1;

#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Place {
    addr: u64,
    seg: u64,
}

/// An encoder's index entry: a place pushed on a ring, and its number among the pushes on
/// that ring (counted across resets, see [`Model::pushes`]). The encoder needs no ring of its
/// own: an entry whose number is among the newest [`RING_REFS`] names the place the
/// decoder's ring holds at that distance.
#[derive(Clone, Copy, Default, Debug)]
struct Found {
    addr: u64,
    seg: u64,
    seq: u64,
}

/// The model both sides keep (boxed: ~27 KiB, allocated at a context's first PyTorch event).
#[derive(Clone, Debug)]
pub(crate) struct Model {
    epoch: u32,
    table: [Pred; TABLE],
    /// Key hashes of the last three events, newest first.
    hist: [u64; 3],
    /// Decoder only: 0: places of blocks freed (action 2), looked up by allocations (action
    /// 0); 1: places of blocks allocated, looked up by every other action; and the pushes on
    /// each since the reset.
    rings: [[Place; RING]; 2],
    counts: [u32; 2],
    /// Encoder only: per ring, the newest place pushed whose address hashes to the entry.
    find: [[Found; 1 << FIND_BITS]; 2],
    /// Encoder only: per ring, the pushes since the model was made, plus `RING` at every
    /// reset, so that no place pushed before a reset is among the newest `RING_REFS` after
    /// it (the index is never cleared).
    pushes: [u64; 2],
    /// The previous event's device and stream, and the three most recent segments of
    /// explicit places (most recent first).
    device: i32,
    stream: u64,
    segments: [u64; 3],
    /// Encoder only: the context's thread and time while a row of events is coded (the
    /// codec's delta state, copied in and out around the row: kept here, in memory, rather
    /// than in the coder's registers, which the loop needs for the event).
    pub cx: Ctx,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            epoch: 1,
            table: [Pred::default(); TABLE],
            hist: [0; 3],
            rings: [[Place::default(); RING]; 2],
            counts: [0; 2],
            find: [[Found::default(); 1 << FIND_BITS]; 2],
            // As after a reset: an entry nothing was put in (number 0) is never among the
            // newest `RING_REFS`, so its empty place is never taken for the ring's.
            pushes: [RING as u64; 2],
            device: 0,
            stream: 0,
            segments: [0; 3],
            cx: Ctx { tid: 0, t: 0 },
        }
    }
}

#[inline(always)]
fn key_hash(action: u8, size: u64, stack: u32) -> u64 {
    (size ^ (stack as u64) << 40 ^ (action as u64) << 60).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[inline(always)]
fn find_slot(addr: u64) -> usize {
    ((addr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FIND_BITS)) as usize
}

/// The ring an event of `action` looks its place up in.
#[inline(always)]
fn ring_of(action: u8) -> usize {
    (action != 0) as usize
}

impl Model {
    /// Forgets everything (a new context): the table by generation, the rings by count.
    pub fn reset(&mut self) {
        self.epoch = (self.epoch + 1) & EPOCH_MASK;
        if self.epoch == 0 {
            self.table = [Pred::default(); TABLE];
            self.epoch = 1;
        }
        self.hist = [0; 3];
        self.counts = [0; 2];
        self.pushes = self.pushes.map(|n| n + RING as u64);
        self.device = 0;
        self.stream = 0;
        self.segments = [0; 3];
    }

    #[inline(always)]
    fn slot(&self) -> usize {
        let h = self.hist[0] ^ self.hist[1].rotate_left(21) ^ self.hist[2].rotate_left(42);
        (h.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> (64 - TABLE_BITS)) as usize
    }

    /// After an event: the prediction for its context and the history.
    #[inline(always)]
    fn learn_pred(&mut self, slot: usize, mt: u64, size: u64, stack: u32, action: u8) {
        self.table[slot] = Pred { size, meta: mt };
        self.hist = [key_hash(action, size, stack), self.hist[0], self.hist[1]];
    }

    /// Decoder: after an event, the ring of its action gets its place.
    #[inline(always)]
    fn learn_ring(&mut self, action: u8, place: Place) {
        let r = match action {
            0 => 1,
            2 => 0,
            _ => return,
        };
        let n = self.counts[r];
        self.rings[r][n as usize % RING] = place;
        self.counts[r] = n.wrapping_add(1);
    }

    /// Encoder: after an event, the index of its action's ring gets its place (`fs`: its
    /// [`find_slot`]).
    #[inline(always)]
    fn learn_find(&mut self, action: u8, place: Place, fs: usize) {
        let r = match action {
            0 => 1,
            2 => 0,
            _ => return,
        };
        let seq = self.pushes[r];
        self.find[r][fs] = Found {
            addr: place.addr,
            seg: place.seg,
            seq,
        };
        self.pushes[r] = seq + 1;
    }

    /// Encoder: the distance (0 = newest) of `place` in the ring `action` looks in, when it
    /// is among the newest `RING_REFS` pushed since the reset (`fs`: its [`find_slot`]). The
    /// decoder's ring holds the place at that distance: the entry was its newest push there,
    /// and a push since the reset (the count jumped by `RING` at the reset).
    #[inline(always)]
    fn find(&self, action: u8, place: Place, fs: usize) -> Option<u8> {
        let r = ring_of(action);
        let e = self.find[r][fs];
        let j = self.pushes[r].wrapping_sub(e.seq).wrapping_sub(1);
        (e.addr == place.addr && e.seg == place.seg && j < RING_REFS as u64).then_some(j as u8)
    }
}

/// The delta state's thread and time, which `TorchRun` events share with the context's
/// other records: copied in and out by the codec, so that the coder works on registers. (The
/// device, stream and recent segments are the model's own.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub tid: u32,
    pub t: u64,
}

/// A PyTorch allocator event as the coder reads it: field by field, where it lies (a
/// [`TorchOp`], or an entry of the interposer's buffers, whose fields sit in other places),
/// so that the coder's loop reads each field from the event's memory when it needs it
/// instead of holding a copy in registers it does not have.
pub trait TorchFields {
    fn t_ns(&self) -> u64;
    fn tid(&self) -> u32;
    fn action(&self) -> u8;
    fn device(&self) -> i32;
    fn addr(&self) -> u64;
    fn size(&self) -> u64;
    fn stream(&self) -> u64;
    fn segment(&self) -> u64;
    fn stack(&self) -> u32;
    /// The event as a [`TorchOp`].
    #[inline(always)]
    fn to_op(&self) -> TorchOp {
        TorchOp {
            t_ns: self.t_ns(),
            tid: self.tid(),
            action: self.action(),
            device: self.device(),
            addr: self.addr(),
            size: self.size(),
            stream: self.stream(),
            segment: self.segment(),
            stack: self.stack(),
        }
    }
}

impl TorchFields for TorchOp {
    #[inline(always)]
    fn t_ns(&self) -> u64 {
        self.t_ns
    }
    #[inline(always)]
    fn tid(&self) -> u32 {
        self.tid
    }
    #[inline(always)]
    fn action(&self) -> u8 {
        self.action
    }
    #[inline(always)]
    fn device(&self) -> i32 {
        self.device
    }
    #[inline(always)]
    fn addr(&self) -> u64 {
        self.addr
    }
    #[inline(always)]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline(always)]
    fn stream(&self) -> u64 {
        self.stream
    }
    #[inline(always)]
    fn segment(&self) -> u64 {
        self.segment
    }
    #[inline(always)]
    fn stack(&self) -> u32 {
        self.stack
    }
}

/// Scratch size of one coded event (its largest form is 68 bytes).
pub(crate) const EV_MAX: usize = 128;

/// True when a `TorchRun` event can hold `op`'s offset into its segment and its size (the
/// caller writes a `Torch` record otherwise). One test for the usual values (a size under
/// 2^63, an offset of magnitude under 2^62), the exact forms for the rest.
#[inline(always)]
pub(crate) fn holds<T: TorchFields>(op: &T) -> bool {
    let off = op.addr().wrapping_sub(op.segment());
    (op.size() | off.wrapping_add(1 << 62)) >> 63 == 0
        || torch_offset(off).is_some() && torch_size(op.size()).is_some()
}

/// Codes `op` (which [`holds`] accepts) into `b`; returns its length. Updates the model and
/// the context. The usual event (its place in a ring, or predicted) takes no varint: the
/// offset and size forms are made only where they are written.
#[inline(always)]
pub(crate) fn encode<T: TorchFields>(m: &mut Model, op: &T, b: &mut [u8; EV_MAX]) -> usize {
    // Each field read where it is used (from the event's memory).
    let slot = m.slot();
    let p = m.table[slot];
    let mt = meta(op.stack(), op.action(), m.epoch);
    // One test for the prediction: every compared field XORed into one word.
    let predicted = ((p.meta ^ mt)
        | (p.size ^ op.size())
        | (op.tid() ^ m.cx.tid) as u64
        | (op.device() ^ m.device) as u64
        | (op.stream() ^ m.stream))
        == 0;
    let place = Place {
        addr: op.addr(),
        seg: op.segment(),
    };
    let fs = find_slot(place.addr);
    let found = m.find(op.action(), place, fs);
    let dt = op.t_ns().wrapping_sub(m.cx.t);
    let mut n = 1;
    if !predicted {
        n = explicit_fields(b, op, m);
    }
    let pc = match found {
        Some(j) => j,
        None => explicit_place(b, &mut n, op, m),
    };
    let ctrl = (!predicted as u8) << 2 | pc << CTRL_PLACE_SHIFT;
    if dt < 1 << 24 {
        // 1-3 bytes: four stored, the form from the highest set bit. (n <= 52 here: never
        // past the scratch.)
        let tf = ((64 - (dt | 1).leading_zeros() as u8 - 1) >> 3).min(2);
        b[0] = ctrl | tf;
        if let Some(w) = b.get_mut(n..n + 4) {
            w.copy_from_slice(&(dt as u32).to_le_bytes());
        }
        n += tf as usize + 1;
    } else {
        b[0] = ctrl | TIME_VARINT;
        n = wv(b, n, crate::wire::zigzag(dt as i64));
    }
    m.cx.t = op.t_ns();
    m.learn_pred(slot, mt, op.size(), op.stack(), op.action());
    m.learn_find(op.action(), place, fs);
    n
}

/// An address not found in the rings: its segment as one of the three most recent or as a
/// difference from the newest, then its offset; returns the control byte's place.
#[inline(always)]
fn explicit_place<T: TorchFields>(
    b: &mut [u8; EV_MAX],
    n: &mut usize,
    op: &T,
    m: &mut Model,
) -> u8 {
    let s = &mut m.segments;
    let k = if op.segment() == s[0] {
        0
    } else if op.segment() == s[1] {
        s.swap(0, 1);
        1
    } else if op.segment() == s[2] {
        *s = [s[2], s[0], s[1]];
        2
    } else {
        *n = wv(
            b,
            *n,
            crate::wire::zigzag(op.segment().wrapping_sub(s[0]) as i64),
        );
        *s = [op.segment(), s[0], s[1]];
        torch_head::SEGMENT_NEW
    };
    let off = torch_offset(op.addr().wrapping_sub(op.segment())).unwrap_or(0);
    *n = wv(b, *n, off);
    RING_REFS + k
}

/// The fields of an event the model did not predict (a `TorchDelta` head byte, then what it
/// says follows, then the size), from `b[1]`; sets the context's thread and place. Out of
/// line: the rarer form.
#[inline(never)]
fn explicit_fields<T: TorchFields>(b: &mut [u8; EV_MAX], op: &T, m: &mut Model) -> usize {
    let mut head = op.action().min(torch_head::ACTION_ESCAPE);
    if op.tid() != m.cx.tid {
        head |= torch_head::TID;
    }
    if op.device() != m.device || op.stream() != m.stream {
        head |= torch_head::PLACE;
    }
    if op.stack() != 0 {
        head |= torch_head::STACK;
    }
    b[1] = head;
    let mut n = 2;
    if head & torch_head::ACTION_ESCAPE == torch_head::ACTION_ESCAPE {
        b[n] = op.action();
        n += 1;
    }
    if head & torch_head::TID != 0 {
        n = wv(b, n, op.tid() as u64);
    }
    if head & torch_head::PLACE != 0 {
        n = wv(b, n, crate::wire::zigzag(op.device() as i64));
        n = wv(b, n, op.stream());
    }
    if head & torch_head::STACK != 0 {
        n = wv(b, n, op.stack() as u64);
    }
    m.cx.tid = op.tid();
    m.device = op.device();
    m.stream = op.stream();
    wv(b, n, torch_size(op.size()).unwrap_or(0))
}

/// Decodes one event of a run from `c` (positioned at its control byte): the inverse of
/// [`encode`], with every reference checked (an empty ring entry, a prediction the model
/// does not have, reserved bits: a corrupt record, never a panic).
#[inline]
pub(crate) fn decode(m: &mut Model, cx: &mut Ctx, c: &mut Cur) -> Result<TorchOp, RecordError> {
    let ctrl = c.u8()?;
    let slot = m.slot();
    let (action, size, stack) = if ctrl & CTRL_EXPLICIT != 0 {
        let head = c.u8()?;
        if head & torch_head::SEGMENT_MASK != 0 {
            return Err(RecordError::BadValue("torch run event head"));
        }
        let action = match head & torch_head::ACTION_ESCAPE {
            torch_head::ACTION_ESCAPE => c.u8()?,
            a => a,
        };
        if head & torch_head::TID != 0 {
            cx.tid = c.u32v()?;
        }
        if head & torch_head::PLACE != 0 {
            m.device = c.i32z()?;
            m.stream = c.varint()?;
        }
        let stack = if head & torch_head::STACK != 0 {
            c.u32v()?
        } else {
            0
        };
        let size = crate::wire::torch_size_of(c.varint()?);
        (action, size, stack)
    } else {
        let p = m.table[slot];
        if p.meta >> 40 != m.epoch as u64 {
            return Err(RecordError::BadValue(
                "torch run event predicted where nothing was learnt",
            ));
        }
        ((p.meta >> 32) as u8, p.size, p.meta as u32)
    };
    let pc = ctrl >> CTRL_PLACE_SHIFT;
    let place = if pc < RING_REFS {
        let r = ring_of(action);
        let n = m.counts[r];
        if pc as u32 >= n {
            return Err(RecordError::BadValue(
                "torch run ring reference (empty entry)",
            ));
        }
        m.rings[r][(n - 1 - pc as u32) as usize % RING]
    } else {
        let k = pc - RING_REFS;
        let s = &mut m.segments;
        let seg = if k == torch_head::SEGMENT_NEW {
            s[0].wrapping_add(unzigzag(c.varint()?) as u64)
        } else {
            s[k as usize]
        };
        match k {
            0 => {}
            1 => s.swap(0, 1),
            2 => *s = [s[2], s[0], s[1]],
            _ => *s = [seg, s[0], s[1]],
        }
        Place {
            addr: seg.wrapping_add(crate::wire::torch_offset_of(c.varint()?)),
            seg,
        }
    };
    let tf = ctrl & CTRL_TIME;
    let dt = if tf == TIME_VARINT {
        unzigzag(c.varint()?) as u64
    } else {
        let b = c.bytes(tf as usize + 1)?;
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let t_ns = cx.t.wrapping_add(dt);
    cx.t = t_ns;
    m.learn_pred(slot, meta(stack, action, m.epoch), size, stack, action);
    m.learn_ring(action, place);
    Ok(TorchOp {
        t_ns,
        tid: cx.tid,
        action,
        device: m.device,
        addr: place.addr,
        size,
        stream: m.stream,
        segment: place.seg,
        stack,
    })
}
