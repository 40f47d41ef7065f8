//! The `vramshim` command's test switches (`VRAMSHIM_FILES_FAULT`, `VRAMSHIM_RUN_FAULT`): a
//! misspelt name is said once, in one line naming the variable, the name, the accepted names
//! and the default taken, and the command goes on with the default (its checks on).

mod common;
use common::*;

use std::process::Command;

#[test]
fn a_misspelt_fault_switch_is_said_once_and_the_checks_stay_on() {
    let d = scratch("switch-typo");
    synth(&d, "t.vramtrace", &[]);
    std::fs::write(d.join("victim"), b"precious\n").unwrap();
    std::os::unix::fs::symlink(d.join("victim"), d.join("out.json")).unwrap();
    let out = Command::new(exe())
        .args([
            "export",
            "t.vramtrace",
            "--format",
            "chrome-json",
            "-o",
            "out.json",
        ])
        .current_dir(&d)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .env("VRAMSHIM_FILES_FAULT", "unsfe")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err
        .lines()
        .filter(|l| l.contains("VRAMSHIM_FILES_FAULT"))
        .collect();
    assert_eq!(lines.len(), 1, "one line wanted:\n{err}");
    assert!(
        lines[0].contains(
            "VRAMSHIM_FILES_FAULT: the name \"unsfe\" is read by no part of vramshim (a test-only switch: a comma-separated list); accepted: unsafe; ignoring it: no fault is switched on by it (the default)"
        ),
        "{err}"
    );
    // the default taken: the output's checks are on, the planted symlink is refused
    assert!(!out.status.success(), "{err}");
    assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"precious\n");
    assert!(err.contains("out.json"), "{err}");
}
