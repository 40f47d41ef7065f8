//! The light path (requests that meet only the cap and/or the tracer: `dispatch::alloc_light`,
//! `free_light`) against the layered one (`dispatch::alloc`, `free`, forced with
//! `VRAMSHIM_LAYERS_FAULT=no-light`): the same program must get the same answers and leave
//! the same trace (every event, in order, with the same fields but for time, thread and the
//! addresses the device happened to hand out) and the same cap accounting.
//! `VRAMSHIM_LAYERS_FAULT=light-no-pitch` breaks the light path's cap accounting (a pitched
//! allocation's padding is not charged): [`the_comparison_notices_a_broken_light_path`]
//! proves that these tests see such a difference.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::{build, preloaded};
use vramshim_testkit::{Link, RunOutput, temp_dir};
use vramshim_trace::{Event, TraceReader};

/// Every event of the one trace in `dir`, with time, thread and latency cleared and the
/// addresses renamed in order of first appearance (runs get different device addresses).
fn normalized_events(dir: &Path) -> Vec<String> {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "vramtrace"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mut r = TraceReader::open(&files[0]).unwrap();
    let mut names: HashMap<u64, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        let line = match &e {
            Event::Alloc(m) | Event::Free(m) => {
                let n = names.len();
                let addr = if m.addr == 0 {
                    0
                } else {
                    *names.entry(m.addr).or_insert(n + 1)
                };
                format!(
                    "{} {:?} {:?} flags={} dev={} stream={} addr#{} size={} rc={} stack={}",
                    if matches!(e, Event::Alloc(_)) {
                        "alloc"
                    } else {
                        "free"
                    },
                    m.api,
                    m.kind,
                    m.flags,
                    m.device,
                    m.stream != 0,
                    addr,
                    m.size,
                    m.result,
                    m.stack
                )
            }
            Event::CapRefusal {
                device,
                api,
                size,
                in_use,
                cap,
                ..
            } => format!("refusal dev={device} {api:?} size={size} in_use={in_use} cap={cap}"),
            Event::MemInfo {
                api,
                device,
                free,
                total,
                result,
                ..
            } => format!("meminfo {api:?} dev={device} free={free} total={total} rc={result}"),
            // Time, threads, modules, counters and the like vary from run to run.
            _ => continue,
        };
        out.push(line);
    }
    out
}

/// Run `exe` traced under `env`, light path or not; (output, normalized events).
fn traced(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    fault: Option<&str>,
    name: &str,
) -> (RunOutput, Vec<String>) {
    let dir = temp_dir(&format!("{name}-{}", fault.unwrap_or("light")));
    let pattern = dir.join("t-%p.vramtrace");
    let pattern = pattern.to_string_lossy().into_owned();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.push(("VRAMSHIM_TRACE", &pattern));
    if let Some(f) = fault {
        env.push(("VRAMSHIM_LAYERS_FAULT", f));
    }
    let out = preloaded(exe, args, &env, name);
    out.assert_success();
    let events = normalized_events(&dir);
    (out, events)
}

/// The light path and the layered path give the same answers and the same trace.
#[track_caller]
fn same_either_way(exe: &Path, args: &[&str], env: &[(&str, &str)], name: &str) -> Vec<String> {
    let (light, le) = traced(exe, args, env, None, name);
    let (layered, ye) = traced(exe, args, env, Some("no-light"), name);
    assert_eq!(
        light.stdout, layered.stdout,
        "answers differ\n--- light stderr\n{}\n--- layered stderr\n{}",
        light.stderr, layered.stderr
    );
    assert!(
        le.len() > 10,
        "too few events to compare: {le:#?}\n{}",
        light.stderr
    );
    assert_eq!(le, ye, "traces differ (light, then layered)");
    le
}

fn alloc_suite() -> PathBuf {
    build(
        "layers_alloc_suite",
        "alloc_suite.c",
        Link::SharedRuntime,
        &["-DLAYER_RUNTIME=1"],
    )
}

const CAP_1G: &[(&str, &str)] = &[
    ("VRAMSHIM_CAP", "1GiB"),
    ("VRAMSHIM_CAP_CONTEXT", "exclude"),
];

#[test]
fn every_path_traced_the_same_light_or_layered() {
    let ev = same_either_way(&alloc_suite(), &[], &[], "ly-trace");
    for what in [
        "alloc CudaMallocPitch",
        "alloc CudaMallocHost",
        "free CudaFree",
        "meminfo",
    ] {
        assert!(ev.iter().any(|l| l.starts_with(what)), "no {what}: {ev:#?}");
    }
}

#[test]
fn every_path_capped_and_traced_the_same_light_or_layered() {
    let _ = same_either_way(&alloc_suite(), &[], CAP_1G, "ly-cap");
}

#[test]
fn refusals_the_same_light_or_layered() {
    let exe = build(
        "layers_cap_wiring",
        "cap_wiring.c",
        Link::SharedRuntime,
        &[],
    );
    let ev = same_either_way(
        &exe,
        &[],
        &[
            ("VRAMSHIM_CAP", "64MiB"),
            ("VRAMSHIM_CAP_CONTEXT", "exclude"),
        ],
        "ly-refuse",
    );
    assert!(
        ev.iter().filter(|l| l.starts_with("refusal")).count() >= 2,
        "{ev:#?}"
    );
}

/// With a light path that does not charge a pitched allocation's padding, the cap answers
/// `cudaMemGetInfo` differently: the comparison above must see it.
#[test]
fn the_comparison_notices_a_broken_light_path() {
    let exe = alloc_suite();
    let (_, broken) = traced(&exe, &[], CAP_1G, Some("light-no-pitch"), "ly-broken");
    let (_, layered) = traced(&exe, &[], CAP_1G, Some("no-light"), "ly-broken");
    assert_ne!(
        broken, layered,
        "the broken light path went unnoticed: the comparison proves nothing"
    );
}
