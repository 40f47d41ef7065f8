//! Converting traces to and from other tools' formats (the library side of `export`/`import`).

pub mod parquet;

use std::io::{BufWriter, Write};
use std::path::Path;

use vramshim_trace::{AllocKind, Event, TraceWriter, codes};

use crate::analysis::reserved::Holdings;

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
    Parquet,
}

impl ExportFormat {
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Perfetto => "perfetto",
            ExportFormat::ChromeJson => "chrome-json",
            ExportFormat::MemoryViz => "memory-viz",
            ExportFormat::RmmCsv => "rmm-csv",
            ExportFormat::Parquet => "parquet",
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

/// The reserved figure as the analyzer computes it from the events
/// ([`crate::analysis::reserved`]), for the exports: `Counter` records carry it, and a
/// `Counter` follows every allocation or free that changed it, so an export's reserved track is
/// the figure `summary` prints at every instant.
#[derive(Default)]
struct ReservedFigures {
    devices: crate::fastmap::FastMap<i32, DeviceFigures>,
}

#[derive(Default)]
struct DeviceFigures {
    /// Live allocations: address -> (kind, flags, size).
    live: crate::fastmap::FastMap<u64, (AllocKind, u8, u64)>,
    held: Holdings,
    in_use: u64,
    cap: u64,
    /// The reserved figure last exported.
    shown: u64,
}

impl ReservedFigures {
    /// Brings `ev` in line; returns the `Counter` to export after it, if any.
    fn see(&mut self, ev: &mut Event) -> Option<Event> {
        let (t_ns, device) = match ev {
            Event::Alloc(m) if m.result == codes::CUDA_SUCCESS && m.addr != 0 => {
                let d = self.devices.entry(m.device).or_default();
                if let Some((k, f, n)) = d.live.insert(m.addr, (m.kind, m.flags, m.size)) {
                    d.held.release(k, f, n);
                    d.in_use = d.in_use.saturating_sub(n);
                }
                d.held.hold(m.kind, m.flags, m.size);
                d.in_use = d.in_use.saturating_add(m.size);
                (m.t_ns, m.device)
            }
            Event::Free(m) if m.result == codes::CUDA_SUCCESS => {
                let d = self.devices.entry(m.device).or_default();
                let (k, f, n) = d.live.remove(&m.addr)?;
                d.held.release(k, f, n);
                d.in_use = d.in_use.saturating_sub(n);
                (m.t_ns, m.device)
            }
            Event::Counter {
                device,
                reserved_bytes,
                cap,
                ..
            } => {
                let d = self.devices.entry(*device).or_default();
                d.held.pool_reports(*reserved_bytes);
                if *cap > 0 {
                    d.cap = *cap;
                }
                *reserved_bytes = d.held.reserved();
                d.shown = *reserved_bytes;
                return None;
            }
            _ => return None,
        };
        let d = self.devices.get_mut(&device)?;
        let r = d.held.reserved();
        if device < 0 || r == d.shown {
            return None;
        }
        d.shown = r;
        Some(Event::Counter {
            t_ns,
            device,
            live_bytes: d.in_use,
            reserved_bytes: r,
            cap: d.cap,
        })
    }
}

/// Streams every event of `opened` into `sink`.
fn pump(
    mut opened: Opened,
    mut sink: impl FnMut(&vramshim_trace::Event) -> std::io::Result<()>,
) -> Result<bool, String> {
    let mut figures = ReservedFigures::default();
    let mut progress = Progress::new(&format!("reading {}", opened.path.display()), opened.len);
    let mut n = 0u64;
    while let Some(ev) = opened.events.next_event() {
        let mut ev = ev?;
        let counter = figures.see(&mut ev);
        sink(&ev).map_err(|e| format!("cannot write: {e}"))?;
        if let Some(c) = counter {
            sink(&c).map_err(|e| format!("cannot write: {e}"))?;
        }
        n += 1;
        if n & 0xffff == 0 {
            progress.update(opened.events.position());
        }
    }
    progress.finish();
    for w in opened.events.warnings() {
        eprintln!("warning: {}", crate::terminal::one_line(&w));
    }
    Ok(opened.events.damaged())
}

pub fn export<W: Write + Send>(
    trace: &Path,
    format: ExportFormat,
    w: W,
    device: Option<i32>,
) -> Result<ExportStats, String> {
    // Decided before a byte is written: standard output cannot be taken back as a file can.
    if let Some(d) = device {
        has_device(trace, d)?;
    }
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
        ExportFormat::Parquet => {
            // Several traces into one file: `convert::parquet::export`, called by the command.
            drop(opened);
            let out = Path::new("the Parquet output");
            let stats = parquet::export(&[trace.to_path_buf()], &mut |p| input::open(p), w, out)?;
            Ok(ExportStats {
                records: stats.rows,
                torn: stats.damaged,
            })
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

/// `Err` when the trace's events name other devices but not `device` (a `--device` it does
/// not have). Reads the trace up to the first event on `device`; its warnings are left to the
/// export's own pass.
fn has_device(trace: &Path, device: i32) -> Result<(), String> {
    let mut opened = input::open(trace)?;
    let mut seen: Vec<i32> = Vec::new();
    while let Some(ev) = opened.events.next_event() {
        match ev_device(&ev?) {
            Some(d) if d == device => return Ok(()),
            Some(d) if d >= 0 && !seen.contains(&d) => seen.push(d),
            _ => {}
        }
    }
    if seen.is_empty() {
        return Ok(());
    }
    seen.sort_unstable();
    let list: Vec<String> = seen.iter().map(|d| d.to_string()).collect();
    Err(format!(
        "{}: no event on device {device} in this trace; --device accepts the devices it has: {}",
        crate::terminal::one_line(&trace.display().to_string()),
        list.join(", ")
    ))
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
    // The output's own rules first (no symlink, FIFO or another user's file at it), so the
    // rename below replaces only what the user may replace; the partial file is created new
    // (never through anything planted at its name).
    let out_is_new = crate::files::check_output(out)?;
    let written = (|| -> Result<u64, String> {
        let f = crate::files::create_output(&partial)?;
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
        if out_is_new {
            let _ = std::fs::remove_file(out);
        }
    }
    renamed
}
