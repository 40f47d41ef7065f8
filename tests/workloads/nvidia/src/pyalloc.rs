//! The Python allocation workloads whose packages link NVIDIA's runtime statically (CuPy, RMM,
//! cuda.bindings: `py/*_alloc.py`): how to run one plain or under `vramshim run --sim`, and
//! what every such run must show.

use std::path::Path;
use std::process::Command;

use vramshim_testkit::{RunOutput, profile_dir, repo_root, sim_command};

use crate::{driver_only_dir, mapped};

/// The simulated device every workload runs on: 2 GiB.
pub const DEVICE: u64 = 2 << 30;

/// `python tests/workloads/nvidia/py/SCRIPT` with `packages` on PYTHONPATH, on a simulated
/// device of [`DEVICE`] bytes named `name`, under `vramshim run --sim FLAGS` when flags are
/// given, else on the driver-only directory (what a machine with NVIDIA's driver offers). The
/// caller adds the script's arguments and runs it.
pub fn command(
    python: &Path,
    packages: &Path,
    name: &str,
    flags: Option<&[&str]>,
    script: &str,
) -> Command {
    let mut c = match flags {
        None => {
            let mut c = sim_command(python, name);
            c.env("LD_LIBRARY_PATH", driver_only_dir());
            c
        }
        Some(f) => {
            let mut c = sim_command(vramshim_testkit::vramshim_exe(), name);
            c.env_remove("LD_LIBRARY_PATH")
                .arg("run")
                .arg("--sim")
                .args(f)
                .arg("--")
                .arg(python);
            c
        }
    };
    c.env("PYTHONPATH", packages)
        .env("VRAMSIM_MEMORY", DEVICE.to_string())
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(repo_root().join("tests/workloads/nvidia/py").join(script));
    c
}

/// Ran to the end (`done`) with its data intact (`intact 1`) and every line of `also` printed,
/// on cuda-sim's driver alone, with no runtime library mapped (the package links NVIDIA's
/// runtime in) and no cuda-sim runtime.
pub fn assert_ran(out: &RunOutput, what: &str, also: &[&str]) {
    assert!(
        out.success()
            && out.stdout.contains("intact 1")
            && also.iter().all(|l| out.stdout.contains(l))
            && out.stdout.contains("\ndone"),
        "{what}: {}\n{}",
        out.stdout,
        out.stderr
    );
    let maps = mapped(&out.stdout);
    assert!(
        !maps
            .iter()
            .any(|p| p.contains("libcudart") || p.contains("vramsim_runtime")),
        "{what}: no runtime library mapped: {maps:?}"
    );
    assert_sim_driver(&maps, what);
}

/// The only driver mapped (`mapped` lines) is cuda-sim's, from this build.
pub fn assert_sim_driver(maps: &[&str], what: &str) {
    let profile = profile_dir().canonicalize().unwrap();
    let drivers: Vec<&&str> = maps.iter().filter(|p| p.contains("libcuda.")).collect();
    assert!(
        drivers.len() == 1 && Path::new(drivers[0]).starts_with(&profile),
        "{what}: cuda-sim's driver: {maps:?}"
    );
}

/// The numbers of every `KEY N` line, in order.
pub fn values(stdout: &str, key: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .collect()
}
