//! Test support shared by every crate's integration tests.
//!
//! ```no_run
//! use vramshim_testkit::{Link, compile_c, sim_command, run};
//! let exe = compile_c("hello", &["tests/workloads/sim/rt_basic.c"], Link::SharedRuntime);
//! let out = run(&mut sim_command(&exe, "hello"));
//! out.assert_success();
//! ```
//!
//! * Where things are: [`profile_dir`], [`repo_root`], [`interposer_lib`] and
//!   [`vramshim_exe`] (checked built from the sources now in the tree: `fresh`), [`sim_dir`]
//!   (the simulated GPU's libraries under their real names, laid out on first use, checked
//!   the same way),
//!   [`workloads_include`].
//! * Building C programs: [`compile_c`] / [`compile_c_to`] (gcc, `-I tests/workloads/include`,
//!   no rpath) with a [`Link`] mode, [`replay_exe`] (the RMM-CSV replay workload).
//! * Running on the simulated GPU: [`sim_env`] / [`sim_command`] (LD_LIBRARY_PATH + a unique
//!   `VRAMSIM_NAME`), [`preload`] (adds a library to `LD_PRELOAD`), [`run`] /
//!   [`run_with_preload`] returning a [`RunOutput`]; [`PASS_VAR`] (`VRAMSHIM_TEST_PASS`) hands
//!   fault switches to every program [`sim_command`] starts.
//! * Scratch space: [`TempDir`] (a private directory in `$TMPDIR`, removed when dropped, also
//!   when the test panics), [`temp_dir`] (under the target directory, removed when the test
//!   process exits), [`unique_name`]; shipped traces: [`trace_file`].
//! * Random workloads, the same on every run: [`XorShift`], [`one_stream_round`], the
//!   busy-mappings serving loop on the pool's model ([`busy_maps`]); property
//!   tests' configuration ([`props::config`]: a known seed, said on every run; new failures
//!   kept under the target directory).
//! * Traces stated event by event: [`records`] (an allocation record, a trace file).
//! * NVIDIA's real `libcudart.so.12` (downloaded wheel): [`real_cudart12_dir`]; the pinned
//!   NVIDIA wheels of scripts/setup-nvidia-wheels: [`nvidia_wheels`].
//!
//! The simulated GPU libraries come from cargo's outputs in [`profile_dir`]
//! (`libvramsim_driver.so`, `libvramsim_runtime12.so`, ...); `scripts/test` builds the whole
//! workspace first. When running one crate's tests alone, build them first:
//! `cargo build --release -p vramsim-driver -p vramsim-nvml -p vramsim-runtime12
//! -p vramsim-runtime13 -p vramsim-runtime-static`.

pub mod busy_maps;
mod fresh;
pub mod layers;
mod layout;
mod proc;
pub mod props;
mod random;
pub mod records;
mod tmp;
pub mod users;
mod wheel;

pub use layout::{SIM_FILES, lay_out, sim_dir};
pub use proc::{
    PASS_VAR, RunOutput, parse_pass, pass_through, preload, run, run_with_preload, sim_command,
    sim_env,
};
pub use random::{RoundStep, XorShift, one_stream_round};
pub use tmp::{TempDir, live_temp_dirs};
pub use wheel::{CUDART12_WHEEL, nvidia_wheels, real_cudart12_dir};

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `target/<profile>` of the running test binary, whatever `CARGO_TARGET_DIR` is.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    // target/<profile>/deps/<test-binary>, or target/<profile>/<binary> for a bin.
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The built `libvramshim.so`, which must exist and be built from the sources now in the
/// tree (checked once per process, see the `fresh` module): a test that preloads a missing library runs
/// no interposer at all and may pass for that reason, and one that preloads a stale one tests
/// the previous build's code (`cargo test` does not rebuild it). Otherwise the calling test
/// fails with one message naming the `cargo build` command to run first.
#[track_caller]
pub fn interposer_lib() -> PathBuf {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    fresh::fresh(&LIB, "libvramshim.so", "libvramshim")
}

/// The built `vramshim` command, checked as [`interposer_lib`] is (the analyzer's own tests
/// use cargo's `CARGO_BIN_EXE_vramshim`, which their `cargo test` builds; every other
/// package's tests run it through this).
#[track_caller]
pub fn vramshim_exe() -> PathBuf {
    static EXE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    fresh::fresh(&EXE, "vramshim", "vramshim")
}

/// `tests/workloads/include` (holds `cuda_api.h`).
pub fn workloads_include() -> PathBuf {
    repo_root().join("tests/workloads/include")
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this process and call: `<prefix>-<pid>-<n>` (prefix cut to 32 chars).
/// Use it for `VRAMSIM_NAME`, `VRAMSHIM_SHARED`, file names.
pub fn unique_name(prefix: &str) -> String {
    let p: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    format!(
        "{p}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh empty directory `<profile>/testkit-tmp/<unique_name(name)>` for one test, removed
/// when the test process exits (a test that must leave nothing behind sooner holds a
/// [`TempDir`]). The first call in a process removes the directories of processes that are
/// gone (killed before their exit).
pub fn temp_dir(name: &str) -> PathBuf {
    let root = profile_dir().join("testkit-tmp");
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(|| sweep_dead(&root));
    let d = root.join(unique_name(name));
    std::fs::create_dir_all(&d).expect("create temp dir");
    tmp::track(d.clone());
    d
}

/// Removes `<prefix>-<pid>-<n>` entries of `root` whose process no longer exists.
fn sweep_dead(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (_n, pid) = (parts.next(), parts.next());
        if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok())
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = tmp::remove_tree(&e.path());
        }
    }
}

/// How [`compile_c`] links a C program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Against the simulated `libcudart.so.12` (`-l:libcudart.so.12`, no rpath): runs with
    /// `LD_LIBRARY_PATH=<sim_dir>`, as a program built with nvcc `-cudart shared` would.
    SharedRuntime,
    /// Against the simulated `libcudart.so.13`; also defines `CUDART13` (cuda_api.h then
    /// declares the CUDA 13 forms where the ABI changed).
    SharedRuntime13,
    /// Against `libcudart_static.a` (nvcc's default): the runtime is inside the executable
    /// and reaches `libcuda.so.1` through `dlopen`.
    StaticRuntime,
    /// Only `-ldl -lpthread`: the program `dlopen`s the runtime or the driver itself.
    Dl,
    /// Against `libcuda.so.1` (`-l:libcuda.so.1`): a driver-API program.
    Driver,
}

impl Link {
    fn args(self, sim: &Path) -> Vec<String> {
        let l = |s: &str| s.to_string();
        let mut v = match self {
            Link::SharedRuntime => vec![format!("-L{}", sim.display()), l("-l:libcudart.so.12")],
            Link::SharedRuntime13 => {
                vec![
                    l("-DCUDART13"),
                    format!("-L{}", sim.display()),
                    l("-l:libcudart.so.13"),
                ]
            }
            Link::StaticRuntime => vec![
                sim.join("libcudart_static.a").display().to_string(),
                l("-lrt"),
                l("-lm"),
                l("-lgcc_s"),
            ],
            Link::Dl => vec![],
            Link::Driver => vec![format!("-L{}", sim.display()), l("-l:libcuda.so.1")],
        };
        v.extend([l("-ldl"), l("-lpthread")]);
        v
    }
}

/// Compiles C `sources` (paths relative to the repository root, or absolute) with gcc
/// (`-O1 -g -Wall -Werror -I tests/workloads/include`) into an executable `name` in a fresh
/// [`temp_dir`], linked as `link` says, and returns its path. Panics with gcc's output on
/// failure.
pub fn compile_c(name: &str, sources: &[&str], link: Link) -> PathBuf {
    let out = temp_dir(name).join(name);
    compile_c_to(&out, sources, link, &[]);
    out
}

/// [`compile_c`] with an explicit output path and extra gcc arguments (e.g. `-DFOO=1`).
pub fn compile_c_to(out: &Path, sources: &[&str], link: Link, extra: &[&str]) {
    let sim = if link == Link::Dl {
        None
    } else {
        Some(sim_dir())
    };
    let root = repo_root();
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()));
    cmd.args(["-O1", "-g", "-Wall", "-Werror", "-std=gnu11"])
        .arg(format!("-I{}", workloads_include().display()))
        .arg("-o")
        .arg(out);
    for s in sources {
        cmd.arg(root.join(s));
    }
    cmd.args(extra);
    if let Some(sim) = &sim {
        cmd.args(link.args(sim));
    } else {
        cmd.args(link.args(Path::new(".")));
    }
    let o = cmd.output().expect("run gcc");
    assert!(
        o.status.success(),
        "compiling {sources:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The `replay` workload (tests/workloads/replay/replay.c) linked against the simulated
/// `libcudart.so.12`, built once per test process. CLI: see `tests/workloads/README.md`.
pub fn replay_exe() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        compile_c(
            "replay",
            &["tests/workloads/replay/replay.c"],
            Link::SharedRuntime,
        )
    })
    .clone()
}

/// A real allocation stream shipped in `tests/workloads/traces/` (RMM CSV:
/// `bert_serve.rmm.csv`, `t5_train.rmm.csv`, `vit_train.rmm.csv`; see the README there).
pub fn trace_file(name: &str) -> PathBuf {
    let p = repo_root().join("tests/workloads/traces").join(name);
    assert!(p.exists(), "no trace {}", p.display());
    p
}

/// Every RMM log of shared/traces (the repository's copies in `tests/workloads/traces/` when
/// the shared folder is not beside the clone), sorted; at least the three shipped ones.
pub fn shipped_traces() -> Vec<PathBuf> {
    let root = repo_root();
    let shared = root.join("../shared/traces");
    let dir = if shared.join("vit_train.rmm.csv").exists() {
        shared
    } else {
        root.join("tests/workloads/traces")
    };
    rmm_logs_in(&dir, "the shipped traces")
}

/// The RMM logs (`*.rmm.csv`) of `dir`, sorted; fewer than three fails the test, naming
/// `what` was expected there.
pub fn rmm_logs_in(dir: &Path, what: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".rmm.csv"))
        .collect();
    v.sort();
    assert!(v.len() >= 3, "expected {what} in {}", dir.display());
    v
}
