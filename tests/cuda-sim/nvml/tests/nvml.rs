//! The simulated NVML reports the simulated device's own accounting (every process's use).
//!
//! Needs both libraries built in this profile:
//! `cargo build --release -p vramsim-driver -p vramsim-nvml`.

use std::path::Path;
use std::process::{Command, Output};

fn setup() -> (std::path::PathBuf, std::path::PathBuf) {
    static DONE: std::sync::OnceLock<(std::path::PathBuf, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    DONE.get_or_init(build).clone()
}

fn build() -> (std::path::PathBuf, std::path::PathBuf) {
    let profile = vramshim_testkit::profile_dir();
    let dir = profile.join("vramsim-nvml-tests");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, built) in [
        ("libnvidia-ml.so.1", "libvramsim_nvml.so"),
        ("libcuda.so.1", "libvramsim_driver.so"),
    ] {
        let built = profile.join(built);
        assert!(
            built.exists(),
            "{} is missing: run `cargo build --release -p vramsim-driver -p vramsim-nvml` first",
            built.display()
        );
        let tmp = dir.join(format!("{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&built, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/nvcheck.c");
    let exe = dir.join("nvcheck");
    let tmp = dir.join(format!("nvcheck.{}", std::process::id()));
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap();
    (dir, exe)
}

fn run(name: &str, hold_mib: u64) -> Output {
    run_with(name, hold_mib, "1GiB")
}

fn run_with(name: &str, hold_mib: u64, memory: &str) -> Output {
    run_args(name, &[&hold_mib.to_string()], memory)
}

fn run_args(name: &str, args: &[&str], memory: &str) -> Output {
    let (dir, exe) = setup();
    let out = Command::new(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("VRAMSIM_NAME", name)
        .env("VRAMSIM_MEMORY", memory)
        .env("VRAMSIM_CONTEXT_OVERHEAD", "100MiB")
        .env_remove("LD_PRELOAD")
        .env_remove("VRAMSIM_DEVICES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvcheck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn field(out: &Output, key: &str) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key}"))
}

const MIB: u64 = 1 << 20;

#[test]
fn nvml_reports_the_devices_own_accounting() {
    let name = format!("nvmltest-{}", std::process::id());
    // This process holds 200 MiB + its context (100 MiB) while it asks NVML.
    let out = run(&name, 200);
    assert_eq!(field(&out, "count"), "1");
    assert_eq!(field(&out, "total").parse::<u64>().unwrap(), 1024 * MIB);
    assert_eq!(field(&out, "used").parse::<u64>().unwrap(), 300 * MIB);
    assert_eq!(field(&out, "free").parse::<u64>().unwrap(), 724 * MIB);
    assert_eq!(field(&out, "procs"), "1");
    assert!(field(&out, "uuid").starts_with("GPU-"));
    assert!(field(&out, "name").contains("vramsim"));
    // Without any CUDA process the device is empty (the earlier one exited).
    let out = run(&name, 0);
    assert_eq!(field(&out, "used"), "0");
    assert_eq!(field(&out, "procs"), "0");
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&name));
}

#[test]
fn a_bad_value_is_reported_once_per_process() {
    for hold in [0, 10] {
        // hold 0: NVML alone reports it; hold 10: the driver did, NVML stays quiet.
        let name = format!("nvmltest-bad-{}-{hold}", std::process::id());
        let out = run_with(&name, hold, "plenty");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains("VRAMSIM_MEMORY"), "{err}");
        assert_eq!(field(&out, "total").parse::<u64>().unwrap(), 16 << 30);
        let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&name));
    }
    // NVML read the variables first: the driver loaded later stays quiet.
    let name = format!("nvmltest-bad-first-{}", std::process::id());
    let out = run_args(&name, &["10", "nvml-first"], "plenty");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&name));
}

/// `nvmlDeviceGetMemoryLimits_v1` answers `VRAMSIM_NVML_MEMORY_LIMITS` (NOT_SUPPORTED for a
/// device without limits, as a driver without the feature would); `nvmlDeviceSetMemoryLimits_v1`
/// changes them; bad arguments are refused.
#[test]
fn memory_limits_are_served_and_set() {
    let (dir, exe) = setup();
    let name = format!("nvlimits-{}", std::process::id());
    let out = Command::new(exe)
        .arg("limits")
        .env("LD_LIBRARY_PATH", dir)
        .env("VRAMSIM_NAME", &name)
        .env("VRAMSIM_DEVICES", "2")
        .env("VRAMSIM_NVML_MEMORY_LIMITS", "0=1GiB/512MiB")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(vramsim_devstate::DeviceState::path(&name));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nvcheck: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("get0=0 soft=536870912 hard=1073741824"),
        "{text}"
    );
    assert!(text.contains("get1=3"), "{text}");
    assert!(text.contains("after soft=1048576 hard=2097152"), "{text}");
}
