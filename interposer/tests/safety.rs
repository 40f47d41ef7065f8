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

#[test]
fn fork_child_starts_clean_parent_continues() {
    let exe = build("fork_exec", "fork_exec.c", Link::SharedRuntime, &[]);
    let (plain, _) = both(&exe, &["fork"], &[], "ip-fork");
    assert!(plain.stdout.contains("child A exit=0"), "{}", plain.stdout);
    assert!(plain.stdout.contains("child B exit=0"), "{}", plain.stdout);
    assert!(plain.stdout.contains("parent: ok"), "{}", plain.stdout);
}

#[test]
fn exec_child_inherits_the_preload() {
    let exe = build("fork_exec_x", "fork_exec.c", Link::SharedRuntime, &[]);
    let out = preloaded(&exe, &["exec"], &[], "ip-exec");
    out.assert_success();
    assert!(
        out.stdout.contains("child: ok interposed=1"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("parent: ok"), "{}", out.stdout);
}

#[test]
fn bad_input_same_codes_as_without_preload() {
    let exe = build("bad_input", "bad_input.c", Link::SharedRuntime, &[]);
    both(&exe, &[], &[], "ip-bad");
}
