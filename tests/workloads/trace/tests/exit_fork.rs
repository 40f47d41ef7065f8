//! `_exit`/`_Exit` flush the trace (end record, every event), a vfork child's `_exit` leaves
//! the parent's trace alone, and `fork` writes a `Fork` record into the parent's trace.

use vramshim_testkit::{
    Link, compile_c, compile_c_to, interposer_lib, preload, run, sim_command, temp_dir,
};
use vramshim_trace::Event;
use vramshim_trace_tests::{only_trace, read, source};

const PAIRS: u64 = 500;

/// Runs `trace_exit MODE PAIRS` traced; returns the one trace file's contents.
fn run_exit(mode: &str, extra_env: &[(&str, &str)]) -> vramshim_trace_tests::Read {
    let exe = compile_c(
        "trace_exit",
        &[&source("trace_exit.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_exit");
    let mut cmd = sim_command(&exe, "trace_exit");
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", dir.join("x-%p.vramtrace"))
        .args([mode, &PAIRS.to_string()]);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    run(&mut cmd).assert_success();
    only_trace(&dir, mode)
}

#[test]
fn underscore_exit_flushes_everything_and_ends_the_trace() {
    for mode in ["_exit", "_Exit"] {
        let r = run_exit(mode, &[]);
        assert_eq!(r.truncation, None, "{mode}: no end record");
        let want: Vec<u64> = (0..PAIRS).map(|i| 4096 + i).collect();
        assert_eq!(r.alloc_sizes(), want, "{mode}");
    }
}

#[test]
fn exit_flush_can_be_turned_off() {
    // The opt-out shows what the hook is for: without it `_exit` leaves no end record.
    let r = run_exit("_exit", &[("VRAMSHIM_TRACE_EXIT_FLUSH", "0")]);
    assert!(
        r.truncation.is_some(),
        "an _exit without the flush has no end record"
    );
}

#[test]
fn vfork_child_exit_leaves_the_parents_trace_alone() {
    let r = run_exit("vfork", &[]);
    assert_eq!(r.truncation, None);
    let want: Vec<u64> = (0..2 * PAIRS).map(|i| 4096 + i).collect();
    assert_eq!(
        r.alloc_sizes(),
        want,
        "the parent's events after the vfork are missing"
    );
}

#[test]
fn fork_writes_a_fork_record_in_the_parent() {
    let dir = temp_dir("trace_forkrec");
    let exe = dir.join("trace_fork");
    compile_c_to(
        &exe,
        &[&source("trace_fork.c")],
        Link::SharedRuntime,
        &["-l:libnvidia-ml.so.1"],
    );
    let mut cmd = sim_command(&exe, "trace_forkrec");
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", dir.join("f-%p.vramtrace"));
    let out = run(&mut cmd);
    out.assert_success();
    let pid_of = |who: &str| -> u32 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(who).map(|p| p.trim().parse().unwrap()))
            .unwrap()
    };
    let (parent, child) = (pid_of("parent "), pid_of("child "));
    let p = read(&dir.join(format!("f-{parent}.vramtrace")));
    let c = read(&dir.join(format!("f-{child}.vramtrace")));
    let forks = |r: &vramshim_trace_tests::Read| -> Vec<(u64, u32)> {
        r.events
            .iter()
            .filter_map(|e| match e {
                Event::Fork { t_ns, child_pid } => Some((*t_ns, *child_pid)),
                _ => None,
            })
            .collect()
    };
    let pf = forks(&p);
    assert_eq!(pf.iter().map(|f| f.1).collect::<Vec<_>>(), vec![child]);
    assert!(forks(&c).is_empty(), "the child's trace has no Fork record");
    // In time: after the parent's NVML query, before the parent's first allocation.
    let t = pf[0].0;
    let query = p.events.iter().find_map(|e| match e {
        Event::MemInfo { t_ns, .. } => Some(*t_ns),
        _ => None,
    });
    let first_alloc = p.events.iter().find_map(|e| match e {
        Event::Alloc(m) => Some(m.t_ns),
        _ => None,
    });
    assert!(
        query.unwrap() < t && t < first_alloc.unwrap(),
        "fork record out of time order"
    );
    // The child was started by this fork: its header names the parent.
    assert_eq!(c.header.ppid, parent);
}
