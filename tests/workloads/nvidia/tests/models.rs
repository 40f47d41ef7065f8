//! Real models from Hugging Face transformers (a 2-layer GPT-2, a 2-layer ViT and a 2-layer
//! BERT with a masked-language-model head, built from config objects with random weights:
//! nothing downloaded) train with AdamW on cuda-sim with
//! PyTorch's own bundled runtime: plain; traced (every segment PyTorch's caching allocator
//! allocates and frees appears in the trace exactly once, at its address and size, and the
//! trace's runtime allocations and frees are exactly those: counts and bytes equal
//! torch.cuda.memory_stats()); capped (a torch.OutOfMemoryError in the middle of training, and
//! vramshim's post-mortem of the refusal in `vramshim summary`); and pooled (every tensor
//! served by the pool, and with a modelled kernel time no synchronization and no device
//! memory from the driver in a steady-state step, by the simulated driver's own counts).
//!
//! Kernels do not run; the allocations, streams and library calls (cuBLAS, cuDNN) are real.
//! Skipped without PyTorch (scripts/setup-torch) and transformers
//! (scripts/setup-transformers); VRAMSHIM_TORCH_TESTS=1 installs them and fails if that fails.

use std::path::{Path, PathBuf};

use vramshim_nvidia_tests::models::{pairs, steps, train_model, transformers_or_skip};
use vramshim_nvidia_tests::{field, mapped};
use vramshim_pytorch_tests::torch_or_skip;
use vramshim_testkit::{RunOutput, profile_dir, run, sim_command, temp_dir};
use vramshim_trace::{Api, Event, MemOp, TraceReader, flags};

fn setup(test: &str) -> Option<(PathBuf, PathBuf)> {
    let python = torch_or_skip(test)?;
    let transformers = transformers_or_skip(test)?;
    Some((python, transformers))
}

fn ok(out: &RunOutput, what: &str) {
    assert!(
        out.success() && out.stdout.contains("\ndone"),
        "{what}: {}\n{}",
        out.stdout,
        out.stderr
    );
}

/// PyTorch ran its wheel's own runtime and cuBLAS on cuda-sim's driver (and cuDNN for the
/// ViT, whose patch embedding is a convolution).
fn assert_real_stack(out: &RunOutput, model: &str) {
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
    if model == "vit" {
        assert!(
            maps.iter().any(|p| p.contains("libcudnn")),
            "cuDNN ran: {maps:?}"
        );
    }
    let profile = profile_dir().canonicalize().unwrap();
    assert!(
        maps.iter()
            .filter(|p| p.contains("libcuda.so") || p.contains("vramsim_driver"))
            .all(|p| Path::new(p).starts_with(&profile)),
        "cuda-sim's driver: {maps:?}"
    );
}

fn events(trace: &Path) -> Vec<Event> {
    TraceReader::open(trace)
        .unwrap_or_else(|e| panic!("{}: {e}", trace.display()))
        .map(|e| e.expect("the trace decodes"))
        .collect()
}

fn plain(model: &str) {
    let test = format!("{model}_trains_on_cuda_sim");
    let Some((python, tf)) = setup(&test) else {
        return;
    };
    let out = train_model(&python, &tf, &test, None, &[], &[model, "--steps", "3"]);
    ok(&out, "plain");
    assert_real_stack(&out, model);
    assert!(field(&out.stdout, "segments") >= 1, "{}", out.stdout);
    assert!(field(&out.stdout, "peak") > 0, "{}", out.stdout);
}

#[test]
fn gpt2_trains_on_cuda_sim() {
    plain("gpt2");
}

#[test]
fn vit_trains_on_cuda_sim() {
    plain("vit");
}

#[test]
fn bert_trains_on_cuda_sim() {
    plain("bert");
}

/// Every segment PyTorch's allocator made and gave back (its own history, with addresses)
/// appears exactly once in the trace; the trace's `cudaMalloc`/`cudaFree` records are exactly
/// those segments (count and bytes equal memory_stats'); the only other allocations are the
/// libraries' own (cuBLAS's per-thread handle buffers, through the driver API).
fn traced(model: &str) {
    let test = format!("{model}_traced_every_segment_once");
    let Some((python, tf)) = setup(&test) else {
        return;
    };
    let trace = temp_dir(&test).join("t.vramtrace");
    let out = train_model(
        &python,
        &tf,
        &test,
        Some(&["--trace", trace.to_str().unwrap()]),
        &[],
        &[model, "--steps", "3", "--history", "--empty-cache"],
    );
    ok(&out, "traced");
    assert_real_stack(&out, model);
    let torch_allocs = pairs(&out.stdout, "segment_alloc");
    let torch_frees = pairs(&out.stdout, "segment_free");
    assert!(!torch_allocs.is_empty(), "{}", out.stdout);
    assert_eq!(
        torch_allocs.len() as u64,
        field(&out.stdout, "segments"),
        "history and memory_stats agree: {}",
        out.stdout
    );
    assert_eq!(
        torch_frees.len() as u64,
        field(&out.stdout, "segments_freed")
    );
    assert_eq!(
        torch_frees.len(),
        torch_allocs.len(),
        "empty_cache freed every segment: {}",
        out.stdout
    );

    let evs = events(&trace);
    let ok_op = |e: &Event, alloc: bool| match e {
        Event::Alloc(m) if alloc && m.result == 0 && m.kind.is_device() => Some(m.clone()),
        Event::Free(m) if !alloc && m.result == 0 && m.kind.is_device() => Some(m.clone()),
        _ => None,
    };
    let allocs: Vec<_> = evs.iter().filter_map(|e| ok_op(e, true)).collect();
    let frees: Vec<_> = evs.iter().filter_map(|e| ok_op(e, false)).collect();
    for s in &torch_allocs {
        let seen = allocs.iter().filter(|m| (m.addr, m.size) == *s).count();
        assert_eq!(
            seen, 1,
            "segment {s:?} allocated once in the trace: {allocs:?}"
        );
    }
    for s in &torch_frees {
        let seen = frees.iter().filter(|m| (m.addr, m.size) == *s).count();
        assert_eq!(seen, 1, "segment {s:?} freed once in the trace: {frees:?}");
    }
    let runtime_allocs: Vec<_> = allocs.iter().filter(|m| m.api == Api::CudaMalloc).collect();
    let runtime_frees: Vec<_> = frees.iter().filter(|m| m.api == Api::CudaFree).collect();
    assert_eq!(
        runtime_allocs.len() as u64,
        field(&out.stdout, "segments"),
        "cudaMalloc records = PyTorch's segment allocations: {runtime_allocs:?}"
    );
    assert_eq!(
        runtime_allocs.iter().map(|m| m.size).sum::<u64>(),
        field(&out.stdout, "segment_bytes")
    );
    assert_eq!(
        runtime_frees.len() as u64,
        field(&out.stdout, "segments_freed"),
        "cudaFree records = PyTorch's segment frees: {runtime_frees:?}"
    );
    assert_eq!(
        runtime_frees.iter().map(|m| m.size).sum::<u64>(),
        field(&out.stdout, "segment_bytes_freed")
    );
    let others: Vec<_> = allocs.iter().filter(|m| m.api != Api::CudaMalloc).collect();
    assert!(
        others.iter().all(|m| m.api == Api::CuMemAlloc),
        "apart from PyTorch's segments, only the libraries' driver-API buffers: {others:?}"
    );
}

#[test]
fn gpt2_traced_every_segment_once() {
    traced("gpt2");
}

#[test]
fn vit_traced_every_segment_once() {
    traced("vit");
}

#[test]
fn bert_traced_every_segment_once() {
    traced("bert");
}

/// The batch grows 4-fold a step: a few steps train, then one asks for more than the cap
/// leaves. PyTorch raises torch.OutOfMemoryError (the script exits 3), vramshim says why on
/// stderr, and `vramshim summary` of the run's trace carries the post-mortem of the refusal.
fn capped(model: &str, cap: &str) {
    let test = format!("{model}_capped_runs_out_mid_training");
    let Some((python, tf)) = setup(&test) else {
        return;
    };
    let trace = temp_dir(&test).join("t.vramtrace");
    let out = train_model(
        &python,
        &tf,
        &test,
        Some(&["--cap", cap, "--trace", trace.to_str().unwrap()]),
        &[],
        &[model, "--steps", "10", "--growth", "4"],
    );
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
        out.stderr.contains("refused")
            && out
                .stderr
                .contains(&format!("cap {}", cap.replace("MiB", " MiB"))),
        "vramshim says why: {}",
        out.stderr
    );
    let mut c = sim_command(vramshim_testkit::vramshim_exe(), &test);
    c.arg("summary").arg(&trace);
    let summary = run(&mut c);
    summary.assert_success();
    assert!(
        summary.stdout.contains("post-mortem #1") && summary.stdout.contains("REFUSED by the cap"),
        "the summary explains the refusal: {}",
        summary.stdout
    );
    let refusals = events(&trace)
        .iter()
        .filter(|e| matches!(e, Event::CapRefusal { .. }))
        .count();
    assert!(refusals >= 1, "the refusal is in the trace");
}

#[test]
fn gpt2_capped_runs_out_mid_training() {
    capped("gpt2", "300MiB");
}

#[test]
fn vit_capped_runs_out_mid_training() {
    capped("vit", "300MiB");
}

#[test]
fn bert_capped_runs_out_mid_training() {
    capped("bert", "300MiB");
}

/// Under `--pool stitch` (PyTorch routed through backend:cudaMallocAsync) the model trains,
/// every tensor is served by the pool, and with kernels taking modelled time
/// (VRAMSIM_KERNEL_NS) nothing synchronizes in the steady-state steps (after the first two):
/// the simulated driver's own count of `cuCtx/Stream/EventSynchronize` calls made during each
/// step (`--step-stats`; the script's closing `torch.cuda.synchronize()` is not counted), which
/// sees the pool's synchronizations as it sees PyTorch's; and no device memory reaches the
/// driver in those steps. `own_syncs`: the model synchronizes by itself (BERT's check of its
/// attention mask reads the mask back once a step): then a plain run's steady-state steps say
/// how many synchronizations are the program's, and the pooled steps must make exactly those.
fn pooled(model: &str, own_syncs: bool) {
    let test = format!("{model}_pooled_trains");
    let Some((python, tf)) = setup(&test) else {
        return;
    };
    let trace = temp_dir(&test).join("t.vramtrace");
    let n = 5;
    let kernel_ns = [("VRAMSIM_KERNEL_NS", "20000")];
    let steps_args = [model, "--steps", &n.to_string(), "--step-stats"];
    let program_syncs = if own_syncs {
        let out = train_model(&python, &tf, &test, None, &kernel_ns, &steps_args);
        ok(&out, "plain");
        let st = steps(&out.stdout);
        assert_eq!(st.len(), n, "{}", out.stdout);
        let per_step: Vec<u64> = st
            .iter()
            .skip(2)
            .map(|s| s.driver.expect("cuda-sim's driver counts").syncs)
            .collect();
        assert!(
            per_step.iter().all(|&x| x == per_step[0]),
            "the program synchronizes as often in every steady-state step: {per_step:?}"
        );
        per_step[0]
    } else {
        0
    };
    let out = train_model(
        &python,
        &tf,
        &test,
        Some(&["--pool", "stitch", "--trace", trace.to_str().unwrap()]),
        &kernel_ns,
        &steps_args,
    );
    ok(&out, "pooled");
    assert_real_stack(&out, model);
    let tensors: Vec<MemOp> = events(&trace)
        .into_iter()
        .filter_map(|e| match e {
            Event::Alloc(m) if m.result == 0 && m.api == Api::CudaMallocAsync => Some(m),
            _ => None,
        })
        .collect();
    assert!(
        tensors.len() > 100,
        "PyTorch's tensors reach the pool one by one: {} cudaMallocAsync",
        tensors.len()
    );
    let unpooled: Vec<&MemOp> = tensors
        .iter()
        .filter(|m| m.flags & flags::POOLED == 0)
        .collect();
    assert!(unpooled.is_empty(), "every tensor pooled: {unpooled:?}");
    let st = steps(&out.stdout);
    assert_eq!(st.len(), n, "{}", out.stdout);
    for (i, s) in st.iter().enumerate().skip(2) {
        let d = s
            .driver
            .unwrap_or_else(|| panic!("no driver counts (not cuda-sim's driver?): {}", out.stdout));
        assert!(d.launches > 0, "step {i} launched kernels: {d:?}");
        assert_eq!(
            (d.syncs, d.allocs, d.frees),
            (program_syncs, 0, 0),
            "step {i}: no synchronization (beyond the program's own {program_syncs}) and no device memory from the driver in a steady-state step: {d:?}"
        );
    }
}

#[test]
fn gpt2_pooled_trains() {
    pooled("gpt2", false);
}

#[test]
fn vit_pooled_trains() {
    pooled("vit", false);
}

#[test]
fn bert_pooled_trains() {
    pooled("bert", true);
}
