//! NVIDIA's real `libcudart.so.12` (the nvidia-cuda-runtime-cu12 wheel), for tests that link a
//! program against the real runtime at build time and run it on the simulated stack.

use std::path::PathBuf;
use std::process::Command;

/// The wheel version the tests use.
pub const CUDART12_WHEEL: &str = "nvidia-cuda-runtime-cu12==12.9.79";

/// Directory holding NVIDIA's real `libcudart.so.12` (from the nvidia-cuda-runtime-cu12 12.9.79
/// wheel), downloaded with `pip download --no-deps` into `~/.cache/vramshim/wheels` (outside
/// the clone; `$VRAMSHIM_WHEEL_CACHE` overrides) and extracted there on first use.
///
/// `Err(reason)` when the wheel is not cached and no package registry is reachable: the caller
/// skips its test with that reason printed.
pub fn real_cudart12_dir() -> Result<PathBuf, String> {
    let cache = match std::env::var_os("VRAMSHIM_WHEEL_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".cache/vramshim/wheels"),
    };
    let extracted = cache.join("nvidia-cuda-runtime-cu12-12.9.79");
    let lib = extracted.join("nvidia/cuda_runtime/lib");
    if lib.join("libcudart.so.12").exists() {
        return Ok(lib);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("create {}: {e}", cache.display()))?;
    let find_wheel = || -> Option<PathBuf> {
        std::fs::read_dir(&cache)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("nvidia_cuda_runtime_cu12-12.9.79") && n.ends_with(".whl")
                })
            })
    };
    if find_wheel().is_none() {
        let o = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
            .arg(&cache)
            .arg(CUDART12_WHEEL)
            .output()
            .map_err(|e| format!("cannot run python3 -m pip: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "`pip download {CUDART12_WHEEL}` failed (no package registry reachable?): {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
    }
    let wheel = find_wheel().ok_or("pip download left no wheel")?;
    let tmp = cache.join(format!(".extract-{}", crate::unique_name("whl")));
    let o = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&tmp)
        .output()
        .map_err(|e| format!("cannot run python3 -m zipfile: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "extracting {}: {}",
            wheel.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    // Another process may have won the race: then ours is simply dropped.
    if std::fs::rename(&tmp, &extracted).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if lib.join("libcudart.so.12").exists() {
        Ok(lib)
    } else {
        Err(format!(
            "the wheel has no {}",
            lib.join("libcudart.so.12").display()
        ))
    }
}

/// Root of the pinned NVIDIA wheels `scripts/setup-nvidia-wheels` installs (`cu12/`, `cu13/`),
/// or `Err(reason)` to skip. With `VRAMSHIM_NVIDIA_TESTS=1` (CI) a missing installation is
/// installed first (once per test process) and a failed install panics: the tests then fail
/// instead of skipping.
pub fn nvidia_wheels() -> Result<PathBuf, String> {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let script = crate::repo_root().join("scripts/setup-nvidia-wheels");
        let check = Command::new(&script)
            .arg("--check")
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if check.status.success() {
            return Ok(PathBuf::from(
                String::from_utf8_lossy(&check.stdout).trim().to_string(),
            ));
        }
        if std::env::var("VRAMSHIM_NVIDIA_TESTS").as_deref() != Ok("1") {
            return Err(format!(
                "{} (run scripts/setup-nvidia-wheels, or set VRAMSHIM_NVIDIA_TESTS=1 to install them from the tests)",
                String::from_utf8_lossy(&check.stderr).trim()
            ));
        }
        let o = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(
            o.status.success(),
            "VRAMSHIM_NVIDIA_TESTS=1 but scripts/setup-nvidia-wheels failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(PathBuf::from(
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        ))
    })
    .clone()
}
