//! PyTorch with its own bundled CUDA runtime (`libcudart.so.13` of the nvidia-cuda-runtime
//! wheel it pins, not cuda-sim's) trains a small MLP with AdamW on cuda-sim's driver: plain,
//! traced (every segment PyTorch's allocator holds appears once), capped (a
//! torch.OutOfMemoryError in the middle of training, with vramshim's refusal message) and
//! pooled; a conv net with cuDNN; and the backward of `.pow(2)`, whose kernel library the runtime
//! loads on the autograd thread without a current context. Kernels do not run; the allocations
//! are real. Skipped without the PyTorch
//! environment of scripts/setup-torch (VRAMSHIM_TORCH_TESTS=1 installs it).

use std::path::Path;
use std::process::Command;

use vramshim_nvidia_tests::*;
use vramshim_pytorch_tests::torch_or_skip;
use vramshim_testkit::{RunOutput, profile_dir, repo_root, run, sim_command, temp_dir};
use vramshim_trace::{Event, TraceReader};

fn script(name: &str) -> String {
    repo_root()
        .join("tests/workloads/nvidia/py")
        .join(name)
        .display()
        .to_string()
}

/// `python train_mlp.py args`, under `vramshim run flags` when flags are given (no `--sim`:
/// the program's own runtime runs; the driver-only directory stands for the installed driver).
fn train(python: &Path, flags: Option<&[&str]>, args: &[&str]) -> RunOutput {
    train_with("train_mlp.py", python, flags, args)
}

fn train_with(name: &str, python: &Path, flags: Option<&[&str]>, args: &[&str]) -> RunOutput {
    let mut c: Command = match flags {
        None => sim_command(python, "nv-torch"),
        Some(f) => {
            let mut c = sim_command(vramshim_testkit::vramshim_exe(), "nv-torch-run");
            c.arg("run").args(f).arg("--").arg(python);
            c
        }
    };
    c.env("LD_LIBRARY_PATH", driver_only_dir())
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .arg(script(name))
        .args(args);
    run(&mut c)
}

fn assert_bundled_runtime(out: &RunOutput) {
    let maps = mapped(&out.stdout);
    let runtimes: Vec<&&str> = maps.iter().filter(|p| p.contains("libcudart")).collect();
    assert!(
        runtimes.len() == 1
            && runtimes[0].contains("site-packages/nvidia/cu13/lib/libcudart.so.13"),
        "PyTorch's own runtime, only: {maps:?}"
    );
    assert!(
        maps.iter().any(|p| p.contains("libcublasLt.so.13")),
        "cuBLAS ran: {maps:?}"
    );
    assert!(
        maps.iter()
            .filter(|p| p.contains("libcuda.so") || p.contains("vramsim_driver"))
            .all(|p| Path::new(p).starts_with(profile_dir().canonicalize().unwrap())),
        "cuda-sim's driver: {maps:?}"
    );
}

fn ok(out: &RunOutput, what: &str) {
    assert!(
        out.success() && out.stdout.contains("\ndone"),
        "{what}: {}\n{}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn pytorch_trains_an_mlp_with_its_bundled_runtime() {
    let Some(python) = torch_or_skip("pytorch_trains_an_mlp_with_its_bundled_runtime") else {
        return;
    };
    let out = train(&python, None, &["5", "256"]);
    ok(&out, "plain");
    assert_bundled_runtime(&out);
    assert!(field(&out.stdout, "segments") >= 1, "{}", out.stdout);
}

#[test]
fn traced_every_pytorch_segment_once() {
    let Some(python) = torch_or_skip("traced_every_pytorch_segment_once") else {
        return;
    };
    let trace = temp_dir("nv-torch-trace").join("t.vramtrace");
    let out = train(
        &python,
        Some(&["--trace", trace.to_str().unwrap()]),
        &["5", "256"],
    );
    ok(&out, "traced");
    assert_bundled_runtime(&out);
    let r = TraceReader::open(&trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
    let allocs: Vec<(u64, u64)> = r
        .filter_map(|e| match e.expect("decodes") {
            Event::Alloc(m) if m.result == 0 => Some((m.addr, m.size)),
            _ => None,
        })
        .collect();
    let segments: Vec<(u64, u64)> = out
        .stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("segment ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    assert!(!segments.is_empty(), "{}", out.stdout);
    for s in &segments {
        let seen = allocs.iter().filter(|a| *a == s).count();
        assert_eq!(seen, 1, "segment {s:?} traced once: {allocs:?}");
    }
}

#[test]
fn capped_pytorch_runs_out_of_memory_mid_training() {
    let Some(python) = torch_or_skip("capped_pytorch_runs_out_of_memory_mid_training") else {
        return;
    };
    // The batch grows 4-fold a step: step 5 needs a 128 MiB activation over a 400 MiB cap.
    let out = train(&python, Some(&["--cap", "400MiB"]), &["8", "1024", "4"]);
    assert_eq!(out.code(), Some(3), "{}\n{}", out.stdout, out.stderr);
    let step: u32 = out
        .stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("oom at step ")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no oom line: {}", out.stdout));
    assert!(
        step > 0,
        "training ran before the cap was reached: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("refused") && out.stderr.contains("cap 400 MiB"),
        "vramshim says why: {}",
        out.stderr
    );
}

#[test]
fn pooled_pytorch_trains() {
    let Some(python) = torch_or_skip("pooled_pytorch_trains") else {
        return;
    };
    let out = train(&python, Some(&["--pool", "stitch"]), &["5", "256"]);
    ok(&out, "pooled");
    assert_bundled_runtime(&out);
}

/// The backward pass of `.pow(2)`: on PyTorch's autograd thread NVIDIA's runtime loads a
/// kernel library before it makes its context current there; the driver loads it (a CUDA 12
/// library belongs to no context), where it answered "invalid device context" before.
#[test]
fn pytorch_backward_of_pow_on_the_autograd_thread() {
    let Some(python) = torch_or_skip("pytorch_backward_of_pow_on_the_autograd_thread") else {
        return;
    };
    let out = train_with("pow_backward.py", &python, None, &[]);
    ok(&out, "pow backward");
    assert_bundled_runtime(&out);
    assert!(out.stdout.contains("grad True"), "{}", out.stdout);
}

/// cuDNN 9 (PyTorch's pin) runs too: a small conv net trains with cuDNN's engines loaded.
#[test]
fn pytorch_trains_a_conv_net_with_cudnn() {
    let Some(python) = torch_or_skip("pytorch_trains_a_conv_net_with_cudnn") else {
        return;
    };
    let out = train_with(
        "train_convnet.py",
        &python,
        Some(&["--pool", "stitch"]),
        &["3"],
    );
    ok(&out, "conv net");
    let maps = mapped(&out.stdout);
    assert!(
        maps.iter().any(|p| p.contains("libcudnn_engines")),
        "cuDNN's engines were loaded: {maps:?}"
    );
    assert!(field(&out.stdout, "cudnn") >= 90000, "{}", out.stdout);
}

/// `python train_mlp.py args` under `vramshim run --sim flags`, with no library path of its own:
/// the CLI decides which runtime runs.
fn train_sim(python: &Path, flags: &[&str], args: &[&str]) -> RunOutput {
    let mut c = sim_command(vramshim_testkit::vramshim_exe(), "nv-torch-sim");
    c.env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .env("VRAMSIM_CONTEXT_OVERHEAD", "0")
        .arg("run")
        .arg("--sim")
        .args(flags)
        .arg("--")
        .arg(python)
        .arg(script("train_mlp.py"))
        .args(args);
    run(&mut c)
}

/// `vramshim run --sim` leaves PyTorch its own runtime: only cuda-sim's driver is substituted,
/// and every segment is traced once.
#[test]
fn vramshim_run_sim_runs_pytorchs_own_runtime() {
    let Some(python) = torch_or_skip("vramshim_run_sim_runs_pytorchs_own_runtime") else {
        return;
    };
    let trace = temp_dir("nv-torch-sim").join("t.vramtrace");
    let out = train_sim(
        &python,
        &["--trace", trace.to_str().unwrap()],
        &["3", "256"],
    );
    ok(&out, "vramshim run --sim");
    assert_bundled_runtime(&out);
    let r = TraceReader::open(&trace).unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
    let allocs = r
        .filter(|e| matches!(e, Ok(Event::Alloc(m)) if m.result == 0))
        .count() as u64;
    assert!(
        allocs >= field(&out.stdout, "segments"),
        "{allocs} allocations traced: {}",
        out.stdout
    );
}

/// `--preload-runtime` keeps the substitution: cuda-sim's runtime in place of PyTorch's.
#[test]
fn vramshim_run_sim_preload_runtime_substitutes_cuda_sims_runtime() {
    let Some(python) = torch_or_skip("vramshim_run_sim_preload_runtime_substitutes") else {
        return;
    };
    let out = train_sim(&python, &["--preload-runtime=13"], &["0", "256"]);
    // PyTorch also opens its wheel's runtime by full path (not by soname), so that copy is
    // mapped too; what the substitution changes is which one its libraries' DT_NEEDED reach.
    let maps = mapped(&out.stdout);
    assert!(
        out.success() && maps.iter().any(|p| p.ends_with("cuda-sim/libcudart.so.13")),
        "cuda-sim's runtime preloaded: {maps:?}\n{}\n{}",
        out.stdout,
        out.stderr
    );
}
