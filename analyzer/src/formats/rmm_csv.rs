//! RAPIDS RMM's `logging_resource_adaptor` CSV, both ways.
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream`; rows such as
//! `139960734369344,14:23:05.123456,allocate,0x7f5e3a000000,1048576,0`; actions `allocate`,
//! `free`, `allocate failure` (pointer `(nil)`); Time is the wall-clock time of day; Stream is
//! hex.

use std::cell::Cell;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use vramshim_trace::{AllocKind, Api, Event, Header, MemOp, codes};

use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::source::EventSource;

pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";
/// The longest line read: RMM writes about 80 bytes a row. Longer means not an RMM log (or
/// a file with no line breaks, such as a device): refused instead of buffered.
pub const MAX_LINE: usize = 64 << 10;
const DAY_NS: u64 = 86_400_000_000_000;
const COLS: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

pub struct RmmCsvSource<R: BufRead> {
    path: PathBuf,
    reader: R,
    count: Rc<Cell<u64>>,
    line_no: u64,
    raw: Vec<u8>,
    buf: String,
    /// Column index of each of COLS.
    cols: [usize; 6],
    ncols: usize,
    day_offset: u64,
    last_tod: u64,
    done: bool,
    truncated_tids: bool,
}

/// The header an imported RMM log gets: no process, times are the log's time of day.
pub fn import_header(path: &Path) -> Header {
    Header {
        format_version: 0,
        cmdline: vec![],
        config: vec![
            ("import.from".into(), "rmm-csv".into()),
            (
                "import.file".into(),
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        ],
        ..Header::default()
    }
}

/// Columns a header may have (RMM writes 6, newer versions a few more): every row's fields
/// are read into a fixed array of this size, so the header's columns must fit in it.
const MAX_COLUMNS: usize = 16;

pub fn open_reader<R: BufRead>(
    path: &Path,
    mut reader: R,
    count: Rc<Cell<u64>>,
) -> Result<(Header, RmmCsvSource<R>), InputError> {
    let mut raw = Vec::new();
    read_line_bounded(&mut reader, &mut raw)
        .map_err(|e| InputError::at_line(path, 1, line_error(&e)))?;
    let line = std::str::from_utf8(&raw)
        .map_err(|_| InputError::at_line(path, 1, "not an RMM log: the header is not UTF-8 text"))?
        .to_string();
    let line = line
        .trim_start_matches('\u{feff}')
        .trim_end_matches(['\r', '\n']);
    let names: Vec<&str> = line.split(',').map(|s| s.trim()).collect();
    if names.len() > MAX_COLUMNS {
        return Err(InputError::at_line(
            path,
            1,
            format!(
                "not an RMM log: header '{}' has {} columns, at most {MAX_COLUMNS} are read (expected '{HEADER}')",
                clip(line),
                names.len()
            ),
        ));
    }
    let mut cols = [usize::MAX; 6];
    for (i, want) in COLS.iter().enumerate() {
        match names.iter().position(|n| n == want) {
            Some(p) => cols[i] = p,
            None => {
                return Err(InputError::at_line(
                    path,
                    1,
                    format!(
                        "not an RMM log: header '{}' has no '{want}' column (expected '{HEADER}')",
                        clip(line)
                    ),
                ));
            }
        }
    }
    let src = RmmCsvSource {
        path: path.to_path_buf(),
        reader,
        raw,
        count,
        line_no: 1,
        buf: String::new(),
        cols,
        ncols: names.len(),
        day_offset: 0,
        last_tod: 0,
        done: false,
        truncated_tids: false,
    };
    Ok((import_header(path), src))
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

impl<R: BufRead> RmmCsvSource<R> {
    fn parse_line(&mut self) -> Result<Event, InputError> {
        let line = self.buf.trim_end_matches(['\r', '\n']);
        let mut fields = [""; MAX_COLUMNS];
        let mut n = 0;
        for f in line.split(',') {
            if n < fields.len() {
                fields[n] = f.trim();
            }
            n += 1;
        }
        let bad = |msg: String| InputError::at_line(&self.path, self.line_no, msg);
        if n != self.ncols {
            return Err(bad(format!(
                "expected {} comma-separated fields, found {n}: '{}'",
                self.ncols,
                clip(line)
            )));
        }
        let get = |i: usize| fields[self.cols[i]];
        let thread: u64 = get(0).parse().map_err(|_| {
            bad(format!(
                "bad Thread '{}': expected a decimal thread id",
                clip(get(0))
            ))
        })?;
        let tod = parse_time(get(1)).ok_or_else(|| {
            bad(format!(
                "bad Time '{}': expected HH:MM:SS.microseconds",
                clip(get(1))
            ))
        })?;
        let action = get(2);
        let ptr = parse_hex(get(3)).ok_or_else(|| {
            bad(format!(
                "bad Pointer '{}': expected 0x-prefixed hex or (nil)",
                clip(get(3))
            ))
        })?;
        let size: u64 = get(4).parse().map_err(|_| {
            bad(format!(
                "bad Size '{}': expected decimal bytes",
                clip(get(4))
            ))
        })?;
        let stream = parse_hex(get(5)).ok_or_else(|| {
            bad(format!(
                "bad Stream '{}': expected a hex stream handle",
                clip(get(5))
            ))
        })?;
        // A log that runs past midnight: the time of day wraps.
        if tod.saturating_add(DAY_NS / 2) < self.last_tod {
            self.day_offset = self.day_offset.checked_add(DAY_NS).ok_or_else(|| {
                bad("the log's times wrap past midnight more than 200,000 times".into())
            })?;
        }
        self.last_tod = tod;
        let t_ns = self
            .day_offset
            .checked_add(tod)
            .ok_or_else(|| bad(format!("Time '{}' is out of range", clip(get(1)))))?;
        if thread > u32::MAX as u64 {
            self.truncated_tids = true;
        }
        let mut op = MemOp {
            t_ns,
            tid: thread as u32,
            api: Api::Imported,
            kind: AllocKind::Runtime,
            flags: 0,
            device: 0,
            stream,
            addr: ptr,
            size,
            result: codes::CUDA_SUCCESS,
            latency_ns: 0,
            stack: 0,
        };
        match action {
            "allocate" => Ok(Event::Alloc(op)),
            "free" => Ok(Event::Free(op)),
            "allocate failure" => {
                op.addr = 0;
                op.result = codes::OUT_OF_MEMORY;
                Ok(Event::Alloc(op))
            }
            other => Err(bad(format!(
                "bad Action '{}': expected allocate, free or allocate failure",
                clip(other)
            ))),
        }
    }
}

impl<R: BufRead> EventSource for RmmCsvSource<R> {
    fn next_event(&mut self) -> Option<Result<Event, InputError>> {
        if self.done {
            return None;
        }
        loop {
            self.buf.clear();
            self.line_no += 1;
            if let Err(e) = read_line_bounded(&mut self.reader, &mut self.raw) {
                self.done = true;
                return Some(Err(InputError::at_line(
                    &self.path,
                    self.line_no,
                    line_error(&e),
                )));
            }
            if self.raw.is_empty() {
                self.done = true;
                return None;
            }
            match std::str::from_utf8(&self.raw) {
                Ok(s) => self.buf.push_str(s),
                Err(_) => {
                    self.done = true;
                    return Some(Err(InputError::at_line(
                        &self.path,
                        self.line_no,
                        "not UTF-8 text",
                    )));
                }
            }
            if self.buf.trim().is_empty() {
                continue;
            }
            let r = self.parse_line();
            if r.is_err() {
                self.done = true;
            }
            return Some(r);
        }
    }
    fn position(&self) -> u64 {
        self.count.get()
    }
    fn warnings(&self) -> Vec<String> {
        if self.truncated_tids {
            vec!["thread ids above 2^32 were kept as their low 32 bits".into()]
        } else {
            vec![]
        }
    }
}

/// Writes RMM's logging CSV from a stream of events. Device allocations only (host memory is not
/// RMM's business); failed allocations that ran out of memory become `allocate failure` rows.
pub struct RmmCsvWriter<W: Write> {
    w: W,
    /// Wall-clock nanoseconds minus monotonic nanoseconds (0 for imported logs).
    wall_minus_mono: i128,
    live: FastMap<(i32, u64), u64>,
    line: String,
    device: Option<i32>,
    pub rows: u64,
}

impl<W: Write> RmmCsvWriter<W> {
    pub fn new(mut w: W, header: &Header, device: Option<i32>) -> io::Result<Self> {
        writeln!(w, "{HEADER}")?;
        Ok(RmmCsvWriter {
            w,
            wall_minus_mono: header.start_wall_ns as i128 - header.start_mono_ns as i128,
            live: FastMap::default(),
            line: String::with_capacity(128),
            device,
            rows: 0,
        })
    }

    pub fn event(&mut self, ev: &Event) -> io::Result<()> {
        use std::fmt::Write as _;
        let (op, action) = match ev {
            Event::Alloc(m) if m.result == codes::CUDA_SUCCESS && m.addr != 0 => (m, "allocate"),
            Event::Alloc(m) if m.result == codes::OUT_OF_MEMORY => (m, "allocate failure"),
            Event::Free(m) if m.result == codes::CUDA_SUCCESS => (m, "free"),
            _ => return Ok(()),
        };
        if !op.kind.is_device() || self.device.is_some_and(|d| d != op.device) {
            return Ok(());
        }
        let mut size = op.size;
        match action {
            "allocate" => {
                self.live.insert((op.device, op.addr), op.size);
            }
            "free" => {
                let known = self.live.remove(&(op.device, op.addr));
                if size == 0 {
                    size = known.unwrap_or(0);
                }
            }
            _ => {}
        }
        self.line.clear();
        let wall = (op.t_ns as i128 + self.wall_minus_mono).max(0) as u64;
        let _ = write!(self.line, "{},", op.tid);
        format_time(wall, &mut self.line);
        if action == "allocate failure" {
            let _ = writeln!(self.line, ",{action},(nil),{size},{:x}", op.stream);
        } else {
            let _ = writeln!(
                self.line,
                ",{action},0x{:x},{size},{:x}",
                op.addr, op.stream
            );
        }
        self.rows += 1;
        self.w.write_all(self.line.as_bytes())
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A header whose required columns stand past the fields a row is read into (the row
    /// parser once indexed past its array): refused at the header, whatever the rows hold.
    #[test]
    fn wide_headers_are_refused_not_indexed_past() {
        let mut header: Vec<String> = (0..70).map(|i| format!("x{i}")).collect();
        header.extend(COLS.iter().map(|c| c.to_string()));
        let row = vec!["1"; header.len()].join(",");
        let text = format!("{}\n{row}\n", header.join(","));
        let count = Rc::new(Cell::new(0));
        let err = match open_reader(Path::new("wide.csv"), text.as_bytes(), count) {
            Ok(_) => panic!("a 76-column header was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("76 columns") && err.contains("line 1"),
            "{err}"
        );
        // At the limit the header is read and a row with too few fields is refused.
        let mut header: Vec<String> = (0..10).map(|i| format!("x{i}")).collect();
        header.extend(COLS.iter().map(|c| c.to_string()));
        let text = format!("{}\n1,2,3\n", header.join(","));
        let count = Rc::new(Cell::new(0));
        let (_, mut src) = open_reader(Path::new("wide.csv"), text.as_bytes(), count).unwrap();
        use crate::source::EventSource;
        assert!(matches!(src.next_event(), Some(Err(_))));
    }
}
