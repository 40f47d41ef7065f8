//! Scratch directories that tests leave nothing of.
//!
//! [`TempDir`] is the one guard for a test's directory in the temporary directory (`$TMPDIR`,
//! else `/tmp`): made fresh and private, removed with everything in it when the guard is
//! dropped, which unwinding does when the test panics. Guards kept for the whole process (in a
//! `static`) are removed when it exits. `scripts/test` runs the tests under a temporary
//! directory of their own and fails when a `vramshim-*` entry is left in it.
//!
//! [`crate::temp_dir`] (under the target directory) is removed when the test process exits.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Directories made here and not yet removed, removed at exit (see [`at_exit`]).
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A fresh empty directory `$TMPDIR/vramshim-<tag>-<pid>-<n>` (mode 0700; or in another base,
/// [`TempDir::new_in`]), removed with its contents when dropped (also while a panicking test unwinds) or, when never dropped (kept in
/// a `static`), when the process exits. Derefs to its [`Path`].
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Makes the directory; panics (naming it) when it cannot.
    #[track_caller]
    pub fn new(tag: &str) -> TempDir {
        TempDir::new_in(&std::env::temp_dir(), tag)
    }

    /// [`TempDir::new`] in `base` (an existing directory) instead of the temporary directory:
    /// `<base>/vramshim-<tag>-<pid>-<n>`.
    #[track_caller]
    pub fn new_in(base: &Path, tag: &str) -> TempDir {
        use std::os::unix::fs::DirBuilderExt;
        // A name taken already (a dead process that had this pid, or anyone else's entry in a
        // shared /tmp) is passed over, never used nor removed.
        let mut tries = 0;
        loop {
            let path = base.join(format!("vramshim-{}", crate::unique_name(tag)));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    track(path.clone());
                    return TempDir { path };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 100 => {
                    tries += 1;
                }
                Err(e) => panic!("cannot create {}: {e}", path.display()),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            // Never a panic here: a drop during a test's unwinding would abort the process.
            eprintln!("testkit: cannot remove {}: {e}", self.path.display());
            return;
        }
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|p| p != &self.path);
    }
}

/// Removes `p` and everything in it; a directory a test made unreadable or unwritable (to
/// see a refusal) is made the owner's again first. Gone already is fine.
pub(crate) fn remove_tree(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            give_back(p);
            match std::fs::remove_dir_all(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }
}

/// Makes every directory under `p` (not following links) readable, writable and searchable
/// by its owner.
fn give_back(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(p) {
        for e in entries.flatten() {
            give_back(&e.path());
        }
    }
}

/// Remembers `p` for removal at exit (registering the exit handler once).
pub(crate) fn track(p: PathBuf) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that never unwinds (it catches panics).
        unsafe { libc::atexit(at_exit) };
    });
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).push(p);
}

/// Directories made by this process and not removed (yet): what is removed at exit.
pub fn live_temp_dirs() -> Vec<PathBuf> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The test process exits (the test harness returns through `exit`): removes what it made
/// and still holds. A forked child that exits removes nothing of its parent's.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let me = std::process::id();
        let live = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|e| e.into_inner()));
        for p in live {
            if made_by(&p, me) {
                let _ = remove_tree(&p);
            }
        }
    });
}

/// Whether `p`'s name is `<prefix>-<pid>-<n>` with `pid` (see [`crate::unique_name`]).
fn made_by(p: &Path, pid: u32) -> bool {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut parts = name.as_deref().unwrap_or("").rsplitn(3, '-');
    let (_n, owner) = (parts.next(), parts.next());
    owner.and_then(|o| o.parse::<u32>().ok()) == Some(pid)
}
