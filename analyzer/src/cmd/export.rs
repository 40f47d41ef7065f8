//! `vramshim export TRACE... --format perfetto|chrome-json|memory-viz|rmm-csv|parquet -o FILE`
//! (`-o -`: standard output).

use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vramshim_analyzer::convert::{self as export, ExportFormat, ExportStats};

#[derive(clap::Args)]
pub struct Args {
    /// The trace (.vramtrace, RMM CSV or memory_viz pickle); several with --format parquet
    /// (one dataset, a `rank` column numbering them in the order given).
    #[arg(value_name = "TRACE", required = true, num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// perfetto (.pftrace, ui.perfetto.dev), chrome-json (chrome://tracing), memory-viz
    /// (PyTorch's memory_viz pickle), rmm-csv (RMM's logging CSV, for its replay benchmark),
    /// parquet (one row per event, for DuckDB, Spark, Trino).
    #[arg(long, short = 'f', value_enum)]
    pub format: ExportFormat,
    /// Output file; `-` writes to standard output (binary formats only when it is not a
    /// terminal).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Only this device (rmm-csv writes one device per file, as RMM does).
    #[arg(long, value_parser = crate::cmd::numbers::device)]
    pub device: Option<i32>,
}

pub fn main(a: Args) -> Result<ExitCode, String> {
    if a.traces.len() > 1 && a.format != ExportFormat::Parquet {
        return Err(format!(
            "export: {} traces given; --format {} takes one (only parquet puts several into one file)",
            a.traces.len(),
            a.format.name()
        ));
    }
    if a.format == ExportFormat::Parquet && a.device.is_some() {
        return Err(
            "export: --device does not apply to parquet (every device is in the file: filter \
             with WHERE device = N)"
                .into(),
        );
    }
    let to_stdout = a.output.as_os_str() == "-";
    let result = if to_stdout {
        let stdout = std::io::stdout();
        if binary(a.format) && stdout.is_terminal() {
            return Err(format!(
                "export: --format {} is binary and standard output is a terminal: redirect it \
                 (-o - > FILE, or into a pipe) or name a file with -o FILE (text to a terminal: \
                 chrome-json, rmm-csv)",
                a.format.name()
            ));
        }
        write(&a, stdout, Path::new("standard output"))
    } else {
        let f = vramshim_analyzer::files::create_output(&a.output)?;
        write(&a, f, &a.output).inspect_err(|_| {
            let _ = std::fs::remove_file(&a.output);
        })
    };
    let stats = result?;
    eprintln!(
        "wrote {} ({} records) to {}",
        a.format.name(),
        stats.records,
        if to_stdout {
            "standard output".to_string()
        } else {
            vramshim_analyzer::render::one_line(&a.output.display().to_string()).into_owned()
        }
    );
    if stats.torn {
        eprintln!(
            "vramshim: {}: a trace is damaged (a torn last frame, a frame that failed its \
             checksum, or bytes after the last good frame that are not a frame; named above); \
             everything else was exported",
            vramshim_analyzer::render::one_line(
                &a.traces
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// The formats whose bytes are not text (a terminal would show garbage and may act on escape
/// sequences in it).
fn binary(f: ExportFormat) -> bool {
    !matches!(f, ExportFormat::ChromeJson | ExportFormat::RmmCsv)
}

/// The export into `out` (a file, or standard output), flushed; `out_name` names it in
/// messages.
fn write<W: Write + Send>(a: &Args, out: W, out_name: &Path) -> Result<ExportStats, String> {
    let w = BufWriter::with_capacity(1 << 20, out);
    if a.format == ExportFormat::Parquet {
        vramshim_analyzer::convert::parquet::export(
            &a.traces,
            &mut |p| vramshim_analyzer::input::open(p),
            w,
            out_name,
        )
        .map(|s| ExportStats {
            records: s.rows,
            torn: s.damaged,
        })
    } else {
        export::export(&a.traces[0], a.format, w, a.device)
    }
}
