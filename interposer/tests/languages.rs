//! Other languages and processes: Python ctypes, a Rust cudarc program, a CPython process
//! importing numpy (no CUDA at all), and the debug log / stats dump.

mod common;

use common::{both, build, json_num, lib, preloaded};
use std::path::PathBuf;
use std::process::Command;
use vramshim_testkit::{
    Link, profile_dir, repo_root, run, run_with_preload, sim_command, temp_dir,
};

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn python_ctypes_on_libcudart() {
    let script = repo_root().join("tests/workloads/interposer/ctypes_app.py");
    let py = PathBuf::from(python());
    let (_, pre) = both(&py, &[script.to_str().unwrap()], &[], "ip-ctypes");
    assert!(pre.stdout.contains("ctypes: ok"), "{}", pre.stdout);
}

#[test]
fn rust_cudarc_program() {
    let exe = profile_dir().join("cudarc-app");
    if !exe.exists() {
        panic!(
            "{} is not built: cargo build --release -p cudarc-app",
            exe.display()
        );
    }
    let dir = temp_dir("cudarc-stats");
    let stats = dir.join("stats.json");
    let stats_s = stats.display().to_string();
    let (_, pre) = both(
        &exe,
        &["4096"],
        &[("VRAMSHIM_STATS", &stats_s)],
        "ip-cudarc",
    );
    assert!(pre.stdout.contains("cudarc-app: ok"), "{}", pre.stdout);
    let j = std::fs::read_to_string(&stats).expect("stats dump");
    // cudarc allocated (driver or stream-ordered) and freed everything it allocated.
    let allocs =
        json_num(&j, "cuMemAlloc").unwrap_or(0) + json_num(&j, "cuMemAllocAsync").unwrap_or(0);
    assert!(allocs >= 3, "{j}");
    assert_eq!(json_num(&j, "live_entries"), Some(0), "{j}");
    assert_eq!(json_num(&j, "unknown_frees"), Some(0), "{j}");
    assert_eq!(json_num(&j, "panics"), Some(0), "{j}");
}

/// numpy from the package registry, installed into a cache outside the clone if missing.
fn numpy_path() -> Option<String> {
    let ok = |pp: Option<&str>| {
        let mut c = Command::new(python());
        c.args(["-c", "import numpy"]);
        if let Some(p) = pp {
            c.env("PYTHONPATH", p);
        }
        c.output().map(|o| o.status.success()).unwrap_or(false)
    };
    if ok(None) {
        return Some(String::new());
    }
    let home = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|_| std::env::temp_dir());
    let cache = home.join("vramshim/test-python-numpy");
    let cs = cache.display().to_string();
    if ok(Some(&cs)) {
        return Some(cs);
    }
    let st = Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
        ])
        .arg(&cache)
        .arg("numpy")
        .status();
    if st.map(|s| s.success()).unwrap_or(false) && ok(Some(&cs)) {
        Some(cs)
    } else {
        None
    }
}

#[test]
fn cpython_numpy_identical_with_and_without_preload() {
    let Some(pp) = numpy_path() else {
        eprintln!(
            "SKIP: numpy is not installed and the package registry is unreachable (pip install numpy failed)"
        );
        return;
    };
    let code = "import numpy as np, os, sys\n\
                a = np.arange(1_000_000, dtype=np.float64)\n\
                m = np.random.default_rng(7).standard_normal((200, 200))\n\
                print(a.sum(), float(np.linalg.det(m @ m.T + np.eye(200)) > 0), np.sort(a[::-1])[:3], np.__version__)\n\
                print(sorted(k for k in os.environ if k.startswith('VRAMSHIM')))\n";
    let mut env: Vec<(&str, &str)> = vec![];
    if !pp.is_empty() {
        env.push(("PYTHONPATH", &pp));
    }
    let py = PathBuf::from(python());
    let plain = run_with_preload(&py, &["-c", code], &env, None, "ip-numpy");
    let pre = run_with_preload(&py, &["-c", code], &env, Some(&lib()), "ip-numpy");
    plain.assert_success();
    pre.assert_success();
    assert_eq!(plain.stdout, pre.stdout);
    assert_eq!(plain.stderr, pre.stderr, "the preload wrote to stderr");
}

#[test]
fn process_without_cuda_unchanged() {
    // A shell pipeline with children: identical output and status, nothing on stderr.
    let script = "echo start; ls / | wc -l; (exit 3)";
    let run_sh = |preload: bool| {
        let mut c = sim_command("/bin/sh", "ip-nocuda");
        c.args(["-c", script]);
        if preload {
            c.env("LD_PRELOAD", lib());
        }
        run(&mut c)
    };
    let a = run_sh(false);
    let b = run_sh(true);
    assert_eq!(a.code(), Some(3));
    assert_eq!(a.code(), b.code());
    assert_eq!(a.stdout, b.stdout);
    assert_eq!(b.stderr, "");
}

#[test]
fn debug_log_explains_every_request() {
    let exe = build(
        "alloc_suite_log",
        "alloc_suite.c",
        Link::SharedRuntime,
        &["-DLAYER_RUNTIME=1"],
    );
    let out = preloaded(&exe, &[], &[("VRAMSHIM_LOG", "debug")], "ip-log");
    out.assert_success();
    let lines: Vec<&str> = out.stderr.lines().collect();
    let mallocs = lines
        .iter()
        .filter(|l| l.contains("debug: cudaMalloc size=") && l.ends_with("[real]"))
        .count();
    assert_eq!(mallocs, 10, "{}", out.stderr);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("debug: cudaFree addr=") && l.contains("-> 0 [real]")),
        "{}",
        out.stderr
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cudaMallocHost size=8192 dev=-1"))
    );
    assert!(lines.iter().any(|l| l.contains("debug: exit:")));
    // Default level: silent.
    let quiet = preloaded(&exe, &[], &[], "ip-log");
    assert!(!quiet.stderr.contains("vramshim["), "{}", quiet.stderr);
    // A bad value: one warning line, then business as usual.
    let bad = preloaded(&exe, &[], &[("VRAMSHIM_LOG", "loud")], "ip-log");
    bad.assert_success();
    assert_eq!(
        bad.stderr
            .lines()
            .filter(|l| l.contains("VRAMSHIM_LOG"))
            .count(),
        1,
        "{}",
        bad.stderr
    );
}

#[test]
fn stats_dump_at_exit() {
    let exe = build(
        "alloc_suite_stats",
        "alloc_suite.c",
        Link::SharedRuntime,
        &["-DLAYER_RUNTIME=1"],
    );
    let dir = temp_dir("stats");
    let pattern = dir.join("s-%p.json").display().to_string();
    let out = preloaded(&exe, &[], &[("VRAMSHIM_STATS", &pattern)], "ip-stats");
    out.assert_success();
    let f = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with("s-"))
        .expect("stats file");
    let j = std::fs::read_to_string(f.path()).unwrap();
    assert_eq!(json_num(&j, "cudaMalloc"), Some(10), "{j}");
    assert_eq!(json_num(&j, "live_entries"), Some(0), "{j}");
    assert!(j.contains("\"0\":{\"live_bytes\":0"), "{j}");
}
