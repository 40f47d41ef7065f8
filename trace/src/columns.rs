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

use crate::wire::{Cur, RecordError, mask, put_varint, tag};

/// Number of streams in a columnar frame: the records, 4 timing streams per class, then
/// (format v4) the torch stream: the payloads of `TorchRun` records, stored uncompressed
/// (they are coded already).
pub const STREAMS: usize = 10;
/// Streams of a version 2 or 3 columnar frame (no torch stream).
pub const STREAMS_V2: usize = 9;
/// The torch stream's index.
pub const TORCH_STREAM: usize = 9;

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
            if t == tag::TORCH_RUN {
                // The header stays in the records, the coded events go to the torch stream.
                self.s[0].extend_from_slice(&raw[start..body]);
                self.s[TORCH_STREAM].extend_from_slice(&raw[body..end]);
                c.p = end;
                continue;
            }
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

/// Where the reader's timing streams are, and a block of decoded `(gap, latency)` values per
/// class: one tight loop per block instead of two varint reads per record, in blocks small
/// enough to stay in L1 (a whole frame's values would not fit in L2), one check per record.
#[derive(Clone, Debug)]
pub(crate) struct TimeCursor {
    pub pos: [usize; STREAMS],
    pub end: [usize; STREAMS],
    /// Per class: the block's gaps and latencies.
    gap: [[u64; BLOCK]; 2],
    lat: [[u64; BLOCK]; 2],
    /// Values in each class's block, and the next one to hand out.
    len: [usize; 2],
    at: [usize; 2],
    /// The error a class's streams ran into while its block was filled (handed out after the
    /// block): the error the record after the block's last one gets.
    err: [Option<RecordError>; 2],
}

const BLOCK: usize = 256;

impl Default for TimeCursor {
    fn default() -> Self {
        TimeCursor {
            pos: [0; STREAMS],
            end: [0; STREAMS],
            gap: [[0; BLOCK]; 2],
            lat: [[0; BLOCK]; 2],
            len: [0; 2],
            at: [0; 2],
            err: [None; 2],
        }
    }
}

impl TimeCursor {
    /// Starts a frame (`pos`/`end` set).
    pub fn load(&mut self, _raw: &[u8]) {
        self.len = [0; 2];
        self.at = [0; 2];
        self.err = [None; 2];
    }

    /// Decodes up to `BLOCK` values of the column pair `lo` (low bytes) / `lo + 1` (high
    /// varints) into `out`: the values and the error after them are exactly what reading them
    /// one by one gives. Returns how many, and the error when fewer than `BLOCK`.
    #[inline(always)]
    fn fill(
        pos: &mut [usize; STREAMS],
        end: &[usize; STREAMS],
        raw: &[u8],
        lo: usize,
        out: &mut [u64; BLOCK],
    ) -> (usize, Option<RecordError>) {
        let (p, q) = (pos[lo], pos[lo + 1]);
        let n = BLOCK.min(end[lo].saturating_sub(p));
        let qend = end[lo + 1].min(raw.len());
        let (Some(low), Some(high)) = (raw.get(p..p + n), raw.get(q..qend)) else {
            return (0, Some(RecordError::ColumnOverrun));
        };
        if high.len() >= n && high[..n].iter().fold(0, |a, &b| a | b) < 0x80 {
            // Every high part of the block is one byte (the common case): no varints to walk.
            for ((o, &l), &h) in out.iter_mut().zip(low).zip(&high[..n]) {
                *o = l as u64 | (h as u64) << 8;
            }
            pos[lo] = p + n;
            pos[lo + 1] = q + n;
            return (n, (n < BLOCK).then_some(RecordError::ColumnOverrun));
        }
        // Some high parts are longer (a long gap now and then): value by value, the one-byte
        // ones inline.
        let mut j = 0usize;
        for i in 0..n {
            let h = match high.get(j) {
                Some(&h) if h < 0x80 => {
                    j += 1;
                    h as u64
                }
                Some(_) => {
                    let mut c = Cur::new(high);
                    c.p = j;
                    match c.varint() {
                        Ok(h) if h <= u64::MAX >> 8 => {
                            j = c.p;
                            h
                        }
                        Ok(_) => return Self::stop(pos, lo, p, q, j, i, RecordError::BadVarint),
                        Err(RecordError::Overrun) => {
                            return Self::stop(pos, lo, p, q, j, i, RecordError::ColumnOverrun);
                        }
                        Err(e) => return Self::stop(pos, lo, p, q, j, i, e),
                    }
                }
                None => return Self::stop(pos, lo, p, q, j, i, RecordError::ColumnOverrun),
            };
            out[i] = low[i] as u64 | h << 8;
        }
        pos[lo] = p + n;
        pos[lo + 1] = q + j;
        (n, (n < BLOCK).then_some(RecordError::ColumnOverrun))
    }

    #[cold]
    fn stop(
        pos: &mut [usize; STREAMS],
        lo: usize,
        p: usize,
        q: usize,
        j: usize,
        i: usize,
        e: RecordError,
    ) -> (usize, Option<RecordError>) {
        pos[lo] = p + i;
        pos[lo + 1] = q + j;
        (i, Some(e))
    }

    /// Decodes the next block of class `k`'s gaps and latencies. A record gets the gap's
    /// error when its gap is missing, else the latency's (the order of the row layout).
    #[cold]
    #[inline(never)]
    fn refill(&mut self, raw: &[u8], k: usize) -> Result<(), RecordError> {
        if let Some(e) = self.err[k] {
            return Err(e);
        }
        let (ng, eg) = Self::fill(
            &mut self.pos,
            &self.end,
            raw,
            stream(k, 0),
            &mut self.gap[k],
        );
        let (nl, el) = Self::fill(
            &mut self.pos,
            &self.end,
            raw,
            stream(k, 2),
            &mut self.lat[k],
        );
        let n = ng.min(nl);
        if n < BLOCK {
            self.err[k] = if ng <= nl { eg } else { el };
        }
        if n == 0 {
            return Err(self.err[k].unwrap_or(RecordError::ColumnOverrun));
        }
        self.len[k] = n;
        self.at[k] = 0;
        Ok(())
    }

    /// `(gap, latency)` of the next MemOp of `class`, from the streams in `raw`.
    #[inline(always)]
    pub fn next(&mut self, raw: &[u8], class: usize) -> Result<(u64, u64), RecordError> {
        if self.at[class] >= self.len[class] {
            self.refill(raw, class)?;
        }
        let i = self.at[class] & (BLOCK - 1);
        self.at[class] += 1;
        Ok((self.gap[class][i], self.lat[class][i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: one value read on its own, as the format defines it (low byte, then the
    /// high varint; a column that ends first is `ColumnOverrun`).
    fn one(
        raw: &[u8],
        pos: &mut [usize; STREAMS],
        end: &[usize; STREAMS],
        lo: usize,
    ) -> Result<u64, RecordError> {
        if pos[lo] >= end[lo] {
            return Err(RecordError::ColumnOverrun);
        }
        let low = raw[pos[lo]] as u64;
        pos[lo] += 1;
        let mut c = Cur::new(&raw[..end[lo + 1]]);
        c.p = pos[lo + 1];
        let h = c.varint().map_err(|e| match e {
            RecordError::Overrun => RecordError::ColumnOverrun,
            e => e,
        })?;
        pos[lo + 1] = c.p;
        if h > u64::MAX >> 8 {
            return Err(RecordError::BadVarint);
        }
        Ok(low | h << 8)
    }

    /// `TimeCursor::next` gives, record by record, what reading the four columns of a class one
    /// value at a time gives (gap first, then latency), up to and including the first error, on
    /// random columns: short and long high parts, columns of unequal lengths, malformed and
    /// oversized varints, both classes interleaved.
    #[test]
    fn blocks_match_value_by_value() {
        let mut rng = vramshim_testkit::XorShift(0x9e37_79b9_7f4a_7c15);
        let mut rnd = move || rng.next_u64();
        for case in 0..3000 {
            let counts = [rnd() % 700, rnd() % 700];
            let long = rnd() % 4; // how often a high part takes more than one byte
            let mut cols: [Vec<u8>; STREAMS] = Default::default();
            for class in 0..2 {
                for field in [0, 2] {
                    let n = counts[class] + [0, 0, 0, 1, 2][(rnd() % 5) as usize];
                    let n = n.saturating_sub([0, 0, 0, 1, 3][(rnd() % 5) as usize]);
                    for _ in 0..n {
                        let v = match rnd() % 64 {
                            k if k < long * 4 => rnd() >> (rnd() % 64),
                            _ => rnd() % 0x7fff,
                        };
                        cols[stream(class, field)].push(v as u8);
                        put_varint(&mut cols[stream(class, field + 1)], v >> 8);
                    }
                }
            }
            // Often damage high columns: a run of continuation bytes (a malformed or oversized
            // varint), or a column cut short; sometimes both columns of a class at the same
            // value, so that which error a record gets is decided by the gap-first rule.
            if case % 3 == 0 {
                let class = (rnd() % 2) as usize;
                let same = rnd() % 2 == 0;
                let at = rnd() as usize % 700;
                for field in [1, 3] {
                    let s = &mut cols[stream(class, field)];
                    if s.is_empty() || (!same && rnd() % 2 == 0) {
                        continue;
                    }
                    let at = if same { at } else { rnd() as usize } % s.len();
                    let k = (rnd() % 12) as usize + 1;
                    for b in s.iter_mut().skip(at).take(k) {
                        *b = 0xff;
                    }
                    if rnd() % 2 == 0 {
                        s.truncate(at + k / 2);
                    }
                }
            }
            let mut raw = Vec::new();
            let (mut pos, mut end) = ([0; STREAMS], [0; STREAMS]);
            for i in 0..STREAMS {
                pos[i] = raw.len();
                raw.extend_from_slice(&cols[i]);
                end[i] = raw.len();
            }
            let mut tc = TimeCursor {
                pos,
                end,
                ..TimeCursor::default()
            };
            tc.load(&raw);
            let mut rpos = pos;
            let mut done = [false; 2];
            for step in 0..2000 {
                let class = (rnd() % 2) as usize;
                if done[class] {
                    if done[1 - class] {
                        break;
                    }
                    continue;
                }
                let want = one(&raw, &mut rpos, &end, stream(class, 0))
                    .and_then(|g| Ok((g, one(&raw, &mut rpos, &end, stream(class, 2))?)));
                let got = tc.next(&raw, class);
                assert_eq!(got, want, "case {case} step {step} class {class}");
                done[class] = want.is_err();
            }
        }
    }
}
