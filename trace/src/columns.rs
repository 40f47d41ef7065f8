//! Columnar frames (format v2, `docs/trace-format.md` section 5.2).
//!
//! The noisy nanosecond timing fields of Alloc/Free records are most of a trace's entropy;
//! interleaved with the repetitive fields they also hide those fields' repetition from zstd.
//! A columnar frame moves them out of the records into 8 streams (per class alloc/free: gap
//! low byte, gap high part, latency low byte, latency high part) and drops the length prefix
//! of the four MemOp records (their layout is fully self-delimiting); every stream is
//! compressed as its own zstd frame, so each gets its own entropy tables.
//!
//! The writer builds columns from the row records the per-thread encoders produce (the hot
//! path does not change); a buffer it cannot split (only possible for hand-made records)
//! goes out as a row frame, which v2 readers also accept.

use crate::codec::{Cur, RecordError, mask, put_varint, tag};

/// Number of streams in a columnar frame: the records, then 4 timing streams per class.
pub const STREAMS: usize = 9;

/// Timing stream index of (class, field): class 0 = Alloc/AllocReuse, 1 = Free/FreeRef;
/// field 0 = gap low byte, 1 = gap high varint, 2 = latency low byte, 3 = latency high varint.
#[inline]
pub(crate) fn stream(class: usize, field: usize) -> usize {
    1 + 4 * class + field
}

#[inline]
pub(crate) fn is_memop(t: u8) -> bool {
    matches!(t, tag::ALLOC | tag::FREE | tag::FREE_REF | tag::ALLOC_REUSE)
}

#[inline]
pub(crate) fn class_of(t: u8) -> usize {
    (t == tag::FREE || t == tag::FREE_REF) as usize
}

/// Skips a MemOp payload's fields up to its timing fields, reading exactly what the decoder
/// reads (so a split frame decodes to the same events as the row frame).
fn skip_memop_fields(t: u8, c: &mut Cur) -> Result<(), RecordError> {
    let mk = c.u8()?;
    if mk & mask::API != 0 {
        c.varint()?;
    }
    if mk & mask::KIND != 0 {
        c.u8()?;
    }
    if mk & mask::FLAGS != 0 {
        c.u8()?;
    }
    for bit in [
        mask::DEVICE,
        mask::STREAM,
        mask::RESULT,
        mask::STACK,
        mask::TID,
    ] {
        if mk & bit != 0 {
            c.varint()?;
        }
    }
    match t {
        tag::FREE_REF => {
            c.u8()?;
        }
        tag::ALLOC_REUSE => {
            if c.u8()? & 0x10 == 0 {
                c.varint()?;
            }
        }
        _ => {
            c.varint()?;
            c.varint()?;
        }
    }
    Ok(())
}

/// The streams of one columnar frame under construction (buffers reused across frames).
#[derive(Default, Debug)]
pub(crate) struct Columns {
    pub s: [Vec<u8>; STREAMS],
}

impl Columns {
    fn clear(&mut self) {
        for s in &mut self.s {
            s.clear();
        }
    }

    /// Splits whole row records into the streams. False (streams unspecified) when a record
    /// does not parse or a MemOp has trailing bytes: the caller then writes a row frame.
    pub fn split(&mut self, raw: &[u8]) -> bool {
        self.clear();
        self.s[0].reserve(raw.len());
        let mut c = Cur::new(raw);
        while c.p < raw.len() {
            let start = c.p;
            let Ok(t) = c.u8() else { return false };
            let Ok(len) = c.varint() else { return false };
            let body = c.p;
            let Some(end) = usize::try_from(len)
                .ok()
                .and_then(|l| body.checked_add(l))
                .filter(|&e| e <= raw.len())
            else {
                return false;
            };
            if !is_memop(t) {
                self.s[0].extend_from_slice(&raw[start..end]);
                c.p = end;
                continue;
            }
            let mut f = Cur::new(&raw[body..end]);
            if skip_memop_fields(t, &mut f).is_err() {
                return false;
            }
            let times = f.p;
            let (Ok(gap), Ok(lat)) = (f.varint(), f.varint()) else {
                return false;
            };
            if f.p != end - body {
                return false;
            }
            self.s[0].push(t);
            self.s[0].extend_from_slice(&raw[body..body + times]);
            let k = class_of(t);
            self.s[stream(k, 0)].push(gap as u8);
            put_varint(&mut self.s[stream(k, 1)], gap >> 8);
            self.s[stream(k, 2)].push(lat as u8);
            put_varint(&mut self.s[stream(k, 3)], lat >> 8);
            c.p = end;
        }
        true
    }
}

/// Where the reader's timing streams are, and a block of decoded values per (class, field):
/// one tight loop per block instead of two varint reads per record, in blocks small enough to
/// stay in L1 (a whole frame's values would not fit in L2).
#[derive(Clone, Debug)]
pub(crate) struct TimeCursor {
    pub pos: [usize; STREAMS],
    pub end: [usize; STREAMS],
    /// Blocks per (class, field): class 0 gap, class 0 latency, class 1 gap, class 1 latency.
    vals: [[u64; BLOCK]; 4],
    /// Values in each block, and the next one to hand out.
    len: [usize; 4],
    at: [usize; 4],
    /// The error a stream ran into while its block was filled (handed out after the block).
    err: [Option<RecordError>; 4],
}

const BLOCK: usize = 256;

impl Default for TimeCursor {
    fn default() -> Self {
        TimeCursor {
            pos: [0; STREAMS],
            end: [0; STREAMS],
            vals: [[0; BLOCK]; 4],
            len: [0; 4],
            at: [0; 4],
            err: [None; 4],
        }
    }
}

impl TimeCursor {
    /// Starts a frame (`pos`/`end` set).
    pub fn load(&mut self, _raw: &[u8]) {
        self.len = [0; 4];
        self.at = [0; 4];
        self.err = [None; 4];
    }

    /// Decodes the next block of list `k` (stream pair `1 + 2k`); the values and the error
    /// after them are exactly what reading them one by one gives.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, raw: &[u8], k: usize) -> Result<(), RecordError> {
        if let Some(e) = self.err[k] {
            return Err(e);
        }
        let lo = 1 + 2 * k;
        let (p, q) = (self.pos[lo], self.pos[lo + 1]);
        let n = BLOCK.min(self.end[lo].saturating_sub(p));
        let out = &mut self.vals[k];
        if let (Some(low), Some(high)) = (
            raw.get(p..p + n).filter(|_| p + n <= self.end[lo]),
            raw.get(q..q + n).filter(|_| q + n <= self.end[lo + 1]),
        ) && n > 0
            && high.iter().fold(0, |a, &b| a | b) < 0x80
        {
            // Every high part of the block is one byte (the common case): no varints to walk.
            for ((o, &l), &h) in out.iter_mut().zip(low).zip(high) {
                *o = l as u64 | (h as u64) << 8;
            }
            self.pos[lo] = p + n;
            self.pos[lo + 1] = q + n;
            self.len[k] = n;
        } else {
            let mut i = 0;
            while i < BLOCK {
                match self.value(raw, lo) {
                    Ok(x) => {
                        self.vals[k][i] = x;
                        i += 1;
                    }
                    Err(e) => {
                        self.err[k] = Some(e);
                        break;
                    }
                }
            }
            self.len[k] = i;
            if i == 0 {
                return Err(self.err[k].unwrap_or(RecordError::ColumnOverrun));
            }
        }
        self.at[k] = 0;
        Ok(())
    }

    #[inline(always)]
    fn take(&mut self, raw: &[u8], k: usize) -> Result<u64, RecordError> {
        if self.at[k] >= self.len[k] {
            self.refill(raw, k)?;
        }
        let v = self.vals[k][self.at[k] & (BLOCK - 1)];
        self.at[k] += 1;
        Ok(v)
    }

    /// `(gap, latency)` of the next MemOp of `class`, from the streams in `raw`.
    #[inline(always)]
    pub fn next(&mut self, raw: &[u8], class: usize) -> Result<(u64, u64), RecordError> {
        let gap = self.take(raw, 2 * class)?;
        let lat = self.take(raw, 2 * class + 1)?;
        Ok((gap, lat))
    }

    #[inline(always)]
    fn value(&mut self, raw: &[u8], lo: usize) -> Result<u64, RecordError> {
        // Fast path: a one-byte high part (values below 32 Ki).
        let (p, q) = (self.pos[lo], self.pos[lo + 1]);
        if p < self.end[lo]
            && q < self.end[lo + 1]
            && let (Some(&l), Some(&h)) = (raw.get(p), raw.get(q))
            && h < 0x80
        {
            self.pos[lo] = p + 1;
            self.pos[lo + 1] = q + 1;
            return Ok(l as u64 | (h as u64) << 8);
        }
        self.value_slow(raw, lo)
    }

    #[cold]
    #[inline(never)]
    fn value_slow(&mut self, raw: &[u8], lo: usize) -> Result<u64, RecordError> {
        let p = self.pos[lo];
        if p >= self.end[lo] {
            return Err(RecordError::ColumnOverrun);
        }
        let low = *raw.get(p).ok_or(RecordError::ColumnOverrun)? as u64;
        self.pos[lo] = p + 1;
        let hi = lo + 1;
        let mut c = Cur::new(raw.get(..self.end[hi]).ok_or(RecordError::ColumnOverrun)?);
        c.p = self.pos[hi];
        let h = c.varint().map_err(|e| match e {
            RecordError::Overrun => RecordError::ColumnOverrun,
            e => e,
        })?;
        self.pos[hi] = c.p;
        if h > u64::MAX >> 8 {
            return Err(RecordError::BadVarint);
        }
        Ok(low | h << 8)
    }
}
