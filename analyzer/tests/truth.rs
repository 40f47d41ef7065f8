//! Every figure true: traces made by real runs of a small CUDA program under the library on
//! the simulated GPU (`vramshim run --sim`), then read back by every command that prints them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::{compile_c, exe, scratch};

const MIB: u64 = 1 << 20;

/// Allocates each size given in bytes (in order, `cudaMalloc`), then frees them all; prints
/// `alloc I refused (CODE)` and exits 2 at the first refusal. `count` as the only argument:
/// asks for the number of devices and nothing else (exit 3 when that fails).
fn program() -> PathBuf {
    // The directory is kept with the program (removed when the test process exits).
    static EXE: OnceLock<(vramshim_testkit::TempDir, PathBuf)> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = scratch("truth-prog");
        let exe = compile_c(
            &dir,
            "sizes",
            r#"#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
int main(int argc, char **argv) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW);
    if (!h) { fprintf(stderr, "no libcudart.so.12: %s\n", dlerror()); return 1; }
    int (*m)(void **, size_t) = (int (*)(void **, size_t))dlsym(h, "cudaMalloc");
    int (*f)(void *) = (int (*)(void *))dlsym(h, "cudaFree");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "count") == 0) {
        int n = -1, rc = count(&n);
        printf("cudaGetDeviceCount: %d (%d devices)\n", rc, n);
        return rc == 0 ? 0 : 3;
    }
    void *p[64] = {0};
    int n = argc - first, rc = 0;
    for (int i = 0; i < n && i < 64; i++) {
        int e = m(&p[i], (size_t)strtoull(argv[first + i], 0, 10));
        if (e != 0) { printf("alloc %d refused (%d)\n", i, e); rc = 2; break; }
    }
    for (int i = 0; i < 64; i++)
        if (p[i]) f(p[i]);
    return rc;
}
"#,
        );
        (dir, exe)
    })
    .1
    .clone()
}

/// `vramshim run --sim ARGS -- program SIZES` in `dir`, with a fresh simulated device.
fn run_sim(dir: &Path, args: &[&str], env: &[(&str, &str)], sizes: &[u64]) -> Output {
    let sizes: Vec<String> = sizes.iter().map(u64::to_string).collect();
    run_sim_args(dir, args, env, &sizes)
}

fn run_sim_args(dir: &Path, args: &[&str], env: &[(&str, &str)], prog_args: &[String]) -> Output {
    let mut c = Command::new(exe());
    c.current_dir(dir)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .env_remove("VRAMSHIM_LIB")
        .env_remove("VRAMSHIM_LOG")
        .env(
            "VRAMSIM_NAME",
            format!("vramshim-truth-{}-{}", std::process::id(), dir.display()).replace('/', "_"),
        )
        .arg("run")
        .args(args)
        .arg("--")
        .arg(program())
        .args(prog_args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run vramshim")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn vramshim(dir: &Path, args: &[&str]) -> Output {
    common::run_in(dir, args)
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// Parses `12.3 MiB`-style figures back to bytes (to the printed precision).
fn parse_bytes(s: &str) -> f64 {
    let mut it = s.split_whitespace();
    let v: f64 = it.next().unwrap().parse().unwrap();
    let unit = it.next().unwrap_or("B");
    let k = match unit.trim_end_matches([';', ',', ')']) {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        u => panic!("unit {u}"),
    };
    v * k
}

/// The figure after `label` in `text` (e.g. "peak reserved " -> 14.0 MiB).
fn figure_after(text: &str, label: &str) -> Option<f64> {
    let at = text.find(label)? + label.len();
    let rest: Vec<&str> = text[at..].split_whitespace().take(2).collect();
    Some(parse_bytes(&rest.join(" ")))
}

#[test]
fn reserved_is_the_driver_footprint_exactly_and_never_below_in_use_anywhere() {
    let dir = scratch("truth-reserved");
    // 3 MiB -> 4 MiB of pages, three 1 MiB packed into 4 MiB (two shared pages), 5 MiB ->
    // 6 MiB: 14 MiB reserved for 11 MiB in use.
    let sizes = [3 * MIB, MIB, MIB, MIB, 5 * MIB];
    let o = run_sim(
        &dir,
        &["--sim", "--trace", "r.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "0")],
        &sizes,
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    // The launcher's line.
    let line = err
        .lines()
        .find(|l| l.contains("peak in use"))
        .unwrap_or_else(|| panic!("no peak line: {err}"));
    assert_eq!(
        figure_after(line, "peak in use "),
        Some(11.0 * MIB as f64),
        "{line}"
    );
    assert_eq!(
        figure_after(line, "peak reserved "),
        Some(14.0 * MIB as f64),
        "{line}"
    );

    // summary --json: exact bytes.
    let j = json(&vramshim(&dir, &["summary", "--json", "r.vramtrace"]));
    let d = &j["traces"][0]["devices"][0];
    assert_eq!(d["device"], 0, "{j}");
    assert_eq!(d["peak_in_use"]["bytes"], 11 * MIB, "{d}");
    assert_eq!(d["peak_reserved"]["bytes"], 14 * MIB, "{d}");
    assert_eq!(d["peak_reserved"]["in_use_bytes"], 11 * MIB, "{d}");

    // summary text.
    let t = stdout(&vramshim(&dir, &["summary", "r.vramtrace"]));
    assert_eq!(
        figure_after(&t, "peak reserved "),
        Some(14.0 * MIB as f64),
        "{t}"
    );
    assert_eq!(
        figure_after(&t, "peak in use  "),
        Some(11.0 * MIB as f64),
        "{t}"
    );

    // report (HTML): the peak reserved KPI.
    common::ok(&dir, &["report", "-o", "r.html", "r.vramtrace"]);
    let html = std::fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(
        html.contains("<b>14.0 MiB</b><span>peak reserved</span>"),
        "{}",
        &html[html.find("kpis").unwrap_or(0)..][..600.min(html.len())]
    );

    // Exports: every reserved counter is at least the in-use figure at that instant, and the
    // largest is the peak.
    common::ok(
        &dir,
        &[
            "export",
            "--format",
            "chrome-json",
            "-o",
            "r.json",
            "r.vramtrace",
        ],
    );
    let ex: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
    let evs = ex["traceEvents"].as_array().expect("traceEvents");
    let (mut in_use, mut max_reserved) = (0, 0);
    for e in evs.iter().filter(|e| e["ph"] == "C") {
        let a = &e["args"];
        if let Some(u) = a["in_use"].as_u64() {
            in_use = u;
        }
        if let Some(r) = a["reserved"].as_u64() {
            assert!(
                r >= in_use,
                "exported reserved {r} below in use {in_use}: {e}"
            );
            max_reserved = max_reserved.max(r);
        }
    }
    assert_eq!(max_reserved, 14 * MIB, "the export's reserved track");
}

#[test]
fn a_capped_post_mortem_reports_reserved_at_least_live() {
    let dir = scratch("truth-pm");
    // 9 x 3 MiB = 27 MiB in use, 36 MiB of pages; the tenth is over a 29 MiB cap.
    let sizes = [3 * MIB; 10];
    let o = run_sim(
        &dir,
        &["--sim", "--cap", "29MiB", "--trace", "c.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "0")],
        &sizes,
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let t = stdout(&vramshim(&dir, &["summary", "c.vramtrace"]));
    let pm = t
        .lines()
        .find(|l| l.contains("live then:"))
        .unwrap_or_else(|| panic!("no post-mortem: {t}"));
    let live = figure_after(pm, "live then: ").unwrap();
    let reserved = figure_after(pm, "reserved ").unwrap_or_else(|| panic!("{pm}"));
    assert!(reserved >= live, "{pm}");
    let j = json(&vramshim(&dir, &["summary", "--json", "c.vramtrace"]));
    let d = &j["traces"][0]["devices"][0];
    let p = &d["post_mortems"][0];
    assert!(
        p["reserved"].as_u64().unwrap() >= p["in_use"].as_u64().unwrap(),
        "{p}"
    );
    assert!(
        d["peak_reserved"]["bytes"].as_u64().unwrap()
            >= d["peak_in_use"]["bytes"].as_u64().unwrap(),
        "{d}"
    );
}

/// The post-mortem lines of `summary` on `trace`.
fn post_mortem_text(dir: &Path, trace: &str) -> String {
    let o = vramshim(dir, &["summary", trace]);
    let t = stdout(&o);
    assert!(
        t.contains("post-mortem #1"),
        "no post-mortem: {t}{}",
        stderr(&o)
    );
    t
}

#[test]
fn the_what_if_counts_the_context_the_cap_counted() {
    let dir = scratch("truth-whatif-cap");
    // Cap 10 MiB with a 2 MiB context: 2 + 3 + 3 = 8 MiB charged, the third 3 MiB is refused.
    // Stitch on the 10 MiB alone would take it (9 MiB); with the context it cannot.
    let o = run_sim(
        &dir,
        &["--sim", "--cap", "10MiB", "--trace", "w.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "2MiB")],
        &[3 * MIB, 3 * MIB, 3 * MIB],
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("alloc 2 refused"), "{}", stdout(&o));
    let t = post_mortem_text(&dir, "w.vramtrace");
    assert!(!t.contains("stitch WOULD have served it"), "{t}");
    assert!(t.contains("stitch would NOT have served it either"), "{t}");
    assert!(
        t.contains("context"),
        "the verdict says what it counted: {t}"
    );
}

#[test]
fn the_what_if_never_contradicts_the_runs_own_stitch_pool() {
    let dir = scratch("truth-whatif-pool");
    let o = run_sim(
        &dir,
        &[
            "--sim",
            "--pool",
            "stitch",
            "--cap",
            "10MiB",
            "--trace",
            "p.vramtrace",
        ],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "2MiB")],
        &[3 * MIB, 3 * MIB, 3 * MIB],
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let t = post_mortem_text(&dir, "p.vramtrace");
    assert!(!t.contains("stitch WOULD have served it"), "{t}");
    assert!(
        t.contains("this run used the stitch pool, and it could not serve the request"),
        "{t}"
    );
}

#[test]
fn after_a_device_refusal_the_what_if_stays_within_what_the_process_could_hold() {
    let dir = scratch("truth-whatif-device");
    // A 16 MiB device with a 2 MiB context: three 4 MiB allocations fit (14 MiB), the fourth
    // does not. Stitch on "a 16 MiB device" would take it; the device had no room for it.
    let o = run_sim(
        &dir,
        &["--sim=16MiB", "--trace", "d.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "2MiB")],
        &[4 * MIB; 4],
    );
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("alloc 3 refused"), "{}", stdout(&o));
    let t = post_mortem_text(&dir, "d.vramtrace");
    assert!(t.contains("OUT OF MEMORY (device)"), "{t}");
    assert!(!t.contains("stitch WOULD have served it"), "{t}");
    assert!(t.contains("stitch would NOT have served it either"), "{t}");
}

#[test]
fn many_traces_print_the_side_by_side_table_first_and_only_the_outliers_detail() {
    let dir = scratch("truth-many");
    let n = 48;
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("rank{i:03}.vramtrace");
        // One rank runs longer with a larger working set: the outlier.
        let (events, scale) = if i == 17 {
            ("3000", "20")
        } else {
            ("300", "1")
        };
        common::synth(
            &dir,
            &name,
            &["--events", events, "--seed", "1", "--scale", scale],
        );
        names.push(name);
    }
    let mut args: Vec<&str> = vec!["summary", "--no-whatif"];
    args.extend(names.iter().map(String::as_str));
    let t = stdout(&common::ok(&dir, &args));
    let first = t.lines().next().unwrap_or("");
    assert_eq!(first, format!("== {n} traces side by side"), "{t}");
    let table_end = t.find("== per-trace detail").expect("detail heading");
    assert!(
        t[..table_end].contains("OUTLIER rank017.vramtrace"),
        "the outlier is named in the table: {}",
        &t[..table_end]
    );
    let details: Vec<&str> = t.lines().filter(|l| l.starts_with("== rank")).collect();
    assert_eq!(details, ["== rank017.vramtrace (vramtrace)"], "{t}");
    assert!(t.contains(&format!("--each shows all {n}")), "{t}");

    args.push("--each");
    let t = stdout(&common::ok(&dir, &args));
    assert!(t.starts_with(&format!("== {n} traces side by side")), "{t}");
    let at = t.find("== per-trace detail").unwrap();
    assert_eq!(t[at..].matches("\n== rank").count(), n, "{t}");
    assert_eq!(t[..at].matches("\n== rank").count(), 0, "{t}");
}

#[test]
fn a_capped_trace_on_a_one_device_machine_describes_one_device() {
    let dir = scratch("truth-devices");
    let o = run_sim(
        &dir,
        &["--sim", "--cap", "1GiB", "--trace", "c.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "0"), ("VRAMSIM_DEVICES", "1")],
        &[MIB, 3 * MIB],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("on 1 device(s)"), "{err}");
    let j = json(&vramshim(&dir, &["summary", "--json", "c.vramtrace"]));
    let devs: Vec<i64> = j["traces"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(devs, [0], "{j}");
    let t = stdout(&vramshim(&dir, &["summary", "c.vramtrace"]));
    assert_eq!(t.matches("\n-- ").count(), 1, "one device section: {t}");
}

#[test]
fn log_info_says_what_runs_and_each_decision() {
    let dir = scratch("truth-info");
    let o = run_sim(
        &dir,
        &[
            "--sim",
            "--log",
            "info",
            "--cap",
            "7MiB",
            "--stacks",
            "4",
            "--trace",
            "i-%p.vramtrace",
        ],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "2MiB")],
        &[3 * MIB, 3 * MIB],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let info: Vec<&str> = err.lines().filter(|l| l.contains(" info: ")).collect();
    let start = info
        .iter()
        .find(|l| l.contains("cap \"7MiB\""))
        .unwrap_or_else(|| panic!("no start line: {err}"));
    for part in [
        "(the CUDA context counted)",
        "pool off",
        "trace \"",
        "i-%p.vramtrace",
        "stacks 4 frames",
    ] {
        assert!(start.contains(part), "{part:?} missing: {start}");
    }
    assert!(
        info.iter()
            .any(|l| l.contains("trace: writing ") && l.contains(&dir.display().to_string())),
        "the trace file chosen: {err}"
    );
    let refusal = info
        .iter()
        .find(|l| l.contains("cap: first refusal on device 0"))
        .unwrap_or_else(|| panic!("no refusal line: {err}"));
    assert!(
        refusal.contains(&format!("{} of the CUDA context", 2 * MIB)),
        "{refusal}"
    );
    // Without info, none of it.
    let o = run_sim(
        &dir,
        &["--sim", "--cap", "8MiB"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "2MiB")],
        &[3 * MIB, 3 * MIB],
    );
    assert!(!stderr(&o).contains(" info: "), "{}", stderr(&o));
}

#[test]
fn a_program_that_fails_in_cuda_start_up_leaves_a_trace_naming_the_cause() {
    let dir = scratch("truth-startup");
    // Every cuInit fails with CUDA_ERROR_NO_DEVICE; the program gives up at its first call.
    let o = run_sim(
        &dir,
        &["--sim", "--trace", "s.vramtrace"],
        &[("VRAMSIM_FAIL", "cuInit:nth=1:code=100")],
        &[MIB],
    );
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(dir.join("s.vramtrace").is_file(), "no trace: {err}");
    assert!(!err.contains("no trace was written"), "{err}");
    assert!(
        err.contains("CUDA failed: cuInit returned 100 (CUDA_ERROR_NO_DEVICE"),
        "the launcher names the cause: {err}"
    );
    let t = stdout(&vramshim(&dir, &["summary", "s.vramtrace"]));
    assert!(t.contains("CUDA call failed at +"), "{t}");
    assert!(t.contains("cuInit returned 100"), "{t}");
    let j = json(&vramshim(&dir, &["summary", "--json", "s.vramtrace"]));
    assert_eq!(j["traces"][0]["failed_calls"][0]["name"], "cuInit", "{j}");
    assert_eq!(j["traces"][0]["failed_calls"][0]["result"], 100, "{j}");
    common::ok(&dir, &["report", "-o", "s.html", "s.vramtrace"]);
    let html = std::fs::read_to_string(dir.join("s.html")).unwrap();
    assert!(
        html.contains("CUDA call failed at +"),
        "the report names it too"
    );

    // A program that only asks how many devices there are: no allocation, still a trace.
    let o = run_sim_args(
        &dir,
        &["--sim", "--trace", "n.vramtrace"],
        &[("VRAMSIM_FAIL", "cuInit:nth=1:code=100")],
        &["count".to_string()],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{}{err}", stdout(&o));
    assert!(dir.join("n.vramtrace").is_file(), "no trace: {err}");
    assert!(
        err.contains("CUDA failed: cuInit returned 100 (CUDA_ERROR_NO_DEVICE"),
        "{err}"
    );

    // A device too small for the context: the context's creation is the cause, not "out of
    // device memory" for the program's allocation alone.
    let o = run_sim(
        &dir,
        &["--sim=16MiB", "--trace", "c.vramtrace"],
        &[("VRAMSIM_CONTEXT_OVERHEAD", "300MiB")],
        &[MIB],
    );
    let err = stderr(&o);
    assert!(
        err.contains("CUDA failed: cuDevicePrimaryCtxRetain on device 0 returned 2"),
        "{err}"
    );
}

/// The simulated device's own high-water mark for `name` (what the driver handed out, page
/// rounding included); the device is removed.
fn sim_high_water(name: &str) -> u64 {
    let smi = Path::new(exe()).parent().unwrap().join("vramsim-smi");
    let o = Command::new(&smi).arg(name).output().expect("vramsim-smi");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    if let Some(f) = j["file"].as_str() {
        let _ = std::fs::remove_file(f);
    }
    j["high_water"][0].as_u64().expect("high_water")
}

#[test]
fn peak_reserved_is_what_the_device_handed_out_with_and_without_the_pool() {
    for pool in ["off", "stitch"] {
        let dir = scratch(&format!("truth-hw-{pool}"));
        let name = format!("vramshim-truth-hw-{pool}-{}", std::process::id());
        let sizes: Vec<String> = [3 * MIB, MIB, MIB, MIB, 5 * MIB]
            .iter()
            .map(u64::to_string)
            .collect();
        let o = Command::new(exe())
            .current_dir(&dir)
            .env("VRAMSHIM_NO_PROGRESS", "1")
            .env_remove("VRAMSHIM_LIB")
            .env("VRAMSIM_NAME", &name)
            .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
            .args([
                "run",
                "--sim",
                "--pool",
                pool,
                "--trace",
                "h.vramtrace",
                "--",
            ])
            .arg(program())
            .args(&sizes)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let device = sim_high_water(&name);
        let j = json(&vramshim(&dir, &["summary", "--json", "h.vramtrace"]));
        let d = &j["traces"][0]["devices"][0];
        assert_eq!(
            d["peak_reserved"]["bytes"].as_u64(),
            Some(device),
            "pool {pool}: the trace's peak reserved against the device's high water: {d}"
        );
        assert_eq!(d["peak_in_use"]["bytes"], 11 * MIB, "{d}");
        // Reached at the last allocation, not at a later sample after everything was freed.
        assert_eq!(
            d["peak_reserved"]["in_use_bytes"],
            11 * MIB,
            "pool {pool}: {d}"
        );
    }
}
