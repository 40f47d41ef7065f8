//! Running programs on the simulated GPU.

use crate::{sim_dir, unique_name};
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, ExitStatus};

/// Environment for a program on the simulated GPU: `LD_LIBRARY_PATH=<sim_dir>` (prepended
/// to any existing value) and `VRAMSIM_NAME=<unique_name(name)>`, so the test has a simulated
/// device of its own. Other `VRAMSIM_*` knobs (e.g. `VRAMSIM_MEMORY`) are the caller's to add.
pub fn sim_env(name: &str) -> Vec<(String, String)> {
    let sim = sim_dir().display().to_string();
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{sim}:{old}"),
        _ => sim,
    };
    vec![
        ("LD_LIBRARY_PATH".into(), ld),
        ("VRAMSIM_NAME".into(), unique_name(name)),
    ]
}

/// The variable whose `NAME=VALUE;NAME=VALUE` pairs [`sim_command`] hands to every program it
/// starts (after removing the inherited `VRAMSHIM_*`), so that a fault switch reaches the
/// programs a test spawns: `VRAMSHIM_TEST_PASS="VRAMSHIM_CAP_FAULT=racy-charge" cargo test ...`.
pub const PASS_VAR: &str = "VRAMSHIM_TEST_PASS";

/// The pairs of a [`PASS_VAR`] value: `NAME=VALUE` separated by `;` (empty parts skipped), each
/// name a `VRAMSHIM_*` or `VRAMSIM_*` variable. Err: one line saying what is wrong and the
/// accepted form.
pub fn parse_pass(value: &str) -> Result<Vec<(String, String)>, String> {
    let form = "accepted: NAME=VALUE pairs separated by ';', each NAME a VRAMSHIM_* or VRAMSIM_* \
                variable (VRAMSHIM_CAP_FAULT=racy-charge;VRAMSIM_DEVSTATE_FAULT=pause)";
    let mut out = Vec::new();
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(format!(
                "{PASS_VAR}=\"{}\": \"{}\" has no '='; {form}",
                value.escape_debug(),
                part.escape_debug()
            ));
        };
        let k = k.trim();
        let named = |p: &str| k.strip_prefix(p).is_some_and(|r| !r.is_empty());
        let chars = k
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !(named("VRAMSHIM_") || named("VRAMSIM_")) || !chars || k == PASS_VAR {
            return Err(format!(
                "{PASS_VAR}=\"{}\": \"{}\" is not a VRAMSHIM_* or VRAMSIM_* variable; {form}",
                value.escape_debug(),
                k.escape_debug()
            ));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

/// The pairs of [`PASS_VAR`] in the test process's environment (none when unset). A value that
/// cannot be read stops the test with one line: a fault demonstration that silently did not
/// reach the programs would pass for the wrong reason.
#[track_caller]
pub fn pass_through() -> Vec<(String, String)> {
    match std::env::var_os(PASS_VAR) {
        None => Vec::new(),
        Some(v) => match v.to_str().map(parse_pass) {
            Some(Ok(p)) => p,
            Some(Err(line)) => panic!("{line}"),
            None => panic!("{PASS_VAR} is not UTF-8 text: {v:?}"),
        },
    }
}

/// A `Command` for `exe` with [`sim_env`]`(name)` applied and `VRAMSHIM_*`/`LD_PRELOAD`
/// removed from the inherited environment (tests start from a clean state), then the pairs
/// of [`PASS_VAR`] set (what the test sets itself afterwards wins).
pub fn sim_command(exe: impl AsRef<OsStr>, name: &str) -> Command {
    let mut c = Command::new(exe);
    for (k, _) in std::env::vars_os() {
        let n = k.as_encoded_bytes();
        if n.starts_with(b"VRAMSHIM_") || n.starts_with(b"VRAMSIM_") || n == b"LD_PRELOAD" {
            c.env_remove(k);
        }
    }
    c.envs(sim_env(name));
    c.envs(pass_through());
    c
}

/// Adds `lib` to the command's `LD_PRELOAD`.
pub fn preload<'a>(cmd: &'a mut Command, lib: &Path) -> &'a mut Command {
    cmd.env("LD_PRELOAD", lib)
}

/// What a finished program did.
#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    /// Exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Signal that killed it, if any.
    pub fn signal(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(&self.status)
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the full output unless the program exited 0.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.success(),
            "program failed ({:?}):\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// The value of `key=` in the last stdout line that starts with `prefix`, e.g.
    /// `field("replay:", "peak_live")`.
    pub fn field(&self, prefix: &str, key: &str) -> Option<String> {
        let line = self.stdout.lines().rev().find(|l| l.starts_with(prefix))?;
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    }
}

/// Runs the command to completion, capturing stdout and stderr.
#[track_caller]
pub fn run(cmd: &mut Command) -> RunOutput {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    RunOutput {
        status: o.status,
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs `exe args` on the simulated GPU ([`sim_command`] with `name`), with `env` added and,
/// if given, `preload` in `LD_PRELOAD` (usually [`crate::interposer_lib`]).
#[track_caller]
pub fn run_with_preload(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    preload_lib: Option<&Path>,
    name: &str,
) -> RunOutput {
    let mut c = sim_command(exe, name);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    if let Some(l) = preload_lib {
        preload(&mut c, l);
    }
    run(&mut c)
}
