//! The exports open in the tools they are for, checked by independent readers: Python's own
//! pickle plus MemoryViz's opcode whitelist (and PyTorch's `_memory_viz` when torch is
//! installed), a hand-written protobuf decoder for Perfetto, JSON for Chrome, and headless
//! Chromium for the HTML report. Each check says clearly when its tool is missing and skips.

mod common;
use common::*;
use std::process::Command;

fn setup() -> vramshim_testkit::TempDir {
    let d = scratch("viewers");
    synth(&d, "t.vramtrace", &["--events", "4000"]);
    d
}

fn py(script: &str, arg: &std::path::Path) {
    py_args(script, arg, &[])
}

fn py_args(script: &str, arg: &std::path::Path, extra: &[&str]) {
    let Some(py) = python() else {
        assert!(
            !viewers_required(),
            "VRAMSHIM_REQUIRE_VIEWERS=1 but no python3 (or VRAMSHIM_TEST_PYTHON) runs"
        );
        eprintln!("SKIP: python3 not found; cannot check {}", arg.display());
        return;
    };
    let out = Command::new(py)
        .arg(manifest_dir().join("tests/py").join(script))
        .arg(arg)
        .args(extra)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    eprintln!("{so}{se}");
    assert!(
        out.status.success(),
        "{script} failed on {}:\n{so}\n{se}",
        arg.display()
    );
}

#[test]
fn memory_viz_pickle_is_what_the_viewer_reads() {
    let d = setup();
    ok(
        &d,
        &[
            "export",
            "t.vramtrace",
            "--format",
            "memory-viz",
            "-o",
            "t.pickle",
        ],
    );
    py("check_memviz.py", &d.join("t.pickle"));
    if let Some(traces) = shared_traces() {
        let f = traces.join("bert_serve.rmm.csv");
        ok(
            &d,
            &[
                "export",
                f.to_str().unwrap(),
                "--format",
                "memory-viz",
                "-o",
                "bert.pickle",
            ],
        );
        py("check_memviz.py", &d.join("bert.pickle"));
    }
}

#[test]
fn perfetto_parses_independently() {
    let d = setup();
    ok(
        &d,
        &[
            "export",
            "t.vramtrace",
            "--format",
            "perfetto",
            "-o",
            "t.pftrace",
        ],
    );
    // Every call site the summary finds names its allocations with a `site` annotation.
    let out = ok(&d, &["summary", "--json", "--top", "1000", "t.vramtrace"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sites = v["traces"][0]["devices"][0]["top_sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["allocs"].as_u64() > Some(0))
        .count();
    assert!(sites > 10, "{sites}");
    py_args(
        "check_perfetto.py",
        &d.join("t.pftrace"),
        &[&sites.to_string()],
    );
}

#[test]
fn chrome_json_is_json_with_counters_and_slices() {
    let d = setup();
    ok(
        &d,
        &[
            "export",
            "t.vramtrace",
            "--format",
            "chrome-json",
            "-o",
            "t.json",
        ],
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("t.json")).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "C" && e["args"]["in_use"].is_u64())
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "C" && e["args"]["reserved"].is_u64())
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "X" && e["name"] == "cudaMallocAsync")
    );
    assert!(
        evs.iter()
            .any(|e| e["ph"] == "i" && e["name"] == "cap refusal")
    );
}

fn chromium() -> Option<String> {
    for c in [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "headless_shell",
    ] {
        if Command::new(c)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            return Some(c.to_string());
        }
    }
    None
}

#[test]
fn report_renders_in_headless_chromium() {
    let d = setup();
    ok(&d, &["report", "t.vramtrace", "-o", "report.html"]);
    let Some(browser) = chromium() else {
        assert!(
            !viewers_required(),
            "VRAMSHIM_REQUIRE_VIEWERS=1 but no chromium found (apt-get install chromium)"
        );
        eprintln!(
            "SKIP: no chromium found (apt-get install chromium); the report's DOM was not rendered"
        );
        return;
    };
    let url = format!("file://{}", d.join("report.html").display());
    let base = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--allow-file-access-from-files",
    ];
    let out = Command::new(&browser)
        .args(base)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "chart timeline",
        "in-use",
        "reserved",
        "chart histogram",
        "chart sites",
        "chart live-at-peak",
        "post-mortem",
    ] {
        assert!(
            dom.contains(needle),
            "rendered DOM lacks {needle} (browser said: {})",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shot = d.join("report.png");
    let _ = Command::new(&browser)
        .args(base)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1100,2200")
        .arg(&url)
        .output();
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false),
        "no screenshot at {}",
        shot.display()
    );
    eprintln!("screenshot: {}", shot.display());
}
