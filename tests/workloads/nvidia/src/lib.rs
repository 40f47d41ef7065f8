//! NVIDIA's own user-mode CUDA libraries on the simulated GPU: the real `libcudart` 12.x and
//! 13.x (shared, and linked in from `libcudart_static.a`), run on cuda-sim's `libcuda.so.1`
//! with no cuda-sim runtime loaded, plain and under `vramshim run`.
//!
//! The libraries come from pinned wheels installed outside the clone by
//! `scripts/setup-nvidia-wheels`. Without them each test prints why it is skipped, unless
//! `VRAMSHIM_NVIDIA_TESTS=1` (CI), which installs them first and fails when that fails.
//!
//! The C programs are in `c/`. Build the workspace first (`scripts/test` does): the tests use
//! the simulated GPU and `libvramshim.so`/`vramshim` from the profile directory.

pub mod models;
pub mod pyalloc;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use vramshim_testkit::{nvidia_wheels, profile_dir, repo_root, sim_dir, temp_dir};

/// Which of NVIDIA's runtimes a program uses, and how it is linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// `libcudart.so.12` of nvidia-cuda-runtime-cu12 12.9.79.
    Shared12,
    /// `libcudart.so.13` of nvidia-cuda-runtime 13.2.86.
    Shared13,
    /// `libcudart_static.a` of nvidia-cuda-runtime-cu12 12.9.79 linked into the program.
    Static12,
    /// `libcudart_static.a` of nvidia-cuda-runtime 13.2.86 linked into the program.
    Static13,
}

pub const ALL: [Runtime; 4] = [
    Runtime::Shared12,
    Runtime::Shared13,
    Runtime::Static12,
    Runtime::Static13,
];

impl Runtime {
    pub fn is_static(self) -> bool {
        matches!(self, Runtime::Static12 | Runtime::Static13)
    }

    pub fn major(self) -> u32 {
        match self {
            Runtime::Shared12 | Runtime::Static12 => 12,
            Runtime::Shared13 | Runtime::Static13 => 13,
        }
    }

    /// The wheel's library directory.
    pub fn lib_dir(self, wheels: &Path) -> PathBuf {
        match self.major() {
            12 => wheels.join("cu12/nvidia/cuda_runtime/lib"),
            _ => wheels.join("cu13/nvidia/cu13/lib"),
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Runtime::Shared12 => "shared12",
            Runtime::Shared13 => "shared13",
            Runtime::Static12 => "static12",
            Runtime::Static13 => "static13",
        }
    }
}

/// The pinned wheels, or `None` after printing why the test is skipped.
pub fn wheels_or_skip() -> Option<PathBuf> {
    match nvidia_wheels() {
        Ok(d) => Some(d),
        Err(why) => {
            eprintln!("SKIP: NVIDIA's wheels are not installed: {why}");
            None
        }
    }
}

/// Compiles `c/<source>` against `rt`, once per (source, runtime) and test process. Shared
/// runtimes are found through a DT_RPATH to the wheel (as PyTorch's bundled libraries are),
/// which wins over LD_LIBRARY_PATH: `vramshim run --sim` puts cuda-sim's own runtimes on
/// LD_LIBRARY_PATH, and the program must still run NVIDIA's.
pub fn build(source: &str, rt: Runtime, wheels: &Path, extra: &[&str]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{source}/{}/{}", rt.tag(), extra.join(" "));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let stem = source.trim_end_matches(".c");
    let exe = temp_dir(&format!("{stem}-{}", rt.tag())).join(format!("{stem}-{}", rt.tag()));
    let lib = rt.lib_dir(wheels);
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "gcc".into()));
    cmd.args(["-O1", "-g", "-Wall", "-Werror", "-std=gnu11", "-o"])
        .arg(&exe)
        .arg(repo_root().join("tests/workloads/nvidia/c").join(source))
        .args(extra);
    if rt.is_static() {
        cmd.arg(lib.join("libcudart_static.a"));
    } else {
        cmd.arg(format!("-L{}", lib.display()))
            .arg(format!("-l:libcudart.so.{}", rt.major()))
            .arg(format!("-Wl,--disable-new-dtags,-rpath,{}", lib.display()));
    }
    cmd.args(["-ldl", "-lpthread", "-lrt"]);
    let o = cmd.output().expect("run gcc");
    assert!(
        o.status.success(),
        "compiling {source} for {rt:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    built.push((key, exe.clone()));
    exe
}

/// A directory holding only cuda-sim's driver and NVML (`libcuda.so.1`, `libnvidia-ml.so.1`),
/// no runtime: what a machine with NVIDIA's driver installed offers.
pub fn driver_only_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let sim = sim_dir();
        let dir = temp_dir("driver-only");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            std::os::unix::fs::symlink(sim.join(name), dir.join(name)).unwrap();
        }
        dir
    })
    .clone()
}

/// The `map <path>` lines a program printed (its mapped CUDA-related files).
pub fn mapped(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("map "))
        .collect()
}

/// Asserts the process ran NVIDIA's runtime of `rt` on cuda-sim's driver: its only mapped
/// CUDA runtime is the wheel's (none at all when linked statically), no cuda-sim runtime is
/// mapped, and `libcuda.so.1` is cuda-sim's (from this build).
pub fn assert_nvidia_runtime_on_sim_driver(stdout: &str, rt: Runtime, wheels: &Path) {
    let maps = mapped(stdout);
    let wheel_lib = rt.lib_dir(wheels);
    let runtimes: Vec<&&str> = maps
        .iter()
        .filter(|p| {
            let name = Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            name.starts_with("libcudart") || name.starts_with("libvramsim_runtime")
        })
        .collect();
    if rt.is_static() {
        assert!(runtimes.is_empty(), "a static program mapped {runtimes:?}");
    } else {
        let want = wheel_lib.join(format!("libcudart.so.{}", rt.major()));
        assert_eq!(
            runtimes,
            [&want.to_str().unwrap()],
            "the one runtime mapped is NVIDIA's: {maps:?}"
        );
    }
    let profile = profile_dir().canonicalize().unwrap();
    let drivers: Vec<&&str> = maps
        .iter()
        .filter(|p| {
            let name = Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            name.starts_with("libcuda.") || name.starts_with("libvramsim_driver")
        })
        .collect();
    assert!(
        drivers.len() == 1 && Path::new(drivers[0]).starts_with(&profile),
        "the driver mapped is cuda-sim's, from {}: {maps:?}",
        profile.display()
    );
}

/// `key value` from a program's stdout.
pub fn field(stdout: &str, key: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{key}` in:\n{stdout}"))
}

/// CuPy as `scripts/setup-cupy` installs it: `(directory for PYTHONPATH, the python it was
/// installed for)`, or `None` after printing why the test is skipped. With
/// `VRAMSHIM_NVIDIA_TESTS=1` (CI) a missing installation is installed first and a failed
/// install panics: the tests then fail instead of skipping.
pub fn cupy_or_skip() -> Option<(PathBuf, PathBuf)> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    python_packages_or_skip(&DIR, "setup-cupy", "CuPy")
}

/// RMM and cuda.bindings as `scripts/setup-rmm` installs them (rmm-cu12 depends on
/// cuda-bindings, so one installation serves both), as [`cupy_or_skip`] does for CuPy.
pub fn rmm_or_skip() -> Option<(PathBuf, PathBuf)> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    python_packages_or_skip(&DIR, "setup-rmm", "RMM and cuda.bindings")
}

/// JAX with its CUDA 12 plugin as `scripts/setup-jax` installs it, as [`cupy_or_skip`] does for
/// CuPy.
pub fn jax_or_skip() -> Option<(PathBuf, PathBuf)> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    python_packages_or_skip(&DIR, "setup-jax", "JAX")
}

/// A `pip install --target` tree made by `scripts/<script>` (which prints its directory, and
/// with `--check` only says whether it is installed; the tree holds `python`, the interpreter it
/// was installed for). Installed when `VRAMSHIM_NVIDIA_TESTS=1`, where a failure panics.
fn python_packages_or_skip(
    cell: &OnceLock<Result<PathBuf, String>>,
    script: &str,
    what: &str,
) -> Option<(PathBuf, PathBuf)> {
    let dir = cell.get_or_init(|| {
        let script = repo_root().join("scripts").join(script);
        let required = std::env::var("VRAMSHIM_NVIDIA_TESTS").as_deref() == Ok("1");
        let mut c = std::process::Command::new(&script);
        if !required {
            c.arg("--check");
        }
        let o = c
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        let err = String::from_utf8_lossy(&o.stderr);
        let name = script.file_name().unwrap_or_default().to_string_lossy();
        if o.status.success() {
            Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        } else if required {
            panic!("VRAMSHIM_NVIDIA_TESTS=1 but scripts/{name} failed:\n{err}");
        } else {
            Err(format!(
                "{} (run scripts/{name}, or set VRAMSHIM_NVIDIA_TESTS=1 to install it from the tests)",
                err.trim()
            ))
        }
    });
    match dir {
        Ok(d) => {
            let python = std::fs::read_to_string(d.join("python"))
                .unwrap_or_else(|e| panic!("{}/python: {e}", d.display()));
            Some((d.clone(), PathBuf::from(python.trim())))
        }
        Err(why) => {
            eprintln!("SKIP: {what} not installed: {why}");
            None
        }
    }
}
