//! A job that exits right after a backward pass ran out of memory ends with its own status
//! under `vramshim run --trace`'s Python hook, never with PyTorch's shutdown abort
//! ("terminate called without an active exception", exit 134): the hook waits at exit until
//! PyTorch's autograd device threads are idle (docs/pytorch-oom.md).
//!
//! `exit_after_backward.py` arranges PyTorch's race every time (by scheduling alone: see its
//! docstring); `VRAMSHIM_TEST_PASS="VRAMSHIM_PYTHON_HOOK_FAULT=no-settle"` switches the
//! hook's wait off, and every run then aborts. Skipped with one line without PyTorch
//! (VRAMSHIM_TORCH_TESTS=1 makes that a failure).

use vramshim_pytorch_tests::{printed, torch_or_skip, vramshim_run_command};
use vramshim_testkit::{repo_root, run, temp_dir};

/// Runs of the job: each aborts without the hook's wait.
const RUNS: usize = 4;

#[test]
fn a_job_exiting_after_an_oom_in_backward_keeps_its_status() {
    let test = "a_job_exiting_after_an_oom_in_backward_keeps_its_status";
    let Some(py) = torch_or_skip(test) else {
        return;
    };
    let script = repo_root().join("tests/workloads/pytorch/exit_after_backward.py");
    let dir = temp_dir("torch_autograd_exit");
    for i in 0..RUNS {
        let trace = dir.join(format!("t{i}.vramtrace"));
        let mut c = vramshim_run_command(
            &py,
            &format!("autograd_exit_{i}"),
            &[
                "--cap",
                "256MiB",
                "--trace",
                trace.to_str().expect("utf-8 path"),
            ],
        );
        c.arg(&script).current_dir(&dir);
        let out = run(&mut c);
        let what = format!(
            "run {i}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            out.status, out.stdout, out.stderr
        );
        let forced: usize = printed(&out.stdout, "forced ");
        assert!(forced >= 1, "no autograd device thread to force: {what}");
        assert!(
            out.stdout
                .contains("\noom in backward: CUDA out of memory."),
            "the backward pass ran out of memory: {what}"
        );
        assert!(
            !out.stderr.contains("terminate called"),
            "the job aborted at exit: {what}"
        );
        assert_eq!(out.code(), Some(3), "the job's own exit status: {what}");
    }
}
