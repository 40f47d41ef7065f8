//! cuda.bindings 12.9 (cuda-bindings, whose runtime module links NVIDIA's runtime 12.9
//! statically and whose driver module loads `libcuda.so.1`) on cuda-sim's driver: the runtime's
//! cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync, the driver's cuMemAlloc/cuMemFree
//! and cuMemCreate/cuMemMap, each copying data in and out intact, plain and under `vramshim run
//! --sim` traced (each allocation appears once, with its free), capped (memGetInfo reports the
//! cap and the fourth 64 MiB buffer over 256 MiB is refused with the path's out-of-memory code)
//! and pooled. Skipped without `scripts/setup-rmm`, which installs cuda-bindings with RMM
//! (VRAMSHIM_NVIDIA_TESTS=1 installs it, and a failed install fails).

use vramshim_nvidia_tests::pyalloc::{self, DEVICE, values};
use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, run, temp_dir};
use vramshim_trace::{AllocKind, Event, TraceReader};

const MODES: [&str; 4] = ["malloc", "async", "driver", "vmm"];
const MIB: u64 = 1 << 20;

/// `python cuda_bindings_alloc.py MODE N`, under `vramshim run --sim FLAGS` when flags are
/// given, else on the driver-only directory.
fn bindings(mode: &str, n: u32, flags: Option<&[&str]>) -> RunOutput {
    let (dir, python) = rmm_or_skip().expect("checked by the caller");
    let name = format!("nv-bindings-{mode}");
    let mut c = pyalloc::command(&python, &dir, &name, flags, "cuda_bindings_alloc.py");
    c.arg(mode).arg(n.to_string());
    run(&mut c)
}

/// Ran to the end with its data intact, every buffer freed, on cuda-sim's driver with no
/// runtime library mapped (cuda.bindings' is linked in).
fn assert_ran(out: &RunOutput, what: &str) {
    pyalloc::assert_ran(out, what, &["\nfreed"]);
}

#[test]
fn cuda_bindings_allocate_and_copy_on_cuda_sim() {
    if rmm_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = bindings(mode, 3, None);
        assert_ran(&out, mode);
        assert_eq!(
            field(&out.stdout, "total"),
            DEVICE,
            "{mode}: {}",
            out.stdout
        );
        assert_eq!(
            values(&out.stdout, "buffer").len(),
            3,
            "{mode}: {}",
            out.stdout
        );
    }
}

/// Every allocation the program made (two small buffers and three of 64 MiB: their device
/// addresses, or for `vmm` their cuMemCreate handles) appears exactly once in the trace
/// as a successful allocation of its size, and once as a free: nothing missed, nothing
/// counted twice by the runtime's and the driver's hooks both.
#[test]
fn traced_cuda_bindings_allocations_appear_once() {
    if rmm_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let trace = temp_dir(&format!("nv-bindings-trace-{mode}")).join("t.vramtrace");
        let out = bindings(mode, 3, Some(&["--trace", trace.to_str().unwrap()]));
        assert_ran(&out, mode);
        let events: Vec<Event> = TraceReader::open(&trace)
            .unwrap_or_else(|e| panic!("{}: {e}", trace.display()))
            .map(|e| e.expect("decodes"))
            .collect();
        let device = |m: &vramshim_trace::MemOp| m.kind != AllocKind::Host && m.device >= 0;
        let allocs: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(m) if m.result == 0 && device(m) => Some((m.addr, m.size)),
                _ => None,
            })
            .collect();
        let frees: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Free(m) if m.result == 0 && device(m) => Some(m.addr),
                _ => None,
            })
            .collect();
        let made: Vec<(u64, u64)> = out
            .stdout
            .lines()
            .filter_map(|l| {
                let mut w = l.strip_prefix("alloc ")?.split(' ');
                Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
            })
            .collect();
        // The buffers' own sizes (cuMemCreate's rounded up to the 2 MiB granularity).
        let small = if mode == "vmm" { 2 * MIB } else { MIB };
        let sizes: Vec<u64> = made.iter().map(|m| m.1).collect();
        assert_eq!(
            sizes,
            [small, small, 64 * MIB, 64 * MIB, 64 * MIB],
            "{mode}: {}",
            out.stdout
        );
        assert_eq!(
            allocs.len(),
            5,
            "{mode}: only the program's allocations: {allocs:x?}"
        );
        for (id, size) in &made {
            let seen: Vec<_> = allocs.iter().filter(|a| a.0 == *id).collect();
            assert_eq!(
                seen,
                [&(*id, *size)],
                "{mode}: {id:#x} traced once: {allocs:x?}"
            );
            let freed = frees.iter().filter(|f| **f == *id).count();
            assert_eq!(freed, 1, "{mode}: {id:#x} freed once: {frees:x?}");
        }
    }
}

#[test]
fn capped_cuda_bindings_see_the_cap_and_are_refused() {
    if rmm_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = bindings(mode, 8, Some(&["--cap", "256MiB"]));
        assert_ran(&out, mode);
        assert_eq!(
            field(&out.stdout, "total"),
            256 * MIB,
            "{mode}: memGetInfo reports the cap: {}",
            out.stdout
        );
        // 2 small buffers and 3 x 64 MiB fit under 256 MiB; the fourth 64 MiB does not, and
        // the program sees its path's own out-of-memory code.
        let want = if matches!(mode, "malloc" | "async") {
            "cudaErrorMemoryAllocation"
        } else {
            "CUDA_ERROR_OUT_OF_MEMORY"
        };
        assert!(
            out.stdout.contains("oom after 3 ") && out.stdout.contains(want),
            "{mode}: {}\n{}",
            out.stdout,
            out.stderr
        );
        assert!(
            out.stderr.contains("refused") && out.stderr.contains("cap 256 MiB"),
            "{mode}: vramshim says why: {}",
            out.stderr
        );
    }
}

#[test]
fn pooled_cuda_bindings_keep_their_data() {
    if rmm_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = bindings(mode, 3, Some(&["--pool", "stitch"]));
        assert_ran(&out, mode);
        assert_eq!(
            values(&out.stdout, "buffer").len(),
            3,
            "{mode}: {}",
            out.stdout
        );
    }
}
