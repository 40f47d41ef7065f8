//! End-to-end tests of the tracer layer (`interposer/src/tracer/`) and its benchmark
//! (`src/bin/trace_bench.rs`). The C workloads are in `c/`.
//!
//! The end-to-end tests run `libvramshim.so` and the simulated GPU from the profile directory:
//! `scripts/test` builds the whole workspace first; alone, build them first
//! (`cargo build --release -p vramshim-interposer -p vramsim-driver -p vramsim-nvml
//! -p vramsim-runtime12 -p vramsim-runtime13 -p vramsim-runtime-static`): building this crate
//! builds the interposer only as a library, not the preload `.so`.

pub mod tick_window;

use std::path::{Path, PathBuf};

use vramshim_trace::{DecodeError, Event, Header, TraceReader, Truncation};

/// Everything in a trace file.
pub struct Read {
    pub header: Header,
    pub events: Vec<Event>,
    pub errors: Vec<DecodeError>,
    pub truncation: Option<Truncation>,
    pub end: Option<u64>,
}

impl Read {
    /// The sizes of the trace's allocation records, in order.
    pub fn alloc_sizes(&self) -> Vec<u64> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(m) => Some(m.size),
                _ => None,
            })
            .collect()
    }
}

/// Reads a whole trace, panicking on open errors (with the path).
pub fn read(path: &Path) -> Read {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut events = Vec::new();
    let mut errors = Vec::new();
    loop {
        match r.next() {
            Some(Ok(e)) => events.push(e),
            Some(Err(e)) => errors.push(e),
            None => break,
        }
    }
    Read {
        header: r.header().clone(),
        events,
        errors,
        truncation: r.truncation().cloned(),
        end: r.end_time(),
    }
}

/// Monotonic clock in ns (the tracer's clock).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `c/<name>` relative to the repository root.
pub fn source(name: &str) -> String {
    format!("tests/workloads/trace/c/{name}")
}

/// Trace files in `dir`.
pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "vramtrace"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The one trace file in `dir`, read; panics (with `what` and the files there) when `dir`
/// holds none or several.
#[track_caller]
pub fn only_trace(dir: &Path, what: &str) -> Read {
    let files = traces_in(dir);
    assert_eq!(files.len(), 1, "{what}: {files:?}");
    read(&files[0])
}
