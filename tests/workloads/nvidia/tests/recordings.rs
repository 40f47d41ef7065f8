//! The GPU-side training recordings in tests/workloads/traces/gpu (scripts/record-training)
//! are what their README says: each `.vramtrace` decodes; PyTorch's tensors arrive one by one
//! as `cudaMallocAsync`/`cudaFreeAsync` from two threads (the main thread and the autograd
//! engine's), cuBLAS's handle buffers through `cuMemAlloc`; and the `.rmm.csv` beside it is the
//! trace's device allocations and frees in time order, row for row. Needs no GPU and no PyTorch.

use std::collections::BTreeSet;
use std::path::PathBuf;

use vramshim_testkit::repo_root;
use vramshim_trace::{Api, Event, MemOp, TraceReader};

fn dir() -> PathBuf {
    repo_root().join("tests/workloads/traces/gpu")
}

/// Successful device allocations and frees of the trace, in order: (is_alloc, op).
fn device_ops(model: &str) -> Vec<(bool, MemOp)> {
    let p = dir().join(format!("{model}_train.vramtrace"));
    TraceReader::open(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .filter_map(|e| match e.expect("the recording decodes") {
            Event::Alloc(m) if m.result == 0 && m.kind.is_device() => Some((true, m)),
            Event::Free(m) if m.result == 0 && m.kind.is_device() => Some((false, m)),
            _ => None,
        })
        .collect()
}

fn check(model: &str, allocs: usize, frees: usize) {
    let ops = device_ops(model);
    let n_allocs = ops.iter().filter(|(a, _)| *a).count();
    assert_eq!(
        (n_allocs, ops.len() - n_allocs),
        (allocs, frees),
        "{model}: allocations and frees as tests/workloads/traces/README.md says"
    );
    let tensor_threads: BTreeSet<u32> = ops
        .iter()
        .filter(|(a, m)| *a && m.api == Api::CudaMallocAsync)
        .map(|(_, m)| m.tid)
        .collect();
    assert!(
        tensor_threads.len() >= 2,
        "{model}: tensors from the main and the autograd threads: {tensor_threads:?}"
    );
    let driver: Vec<u64> = ops
        .iter()
        .filter(|(a, m)| *a && m.api == Api::CuMemAlloc)
        .map(|(_, m)| m.size)
        .collect();
    assert!(
        driver.contains(&(64 << 20)),
        "{model}: cuBLAS's handle buffers through the driver API: {driver:?}"
    );

    let csv_path = dir().join(format!("{model}_train.rmm.csv"));
    let csv = std::fs::read_to_string(&csv_path)
        .unwrap_or_else(|e| panic!("{}: {e}", csv_path.display()));
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("Thread,Time,Action,Pointer,Size,Stream"));
    let rows: Vec<(u32, bool, u64, u64, u64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 6, "{l}");
            (
                f[0].parse().unwrap(),
                f[2] == "allocate",
                u64::from_str_radix(f[3].trim_start_matches("0x"), 16).unwrap(),
                f[4].parse().unwrap(),
                f[5].parse().unwrap(),
            )
        })
        .collect();
    // The CSV is in time order; the trace holds each thread's records in its order, with
    // threads interleaved by when their buffers were written.
    let mut by_time: Vec<&(bool, MemOp)> = ops.iter().collect();
    by_time.sort_by_key(|(_, m)| m.t_ns);
    let want: Vec<(u32, bool, u64, u64, u64)> = by_time
        .into_iter()
        .map(|(a, m)| (m.tid, *a, m.addr, m.size, m.stream))
        .collect();
    assert_eq!(
        rows.len(),
        want.len(),
        "{model}: one CSV row per device event"
    );
    for (i, (r, w)) in rows.iter().zip(&want).enumerate() {
        assert_eq!(
            r,
            w,
            "{model}: CSV row {} against the trace's device event",
            i + 2
        );
    }
}

#[test]
fn mlp_recording() {
    check("mlp", 320, 290);
}

#[test]
fn gpt2_recording() {
    check("gpt2", 1810, 1776);
}

#[test]
fn vit_recording() {
    check("vit", 1816, 1766);
}
