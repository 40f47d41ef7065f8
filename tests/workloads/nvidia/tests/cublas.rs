//! A plain C cuBLAS program (NVIDIA's cuBLAS 13.4 and runtime 13.2 from the wheels):
//! `cublasCreate`, `cublasSgemm`, `cublasDestroy` complete on cuda-sim's driver (kernels are
//! not executed, so C's values are not checked), plain, with `libvramshim.so` preloaded, and
//! traced under `vramshim run`.

use std::path::{Path, PathBuf};

use vramshim_nvidia_tests::*;
use vramshim_testkit::{RunOutput, interposer_lib, run, sim_command, temp_dir};
use vramshim_trace::{Event, TraceReader};

/// Matrix side: 72 x 72 floats = 20736 bytes, a size nothing else allocates.
const N: &str = "72";
const MATRIX_BYTES: u64 = 72 * 72 * 4;

fn sgemm(wheels: &Path) -> PathBuf {
    let lib = Runtime::Shared13.lib_dir(wheels);
    build(
        "cublas_sgemm.c",
        Runtime::Shared13,
        wheels,
        &[&format!("-L{}", lib.display()), "-l:libcublas.so.13"],
    )
}

fn assert_completed(out: &RunOutput, what: &str, wheels: &Path) {
    assert!(
        out.success() && out.stdout.contains("\ndone"),
        "{what}: {}\n{}",
        out.stdout,
        out.stderr
    );
    assert_nvidia_runtime_on_sim_driver(&out.stdout, Runtime::Shared13, wheels);
    let lib = Runtime::Shared13.lib_dir(wheels);
    for l in ["libcublas.so.13", "libcublasLt.so.13"] {
        let want = lib.join(l);
        assert!(
            mapped(&out.stdout).contains(&want.to_str().unwrap()),
            "{what}: {l} from the wheel is mapped: {}",
            out.stdout
        );
    }
}

#[test]
fn cublas_sgemm_completes_on_the_simulated_gpu() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    let exe = sgemm(&wheels);
    let mut c = sim_command(&exe, "nv-sgemm");
    c.env("LD_LIBRARY_PATH", driver_only_dir()).args([N, "3"]);
    assert_completed(&run(&mut c), "plain", &wheels);
}

/// With the interposer preloaded, cuBLAS, cuBLASLt and the runtime inside them reach the same
/// driver (the one libcuda.so.1 on the library path).
#[test]
fn cublas_sgemm_completes_with_the_interposer_preloaded() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    let exe = sgemm(&wheels);
    let mut c = sim_command(&exe, "nv-sgemm-pre");
    c.env("LD_LIBRARY_PATH", driver_only_dir())
        .env("LD_PRELOAD", interposer_lib())
        .args([N, "3"]);
    assert_completed(&run(&mut c), "preloaded", &wheels);
}

#[test]
fn cublas_sgemm_traced_sees_each_matrix_once() {
    let Some(wheels) = wheels_or_skip() else {
        return;
    };
    let exe = sgemm(&wheels);
    let trace = temp_dir("nv-sgemm-trace").join("t.vramtrace");
    let mut c = sim_command(vramshim_testkit::vramshim_exe(), "nv-sgemm-run");
    c.args(["run", "--sim", "--trace", trace.to_str().unwrap(), "--"])
        .arg(&exe)
        .args([N, "3"]);
    let out = run(&mut c);
    assert_completed(&out, "vramshim run --trace", &wheels);
    let r = TraceReader::open(&trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
    let events: Vec<Event> = r.map(|e| e.expect("decodes")).collect();
    let matrices = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(m) if m.result == 0 && m.size == MATRIX_BYTES))
        .count();
    assert_eq!(matrices, 3, "A, B and C, each seen once");
    let allocs = events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(m) if m.result == 0))
        .count();
    let frees = events
        .iter()
        .filter(|e| matches!(e, Event::Free(_)))
        .count();
    assert!(
        allocs >= 3 && frees >= 3,
        "{allocs} allocations, {frees} frees"
    );
}
