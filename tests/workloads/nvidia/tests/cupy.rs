//! CuPy 14.2 (cupy-cuda12x, which links NVIDIA's runtime 12.9 statically into its extension
//! modules) on cuda-sim's driver: its default memory pool, `set_allocator(None)` and
//! `MemoryAsyncPool` copy data in and out intact and see the device in `memGetInfo`, plain and
//! under `vramshim run --sim` traced (each array's allocation appears once), capped (the cap is
//! what `memGetInfo` reports, and the fourth 64 MiB array over 256 MiB is refused) and pooled.
//! Kernels are not used: CuPy compiles them with NVRTC at run time. Skipped without
//! `scripts/setup-cupy` (VRAMSHIM_NVIDIA_TESTS=1 installs it, and a failed install fails).

use vramshim_nvidia_tests::pyalloc::{self, DEVICE};
use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, run, temp_dir};
use vramshim_trace::{Event, TraceReader};

const MODES: [&str; 3] = ["default", "none", "async"];

/// `python cupy_alloc.py MODE N`, under `vramshim run --sim FLAGS` when flags are given, else
/// on the driver-only directory (what a machine with NVIDIA's driver offers).
fn cupy(mode: &str, n: u32, flags: Option<&[&str]>) -> RunOutput {
    let (dir, python) = cupy_or_skip().expect("checked by the caller");
    let mut c = pyalloc::command(
        &python,
        &dir,
        &format!("nv-cupy-{mode}"),
        flags,
        "cupy_alloc.py",
    );
    c.arg(mode).arg(n.to_string());
    run(&mut c)
}

/// Ran to the end with its data intact, on cuda-sim's driver with no runtime library mapped
/// (CuPy's is linked in) and no cuda-sim runtime.
fn assert_ran(out: &RunOutput, what: &str) {
    pyalloc::assert_ran(out, what, &[]);
}

fn arrays(stdout: &str) -> Vec<u64> {
    pyalloc::values(stdout, "array")
}

#[test]
fn cupy_allocates_and_copies_on_cuda_sim() {
    if cupy_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = cupy(mode, 3, None);
        assert_ran(&out, mode);
        assert_eq!(
            field(&out.stdout, "total"),
            DEVICE,
            "{mode}: {}",
            out.stdout
        );
        assert_eq!(arrays(&out.stdout).len(), 3, "{mode}: {}", out.stdout);
    }
}

#[test]
fn traced_cupy_allocations_appear_once() {
    if cupy_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let trace = temp_dir(&format!("nv-cupy-trace-{mode}")).join("t.vramtrace");
        let out = cupy(mode, 3, Some(&["--trace", trace.to_str().unwrap()]));
        assert_ran(&out, mode);
        let allocs: Vec<u64> = TraceReader::open(&trace)
            .unwrap_or_else(|e| panic!("{}: {e}", trace.display()))
            .filter_map(|e| match e.expect("decodes") {
                Event::Alloc(m) if m.result == 0 => Some(m.addr),
                _ => None,
            })
            .collect();
        let arrays = arrays(&out.stdout);
        assert_eq!(arrays.len(), 3, "{mode}: {}", out.stdout);
        for a in arrays {
            let seen = allocs.iter().filter(|x| **x == a).count();
            assert_eq!(seen, 1, "{mode}: array at {a:#x} traced once: {allocs:x?}");
        }
    }
}

#[test]
fn capped_cupy_sees_the_cap_and_is_refused() {
    if cupy_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = cupy(mode, 8, Some(&["--cap", "256MiB"]));
        assert_ran(&out, mode);
        assert_eq!(
            field(&out.stdout, "total"),
            256 << 20,
            "{mode}: memGetInfo reports the cap: {}",
            out.stdout
        );
        // 3 x 64 MiB and the 3 small arrays fit under 256 MiB; the fourth 64 MiB does not.
        assert!(
            out.stdout.contains("oom after 3 "),
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
fn pooled_cupy_keeps_its_data() {
    if cupy_or_skip().is_none() {
        return;
    }
    for mode in MODES {
        let out = cupy(mode, 3, Some(&["--pool", "stitch"]));
        assert_ran(&out, mode);
        assert_eq!(arrays(&out.stdout).len(), 3, "{mode}: {}", out.stdout);
    }
}
