//! `vramshim replay --live [--sim] TRACE`: the trace's allocation stream replayed through real
//! `cudaMalloc`/`cudaFree` by the log-replay workload (tests/workloads/replay/replay.c, built
//! on demand as `vramshim demo` does), under libvramshim.so with the requested pool and cap, on
//! the real GPU or the simulated one; printed next to the deterministic what-if model.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use serde::Serialize;
use vramshim_analyzer::convert::{self, ExportFormat};
use vramshim_analyzer::units::bytes;
use vramshim_analyzer::whatif::{self, PolicyReport};
use vramshim_pool::replay::Event as Op;
use vramshim_pool::{FreeMode, PolicyKind};

use crate::cmd::demo::{self, Gpu};
use crate::cmd::run;

pub struct LiveArgs<'a> {
    pub trace: &'a Path,
    pub pool: &'a str,
    pub cap: Option<u64>,
    pub device_memory: Option<u64>,
    pub device: Option<i32>,
    pub sim: bool,
    pub json: bool,
}

/// What one live run did.
#[derive(Debug, Serialize)]
pub struct LiveRun {
    pub policy: String,
    pub completed: bool,
    pub allocs_done: u64,
    pub failed: u64,
    /// The request (0-based, in the device's allocation order) that failed first, and what
    /// the process saw.
    pub first_failure: Option<(u64, String)>,
    /// Largest sum of live requested bytes the workload held.
    pub peak_live: u64,
    /// What the device handed out at most (simulated device's own accounting), or what the
    /// pool reserved by its trace counters on a real GPU.
    pub peak_reserved: Option<u64>,
    pub driver_calls: Option<u64>,
    pub syncs: Option<u64>,
    pub wall_ns: u64,
    pub model: Option<PolicyReport>,
    pub problem: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct LiveReport {
    pub schema: &'static str,
    pub file: String,
    pub device: i32,
    pub gpu: String,
    pub device_memory: Option<u64>,
    pub cap: Option<u64>,
    pub requests: u64,
    /// Replayed with cudaMallocAsync/cudaFreeAsync on one stream (most of the trace's frees
    /// were stream-ordered), else cudaMalloc/cudaFree.
    pub stream_ordered: bool,
    pub runs: Vec<LiveRun>,
}

pub const LIVE_SCHEMA: &str = "vramshim.replay-live/1";

/// The live policies: vramshim's pool on (`stitch`) or off (`direct`, plain driver calls).
fn policies(pool: &str) -> Result<Vec<PolicyKind>, String> {
    match pool {
        "all" => Ok(vec![PolicyKind::Direct, PolicyKind::Stitch]),
        p => match p.parse::<PolicyKind>() {
            Ok(k @ (PolicyKind::Direct | PolicyKind::Stitch)) => Ok(vec![k]),
            Ok(k) => Err(format!(
                "--pool {k}: libvramshim.so has no such pool, so it cannot be replayed live (use stitch, direct or all; the what-if model without --live covers {k})"
            )),
            Err(e) => Err(format!("--pool: {e} (or all)")),
        },
    }
}

pub fn main(a: LiveArgs) -> Result<ExitCode, String> {
    let kinds = policies(a.pool)?;
    let model = whatif::replay(a.trace, &kinds, a.device, a.device_memory, a.cap, false)?;
    let damage = model.damage.clone();
    let gpu = demo::detect_gpu(a.sim)?;
    let lib = run::find_library()?;
    // Private to this run: the replay program is built and run from it.
    let work = vramshim_analyzer::files::private_temp_dir("vramshim-replay-live")?;
    let result = live(&a, &gpu, &lib, &work, &kinds, model);
    let _ = std::fs::remove_dir_all(&work);
    let report = result?;
    if a.json {
        println!("{}", vramshim_analyzer::json::to_string_pretty(&report)?);
    } else {
        // The file's name and a run's problem (the workload's own lines) come from elsewhere.
        print!(
            "{}",
            vramshim_analyzer::render::for_terminal(&text(&report))
        );
    }
    // A damaged input (named on stderr) is an input problem: 3, as for `replay`.
    for d in &damage {
        eprintln!("vramshim: {}", vramshim_analyzer::render::one_line(d));
    }
    Ok(if report.runs.iter().any(|r| r.problem.is_some()) {
        ExitCode::from(1)
    } else if !damage.is_empty() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

fn live(
    a: &LiveArgs,
    gpu: &Gpu,
    lib: &Path,
    work: &Path,
    kinds: &[PolicyKind],
    model: whatif::ReplayReport,
) -> Result<LiveReport, String> {
    // The device's stream as an RMM log: what the replay workload reads.
    let csv = work.join("stream.csv");
    let f = vramshim_analyzer::files::create_output(&csv)?;
    convert::export(
        a.trace,
        ExportFormat::RmmCsv,
        std::io::BufWriter::new(f),
        Some(model.device),
    )?;
    // A stream-ordered trace (cudaMallocAsync/cudaFreeAsync) is replayed stream-ordered.
    let ops =
        whatif::read_stream(vramshim_analyzer::input::open(a.trace)?, Some(model.device))?.ops;
    let frees = ops.iter().filter(|o| matches!(o, Op::Free { .. })).count();
    let async_frees = ops
        .iter()
        .filter(|o| {
            matches!(
                o,
                Op::Free {
                    mode: FreeMode::Async { .. },
                    ..
                }
            )
        })
        .count();
    drop(ops);
    let stream_ordered = async_frees * 2 > frees;
    // Built in this run's private directory (a program shared through the temp directory
    // could be anyone's).
    let bin = demo::replay_program(work, gpu)?;
    let device_memory = match gpu {
        Gpu::Sim { .. } => Some(model.device_memory),
        Gpu::Real { .. } => None,
    };
    let mut runs = Vec::new();
    for (&k, m) in kinds.iter().zip(model.policies) {
        let mut r = run_one(
            gpu,
            lib,
            &bin,
            &csv,
            work,
            k,
            a.cap,
            model.device_memory,
            stream_ordered,
        );
        r.model = Some(m);
        runs.push(r);
    }
    Ok(LiveReport {
        schema: LIVE_SCHEMA,
        file: a.trace.display().to_string(),
        device: model.device,
        gpu: gpu.describe(),
        device_memory,
        cap: a.cap,
        requests: model.requests,
        stream_ordered,
        runs,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    gpu: &Gpu,
    lib: &Path,
    bin: &Path,
    csv: &Path,
    work: &Path,
    kind: PolicyKind,
    cap: Option<u64>,
    device_memory: u64,
    stream_ordered: bool,
) -> LiveRun {
    let trace: PathBuf = work.join(format!("{kind}.vramtrace"));
    let mut cmd = Command::new(bin);
    cmd.arg("--stop-on-failure");
    if stream_ordered {
        cmd.arg("--async");
    }
    cmd.arg(csv)
        .env("LD_PRELOAD", lib)
        .env("VRAMSHIM_TRACE", &trace)
        .env(
            "VRAMSHIM_POOL",
            if kind == PolicyKind::Stitch {
                "stitch"
            } else {
                "off"
            },
        )
        .env_remove("VRAMSHIM_SHARED")
        .env_remove("VRAMSHIM_STACKS")
        // The cap is about the replayed allocations, as in the model, not the context's memory.
        .env("VRAMSHIM_CAP_CONTEXT", "exclude");
    match cap {
        Some(c) => cmd.env("VRAMSHIM_CAP", c.to_string()),
        None => cmd.env_remove("VRAMSHIM_CAP"),
    };
    let sim_name = format!("vramshim-replay-{}-{kind}", std::process::id());
    match gpu {
        Gpu::Sim { dir } => {
            cmd.env("LD_LIBRARY_PATH", dir)
                .env("VRAMSIM_NAME", &sim_name)
                .env("VRAMSIM_MEMORY", device_memory.to_string())
                .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
                .env("VRAMSIM_LATENCY", demo::SIM_LATENCY)
                .env("VRAMSIM_DEBUG", "1");
        }
        Gpu::Real { .. } => {
            if let Some(r) = demo::real_cudart() {
                let mut v = r.dir.into_os_string();
                if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                    v.push(":");
                    v.push(old);
                }
                cmd.env("LD_LIBRARY_PATH", v);
            }
        }
    }
    let mut r = LiveRun {
        policy: kind.to_string(),
        completed: false,
        allocs_done: 0,
        failed: 0,
        first_failure: None,
        peak_live: 0,
        peak_reserved: None,
        driver_calls: None,
        syncs: None,
        wall_ns: 0,
        model: None,
        problem: None,
    };
    let start = Instant::now();
    let out = match cmd.stdin(Stdio::null()).output() {
        Ok(o) => o,
        Err(e) => {
            r.problem = Some(format!("cannot start {}: {e}", bin.display()));
            return r;
        }
    };
    r.wall_ns = start.elapsed().as_nanos() as u64;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some(line) = demo::parse_replay_line(&stdout) else {
        r.problem = Some(format!(
            "the workload ended without its summary line (status {:?}): {}",
            out.status.code(),
            stderr
                .lines()
                .rfind(|l| !l.starts_with("vramsim: "))
                .unwrap_or("")
        ));
        return r;
    };
    r.allocs_done = line.allocs;
    r.failed = line.failed;
    r.peak_live = line.peak_live;
    r.wall_ns = line.ns;
    r.completed = line.failed == 0 && out.status.success();
    if line.failed > 0 {
        // `replay: event I: alloc SIZE failed: CODE (NAME)`
        let what = stderr
            .lines()
            .find(|l| l.starts_with("replay: event") && l.contains("failed: "))
            .and_then(|l| l.split_once(": alloc "))
            .map(|(_, w)| format!("alloc {w}"))
            .unwrap_or_else(|| "an allocation failed".into());
        r.first_failure = Some((line.allocs, what));
    } else if !out.status.success() {
        r.problem = Some(format!(
            "the workload failed (exit {:?})",
            out.status.code()
        ));
    }
    // Reserved as every command reports it: computed from the trace's events.
    r.peak_reserved = demo::trace_peak_reserved(&trace).ok().flatten();
    if let Gpu::Sim { dir } = gpu {
        // Reading the simulated device's accounting also removes the device.
        let _ = demo::sim_high_water(dir, &sim_name);
        let (calls, syncs) = demo::sim_driver_counts(&stderr);
        r.driver_calls = Some(calls);
        r.syncs = Some(syncs);
    }
    r
}

fn text(r: &LiveReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "live replay of {} (device {}): {} requests through {} on the {}",
        vramshim_analyzer::render::one_line(&r.file),
        r.device,
        r.requests,
        if r.stream_ordered {
            "cudaMallocAsync/cudaFreeAsync (one stream)"
        } else {
            "cudaMalloc/cudaFree"
        },
        r.gpu
    );
    let _ = writeln!(
        o,
        "{}{}",
        r.device_memory
            .map(|m| format!("simulated device {}", bytes(m)))
            .unwrap_or_else(|| "the real device".into()),
        r.cap
            .map(|c| format!(", cap {}", bytes(c)))
            .unwrap_or_default()
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<8} {:<6} {:>26} {:>13} {:>12} {:>7} {:>9}",
        "policy", "", "result", "peak reserved", "driver calls", "syncs", "time"
    );
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for run in &r.runs {
        let result = if let Some(p) = &run.problem {
            format!("ERROR: {p}")
        } else if run.completed {
            "completes".into()
        } else {
            match &run.first_failure {
                Some((i, _)) => format!("fails at request {i}"),
                None => "fails".into(),
            }
        };
        let _ = writeln!(
            o,
            "{:<8} {:<6} {:>26} {:>13} {:>12} {:>7} {:>8.2}s",
            run.policy,
            "live",
            result,
            run.peak_reserved.map_or("-".into(), bytes),
            opt(run.driver_calls),
            opt(run.syncs),
            run.wall_ns as f64 / 1e9
        );
        if let Some(m) = &run.model {
            let result = if m.completed {
                "completes".to_string()
            } else {
                format!("fails at request {}", m.allocs_done)
            };
            let _ = writeln!(
                o,
                "{:<8} {:<6} {:>26} {:>13} {:>12} {:>7} {:>9}",
                "",
                "model",
                result,
                bytes(m.peak_reserved),
                m.driver_calls,
                m.syncs,
                "-"
            );
        }
    }
    for run in &r.runs {
        if let Some((i, what)) = &run.first_failure {
            let _ = writeln!(o, "{} live: request {i} failed: {what}", run.policy);
        }
        if let Some(f) = run.model.as_ref().and_then(|m| m.first_failure.as_ref()) {
            let _ = writeln!(
                o,
                "{} model: request failed at trace event {}: {} ({})",
                run.policy,
                f.event_index,
                bytes(f.size),
                f.why
            );
        }
    }
    if r.device_memory.is_some() {
        let _ = writeln!(
            o,
            "\nsimulated: driver calls and syncs are counted by the simulated driver; times use modelled driver latencies"
        );
    }
    o
}
