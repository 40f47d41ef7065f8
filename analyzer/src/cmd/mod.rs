//! The `vramshim` subcommands, one module each with its own `Args` and `main`, over the
//! library (`vramshim_analyzer`). Helpers shared by several subcommands live here too
//! (`pytorch_route`: how a PyTorch job is routed; `replay_live`, `replay_torch`: the two
//! live replays behind `vramshim replay --live`).

use std::process::ExitCode;

pub(crate) mod demo;
pub(crate) mod diff;
pub(crate) mod export;
pub(crate) mod exporter;
pub(crate) mod import;
pub(crate) mod kube;
pub(crate) mod node;
pub(crate) mod python_hook;
pub(crate) mod pytorch_route;
pub(crate) mod replay;
pub(crate) mod replay_live;
pub(crate) mod replay_torch;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod summary;
pub(crate) mod synth;
pub(crate) mod top;

/// The exit status after the output is written: 3 when an input was torn (its last frame cut;
/// everything before it was used and the problem was named on stderr), else 0.
pub(crate) fn input_status(reports: &[vramshim_analyzer::TraceReport], torn: bool) -> ExitCode {
    if torn {
        for r in reports.iter().filter(|r| r.torn) {
            for w in &r.warnings {
                eprintln!("vramshim: {}", vramshim_analyzer::render::one_line(w));
            }
        }
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

/// Value parsers for numeric flags whose errors name the accepted forms (clap's own say only
/// "invalid digit found in string").
pub(crate) mod numbers {
    /// A count: `--top N`.
    pub(crate) fn count(s: &str) -> Result<usize, String> {
        s.trim()
            .parse()
            .map_err(|_| "not a count; accepted: a whole number, 0 or more (e.g. 10)".into())
    }

    /// A CUDA device ordinal as the trace records it: `--device N`.
    pub(crate) fn device(s: &str) -> Result<i32, String> {
        s.trim().parse().map_err(|_| {
            "not a device; accepted: a CUDA device ordinal as the trace records it (0, 1, ...)"
                .into()
        })
    }

    /// Frames per call stack: `run --stacks N`.
    pub(crate) fn frames(s: &str) -> Result<u32, String> {
        s.trim().parse().map_err(|_| {
            "not a number of frames; accepted: a whole number from 0 to 64 (more are kept as 64)"
                .into()
        })
    }

    /// Seconds, with a fraction: `top --interval`.
    pub(crate) fn seconds(s: &str) -> Result<f64, String> {
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err("not a duration; accepted: seconds, 0 or more (e.g. 1 or 0.5)".into()),
        }
    }
}
