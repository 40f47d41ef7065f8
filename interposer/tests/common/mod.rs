//! Helpers shared by the interposer's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use vramshim_testkit::{Link, RunOutput, compile_c_to, run_with_preload, temp_dir};

/// `tests/workloads/interposer/<file>` relative to the repository root.
pub fn src(file: &str) -> String {
    format!("tests/workloads/interposer/{file}")
}

/// Compile one of our C workloads (`-I tests/workloads/interposer` for vs.h).
pub fn build(name: &str, file: &str, link: Link, extra: &[&str]) -> PathBuf {
    let out = temp_dir(name).join(name);
    let inc = format!(
        "-I{}",
        vramshim_testkit::repo_root()
            .join("tests/workloads/interposer")
            .display()
    );
    let mut args: Vec<&str> = vec![&inc];
    args.extend_from_slice(extra);
    compile_c_to(&out, &[&src(file)], link, &args);
    out
}

pub fn lib() -> PathBuf {
    vramshim_testkit::interposer_lib()
}

/// Run `exe` on the simulated GPU without and with the preload (each on its own simulated
/// device), assert both succeed with identical stdout, and return (plain, preloaded).
#[track_caller]
pub fn both(exe: &Path, args: &[&str], env: &[(&str, &str)], name: &str) -> (RunOutput, RunOutput) {
    let plain = run_with_preload(exe, args, env, None, name);
    plain.assert_success();
    let pre = run_with_preload(exe, args, env, Some(&lib()), name);
    pre.assert_success();
    assert_eq!(
        plain.stdout, pre.stdout,
        "stdout differs with the preload\n--- plain stderr\n{}\n--- preloaded stderr\n{}",
        plain.stderr, pre.stderr
    );
    (plain, pre)
}

/// Build `file` as `name` and run it with and without the preload ([`both`]).
#[track_caller]
pub fn build_both(
    name: &str,
    file: &str,
    link: Link,
    extra: &[&str],
    env: &[(&str, &str)],
    sim: &str,
) -> (RunOutput, RunOutput) {
    let exe = build(name, file, link, extra);
    both(&exe, &[], env, sim)
}

/// Run with the preload only.
#[track_caller]
pub fn preloaded(exe: &Path, args: &[&str], env: &[(&str, &str)], name: &str) -> RunOutput {
    run_with_preload(exe, args, env, Some(&lib()), name)
}

/// Every one of `lines` is in the run's stdout.
#[track_caller]
pub fn assert_lines(out: &RunOutput, lines: &[&str]) {
    for line in lines {
        assert!(
            out.stdout.contains(line),
            "missing {line:?} in\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

/// A `"key":number` value from a stats JSON dump.
pub fn json_num(json: &str, key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let i = json.find(&pat)? + pat.len();
    let rest = &json[i..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
