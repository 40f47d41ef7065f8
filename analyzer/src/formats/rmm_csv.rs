//! RAPIDS RMM's `logging_resource_adaptor` CSV, both ways: the import streams the rows of
//! `vramshim_pool::rmm_csv::Reader` (the one reader of these logs, hardened against hostile
//! input) as trace events; the export writes the log RMM would have written.

use std::cell::Cell;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub use vramshim_pool::rmm_csv::HEADER;
use vramshim_pool::rmm_csv::format_time;
use vramshim_pool::rmm_csv::{Action, ParseError, Reader};
use vramshim_trace::{AllocKind, Api, Event, Header, MemOp, codes};

use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::source::EventSource;

/// The rows of one log as trace events.
pub struct RmmCsvSource<R: BufRead> {
    path: PathBuf,
    rows: Reader<R>,
    count: Rc<Cell<u64>>,
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

fn input_error(path: &Path, e: ParseError) -> InputError {
    InputError::at_line(path, e.line as u64, e.msg)
}

pub fn open_reader<R: BufRead>(
    path: &Path,
    reader: R,
    count: Rc<Cell<u64>>,
) -> Result<(Header, RmmCsvSource<R>), InputError> {
    let rows = Reader::new(reader).map_err(|e| input_error(path, e))?;
    let src = RmmCsvSource {
        path: path.to_path_buf(),
        rows,
        count,
        truncated_tids: false,
    };
    Ok((import_header(path), src))
}

impl<R: BufRead> EventSource for RmmCsvSource<R> {
    fn next_event(&mut self) -> Option<Result<Event, InputError>> {
        let row = match self.rows.next_row()? {
            Ok(row) => row,
            Err(e) => return Some(Err(input_error(&self.path, e))),
        };
        if row.thread > u32::MAX as u64 {
            self.truncated_tids = true;
        }
        let mut op = MemOp {
            t_ns: row.t_ns,
            tid: row.thread as u32,
            api: Api::Imported,
            kind: AllocKind::Runtime,
            flags: 0,
            device: 0,
            stream: row.stream,
            addr: row.ptr,
            size: row.size,
            result: codes::CUDA_SUCCESS,
            latency_ns: 0,
            stack: 0,
        };
        Some(Ok(match row.action {
            Action::Allocate => Event::Alloc(op),
            Action::Free => Event::Free(op),
            Action::AllocateFailure => {
                op.addr = 0;
                op.result = codes::OUT_OF_MEMORY;
                Event::Alloc(op)
            }
        }))
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

    /// Reader errors keep their line and message, under the file's name.
    #[test]
    fn errors_name_the_file_and_line() {
        let text =
            format!("{HEADER}\n1,00:00:01.5,allocate,0x10,8,0\n1,00:00:02,allocate,0x20,big,0\n");
        let count = Rc::new(Cell::new(0));
        let (_, mut src) = open_reader(Path::new("log.csv"), text.as_bytes(), count).unwrap();
        assert!(
            matches!(src.next_event(), Some(Ok(Event::Alloc(m))) if m.t_ns == 1_500_000_000 && m.addr == 0x10)
        );
        let e = src.next_event().unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "log.csv: line 3: bad Size 'big': expected decimal bytes"
        );
        assert!(src.next_event().is_none());
        let count = Rc::new(Cell::new(0));
        let e = match open_reader(Path::new("x.csv"), &b"a,b\n"[..], count) {
            Ok(_) => panic!("a header with no RMM column was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.starts_with("x.csv: line 1: not an RMM log: header 'a,b' has no 'Thread' column"),
            "{e}"
        );
    }
}
