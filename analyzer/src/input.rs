//! Opening anything the analyzer reads: a `.vramtrace`, an RMM logging CSV or a PyTorch memory
//! snapshot pickle. Each becomes a `Header` and a stream of `Event`s.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::error::InputError;
use crate::formats;
pub use crate::source::{Counting, EventSource, Format, Opened, VecSource};

/// Guesses the format from the first bytes (and the name, as a tie-breaker).
pub fn detect(path: &Path) -> Result<Format, InputError> {
    let mut f = File::open(path).map_err(|e| InputError::io(path, &e))?;
    if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
        return Err(InputError::new(path, None, "is a directory, not a trace"));
    }
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(InputError::io(path, &e)),
        }
    }
    detect_head(path, &head[..n])
}

/// [`detect`] on the first bytes of `path` (up to 64).
fn detect_head(path: &Path, head: &[u8]) -> Result<Format, InputError> {
    if head.is_empty() {
        return Err(InputError::at_offset(
            path,
            0,
            "empty file: not a trace, RMM log or memory snapshot",
        ));
    }
    if head.starts_with(b"Thread,") || head.starts_with(b"\xef\xbb\xbfThread,") {
        return Ok(Format::RmmCsv);
    }
    if head[0] == 0x80 && head.len() >= 2 && (2..=5).contains(&head[1]) {
        return Ok(Format::MemoryViz);
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "csv" => Ok(Format::RmmCsv),
        "pickle" | "pkl" => Ok(Format::MemoryViz),
        _ => Ok(Format::VramTrace),
    }
}

/// The most bytes of a pipe or device copied into a temporary file (see [`spool`]).
pub const MAX_SPOOL: u64 = 16 << 30;

/// An input ready to be read (and re-read: summaries, exports and what-ifs read a trace more
/// than once): the file itself, or for a pipe or device (`<(...)`, `/dev/stdin`) a private
/// copy in a private directory of its own, both removed when this is dropped.
pub struct Spooled {
    path: PathBuf,
    temp: bool,
}

impl Spooled {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Spooled {
    fn drop(&mut self) {
        if self.temp {
            let _ = std::fs::remove_file(&self.path);
            if let Some(dir) = self.path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// Makes `path` re-readable: regular files (and anything that cannot be opened, for the
/// reader's own message) are used in place; a pipe or device is checked to start like a
/// trace, RMM log or pickle, then copied into a file of a fresh private directory
/// ([`crate::files::private_temp_dir`]; the file `O_EXCL`, mode 0600), at most [`MAX_SPOOL`]
/// bytes.
pub fn spool(path: &Path) -> Result<Spooled, InputError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let in_place = Spooled {
        path: path.to_path_buf(),
        temp: false,
    };
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {}
        _ => return Ok(in_place),
    }
    let mut src = File::open(path).map_err(|e| InputError::io(path, &e))?;
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match src.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(InputError::io(path, &e)),
        }
    }
    let head = &head[..n];
    let format = detect_head(path, head)?;
    if format == Format::VramTrace && !head.starts_with(&vramshim_trace::MAGIC[..4]) {
        return Err(InputError::at_offset(
            path,
            0,
            "not a vramshim trace (no .vramtrace magic at byte 0), RMM log or memory snapshot",
        ));
    }
    // A file of its own in a fresh private directory (never a name another user can
    // predict and plant first).
    let dir = crate::files::private_temp_dir("vramshim-input").map_err(|e| {
        InputError::new(
            path,
            None,
            format!("a pipe or device is copied into a temporary file to be read; {e}"),
        )
    })?;
    let tmp = dir.join("input");
    let spooled = Spooled {
        path: tmp,
        temp: true,
    };
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&spooled.path)
        .map_err(|e| {
            InputError::new(
                path,
                None,
                format!(
                    "a pipe or device is copied into {} to be read; cannot create it: {e}",
                    spooled.path.display()
                ),
            )
        })?;
    let copy_err = |e: std::io::Error| {
        InputError::new(
            path,
            None,
            format!("cannot copy the pipe into {}: {e}", spooled.path.display()),
        )
    };
    out.write_all(head).map_err(copy_err)?;
    let copied = std::io::copy(&mut (&mut src).take(MAX_SPOOL + 1 - n as u64), &mut out)
        .map_err(copy_err)?;
    if copied + n as u64 > MAX_SPOOL {
        return Err(InputError::new(
            path,
            None,
            format!(
                "a pipe or device is copied into a temporary file to be read, and this one runs \
                 past {} GiB: write it to a file first",
                MAX_SPOOL >> 30
            ),
        ));
    }
    Ok(spooled)
}

/// Opens `path` in whatever format it is in.
pub fn open(path: &Path) -> Result<Opened, InputError> {
    let format = detect(path)?;
    open_as(path, format)
}

pub fn open_as(path: &Path, format: Format) -> Result<Opened, InputError> {
    let file = File::open(path).map_err(|e| InputError::io(path, &e))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    match format {
        Format::RmmCsv => {
            let count = Rc::new(Cell::new(0));
            let reader = BufReader::with_capacity(
                1 << 16,
                Counting {
                    inner: file,
                    count: count.clone(),
                },
            );
            let (header, events) = formats::rmm_csv::open_reader(path, reader, count)?;
            Ok(Opened {
                path: path.to_path_buf(),
                format,
                header,
                len,
                events: Box::new(events),
            })
        }
        Format::MemoryViz => {
            let (header, events) = formats::memviz::open(path)?;
            Ok(Opened {
                path: path.to_path_buf(),
                format,
                header,
                len,
                events: Box::new(events),
            })
        }
        Format::VramTrace => {
            let (header, events) = formats::vramtrace::open(path)?;
            Ok(Opened {
                path: path.to_path_buf(),
                format,
                header,
                len,
                events,
            })
        }
    }
}
