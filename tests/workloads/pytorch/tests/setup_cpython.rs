//! `scripts/setup-cpython314` runs the interpreter it installs (and the tests run it), so it
//! refuses a cache directory someone else could have put files in: one owned by another user,
//! writable by others, a symbolic link, below a directory others can write that is not sticky,
//! or below another user's symbolic link. Each is refused with one line before anything is read
//! from it or downloaded (these checks need no network); a directory of the user's own below a
//! sticky one (/tmp) is taken.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use vramshim_testkit::users::{nobody, root_or_skip};
use vramshim_testkit::{repo_root, temp_dir};

/// `--check` with the cache in `dir`: (exit code, stderr).
fn check(dir: &Path) -> (Option<i32>, String) {
    let o = Command::new(repo_root().join("scripts/setup-cpython314"))
        .arg("--check")
        .env("VRAMSHIM_CPYTHON_DIR", dir)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn mode(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

#[track_caller]
fn refused(dir: &Path, why: &str) {
    let (code, err) = check(dir);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line wanted:\n{err}");
    assert!(
        err.contains(why) && err.contains("refusing to install or run CPython from there"),
        "{}: {why:?} wanted:\n{err}",
        dir.display()
    );
}

#[test]
fn cache_directories_others_could_write_are_refused() {
    let base = temp_dir("setup-cpython");
    mode(&base, 0o755);

    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    mode(&open, 0o777);
    refused(
        &open,
        &format!("{} is writable by others (mode 777)", open.display()),
    );
    mode(&open, 0o775);
    refused(&open, "is writable by others (mode 775)");

    let link = base.join("link");
    let own = base.join("own");
    std::fs::create_dir(&own).unwrap();
    mode(&own, 0o755);
    std::os::unix::fs::symlink(&own, &link).unwrap();
    refused(&link, "is a symbolic link");

    // below a directory others can write (not sticky): refused, made or not
    let shared = base.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::create_dir(shared.join("mine")).unwrap();
    mode(&shared.join("mine"), 0o755);
    mode(&shared, 0o777);
    refused(
        &shared.join("mine"),
        &format!(
            "{}, above the cache directory, is writable by others",
            shared.display()
        ),
    );

    // the user's own, closed directory below a sticky one (as in /tmp) is taken: not
    // installed there, said as such
    let sticky = base.join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    mode(&sticky, 0o1777);
    let mine = sticky.join("mine");
    std::fs::create_dir(&mine).unwrap();
    mode(&mine, 0o755);
    let (code, err) = check(&mine);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not installed in"), "{err}");

    if root_or_skip("cache_directories_others_could_write_are_refused (another user's)") {
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        mode(&theirs, 0o755);
        let n = nobody();
        std::os::unix::fs::chown(&theirs, Some(n.uid), Some(n.gid)).unwrap();
        refused(
            &theirs,
            &format!("belongs to uid {}, not to this user", n.uid),
        );

        // A symbolic link above the cache directory is judged itself, not by what it leads
        // to: another user's link to a directory of ours could be repointed by that user.
        let ours = base.join("ours");
        std::fs::create_dir(&ours).unwrap();
        mode(&ours, 0o755);
        std::fs::create_dir(ours.join("mine")).unwrap();
        mode(&ours.join("mine"), 0o755);
        let their_link = base.join("their-link");
        std::os::unix::fs::symlink(&ours, &their_link).unwrap();
        std::os::unix::fs::lchown(&their_link, Some(n.uid), Some(n.gid)).unwrap();
        refused(
            &their_link.join("mine"),
            &format!(
                "{}, above the cache directory, belongs to uid {}",
                their_link.display(),
                n.uid
            ),
        );
    }

    // ... and what a link of ours leads to is judged too.
    let open_target = base.join("open-target");
    std::fs::create_dir(&open_target).unwrap();
    std::fs::create_dir(open_target.join("mine")).unwrap();
    mode(&open_target.join("mine"), 0o755);
    mode(&open_target, 0o777);
    let our_link = base.join("our-link");
    std::os::unix::fs::symlink(&open_target, &our_link).unwrap();
    refused(
        &our_link.join("mine"),
        &format!(
            "{}, above the cache directory, is writable by others",
            open_target.display()
        ),
    );
    let _ = std::fs::remove_dir_all(&base);
}
