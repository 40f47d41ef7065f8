//! `vramshim replay --live --sim TRACE`: the trace replayed through real cudaMalloc/cudaFree
//! (the C log-replay workload under libvramshim.so) on the simulated GPU, next to the model.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::*;

fn vit() -> PathBuf {
    manifest_dir().join("../tests/workloads/traces/vit_train.rmm.csv")
}

fn live(args: &[&str]) -> Output {
    Command::new(exe())
        .env_remove("VRAMSHIM_LIB")
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .args(["replay", "--live", "--sim", "--device-memory", "16G"])
        .args(args)
        .arg(vit())
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn stitch_replays_the_whole_trace_live_and_agrees_with_the_model() {
    built_library();
    let v = json(&live(&["--pool", "stitch", "--json"]));
    assert_eq!(v["schema"], "vramshim.replay-live/1");
    let requests = v["requests"].as_u64().unwrap();
    assert!(requests > 1000, "{v}");
    let r = &v["runs"][0];
    assert_eq!(r["policy"], "stitch");
    assert_eq!(r["completed"], true, "{r}");
    assert_eq!(r["allocs_done"].as_u64(), Some(requests));
    // What the workload held is the trace's own peak, in both.
    assert_eq!(r["peak_live"], r["model"]["peak_live"], "{r}");
    assert!(r["driver_calls"].as_u64().unwrap() > 0);
    // The pool holds at least what is live, and far fewer driver calls than requests.
    let reserved = r["peak_reserved"].as_u64().unwrap();
    assert!(reserved >= r["peak_live"].as_u64().unwrap(), "{r}");
    assert!(r["driver_calls"].as_u64().unwrap() < requests / 2, "{r}");
}

#[test]
fn a_cap_below_the_peak_fails_live_at_the_first_refused_request_and_text_shows_both() {
    built_library();
    // The trace's peak live is ~160 MiB: 100 MiB refuses with or without the pool.
    let v = json(&live(&["--pool", "all", "--cap", "100M", "--json"]));
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(r["completed"], false, "{r}");
        let done = r["allocs_done"].as_u64().unwrap();
        assert!(done > 0 && done < v["requests"].as_u64().unwrap(), "{r}");
        let f = &r["first_failure"];
        assert_eq!(f[0].as_u64(), Some(done), "{r}");
        assert!(f[1].as_str().unwrap().starts_with("alloc "), "{r}");
        assert_eq!(r["model"]["completed"], false, "{r}");
        assert!(r["peak_live"].as_u64().unwrap() <= 100 << 20, "{r}");
    }
    let o = live(&["--pool", "stitch", "--cap", "100M"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("stitch   live"), "{text}");
    assert!(text.contains("model"), "{text}");
    assert!(text.contains("fails at request"), "{text}");
    assert!(text.contains("stitch live: request"), "{text}");
}

#[test]
fn a_pool_the_library_does_not_have_is_refused_with_a_message() {
    let o = live(&["--pool", "caching"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--pool caching") && err.contains("cannot be replayed live"),
        "{err}"
    );
}

#[test]
fn a_stream_ordered_trace_replays_stream_ordered_and_stitch_matches_the_model() {
    built_library();
    let d = scratch("live-synth");
    let t = synth(&d, "s.vramtrace", &["--events", "4000", "--no-refusal"]);
    let o = Command::new(exe())
        .env_remove("VRAMSHIM_LIB")
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .args(["replay", "--live", "--sim", "--pool", "stitch", "--json"])
        .arg(&t)
        .output()
        .unwrap();
    let v = json(&o);
    assert_eq!(v["stream_ordered"], true, "{v}");
    let r = &v["runs"][0];
    assert_eq!(r["completed"], true, "{r}");
    // The live pool and the model reserve the same and call the driver as often.
    assert_eq!(r["peak_reserved"], r["model"]["peak_reserved"], "{r}");
    assert_eq!(r["driver_calls"], r["model"]["driver_calls"], "{r}");
    let _ = std::fs::remove_dir_all(&d);
}
