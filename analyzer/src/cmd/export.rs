//! `vramshim export TRACE --format perfetto|chrome-json|memory-viz|rmm-csv -o FILE`.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::convert::{self as export, ExportFormat};

#[derive(clap::Args)]
pub struct Args {
    /// The trace (.vramtrace, RMM CSV or memory_viz pickle).
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// perfetto (.pftrace, ui.perfetto.dev), chrome-json (chrome://tracing), memory-viz
    /// (PyTorch's memory_viz pickle), rmm-csv (RMM's logging CSV, for its replay benchmark).
    #[arg(long, short = 'f', value_enum)]
    pub format: ExportFormat,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Only this device (rmm-csv writes one device per file, as RMM does).
    #[arg(long)]
    pub device: Option<i32>,
}

pub fn main(a: Args) -> Result<ExitCode, String> {
    let f = vramshim_analyzer::files::create_output(&a.output)?;
    let w = BufWriter::with_capacity(1 << 20, f);
    let stats = export::export(&a.trace, a.format, w, a.device).inspect_err(|_| {
        let _ = std::fs::remove_file(&a.output);
    })?;
    eprintln!(
        "wrote {} ({} records) to {}",
        a.format.name(),
        stats.records,
        a.output.display()
    );
    if stats.torn {
        eprintln!(
            "vramshim: {}: the trace is damaged (a torn last frame or a frame that failed its \
             checksum, named above); everything else was exported",
            a.trace.display()
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
