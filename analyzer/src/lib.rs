//! The analysis side of vramshim as a library: open a trace (a `.vramtrace`, an RMM log or a
//! PyTorch memory snapshot), analyze it in one streaming pass, and render or convert the result.
//! The `vramshim` subcommands are thin wrappers over these modules.

pub mod analysis;
pub mod convert;
pub mod error;
pub mod fastmap;
pub mod files;
pub mod formats;
pub mod input;
pub mod progress;
pub mod render;
pub mod source;
pub mod symbols;
pub mod synth;
pub mod units;
pub mod whatif;

pub use analysis::{Analysis, Options, TraceReport};
pub use error::InputError;

/// Analyzes one file (any supported format) with the stitch what-if filled into post-mortems.
/// What `vramshim summary` does for each TRACE; for other tools (`vramshim demo`).
pub fn summarize(path: &std::path::Path, opts: &Options) -> Result<TraceReport, String> {
    let mut r = analysis::analyze(input::open(path)?, opts)?;
    whatif::judge_post_mortems(path, &mut r)?;
    Ok(r)
}

/// The text `vramshim summary` prints for one report (post-mortems included).
pub fn summary_text(r: &TraceReport) -> String {
    let mut s = String::new();
    render::text::trace(r, &mut s);
    s
}

/// Writes the self-contained HTML report of `traces` to `out` (what `vramshim report` does).
pub fn write_html_report(
    traces: &[std::path::PathBuf],
    out: &std::path::Path,
) -> Result<(), String> {
    let opts = Options {
        progress: false,
        // Several traces may share a GPU: the report lines them up (by GPU).
        steps: traces.len() > 1,
        ..Options::default()
    };
    let mut reports = traces
        .iter()
        .map(|p| summarize(p, &opts))
        .collect::<Result<Vec<_>, _>>()?;
    let gpus = analysis::by_gpu::by_gpu(&mut reports);
    let cmp = if reports.len() > 1 {
        Some(analysis::compare::compare(&reports))
    } else {
        None
    };
    files::write_output(
        out,
        render::html::page(&reports, cmp.as_ref(), &gpus).as_bytes(),
    )
}
