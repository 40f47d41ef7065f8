//! What every reader of a format produces, below the readers (`formats`) and the opening by
//! format (`input`): the [`EventSource`] trait, the [`Opened`] file and the [`Format`] names.

use std::cell::Cell;
use std::io::Read;
use std::path::PathBuf;
use std::rc::Rc;

use vramshim_trace::{Event, Header};

use crate::error::InputError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    VramTrace,
    RmmCsv,
    MemoryViz,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::VramTrace => "vramtrace",
            Format::RmmCsv => "rmm-csv",
            Format::MemoryViz => "memory-viz",
        }
    }
}

/// A stream of events from one file.
pub trait EventSource {
    /// The next event, an error (after which the stream ends), or `None` at the end.
    fn next_event(&mut self) -> Option<Result<Event, InputError>>;
    /// Bytes of the file consumed so far (for progress).
    fn position(&self) -> u64;
    /// Problems that did not stop reading (a torn last chunk, lost events...), known at the end.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// Part of the file could not be used: it was cut inside its last frame, or a frame failed
    /// its checksum and was skipped (named in `warnings`; reported as an input problem once the
    /// output is written: exit status 3).
    fn damaged(&self) -> bool {
        false
    }
    /// The file ends before its writer finished it (no end record, or a torn frame): what was
    /// live at its end is not what the process left allocated.
    fn cut_off(&self) -> bool {
        false
    }
}

pub struct Opened {
    pub path: PathBuf,
    pub format: Format,
    pub header: Header,
    pub len: u64,
    pub events: Box<dyn EventSource>,
}

/// A reader that counts the bytes it has handed out.
pub struct Counting<R> {
    pub inner: R,
    pub count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// Events from memory (imports, tests).
pub struct VecSource {
    events: std::vec::IntoIter<Event>,
    warnings: Vec<String>,
}

impl VecSource {
    pub fn new(events: Vec<Event>, warnings: Vec<String>) -> VecSource {
        VecSource {
            events: events.into_iter(),
            warnings,
        }
    }
}

impl EventSource for VecSource {
    fn next_event(&mut self) -> Option<Result<Event, InputError>> {
        self.events.next().map(Ok)
    }
    fn position(&self) -> u64 {
        0
    }
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}
