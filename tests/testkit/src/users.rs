//! Two users on one machine, for the tests that plant files as one user and run vramshim as
//! the other (docs/threat-model.md): root, and `nobody`.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub name: &'static str,
}

pub const ROOT: User = User {
    uid: 0,
    gid: 0,
    name: "root",
};

/// The `nobody` user of this machine.
pub fn nobody() -> User {
    let n = CString::new("nobody").unwrap();
    // SAFETY: a NUL-terminated name; the entry is read at once, before any other getpw call.
    let pw = unsafe { libc::getpwnam(n.as_ptr()) };
    assert!(!pw.is_null(), "no user nobody on this machine");
    // SAFETY: non-null entry from getpwnam.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    User {
        uid,
        gid,
        name: "nobody",
    }
}

/// True when running as root (the plants need two users); otherwise says why `test` skips.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root (it plants files as root and as nobody)");
    false
}

/// `cmd` runs as `u` (as is, for root).
pub fn as_user(cmd: &mut Command, u: User) -> &mut Command {
    if u.uid != 0 {
        // std drops the supplementary groups when root changes uid.
        cmd.uid(u.uid).gid(u.gid);
    }
    cmd
}

/// A fresh directory like /tmp: world-writable and sticky.
pub fn sticky_dir(tag: &str) -> PathBuf {
    let d = crate::temp_dir(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}
