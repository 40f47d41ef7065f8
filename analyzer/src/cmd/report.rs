//! `vramshim report TRACE... -o FILE.html`: a self-contained HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

use vramshim_analyzer::analysis::{self, Options, compare};
use vramshim_analyzer::{input, render, whatif};

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
    let mut reports = Vec::new();
    let mut torn = false;
    for p in &args.traces {
        let mut r = analysis::analyze(input::open(p)?, &opts)?;
        if !args.no_whatif {
            whatif::judge_post_mortems(p, &mut r)?;
        }
        torn |= r.torn;
        reports.push(r);
    }
    let comparison = if reports.len() > 1 {
        Some(compare::compare(&reports))
    } else {
        None
    };
    let gpus = analysis::by_gpu::by_gpu(&mut reports);
    let html = render::html::page(&reports, comparison.as_ref(), &gpus);
    vramshim_analyzer::files::write_output(&args.output, html.as_bytes())?;
    eprintln!("wrote {}", args.output.display());
    Ok(crate::cmd::input_status(&reports, torn))
}
