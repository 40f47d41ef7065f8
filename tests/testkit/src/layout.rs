//! The simulated GPU's layout: `<profile>/cuda-sim/` holds cargo's outputs under the real
//! libraries' names. Same result as `scripts/sim-layout <profile_dir>`.

use crate::profile_dir;
use std::fs;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `(name in the layout, cargo output it is copied from)`.
pub const SIM_FILES: &[(&str, &str)] = &[
    ("libcuda.so.1", "libvramsim_driver.so"),
    ("libcudart.so.12", "libvramsim_runtime12.so"),
    ("libcudart.so.13", "libvramsim_runtime13.so"),
    ("libcudart_static.a", "libvramsim_runtime_static.a"),
    ("libnvidia-ml.so.1", "libvramsim_nvml.so"),
];

/// `(link, target)` symlinks in the layout.
const SIM_LINKS: &[(&str, &str)] = &[
    ("libcuda.so", "libcuda.so.1"),
    ("libcudart.so", "libcudart.so.12"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
];

/// `<profile>/cuda-sim/`: `libcuda.so.1` (+ `libcuda.so`), `libcudart.so.12`,
/// `libcudart.so.13`, `libcudart_static.a`, `libnvidia-ml.so.1`. Created on first use in the
/// process, and refreshed when a cargo output is newer than its copy. Safe with concurrent
/// test processes (lock file + every file replaced by an atomic rename).
///
/// Panics with the cargo command to run when the simulated GPU's crates are not built.
pub fn sim_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let profile = profile_dir();
        lay_out(&profile).unwrap_or_else(|e| panic!("{e}"))
    })
    .clone()
}

fn is_stale(src: &Path, dst: &Path) -> bool {
    let (Ok(s), Ok(d)) = (fs::metadata(src), fs::metadata(dst)) else {
        return true;
    };
    s.len() != d.len() || s.modified().ok() > d.modified().ok()
}

/// Lays the simulated GPU out under `<profile>/cuda-sim` from the cargo outputs in `profile`
/// (only what is missing or stale) and returns the directory.
pub fn lay_out(profile: &Path) -> Result<PathBuf, String> {
    let dir = profile.join("cuda-sim");
    let missing: Vec<&str> = SIM_FILES
        .iter()
        .filter(|(_, src)| !profile.join(src).exists())
        .map(|(_, src)| *src)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the simulated GPU is not built in {} (missing {}): run `cargo build --release -p vramsim-driver \
             -p vramsim-nvml -p vramsim-runtime12 -p vramsim-runtime13 -p vramsim-runtime-static` \
             (scripts/test builds the whole workspace)",
            profile.display(),
            missing.join(", ")
        ));
    }
    let up_to_date = |dir: &Path| {
        SIM_FILES
            .iter()
            .all(|(name, src)| !is_stale(&profile.join(src), &dir.join(name)))
            && SIM_LINKS.iter().all(|(l, _)| dir.join(l).exists())
    };
    if up_to_date(&dir) {
        return Ok(dir);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let lock = fs::File::create(dir.join(".lock")).map_err(|e| format!("lock file: {e}"))?;
    // SAFETY: flock on a file descriptor we own; released when `lock` is closed.
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    let tag = format!("{}.{:?}", std::process::id(), std::thread::current().id());
    for (name, src) in SIM_FILES {
        let (src, dst) = (profile.join(src), dir.join(name));
        if !is_stale(&src, &dst) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{tag}.tmp"));
        fs::copy(&src, &tmp)
            .map_err(|e| format!("copy {} -> {}: {e}", src.display(), tmp.display()))?;
        fs::rename(&tmp, &dst).map_err(|e| format!("rename to {}: {e}", dst.display()))?;
    }
    for (link, target) in SIM_LINKS {
        let p = dir.join(link);
        if fs::read_link(&p).ok().as_deref() == Some(Path::new(target)) {
            continue;
        }
        let tmp = dir.join(format!(".{link}.{tag}.tmp"));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)
            .map_err(|e| format!("symlink {}: {e}", tmp.display()))?;
        fs::rename(&tmp, &p).map_err(|e| format!("rename to {}: {e}", p.display()))?;
    }
    let _ = writeln!(&lock, "{tag}");
    Ok(dir)
}
