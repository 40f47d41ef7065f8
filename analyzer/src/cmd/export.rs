//! `vramshim export TRACE... --format perfetto|chrome-json|memory-viz|rmm-csv|parquet -o FILE`.

use std::io::BufWriter;
use std::path::PathBuf;
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
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Only this device (rmm-csv writes one device per file, as RMM does).
    #[arg(long)]
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
    let f = vramshim_analyzer::files::create_output(&a.output)?;
    let w = BufWriter::with_capacity(1 << 20, f);
    let result = if a.format == ExportFormat::Parquet {
        vramshim_analyzer::convert::parquet::export(
            &a.traces,
            &mut |p| vramshim_analyzer::input::open(p),
            w,
            &a.output,
        )
        .map(|s| ExportStats {
            records: s.rows,
            torn: s.damaged,
        })
    } else {
        export::export(&a.traces[0], a.format, w, a.device)
    };
    let stats = result.inspect_err(|_| {
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
            "vramshim: {}: a trace is damaged (a torn last frame or a frame that failed its \
             checksum, named above); everything else was exported",
            a.traces
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}
