//! The cap is set up at load in every process that preloads the library: a panic there
//! (a bug, an unexpected cgroup file) must leave the user's job running, uncapped, with one
//! line, never abort it. `VRAMSHIM_CAP_FAULT=panic-at-setup` makes the set-up panic.

mod common;

use common::{build, preloaded};
use vramshim_testkit::Link;

const LINE: &str = "internal error (panic: VRAMSHIM_CAP_FAULT=panic-at-setup) while setting up \
                    the cap; running without a cap";

#[test]
fn a_panic_while_setting_up_the_cap_leaves_the_job_running_uncapped() {
    let exe = build(
        "cap_setup_malloc",
        "bench_malloc.c",
        Link::SharedRuntime,
        &[],
    );
    // 64 MiB allocations under a 32 MiB cap: refused while the cap is in force.
    let args = ["1", "20", "67108864"];
    let capped = preloaded(&exe, &args, &[("VRAMSHIM_CAP", "32MiB")], "ip-cap-setup-on");
    assert!(
        !capped.status.success(),
        "the cap did not refuse 64 MiB under 32 MiB\n{}",
        capped.stderr
    );
    let out = preloaded(
        &exe,
        &args,
        &[
            ("VRAMSHIM_CAP", "32MiB"),
            ("VRAMSHIM_CAP_FAULT", "panic-at-setup"),
        ],
        "ip-cap-setup-panic",
    );
    out.assert_success();
    assert!(
        out.stdout.contains("bench_malloc: threads=1"),
        "{}",
        out.stdout
    );
    // That line, and no other (Rust's own panic report is held back).
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line:\n{}", out.stderr);
    assert!(lines[0].ends_with(LINE), "{}", out.stderr);
}
