//! PyTorch 2.15 on the simulated GPU: its real allocators (native caching, expandable
//! segments, cudaMallocAsync) replaying the shipped traces, and the same process under
//! vramshim (trace, cap, stitch pool). Needs PyTorch installed by scripts/setup-torch (else
//! each test prints why it is skipped; VRAMSHIM_TORCH_TESTS=1 installs it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vramshim_pytorch_tests::{
    TRACES, replay_json, replay_script, torch_or_skip, torch_sim_command, vramshim_run_command,
};
use vramshim_testkit::{RunOutput, run, temp_dir, trace_file};
use vramshim_trace::{AllocKind, Api, Event, TraceReader};

const DEFAULT: &str = "";
const EXPANDABLE: &str = "expandable_segments:True";
const ASYNC: &str = "backend:cudaMallocAsync";

fn replay(py: &Path, name: &str, trace: &str, conf: &str, extra: &[&str]) -> (RunOutput, Value) {
    let mut c = torch_sim_command(py, name);
    if !conf.is_empty() {
        c.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    c.arg(replay_script()).arg(trace_file(trace)).args(extra);
    let out = run(&mut c);
    let j = replay_json(&out.stdout);
    (out, j)
}

fn num(j: &Value, k: &str) -> u64 {
    j[k].as_u64()
        .unwrap_or_else(|| panic!("{k} is not a number in {j}"))
}

#[test]
fn torch_sees_the_simulated_gpu() {
    let Some(py) = torch_or_skip("torch_sees_the_simulated_gpu") else {
        return;
    };
    let out = run(torch_sim_command(&py, "torch_avail")
        .env("VRAMSIM_MEMORY", "8GiB")
        .args([
            "-c",
            "import torch\n\
         print('available', torch.cuda.is_available(), torch.cuda.device_count())\n\
         p = torch.cuda.get_device_properties(0)\n\
         print('device', p.name, p.total_memory, p.major, p.minor)\n\
         x = torch.arange(1000, dtype=torch.int32).to('cuda')\n\
         y = x.cpu()\n\
         print('roundtrip', bool((y == torch.arange(1000, dtype=torch.int32)).all()))\n\
         print('reserved', torch.cuda.memory_reserved())\n",
        ]));
    out.assert_success();
    assert!(out.stdout.contains("available True 1"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("device vramsim GPU 0 (simulated) 8589934592 9 0"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("roundtrip True"), "{}", out.stdout);
    assert!(out.stdout.contains("reserved 2097152"), "{}", out.stdout);
}

/// Every trace completes under each of PyTorch's three allocator configurations, with what
/// PyTorch reports consistent with the trace (peak allocated >= peak live, reserved >=
/// allocated).
#[test]
fn every_trace_replays_under_every_pytorch_allocator() {
    let Some(py) = torch_or_skip("every_trace_replays_under_every_pytorch_allocator") else {
        return;
    };
    for trace in TRACES {
        for conf in [DEFAULT, EXPANDABLE, ASYNC] {
            // Patterns on the smallest trace only (they cost copies, not allocator work).
            let pattern = if trace.starts_with("bert") {
                "sample"
            } else {
                "none"
            };
            let (out, j) = replay(&py, "torch_replay", trace, conf, &["--pattern", pattern]);
            let what = format!("{trace} under '{conf}'");
            assert_eq!(out.code(), Some(0), "{what}: {}{}", out.stdout, out.stderr);
            assert_eq!(j["completed"], Value::Bool(true), "{what}: {j}");
            assert_eq!(num(&j, "mismatches"), 0, "{what}");
            assert_eq!(num(&j, "skipped_frees"), 0, "{what}");
            let expected_backend = if conf == ASYNC {
                "cudaMallocAsync"
            } else {
                "native"
            };
            assert_eq!(j["backend"], expected_backend, "{what}");
            let (live, alloc, reserved) = (
                num(&j, "peak_live"),
                num(&j, "max_memory_allocated"),
                num(&j, "max_memory_reserved"),
            );
            assert!(alloc >= live, "{what}: allocated {alloc} < live {live}");
            assert!(
                reserved >= alloc,
                "{what}: reserved {reserved} < allocated {alloc}"
            );
            assert_eq!(num(&j, "num_ooms"), 0, "{what}");
            if conf != ASYNC {
                assert!(num(&j, "num_device_alloc") > 0, "{what}: {j}");
            }
        }
    }
}

/// Alloc events of a trace file (or files, %p), by (api, kind).
fn trace_allocs(pattern: &Path) -> Vec<vramshim_trace::MemOp> {
    let dir = pattern.parent().expect("trace dir");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("trace dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "vramtrace"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 1, "one trace expected: {files:?}");
    let mut ops = Vec::new();
    for ev in TraceReader::open(&files[0]).expect("open trace") {
        if let Event::Alloc(op) = ev.expect("trace event") {
            ops.push(op);
        }
    }
    ops
}

fn traced_replay(
    py: &Path,
    name: &str,
    trace: &str,
    conf: &str,
) -> (Value, Vec<vramshim_trace::MemOp>) {
    let dir = temp_dir(name);
    let file = dir.join("run-%p.vramtrace");
    let mut c = vramshim_run_command(py, name, &["--trace", file.to_str().expect("utf-8 path")]);
    if !conf.is_empty() {
        c.env("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    c.arg(replay_script()).arg(trace_file(trace));
    let out = run(&mut c);
    assert_eq!(
        out.code(),
        Some(0),
        "{trace} '{conf}': {}{}",
        out.stdout,
        out.stderr
    );
    (replay_json(&out.stdout), trace_allocs(&file))
}

/// Each device allocation PyTorch makes appears exactly once in vramshim's trace: segments
/// (cudaMalloc) for the native allocator, physical handles (cuMemCreate) with expandable
/// segments, one cudaMallocAsync per tensor with the async backend; and nothing twice (the
/// runtime's own driver calls underneath are not recorded again).
#[test]
fn trace_shows_each_pytorch_device_allocation_once() {
    let Some(py) = torch_or_skip("trace_shows_each_pytorch_device_allocation_once") else {
        return;
    };
    let trace = "bert_serve.rmm.csv";
    let device = |ops: &[vramshim_trace::MemOp]| -> Vec<vramshim_trace::MemOp> {
        ops.iter()
            .filter(|o| o.result == 0 && o.kind != AllocKind::Host && o.device >= 0)
            .cloned()
            .collect()
    };
    let by_api = |ops: &[vramshim_trace::MemOp]| -> HashMap<Api, usize> {
        let mut m = HashMap::new();
        for o in ops {
            *m.entry(o.api).or_default() += 1;
        }
        m
    };

    // Native caching allocator: one cudaMalloc per segment, nothing else.
    let (j, ops) = traced_replay(&py, "torch_trace_native", trace, DEFAULT);
    let dev = device(&ops);
    let apis = by_api(&dev);
    let segments = num(&j, "num_device_alloc") as usize;
    assert!(segments > 0, "{j}");
    assert_eq!(
        apis.get(&Api::CudaMalloc).copied().unwrap_or(0),
        segments,
        "{apis:?} {j}"
    );
    assert_eq!(
        dev.len(),
        segments,
        "device allocations other than PyTorch's segments: {apis:?}"
    );

    // Expandable segments: physical memory comes from cuMemCreate handles, no cudaMalloc.
    let (j, ops) = traced_replay(&py, "torch_trace_expandable", trace, EXPANDABLE);
    let dev = device(&ops);
    let apis = by_api(&dev);
    let handles = apis.get(&Api::CuMemCreate).copied().unwrap_or(0);
    assert!(
        handles > 0,
        "no cuMemCreate with expandable segments: {apis:?}"
    );
    assert!(
        dev.iter().all(|o| o.kind == AllocKind::VmmHandle),
        "expandable segments made non-VMM device allocations: {apis:?}"
    );
    let mut addrs: Vec<u64> = dev.iter().map(|o| o.addr).collect();
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(addrs.len(), handles, "a VMM handle recorded twice");
    assert!(
        handles as u64 >= num(&j, "num_device_alloc"),
        "{handles} handles for {} growths: {j}",
        num(&j, "num_device_alloc")
    );

    // cudaMallocAsync backend: every tensor is one cudaMallocAsync.
    let (j, ops) = traced_replay(&py, "torch_trace_async", trace, ASYNC);
    let dev = device(&ops);
    let apis = by_api(&dev);
    let tensors = num(&j, "allocs") as usize;
    assert_eq!(
        apis.get(&Api::CudaMallocAsync).copied().unwrap_or(0),
        tensors,
        "{apis:?} {j}"
    );
    assert_eq!(dev.len(), tensors, "{apis:?}");
}

/// A vramshim cap below what the replay needs: PyTorch raises its own OutOfMemoryError (the
/// replay reports it and exits 2), with PyTorch's usual message.
#[test]
fn cap_below_the_need_raises_torch_out_of_memory() {
    let Some(py) = torch_or_skip("cap_below_the_need_raises_torch_out_of_memory") else {
        return;
    };
    for conf in [DEFAULT, EXPANDABLE, ASYNC] {
        let mut c = vramshim_run_command(&py, "torch_cap", &["--cap", "96MiB"]);
        if !conf.is_empty() {
            c.env("PYTORCH_CUDA_ALLOC_CONF", conf);
        }
        c.arg(replay_script()).arg(trace_file("vit_train.rmm.csv"));
        let out = run(&mut c);
        assert_eq!(
            out.code(),
            Some(2),
            "'{conf}': {}{}",
            out.stdout,
            out.stderr
        );
        let j = replay_json(&out.stdout);
        assert_eq!(j["completed"], Value::Bool(false), "{j}");
        let msg = j["oom"]["message"].as_str().unwrap_or_default();
        // Native allocator: "CUDA out of memory. Tried to allocate ..."; cudaMallocAsync
        // backend: "Allocation on device 0 would exceed allowed memory. (out of memory)".
        let expected = if conf == ASYNC {
            "out of memory"
        } else {
            "CUDA out of memory"
        };
        assert!(msg.contains(expected), "'{conf}': {msg}");
        assert_eq!(j["oom"]["type"], "OutOfMemoryError", "{j}");
        assert!(num(&j["oom"], "live_bytes") < 96 << 20, "{j}");
    }
}

/// vramshim's stitch pool under PyTorch uncached (`--pytorch-route uncached` sets
/// PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor reaches the pool with cudaMalloc /
/// cudaFree): the replay completes with its data patterns intact.
#[test]
fn stitch_pool_replays_with_patterns_intact() {
    let Some(py) = torch_or_skip("stitch_pool_replays_with_patterns_intact") else {
        return;
    };
    for trace in ["bert_serve.rmm.csv", "vit_train.rmm.csv"] {
        let mut c = vramshim_run_command(
            &py,
            "torch_stitch",
            &["--pool", "stitch", "--pytorch-route", "uncached"],
        );
        c.arg(replay_script())
            .arg(trace_file(trace))
            .args(["--pattern", "sample"]);
        let out = run(&mut c);
        assert_eq!(out.code(), Some(0), "{trace}: {}{}", out.stdout, out.stderr);
        let j = replay_json(&out.stdout);
        assert_eq!(j["no_caching"], Value::Bool(true), "{j}");
        assert_eq!(j["completed"], Value::Bool(true), "{j}");
        assert_eq!(num(&j, "mismatches"), 0, "{j}");
    }
}

/// Whole 2 MiB pages within 1.05 x the trace's peak live bytes (the benchmark target).
fn device_within_5_percent(trace: &str) -> (u64, u64) {
    let parsed = vramshim_pool::rmm_csv::parse_file(trace_file(trace)).expect("parse trace");
    let live = vramshim_pool::replay::peak_live(&parsed.events);
    let page = 2u64 << 20;
    (live, (live + live / 20) / page * page)
}

/// vramshim's stitch pool behind PyTorch's `backend:cudaMallocAsync`: every tensor is one
/// cudaMallocAsync / cudaFreeAsync that the pool serves (a stream-ordered free is reusable at
/// once on its stream, no synchronization), and each trace completes with its patterns
/// intact on a simulated device of 1.05 x its peak live bytes (whole pages below that).
/// (Without `--pool stitch` the same backend on the simulated driver's own pool fails this
/// on BERT: 240 MiB needed, 218 MiB here.)
#[test]
fn stitch_behind_pytorch_async_backend_fits_in_peak_live_plus_5_percent() {
    let Some(py) =
        torch_or_skip("stitch_behind_pytorch_async_backend_fits_in_peak_live_plus_5_percent")
    else {
        return;
    };
    for trace in TRACES {
        let (live, device) = device_within_5_percent(trace);
        let dir = temp_dir("torch_stitch_async");
        let stats = dir.join("stats-%p.json");
        let mut c = vramshim_run_command(&py, "torch_stitch_async", &["--pool", "stitch"]);
        c.env("PYTORCH_CUDA_ALLOC_CONF", ASYNC)
            .env("VRAMSIM_MEMORY", device.to_string())
            .env("VRAMSHIM_STATS", &stats)
            .arg(replay_script())
            .arg(trace_file(trace))
            .args(["--pattern", "sample"]);
        let out = run(&mut c);
        let what = format!(
            "{trace} on a {} MiB device (peak live {live} B)",
            device >> 20
        );
        assert_eq!(out.code(), Some(0), "{what}: {}{}", out.stdout, out.stderr);
        let j = replay_json(&out.stdout);
        assert_eq!(j["backend"], "cudaMallocAsync", "{what}: {j}");
        assert_eq!(j["completed"], Value::Bool(true), "{what}: {j}");
        assert_eq!(num(&j, "mismatches"), 0, "{what}: {j}");
        assert_eq!(num(&j, "peak_live"), live, "{what}: {j}");
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("stats dir")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(files.len(), 1, "{what}: one stats file expected: {files:?}");
        let st: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).expect("stats"))
            .expect("stats JSON");
        let allocs = num(&j, "allocs");
        assert_eq!(num(&st["calls"], "cudaMallocAsync"), allocs, "{what}: {st}");
        assert_eq!(
            num(&st, "pooled"),
            allocs,
            "{what}: every tensor from the pool: {st}"
        );
    }
}

/// Device synchronizations in the simulated driver's call log (VRAMSIM_DEBUG=1) after the
/// first `replay_torch: mark pass=2` line, up to `mark end` (a `cuMemFree` waits for the
/// device too). PyTorch makes none of its own in a replay without patterns.
fn second_pass_syncs(stderr: &str) -> usize {
    const SYNC: [&str; 4] = [
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemFree",
    ];
    let mut in_pass2 = false;
    let mut n = 0;
    for l in stderr.lines() {
        if let Some(m) = l.strip_prefix("replay_torch: mark ") {
            in_pass2 = m.starts_with("pass=2");
            continue;
        }
        let Some((name, _)) = l
            .strip_prefix("vramsim: ")
            .and_then(|r| r.split_once(" -> "))
        else {
            continue;
        };
        let base = name.trim_end_matches("_ptsz").trim_end_matches("_ptds");
        let base = base.strip_suffix("_v2").unwrap_or(base);
        if in_pass2 && SYNC.contains(&base) {
            n += 1;
        }
    }
    n
}

/// `vramshim run --pool stitch` with no other setting routes PyTorch through
/// `backend:cudaMallocAsync`: every tensor a stream-ordered allocation the pool serves, and
/// in the second pass of a repeated replay the process (pool included) makes no device
/// synchronization. The same run on the uncached route (`--pytorch-route uncached`, frees
/// that only a synchronization makes reusable) makes them: the test can fail.
#[test]
fn stitch_pool_routes_pytorch_stream_ordered_with_no_synchronization() {
    let Some(py) =
        torch_or_skip("stitch_pool_routes_pytorch_stream_ordered_with_no_synchronization")
    else {
        return;
    };
    let trace = "bert_serve.rmm.csv";
    let go = |flags: &[&str]| {
        let mut c = vramshim_run_command(&py, "torch_stitch_route", flags);
        c.env("VRAMSIM_DEBUG", "1")
            .arg(replay_script())
            .arg(trace_file(trace))
            .args(["--repeat", "2", "--marks"]);
        let out = run(&mut c);
        assert_eq!(out.code(), Some(0), "{flags:?}: {}", out.stdout);
        let j = replay_json(&out.stdout);
        assert_eq!(j["completed"], Value::Bool(true), "{flags:?}: {j}");
        (second_pass_syncs(&out.stderr), j)
    };
    let (syncs, j) = go(&["--pool", "stitch"]);
    assert_eq!(j["backend"], "cudaMallocAsync", "{j}");
    assert_eq!(j["alloc_conf"], ASYNC, "{j}");
    assert_eq!(j["no_caching"], Value::Bool(false), "{j}");
    eprintln!(
        "{trace} under --pool stitch: second-pass syncs {syncs}; PyTorch reports memory_reserved {} max_memory_reserved {} mem_get_info free {} of {}",
        j["memory_reserved"],
        j["max_memory_reserved"],
        j["mem_get_info_free"],
        j["mem_get_info_total"]
    );
    assert_eq!(
        syncs, 0,
        "second-pass synchronizations behind stream-ordered frees"
    );
    let (syncs, j) = go(&["--pool", "stitch", "--pytorch-route", "uncached"]);
    assert_eq!(j["no_caching"], Value::Bool(true), "{j}");
    eprintln!("{trace} uncached: second-pass syncs {syncs}");
    assert!(syncs > 0, "the uncached route synchronizes: {syncs}");
}

/// Under `vramshim run --pool stitch --cap` (no other setting) a cap below the replay's need
/// is PyTorch's own `torch.OutOfMemoryError`, raised from the pool's refusal of a
/// cudaMallocAsync.
#[test]
fn stitch_pool_under_a_cap_raises_torch_out_of_memory() {
    let Some(py) = torch_or_skip("stitch_pool_under_a_cap_raises_torch_out_of_memory") else {
        return;
    };
    let mut c = vramshim_run_command(
        &py,
        "torch_stitch_cap",
        &["--pool", "stitch", "--cap", "96MiB"],
    );
    c.arg(replay_script()).arg(trace_file("vit_train.rmm.csv"));
    let out = run(&mut c);
    assert_eq!(out.code(), Some(2), "{}{}", out.stdout, out.stderr);
    let j = replay_json(&out.stdout);
    assert_eq!(j["backend"], "cudaMallocAsync", "{j}");
    assert_eq!(j["completed"], Value::Bool(false), "{j}");
    assert_eq!(j["oom"]["type"], "OutOfMemoryError", "{j}");
    let msg = j["oom"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("out of memory"), "{msg}");
    assert!(num(&j["oom"], "live_bytes") < 96 << 20, "{j}");
}

/// `replay_torch.py --marks` splits a run into phases on stderr (the benchmark counts driver
/// calls between them): each half of each pass, then the end, in order.
#[test]
fn replay_marks_split_passes_and_halves() {
    let Some(py) = torch_or_skip("replay_marks_split_passes_and_halves") else {
        return;
    };
    let (out, j) = replay(
        &py,
        "torch_marks",
        "bert_serve.rmm.csv",
        DEFAULT,
        &["--limit", "300", "--repeat", "2", "--marks"],
    );
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    let marks: Vec<&str> = out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("replay_torch: mark "))
        .collect();
    assert_eq!(
        marks,
        [
            "pass=1 half=1",
            "pass=1 half=2",
            "pass=2 half=1",
            "pass=2 half=2",
            "end"
        ],
        "{}",
        out.stderr
    );
    assert!(num(&j, "allocs") > 2, "{j}");
}

/// `vramshim replay --live --sim --through pytorch TRACE`: PyTorch's JSON line, then vramshim's
/// summary of the same run's trace.
#[test]
fn vramshim_replay_live_through_pytorch() {
    let Some(py) = torch_or_skip("vramshim_replay_live_through_pytorch") else {
        return;
    };
    let exe = vramshim_testkit::vramshim_exe();
    // The run's trace goes to a directory of its own in the temporary directory (kept for the
    // user): this test's, removed after it.
    let tmp = vramshim_testkit::TempDir::new("torch-cli");
    let mut c = torch_sim_command(&exe, "torch_cli");
    c.env_remove("LD_PRELOAD")
        .env("TMPDIR", tmp.path())
        .env("VRAMSHIM_TORCH_PYTHON", &py)
        .env("PYTORCH_CUDA_ALLOC_CONF", EXPANDABLE)
        .args([
            "replay",
            "--live",
            "--sim",
            "--through",
            "pytorch",
            "--pattern",
            "sample",
        ])
        .arg(trace_file("bert_serve.rmm.csv"));
    let out = run(&mut c);
    assert_eq!(out.code(), Some(0), "{}{}", out.stdout, out.stderr);
    let j = replay_json(&out.stdout);
    assert_eq!(j["completed"], Value::Bool(true), "{j}");
    assert_eq!(j["alloc_conf"], EXPANDABLE, "{j}");
    assert_eq!(num(&j, "mismatches"), 0, "{j}");
    assert!(out.stderr.contains("vramshim: trace: "), "{}", out.stderr);
}

/// `replay --live --through pytorch` takes every format `replay` takes: the same RMM log as a
/// `.vramtrace` (imported) and as a memory-viz pickle (exported from that trace) replays the
/// same allocations through PyTorch as the CSV itself.
#[test]
fn vramshim_replay_live_through_pytorch_takes_every_format() {
    let Some(py) = torch_or_skip("vramshim_replay_live_through_pytorch_takes_every_format") else {
        return;
    };
    let exe = vramshim_testkit::vramshim_exe();
    let dir = temp_dir("torch_formats");
    let csv = trace_file("bert_serve.rmm.csv");
    let vt = dir.join("bert.vramtrace");
    let pk = dir.join("bert.pickle");
    for args in [
        vec![
            "import".as_ref(),
            csv.as_os_str(),
            "-o".as_ref(),
            vt.as_os_str(),
        ],
        vec![
            "export".as_ref(),
            vt.as_os_str(),
            "--format".as_ref(),
            "memory-viz".as_ref(),
            "-o".as_ref(),
            pk.as_os_str(),
        ],
    ] {
        let out = run(std::process::Command::new(&exe).args(&args));
        assert_eq!(out.code(), Some(0), "{args:?}: {}", out.stderr);
    }
    let mut allocs = Vec::new();
    // Where the runs' traces go (see vramshim_replay_live_through_pytorch).
    let tmp = vramshim_testkit::TempDir::new("torch-formats");
    for input in [&csv, &vt, &pk] {
        let mut c = torch_sim_command(&exe, "torch_formats");
        c.env_remove("LD_PRELOAD")
            .env("TMPDIR", tmp.path())
            .env("VRAMSHIM_TORCH_PYTHON", &py)
            .args(["replay", "--live", "--sim", "--through", "pytorch"])
            .arg(input);
        let out = run(&mut c);
        assert_eq!(
            out.code(),
            Some(0),
            "{}: {}{}",
            input.display(),
            out.stdout,
            out.stderr
        );
        assert!(!out.stderr.contains("codec can't decode"), "{}", out.stderr);
        let j = replay_json(&out.stdout);
        assert_eq!(
            j["completed"],
            Value::Bool(true),
            "{}: {j}",
            input.display()
        );
        allocs.push(num(&j, "allocs"));
    }
    assert!(allocs[0] > 2, "{allocs:?}");
    assert!(allocs.iter().all(|&a| a == allocs[0]), "{allocs:?}");
}
