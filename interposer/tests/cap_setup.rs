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

/// A fork while another thread is inside the cap's set-up: the child, where that thread
/// does not exist, must set the cap up itself, and its capped cudaMalloc (one over the cap,
/// refused) must come back, not wait forever for the parent's thread.
/// `VRAMSHIM_CAP_FAULT=setup-pause` parks the parent's worker inside the set-up (two
/// minutes, the parent's process only); the whole run is killed after 90 s and the test fails.
#[test]
fn a_child_forked_during_the_caps_set_up_sets_it_up_itself() {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    let exe = build(
        "fork_in_setup",
        "fork_in_setup.c",
        Link::SharedRuntime,
        &["-lpthread"],
    );
    let dir = vramshim_testkit::temp_dir("fork-in-setup-out");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut c = vramshim_testkit::sim_command(&exe, "ip-fork-in-setup");
    c.env("LD_PRELOAD", common::lib())
        .env("VRAMSHIM_CAP", "64MiB")
        .env("VRAMSHIM_CAP_CONTEXT", "exclude")
        .env("VRAMSHIM_CAP_FAULT", "setup-pause")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        // Its own process group: a child that hangs is killed with the parent.
        .process_group(0);
    let mut child = c.spawn().expect("spawn fork_in_setup");
    let pgid = child.id() as libc::pid_t;
    let end = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            // SAFETY: signals our own process group (the workload and its forked child).
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The forked child may outlive a killed parent for a moment: the group is gone anyway.
    // SAFETY: as above; ESRCH when nothing is left.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!("hung: killed after 90 s (the child waits for the parent's set-up)\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    });
    assert!(
        status.success() && stdout.contains("child exit=0"),
        "{status:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains(" big=2 cap_refusals=1"),
        "the child's cudaMalloc over the cap was not refused by the cap\n{stdout}"
    );
}
