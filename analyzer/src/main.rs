//! `vramshim`: launches jobs under libvramshim.so and turns traces into answers.
//! Each subcommand lives in its own module with its own `Args` and `main`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

use cmd::{demo, diff, export, exporter, import, replay, report, run, summary, synth, top};
use vramshim_analyzer::render::{for_terminal, one_line};

#[derive(Parser)]
#[command(
    name = "vramshim",
    version,
    about = "GPU memory of unmodified CUDA processes: visible, bounded, unfragmented",
    after_help = "\
Environment:
  VRAMSHIM_NO_PROGRESS  set: no progress bar, even on a terminal
  VRAMSHIM_SYMBOLIZE    0: name call sites from the trace's module map only, without
                        reading the modules' ELF files
  VRAMSHIM_TORCH_VENV   a virtual environment with PyTorch, for replay --through pytorch
`vramshim run --help` lists the variables of the library; every variable, its default and
accepted forms: docs/configuration.md"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command under libvramshim.so (cap, pool, trace).
    Run(run::Args),
    /// Replay a real training trace plain, capped and pooled, and compare.
    Demo(demo::Args),
    /// Summarize one or more traces (text or --json).
    Summary(summary::Args),
    /// Write a self-contained HTML report of a trace.
    Report(report::Args),
    /// Export a trace to Perfetto, Chrome JSON, PyTorch memory_viz, RMM CSV or Parquet.
    Export(export::Args),
    /// Import an RMM log or a PyTorch memory snapshot as a trace.
    Import(import::Args),
    /// What-if: replay a trace through a pool policy, cap and device size.
    Replay(replay::Args),
    /// What changed between two runs.
    Diff(diff::Args),
    /// Live view of the shared cap regions and of every process on the node.
    Top(top::Args),
    /// Serve the node registry as Prometheus metrics at /metrics.
    Exporter(exporter::Args),
    /// Write a deterministic synthetic trace (benchmarks, tests).
    #[command(hide = true)]
    Synth(synth::Args),
}

/// Pipes and devices given as inputs become private temporary copies that the commands can
/// re-read (see `input::spool`); the copies go when the returned guards are dropped.
fn spool_inputs(cmd: &mut Cmd) -> Result<Vec<vramshim_analyzer::input::Spooled>, String> {
    let paths: Vec<&mut std::path::PathBuf> = match cmd {
        Cmd::Summary(a) => a.traces.iter_mut().collect(),
        Cmd::Report(a) => a.traces.iter_mut().collect(),
        Cmd::Export(a) => a.traces.iter_mut().collect(),
        Cmd::Replay(a) => vec![&mut a.trace],
        Cmd::Diff(a) => vec![&mut a.a, &mut a.b],
        // With --from the import streams its input once; without, the format is guessed from
        // the first bytes first.
        Cmd::Import(a) if a.from.is_none() => vec![&mut a.file],
        _ => vec![],
    };
    let mut held = Vec::new();
    for p in paths {
        let s = vramshim_analyzer::input::spool(p)?;
        if s.path() != p.as_path() {
            eprintln!(
                "vramshim: {} is a pipe or device: reading its copy {}",
                one_line(&p.to_string_lossy()),
                s.path().display()
            );
        }
        *p = s.path().to_path_buf();
        held.push(s);
    }
    Ok(held)
}

/// A command whose output is read by another program ends quietly, as other Unix tools do,
/// when that reader goes away (`vramshim summary --json | head`): Rust ignores SIGPIPE, so
/// the next write would fail and print! would panic. The exporter keeps ignoring it (a scraper
/// that hangs up must not end the server), and so do the commands that launch a job (the job
/// inherits the disposition it would have had without vramshim).
fn end_quietly_when_the_reader_leaves(cmd: &Cmd) {
    if matches!(cmd, Cmd::Run(_) | Cmd::Demo(_) | Cmd::Exporter(_)) {
        return;
    }
    // SAFETY: setting a signal's disposition to its default at start, before any thread.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    end_quietly_when_the_reader_leaves(&cli.cmd);
    let _spooled = match spool_inputs(&mut cli.cmd) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("vramshim: {}", for_terminal(&msg));
            return ExitCode::from(2);
        }
    };
    let result = match cli.cmd {
        Cmd::Run(a) => run::main(a),
        Cmd::Demo(a) => demo::main(a),
        Cmd::Summary(a) => summary::main(a),
        Cmd::Report(a) => report::main(a),
        Cmd::Export(a) => export::main(a),
        Cmd::Import(a) => import::main(a),
        Cmd::Replay(a) => replay::main(a),
        Cmd::Diff(a) => diff::main(a),
        Cmd::Top(a) => top::main(a),
        Cmd::Exporter(a) => exporter::main(a),
        Cmd::Synth(a) => synth::main(a),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("vramshim: {}", for_terminal(&msg));
            ExitCode::from(2)
        }
    }
}
