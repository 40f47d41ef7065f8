//! The harness the cap's end-to-end tests share (`mod common;` in each): the probe
//! (tests/workloads/cap/cap_probe.c) built once per test process, run on a simulated device
//! of its own, and its `key=value` lines read back.

// Each test file uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use vramshim_testkit::{Link, RunOutput, compile_c, interposer_lib, run, sim_command, unique_name};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// The built `libvramshim.so`, which must exist (checked; whether it is up to date is not).
pub fn lib() -> PathBuf {
    interposer_lib()
}

/// cap_probe linked against the simulated `libcudart.so.12`, built once per test process.
pub fn probe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        lib();
        compile_c(
            "cap_probe",
            &["tests/workloads/cap/cap_probe.c"],
            Link::SharedRuntime,
        )
    })
    .clone()
}

/// Runs the probe on a simulated device of its own (`VRAMSIM_NAME` unique to the call, its
/// state file removed afterwards), with what `setup` adds (arguments, variables, preload).
pub fn probe_on_sim(name: &str, setup: impl FnOnce(&mut Command)) -> RunOutput {
    let sim = unique_name(name);
    let mut c = sim_command(probe(), name);
    c.env("VRAMSIM_NAME", &sim);
    setup(&mut c);
    let out = run(&mut c);
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&sim));
    out
}

/// `key=value` pairs of the stdout line starting with `prefix` (and holding `has`).
pub fn fields(out: &RunOutput, prefix: &str, has: &str) -> Vec<(String, String)> {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with(prefix) && l.contains(has))
        .unwrap_or_else(|| panic!("no line {prefix}..{has} in\n{}\n{}", out.stdout, out.stderr));
    line.split_whitespace()
        .filter_map(|w| {
            w.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The number `key` of [`fields`]' pairs.
pub fn num(f: &[(String, String)], key: &str) -> u64 {
    f.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .1
        .parse()
        .unwrap()
}
