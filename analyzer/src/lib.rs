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
pub mod json;
pub mod progress;
pub mod render;
pub mod source;
pub mod switches;
pub mod symbols;
pub mod synth;
pub mod terminal;
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

/// Several traces analyzed together: what `vramshim summary` and `vramshim report` show.
pub struct Analyzed {
    pub reports: Vec<TraceReport>,
    /// The side-by-side comparison, when there are several traces.
    pub comparison: Option<analysis::compare::Comparison>,
    /// The traces' devices lined up by the GPU they shared (by UUID).
    pub gpus: Vec<analysis::by_gpu::GpuGroup>,
    /// Some input was torn (cut inside its last frame): exit status 3 once the output is out.
    pub torn: bool,
}

/// Analyzes each trace (with the stitch what-if filled into post-mortems when `judge`),
/// compares them when there are several and lines them up by GPU.
pub fn analyze_traces<P: AsRef<std::path::Path>>(
    traces: &[P],
    opts: &Options,
    judge: bool,
) -> Result<Analyzed, String> {
    let mut reports = Vec::with_capacity(traces.len());
    for p in traces {
        let p = p.as_ref();
        let mut r = analysis::analyze(input::open(p)?, opts)?;
        if judge {
            whatif::judge_post_mortems(p, &mut r)?;
        }
        reports.push(r);
    }
    let torn = reports.iter().any(|r| r.torn);
    let comparison = (reports.len() > 1).then(|| analysis::compare::compare(&reports));
    let gpus = analysis::by_gpu::by_gpu(&mut reports);
    Ok(Analyzed {
        reports,
        comparison,
        gpus,
        torn,
    })
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
    let a = analyze_traces(traces, &opts, true)?;
    files::write_output(
        out,
        render::html::page(&a.reports, a.comparison.as_ref(), &a.gpus).as_bytes(),
    )
}
