//! RMM 26.10 (rmm-cu12; librmm links NVIDIA's runtime 12.9 statically) on cuda-sim's driver:
//! CudaMemoryResource, PoolMemoryResource, ArenaMemoryResource and CudaAsyncMemoryResource copy
//! data in and out intact and see the device in memGetInfo, plain and under `vramshim run
//! --sim` traced (RMM's logging adaptor's CSV, imported by `vramshim import`, equals vramshim's
//! own trace of the same run row for row), capped (the cap is what memGetInfo reports, the
//! refusal surfaces as RMM's out_of_memory) and pooled. Skipped without `scripts/setup-rmm`
//! (VRAMSHIM_NVIDIA_TESTS=1 installs it, and a failed install fails).

use std::path::{Path, PathBuf};

use vramshim_nvidia_tests::pyalloc::{self, DEVICE};
use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, run, temp_dir};
use vramshim_trace::{AllocKind, Api, Event, TraceReader};

const RESOURCES: [&str; 4] = ["cuda", "pool", "arena", "async"];
const MIB: u64 = 1 << 20;

/// `python rmm_alloc.py RESOURCE N [LOG]`, under `vramshim run --sim FLAGS` when flags are
/// given, else on the driver-only directory (what a machine with NVIDIA's driver offers).
fn rmm(resource: &str, n: u32, log: Option<&Path>, flags: Option<&[&str]>) -> RunOutput {
    let (dir, python) = rmm_or_skip().expect("checked by the caller");
    let name = format!("nv-rmm-{resource}");
    let mut c = pyalloc::command(&python, &dir, &name, flags, "rmm_alloc.py");
    c.env_remove("RMM_LOG_FILE")
        .arg(resource)
        .arg(n.to_string());
    if let Some(l) = log {
        c.arg(l);
    }
    run(&mut c)
}

/// Ran to the end with its data intact, on cuda-sim's driver with no runtime library mapped
/// (librmm's is linked in) and no cuda-sim runtime.
fn assert_ran(out: &RunOutput, what: &str) {
    pyalloc::assert_ran(out, what, &[]);
    let maps = mapped(&out.stdout);
    assert!(
        maps.iter().any(|p| p.ends_with("/librmm.so")),
        "{what}: librmm is loaded: {maps:?}"
    );
}

fn buffers(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("buffer ")?.trim().parse().ok())
        .collect()
}

#[test]
fn rmm_resources_run_on_cuda_sim() {
    if rmm_or_skip().is_none() {
        return;
    }
    for r in RESOURCES {
        let out = rmm(r, 3, None, None);
        assert_ran(&out, r);
        assert_eq!(field(&out.stdout, "total"), DEVICE, "{r}: {}", out.stdout);
        assert_eq!(buffers(&out.stdout).len(), 3, "{r}: {}", out.stdout);
    }
}

/// One row of RMM's log, or one device-memory event of vramshim's trace, as the log has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    alloc: bool,
    /// An allocation refused (RMM's `allocate failure`; in the trace an out-of-memory result).
    failed: bool,
    addr: u64,
    size: u64,
    stream: u64,
    /// The CUDA call took a stream (trace side only; the log does not say).
    stream_ordered: bool,
}

fn events(path: &Path) -> Vec<Event> {
    TraceReader::open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e:?}", path.display())))
        .collect()
}

fn stream_ordered(api: Api) -> bool {
    matches!(
        api,
        Api::CudaMallocAsync
            | Api::CudaFreeAsync
            | Api::CudaMallocFromPoolAsync
            | Api::CuMemAllocAsync
            | Api::CuMemFreeAsync
            | Api::CuMemAllocFromPoolAsync
    )
}

/// vramshim's trace as RMM would log it: device memory (not pinned host memory), successful
/// allocations and frees, and allocations refused as out of memory (code 2). Other failed
/// calls are left out: NVIDIA's runtime first tries a stream-ordered allocation before it has
/// made its context current, gets CUDA_ERROR_INVALID_CONTEXT (201), makes it current and
/// retries, and RMM only ever sees the retry.
fn trace_rows(path: &Path) -> Vec<Row> {
    events(path)
        .into_iter()
        .filter_map(|e| {
            let (alloc, m) = match e {
                Event::Alloc(m) => (true, m),
                Event::Free(m) => (false, m),
                _ => return None,
            };
            let failed = m.result == 2 && alloc;
            if m.kind == AllocKind::Host || m.device < 0 || (m.result != 0 && !failed) {
                return None;
            }
            Some(Row {
                alloc,
                failed,
                addr: m.addr,
                size: m.size,
                stream: m.stream,
                stream_ordered: stream_ordered(m.api),
            })
        })
        .collect()
}

/// RMM's log through `vramshim import`, read back.
fn imported_rows(log: &Path) -> Vec<Row> {
    let out_trace = log.with_extension("vramtrace");
    let mut c = std::process::Command::new(vramshim_testkit::vramshim_exe());
    c.arg("import").arg(log).arg("-o").arg(&out_trace);
    let out = run(&mut c);
    assert!(
        out.success(),
        "vramshim import {}: {}",
        log.display(),
        out.stderr
    );
    events(&out_trace)
        .into_iter()
        .filter_map(|e| match e {
            Event::Alloc(m) => Some(Row {
                alloc: true,
                failed: m.result != 0,
                addr: m.addr,
                size: m.size,
                stream: m.stream,
                stream_ordered: false,
            }),
            Event::Free(m) => Some(Row {
                alloc: false,
                failed: false,
                addr: m.addr,
                size: m.size,
                stream: m.stream,
                stream_ordered: false,
            }),
            _ => None,
        })
        .collect()
}

/// RMM names its log `<name>.dev<device>.csv`.
fn log_file(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("rmm.csv"), dir.join("rmm.dev0.csv"))
}

/// The log and the trace agree row for row: the same action, outcome, address and size in the
/// same order, and the same stream wherever the CUDA call takes one. A synchronous cudaMalloc
/// takes none (the trace says 0, the legacy default stream); RMM logs the stream its request
/// was made on, here the legacy default stream as 0 or as cudaStreamLegacy (1, the pool grows
/// on it).
fn assert_same_rows(log: &[Row], trace: &[Row], what: &str) {
    let show = || format!("{what}:\nRMM's log:\n{log:#x?}\nvramshim's trace:\n{trace:#x?}");
    assert_eq!(log.len(), trace.len(), "{}", show());
    for (i, (l, t)) in log.iter().zip(trace).enumerate() {
        let same = l.alloc == t.alloc
            && l.failed == t.failed
            && l.size == t.size
            && (l.failed || l.addr == t.addr)
            && if t.stream_ordered {
                l.stream == t.stream
            } else {
                t.stream == 0 && (l.stream == 0 || l.stream == 1)
            };
        assert!(same, "row {i}: {l:x?} != {t:x?}\n{}", show());
    }
}

/// RMM's logging adaptor wraps the resource that calls CUDA, so each of its rows is one CUDA
/// allocation or free; `vramshim import` of that CSV must then equal vramshim's own trace of the
/// same run, traced alone, under the pool, and under a cap (the refusals included).
#[test]
fn rmm_log_imported_equals_the_trace_row_for_row() {
    if rmm_or_skip().is_none() {
        return;
    }
    for r in RESOURCES {
        for (setup, flags, n) in [
            ("traced", &[][..], 3),
            ("pooled", &["--pool", "stitch"][..], 3),
            ("capped", &["--cap", "256MiB"][..], 8),
        ] {
            let what = format!("{r} {setup}");
            let dir = temp_dir(&format!("nv-rmm-log-{r}-{setup}"));
            let trace = dir.join("t.vramtrace");
            let (log, written) = log_file(&dir);
            let mut f = vec!["--trace", trace.to_str().unwrap()];
            f.extend_from_slice(flags);
            let out = rmm(r, n, Some(&log), Some(&f));
            assert_ran(&out, &what);
            let log_rows = imported_rows(&written);
            let trace_rows = trace_rows(&trace);
            assert!(
                log_rows.iter().filter(|r| r.alloc && !r.failed).count() >= 1
                    && log_rows.iter().filter(|r| !r.alloc).count() >= 1,
                "{what}: the log has allocations and frees: {log_rows:x?}"
            );
            assert_same_rows(&log_rows, &trace_rows, &what);
            if setup == "capped" && r != "arena" {
                assert!(
                    log_rows.iter().any(|r| r.failed),
                    "{what}: a refusal is in the log: {log_rows:x?}"
                );
            }
            if r == "cuda" || r == "async" {
                // Without a suballocator each buffer is a CUDA allocation of its own.
                for b in buffers(&out.stdout) {
                    let seen = trace_rows.iter().filter(|t| t.alloc && t.addr == b).count();
                    assert_eq!(
                        seen, 1,
                        "{what}: buffer {b:#x} traced once: {trace_rows:x?}"
                    );
                }
            }
        }
    }
}

#[test]
fn capped_rmm_sees_the_cap_and_raises_its_out_of_memory() {
    if rmm_or_skip().is_none() {
        return;
    }
    for r in RESOURCES {
        let out = rmm(r, 8, None, Some(&["--cap", "256MiB"]));
        assert_ran(&out, r);
        assert_eq!(
            field(&out.stdout, "total"),
            256 * MIB,
            "{r}: memGetInfo reports the cap: {}",
            out.stdout
        );
        // RMM raises its out_of_memory (a std::bad_alloc, MemoryError in Python), not a generic
        // CUDA error.
        let oom = out
            .stdout
            .lines()
            .find(|l| l.starts_with("oom after "))
            .unwrap_or_else(|| panic!("{r}: refused: {}\n{}", out.stdout, out.stderr));
        assert!(oom.contains("out_of_memory"), "{r}: {oom}");
        let kept = buffers(&out.stdout).len();
        match r {
            // 2 x 1 MiB + 3 x 64 MiB fit under 256 MiB; the fourth 64 MiB does not.
            "cuda" | "async" | "pool" => assert_eq!(kept, 3, "{r}: {}", out.stdout),
            // RMM sizes its arena at half the free memory memGetInfo reports, 128 MiB under the
            // cap: one 64 MiB buffer beside the copies, then the arena is full (RMM's own
            // refusal, the cap never reached).
            _ => {
                assert_eq!(kept, 1, "{r}: {}", out.stdout);
                assert!(oom.contains("arena"), "{r}: {oom}");
            }
        }
        if r != "arena" {
            assert!(
                out.stderr.contains("refused") && out.stderr.contains("cap 256 MiB"),
                "{r}: vramshim says why: {}",
                out.stderr
            );
        }
    }
}

#[test]
fn pooled_rmm_keeps_its_data() {
    if rmm_or_skip().is_none() {
        return;
    }
    for r in RESOURCES {
        let out = rmm(r, 3, None, Some(&["--pool", "stitch"]));
        assert_ran(&out, r);
        assert_eq!(buffers(&out.stdout).len(), 3, "{r}: {}", out.stdout);
    }
}
