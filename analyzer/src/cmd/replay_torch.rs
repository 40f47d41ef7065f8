//! `vramshim replay --live --through pytorch TRACE [--sim]`: the trace replayed through
//! PyTorch's own CUDA allocator (`torch.empty(size, dtype=torch.uint8, device="cuda")` and
//! `del` in trace order) under the caller's `PYTORCH_CUDA_ALLOC_CONF`, on the real GPU or the
//! simulated one, inside `vramshim run` (so `--cap` and `--pool stitch` apply, and vramshim
//! traces the same run). Prints PyTorch's statistics as one JSON line
//! (tests/workloads/pytorch/replay_torch.py, keys in docs/pytorch.md), then the trace summary.
//! Owned by the "pytorch" engineer; wired into replay.rs by the analyzer's owner.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The replay driver, embedded so an installed `vramshim` needs no clone.
const SCRIPT: &str = include_str!("../../../tests/workloads/pytorch/replay_torch.py");

/// `replay` flags of the PyTorch replay (flattened into replay's Args).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct TorchArgs {
    /// With --live: replay through a framework's allocator instead of raw CUDA calls
    /// (`pytorch`: torch.empty/del under your PYTORCH_CUDA_ALLOC_CONF).
    #[arg(long, value_name = "FRAMEWORK", value_parser = ["pytorch"])]
    pub through: Option<String>,
    /// Python with PyTorch for --through pytorch (default: $VRAMSHIM_TORCH_PYTHON, else the
    /// environment of scripts/setup-torch if installed, else python3).
    #[arg(long, value_name = "PYTHON")]
    pub python: Option<PathBuf>,
    /// With --through pytorch: write a pattern into each block and check it before its free
    /// (`sample`: 4 KiB at each end, `full`: every byte; copies only, no kernels).
    #[arg(long, value_name = "MODE", default_value = "none", value_parser = ["none", "sample", "full"])]
    pub pattern: String,
    /// With --through pytorch: where vramshim writes the run's trace (default: a file in the
    /// temporary directory, named on stderr).
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
}

/// Handles `replay` when `--through` is given: `None` lets replay.rs go on as before.
#[allow(clippy::too_many_arguments)]
pub fn dispatch(
    trace: &Path,
    live: bool,
    sim: bool,
    cap: Option<u64>,
    pool: &str,
    device_memory: Option<u64>,
    t: &TorchArgs,
) -> Option<Result<ExitCode, String>> {
    let through = t.through.as_deref()?;
    if !live {
        return Some(Err(format!(
            "--through {through} needs --live (it replays through real CUDA calls)"
        )));
    }
    Some(run_pytorch(trace, sim, cap, pool, device_memory, t))
}

/// The Python that has PyTorch.
pub fn torch_python(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = std::env::var_os("VRAMSHIM_TORCH_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = std::env::var_os("VRAMSHIM_TORCH_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("vramshim/torch-venv"))
        });
    if let Some(py) = venv.map(|v| v.join("bin/python"))
        && py.exists()
    {
        return py;
    }
    PathBuf::from("python3")
}

/// With `--pool stitch` and PyTorch uncached (`vramshim run` routes PyTorch through
/// `backend:cudaMallocAsync` unless the route is `uncached` or the user set
/// `PYTORCH_NO_CUDA_MEMORY_CACHING` without a backend), every tensor is freed with `cudaFree`,
/// which the pool may reuse only after a device synchronization: say so (docs/pytorch.md,
/// "vramshim's pool under PyTorch").
pub fn stitch_note(
    pool: &str,
    route: crate::cmd::pytorch_route::Route,
    conf: &str,
    no_caching: Option<&str>,
) -> Option<&'static str> {
    use crate::cmd::pytorch_route::{Route, backend_of};
    let uncached = match route {
        Route::Uncached => backend_of(conf).is_none_or(|b| b == "native"),
        Route::Async => {
            backend_of(conf).is_none() && no_caching.is_some_and(|v| !matches!(v.trim(), "" | "0"))
        }
        Route::Native => false,
    };
    (pool == "stitch" && uncached).then_some(
        "PyTorch frees each tensor with cudaFree here, which the pool reuses only after a \
         synchronization; the default route (--pytorch-route async, PyTorch through \
         backend:cudaMallocAsync) makes the frees stream-ordered (reusable at once, no \
         synchronization): see docs/pytorch.md",
    )
}

/// The `vramshim run` arguments for the PyTorch replay (everything after `vramshim`).
#[allow(clippy::too_many_arguments)]
pub fn run_args(
    python: &Path,
    script: &Path,
    trace: &Path,
    sim: bool,
    cap: Option<u64>,
    pool: &str,
    device_memory: Option<u64>,
    t: &TorchArgs,
    trace_out: &Path,
) -> Result<Vec<OsString>, String> {
    let mut a: Vec<OsString> = vec!["run".into()];
    if sim {
        a.push(match device_memory {
            Some(m) => format!("--sim={m}").into(),
            None => "--sim".into(),
        });
    } else if device_memory.is_some() {
        return Err("--device-memory with --live needs --sim (a real GPU has its own size)".into());
    }
    if let Some(c) = cap {
        a.push("--cap".into());
        a.push(c.to_string().into());
    }
    match pool {
        "all" | "off" | "none" => {}
        "stitch" => {
            a.push("--pool".into());
            a.push("stitch".into());
        }
        other => {
            return Err(format!(
                "--pool {other} is not available with --live --through pytorch (stitch, or leave it out for PyTorch's own allocator)"
            ));
        }
    }
    a.push("--trace".into());
    a.push(trace_out.into());
    a.push("--".into());
    a.push(python.into());
    a.push(script.into());
    a.push(trace.into());
    a.push("--pattern".into());
    a.push(t.pattern.clone().into());
    Ok(a)
}

fn run_pytorch(
    trace: &Path,
    sim: bool,
    cap: Option<u64>,
    pool: &str,
    device_memory: Option<u64>,
    t: &TorchArgs,
) -> Result<ExitCode, String> {
    // A trace's name may be another user's choice: shown escaped.
    let show =
        |p: &Path| vramshim_analyzer::render::one_line(&p.display().to_string()).into_owned();
    let given = std::fs::canonicalize(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    // Private to this run: Python runs the script from it.
    let dir = vramshim_analyzer::files::private_temp_dir("vramshim-replay-torch")?;
    // Kept only while it holds something for the user (the run's trace): a run that wrote
    // nothing there (Python failed to start, a conversion refused) leaves no directory behind.
    let _empty_removed = RemovedIfEmpty(&dir);
    // The driver reads RMM CSV: any other format `replay` takes is converted first (the
    // device with the most allocations, as `replay` picks; the CSV has no device column).
    let trace = match vramshim_analyzer::input::detect(&given)? {
        vramshim_analyzer::input::Format::RmmCsv => given.clone(),
        _ => {
            let csv = dir.join("trace.rmm.csv");
            let f = std::fs::File::create(&csv)
                .map_err(|e| vramshim_analyzer::error::write_error(&csv, &e))?;
            let device = busiest_device(&given)?;
            let stats = vramshim_analyzer::convert::export(
                &given,
                vramshim_analyzer::convert::ExportFormat::RmmCsv,
                std::io::BufWriter::new(f),
                device,
            )?;
            eprintln!(
                "vramshim: {} converted to RMM CSV for the replay driver ({} rows{})",
                show(&given),
                stats.records,
                device.map(|d| format!(", device {d}")).unwrap_or_default()
            );
            csv
        }
    };
    let script = dir.join("replay_torch.py");
    vramshim_analyzer::files::write_output(&script, SCRIPT.as_bytes())?;
    let trace_out = t
        .trace_out
        .clone()
        .unwrap_or_else(|| dir.join("replay-%p.vramtrace"));
    let python = torch_python(t.python.as_deref());
    let args = run_args(
        &python,
        &script,
        &trace,
        sim,
        cap,
        pool,
        device_memory,
        t,
        &trace_out,
    )?;
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let conf = std::env::var("PYTORCH_CUDA_ALLOC_CONF")
        .or_else(|_| std::env::var("PYTORCH_ALLOC_CONF"))
        .unwrap_or_default();
    eprintln!(
        "vramshim: replay {} through PyTorch ({}), PYTORCH_CUDA_ALLOC_CONF={}",
        show(&given),
        show(&python),
        vramshim_analyzer::render::one_line(&conf)
    );
    let route = match std::env::var(crate::cmd::pytorch_route::ROUTE_VAR) {
        Ok(v) if !v.trim().is_empty() => {
            crate::cmd::pytorch_route::Route::parse(&v, crate::cmd::pytorch_route::ROUTE_VAR)?
        }
        _ => crate::cmd::pytorch_route::Route::Async,
    };
    let no_caching = std::env::var(crate::cmd::pytorch_route::NO_CACHING).ok();
    if let Some(note) = stitch_note(pool, route, &conf, no_caching.as_deref()) {
        eprintln!("vramshim: note: {note}");
    }
    let status = Command::new(me)
        .args(&args)
        .status()
        .map_err(|e| format!("vramshim run: {e}"))?;
    if t.trace_out.is_none() {
        let _ = std::fs::remove_file(&script);
    }
    if trace != given {
        let _ = std::fs::remove_file(&trace);
    }
    Ok(ExitCode::from(crate::cmd::run::shell_status(status)))
}

/// Removes its directory when dropped if nothing is left in it (`remove_dir` refuses a
/// directory with entries, so a written trace keeps it).
struct RemovedIfEmpty<'a>(&'a Path);

impl Drop for RemovedIfEmpty<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.0);
    }
}

/// The device with the most successful device allocations (None when there are none).
fn busiest_device(trace: &Path) -> Result<Option<i32>, String> {
    use vramshim_trace::{Event, codes};
    let mut opened = vramshim_analyzer::input::open(trace)?;
    let mut counts: std::collections::BTreeMap<i32, u64> = Default::default();
    while let Some(ev) = opened.events.next_event() {
        if let Event::Alloc(m) = ev?
            && m.kind.is_device()
            && m.result == codes::CUDA_SUCCESS
        {
            *counts.entry(m.device).or_default() += 1;
        }
    }
    Ok(counts
        .into_iter()
        .max_by_key(|&(d, n)| (n, -(d as i64)))
        .map(|(d, _)| d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn arguments_of_vramshim_run() {
        let t = TorchArgs {
            through: Some("pytorch".into()),
            pattern: "sample".into(),
            ..Default::default()
        };
        let a = run_args(
            Path::new("/v/bin/python"),
            Path::new("/tmp/r.py"),
            Path::new("/x/t.csv"),
            true,
            Some(1 << 30),
            "stitch",
            Some(8 << 30),
            &t,
            Path::new("/tmp/o-%p.vramtrace"),
        )
        .unwrap();
        assert_eq!(
            strs(&a),
            [
                "run",
                "--sim=8589934592",
                "--cap",
                "1073741824",
                "--pool",
                "stitch",
                "--trace",
                "/tmp/o-%p.vramtrace",
                "--",
                "/v/bin/python",
                "/tmp/r.py",
                "/x/t.csv",
                "--pattern",
                "sample"
            ]
        );
        let plain = run_args(
            Path::new("python3"),
            Path::new("r.py"),
            Path::new("t.csv"),
            false,
            None,
            "all",
            None,
            &t,
            Path::new("o"),
        )
        .unwrap();
        assert_eq!(strs(&plain)[..3], ["run", "--trace", "o"]);
        assert!(
            run_args(
                Path::new("p"),
                Path::new("r"),
                Path::new("t"),
                true,
                None,
                "caching",
                None,
                &t,
                Path::new("o")
            )
            .is_err()
        );
    }

    #[test]
    fn not_ours_without_through() {
        let t = TorchArgs::default();
        assert!(dispatch(Path::new("t"), true, true, None, "all", None, &t).is_none());
        let t = TorchArgs {
            through: Some("pytorch".into()),
            ..Default::default()
        };
        assert!(matches!(
            dispatch(Path::new("t"), false, false, None, "all", None, &t),
            Some(Err(_))
        ));
    }

    #[test]
    fn stitch_with_pytorch_uncached_gets_a_note() {
        use crate::cmd::pytorch_route::Route;
        // the default route: PyTorch through cudaMallocAsync, nothing to say
        assert!(stitch_note("stitch", Route::Async, "", None).is_none());
        assert!(stitch_note("stitch", Route::Async, "expandable_segments:True", None).is_none());
        // uncached by the route or by the user's own switch
        assert!(stitch_note("stitch", Route::Uncached, "", None).is_some());
        assert!(stitch_note("stitch", Route::Async, "", Some("1")).is_some());
        assert!(stitch_note("stitch", Route::Async, "", Some("0")).is_none());
        assert!(
            stitch_note(
                "stitch",
                Route::Uncached,
                "backend: cudaMallocAsync,release_lock_on_cudamalloc:True",
                None
            )
            .is_none()
        );
        assert!(stitch_note("all", Route::Uncached, "", None).is_none());
    }

    #[test]
    fn the_embedded_script_is_the_replay_driver() {
        assert!(SCRIPT.contains("torch.empty(size, dtype=torch.uint8, device=\"cuda\")"));
    }
}
