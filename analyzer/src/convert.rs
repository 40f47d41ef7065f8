//! Converting traces to and from other tools' formats (the library side of `export`/`import`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use vramshim_trace::TraceWriter;

use crate::error::{InputError, write_error};
use crate::formats::{
    chrome::ChromeWriter, memviz, perfetto::PerfettoWriter, rmm_csv::RmmCsvWriter,
};
use crate::input::{self, Format, Opened};
use crate::progress::Progress;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Perfetto,
    ChromeJson,
    MemoryViz,
    RmmCsv,
}

impl ExportFormat {
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Perfetto => "perfetto",
            ExportFormat::ChromeJson => "chrome-json",
            ExportFormat::MemoryViz => "memory-viz",
            ExportFormat::RmmCsv => "rmm-csv",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    RmmCsv,
    MemoryViz,
}

#[derive(Clone, Debug, Default)]
pub struct ExportStats {
    pub records: u64,
    /// A torn last frame or a skipped corrupt frame (named on stderr as a warning).
    pub torn: bool,
}

/// Streams every event of `opened` into `sink`.
fn pump(
    mut opened: Opened,
    mut sink: impl FnMut(&vramshim_trace::Event) -> std::io::Result<()>,
) -> Result<bool, String> {
    let mut progress = Progress::new(&format!("reading {}", opened.path.display()), opened.len);
    let mut n = 0u64;
    while let Some(ev) = opened.events.next_event() {
        let ev = ev?;
        sink(&ev).map_err(|e| format!("cannot write: {e}"))?;
        n += 1;
        if n & 0xffff == 0 {
            progress.update(opened.events.position());
        }
    }
    progress.finish();
    for w in opened.events.warnings() {
        eprintln!("warning: {w}");
    }
    Ok(opened.events.damaged())
}

pub fn export<W: Write>(
    trace: &Path,
    format: ExportFormat,
    w: W,
    device: Option<i32>,
) -> Result<ExportStats, String> {
    let opened = input::open(trace)?;
    let header = opened.header.clone();
    let io = |e: std::io::Error| format!("cannot write: {e}");
    match format {
        ExportFormat::RmmCsv => {
            let mut wr = RmmCsvWriter::new(w, &header, device).map_err(io)?;
            let torn = pump(opened, |ev| wr.event(ev))?;
            let rows = wr.rows;
            wr.finish().map_err(io)?;
            Ok(ExportStats {
                records: rows,
                torn,
            })
        }
        ExportFormat::ChromeJson => {
            let mut wr = ChromeWriter::new(w, &header).map_err(io)?;
            let torn = pump(opened, |ev| {
                if device.is_none_or(|d| ev_device(ev).is_none_or(|x| x == d)) {
                    wr.event(ev)
                } else {
                    Ok(())
                }
            })?;
            let n = wr.events;
            wr.finish().map_err(io)?;
            Ok(ExportStats { records: n, torn })
        }
        ExportFormat::Perfetto => {
            let mut wr = PerfettoWriter::new(w, &header).map_err(io)?;
            let torn = pump(opened, |ev| {
                if device.is_none_or(|d| ev_device(ev).is_none_or(|x| x == d)) {
                    wr.event(ev)
                } else {
                    Ok(())
                }
            })?;
            let n = wr.packets;
            wr.finish().map_err(io)?;
            Ok(ExportStats { records: n, torn })
        }
        ExportFormat::MemoryViz => {
            let torn = opened.format == Format::VramTrace && {
                // Learn whether the input is torn from a plain pass (the export passes re-read it).
                pump(opened, |_| Ok(()))?
            };
            let mut reopen = || input::open(trace);
            let (mut w, n) = memviz::export(w, &mut reopen)?;
            w.flush().map_err(io)?;
            Ok(ExportStats { records: n, torn })
        }
    }
}

fn ev_device(ev: &vramshim_trace::Event) -> Option<i32> {
    use vramshim_trace::Event::*;
    match ev {
        Alloc(m) | Free(m) => Some(m.device),
        CapRefusal { device, .. }
        | PoolTrim { device, .. }
        | Sync { device, .. }
        | Counter { device, .. } => Some(*device),
        MemInfo { device, .. } => Some(*device),
        _ => None,
    }
}

/// Converts an RMM log or a memory snapshot into a `.vramtrace`; returns the events written.
pub fn import(file: &Path, from: Option<ImportFormat>, out: &Path) -> Result<u64, String> {
    let format = match from {
        Some(ImportFormat::RmmCsv) => Format::RmmCsv,
        Some(ImportFormat::MemoryViz) => Format::MemoryViz,
        None => match input::detect(file)? {
            Format::VramTrace => {
                return Err(InputError::new(
                    file,
                    Some(crate::error::Location::Offset(0)),
                    "neither an RMM log (no 'Thread,Time,Action,...' header) nor a pickle; say --from",
                )
                .to_string());
            }
            f => f,
        },
    };
    let mut opened = input::open_as(file, format)?;
    // Streamed into a file beside the output and renamed at the end (bounded memory however
    // long the input): a bad row leaves no half-written trace behind.
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partial = out.with_file_name(format!(".{name}.partial-{}", std::process::id()));
    let written = (|| -> Result<u64, String> {
        let f = File::create(&partial).map_err(|e| write_error(out, &e))?;
        let mut w = TraceWriter::new(BufWriter::with_capacity(1 << 20, f), &opened.header)
            .map_err(|e| write_error(out, &e))?;
        let mut n = 0u64;
        while let Some(ev) = opened.events.next_event() {
            w.write(&ev?).map_err(|e| write_error(out, &e))?;
            n += 1;
        }
        let mut f = w.finish().map_err(|e| write_error(out, &e))?;
        f.flush().map_err(|e| write_error(out, &e))?;
        Ok(n)
    })();
    let renamed = written.and_then(|n| {
        std::fs::rename(&partial, out)
            .map(|_| n)
            .map_err(|e| write_error(out, &e))
    });
    if renamed.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    renamed
}
