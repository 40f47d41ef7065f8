//! `vramshim export --format parquet` checked by DuckDB (the `duckdb` Python package, installed
//! by `scripts/setup-duckdb`): the peak in use that SQL computes from the rows (a running sum of
//! `size` over successful allocations and frees, ordered by `t_ns, seq`) is the peak
//! `vramshim summary` prints, per trace and device, for a trace recorded from a real program on
//! the simulated GPU, for the real PyTorch streams in shared/traces, and for 64 rank traces
//! exported into one file and queried in one statement.
//!
//! Without DuckDB the tests skip with one line; `VRAMSHIM_REQUIRE_VIEWERS=1` (CI) makes that a
//! failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The Python that has DuckDB, and the directory to put on PYTHONPATH.
fn duckdb() -> Option<(String, PathBuf)> {
    let script = manifest_dir().join("../scripts/setup-duckdb");
    let out = Command::new(&script).arg("--check").output().ok()?;
    if !out.status.success() {
        assert!(
            !viewers_required(),
            "VRAMSHIM_REQUIRE_VIEWERS=1 but DuckDB is not installed (run scripts/setup-duckdb): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("SKIP: DuckDB is not installed (scripts/setup-duckdb installs it)");
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let py = std::fs::read_to_string(dir.join("python")).ok()?;
    Some((py.trim().to_string(), dir))
}

/// DuckDB's answers about `parquet` (tests/py/parquet_sql.py).
fn sql(db: &(String, PathBuf), parquet: &Path) -> serde_json::Value {
    let out = Command::new(&db.0)
        .env("PYTHONPATH", &db.1)
        .arg(manifest_dir().join("tests/py/parquet_sql.py"))
        .arg(parquet)
        .arg("peaks")
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "parquet_sql.py failed on {}: {}",
        parquet.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parquet_sql.py prints JSON")
}

/// `vramshim summary --json` of `traces`: (rank, device, peak in use) for every device of every
/// trace that allocated anything.
fn summary_peaks(dir: &Path, traces: &[PathBuf]) -> Vec<(i64, i64, i64)> {
    let mut args = vec!["summary".to_string(), "--json".to_string()];
    args.extend(traces.iter().map(|p| p.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = ok(dir, &args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut peaks = Vec::new();
    for (rank, t) in v["traces"].as_array().unwrap().iter().enumerate() {
        for d in t["devices"].as_array().unwrap() {
            let peak = d["peak_in_use"]["bytes"].as_i64().unwrap();
            let dev = d["device"].as_i64().unwrap();
            peaks.push((rank as i64, dev, peak));
        }
    }
    peaks.sort();
    peaks
}

fn sql_peaks(v: &serde_json::Value) -> Vec<(i64, i64, i64)> {
    let mut p: Vec<(i64, i64, i64)> = v["peaks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_i64().unwrap(),
                r[2].as_i64().unwrap(),
            )
        })
        .collect();
    p.sort();
    p
}

/// Devices where summary saw only failed requests have no SQL row (nothing was summed); they
/// must then show a peak of 0.
fn same_peaks(summary: &[(i64, i64, i64)], sql: &[(i64, i64, i64)]) {
    let nonzero: Vec<_> = summary.iter().filter(|p| p.2 != 0).cloned().collect();
    let sql_nonzero: Vec<_> = sql.iter().filter(|p| p.2 != 0).cloned().collect();
    assert_eq!(
        sql_nonzero, nonzero,
        "DuckDB's peaks (rank, device, bytes) differ from vramshim summary's"
    );
    assert!(!nonzero.is_empty(), "no device allocated anything");
}

fn export_parquet(dir: &Path, traces: &[PathBuf], out: &str) -> PathBuf {
    let mut args = vec!["export".to_string()];
    args.extend(traces.iter().map(|p| p.to_string_lossy().into_owned()));
    args.extend(["--format", "parquet", "-o", out].map(String::from));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    ok(dir, &args);
    dir.join(out)
}

fn built_library() {
    let lib = Path::new(exe()).parent().unwrap().join("libvramshim.so");
    assert!(
        lib.is_file(),
        "{} is not built: build the workspace first (cargo build --release --workspace, as scripts/test does)",
        lib.display()
    );
}

/// Records `ranks_workload.c` on a two-device simulated GPU under a cap, with stacks.
fn real_trace(dir: &Path) -> PathBuf {
    built_library();
    let prog = dir.join("ranks_workload");
    let st = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-g", "-O1", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&prog)
        .arg(data("ranks_workload.c"))
        .arg("-ldl")
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let trace = dir.join("real.vramtrace");
    let o = Command::new(exe())
        .env_remove("VRAMSHIM_LIB")
        .env(
            "VRAMSIM_NAME",
            format!("vramshim-parquet-{}", std::process::id()),
        )
        .env("VRAMSIM_DEVICES", "2")
        // The small cap is about the workload's allocations, not the context's memory.
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .current_dir(dir)
        .args([
            "run", "--sim", "--cap", "64MiB", "--stacks", "16", "--trace",
        ])
        .arg(&trace)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    trace
}

#[test]
fn duckdb_computes_summarys_peak_from_a_real_traces_rows() {
    let dir = scratch("parquet-real");
    let trace = real_trace(&dir);
    let pq = export_parquet(&dir, std::slice::from_ref(&trace), "real.parquet");
    let Some(db) = duckdb() else { return };
    let v = sql(&db, &pq);
    let summary = summary_peaks(&dir, std::slice::from_ref(&trace));
    same_peaks(&summary, &sql_peaks(&v));
    // Both devices allocated.
    assert_eq!(summary.iter().filter(|p| p.2 > 0).count(), 2, "{summary:?}");

    // The columns the export promises, with the types an SQL engine sums without casts.
    let cols = &v["columns"];
    for (name, ty) in [
        ("seq", "BIGINT"),
        ("t_ns", "BIGINT"),
        ("pid", "BIGINT"),
        ("tid", "BIGINT"),
        ("device", "INTEGER"),
        ("op", "VARCHAR"),
        ("api", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("addr", "UBIGINT"),
        ("size", "BIGINT"),
        ("stream", "UBIGINT"),
        ("failed", "BOOLEAN"),
        ("site", "VARCHAR"),
        ("rank", "INTEGER"),
        ("file", "VARCHAR"),
    ] {
        assert_eq!(cols[name].as_str(), Some(ty), "column {name}: {cols}");
    }
    // Every successful free of a block the trace saw allocated carries its size; seq numbers
    // the rows 0..n.
    let r = &v["ranks"][0];
    assert_eq!(r["unmatched_frees"], 0, "{r}");
    assert_eq!(r["min_seq"], 0);
    assert_eq!(
        r["max_seq"].as_i64().unwrap() + 1,
        r["rows"].as_i64().unwrap()
    );
    // The refusals are rows too, and the call sites are named as summary names them.
    assert!(v["cap_refused_allocs"].as_i64().unwrap() >= 2, "{v}");
    assert!(v["ops"]["cap_refusal"].as_i64().unwrap() >= 2, "{v}");
    let sites: Vec<&str> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for f in ["alloc_weights", "alloc_activations"] {
        assert!(
            sites
                .iter()
                .any(|s| s.starts_with(&format!("{f} (ranks_workload.c:"))),
            "no site named {f}: {sites:?}"
        );
    }
    let out = ok(&dir, &["summary", "--json", trace.to_str().unwrap()]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for d in s["traces"][0]["devices"].as_array().unwrap() {
        for t in d["top_sites"].as_array().unwrap() {
            let name = t["site"].as_str().unwrap();
            assert!(
                sites.contains(&name),
                "summary's site {name} not in {sites:?}"
            );
        }
    }
}

#[test]
fn duckdb_matches_summary_on_the_real_pytorch_streams() {
    let Some(traces) = shared_traces() else {
        eprintln!("SKIP: shared/traces is not beside the clone");
        return;
    };
    let dir = scratch("parquet-shared");
    let files: Vec<PathBuf> = [
        "vit_train.rmm.csv",
        "bert_serve.rmm.csv",
        "t5_train.rmm.csv",
    ]
    .iter()
    .map(|n| traces.join(n))
    .collect();
    let pq = export_parquet(&dir, &files, "streams.parquet");
    let Some(db) = duckdb() else { return };
    let v = sql(&db, &pq);
    same_peaks(&summary_peaks(&dir, &files), &sql_peaks(&v));
    assert_eq!(v["ranks"].as_array().unwrap().len(), 3);
}

#[test]
fn sixty_four_rank_traces_into_one_dataset_queried_in_one_statement() {
    let dir = scratch("parquet-ranks");
    let traces: Vec<PathBuf> = (0..64)
        .map(|i| {
            synth(
                &dir,
                &format!("rank{i:02}.vramtrace"),
                &[
                    "--events",
                    &(1500 + 37 * i).to_string(),
                    "--seed",
                    &(i + 1).to_string(),
                    "--devices",
                    &(1 + i % 2).to_string(),
                ],
            )
        })
        .collect();
    let pq = export_parquet(&dir, &traces, "ranks.parquet");
    let Some(db) = duckdb() else { return };
    let v = sql(&db, &pq);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 64);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"].as_i64(), Some(i as i64));
        assert_eq!(r["files"], 1, "rank {i}: one file per rank");
        assert_eq!(r["min_seq"], 0);
        assert_eq!(
            r["max_seq"].as_i64().unwrap() + 1,
            r["rows"].as_i64().unwrap()
        );
    }
    same_peaks(&summary_peaks(&dir, &traces), &sql_peaks(&v));
}

#[test]
fn several_traces_only_for_parquet_and_bad_input_is_one_clear_error() {
    let dir = scratch("parquet-cli");
    let a = synth(&dir, "a.vramtrace", &["--events", "200"]);
    let out = run_in(
        &dir,
        &[
            "export",
            a.to_str().unwrap(),
            a.to_str().unwrap(),
            "--format",
            "perfetto",
            "-o",
            "x.pftrace",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only parquet"), "{err}");

    // Not a trace: one line naming the file, no output left behind.
    std::fs::write(dir.join("junk.vramtrace"), b"not a trace at all").unwrap();
    let out = run_in(
        &dir,
        &[
            "export",
            "a.vramtrace",
            "junk.vramtrace",
            "--format",
            "parquet",
            "-o",
            "bad.parquet",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("junk.vramtrace"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!dir.join("bad.parquet").exists());
}
