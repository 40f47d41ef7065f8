//! `TraceReader`: header, then events frame by frame; tolerant of a torn tail.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::codec::{Decoded, RecordDecoder};
use crate::columns::{STREAMS, STREAMS_V2, TORCH_STREAM, TimeCursor, is_memop};
use crate::event::{Event, Header, MemOp};
use crate::header::{
    CHAINED_SINCE, COLUMNAR_SINCE, FORMAT_VERSION, MAGIC, MAX_HEADER, TORCH_RUN_SINCE,
    decode_header,
};
use crate::wire::{Cur, RecordError, tag};
use crate::writer::{
    FRAME_HEADER_LEN, FRAME_MAGIC, FRAME_MAGIC_COLUMNAR, MAX_FRAME_COMPRESSED, MAX_FRAME_RAW,
};

/// What went wrong, without the position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeErrorKind {
    /// The file is empty.
    Empty,
    /// The file does not start with the `.vramtrace` magic.
    NotATrace,
    /// The file was written by a newer vramshim whose format this reader does not know.
    FutureVersion { found: u32, supported: u32 },
    /// The version field is 0: no vramshim writes it (versions start at 1).
    InvalidVersion,
    /// The file ends inside the preamble or header.
    TruncatedHeader,
    /// The header is malformed.
    BadHeader(String),
    /// A frame envelope is malformed (bad magic or impossible lengths). The reader no longer
    /// returns it: it ends the trace there with [`TruncationReason::Damaged`] instead, so the
    /// frames before the damage stay readable.
    BadFrame(String),
    /// A frame's zstd data does not decompress (corrupt); the frame is skipped.
    CorruptFrame(String),
    /// A record inside a frame is malformed; the rest of that frame is skipped.
    CorruptRecord(String),
    /// An I/O error from the underlying reader.
    Io(io::ErrorKind, String),
}

/// A decode error with its position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Byte offset in the file: of the problem for preamble errors, of the frame's envelope
    /// for frame and record errors.
    pub offset: u64,
    /// For record errors, the byte offset of the record inside the uncompressed frame.
    pub record_offset: Option<u64>,
    pub kind: DecodeErrorKind,
}

impl DecodeError {
    fn at(offset: u64, kind: DecodeErrorKind) -> Self {
        DecodeError {
            offset,
            record_offset: None,
            kind,
        }
    }

    /// True when the reader can go on after this error (the next frame is still readable).
    pub fn is_recoverable(&self) -> bool {
        matches!(
            self.kind,
            DecodeErrorKind::CorruptFrame(_) | DecodeErrorKind::CorruptRecord(_)
        )
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DecodeErrorKind::*;
        match &self.kind {
            Empty => write!(f, "empty file (not a vramshim trace)"),
            NotATrace => write!(f, "not a vramshim trace (no .vramtrace magic at byte 0)"),
            FutureVersion { found, supported } => write!(
                f,
                "trace format version {found} is newer than this vramshim supports \
                 (up to {supported}); upgrade vramshim to read it"
            ),
            InvalidVersion => write!(
                f,
                "trace format version 0 at byte 14 is not a valid version (versions start at \
                 1): a damaged header"
            ),
            TruncatedHeader => write!(
                f,
                "trace header truncated at byte {} (file cut before any event)",
                self.offset
            ),
            BadHeader(m) => write!(f, "corrupt trace header at byte {}: {m}", self.offset),
            BadFrame(m) => write!(f, "corrupt frame at byte {}: {m}", self.offset),
            CorruptFrame(m) => write!(
                f,
                "corrupt frame at byte {}: {m} (frame skipped)",
                self.offset
            ),
            CorruptRecord(m) => write!(
                f,
                "corrupt record at byte {} of the frame at byte {}: {m} (rest of frame skipped)",
                self.record_offset.unwrap_or(0),
                self.offset
            ),
            Io(_, m) => write!(f, "read error at byte {}: {m}", self.offset),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a trace ended early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TruncationReason {
    /// The last frame is incomplete (the process was killed while writing it): `have` of `need`
    /// bytes of it are present. Everything before it was read.
    TornFrame { have: u64, need: u64 },
    /// All frames are complete but the trace has no end record: the process was killed
    /// between flushes (or is still running). Events after the last flush are missing.
    NoEndRecord,
    /// What follows the last good frame is not a frame (garbage, or a frame envelope with
    /// bad magic or impossible lengths): reading stopped there. `frame` is the 1-based number
    /// of the frame that should have started at the offset, `skipped` the bytes from there to
    /// the end of the file, `what` what was wrong with them. The rest is never read whole (a
    /// damaged file may be many GB): a file opened by path is measured by its size; a stream
    /// of unknown length is counted up to [`DAMAGE_COUNT_MAX`] bytes, and past that
    /// `skipped_exact` is false and `skipped` is a lower bound.
    Damaged {
        frame: u64,
        skipped: u64,
        skipped_exact: bool,
        what: String,
    },
}

/// Where and why a trace ends without its end record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// File offset where readable data ends (start of the torn frame, or end of file).
    pub offset: u64,
    pub reason: TruncationReason,
}

impl Truncation {
    /// True when bytes of the file were not read (a torn last frame, or damage after the last
    /// good frame); false when the trace merely lacks its end record.
    pub fn is_damage(&self) -> bool {
        !matches!(self.reason, TruncationReason::NoEndRecord)
    }
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            TruncationReason::TornFrame { have, need } => write!(
                f,
                "trace truncated at byte {}: last frame torn ({have} of {need} bytes); \
                 everything before it was read",
                self.offset
            ),
            TruncationReason::NoEndRecord => write!(
                f,
                "trace ends at byte {} without an end record (process killed, or still \
                 running); events after the last flush are missing",
                self.offset
            ),
            TruncationReason::Damaged {
                frame,
                skipped,
                skipped_exact,
                what,
            } => write!(
                f,
                "trace damaged at byte {} (frame {frame}): {what}; skipped {} bytes \
                 from there to the end of the file; everything before it ({} frame{}) was read",
                self.offset,
                if *skipped_exact {
                    skipped.to_string()
                } else {
                    format!("at least {skipped}")
                },
                frame.saturating_sub(1),
                if *frame == 2 { "" } else { "s" }
            ),
        }
    }
}

/// Envelope of one frame, as found in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// File offset of the envelope.
    pub offset: u64,
    pub compressed_len: u32,
    pub raw_len: u32,
    pub records: u32,
    /// Smallest and largest timestamp of the frame's timed records (0, 0 when none).
    pub t_min: u64,
    pub t_max: u64,
}

enum State {
    Frames,
    Done,
}

/// After damage, the most bytes of a stream of unknown length read to count what was skipped
/// (a file opened by path is measured by its size instead, nothing read).
pub const DAMAGE_COUNT_MAX: u64 = 1 << 20;

/// Reads a `.vramtrace` stream.
///
/// ```no_run
/// # use vramshim_trace::*;
/// let mut r = TraceReader::open("job.vramtrace")?;
/// println!("pid {}", r.header().pid);
/// let mut ev = Event::Lost { t_ns: 0, count: 0 };
/// while r.next_into(&mut ev)? {
///     // ... use ev (no allocation per Alloc/Free event)
/// }
/// if let Some(t) = r.truncation() {
///     eprintln!("warning: {t}");
/// }
/// # Ok::<(), DecodeError>(())
/// ```
pub struct TraceReader<R: Read> {
    r: R,
    /// File offset of the next unread byte of `r`.
    pos: u64,
    header: Header,
    dctx: zstd::bulk::Decompressor<'static>,
    comp: Vec<u8>,
    /// The frame's uncompressed bytes: the records, then (columnar frames) the timing streams.
    raw: Vec<u8>,
    /// Next record in `raw`, and the end of the records.
    rp: usize,
    rend: usize,
    /// The current frame is columnar; `tc` walks its timing streams.
    columnar: bool,
    tc: TimeCursor,
    /// Inside a `TorchRun` record: its events' bytes are `raw[run_p..run_end]` (in the
    /// record, or in a columnar frame's torch stream); `run_rec` is the record's offset.
    run_p: usize,
    run_end: usize,
    run_rec: usize,
    version: u32,
    frame: Option<FrameInfo>,
    dec: RecordDecoder,
    state: State,
    truncation: Option<Truncation>,
    /// The stream's length, when known (a file opened by path: its size then).
    len: Option<u64>,
    end: Option<u64>,
    frames: u64,
    events: u64,
    scratch: Event,
    /// Skipping the rest of a context whose `TorchRun` model is unknown (format v5: it
    /// continues a model from a context not read), up to the next `Context` record.
    skip_ctx: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DecodeError> {
        let f = File::open(path.as_ref()).map_err(|e| io_err(0, &e))?;
        let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
        // A frame body larger than the buffer is read past it (no copy): 64 KiB holds the
        // envelopes and small frames.
        let mut r = Self::from_reader(BufReader::with_capacity(64 << 10, f))?;
        r.len = len;
        Ok(r)
    }
}

fn io_err(offset: u64, e: &io::Error) -> DecodeError {
    DecodeError::at(offset, DecodeErrorKind::Io(e.kind(), e.to_string()))
}

/// Reads until `buf` is full or EOF; returns the number of bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads up to `len` bytes into `v[..]`, growing `v` only as data actually arrives, so a hostile
/// length never allocates more than the file holds (plus one 64 KiB step); returns the number
/// of bytes read (the data is `v[..n]`). `v` keeps its length between calls: the next frame
/// reads into bytes already initialised instead of zeroing them again (~4 instructions per event
/// on a 10M-event trace), and in one call for all of them, so a `BufReader` hands over what it
/// holds and the rest goes straight from the file (a read larger than its buffer bypasses it).
fn read_exactish<R: Read>(r: &mut R, v: &mut Vec<u8>, len: usize) -> io::Result<usize> {
    let mut have = 0;
    while have < len {
        if v.len() <= have {
            v.resize(have + (len - have).min(64 << 10), 0);
        }
        let want = v.len().min(len);
        let k = read_full(r, &mut v[have..want])?;
        have += k;
        if have < want {
            break;
        }
    }
    Ok(have)
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the preamble and header.
    pub fn from_reader(mut r: R) -> Result<Self, DecodeError> {
        let mut pre = [0u8; 22];
        let n = read_full(&mut r, &mut pre).map_err(|e| io_err(0, &e))?;
        if n == 0 {
            return Err(DecodeError::at(0, DecodeErrorKind::Empty));
        }
        let m = n.min(MAGIC.len());
        if pre[..m] != MAGIC[..m] {
            return Err(DecodeError::at(0, DecodeErrorKind::NotATrace));
        }
        if n < pre.len() {
            return Err(DecodeError::at(n as u64, DecodeErrorKind::TruncatedHeader));
        }
        let version = u32::from_le_bytes(pre[14..18].try_into().unwrap_or_default());
        if version == 0 {
            return Err(DecodeError::at(14, DecodeErrorKind::InvalidVersion));
        }
        if version > FORMAT_VERSION {
            return Err(DecodeError::at(
                14,
                DecodeErrorKind::FutureVersion {
                    found: version,
                    supported: FORMAT_VERSION,
                },
            ));
        }
        let hlen = u32::from_le_bytes(pre[18..22].try_into().unwrap_or_default()) as usize;
        if hlen > MAX_HEADER {
            return Err(DecodeError::at(
                18,
                DecodeErrorKind::BadHeader(format!("header length {hlen} exceeds {MAX_HEADER}")),
            ));
        }
        let mut hbuf = Vec::new();
        let got = read_exactish(&mut r, &mut hbuf, hlen).map_err(|e| io_err(22, &e))?;
        if got < hlen {
            return Err(DecodeError::at(
                22 + got as u64,
                DecodeErrorKind::TruncatedHeader,
            ));
        }
        let header = decode_header(&hbuf[..hlen], version)
            .map_err(|e| DecodeError::at(22, DecodeErrorKind::BadHeader(e.to_string())))?;
        Ok(TraceReader {
            r,
            pos: 22 + hlen as u64,
            header,
            dctx: zstd::bulk::Decompressor::new().map_err(|e| io_err(0, &e))?,
            comp: Vec::new(),
            raw: Vec::new(),
            rp: 0,
            rend: 0,
            columnar: false,
            tc: TimeCursor::default(),
            run_p: 0,
            run_end: 0,
            run_rec: 0,
            version,
            frame: None,
            dec: RecordDecoder::chained(version >= CHAINED_SINCE),
            state: State::Frames,
            truncation: None,
            len: None,
            end: None,
            frames: 0,
            events: 0,
            scratch: Event::Lost { t_ns: 0, count: 0 },
            skip_ctx: false,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// After iteration: why the trace ended early, if it did (`None` for a clean end).
    pub fn truncation(&self) -> Option<&Truncation> {
        self.truncation.as_ref()
    }

    /// The time of the end record, once read (`None` if not reached or absent).
    pub fn end_time(&self) -> Option<u64> {
        self.end
    }

    /// Frames fully read so far.
    pub fn frames_read(&self) -> u64 {
        self.frames
    }

    /// Events returned so far.
    pub fn events_read(&self) -> u64 {
        self.events
    }

    /// The envelope of the frame being decoded.
    pub fn current_frame(&self) -> Option<FrameInfo> {
        self.frame
    }

    /// File offset of the next unread byte (all frames before it have been loaded).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Decodes the next event into `out` (reusing its storage). Returns `Ok(false)` at the end
    /// of the trace. A recoverable error (corrupt frame or record) skips the rest of that frame;
    /// calling again continues with the next frame. After any other error, returns `Ok(false)`.
    #[inline]
    pub fn next_into(&mut self, out: &mut Event) -> Result<bool, DecodeError> {
        loop {
            if self.rp < self.rend || self.run_p < self.run_end {
                let at = self.record_offset();
                match self.record(out) {
                    Ok(true) => {
                        self.events += 1;
                        return Ok(true);
                    }
                    Ok(false) => continue,
                    Err(e) => {
                        self.after_error(&e);
                        return Err(DecodeError {
                            offset: self.frame.map(|f| f.offset).unwrap_or(0),
                            record_offset: Some(at as u64),
                            kind: DecodeErrorKind::CorruptRecord(e.to_string()),
                        });
                    }
                }
            }
            match self.state {
                State::Done => return Ok(false),
                State::Frames => self.load_frame()?,
            }
        }
    }

    /// Where the next record (or the run it continues) starts, for errors.
    #[inline]
    fn record_offset(&self) -> usize {
        if self.run_p < self.run_end {
            self.run_rec
        } else {
            self.rp
        }
    }

    /// Decodes one record at `rp` (or the next event of the open `TorchRun`). Ok(true) =
    /// event in `out`.
    #[inline]
    fn record(&mut self, out: &mut Event) -> Result<bool, RecordError> {
        if self.run_p < self.run_end {
            let mut c = Cur::new(&self.raw[..self.run_end]);
            c.p = self.run_p;
            self.dec.torch_run_event(&mut c, out)?;
            self.run_p = c.p;
            return Ok(true);
        }
        let raw = &self.raw[self.rp..self.rend];
        let tag = raw[0];
        if self.skip_ctx {
            if tag == tag::CONTEXT {
                self.skip_ctx = false;
            } else if !defines(tag) {
                return self.skip_record(tag);
            }
        }
        if self.columnar && is_memop(tag) {
            // No length prefix: the fields delimit themselves; timing comes from the streams.
            let mut c = Cur::new(&raw[1..]);
            self.dec
                .decode_memop(tag, &mut c, Some((&self.raw, &mut self.tc)), out)?;
            self.rp += 1 + c.p;
            return Ok(true);
        }
        // Inline fast path for one-byte lengths.
        let (len, hl) = match raw.get(1) {
            Some(&b) if b < 0x80 => (b as usize, 2),
            Some(_) => {
                let mut c = Cur::new(&raw[1..]);
                let l = c.varint()?;
                // (A columnar frame's `TorchRun` has its payload in the torch stream.)
                if l > raw.len() as u64 && !(self.columnar && tag == tag::TORCH_RUN) {
                    return Err(RecordError::Overrun);
                }
                (l as usize, 1 + c.p)
            }
            None => return Err(RecordError::Overrun),
        };
        if tag == tag::TORCH_RUN {
            // Tag 25 is a `TorchRun` only from format v4 on; an older file that holds one is
            // damaged (its writer never wrote one), not a run to decode with v4's rules.
            if self.version < TORCH_RUN_SINCE {
                return Err(RecordError::BadValue(
                    "record tag 25 (TorchRun) in a trace of format version 1 to 3 (TorchRun records are format 4 and later)",
                ));
            }
            // A run of a context whose model this reader does not have: skipped with the rest
            // of the context (one error; the frame's other contexts are read).
            if self.dec.model_unknown() {
                self.skip_ctx = true;
                self.skip_record(tag)?;
                return Err(RecordError::ModelUnknown);
            }
            // The run's events are decoded one per call from here on.
            let (p, end) = if self.columnar {
                let p = self.tc.pos[TORCH_STREAM];
                let end = p.checked_add(len).ok_or(RecordError::ColumnOverrun)?;
                if len > MAX_FRAME_RAW {
                    return Err(RecordError::ColumnOverrun);
                }
                if end > self.tc.end[TORCH_STREAM] {
                    return Err(RecordError::ColumnOverrun);
                }
                self.tc.pos[TORCH_STREAM] = end;
                self.run_rec = self.rp;
                self.rp += hl;
                (p, end)
            } else {
                if hl + len > raw.len() {
                    return Err(RecordError::Overrun);
                }
                let p = self.rp + hl;
                self.run_rec = self.rp;
                self.rp = p + len;
                (p, p + len)
            };
            self.run_p = p;
            self.run_end = end;
            return Ok(false);
        }
        let payload = raw.get(hl..hl + len).ok_or(RecordError::Overrun)?;
        let r = self.dec.decode(tag, payload, out)?;
        self.rp += hl + len;
        match r {
            Decoded::Event => Ok(true),
            Decoded::Nothing => Ok(false),
            Decoded::End(t) => {
                self.end = Some(t);
                Ok(false)
            }
        }
    }

    /// After a record error: the rest of the frame is skipped (a slot model the context was
    /// updating is then unknown), except for [`RecordError::ModelUnknown`], after which the
    /// reader skips to the next context ([`Self::skip_record`]).
    fn after_error(&mut self, e: &RecordError) {
        if *e != RecordError::ModelUnknown {
            self.rp = self.rend;
            self.run_end = 0;
            self.skip_ctx = false;
            self.dec.abandon();
        }
    }

    /// Steps over the record at `rp` (tag `tag`, not a `Context`) without an event: a MemOp of
    /// a columnar frame is decoded (its timing columns advance), a `TorchRun` skips its
    /// payload (in the torch stream of a columnar frame), any other record its length.
    #[cold]
    fn skip_record(&mut self, tag: u8) -> Result<bool, RecordError> {
        let raw = &self.raw[self.rp..self.rend];
        if self.columnar && is_memop(tag) {
            let mut c = Cur::new(&raw[1..]);
            let mut scratch = Event::Lost { t_ns: 0, count: 0 };
            self.dec
                .decode_memop(tag, &mut c, Some((&self.raw, &mut self.tc)), &mut scratch)?;
            self.rp += 1 + c.p;
            return Ok(false);
        }
        let mut c = Cur::new(raw.get(1..).unwrap_or_default());
        let len = c.varint()?;
        let hl = 1 + c.p;
        if self.columnar && tag == tag::TORCH_RUN {
            let p = self.tc.pos[TORCH_STREAM];
            let end = usize::try_from(len)
                .ok()
                .filter(|&l| l <= MAX_FRAME_RAW)
                .and_then(|l| p.checked_add(l))
                .filter(|&e| e <= self.tc.end[TORCH_STREAM])
                .ok_or(RecordError::ColumnOverrun)?;
            self.tc.pos[TORCH_STREAM] = end;
            self.rp += hl;
            return Ok(false);
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| hl.checked_add(l).is_some_and(|e| e <= raw.len()))
            .ok_or(RecordError::Overrun)?;
        self.rp += hl + len;
        Ok(false)
    }

    fn stop(&mut self, reason: Option<Truncation>) {
        self.state = State::Done;
        self.raw.clear();
        self.rp = 0;
        self.rend = 0;
        self.run_p = 0;
        self.run_end = 0;
        if self.truncation.is_none() {
            self.truncation = reason;
        }
    }

    /// Ends the trace at `off`, where the bytes are not a frame (`read` of them already
    /// consumed), saying how much was skipped: for a file of known size, the rest of it by
    /// its size (nothing read: a damaged file may be many GB); else the rest counted in
    /// fixed-size chunks, never held, up to [`DAMAGE_COUNT_MAX`] bytes (then "at least").
    #[cold]
    fn damaged(&mut self, off: u64, read: usize, what: String) {
        let read = read as u64;
        let (skipped, skipped_exact) = match self.len {
            // A file that grew since it was opened is counted like a stream.
            Some(len) if len >= off + read => (len - off, true),
            _ => self.count_rest(read),
        };
        self.pos = off + skipped;
        self.stop(Some(Truncation {
            offset: off,
            reason: TruncationReason::Damaged {
                frame: self.frames + 1,
                skipped,
                skipped_exact,
                what,
            },
        }));
    }

    /// The bytes left in the stream, `read` of them already consumed: (count, true) when the
    /// end came within [`DAMAGE_COUNT_MAX`] bytes, else (what was counted, false).
    fn count_rest(&mut self, read: u64) -> (u64, bool) {
        let mut skipped = read;
        let mut buf = [0u8; 8192];
        while skipped < DAMAGE_COUNT_MAX {
            let want = buf.len().min((DAMAGE_COUNT_MAX - skipped) as usize);
            match self.r.read(&mut buf[..want]) {
                Ok(0) => return (skipped, true),
                Ok(k) => skipped += k as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The count is informative only: what was read is kept either way.
                Err(_) => return (skipped, false),
            }
        }
        // The cap reached: one more byte says whether that was the end.
        loop {
            match self.r.read(&mut buf[..1]) {
                Ok(0) => return (skipped, true),
                Ok(_) => return (skipped + 1, false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return (skipped, false),
            }
        }
    }

    /// Reads the next frame envelope and body into `raw`. Sets `Done` at the end.
    fn load_frame(&mut self) -> Result<(), DecodeError> {
        // `raw` keeps the previous frame's bytes (reused by columnar frames); only
        // `rp..rend` is ever read.
        self.rp = 0;
        self.rend = 0;
        self.run_p = 0;
        self.run_end = 0;
        self.skip_ctx = false;
        let off = self.pos;
        let mut env = [0u8; FRAME_HEADER_LEN];
        let n = match read_full(&mut self.r, &mut env) {
            Ok(n) => n,
            Err(e) => {
                self.stop(None);
                return Err(io_err(off, &e));
            }
        };
        self.pos += n as u64;
        if n == 0 {
            let t = if self.end.is_none() {
                Some(Truncation {
                    offset: off,
                    reason: TruncationReason::NoEndRecord,
                })
            } else {
                None
            };
            self.stop(t);
            return Ok(());
        }
        let columnar =
            self.version >= COLUMNAR_SINCE && env[..n.min(4)] == FRAME_MAGIC_COLUMNAR[..n.min(4)];
        if !columnar && env[..n.min(4)] != FRAME_MAGIC[..n.min(4)] {
            self.damaged(
                off,
                n,
                "no frame magic (garbage after the last frame?)".into(),
            );
            return Ok(());
        }
        if n < FRAME_HEADER_LEN {
            self.stop(Some(Truncation {
                offset: off,
                reason: TruncationReason::TornFrame {
                    have: n as u64,
                    need: FRAME_HEADER_LEN as u64,
                },
            }));
            return Ok(());
        }
        let le32 = |i: usize| u32::from_le_bytes([env[i], env[i + 1], env[i + 2], env[i + 3]]);
        let le64 = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&env[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let info = FrameInfo {
            offset: off,
            compressed_len: le32(4),
            raw_len: le32(8),
            records: le32(12),
            t_min: le64(16),
            t_max: le64(24),
        };
        let clen = info.compressed_len as usize;
        let rlen = info.raw_len as usize;
        if clen > MAX_FRAME_COMPRESSED || rlen > MAX_FRAME_RAW || clen == 0 {
            let what =
                format!("frame envelope with impossible lengths (compressed {clen}, raw {rlen})");
            self.damaged(off, n, what);
            return Ok(());
        }
        let got = match read_exactish(&mut self.r, &mut self.comp, clen) {
            Ok(g) => g,
            Err(e) => {
                self.stop(None);
                return Err(io_err(self.pos, &e));
            }
        };
        self.pos += got as u64;
        if got < clen {
            self.stop(Some(Truncation {
                offset: off,
                reason: TruncationReason::TornFrame {
                    have: (FRAME_HEADER_LEN + got) as u64,
                    need: (FRAME_HEADER_LEN + clen) as u64,
                },
            }));
            return Ok(());
        }
        self.frame = Some(info);
        self.frames += 1;
        self.dec.reset();
        self.columnar = columnar;
        let r = if columnar {
            self.load_columns(clen, rlen)
        } else {
            self.raw.clear();
            if self.raw.capacity() < rlen {
                self.raw.reserve(rlen);
            }
            match self
                .dctx
                .decompress_to_buffer(&self.comp[..clen], &mut self.raw)
            {
                Ok(k) if k == rlen => Ok(()),
                Ok(k) => Err(format!("decompressed to {k} bytes, envelope says {rlen}")),
                Err(e) => Err(format!("zstd: {e}")),
            }
        };
        match r {
            Ok(()) => {
                if !columnar {
                    self.rend = self.raw.len();
                }
                Ok(())
            }
            Err(m) => {
                self.raw.clear();
                self.rend = 0;
                Err(DecodeError::at(off, DecodeErrorKind::CorruptFrame(m)))
            }
        }
    }

    /// Decompresses a columnar frame body (in `comp`) into `raw`: the stream directory, then
    /// every stream as its own zstd frame, laid out back to back.
    fn load_columns(&mut self, clen: usize, rlen: usize) -> Result<(), String> {
        let body = &self.comp[..clen];
        // Version 4 added the torch stream; earlier frames have 9 streams.
        let want = if self.version >= TORCH_RUN_SINCE {
            STREAMS
        } else {
            STREAMS_V2
        };
        let count = body.first().map_or(0, |&c| c as usize);
        if count != want && count != STREAMS_V2 {
            return Err(format!(
                "columnar frame: bad stream directory ({count} streams; expected {want})"
            ));
        }
        let dir_len = 1 + 8 * count;
        if body.len() < dir_len {
            return Err(format!(
                "columnar frame: stream directory cut short ({} of {dir_len} bytes)",
                body.len()
            ));
        }
        let le32 = |i: usize| {
            u32::from_le_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]) as usize
        };
        let (mut raw_sum, mut comp_sum) = (0usize, dir_len);
        for i in 0..count {
            raw_sum += le32(1 + 8 * i);
            comp_sum += le32(5 + 8 * i);
        }
        if raw_sum != rlen || comp_sum != body.len() {
            return Err(format!(
                "columnar frame: streams hold {raw_sum} raw / {comp_sum} compressed bytes, \
                 envelope says {rlen} / {}",
                body.len()
            ));
        }
        // rlen <= MAX_FRAME_RAW was checked with the envelope. Every byte is overwritten
        // below, so the previous frame's bytes are reused and only growth is zeroed.
        self.raw.resize(rlen, 0);
        let (mut rp, mut cp) = (0usize, dir_len);
        for i in 0..STREAMS {
            // A 9-stream frame's torch stream is empty.
            let (r, c) = if i < count {
                (le32(1 + 8 * i), le32(5 + 8 * i))
            } else {
                (0, 0)
            };
            if r > 0 || c > 0 {
                let k = self
                    .dctx
                    .decompress_to_buffer(&body[cp..cp + c], &mut self.raw[rp..rp + r])
                    .map_err(|e| format!("zstd (stream {i}): {e}"))?;
                if k != r {
                    return Err(format!(
                        "stream {i} decompressed to {k} bytes, directory says {r}"
                    ));
                }
            }
            self.tc.pos[i] = rp;
            self.tc.end[i] = rp + r;
            rp += r;
            cp += c;
        }
        self.rend = self.tc.end[0];
        self.tc.load(&self.raw);
        Ok(())
    }
}

/// Receives the events of [`TraceReader::visit_frame`] without an [`Event`] per Alloc/Free.
pub trait Visitor {
    /// An `Alloc` (`alloc`) or `Free`; `m` is only borrowed for the call.
    fn memop(&mut self, alloc: bool, m: &MemOp);
    /// Any other event.
    fn event(&mut self, ev: Event);
}

impl<R: Read> TraceReader<R> {
    /// Decodes every remaining record of the current frame (loading the next frame first when
    /// none is left) into `v`: the same events in the same order as [`TraceReader::next_into`],
    /// with the same errors, but a frame at a time, so a monomorphised visitor runs inside the
    /// decode loop. `Ok(false)` at the end of the trace; a recoverable error skips the rest of
    /// its frame, after the events before it were visited.
    pub fn visit_frame<V: Visitor>(&mut self, v: &mut V) -> Result<bool, DecodeError> {
        while self.rp >= self.rend && self.run_p >= self.run_end {
            match self.state {
                State::Done => return Ok(false),
                State::Frames => self.load_frame()?,
            }
        }
        let mut rp = self.rp;
        let rend = self.rend;
        let mut n = 0u64;
        let r = 'records: loop {
            if self.columnar && self.run_p >= self.run_end && !self.skip_ctx {
                // A run of MemOp records: one cursor over the record stream, no re-slicing.
                let (recs, raw) = (&self.raw[..rend], &self.raw[..]);
                let mut c = Cur::new(recs);
                c.p = rp;
                while let Some(&tag_) = c.b.get(c.p)
                    && is_memop(tag_)
                {
                    let at = c.p;
                    c.p += 1;
                    match self
                        .dec
                        .memop_fields(tag_, &mut c, Some((raw, &mut self.tc)))
                    {
                        Ok(m) => {
                            n += 1;
                            v.memop(tag_ == tag::ALLOC || tag_ == tag::ALLOC_REUSE, &m);
                        }
                        Err(e) => break 'records Err((at, e)),
                    }
                }
                rp = c.p;
            }
            if rp >= rend && self.run_p >= self.run_end {
                break Ok(());
            }
            self.rp = rp;
            let at = self.record_offset();
            let mut ev = std::mem::replace(&mut self.scratch, Event::Lost { t_ns: 0, count: 0 });
            match self.record(&mut ev) {
                Ok(true) => {
                    n += 1;
                    match ev {
                        Event::Alloc(m) => v.memop(true, &m),
                        Event::Free(m) => v.memop(false, &m),
                        ev => v.event(ev),
                    }
                }
                Ok(false) => self.scratch = ev,
                Err(e) => break Err((at, e)),
            }
            rp = self.rp;
        };
        self.events += n;
        match r {
            Ok(()) => {
                self.rp = rend;
                Ok(true)
            }
            Err((at, e)) => {
                self.after_error(&e);
                Err(DecodeError {
                    offset: self.frame.map(|f| f.offset).unwrap_or(0),
                    record_offset: Some(at as u64),
                    kind: DecodeErrorKind::CorruptRecord(e.to_string()),
                })
            }
        }
    }
}

/// Records that need none of the context's state (untimed, or `PoolStats` and `StreamDestroy`,
/// timed in full), among
/// them those that name something for the rest of the file (`Module`, `Stack`, `Device`,
/// `PyCode`, `PyStack`: written once a process, referred to by id from any later frame): a
/// context skipped for a `TorchRun` model the reader lacks still gives them.
#[inline]
fn defines(tag: u8) -> bool {
    matches!(
        tag,
        tag::MODULE
            | tag::STACK
            | tag::DEVICE
            | tag::PY_CODE
            | tag::PY_STACK
            | tag::POOL_STATS
            | tag::STREAM_DESTROY
    )
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Event, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut ev = std::mem::replace(&mut self.scratch, Event::Lost { t_ns: 0, count: 0 });
        match self.next_into(&mut ev) {
            Ok(true) => Some(Ok(ev)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}
