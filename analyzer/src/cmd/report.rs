//! `vramshim report TRACE... -o FILE.html`: a self-contained HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::analysis::Options;
use vramshim_analyzer::render;

#[derive(clap::Args)]
pub struct Args {
    /// Traces (.vramtrace, RMM CSV or memory_viz pickle).
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Skip the stitch what-if in post-mortems.
    #[arg(long)]
    pub no_whatif: bool,
}

pub fn main(args: Args) -> Result<ExitCode, String> {
    let opts = Options {
        // Several traces may share a GPU: the report lines them up (by GPU).
        steps: args.traces.len() > 1,
        ..Options::default()
    };
    let a = vramshim_analyzer::analyze_traces(&args.traces, &opts, !args.no_whatif)?;
    let html = render::html::page(&a.reports, a.comparison.as_ref(), &a.gpus);
    vramshim_analyzer::files::write_output(&args.output, html.as_bytes())?;
    eprintln!("wrote {}", args.output.display());
    Ok(crate::cmd::input_status(&a.reports, a.torn))
}
