//! The Python startup hook of `vramshim run --trace` (`python/sitecustomize.py`, embedded):
//! written into a fresh private directory that goes first on the job's `PYTHONPATH`, so a
//! Python job that uses PyTorch's CUDA allocator gets tensor-level events without a change.
//! Opt out with `--no-python-hook` or `VRAMSHIM_PYTHON_HOOK=0`. Programs that are not Python
//! never look at the directory; Python programs that do not import torch.cuda only load the
//! hook (a few imports of the standard library).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// The hook's source.
pub const SITECUSTOMIZE: &str = include_str!("python/sitecustomize.py");
/// The variable that turns the hook off (`0`).
pub const HOOK_VAR: &str = "VRAMSHIM_PYTHON_HOOK";

/// The directory holding the hook; removed when dropped (after the job ended).
pub struct HookDir(PathBuf);

impl Drop for HookDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the hook is wanted: not when `VRAMSHIM_PYTHON_HOOK` is `0` (another value is one
/// line, then the default).
pub fn wanted(flag_off: bool) -> bool {
    if flag_off {
        return false;
    }
    match std::env::var(HOOK_VAR) {
        Ok(v) if v.trim() == "0" => false,
        Ok(v) if v.trim() == "1" || v.trim().is_empty() => true,
        Ok(v) => {
            eprintln!(
                "vramshim: run: {HOOK_VAR}={:?} is not understood (accepted: 0 or 1); the \
                 Python hook stays on",
                v
            );
            true
        }
        Err(_) => true,
    }
}

/// Where the hook's directory is made: in the user's runtime directory (`$XDG_RUNTIME_DIR`,
/// a directory of the user's own that nobody else may enter) when there is one, else in
/// `$TMPDIR`. The directory is removed when the job ends, but its name stays on the
/// `PYTHONPATH` of whatever the job left running; in a world-writable `$TMPDIR`, where any
/// user can list the name while the job runs, another user could then create it with a
/// `sitecustomize.py` of their own, which such a process's next Python would run.
fn parent() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let private = |d: &PathBuf| {
        d.is_absolute()
            && std::fs::symlink_metadata(d).is_ok_and(|m| {
                m.is_dir()
                    && m.uid() == vramshim_trace::output_file::effective_uid()
                    && m.mode() & 0o077 == 0
            })
    };
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(private)
        .unwrap_or_else(std::env::temp_dir)
}

/// Writes the hook and puts its directory first on the command's `PYTHONPATH`. On failure,
/// one line and no hook (the job runs as it would without it).
pub fn install(cmd: &mut Command) -> Option<HookDir> {
    let dir = match vramshim_analyzer::files::private_dir_in(&parent(), "vramshim-pyhook") {
        Ok(d) => HookDir(d),
        Err(e) => {
            eprintln!("vramshim: run: no Python hook (tensor-level events off): {e}");
            return None;
        }
    };
    if let Err(e) = std::fs::write(dir.0.join("sitecustomize.py"), SITECUSTOMIZE) {
        eprintln!(
            "vramshim: run: no Python hook (tensor-level events off): cannot write {}: {e}",
            dir.0.display()
        );
        return None;
    }
    let mut path = OsString::from(dir.0.as_os_str());
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    cmd.env("PYTHONPATH", path);
    Some(dir)
}
