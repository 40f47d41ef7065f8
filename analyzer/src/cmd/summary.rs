//! `vramshim summary TRACE...`: per process and device, what happened to device memory.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::analysis::{self, Options};
use vramshim_analyzer::render;

#[derive(clap::Args)]
pub struct Args {
    /// Traces (.vramtrace, RMM CSV or memory_viz pickle); several = side by side.
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
    /// Print the documented JSON object instead of text (docs/analyzer.md).
    #[arg(long)]
    pub json: bool,
    /// Entries in each "largest"/"top" list.
    #[arg(long, default_value_t = 10, value_parser = crate::cmd::numbers::count)]
    pub top: usize,
    /// Skip the stitch what-if in post-mortems (it replays the trace up to each failure).
    #[arg(long)]
    pub no_whatif: bool,
    /// With several traces, print every trace's own detail after the side-by-side table
    /// (by default only the outliers' detail is printed).
    #[arg(long)]
    pub each: bool,
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let opts = Options {
        top: args.top.max(1),
        // Nothing summary prints comes from the memory-over-time chart.
        timeline: false,
        // Several traces may share a GPU: their exact in-use steps line them up (by_gpu).
        steps: args.traces.len() > 1,
        ..Options::default()
    };
    let vramshim_analyzer::Analyzed {
        reports,
        comparison,
        gpus,
        torn,
    } = vramshim_analyzer::analyze_traces(&args.traces, &opts, !args.no_whatif)?;
    if args.json {
        let mut v = serde_json::json!({
            "schema": analysis::SCHEMA,
            "traces": reports,
            "comparison": comparison,
        });
        if !gpus.is_empty() {
            v["by_gpu"] = serde_json::to_value(&gpus).map_err(|e| e.to_string())?;
        }
        println!("{}", vramshim_analyzer::json::to_string_pretty(&v)?);
    } else {
        let mut out = String::new();
        match &comparison {
            None => {
                for r in &reports {
                    render::text::trace(r, &mut out);
                    out.push('\n');
                }
            }
            Some(c) => {
                // Many ranks: the side-by-side table and its outliers first, then the detail
                // of the outliers (or of every trace with --each).
                render::text::comparison(c, &mut out);
                if !gpus.is_empty() {
                    out.push('\n');
                    render::text::by_gpu(&gpus, &mut out);
                }
                let shown: Vec<&analysis::TraceReport> = reports
                    .iter()
                    .filter(|r| args.each || c.outliers.iter().any(|o| o.file == r.file))
                    .collect();
                let _ = writeln!(
                    out,
                    "\n== per-trace detail: {}",
                    if args.each {
                        format!("all {} traces", reports.len())
                    } else if shown.is_empty() {
                        format!(
                            "none shown (no outlier; --each shows all {})",
                            reports.len()
                        )
                    } else {
                        format!(
                            "the {} outlier(s) (--each shows all {})",
                            shown.len(),
                            reports.len()
                        )
                    }
                );
                for r in shown {
                    out.push('\n');
                    render::text::trace(r, &mut out);
                }
            }
        }
        print!("{}", render::for_terminal(&out));
    }
    Ok(crate::cmd::input_status(&reports, torn))
}
