//! `vramshim demo` writes vramshim-demo.html: it renders in headless Chromium (a screenshot is
//! left in the target directory) with its table and charts present.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const VRAMSHIM: &str = env!("CARGO_BIN_EXE_vramshim");

fn profile_dir() -> PathBuf {
    Path::new(VRAMSHIM).parent().unwrap().to_path_buf()
}

/// A headless Chromium, installed with apt-get when missing and possible.
fn chromium() -> Option<PathBuf> {
    let find = || {
        [
            "chromium",
            "chromium-browser",
            "google-chrome",
            "headless_shell",
        ]
        .iter()
        .find_map(|n| {
            let o = Command::new("sh")
                .args(["-c", &format!("command -v {n}")])
                .output()
                .ok()?;
            let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
            (o.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
        })
    };
    if let Some(p) = find() {
        return Some(p);
    }
    eprintln!("chromium not found; trying: apt-get install -y chromium");
    let _ = Command::new("sh")
        .args([
            "-c",
            "command -v apt-get >/dev/null && [ \"$(id -u)\" = 0 ] && \
             (timeout 600 apt-get install -y -qq chromium || \
              (timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq chromium))",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    find()
}

#[test]
fn demo_report_renders_in_headless_chromium_with_charts() {
    if !profile_dir().join("libvramshim.so").exists() {
        panic!(
            "{} is not built: build the workspace first (cargo build --release --workspace, as scripts/test does)",
            profile_dir().join("libvramshim.so").display()
        );
    }
    let dir = profile_dir().join("demo-html-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("vramshim-demo.html");
    let o = Command::new(VRAMSHIM)
        .arg("demo")
        .arg("-o")
        .arg(&html)
        .arg("--work-dir")
        .arg(dir.join("work"))
        .env_remove("VRAMSHIM_LIB")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "vramshim demo failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(text.contains("id=\"demo-table\""));
    assert!(
        text.contains("id=\"memory-chart\""),
        "the memory chart is in the page"
    );
    assert!(
        text.contains("class=\"chart timeline\""),
        "the analyzer's report of the runs' traces (memory over time) is in the page"
    );

    let Some(chrome) = chromium() else {
        eprintln!(
            "SKIPPED the Chromium rendering: no chromium and it could not be installed (apt-get install chromium)"
        );
        return;
    };
    let shot = profile_dir().join("vramshim-demo-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let url = format!("file://{}", html.display());
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
    ];
    let o = Command::new(&chrome)
        .args(common)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,1400")
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        shot.is_file(),
        "no screenshot from {}: {}",
        chrome.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    assert!(
        png.len() > 20_000,
        "the screenshot is not blank ({} bytes)",
        png.len()
    );
    println!("screenshot of vramshim-demo.html: {}", shot.display());

    // What the browser actually rendered: the charts' SVG elements with their bars.
    let o = Command::new(&chrome)
        .args(common)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&o.stdout);
    for id in ["demo-table", "memory-chart", "calls-chart"] {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "{id} missing from the rendered page"
        );
    }
    let bars = dom.matches("<rect").count();
    assert!(bars >= 8, "the charts have bars ({bars} rect elements)");
}
