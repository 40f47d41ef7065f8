//! Real models (GPT-2, ViT and BERT from Hugging Face transformers, random weights, nothing
//! downloaded; and an MLP) trained by `py/train_model.py` with PyTorch's bundled runtime on the
//! simulated GPU: where transformers is, how to run the script plain or under `vramshim run`,
//! and how to read what it prints.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vramshim_testkit::{RunOutput, repo_root, run, sim_command};

use crate::driver_only_dir;

/// The directory `scripts/setup-transformers` installed transformers into (for PYTHONPATH), or
/// `None` after printing why the test is skipped. With `VRAMSHIM_TORCH_TESTS=1` (CI) a missing
/// installation is installed first and a failed install panics: the tests then fail instead of
/// skipping.
pub fn transformers_or_skip(test: &str) -> Option<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let script = repo_root().join("scripts/setup-transformers");
        let required = std::env::var("VRAMSHIM_TORCH_TESTS").as_deref() == Ok("1");
        let mut c = Command::new(&script);
        if !required {
            c.arg("--check");
        }
        let o = c
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.success() {
            Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        } else if required {
            panic!("VRAMSHIM_TORCH_TESTS=1 but scripts/setup-transformers failed:\n{err}");
        } else {
            Err(format!(
                "{} (run scripts/setup-transformers, or set VRAMSHIM_TORCH_TESTS=1 to install it from the tests)",
                err.trim()
            ))
        }
    });
    match dir {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            eprintln!("{test}: skipped: transformers is not installed: {why}");
            None
        }
    }
}

/// `tests/workloads/nvidia/py/train_model.py`.
pub fn train_model_script() -> PathBuf {
    repo_root().join("tests/workloads/nvidia/py/train_model.py")
}

/// `python train_model.py ARGS`, under `vramshim run FLAGS` when flags are given. No `--sim`:
/// the program's own runtime runs on cuda-sim's driver, which the driver-only directory on the
/// library path stands for (as an installed NVIDIA driver would be found). `name` gives the
/// run a simulated device of its own; `env` adds variables (e.g. `VRAMSIM_KERNEL_NS`).
pub fn train_model(
    python: &Path,
    transformers: &Path,
    name: &str,
    flags: Option<&[&str]>,
    env: &[(&str, &str)],
    args: &[&str],
) -> RunOutput {
    let mut c = match flags {
        None => sim_command(python, name),
        Some(f) => {
            let mut c = sim_command(vramshim_testkit::vramshim_exe(), name);
            c.arg("run").args(f).arg("--").arg(python);
            c
        }
    };
    for k in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
    ] {
        c.env_remove(k);
    }
    c.env("LD_LIBRARY_PATH", driver_only_dir())
        .env("PYTHONPATH", transformers)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONWARNINGS", "ignore")
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .envs(env.iter().copied())
        .arg(train_model_script())
        .args(args);
    run(&mut c)
}

/// `(address, size)` of every `PREFIX ADDRESS SIZE` line, in order.
pub fn pairs(stdout: &str, prefix: &str) -> Vec<(u64, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix(prefix)?.strip_prefix(' ')?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// One `step K allocs A frees F device_allocs D syncs S cpu_ns C wall_ns W [driver_calls N
/// driver_syncs N driver_allocs N driver_frees N launches N]` line (the driver's counts only on
/// cuda-sim).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub allocs: u64,
    pub frees: u64,
    pub device_allocs: u64,
    pub syncs: u64,
    pub cpu_ns: u64,
    pub wall_ns: u64,
    pub driver: Option<DriverCounts>,
}

/// cuda-sim's counts of one step's driver calls (`vramsimDriverCalls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounts {
    pub calls: u64,
    pub syncs: u64,
    pub allocs: u64,
    pub frees: u64,
    pub launches: u64,
}

/// The `step ...` lines of a `--step-stats` run, in order.
pub fn steps(stdout: &str) -> Vec<Step> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("step ")?;
            let w: Vec<&str> = rest.split(' ').collect();
            let get = |k: &str| -> Option<u64> {
                let i = w.iter().position(|x| *x == k)?;
                w.get(i + 1)?.parse().ok()
            };
            Some(Step {
                allocs: get("allocs")?,
                frees: get("frees")?,
                device_allocs: get("device_allocs")?,
                syncs: get("syncs")?,
                cpu_ns: get("cpu_ns")?,
                wall_ns: get("wall_ns")?,
                driver: get("driver_calls").map(|calls| DriverCounts {
                    calls,
                    syncs: get("driver_syncs").unwrap_or(u64::MAX),
                    allocs: get("driver_allocs").unwrap_or(u64::MAX),
                    frees: get("driver_frees").unwrap_or(u64::MAX),
                    launches: get("launches").unwrap_or(u64::MAX),
                }),
            })
        })
        .collect()
}
