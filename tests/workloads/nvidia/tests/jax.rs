//! JAX 0.10.2 with its CUDA 12 plugin (`jax[cuda12]`, XLA_PYTHON_CLIENT_ALLOCATOR=platform) on
//! cuda-sim's driver: JAX finds a CUDA device, copies data in and out intact, compiles and
//! launches a jitted step (XLA's ptxas; the kernel computes nothing here), and reports the device
//! as its memory limit; plain and under `vramshim run --sim` traced (every byte XLA's
//! allocator holds is in the trace, each allocation once), capped (XLA's limit is the cap, and
//! its out-of-memory error comes when the cap refuses) and pooled. Skipped without
//! `scripts/setup-jax` (VRAMSHIM_NVIDIA_TESTS=1 installs it, and a failed install fails).

use std::collections::HashMap;
use std::path::Path;

use vramshim_nvidia_tests::pyalloc::{self, DEVICE};
use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, run, temp_dir};
use vramshim_trace::{AllocKind, Event, TraceReader};

const MIB: u64 = 1 << 20;

/// `python jax_alloc.py N`, under `vramshim run --sim FLAGS` when flags are given, else on the
/// driver-only directory.
fn jax(n: u32, flags: Option<&[&str]>) -> RunOutput {
    let (dir, python) = jax_or_skip().expect("checked by the caller");
    let mut c = pyalloc::command(&python, &dir, "nv-jax", flags, "jax_alloc.py");
    c.env("JAX_PLATFORMS", "cuda")
        .env("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
        .arg(n.to_string());
    run(&mut c)
}

/// Ran to the end on a CUDA device of cuda-sim's driver, its data intact and its step compiled
/// and launched.
fn assert_ran(out: &RunOutput, what: &str) {
    assert!(
        out.success()
            && out.stdout.contains("devices [CudaDevice(id=0)]")
            && out.stdout.contains("intact 1")
            && out.stdout.contains("jit 1")
            && out.stdout.contains("\ndone"),
        "{what}: {}\n{}",
        out.stdout,
        out.stderr
    );
    let maps = mapped(&out.stdout);
    assert!(
        !maps.iter().any(|p| p.contains("vramsim_runtime")),
        "{what}: no cuda-sim runtime mapped: {maps:?}"
    );
    pyalloc::assert_sim_driver(&maps, what);
}

fn buffers(stdout: &str) -> usize {
    stdout.lines().filter(|l| l.starts_with("buffer ")).count()
}

#[test]
fn jax_runs_on_cuda_sim() {
    if jax_or_skip().is_none() {
        return;
    }
    let out = jax(4, None);
    assert_ran(&out, "plain");
    assert_eq!(field(&out.stdout, "limit"), DEVICE, "{}", out.stdout);
    assert_eq!(buffers(&out.stdout), 4, "{}", out.stdout);
}

/// The device memory XLA's allocator says it holds (`pool_bytes`: it maps cuMemCreate handles
/// and grows them as arrays come) is exactly what the trace holds live at the end: every
/// allocation seen, none twice (a handle traced twice, or one missed, changes the sum).
fn assert_trace_holds_what_xla_holds(trace: &Path, stdout: &str, what: &str) {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut twice = Vec::new();
    let mut vmm = 0;
    for e in TraceReader::open(trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display())) {
        match e.expect("decodes") {
            Event::Alloc(m) if m.result == 0 && m.kind == AllocKind::VmmHandle => {
                vmm += 1;
                if live.insert(m.addr, m.size).is_some() {
                    twice.push(m.addr);
                }
            }
            Event::Free(m) if m.result == 0 && m.kind == AllocKind::VmmHandle => {
                live.remove(&m.addr);
            }
            _ => {}
        }
    }
    assert!(twice.is_empty(), "{what}: handles traced twice: {twice:x?}");
    assert!(
        vmm >= 2,
        "{what}: XLA's platform allocator maps cuMemCreate handles"
    );
    let held: u64 = live.values().sum();
    assert_eq!(
        held,
        field(stdout, "pool_bytes"),
        "{what}: {live:x?}\n{stdout}"
    );
    assert!(
        held >= field(stdout, "in_use"),
        "{what}: the arrays fit in what is held: {stdout}"
    );
}

#[test]
fn traced_jax_allocations_appear_once() {
    if jax_or_skip().is_none() {
        return;
    }
    let trace = temp_dir("nv-jax-trace").join("t.vramtrace");
    let out = jax(4, Some(&["--trace", trace.to_str().unwrap()]));
    assert_ran(&out, "traced");
    assert_eq!(buffers(&out.stdout), 4, "{}", out.stdout);
    assert_trace_holds_what_xla_holds(&trace, &out.stdout, "traced");
}

#[test]
fn capped_jax_sees_the_cap_and_runs_out_of_memory() {
    if jax_or_skip().is_none() {
        return;
    }
    let trace = temp_dir("nv-jax-cap").join("t.vramtrace");
    let out = jax(
        8,
        Some(&["--cap", "256MiB", "--trace", trace.to_str().unwrap()]),
    );
    assert_ran(&out, "capped");
    assert_eq!(
        field(&out.stdout, "limit"),
        256 * MIB,
        "XLA's memory limit is the cap: {}",
        out.stdout
    );
    // XLA grows its pool by doubling: 3 x 64 MiB fit under 256 MiB beside the small arrays,
    // then the growth it asks for is refused and XLA raises RESOURCE_EXHAUSTED.
    assert!(
        out.stdout.contains("oom after 3 ") && out.stdout.contains("RESOURCE_EXHAUSTED"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stderr.contains("refused") && out.stderr.contains("cap 256 MiB"),
        "vramshim says why: {}",
        out.stderr
    );
    assert_trace_holds_what_xla_holds(&trace, &out.stdout, "capped");
}

#[test]
fn pooled_jax_keeps_its_data() {
    if jax_or_skip().is_none() {
        return;
    }
    let out = jax(4, Some(&["--pool", "stitch"]));
    assert_ran(&out, "pooled");
    assert_eq!(buffers(&out.stdout), 4, "{}", out.stdout);
}
