//! The wire primitives of a frame's records, below both the record codec (`codec`) and the
//! columnar timing streams (`columns`): record tags and presence bits, varints, zigzag,
//! strings, and the bounds-checked cursor every decoder reads through.

/// Record type tags. Values are part of the format: never renumber, only append.
pub mod tag {
    /// Reset all delta state and set the current thread id. Payload: `tid varint`.
    pub const CONTEXT: u8 = 1;
    /// Clean end of trace. Payload: `dt zigzag`.
    pub const END: u8 = 2;
    pub const ALLOC: u8 = 3;
    pub const FREE: u8 = 4;
    pub const CAP_REFUSAL: u8 = 5;
    pub const POOL_TRIM: u8 = 6;
    pub const SYNC: u8 = 7;
    pub const MEM_INFO: u8 = 8;
    pub const THREAD_START: u8 = 9;
    pub const THREAD_EXIT: u8 = 10;
    pub const FORK: u8 = 11;
    pub const MODULE: u8 = 12;
    pub const STACK: u8 = 13;
    pub const COUNTER: u8 = 14;
    pub const LOST: u8 = 15;
    pub const DEVICE: u8 = 16;
    /// A `Free` of the block in slot `s` of the recent-allocation table (address and size
    /// taken from there).
    pub const FREE_REF: u8 = 17;
    /// An `Alloc` that got the address of one of the last 16 frees (ring index instead of
    /// the address, and the size omitted when it is the freed block's).
    pub const ALLOC_REUSE: u8 = 18;
    /// A failed call that is not an allocation (`Event::CallFailed`).
    pub const CALL_FAILED: u8 = 19;
    /// An event of PyTorch's caching allocator (`Event::Torch`).
    pub const TORCH: u8 = 20;
    /// A Python code object's names (`Event::PyCode`).
    pub const PY_CODE: u8 = 21;
    /// A deduplicated Python stack (`Event::PyStack`).
    pub const PY_STACK: u8 = 22;
    /// The pool's statistics (`Event::PoolStats`).
    pub const POOL_STATS: u8 = 23;
    /// An event of PyTorch's caching allocator (`Event::Torch`), its fields as deltas from
    /// the context's previous one ([`super::torch_head`]); written instead of `TORCH` since
    /// format version 3.
    pub const TORCH_DELTA: u8 = 24;
    /// A run of PyTorch allocator events (`Event::Torch`) coded against the context's model
    /// of the events before them (`crate::torch_run`); written instead of `TORCH_DELTA` since
    /// format version 4. In a columnar frame its payload is in the torch stream.
    pub const TORCH_RUN: u8 = 25;
    /// The process destroyed a stream (`Event::StreamDestroy`); timed in full, like
    /// `POOL_STATS`, so a reader written before it skips it with its delta state intact.
    pub const STREAM_DESTROY: u8 = 26;
}

/// Head byte of a `TORCH_DELTA` record: the action in the low 3 bits (7: an action byte
/// follows), which recent segment the block lies in (2 bits), then presence bits for the
/// fields that differ from the context's state.
pub mod torch_head {
    /// Low 3 bits: the action (0-6); this value means "an action byte follows".
    pub const ACTION_ESCAPE: u8 = 0x07;
    /// Bits 3-4: the segment is the context's most recent one (0), second (1) or third (2)
    /// most recent, or a new one whose delta from the most recent follows (3).
    pub const SEGMENT_SHIFT: u8 = 3;
    pub const SEGMENT_MASK: u8 = 0x18;
    pub const SEGMENT_NEW: u8 = 3;
    /// `tid: varint` follows (and becomes the context's thread).
    pub const TID: u8 = 0x20;
    /// `device: zigzag`, `stream: varint` follow (and become the context's).
    pub const PLACE: u8 = 0x40;
    /// `stack: varint` follows (else 0, none).
    pub const STACK: u8 = 0x80;
}

/// A `TORCH_DELTA` record's block offset (address minus segment): the varint `v` holds
/// `zigzag(offset / 512) << 1` when the offset is a multiple of 512 (PyTorch's blocks are),
/// else `zigzag(offset) << 1 | 1`. None when the offset does not fit (|offset| >= 2^62).
#[inline]
pub(crate) fn torch_offset(off: u64) -> Option<u64> {
    let q = off as i64;
    if q & 511 == 0 {
        Some(zigzag(q >> 9) << 1)
    } else {
        let z = zigzag(q);
        (z >> 63 == 0).then_some(z << 1 | 1)
    }
}

#[inline]
pub(crate) fn torch_offset_of(v: u64) -> u64 {
    if v & 1 == 0 {
        (unzigzag(v >> 1) << 9) as u64
    } else {
        unzigzag(v >> 1) as u64
    }
}

/// A `TORCH_DELTA` record's size: `(size / 256) << 1` when a multiple of 256, else
/// `size << 1 | 1`. None when it does not fit (an odd size of 2^63 or more).
#[inline]
pub(crate) fn torch_size(size: u64) -> Option<u64> {
    if size & 255 == 0 {
        Some(size >> 7)
    } else {
        (size >> 63 == 0).then_some(size << 1 | 1)
    }
}

#[inline]
pub(crate) fn torch_size_of(v: u64) -> u64 {
    if v & 1 == 0 { v << 7 } else { v >> 1 }
}

/// MemOp presence bits (first payload byte of `ALLOC`/`FREE`).
pub mod mask {
    pub const API: u8 = 0x01;
    pub const KIND: u8 = 0x02;
    pub const FLAGS: u8 = 0x04;
    pub const DEVICE: u8 = 0x08;
    pub const STREAM: u8 = 0x10;
    pub const RESULT: u8 = 0x20;
    pub const STACK: u8 = 0x40;
    pub const TID: u8 = 0x80;
}

/// Largest stack a `STACK` record may hold (decoder cap).
pub const MAX_STACK_FRAMES: usize = 1024;
/// Largest string a record or the header may hold (decoder cap).
pub const MAX_STRING: usize = 64 * 1024;

/// Writes `v` as a varint at `b[n..]` of a fixed-size scratch record (positions modulo `N`, a
/// power of two larger than any record written there: never reached, but no bounds check
/// is left in the coder), returns the new position. Most fields take one or two bytes: no
/// loop for those.
#[inline(always)]
pub(crate) fn put_varint_at<const N: usize>(b: &mut [u8; N], mut n: usize, mut v: u64) -> usize {
    if v < 0x80 {
        b[n % N] = v as u8;
        return n + 1;
    }
    if v < 0x4000 {
        b[n % N] = (v as u8) | 0x80;
        b[(n + 1) % N] = (v >> 7) as u8;
        return n + 2;
    }
    while v >= 0x80 {
        b[n % N] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    b[n % N] = v as u8;
    n + 1
}

#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    let b = &b[..b.len().min(MAX_STRING)];
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Why a record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The record (or its length) runs past the end of the frame.
    Overrun,
    /// A varint longer than 10 bytes.
    BadVarint,
    /// A field holds a value this reader does not know (e.g. an API number).
    BadValue(&'static str),
    /// A columnar frame's timing stream ends before its records do.
    ColumnOverrun,
    /// `TorchRun` events of a context that continues a model (format v5) from a context this
    /// reader did not read whole: the rest of the context is skipped, not the frame.
    ModelUnknown,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Overrun => write!(f, "record runs past the end of its frame"),
            RecordError::BadVarint => write!(f, "malformed varint"),
            RecordError::BadValue(what) => write!(f, "invalid {what}"),
            RecordError::ColumnOverrun => {
                write!(f, "timing column ends before the frame's records do")
            }
            RecordError::ModelUnknown => write!(
                f,
                "PyTorch allocator events coded against a model from an earlier frame that was not read whole (damaged or missing): the rest of their context is skipped, up to the next context"
            ),
        }
    }
}

/// A bounds-checked cursor over a payload.
pub(crate) struct Cur<'a> {
    pub b: &'a [u8],
    pub p: usize,
}

impl<'a> Cur<'a> {
    #[inline]
    pub fn new(b: &'a [u8]) -> Self {
        Cur { b, p: 0 }
    }
    #[inline]
    pub fn u8(&mut self) -> Result<u8, RecordError> {
        let v = *self.b.get(self.p).ok_or(RecordError::Overrun)?;
        self.p += 1;
        Ok(v)
    }
    #[inline(always)]
    pub fn varint(&mut self) -> Result<u64, RecordError> {
        if let Some(&first) = self.b.get(self.p) {
            if first < 0x80 {
                self.p += 1;
                return Ok(first as u64);
            }
            if let Some(&second) = self.b.get(self.p + 1)
                && second < 0x80
            {
                self.p += 2;
                return Ok((first & 0x7f) as u64 | (second as u64) << 7);
            }
        }
        self.varint_wide()
    }

    /// [`Cur::varint`] without the one- and two-byte shortcuts: for fields whose length varies
    /// from record to record (addresses, sizes), where those branches mispredict.
    #[inline(always)]
    pub fn varint_wide(&mut self) -> Result<u64, RecordError> {
        // Up to 8 bytes at once when 8 are readable (all but a record stream's last bytes):
        // the 7-bit groups of a little-endian word are packed with three mask-and-shift steps,
        // with no branch on the length (field lengths vary from record to record).
        if let Some(w) = self.b.get(self.p..self.p + 8) {
            let w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            let stops = !w & 0x8080_8080_8080_8080;
            if stops != 0 {
                let bits = stops.trailing_zeros() + 1; // through the last byte's top bit
                let x = w & (u64::MAX >> (64 - bits));
                let x = x & 0x7f7f_7f7f_7f7f_7f7f;
                let x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
                let x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
                let x = ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff);
                self.p += (bits / 8) as usize;
                return Ok(x);
            }
        }
        self.varint_slow()
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, RecordError> {
        if let Some(&first) = self.b.get(self.p)
            && first < 0x80
        {
            self.p += 1;
            return Ok(first as u64);
        }
        self.varint_loop()
    }

    #[inline(never)]
    fn varint_loop(&mut self) -> Result<u64, RecordError> {
        let b = self.b;
        let mut p = self.p;
        let first = *b.get(p).ok_or(RecordError::Overrun)?;
        p += 1;
        if first < 0x80 {
            self.p = p;
            return Ok(first as u64);
        }
        let mut v = (first & 0x7f) as u64;
        let mut shift = 7;
        loop {
            let x = *b.get(p).ok_or(RecordError::Overrun)?;
            p += 1;
            if shift == 63 && x > 1 {
                return Err(RecordError::BadVarint);
            }
            v |= ((x & 0x7f) as u64) << shift;
            if x < 0x80 {
                self.p = p;
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(RecordError::BadVarint);
            }
        }
    }
    #[inline]
    pub fn u32v(&mut self) -> Result<u32, RecordError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| RecordError::BadValue("32-bit field"))
    }
    #[inline]
    pub fn i32z(&mut self) -> Result<i32, RecordError> {
        let v = unzigzag(self.varint()?);
        i32::try_from(v).map_err(|_| RecordError::BadValue("32-bit signed field"))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self.p.checked_add(n).ok_or(RecordError::Overrun)?;
        let s = self.b.get(self.p..end).ok_or(RecordError::Overrun)?;
        self.p = end;
        Ok(s)
    }
    pub fn string(&mut self) -> Result<String, RecordError> {
        let n = self.varint()?;
        if n > MAX_STRING as u64 {
            return Err(RecordError::BadValue("string length"));
        }
        let s = self.bytes(n as usize)?;
        Ok(String::from_utf8_lossy(s).into_owned())
    }
}

#[cfg(test)]
mod varint_tests {
    use super::*;

    /// The word-at-a-time path reads every varint (canonical or padded, followed by other
    /// bytes or at the end of the buffer) exactly as the byte loop does.
    #[test]
    fn word_path_matches_the_byte_loop() {
        let mut rng = vramshim_testkit::XorShift(0x1234_5678_9abc_def1);
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for i in 0..20_000u64 {
            let x = rng.next_u64();
            let v = x >> (i % 64);
            let mut b = Vec::new();
            put_varint(&mut b, v);
            if i % 5 == 0 {
                // Non-canonical: a padded last group.
                let last = b.len() - 1;
                b[last] |= 0x80;
                b.push(0);
            }
            b.extend(std::iter::repeat_n((x >> 8) as u8, (i % 12) as usize));
            cases.push(b);
        }
        cases.push(vec![0xff; 12]);
        cases.push(vec![0x80; 9]);
        for b in &cases {
            let mut fast = Cur::new(b);
            let mut slow = Cur::new(b);
            let mut wide = Cur::new(b);
            let f = fast.varint();
            let w = wide.varint_wide();
            let s = slow.varint_loop();
            assert_eq!(f, s, "{b:02x?}");
            assert_eq!(w, s, "{b:02x?}");
            if s.is_ok() {
                assert_eq!(fast.p, slow.p, "{b:02x?}");
                assert_eq!(wide.p, slow.p, "{b:02x?}");
            }
        }
    }
}
