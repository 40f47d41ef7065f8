//! A thread whose tid a new thread gets before the trace writer noticed its exit gets its
//! `ThreadExit` record while the new thread runs, not when that one exits too: the writer
//! knows a slot's thread by the robust mutex it holds for its life (`sys::life`), not by its
//! tid. The tid is reused for real: the helper (`src/bin/tid_reuse.rs`) runs as the first
//! process of a new pid namespace and sets the namespace's next tid. With
//! `VRAMSHIM_TRACE_FAULT=tid-only` (slots looked for by tid alone, as before) the old thread's
//! `ThreadExit` record is missing at the marker the process emits while the new thread runs:
//! this fails. Both ways of the new thread: emitting before the writer looks (two slots with
//! one tid) and not (one slot, its tid alive). Where no pid namespace can be made it checks
//! nothing and says so, unless `VRAMSHIM_REQUIRE_PIDNS=1` (`.ci/run`).

use std::path::Path;
use std::process::Command;

use vramshim_testkit::temp_dir;
use vramshim_trace::{Event, TraceReader};

const MARKER: u64 = 999_999;

/// How to make a pid namespace here: a user namespace of our own (unprivileged user
/// namespaces), or a plain pid namespace (root); `None` when neither works.
fn unshare_args() -> Option<&'static [&'static str]> {
    const WAYS: [&[&str]; 2] = [
        &[
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
        ],
        &["--pid", "--fork", "--mount-proc"],
    ];
    WAYS.into_iter().find(|w| {
        Command::new("unshare")
            .args(*w)
            .args(["sh", "-c", "echo 100 > /proc/sys/kernel/ns_last_pid"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs the helper in a new pid namespace; returns the reused tid, or `None` where no pid
/// namespace can be made (then, unless `VRAMSHIM_REQUIRE_PIDNS=1`, the test checks nothing
/// and says so; `.ci/run` sets it).
fn run_helper(path: &Path, mode: &str) -> Option<u32> {
    let Some(ways) = unshare_args() else {
        let required = std::env::var("VRAMSHIM_REQUIRE_PIDNS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "VRAMSHIM_REQUIRE_PIDNS=1 but no pid namespace could be made with unshare (root, or \
             unprivileged user namespaces, are needed)"
        );
        eprintln!(
            "not checked: no pid namespace could be made (root, or unprivileged user namespaces, are needed)"
        );
        return None;
    };
    let out = Command::new("unshare")
        .args(ways)
        .arg(env!("CARGO_BIN_EXE_tid_reuse"))
        .arg(path)
        .arg(mode)
        .envs(
            std::env::var("VRAMSHIM_TRACE_FAULT")
                .ok()
                .map(|v| ("VRAMSHIM_TRACE_FAULT", v)),
        )
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tid_reuse {mode} in a new pid namespace failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let tids: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tid "))
        .map(|l| l.split(' ').map(|t| t.parse().unwrap()).collect())
        .unwrap_or_else(|| panic!("no tid line in {stdout:?}"));
    assert_eq!(tids[0], tids[1], "thread B got thread A's tid");
    Some(tids[0])
}

/// Thread A (`tid`, allocations 0..5) has exactly one `ThreadExit` record before the marker,
/// after its last event; thread B's allocations (100..105) are all written.
fn check(path: &Path, tid: u32) {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    let mut a_events = 0;
    let mut b_events = 0;
    let mut exits_before_marker = 0;
    let mut marker = false;
    while r.next_into(&mut e).unwrap() {
        match &e {
            Event::Alloc(m) if m.size == MARKER => marker = true,
            Event::Alloc(m) if m.tid == tid && m.size < 100 => {
                assert_eq!(
                    exits_before_marker, 0,
                    "thread A's event after its ThreadExit"
                );
                a_events += 1;
            }
            Event::Alloc(m) if m.tid == tid => b_events += 1,
            Event::ThreadExit { tid: t, .. } if *t == tid && !marker => exits_before_marker += 1,
            _ => {}
        }
    }
    assert_eq!(r.truncation(), None);
    assert!(marker, "the marker is written");
    assert_eq!(
        (a_events, b_events),
        (5, 5),
        "both threads' events are written"
    );
    assert_eq!(
        exits_before_marker, 1,
        "tid {tid}: thread A's ThreadExit record written once while thread B (same tid) runs"
    );
}

fn run(mode: &str) {
    let dir = temp_dir("trace_tid_reuse");
    let path = dir.join(format!("{mode}.vramtrace"));
    if let Some(tid) = run_helper(&path, mode) {
        check(&path, tid);
    }
}

/// The new thread emits before the writer looks: two slots with one tid.
#[test]
fn a_reused_tid_does_not_delay_the_exited_threads_exit_record() {
    run("emits");
}

/// The new thread emits only after the marker: one slot, its tid alive.
#[test]
fn a_reused_tid_of_a_silent_thread_does_not_delay_it_either() {
    run("silent");
}
