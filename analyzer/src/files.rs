//! Where the `vramshim` command writes and what it runs (docs/threat-model.md): every output
//! file (`-o`, the demo's page, work files) is opened with `vramshim_trace::output_file`
//! (never through a symlink, a FIFO, a device or another user's file; an own regular file is
//! replaced, as any `-o` does); work directories are private (created by `mkdir` with mode
//! 0700 under a fresh random name, or a named directory checked to be ours and closed to
//! others); and a program built for a run is executed only if nobody but this user and root
//! can have changed it or any directory above it.
//!
//! `VRAMSHIM_FILES_FAULT=unsafe` switches these checks off (outputs opened with a plain
//! create-and-truncate, the demo's fixed shared directory, a cached program run unchecked):
//! the tests use it to show that they catch a missing check.

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use vramshim_trace::output_file::{self, Replace};

/// The checks are off (`VRAMSHIM_FILES_FAULT=unsafe`; tests only).
pub fn fault_unsafe() -> bool {
    crate::switches::switch_on("VRAMSHIM_FILES_FAULT", "unsafe")
}

/// The output file `path`, empty, for writing: an own regular file is replaced; a symlink, a
/// FIFO or other special file, another user's file or a hard-linked one is refused with one
/// line naming the path and why.
pub fn create_output(path: &Path) -> Result<File, String> {
    if fault_unsafe() {
        return File::create(path).map_err(|e| crate::error::write_error(path, &e));
    }
    output_file::create(path, Replace::OwnFile)
        .map_err(|why| format!("{}: not written: it {why}", path.display()))
}

/// Checks that `path` may be written as [`create_output`] would, without emptying an existing
/// file (for outputs written beside it and renamed into place); a missing file is created
/// empty, and `true` says so.
pub fn check_output(path: &Path) -> Result<bool, String> {
    if fault_unsafe() {
        return Ok(false);
    }
    match output_file::open(path, Replace::OwnFile) {
        Ok(output_file::Opened::Created(_)) => Ok(true),
        Ok(output_file::Opened::Existing(_)) => Ok(false),
        Err(why) => Err(format!("{}: not written: it {why}", path.display())),
    }
}

/// [`create_output`], then `bytes` written.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = create_output(path)?;
    f.write_all(bytes)
        .map_err(|e| crate::error::write_error(path, &e))
}

fn me() -> u32 {
    output_file::effective_uid()
}

/// A fresh private directory `$TMPDIR/<prefix>-<random>` (mode 0700, made by `mkdir`, so
/// nothing another user planted under that name is ever used), checked like
/// [`check_trusted`].
pub fn private_temp_dir(prefix: &str) -> Result<PathBuf, String> {
    private_dir_in(&std::env::temp_dir(), prefix)
}

/// [`private_temp_dir`] under `base` instead of `$TMPDIR`.
pub fn private_dir_in(base: &Path, prefix: &str) -> Result<PathBuf, String> {
    let mut last = None;
    for _ in 0..16 {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let d = base.join(format!("{prefix}-{:016x}", h.finish()));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {
                check_trusted(&d)?;
                return Ok(d);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(format!(
                    "cannot create a directory in {}: {e}",
                    base.display()
                ));
            }
        }
    }
    Err(format!(
        "cannot create a private directory in {}: {}",
        base.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// A directory the user named for our work files: made (mode 0700) if absent; if present it
/// must be a directory of ours that group and others cannot write, in a trusted place
/// ([`check_trusted`]), since programs built in it are run.
pub fn own_work_dir(path: &Path) -> Result<PathBuf, String> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
    }
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_dir() {
        return Err(format!(
            "{}: not used as a work directory: it is not a directory (a symbolic link is not followed)",
            path.display()
        ));
    }
    check_trusted(path)?;
    Ok(path.to_path_buf())
}

/// Fails unless nobody but this user and root can change what `path` is: `path` itself is
/// ours (or root's) and closed to group and others, and so is every directory above it,
/// except that a sticky directory (like /tmp) may be open to all, since there only the owner
/// of an entry may rename or remove it. Symbolic links on the way are resolved first.
pub fn check_trusted(path: &Path) -> Result<(), String> {
    let canon = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let me = me();
    let refuse = |p: &Path, why: String| {
        Err(format!(
            "{}: not trusted: {} {why} (another user could change what vramshim runs or writes there)",
            path.display(),
            p.display()
        ))
    };
    let mut chain: Vec<&Path> = canon.ancestors().collect();
    chain.reverse();
    for (i, p) in chain.iter().enumerate() {
        let m = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if m.uid() != me && m.uid() != 0 {
            return refuse(p, format!("belongs to uid {}", m.uid()));
        }
        let last = i + 1 == chain.len();
        let open = m.mode() & 0o022 != 0;
        if open && (last || m.mode() & 0o1000 == 0) {
            return refuse(
                p,
                format!(
                    "is writable by group or others (mode {:o})",
                    m.mode() & 0o7777
                ),
            );
        }
    }
    Ok(())
}

/// The program at `exe` may be run: a regular file that only this user (or root) can have
/// written, in a trusted place ([`check_trusted`]).
pub fn check_runnable(exe: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    if !m.is_file() {
        return Err(format!(
            "{}: not run: it is not a regular file",
            exe.display()
        ));
    }
    check_trusted(exe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn private_dirs_are_fresh_and_closed() {
        let a = private_temp_dir("vramshim-files-test").unwrap();
        let b = private_temp_dir("vramshim-files-test").unwrap();
        assert_ne!(a, b);
        let m = std::fs::metadata(&a).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        assert_eq!(m.uid(), me());
        std::fs::remove_dir(&a).unwrap();
        std::fs::remove_dir(&b).unwrap();
    }

    #[test]
    fn open_directories_are_not_trusted() {
        let d = private_temp_dir("vramshim-files-test").unwrap();
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("exe"), "").unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(sub.join("exe"), std::fs::Permissions::from_mode(0o755)).unwrap();
        check_runnable(&sub.join("exe")).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_runnable(&sub.join("exe")).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_runnable(&sub.join("exe")).unwrap();
        std::fs::set_permissions(sub.join("exe"), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_runnable(&sub.join("exe")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
