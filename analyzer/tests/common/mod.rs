//! Helpers shared by the analyzer's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// each test crate compiles this module and uses what it needs of it
#[allow(unused_imports)]
pub use vramshim_testkit::records::{memop, write_trace};

pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_vramshim")
}

/// Panics with the command to run when `libvramshim.so` is not built beside the command.
pub fn built_library() {
    let lib = Path::new(exe()).parent().unwrap().join("libvramshim.so");
    assert!(
        lib.is_file(),
        "{} is not built: build the workspace first (cargo build --release --workspace, as scripts/test does)",
        lib.display()
    );
}

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn data(name: &str) -> PathBuf {
    manifest_dir().join("tests/data").join(name)
}

/// The real RMM traces, when the shared folder sits beside the clone (as in CI).
pub fn shared_traces() -> Option<PathBuf> {
    let p = manifest_dir().join("../../shared/traces");
    if p.join("vit_train.rmm.csv").exists() {
        Some(p)
    } else {
        None
    }
}

/// A fresh scratch directory under the target dir, removed (with what the test made in it)
/// when dropped, also when the test panics.
pub fn scratch(name: &str) -> vramshim_testkit::TempDir {
    vramshim_testkit::TempDir::new_in(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &format!("analyzer-{name}"),
    )
}

pub fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(exe())
        .args(args)
        .current_dir(dir)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .output()
        .expect("run vramshim")
}

pub fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = run_in(dir, args);
    assert!(
        out.status.success(),
        "vramshim {args:?} failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A deterministic synthetic trace written into `dir` as `name`.
pub fn synth(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["synth", "-o", name];
    args.extend_from_slice(extra);
    ok(dir, &args);
    dir.join(name)
}

/// Compares `actual` with the checked-in golden file; VRAMSHIM_UPDATE_GOLDEN=1 rewrites it.
pub fn golden(name: &str, actual: &[u8]) {
    let path = manifest_dir().join("tests/golden").join(name);
    if std::env::var_os("VRAMSHIM_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|_| {
        panic!(
            "golden file {} missing: run with VRAMSHIM_UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let fresh = path.with_extension(format!(
            "{}.actual",
            path.extension().and_then(|e| e.to_str()).unwrap_or("")
        ));
        let _ = std::fs::write(&fresh, actual);
        panic!(
            "{} differs from the golden file (new output in {}; VRAMSHIM_UPDATE_GOLDEN=1 accepts it)",
            path.display(),
            fresh.display()
        );
    }
}

/// The Python that runs the viewer checks: `VRAMSHIM_TEST_PYTHON` (CI points it at an
/// environment with torch installed) or `python3`.
pub fn python() -> Option<String> {
    let py = std::env::var("VRAMSHIM_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .arg("-c")
        .arg("import pickle, pickletools, json")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then_some(py)
}

/// True when a missing viewer (Python, torch, Chromium) must fail the test instead of
/// skipping it: `.ci/run` installs them and sets `VRAMSHIM_REQUIRE_VIEWERS=1`, so that CI
/// shows the exports open in the real tools rather than passing on a skip.
pub fn viewers_required() -> bool {
    std::env::var("VRAMSHIM_REQUIRE_VIEWERS").is_ok_and(|v| v == "1")
}

/// Writes `source` to `dir/NAME.c` and builds `dir/NAME` with `cc ... -ldl` (the test programs
/// dlopen the CUDA runtime, as frameworks do).
pub fn compile_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .expect("cc (gcc) is needed to build a test program");
    assert!(st.success(), "cc failed on {}", src.display());
    exe
}
