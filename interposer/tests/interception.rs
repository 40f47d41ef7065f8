//! Interception: real programs on the simulated GPU, run with and without the preload; the
//! live table and counters (read in-process through `vramshim_counter`) must match what the
//! program did, and what the program observes must not change.

mod common;

use common::{both, build};
use vramshim_testkit::Link;

#[test]
fn shared_runtime_all_paths() {
    let exe = build(
        "alloc_suite_shared",
        "alloc_suite.c",
        Link::SharedRuntime,
        &["-DLAYER_RUNTIME=1"],
    );
    let (_, pre) = both(&exe, &[], &[], "ip-shared");
    assert!(pre.stderr.contains("preloaded=1"), "{}", pre.stderr);
}

#[test]
fn static_runtime_all_paths() {
    let exe = build(
        "alloc_suite_static",
        "alloc_suite.c",
        Link::StaticRuntime,
        &["-DLAYER_RUNTIME=0"],
    );
    let (_, pre) = both(&exe, &[], &[], "ip-static");
    assert!(pre.stderr.contains("preloaded=1"), "{}", pre.stderr);
}

#[test]
fn dlopen_runtime_all_paths() {
    let exe = build(
        "alloc_suite_dl",
        "alloc_suite.c",
        Link::Dl,
        &["-DLAYER_RUNTIME=1", "-DUSE_DLOPEN"],
    );
    let (_, pre) = both(&exe, &[], &[], "ip-dlopen");
    assert!(pre.stderr.contains("preloaded=1"), "{}", pre.stderr);
}
