//! The simulated GPU's layout: `<profile>/cuda-sim/` holds cargo's outputs under the real
//! libraries' names. Same result as `scripts/sim-layout <profile_dir>`.

use crate::fresh;
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
/// Panics with the cargo command to run when the simulated GPU's crates are not built, or
/// not from the sources now in the tree ([`sim_built_fresh`]: `cargo test` of another package
/// does not rebuild them, and a test against a stale simulator tests the previous one).
#[track_caller]
pub fn sim_dir() -> PathBuf {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = DIR.get_or_init(|| {
        let profile = profile_dir();
        let fix = fresh::build_command(fresh::SIM_PACKAGES);
        sim_built_fresh(&profile, &crate::repo_root(), &fix)?;
        lay_out(&profile)
    });
    match r {
        Ok(p) => p.clone(),
        Err(why) => panic!("{why}"),
    }
}

/// `Ok` if every cargo output the layout copies (in `profile`) was built from the sources its
/// dep-info lists, unchanged since and lying under `root` (the `fresh` module's check); else
/// the first that is not, and why, ending in `fix`.
fn sim_built_fresh(profile: &Path, root: &Path, fix: &str) -> Result<(), String> {
    for (_, src) in SIM_FILES {
        let artifact = profile.join(src);
        fresh::check(&artifact, &fresh::dep_info_of(&artifact), root, fix)?;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fresh::tests::at;

    /// The simulated GPU's libraries are checked as the interposer's binaries are: fresh when
    /// each was built after every source its dep-info lists; stale (naming the library, the
    /// source and the build command) when a source of one changed after it was built, fresh
    /// again once it is rebuilt; not built, said so.
    #[test]
    fn a_simulator_library_is_stale_when_a_source_it_was_built_from_is_newer() {
        let tmp = crate::TempDir::new("sim-fresh");
        let root = tmp.join("repo");
        let profile = tmp.join("release");
        std::fs::create_dir_all(root.join("driver/src")).unwrap();
        std::fs::create_dir_all(root.join("runtime/src")).unwrap();
        std::fs::create_dir_all(&profile).unwrap();
        let driver_src = root.join("driver/src/lib.rs");
        let runtime_src = root.join("runtime/src/lib.rs");
        for f in [&driver_src, &runtime_src] {
            fs::write(f, "x").unwrap();
            at(f, 10);
        }
        for (_, out) in SIM_FILES {
            let artifact = profile.join(out);
            fs::write(&artifact, "lib").unwrap();
            at(&artifact, 20);
            // the driver's library from the driver's source, the others from the runtime's
            let src = if out.contains("driver") {
                &driver_src
            } else {
                &runtime_src
            };
            let dep = format!("{}: {}\n", artifact.display(), src.display());
            fs::write(fresh::dep_info_of(&artifact), dep).unwrap();
        }
        let fix = fresh::build_command(fresh::SIM_PACKAGES);
        assert!(fix.ends_with(fresh::SIM_PACKAGES), "{fix}");
        assert_eq!(sim_built_fresh(&profile, &root, &fix), Ok(()));
        // a driver source touched after the build: the driver's library is stale
        at(&driver_src, 30);
        let e = sim_built_fresh(&profile, &root, &fix).unwrap_err();
        assert!(
            e.contains("libvramsim_driver.so is stale")
                && e.contains("driver/src/lib.rs")
                && e.ends_with(&fix),
            "{e}"
        );
        // rebuilt
        at(&profile.join("libvramsim_driver.so"), 40);
        assert_eq!(sim_built_fresh(&profile, &root, &fix), Ok(()));
        // the static runtime (a `.a`, its dep-info `libvramsim_runtime_static.d`) is checked too
        at(&runtime_src, 50);
        let e = sim_built_fresh(&profile, &root, &fix).unwrap_err();
        assert!(
            e.contains("is stale") && e.contains("runtime/src/lib.rs"),
            "{e}"
        );
        for (_, out) in SIM_FILES {
            at(&profile.join(out), 60);
        }
        assert_eq!(sim_built_fresh(&profile, &root, &fix), Ok(()));
        at(&runtime_src, 70);
        at(&profile.join("libvramsim_runtime12.so"), 80);
        at(&profile.join("libvramsim_runtime13.so"), 80);
        let e = sim_built_fresh(&profile, &root, &fix).unwrap_err();
        assert!(e.contains("libvramsim_runtime_static.a is stale"), "{e}");
        // one not built
        fs::remove_file(profile.join("libvramsim_nvml.so")).unwrap();
        at(&profile.join("libvramsim_runtime_static.a"), 80);
        let e = sim_built_fresh(&profile, &root, &fix).unwrap_err();
        assert!(
            e.contains("libvramsim_nvml.so is not built") && e.ends_with(&fix),
            "{e}"
        );
    }
}
