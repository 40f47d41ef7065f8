//! Safety: threads, fork, exec, bad input, processes that never touch CUDA.

mod common;

use common::{both, build, preloaded};
use vramshim_testkit::Link;

#[test]
fn sixteen_threads_exact_counts_no_deadlock() {
    let exe = build("threads", "threads.c", Link::SharedRuntime, &[]);
    let (_, pre) = both(&exe, &["20000"], &[], "ip-threads");
    assert!(pre.stdout.contains("threads: ok"));
}

/// Frees of pointers another thread allocated (each thread has its own live-table part),
/// racing the owners' own allocations, then double frees of them: counts stay exact and
/// every double free gets the code it gets without the preload.
#[test]
fn cross_thread_frees_exact() {
    let exe = build("cross_free", "cross_free.c", Link::SharedRuntime, &[]);
    let (_, pre) = both(&exe, &["40"], &[], "ip-cross-free");
    common::assert_lines(&pre, &["cross_free: ok"]);
}

#[test]
fn fork_child_starts_clean_parent_continues() {
    let exe = build("fork_exec", "fork_exec.c", Link::SharedRuntime, &[]);
    let (plain, _) = both(&exe, &["fork"], &[], "ip-fork");
    common::assert_lines(&plain, &["child A exit=0", "child B exit=0", "parent: ok"]);
}

#[test]
fn exec_child_inherits_the_preload() {
    let exe = build("fork_exec_x", "fork_exec.c", Link::SharedRuntime, &[]);
    let out = preloaded(&exe, &["exec"], &[], "ip-exec");
    out.assert_success();
    common::assert_lines(&out, &["child: ok interposed=1", "parent: ok"]);
}

#[test]
fn bad_input_same_codes_as_without_preload() {
    common::build_both(
        "bad_input",
        "bad_input.c",
        Link::SharedRuntime,
        &[],
        &[],
        "ip-bad",
    );
}

#[test]
fn stacked_with_another_rtld_next_interposer() {
    let exe = build("stacked_main", "stacked_main.c", Link::SharedRuntime, &[]);
    let dir = vramshim_testkit::temp_dir("stacked-wrap");
    let wrap = dir.join("wrap.so");
    let src = vramshim_testkit::repo_root().join("tests/workloads/interposer/stacked_wrap.c");
    let o = std::process::Command::new("gcc")
        .args(["-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-o"])
        .arg(&wrap)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("gcc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lib = common::lib();
    for order in [
        format!("{}:{}", lib.display(), wrap.display()),
        format!("{}:{}", wrap.display(), lib.display()),
    ] {
        let mut c = vramshim_testkit::sim_command(&exe, "ip-stacked");
        c.env("LD_PRELOAD", &order);
        let out = vramshim_testkit::run(&mut c);
        out.assert_success();
        assert!(
            out.stdout.contains("wrapper calls=5"),
            "{order}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("stacked: ok"),
            "{order}: {}",
            out.stdout
        );
    }
}

#[test]
fn no_driver_no_runtime_gives_cuda_codes() {
    let exe = build("no_cuda_libs", "no_cuda_libs.c", Link::Dl, &[]);
    // No LD_LIBRARY_PATH to the simulated GPU: there is no CUDA library to find.
    let mut c = std::process::Command::new(&exe);
    c.env_remove("LD_LIBRARY_PATH")
        .env("LD_PRELOAD", common::lib());
    let out = vramshim_testkit::run(&mut c);
    out.assert_success();
    common::assert_lines(
        &out,
        &[
            "cudaMalloc -> 35",
            "cudaFree -> 35",
            "cudaMemGetInfo -> 35",
            "cuMemAlloc_v2 -> 3",
            "cuMemGetInfo_v2 -> 3",
            "cuGetProcAddress_v2 -> 3",
            "nvmlDeviceGetMemoryInfo -> 1",
        ],
    );
    assert_eq!(out.stderr, "", "nothing on stderr");
}
