//! `.vramtrace` files, through the trace crate's reader and writer.
//!
//! The file is not in global time order (per-thread buffers interleave, flushed at least every
//! 100 ms), so events pass through a reorder window: they are released in time order once the
//! trace has moved `WINDOW_NS` past them. Untimed records (modules, stacks, devices) go out at
//! once: they only need to precede their uses.

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use vramshim_trace::{DecodeErrorKind, Event, Header, TraceReader};

use crate::error::InputError;
use crate::source::EventSource;

/// How far (in trace time) a buffer may lag behind the newest event. The writer flushes every
/// 100 ms; ten times that is a wide margin.
pub const WINDOW_NS: u64 = 1_000_000_000;
/// Past this many held events, the oldest are released regardless (bounded memory).
pub(crate) const MAX_HELD: usize = 4 << 20;
/// Events read per refill (the analysis's fast path emulates these boundaries).
pub(crate) const BATCH: usize = 1 << 16;

pub struct VramTraceSource {
    path: PathBuf,
    reader: TraceReader<BufReader<File>>,
    /// Timed events in time order; the first `ready` are released, the rest held.
    held: VecDeque<Event>,
    ready: usize,
    untimed: VecDeque<Event>,
    max_t: u64,
    released_t: u64,
    late: u64,
    eof: bool,
    error: Option<InputError>,
    warnings: Vec<String>,
    /// A torn last frame or a skipped corrupt frame: reported as a problem with the input
    /// (after the output is written).
    pub damaged: bool,
    /// No end record, or a torn last frame.
    cut_off: bool,
}

fn decode_error(path: &Path, e: &vramshim_trace::DecodeError) -> InputError {
    InputError::new(path, None, e.to_string())
}

pub fn open(path: &Path) -> Result<(Header, Box<dyn EventSource>), InputError> {
    let reader = TraceReader::open(path).map_err(|e| match &e.kind {
        DecodeErrorKind::Io(std::io::ErrorKind::NotFound, _) => {
            InputError::new(path, None, "no such file")
        }
        _ => decode_error(path, &e),
    })?;
    let header = reader.header().clone();
    Ok((
        header,
        Box::new(VramTraceSource {
            path: path.to_path_buf(),
            reader,
            held: VecDeque::new(),
            ready: 0,
            untimed: VecDeque::new(),
            max_t: 0,
            released_t: 0,
            late: 0,
            eof: false,
            error: None,
            warnings: Vec::new(),
            damaged: false,
            cut_off: false,
        }),
    ))
}

const PLACEHOLDER: Event = Event::Lost { t_ns: 0, count: 0 };

impl VramTraceSource {
    /// Reads a batch and releases what the window allows.
    fn fill(&mut self) {
        // Whether the held part is still in time order after this batch (single-threaded traces
        // always are): checked while decoding so the batch is not walked twice.
        let mut prev = self
            .held
            .back()
            .filter(|_| self.held.len() > self.ready)
            .map_or(0, |e| e.t_ns().unwrap_or(0));
        let mut sorted = true;
        let mut ev = PLACEHOLDER;
        let mut n = 0;
        while n < BATCH {
            match self.reader.next_into(&mut ev) {
                Ok(true) => {
                    n += 1;
                    match ev.t_ns() {
                        Some(t) => {
                            if t < self.released_t {
                                self.late += 1;
                            }
                            if t > self.max_t {
                                self.max_t = t;
                            }
                            sorted &= t >= prev;
                            prev = t;
                            self.held.push_back(std::mem::replace(&mut ev, PLACEHOLDER));
                        }
                        None => self
                            .untimed
                            .push_back(std::mem::replace(&mut ev, PLACEHOLDER)),
                    }
                }
                Ok(false) => {
                    self.eof = true;
                    break;
                }
                Err(e) if e.is_recoverable() => {
                    self.warnings.push(format!("{}: {e}", self.path.display()));
                    self.damaged = true;
                }
                Err(e) => {
                    self.error = Some(decode_error(&self.path, &e));
                    self.eof = true;
                    break;
                }
            }
        }
        if self.eof
            && let Some(t) = self.reader.truncation()
        {
            self.warnings.push(format!("{}: {t}", self.path.display()));
            self.cut_off = true;
            if t.is_damage() {
                self.damaged = true;
            }
        }
        // Late events (older than what was released) stay late.
        let key = |e: &Event| e.t_ns().unwrap_or(0);
        if !sorted {
            let ready = self.ready;
            self.held.make_contiguous()[ready..].sort_by_key(key);
        }
        let limit = if self.eof {
            u64::MAX
        } else {
            self.max_t.saturating_sub(WINDOW_NS)
        };
        let held = &self.held;
        let (mut lo, mut hi) = (self.ready, held.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if key(&held[mid]) <= limit {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mut cut = lo;
        if !self.eof && self.held.len() - cut > MAX_HELD {
            cut = self.held.len() - MAX_HELD / 2;
        }
        if cut > self.ready {
            self.released_t = key(&self.held[cut - 1]);
            self.ready = cut;
        }
    }
}

impl EventSource for VramTraceSource {
    #[inline]
    fn next_event(&mut self) -> Option<Result<Event, InputError>> {
        loop {
            if let Some(e) = self.untimed.pop_front() {
                return Some(Ok(e));
            }
            if self.ready > 0 {
                self.ready -= 1;
                if let Some(e) = self.held.pop_front() {
                    return Some(Ok(e));
                }
            }
            if self.eof {
                return self.error.take().map(Err);
            }
            self.fill();
        }
    }
    fn position(&self) -> u64 {
        self.reader.position()
    }
    fn warnings(&self) -> Vec<String> {
        let mut w = self.warnings.clone();
        if self.late > 0 {
            w.push(format!(
                "{}: {} events arrived more than {} s after later ones and were analyzed out of order",
                self.path.display(),
                self.late,
                WINDOW_NS / 1_000_000_000
            ));
        }
        w
    }
    fn damaged(&self) -> bool {
        self.damaged
    }
    fn cut_off(&self) -> bool {
        self.cut_off
    }
}
