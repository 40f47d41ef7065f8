//! Support for the PyTorch tests (tests/workloads/pytorch/tests): where PyTorch is, how to
//! run Python with it on the simulated GPU, the runtime imports list, and the JSON line of
//! `replay_torch.py`.
//!
//! PyTorch 2.15 (CUDA 13 build, ~5 GB with its NVIDIA libraries) is installed by
//! `scripts/setup-torch` into a virtual environment outside the clone
//! (`~/.cache/vramshim/torch-venv`, `$VRAMSHIM_TORCH_VENV` overrides). Tests that need it
//! call [`torch_python`]: with the environment present they run; without it they print one
//! line naming the reason and return (skipped), unless `VRAMSHIM_TORCH_TESTS=1`, which makes
//! them install it first (and fail if that fails).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vramshim_testkit::{repo_root, sim_command, sim_dir};

/// The PyTorch version the tests and `scripts/setup-torch` use.
pub const TORCH_VERSION: &str = "2.15.0";

/// `tests/workloads/pytorch` in the clone.
pub fn pytorch_dir() -> PathBuf {
    repo_root().join("tests/workloads/pytorch")
}

/// The replay driver script.
pub fn replay_script() -> PathBuf {
    pytorch_dir().join("replay_torch.py")
}

/// The runtime functions PyTorch 2.15's CUDA libraries import (runtime-imports.txt).
pub fn runtime_imports() -> Vec<String> {
    let p = pytorch_dir().join("runtime-imports.txt");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// `nm -D` of `lib`: (name, version) pairs, `defined` or undefined symbols.
pub fn dynamic_symbols(lib: &Path, defined: bool) -> Vec<(String, Option<String>)> {
    let o = Command::new("nm")
        .arg("-D")
        .arg(if defined {
            "--defined-only"
        } else {
            "--undefined-only"
        })
        .arg(lib)
        .output()
        .expect("run nm (binutils)");
    assert!(
        o.status.success(),
        "nm -D {}: {}",
        lib.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|sym| match sym.split_once('@') {
            Some((n, v)) => (n.to_string(), Some(v.trim_start_matches('@').to_string())),
            None => (sym.to_string(), None),
        })
        .collect()
}

/// Functions of `libcudart.so.N` defined by the simulated runtime with that version node.
pub fn sim_runtime_defines(n: u32) -> BTreeSet<String> {
    let lib = sim_dir().join(format!("libcudart.so.{n}"));
    let node = format!("libcudart.so.{n}");
    dynamic_symbols(&lib, true)
        .into_iter()
        .filter(|(_, v)| v.as_deref() == Some(node.as_str()))
        .map(|(n, _)| n)
        .collect()
}

/// The virtual environment `scripts/setup-torch` installs into.
pub fn torch_venv() -> PathBuf {
    if let Some(v) = std::env::var_os("VRAMSHIM_TORCH_VENV") {
        return PathBuf::from(v);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache")
        });
    cache.join("vramshim/torch-venv")
}

fn installed_python(venv: &Path) -> Option<PathBuf> {
    let py = venv.join("bin/python");
    let marker = venv.join(".vramshim-torch");
    let ok = std::fs::read_to_string(marker).is_ok_and(|v| v.trim() == TORCH_VERSION);
    (ok && py.exists()).then_some(py)
}

/// Python of the PyTorch environment, or `Err(reason)` to skip. Installs it first (once per
/// test process) when `VRAMSHIM_TORCH_TESTS=1`.
pub fn torch_python() -> Result<PathBuf, String> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(|| {
        let venv = torch_venv();
        if let Some(py) = installed_python(&venv) {
            return Ok(py);
        }
        if std::env::var("VRAMSHIM_TORCH_TESTS").as_deref() != Ok("1") {
            return Err(format!(
                "PyTorch {TORCH_VERSION} is not installed in {} (run scripts/setup-torch: a few minutes, ~4 GB; \
                 or set VRAMSHIM_TORCH_TESTS=1 to install it from the tests)",
                venv.display()
            ));
        }
        let o = Command::new(repo_root().join("scripts/setup-torch"))
            .env("VRAMSHIM_TORCH_VENV", &venv)
            .output()
            .map_err(|e| format!("scripts/setup-torch: {e}"))?;
        if !o.status.success() {
            panic!(
                "VRAMSHIM_TORCH_TESTS=1 but scripts/setup-torch failed:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        installed_python(&venv).ok_or_else(|| {
            panic!(
                "scripts/setup-torch succeeded but {} has no PyTorch",
                venv.display()
            )
        })
    })
    .clone()
}

/// `Some(python)`, or prints why the test is skipped and gives `None`.
pub fn torch_or_skip(test: &str) -> Option<PathBuf> {
    match torch_python() {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// `torch/lib` of the environment.
pub fn torch_lib_dir(python: &Path) -> PathBuf {
    let o = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .expect("run python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("torch/lib")
}

/// `python ARGS` on the simulated GPU with its `libcudart.so.13` preloaded (PyTorch's DT_RPATH
/// points at the wheel's own runtime; a preloaded one satisfies the soname), its own
/// simulated device (`VRAMSIM_NAME` unique per `name`), no context overhead, and no
/// `PYTORCH_*` allocator settings inherited.
pub fn torch_sim_command(python: &Path, name: &str) -> Command {
    let mut c = sim_command(python, name);
    for k in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
    ] {
        c.env_remove(k);
    }
    c.env("LD_PRELOAD", sim_dir().join("libcudart.so.13"))
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONWARNINGS", "ignore");
    c
}

/// `vramshim run --sim [FLAGS] -- python ARGS` on the simulated GPU (the CLI preloads the
/// interposer; PyTorch runs its own bundled runtime on cuda-sim's driver).
pub fn vramshim_run_command(python: &Path, name: &str, flags: &[&str]) -> Command {
    let exe = vramshim_testkit::vramshim_exe();
    let mut c = torch_sim_command(&exe, name);
    c.env_remove("LD_PRELOAD");
    c.arg("run").arg("--sim").args(flags).arg("--").arg(python);
    c
}

/// The JSON line `replay_torch.py` ends its stdout with.
pub fn replay_json(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in replay_torch output:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line}: {e}"))
}

/// The value a script printed on its first stdout line that starts with `key` (with its
/// separating space, e.g. `"reused "`); none, or one that does not parse, panics with the
/// whole output.
#[track_caller]
pub fn printed<T: std::str::FromStr>(stdout: &str, key: &str) -> T {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"))
}

/// The shipped traces (tests/workloads/traces/*.rmm.csv).
pub const TRACES: [&str; 3] = [
    "bert_serve.rmm.csv",
    "vit_train.rmm.csv",
    "t5_train.rmm.csv",
];
