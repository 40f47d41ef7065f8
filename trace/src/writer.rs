//! `TraceWriter`: header, then independent zstd frames of whole records.

use std::io::{self, Write};

use crate::codec::{RecordEncoder, RecordStats};
use crate::columns::{Columns, STREAMS, TORCH_STREAM};
use crate::event::{Event, Header};
use crate::header::encode_preamble;

/// Envelope magic of a row frame (one zstd frame of length-prefixed records).
pub const FRAME_MAGIC: [u8; 4] = *b"VRFR";
/// Envelope magic of a columnar frame (format v2: a stream directory, then one zstd frame per
/// stream; see [`crate::columns`]).
pub const FRAME_MAGIC_COLUMNAR: [u8; 4] = *b"VRFC";
/// Envelope size: magic, compressed length, raw length, record count, t_min, t_max.
pub const FRAME_HEADER_LEN: usize = 32;
/// Largest uncompressed frame a reader accepts (and a writer produces).
pub const MAX_FRAME_RAW: usize = 16 << 20;
/// Largest compressed frame a reader accepts.
pub const MAX_FRAME_COMPRESSED: usize = MAX_FRAME_RAW + (MAX_FRAME_RAW >> 7) + (1 << 16);
/// Default raw size at which [`TraceWriter::write`] closes a frame on its own.
pub const DEFAULT_FRAME_TARGET: usize = 1 << 20;
/// Frames (and columnar streams) with fewer raw bytes are stored, not compressed: a zstd frame
/// of one raw block with its content checksum ([`store_append`]). zstd's fixed cost per call
/// (resetting its context, building the predefined FSE tables of every block) is ~13 k
/// instructions whatever the input, and on a few records it saves a few dozen bytes: the
/// writer thread's 50 ms tick that finds a handful of events pays ~0.5 k instead.
pub const STORE_BELOW: usize = 256;
/// In [`FrameLayout::Auto`], frames with fewer raw bytes are written as rows: the columnar
/// directory (73 bytes) and one zstd frame per timing stream (up to 9 calls) cost more than
/// the columns save (measured with `trace/examples/frame_cost.rs`: rows are smaller up to
/// ~100 MemOps, about 1.2 KiB of records).
const COLUMNAR_MIN: usize = 1 << 10;
/// In [`FrameLayout::Auto`], frames from `COLUMNAR_MIN` up to this raw size take the layout
/// that was smaller for the last such frame; every `RECHECK_EVERY`-th one is compressed both
/// ways and the smaller written (and remembered). Larger frames are columnar.
const COMPARE_BELOW: usize = 16 << 10;
const RECHECK_EVERY: u8 = 8;
/// In [`FrameLayout::Auto`], the zstd level of row frames under `COLUMNAR_MIN` (when the
/// writer's level is higher): 2.5x fewer instructions than level 3 on 0.4-1 KiB of records
/// for 1-2% more bytes (`trace/examples/frame_cost.rs`, `FRAME_COST_LEVEL`).
const SMALL_LEVEL: i32 = -1;
const _: () = assert!(STORE_BELOW <= 256 && STORE_BELOW <= COLUMNAR_MIN);
/// Default zstd level (single-threaded).
pub const DEFAULT_LEVEL: i32 = 3;

/// How [`TraceWriter`] lays out frames (format v2 readers accept both in any mix).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameLayout {
    /// Columnar for frames of 16 KiB raw and more; rows under 1 KiB or without MemOps; in
    /// between, the layout that was smaller for the previous such frame (rechecked by
    /// compressing both ways every 8th one). Frames and streams under 256 bytes are stored
    /// uncompressed (still zstd frames, [`STORE_BELOW`]); frames under 1 KiB are compressed
    /// at zstd level -1 at most.
    #[default]
    Auto,
    /// Columnar whenever the records split (always, for records from [`RecordEncoder`]);
    /// every stream compressed, however small.
    Columnar,
    /// Row frames only, every frame compressed, however small.
    Rows,
}

/// Writes a `.vramtrace` stream: the header at construction, then frames.
///
/// Events are encoded into the open frame; [`TraceWriter::flush_frame`] compresses it into one
/// independent zstd frame, writes it with a single `write_all` and flushes `W`. Everything up to
/// the last completed `flush_frame` survives the process being killed.
pub struct TraceWriter<W: Write> {
    w: W,
    comp: zstd::bulk::Compressor<'static>,
    /// The level asked for, and the level `comp` is set to (`SMALL_LEVEL` for small frames).
    level: i32,
    comp_level: i32,
    enc: RecordEncoder,
    out: Vec<u8>,
    comp_buf: Vec<u8>,
    row_buf: Vec<u8>,
    cols: Columns,
    layout: FrameLayout,
    frame_target: usize,
    /// The open frame holds records beyond its leading `Context`.
    has_records: bool,
    /// Records were appended raw: the next `write` must start a new context.
    dirty: bool,
    /// Auto layout, mid-size frames: rows were smaller last time they were compared.
    mid_rows: bool,
    /// Auto layout, mid-size frames: frames until the next comparison of both layouts.
    mid_recheck: u8,
    last_t: u64,
    stats: WriterStats,
    finished: bool,
}

/// Counters of what a writer produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Records written (including `Context`/`End` records).
    pub records: u64,
    pub frames: u64,
    /// Uncompressed record bytes.
    pub raw_bytes: u64,
    /// Bytes written to `W` (preamble, envelopes, compressed frames).
    pub file_bytes: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the preamble (magic, version, header) and returns a writer with zstd level 3.
    pub fn new(w: W, header: &Header) -> io::Result<Self> {
        Self::with_level(w, header, DEFAULT_LEVEL)
    }

    /// Like [`TraceWriter::new`] with an explicit zstd level (1..=22; 1–3 recommended).
    pub fn with_level(mut w: W, header: &Header, level: i32) -> io::Result<Self> {
        let mut comp = zstd::bulk::Compressor::new(level)?;
        comp.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        let pre = encode_preamble(header);
        w.write_all(&pre)?;
        w.flush()?;
        Ok(TraceWriter {
            w,
            comp,
            level,
            comp_level: level,
            enc: RecordEncoder::with_capacity(64 << 10),
            out: Vec::new(),
            comp_buf: Vec::new(),
            row_buf: Vec::new(),
            cols: Columns::default(),
            layout: FrameLayout::Auto,
            frame_target: DEFAULT_FRAME_TARGET,
            has_records: false,
            dirty: true,
            mid_rows: false,
            mid_recheck: 0,
            last_t: 0,
            stats: WriterStats {
                file_bytes: pre.len() as u64,
                ..Default::default()
            },
            finished: false,
        })
    }

    /// Changes the zstd level for the following frames (e.g. a faster one under back-pressure).
    pub fn set_level(&mut self, level: i32) -> io::Result<()> {
        self.comp.set_compression_level(level)?;
        self.level = level;
        self.comp_level = level;
        Ok(())
    }

    /// Chooses the layout of the following frames.
    pub fn set_layout(&mut self, layout: FrameLayout) {
        self.layout = layout;
    }

    /// Sets the uncompressed size at which `write` closes a frame by itself (capped at 16 MiB).
    pub fn set_frame_target(&mut self, bytes: usize) {
        self.frame_target = bytes.clamp(1, MAX_FRAME_RAW / 2);
    }

    fn check_open(&self) -> io::Result<()> {
        if self.finished {
            Err(io::Error::other("trace writer already finished"))
        } else {
            Ok(())
        }
    }

    /// Encodes one event into the open frame; closes the frame when it reaches the target size.
    pub fn write(&mut self, ev: &Event) -> io::Result<()> {
        self.check_open()?;
        if self.dirty {
            let tid = match ev {
                Event::Alloc(m) | Event::Free(m) => m.tid,
                _ => 0,
            };
            if self.enc.is_empty() {
                self.enc.begin(tid);
            } else {
                self.enc.context(tid);
            }
            self.dirty = false;
        }
        self.enc.push(ev);
        self.has_records = true;
        if let Some(t) = ev.t_ns() {
            self.last_t = self.last_t.max(t);
        }
        if self.enc.len() >= self.frame_target {
            self.flush_frame()?;
        }
        Ok(())
    }

    /// Appends records encoded elsewhere by a [`RecordEncoder`] (which starts every buffer with
    /// `begin(tid)`, i.e. a `Context` record). `bytes` must hold whole records.
    pub fn write_records(&mut self, bytes: &[u8], stats: RecordStats) -> io::Result<()> {
        self.append_records(bytes.len(), stats, |e| e.append_raw(bytes, stats))
    }

    /// [`TraceWriter::write_records`] of everything `enc` encoded (which started with
    /// `begin(tid)`): also tells the writer how much of it is `TorchRun` payload, which it
    /// stores as it is instead of compressing it.
    pub fn write_encoded(&mut self, enc: &RecordEncoder) -> io::Result<()> {
        self.append_records(enc.bytes().len(), enc.stats(), |e| e.append_encoded(enc))
    }

    /// Puts `len` bytes of whole records (`stats`) into the open frame with `append` (a new
    /// frame first when they would not fit), then closes the frame at its target size.
    fn append_records(
        &mut self,
        len: usize,
        stats: RecordStats,
        append: impl FnOnce(&mut RecordEncoder),
    ) -> io::Result<()> {
        self.check_open()?;
        if len == 0 {
            return Ok(());
        }
        if len > MAX_FRAME_RAW {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "record buffer larger than the maximum frame",
            ));
        }
        if self.enc.len() + len > MAX_FRAME_RAW {
            self.flush_frame()?;
        }
        append(&mut self.enc);
        self.has_records = true;
        self.dirty = true;
        if stats.records > 0 && stats.t_max >= stats.t_min {
            self.last_t = self.last_t.max(stats.t_max);
        }
        if self.enc.len() >= self.frame_target {
            self.flush_frame()?;
        }
        Ok(())
    }

    /// Compresses the open frame (if it holds any record), writes it, and flushes `W`.
    pub fn flush_frame(&mut self) -> io::Result<()> {
        if self.has_records {
            let stats = self.enc.stats();
            let raw = self.enc.bytes();
            let (t_min, t_max) = if stats.t_min <= stats.t_max {
                (stats.t_min, stats.t_max)
            } else {
                (0, 0)
            };
            self.comp_buf.clear();
            let mut raw_len = raw.len();
            let mid = raw.len() >= COLUMNAR_MIN && raw.len() < COMPARE_BELOW;
            // The pinned layouts compress everything (their bytes are what the golden file
            // holds); Auto stores what is too small to be worth a zstd call.
            let store = self.layout == FrameLayout::Auto;
            let level = if store && raw.len() < COLUMNAR_MIN {
                self.level.min(SMALL_LEVEL)
            } else {
                self.level
            };
            if level != self.comp_level {
                self.comp.set_compression_level(level)?;
                self.comp_level = level;
            }
            // Frames mostly of coded PyTorch allocator events (`TorchRun` payloads) are
            // columnar whatever their size: the payloads go to the torch stream, stored as
            // they are, and zstd sees only the rest. No comparison of both layouts for them
            // (the row layout would compress what is coded already).
            let torchy = self.layout == FrameLayout::Auto
                && raw.len() >= STORE_BELOW
                && self.enc.torch_bytes() * 2 >= raw.len();
            let compare =
                self.layout == FrameLayout::Auto && mid && !torchy && self.mid_recheck == 0;
            let try_columns = match self.layout {
                FrameLayout::Rows => false,
                FrameLayout::Columnar => true,
                FrameLayout::Auto => {
                    torchy || raw.len() >= COLUMNAR_MIN && (compare || !mid || !self.mid_rows)
                }
            };
            // Columns take up to one byte more per MemOp than rows: a frame near the raw cap
            // goes out as rows. In Auto, a frame without MemOps or torch runs too: its
            // columns are the records plus a directory.
            let mut magic = if try_columns
                && self.cols.split(raw)
                && self.cols.s.iter().map(|s| s.len()).sum::<usize>() <= MAX_FRAME_RAW
                && (self.layout == FrameLayout::Columnar
                    || self.cols.s[1..].iter().any(|s| !s.is_empty()))
            {
                raw_len = self.cols.s.iter().map(|s| s.len()).sum();
                // Directory (raw and compressed length of every stream), then the streams.
                self.comp_buf.resize(1 + 8 * STREAMS, 0);
                self.comp_buf[0] = STREAMS as u8;
                for (i, st) in self.cols.s.iter().enumerate() {
                    let at = self.comp_buf.len();
                    if i == TORCH_STREAM {
                        if !st.is_empty() {
                            store_any(st, &mut self.comp_buf);
                        }
                    } else if !st.is_empty() {
                        compress_append(&mut self.comp, st, &mut self.comp_buf, store)?;
                    }
                    let n = self.comp_buf.len() - at;
                    let d = 1 + 8 * i;
                    self.comp_buf[d..d + 4].copy_from_slice(&(st.len() as u32).to_le_bytes());
                    self.comp_buf[d + 4..d + 8].copy_from_slice(&(n as u32).to_le_bytes());
                }
                FRAME_MAGIC_COLUMNAR
            } else {
                compress_append(&mut self.comp, raw, &mut self.comp_buf, store)?;
                FRAME_MAGIC
            };
            // Mid-size frames (a slow job between flushes): per-stream zstd overhead can
            // outweigh the gain. Now and then compress both ways, keep the smaller, and
            // follow that choice until the next comparison.
            if self.layout == FrameLayout::Auto && mid && !torchy {
                if compare && magic == FRAME_MAGIC_COLUMNAR {
                    self.row_buf.clear();
                    compress_append(&mut self.comp, raw, &mut self.row_buf, store)?;
                    self.mid_rows = self.row_buf.len() <= self.comp_buf.len();
                    if self.mid_rows {
                        std::mem::swap(&mut self.row_buf, &mut self.comp_buf);
                        magic = FRAME_MAGIC;
                        raw_len = raw.len();
                    }
                }
                self.mid_recheck = if compare {
                    RECHECK_EVERY - 1
                } else {
                    self.mid_recheck - 1
                };
            }
            let n = self.comp_buf.len();
            self.out.clear();
            self.out.extend_from_slice(&magic);
            self.out.extend_from_slice(&(n as u32).to_le_bytes());
            self.out.extend_from_slice(&(raw_len as u32).to_le_bytes());
            self.out.extend_from_slice(&stats.records.to_le_bytes());
            self.out.extend_from_slice(&t_min.to_le_bytes());
            self.out.extend_from_slice(&t_max.to_le_bytes());
            self.out.extend_from_slice(&self.comp_buf[..n]);
            // One write per frame: a kill leaves either the whole frame or a torn tail.
            self.w.write_all(&self.out)?;
            self.stats.records += stats.records as u64;
            self.stats.frames += 1;
            self.stats.raw_bytes += raw.len() as u64;
            self.stats.file_bytes += self.out.len() as u64;
            self.enc.clear();
            self.has_records = false;
            self.dirty = true;
        }
        self.w.flush()
    }

    /// Writes the `End` record at the latest time seen, flushes, and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        let t = self.last_t;
        self.finish_in_place(t)?;
        Ok(self.w)
    }

    /// Writes the `End` record at monotonic time `t_ns` and flushes the last frame. For a writer
    /// that lives in a static (Rust never drops statics): later writes return an error.
    pub fn finish_in_place(&mut self, t_ns: u64) -> io::Result<()> {
        self.check_open()?;
        if self.dirty {
            if self.enc.is_empty() {
                self.enc.begin(0);
            } else {
                self.enc.context(0);
            }
            self.dirty = false;
        }
        self.enc.end(t_ns);
        self.has_records = true;
        self.flush_frame()?;
        self.finished = true;
        Ok(())
    }

    /// Drops the open frame after a failed write (its bytes may be partly in `W`: the caller
    /// cuts `W` back to `stats().file_bytes`, the end of the last whole frame). Returns how
    /// many records it held (each event is one record; every buffer adds one `Context`).
    pub fn discard_open_frame(&mut self) -> u64 {
        let n = if self.has_records {
            u64::from(self.enc.stats().records)
        } else {
            0
        };
        self.enc.clear();
        self.has_records = false;
        self.dirty = true;
        n
    }

    /// What has been written so far.
    pub fn stats(&self) -> WriterStats {
        self.stats
    }

    /// Uncompressed bytes in the open frame.
    pub fn pending_bytes(&self) -> usize {
        if self.has_records { self.enc.len() } else { 0 }
    }

    pub fn get_ref(&self) -> &W {
        &self.w
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.w
    }
}

/// Compresses `src` as one zstd frame appended to `dst` (with `store`, stored when it is
/// under [`STORE_BELOW`] bytes); returns its length.
fn compress_append(
    comp: &mut zstd::bulk::Compressor<'static>,
    src: &[u8],
    dst: &mut Vec<u8>,
    store: bool,
) -> io::Result<usize> {
    if store && src.len() < STORE_BELOW {
        return Ok(store_append(src, dst));
    }
    let at = dst.len();
    // zstd's WriteBuf for `[u8]` wants an initialised slice: zero just the room it may use.
    dst.resize(at + zstd::zstd_safe::compress_bound(src.len()), 0);
    let n = comp.compress_to_buffer(src, &mut dst[at..])?;
    dst.truncate(at + n);
    Ok(n)
}

/// zstd's frame magic number (RFC 8878, 3.1.1), as it appears in the file.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Appends `src` (under 256 bytes) as one zstd frame that stores it uncompressed (RFC 8878):
/// a frame header with Single_Segment (the window is the content size, given in one byte) and
/// Content_Checksum set, one Raw block marked last, then the low 32 bits of the XXH64 of
/// `src` (seed 0). Any zstd decoder reads it and checks the checksum. Returns its length.
pub(crate) fn store_append(src: &[u8], dst: &mut Vec<u8>) -> usize {
    assert!(src.len() < 256, "a stored frame's content size is one byte");
    let at = dst.len();
    dst.extend_from_slice(&ZSTD_MAGIC);
    // Frame_Header_Descriptor: FCS_Field_Size 0 (1 byte, with Single_Segment), Single_Segment
    // (bit 5), Content_Checksum (bit 2), no dictionary.
    dst.push(0b0010_0100);
    dst.push(src.len() as u8);
    // Block header (3 bytes, little-endian): Last_Block (bit 0), Block_Type 0 = Raw (bits
    // 1-2), Block_Size (bits 3-23).
    let bh = 1u32 | (src.len() as u32) << 3;
    dst.extend_from_slice(&bh.to_le_bytes()[..3]);
    dst.extend_from_slice(src);
    let sum = twox_hash::XxHash64::oneshot(0, src) as u32;
    dst.extend_from_slice(&sum.to_le_bytes());
    dst.len() - at
}

/// Largest block of a zstd frame (RFC 8878, 3.1.1.2.4: Block_Maximum_Size).
const ZSTD_BLOCK_MAX: usize = 128 << 10;

/// Appends `src` (any length up to 4 GiB) as one zstd frame that stores it uncompressed:
/// [`store_append`]'s frame with a 1-, 2- or 4-byte content size and as many Raw blocks of at
/// most 128 KiB as it takes. For bytes coded already (the torch stream): what a zstd call
/// would cost ~36 instructions a byte for, this costs a copy and the checksum.
pub(crate) fn store_any(src: &[u8], dst: &mut Vec<u8>) -> usize {
    if src.len() < 256 {
        return store_append(src, dst);
    }
    let at = dst.len();
    dst.extend_from_slice(&ZSTD_MAGIC);
    let n = src.len();
    if n < 256 + 65536 {
        // FCS_Field_Size 1 (2 bytes, the size minus 256), Single_Segment, Content_Checksum.
        dst.push(0b0110_0100);
        dst.extend_from_slice(&((n - 256) as u16).to_le_bytes());
    } else {
        // FCS_Field_Size 2 (4 bytes).
        dst.push(0b1010_0100);
        dst.extend_from_slice(&(n as u32).to_le_bytes());
    }
    let mut chunks = src.chunks(ZSTD_BLOCK_MAX).peekable();
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none() as u32;
        let bh = last | (c.len() as u32) << 3;
        dst.extend_from_slice(&bh.to_le_bytes()[..3]);
        dst.extend_from_slice(c);
    }
    let sum = twox_hash::XxHash64::oneshot(0, src) as u32;
    dst.extend_from_slice(&sum.to_le_bytes());
    dst.len() - at
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stored frames of every size class decode with zstd to their bytes (one block, several
    /// blocks, each content-size width).
    #[test]
    fn stored_frames_of_any_size_decode_with_zstd() {
        for n in [
            0usize,
            1,
            255,
            256,
            257,
            1000,
            65791,
            65792,
            131071,
            131072,
            131073,
            400_000,
            1 << 20,
        ] {
            let src: Vec<u8> = (0..n).map(|i| (i * 131 + n / 7) as u8).collect();
            let mut f = vec![0x55];
            let len = store_any(&src, &mut f);
            assert_eq!(len, f.len() - 1);
            let out = zstd::bulk::decompress(&f[1..], n.max(1)).unwrap();
            assert_eq!(out, src, "length {n}");
            if n > 0 {
                let mut bad = f.clone();
                let last = bad.len() - 5;
                bad[last] ^= 1;
                assert!(zstd::bulk::decompress(&bad[1..], n).is_err(), "length {n}");
            }
        }
    }

    /// A stored frame is a zstd frame: zstd decodes it to the bytes, for every length a
    /// stored frame can have (empty included).
    #[test]
    fn stored_frames_decode_with_zstd() {
        for n in 0..256usize {
            let src: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let mut f = vec![0xaa];
            let len = store_append(&src, &mut f);
            assert_eq!(len, f.len() - 1);
            assert_eq!(len, 4 + 2 + 3 + n + 4);
            let out = zstd::bulk::decompress(&f[1..], 256).unwrap();
            assert_eq!(out, src, "length {n}");
        }
    }

    /// Its checksum is checked: one flipped bit of content or checksum and zstd refuses it.
    #[test]
    fn stored_frames_carry_a_checked_checksum() {
        let src = b"records of a 50 ms tick";
        let mut f = Vec::new();
        store_append(src, &mut f);
        for i in 9..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x10;
            assert!(
                zstd::bulk::decompress(&bad, 256).is_err(),
                "byte {i} flipped went unnoticed"
            );
        }
    }
}
