//! RAPIDS RMM's `logging_resource_adaptor` CSV: the one reader of these logs, under the pool's
//! replays ([`parse`], [`parse_file`]) and the analyzer's import (which streams [`Reader`]).
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream` (columns found by name, in any order);
//! rows such as `139960734369344,14:23:05.123456,allocate,0x7f5e3a000000,1048576,0`; actions
//! `allocate`, `free`, `allocate failure` (pointer `(nil)`); Time is the wall-clock time of
//! day; Pointer and Stream are hex (`0` = legacy default stream), Size decimal bytes as
//! requested. The reader holds one line at a time, at most [`MAX_LINE`] bytes, and checks
//! every field: a hostile file gets one error naming its line, never a panic or an unbounded
//! buffer (fuzzed by `fuzz/fuzz_targets/rmm_csv.rs`).
//!
//! [`parse`] replays a row the way the log-replay workload (`tests/workloads/replay`,
//! `vramshim replay --live`, `vramshim demo`) issues it and `vramshim replay` reads an imported
//! log: an `allocate` is a request on the row's stream, a `free` is `cudaFree`
//! ([`FreeMode::Sync`]: the block is reusable after a synchronization covers it). RMM's own
//! `deallocate(ptr, size, stream)` is stream-ordered, but a log replayed through the CUDA API
//! becomes `cudaMalloc`/`cudaFree`, and the what-if must answer for what really runs: the same
//! events through the same policy code, so `pool::replay`, `vramshim replay` and the
//! interposer's pool on the same log agree. Each allocation gets an id; a free refers to the
//! live allocation at its pointer (frees of unknown pointers, e.g. blocks allocated before
//! recording started, are counted and skipped); `allocate failure` rows are counted and
//! skipped.

use std::collections::HashSet;
use std::io::{self, BufRead, Read};

use crate::FreeMode;
use crate::fxhash::FxMap;
use crate::replay::Event;

pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";
/// The longest line read: RMM writes about 80 bytes a row. Longer means not an RMM log (or
/// a file with no line breaks, such as a device): refused instead of buffered.
pub const MAX_LINE: usize = 64 << 10;
/// Columns a header may have (RMM writes 6, newer versions a few more): every row's fields
/// are read into a fixed array of this size, so the header's columns must fit in it.
pub const MAX_COLUMNS: usize = 16;
const DAY_NS: u64 = 86_400_000_000_000;
const COLS: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

/// A problem in the input: 1-based line number (0: the file as a whole) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ParseError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allocate,
    Free,
    AllocateFailure,
}

/// One row of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The Thread column (decimal).
    pub thread: u64,
    /// The Time column in nanoseconds since the first row's midnight: a log that runs past
    /// midnight keeps counting up.
    pub t_ns: u64,
    pub action: Action,
    /// 0 for `(nil)`.
    pub ptr: u64,
    pub size: u64,
    pub stream: u64,
}

/// Streams the rows of a log, one line in memory at a time.
pub struct Reader<R: BufRead> {
    reader: R,
    raw: Vec<u8>,
    /// The line last read (1: the header).
    line_no: usize,
    /// Column index of each of COLS.
    cols: [usize; 6],
    ncols: usize,
    day_offset: u64,
    last_tod: u64,
    done: bool,
}

impl<R: BufRead> Reader<R> {
    /// Reads and checks the header (line 1).
    pub fn new(mut reader: R) -> Result<Self, ParseError> {
        let at_header = |msg: String| ParseError { line: 1, msg };
        let mut raw = Vec::new();
        read_line_bounded(&mut reader, &mut raw).map_err(|e| at_header(line_error(&e)))?;
        let line = std::str::from_utf8(&raw)
            .map_err(|_| at_header("not an RMM log: the header is not UTF-8 text".into()))?;
        let line = line
            .trim_start_matches('\u{feff}')
            .trim_end_matches(['\r', '\n']);
        let names: Vec<&str> = line.split(',').map(|s| s.trim()).collect();
        if names.len() > MAX_COLUMNS {
            return Err(at_header(format!(
                "not an RMM log: header '{}' has {} columns, at most {MAX_COLUMNS} are read (expected '{HEADER}')",
                clip(line),
                names.len()
            )));
        }
        let mut cols = [usize::MAX; 6];
        for (i, want) in COLS.iter().enumerate() {
            match names.iter().position(|n| n == want) {
                Some(p) => cols[i] = p,
                None => {
                    return Err(at_header(format!(
                        "not an RMM log: header '{}' has no '{want}' column (expected '{HEADER}')",
                        clip(line)
                    )));
                }
            }
        }
        let ncols = names.len();
        Ok(Reader {
            reader,
            raw,
            line_no: 1,
            cols,
            ncols,
            day_offset: 0,
            last_tod: 0,
            done: false,
        })
    }

    /// The line of the row (or error) last returned.
    pub fn line(&self) -> usize {
        self.line_no
    }

    /// The next row; `None` at the end. Blank lines are skipped; after an error the stream
    /// ends.
    pub fn next_row(&mut self) -> Option<Result<Row, ParseError>> {
        if self.done {
            return None;
        }
        loop {
            self.line_no += 1;
            if let Err(e) = read_line_bounded(&mut self.reader, &mut self.raw) {
                return self.fail(line_error(&e));
            }
            if self.raw.is_empty() {
                self.done = true;
                return None;
            }
            let raw = std::mem::take(&mut self.raw);
            let r = match std::str::from_utf8(&raw) {
                Ok(s) if s.trim().is_empty() => {
                    self.raw = raw;
                    continue;
                }
                Ok(s) => self.parse_line(s),
                Err(_) => Err("not UTF-8 text".to_string()),
            };
            self.raw = raw;
            return match r {
                Ok(row) => Some(Ok(row)),
                Err(msg) => self.fail(msg),
            };
        }
    }

    fn fail(&mut self, msg: String) -> Option<Result<Row, ParseError>> {
        self.done = true;
        Some(Err(ParseError {
            line: self.line_no,
            msg,
        }))
    }

    fn parse_line(&mut self, line: &str) -> Result<Row, String> {
        let line = line.trim_end_matches(['\r', '\n']);
        let mut fields = [""; MAX_COLUMNS];
        let mut n = 0;
        for f in line.split(',') {
            if n < fields.len() {
                fields[n] = f.trim();
            }
            n += 1;
        }
        if n != self.ncols {
            return Err(format!(
                "expected {} comma-separated fields, found {n}: '{}'",
                self.ncols,
                clip(line)
            ));
        }
        let get = |i: usize| fields[self.cols[i]];
        let thread: u64 = get(0).parse().map_err(|_| {
            format!(
                "bad Thread '{}': expected a decimal thread id",
                clip(get(0))
            )
        })?;
        let tod = parse_time(get(1)).ok_or_else(|| {
            format!(
                "bad Time '{}': expected HH:MM:SS.microseconds",
                clip(get(1))
            )
        })?;
        let ptr = parse_hex(get(3)).ok_or_else(|| {
            format!(
                "bad Pointer '{}': expected 0x-prefixed hex or (nil)",
                clip(get(3))
            )
        })?;
        let size: u64 = get(4)
            .parse()
            .map_err(|_| format!("bad Size '{}': expected decimal bytes", clip(get(4))))?;
        let stream = parse_hex(get(5)).ok_or_else(|| {
            format!(
                "bad Stream '{}': expected a hex stream handle",
                clip(get(5))
            )
        })?;
        let action = match get(2) {
            "allocate" => Action::Allocate,
            "free" => Action::Free,
            "allocate failure" => Action::AllocateFailure,
            other => {
                return Err(format!(
                    "bad Action '{}': expected allocate, free or allocate failure",
                    clip(other)
                ));
            }
        };
        // A log that runs past midnight: the time of day wraps.
        if tod.saturating_add(DAY_NS / 2) < self.last_tod {
            self.day_offset = self.day_offset.checked_add(DAY_NS).ok_or_else(|| {
                "the log's times wrap past midnight more than 200,000 times".to_string()
            })?;
        }
        self.last_tod = tod;
        let t_ns = self
            .day_offset
            .checked_add(tod)
            .ok_or_else(|| format!("Time '{}' is out of range", clip(get(1))))?;
        Ok(Row {
            thread,
            t_ns,
            action,
            ptr,
            size,
            stream,
        })
    }
}

/// Reads one line (with its `\n`) into `out`, at most [`MAX_LINE`] bytes: an empty `out` at
/// the end of the input, an `InvalidData` error for a longer line.
fn read_line_bounded<R: BufRead>(r: &mut R, out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(());
        }
        let room = MAX_LINE + 1 - out.len();
        let chunk = &avail[..avail.len().min(room)];
        if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            out.extend_from_slice(&chunk[..=i]);
            r.consume(i + 1);
            return Ok(());
        }
        let n = chunk.len();
        out.extend_from_slice(chunk);
        r.consume(n);
        if out.len() > MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, LineTooLong));
        }
    }
}

#[derive(Debug)]
struct LineTooLong;

impl std::fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line longer than {} KiB: not an RMM log (its rows are about 80 bytes; no line \
             breaks?)",
            MAX_LINE >> 10
        )
    }
}

impl std::error::Error for LineTooLong {}

fn line_error(e: &io::Error) -> String {
    match e.get_ref() {
        Some(inner) if inner.is::<LineTooLong>() => inner.to_string(),
        _ => format!("cannot read: {e}"),
    }
}

fn clip(s: &str) -> String {
    if s.len() > 60 {
        let mut end = 60;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s.to_string()
    }
}

/// `HH:MM:SS.ffffff` (any number of fraction digits up to 9) to nanoseconds since midnight.
pub fn parse_time(s: &str) -> Option<u64> {
    let mut it = s.splitn(3, ':');
    let h: u64 = it.next()?.parse().ok()?;
    let m: u64 = it.next()?.parse().ok()?;
    let rest = it.next()?;
    let (sec, frac) = match rest.split_once('.') {
        Some((a, b)) => (a, b),
        None => (rest, ""),
    };
    let sec: u64 = sec.parse().ok()?;
    if m >= 60 || sec >= 61 || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut f: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..9 {
        f *= 10;
    }
    h.checked_mul(3_600_000_000_000)?
        .checked_add(m * 60_000_000_000 + sec * 1_000_000_000 + f)
}

/// Nanoseconds to `HH:MM:SS.ffffff` (time of day, microseconds truncated as spdlog does).
pub fn format_time(ns: u64, out: &mut String) {
    use std::fmt::Write as _;
    let tod = ns % DAY_NS;
    let us = tod / 1000;
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}.{:06}",
        us / 3_600_000_000,
        (us / 60_000_000) % 60,
        (us / 1_000_000) % 60,
        us % 1_000_000
    );
}

/// Hex with or without `0x`, or `(nil)` (0).
fn parse_hex(s: &str) -> Option<u64> {
    if s == "(nil)" {
        return Some(0);
    }
    let h = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if h.is_empty() {
        return None;
    }
    u64::from_str_radix(h, 16).ok()
}

/// A parsed log, as replay events.
#[derive(Clone, Debug, Default)]
pub struct ParsedTrace {
    pub events: Vec<Event>,
    pub allocs: u64,
    pub frees: u64,
    /// Frees of pointers with no live allocation in the log.
    pub skipped_frees: u64,
    /// `allocate failure` rows.
    pub failed_allocs: u64,
    /// Distinct values of the Thread column.
    pub threads: usize,
}

fn collect<R: BufRead>(rows: &mut Reader<R>) -> Result<ParsedTrace, ParseError> {
    let mut out = ParsedTrace::default();
    let mut live: FxMap<u64, u64> = FxMap::default();
    let mut threads = HashSet::new();
    let mut next_id = 0u64;
    while let Some(row) = rows.next_row() {
        let row = row?;
        threads.insert(row.thread);
        match row.action {
            Action::Allocate => {
                let id = next_id;
                next_id += 1;
                live.insert(row.ptr, id);
                out.allocs += 1;
                out.events.push(Event::Alloc {
                    id,
                    size: row.size,
                    stream: row.stream,
                });
            }
            Action::Free => match live.remove(&row.ptr) {
                Some(id) => {
                    out.frees += 1;
                    out.events.push(Event::Free {
                        id,
                        mode: FreeMode::Sync,
                    });
                }
                None => out.skipped_frees += 1,
            },
            Action::AllocateFailure => out.failed_allocs += 1,
        }
    }
    out.threads = threads.len();
    Ok(out)
}

/// Parse a whole log.
pub fn parse(text: &str) -> Result<ParsedTrace, ParseError> {
    collect(&mut Reader::new(text.as_bytes())?)
}

/// The largest file [`parse_file`] reads (its events are held in memory; a device such as
/// `/dev/zero` would never end).
pub const MAX_FILE: u64 = 4 << 30;

/// Read and parse a file; errors name the file.
pub fn parse_file(path: impl AsRef<std::path::Path>) -> Result<ParsedTrace, ParseError> {
    let p = path.as_ref();
    let named = |line: usize, msg: &dyn std::fmt::Display| ParseError {
        line,
        msg: format!("{}: {msg}", p.display()),
    };
    let file = std::fs::File::open(p).map_err(|e| named(0, &e))?;
    let mut input = io::BufReader::new(file.take(MAX_FILE + 1));
    let parsed = Reader::new(&mut input).and_then(|mut rows| collect(&mut rows));
    if input.get_ref().limit() == 0 {
        return Err(named(
            0,
            &format!(
                "larger than {} GiB, the largest log read whole",
                MAX_FILE >> 30
            ),
        ));
    }
    parsed.map_err(|e| named(e.line, &e.msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rmm_rows() {
        let t = "Thread,Time,Action,Pointer,Size,Stream\n\
                 1,00:00:00.000000,allocate,0x1000,1024,0\n\
                 1,00:00:00.000001,allocate failure,(nil),99,0\n\
                 1,00:00:00.000002,free,0x1000,1024,0\n\
                 2,00:00:00.000003,free,0x9999,8,0\n\
                 2,00:00:00.000004,allocate,0x1000,7,7f00\n";
        let p = parse(t).unwrap();
        assert_eq!(p.allocs, 2);
        assert_eq!(p.frees, 1);
        assert_eq!(p.skipped_frees, 1);
        assert_eq!(p.failed_allocs, 1);
        assert_eq!(p.threads, 2);
        assert_eq!(
            p.events,
            vec![
                Event::Alloc {
                    id: 0,
                    size: 1024,
                    stream: 0
                },
                Event::Free {
                    id: 0,
                    mode: FreeMode::Sync
                },
                Event::Alloc {
                    id: 1,
                    size: 7,
                    stream: 0x7f00
                },
            ]
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e =
            parse("Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,abc,0\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("Time"), "{e}");
        let e = parse("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.5,allocate,0x10,abc,0\n")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 2: bad Size 'abc': expected decimal bytes"
        );
        assert!(parse("a,b\n").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("00:00:01.5"), Some(1_500_000_000));
        assert_eq!(
            parse_time("14:23:05.123456"),
            Some(((14 * 60 + 23) * 60 + 5) * 1_000_000_000 + 123_456_000)
        );
        assert_eq!(parse_time("1:2"), None);
        assert_eq!(parse_time("00:00:00.1234567890"), None);
        let mut s = String::new();
        format_time(
            ((14 * 60 + 23) * 60 + 5) * 1_000_000_000 + 123_456_789,
            &mut s,
        );
        assert_eq!(s, "14:23:05.123456");
    }

    /// Rows past midnight keep counting up from the first row's day.
    #[test]
    fn midnight_wraps_forward() {
        let t = "Thread,Time,Action,Pointer,Size,Stream\n\
                 1,23:59:59.5,allocate,0x10,8,0\n\
                 1,00:00:00.5,free,0x10,8,0\n";
        let mut r = Reader::new(t.as_bytes()).unwrap();
        let a = r.next_row().unwrap().unwrap();
        let b = r.next_row().unwrap().unwrap();
        assert_eq!(b.t_ns - a.t_ns, 1_000_000_000);
        assert!(r.next_row().is_none());
    }

    /// A header whose required columns stand past the fields a row is read into (the row
    /// parser must not index past its array): refused at the header, whatever the rows hold.
    #[test]
    fn wide_headers_are_refused_not_indexed_past() {
        let mut header: Vec<String> = (0..70).map(|i| format!("x{i}")).collect();
        header.extend(COLS.iter().map(|c| c.to_string()));
        let row = vec!["1"; header.len()].join(",");
        let e = parse(&format!("{}\n{row}\n", header.join(","))).unwrap_err();
        assert!(e.line == 1 && e.msg.contains("76 columns"), "{e}");
        // At the limit the header is read and a row with too few fields is refused.
        let mut header: Vec<String> = (0..10).map(|i| format!("x{i}")).collect();
        header.extend(COLS.iter().map(|c| c.to_string()));
        let e = parse(&format!("{}\n1,2,3\n", header.join(","))).unwrap_err();
        assert!(e.line == 2 && e.msg.contains("expected 16"), "{e}");
    }

    /// A line with no end (a device, a binary file) is refused after [`MAX_LINE`] bytes,
    /// not buffered.
    #[test]
    fn endless_lines_are_refused() {
        let mut r = io::Read::chain(
            &b"Thread,Time,Action,Pointer,Size,Stream\n"[..],
            io::repeat(b'1'),
        );
        let mut rows = Reader::new(io::BufReader::new(&mut r)).unwrap();
        let e = rows.next_row().unwrap().unwrap_err();
        assert!(e.line == 2 && e.msg.contains("longer than 64 KiB"), "{e}");
        assert!(rows.next_row().is_none());
    }
}
