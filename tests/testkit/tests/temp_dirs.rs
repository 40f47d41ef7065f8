//! The test kit's scratch directories leave nothing behind: a [`TempDir`] is removed when
//! dropped, also when its test panics, and what a test process keeps for its whole life (a
//! `static` guard, [`temp_dir`]) is removed when it exits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use vramshim_testkit::{TempDir, live_temp_dirs, temp_dir};

/// Fills `d` with a file, a nested directory and one its owner cannot write (as a test that
/// checks a refusal leaves it).
fn fill(d: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(d.join("f"), b"x").unwrap();
    let sub = d.join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("g"), b"y").unwrap();
    std::fs::set_permissions(d.join("a"), std::fs::Permissions::from_mode(0o500)).unwrap();
}

#[test]
fn a_temp_dir_is_private_and_removed_when_dropped() {
    use std::os::unix::fs::PermissionsExt;
    let d = TempDir::new("kit-drop");
    let p = d.path().to_path_buf();
    assert!(
        p.starts_with(std::env::temp_dir()),
        "{} is not in the temporary directory",
        p.display()
    );
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("vramshim-kit-drop-"), "{name}");
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", p.display());
    fill(&d);
    assert!(live_temp_dirs().contains(&p));
    drop(d);
    assert!(!p.exists(), "{} left behind", p.display());
    assert!(
        !live_temp_dirs().contains(&p),
        "still listed for removal at exit"
    );
}

#[test]
fn a_temp_dir_is_removed_when_its_test_panics() {
    let seen: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let r = std::panic::catch_unwind(|| {
        let d = TempDir::new("kit-panic");
        fill(&d);
        *seen.lock().unwrap() = Some(d.to_path_buf());
        panic!("the test fails");
    });
    assert!(r.is_err());
    let p = seen
        .lock()
        .unwrap()
        .clone()
        .expect("the directory was made");
    assert!(
        !p.exists(),
        "{} left behind by a panicking test",
        p.display()
    );
}

/// Set in the child run of [`what_a_process_keeps_is_removed_when_it_exits`].
const CHILD: &str = "VRAMSHIM_TESTKIT_TEMP_CHILD";

#[test]
fn what_a_process_keeps_is_removed_when_it_exits() {
    if std::env::var_os(CHILD).is_some() {
        // The child: a guard kept for the process's life, and a directory of the target dir.
        static KEPT: OnceLock<TempDir> = OnceLock::new();
        let kept = KEPT.get_or_init(|| TempDir::new("kit-static"));
        fill(kept);
        let scratch = temp_dir("kit-scratch");
        fill(&scratch);
        println!("KEPT={}", kept.display());
        println!("SCRATCH={}", scratch.display());
        return;
    }
    let me = std::env::current_exe().unwrap();
    let o = Command::new(me)
        .args([
            "--exact",
            "what_a_process_keeps_is_removed_when_it_exits",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let path = |key: &str| {
        out.lines()
            .find_map(|l| l.find(key).map(|i| &l[i + key.len()..]))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("no {key} in the child's output:\n{out}"))
    };
    for p in [path("KEPT="), path("SCRATCH=")] {
        assert!(
            !p.exists(),
            "{} outlived the process that made it",
            p.display()
        );
    }
}
