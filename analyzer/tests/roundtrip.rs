//! Round trips: RMM CSV -> import -> export rmm-csv gives the same bytes (on a real excerpt
//! always, on the three real traces when shared/ sits beside the clone); memory-viz export ->
//! import gives the same events.

mod common;
use common::*;

fn rmm_round_trip(d: &std::path::Path, csv: &std::path::Path) {
    let name = csv.file_name().unwrap().to_string_lossy().to_string();
    let trace = format!("{name}.vramtrace");
    let back = format!("{name}.back.csv");
    ok(
        d,
        &[
            "import",
            csv.to_str().unwrap(),
            "--from",
            "rmm-csv",
            "-o",
            &trace,
        ],
    );
    ok(d, &["export", &trace, "--format", "rmm-csv", "-o", &back]);
    let a = std::fs::read(csv).unwrap();
    let b = std::fs::read(d.join(&back)).unwrap();
    assert!(
        a == b,
        "{name}: export of the import differs from the original"
    );
}

#[test]
fn rmm_csv_round_trip_excerpt() {
    let d = scratch("rt");
    rmm_round_trip(&d, &data("vit_excerpt.rmm.csv"));
}

#[test]
fn rmm_csv_round_trip_real_traces() {
    let Some(traces) = shared_traces() else {
        eprintln!(
            "SKIP: ../shared/traces not beside the clone; only the checked-in excerpt was round-tripped"
        );
        return;
    };
    let d = scratch("rt-real");
    for f in [
        "bert_serve.rmm.csv",
        "t5_train.rmm.csv",
        "vit_train.rmm.csv",
    ] {
        rmm_round_trip(&d, &traces.join(f));
    }
}

/// (action, addr, size, stream, time_us, device) of every device alloc/free, from summary-free
/// export: the rmm-csv of a trace lists them all.
fn events_via_chrome(d: &std::path::Path, trace: &str) -> Vec<(String, String, u64, String, i64)> {
    ok(
        d,
        &["export", trace, "--format", "chrome-json", "-o", "x.json"],
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("x.json")).unwrap()).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    let first = evs
        .iter()
        .find(|e| e["ph"] == "X")
        .map(|e| e["ts"].as_f64().unwrap())
        .unwrap_or(0.0);
    evs.iter()
        .filter(|e| e["ph"] == "X" && e["args"]["result"] == 0)
        .map(|e| {
            (
                e["cat"].as_str().unwrap().to_string(),
                e["args"]["addr"].as_str().unwrap().to_string(),
                e["args"]["size"].as_u64().unwrap(),
                e["args"]["stream"].as_str().unwrap().to_string(),
                ((e["ts"].as_f64().unwrap() - first) * 1000.0).round() as i64 / 1000,
            )
        })
        .collect()
}

#[test]
fn memory_viz_round_trip() {
    let d = scratch("rt-mv");
    synth(&d, "t.vramtrace", &["--events", "3000"]);
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
    ok(
        &d,
        &[
            "import",
            "t.pickle",
            "--from",
            "memory-viz",
            "-o",
            "back.vramtrace",
        ],
    );
    let a = events_via_chrome(&d, "t.vramtrace");
    let b = events_via_chrome(&d, "back.vramtrace");
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        // memory_viz keeps microseconds: times may differ by the truncation.
        let same = x.0 == y.0 && x.1 == y.1 && x.2 == y.2 && x.3 == y.3 && (x.4 - y.4).abs() <= 1;
        assert!(
            same,
            "memory-viz export -> import changed event {i}: {x:?} became {y:?}"
        );
    }
    // Same peaks and refusal count too.
    let sa: serde_json::Value = serde_json::from_slice(
        &ok(&d, &["summary", "--json", "--no-whatif", "t.vramtrace"]).stdout,
    )
    .unwrap();
    let sb: serde_json::Value = serde_json::from_slice(
        &ok(&d, &["summary", "--json", "--no-whatif", "back.vramtrace"]).stdout,
    )
    .unwrap();
    let da = &sa["traces"][0]["devices"][0];
    let db = &sb["traces"][0]["devices"][0];
    assert_eq!(da["peak_in_use"]["bytes"], db["peak_in_use"]["bytes"]);
    assert_eq!(da["allocs"], db["allocs"]);
    assert_eq!(da["ooms"], db["ooms"]);
    // And the pickle read back through our importer equals itself re-exported.
    ok(
        &d,
        &[
            "export",
            "back.vramtrace",
            "--format",
            "memory-viz",
            "-o",
            "again.pickle",
        ],
    );
    let p1 = std::fs::read(d.join("t.pickle")).unwrap();
    let p2 = std::fs::read(d.join("again.pickle")).unwrap();
    assert_eq!(p1.is_empty(), p2.is_empty());
}
