//! List switches (`VRAMSHIM_POOL_DEBUG`, read by several parts of the library) on cuda-sim: a
//! name no part reads is said in one line at load, with the variable and the accepted names,
//! and the job goes on; the names that are read still apply, whichever parts read them and
//! whatever else the list holds.

mod common;

use common::{build, preloaded};
use vramshim_testkit::{Link, RunOutput};

fn pool_run(debug: &str, pool: &str, sim: &str) -> RunOutput {
    let exe = build("sw_pool_wiring", "pool_wiring.c", Link::SharedRuntime, &[]);
    let mut env = vec![("VRAMSHIM_POOL_DEBUG", debug)];
    if !pool.is_empty() {
        env.push(("VRAMSHIM_POOL", pool));
    }
    let out = preloaded(&exe, &[], &env, sim);
    // a warning only: the job is never stopped for it
    out.assert_success();
    common::assert_lines(&out, &["pool_wiring: ok"]);
    out
}

/// The lines of stderr that speak of names no part reads.
fn unknown_lines(out: &RunOutput) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.contains("read by no part of vramshim"))
        .collect()
}

#[test]
fn an_unknown_name_is_said_once_and_the_known_ones_still_apply() {
    let out = pool_run("lazy-sync, lazy-synk", "stitch", "sw-typo");
    let lines = unknown_lines(&out);
    assert_eq!(lines.len(), 1, "one line wanted:\n{}", out.stderr);
    let line = lines[0];
    assert!(
        line.contains("VRAMSHIM_POOL_DEBUG: the name \"lazy-synk\" is read by no part"),
        "{line}"
    );
    // the names of every reader are offered (that every name a reader takes is listed is the
    // unit test config::switches::every_name_read_is_listed)
    for name in ["lazy-sync", "no-peer", "tcache-no-drain", "no-tcache"] {
        assert!(
            line.contains(&format!(" {name},")) || line.contains(&format!(" {name};")),
            "{name} not offered: {line}"
        );
    }
    assert!(!line.contains("lazy-sync,lazy-synk"), "{line}");
    // the known name beside it is not dropped
    assert!(
        out.stderr
            .contains("the pool packs as before its tightness fix"),
        "lazy-sync was dropped:\n{}",
        out.stderr
    );
}

/// What each reader of the list says when its name is on.
const PRESSURE_OFF: &str = "the pool ignores how close the device is to full";
const NO_DRAIN: &str = "the thread caches are never drained";
const NO_PEER: &str = "the pool ignores peer access";

#[test]
fn names_of_several_readers_combine() {
    // the pool's rules, the thread caches and peer access each take their own names
    let names = "pressure-off,tcache-no-drain,no-peer";
    let out = pool_run(names, "stitch", "sw-mix");
    assert!(unknown_lines(&out).is_empty(), "{}", out.stderr);
    for said in [PRESSURE_OFF, NO_DRAIN] {
        assert!(
            out.stderr.contains(said),
            "{said:?} missing:\n{}",
            out.stderr
        );
    }
    // pool_wiring grants no peer access, so `no-peer` is checked where a program does
    // (tests/workloads/pool/peer_access.c, two devices): the pool ignores the grant, so device
    // 1's fills of device 0's pooled blocks are refused and the program exits 1 (0 with the
    // grant applied: pool::tests::peer_access_applies_to_pool_mappings)
    let exe = vramshim_testkit::compile_c(
        "sw_peer_access",
        &["tests/workloads/pool/peer_access.c"],
        Link::SharedRuntime,
    );
    let env = [
        ("VRAMSIM_DEVICES", "2"),
        ("VRAMSHIM_POOL", "stitch"),
        ("VRAMSHIM_POOL_DEBUG", names),
    ];
    let out = preloaded(&exe, &[], &env, "sw-mix-peer");
    assert!(unknown_lines(&out).is_empty(), "{}", out.stderr);
    for said in [PRESSURE_OFF, NO_DRAIN, NO_PEER] {
        assert!(
            out.stderr.contains(said),
            "{said:?} missing:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stdout.contains("before=1 ") && out.stdout.contains("enable=0 "),
        "device 1 reached device 0's memory without peer access, or the grant failed:\n{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("data=BAD") && !out.stdout.contains(" a=0 "),
        "no-peer did not take effect: the pool granted device 1 access all the same:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
}

#[test]
fn unknown_names_are_said_even_with_the_pool_off() {
    let out = pool_run("x\u{1b}[2J,,reuse-early,ignore_budget", "", "sw-off");
    let lines = unknown_lines(&out);
    assert_eq!(lines.len(), 1, "one line wanted:\n{}", out.stderr);
    assert!(
        lines[0].contains("the names \"x\\u{1b}[2J\", \"ignore_budget\" are read by no part"),
        "{}",
        lines[0]
    );
    // what the environment holds reaches the terminal escaped
    assert!(!out.stderr.contains('\u{1b}'), "{}", out.stderr);
}

/// The single-purpose fault switches (`VRAMSHIM_*_FAULT`) are read the same way: a misspelt
/// value is said once, in one line naming the variable, the value, the accepted names and the
/// default taken, and the job goes on untouched; before, it was silently ignored.
#[test]
fn a_misspelt_fault_switch_is_said_once_and_the_job_goes_on() {
    let exe = build("sw_pool_wiring", "pool_wiring.c", Link::SharedRuntime, &[]);
    let env = [
        ("VRAMSHIM_TRACE_FAULT", "no-tik"),
        ("VRAMSHIM_TORCH_FAULT", " drop,dorp\u{202e}"),
        ("VRAMSHIM_ENV_FAULT", "first32"),
        ("VRAMSHIM_DEVICE_FAULT", "stale "),
    ];
    let out = preloaded(&exe, &[], &env, "sw-fault-typo");
    out.assert_success();
    common::assert_lines(&out, &["pool_wiring: ok"]);
    let lines = unknown_lines(&out);
    assert_eq!(lines.len(), 3, "three lines wanted:\n{}", out.stderr);
    for (var, name, accepted) in [
        (
            "VRAMSHIM_TRACE_FAULT",
            "\"no-tik\"",
            "accepted: unsafe-open, no-tick, partials-first, late-reap, late-close, tid-only, own-wait, nested-exit-waits, arm-in-op, send-unmasked, exit-inline;",
        ),
        (
            "VRAMSHIM_TORCH_FAULT",
            "\"dorp\\u{202e}\"",
            "accepted: drop;",
        ),
        ("VRAMSHIM_ENV_FAULT", "\"first32\"", "accepted: first-32;"),
    ] {
        let of_var: Vec<_> = lines
            .iter()
            .filter(|l| l.contains(&format!("{var}: ")))
            .collect();
        assert_eq!(of_var.len(), 1, "{var}: one line wanted:\n{}", out.stderr);
        let line = of_var[0];
        assert!(
            line.contains(&format!(
                "{var}: the name {name} is read by no part of vramshim"
            )),
            "{line}"
        );
        assert!(line.contains(accepted), "{line}");
        assert!(
            line.contains("ignoring it: no fault is switched on by it (the default)"),
            "{line}"
        );
    }
    // the known name beside the misspelt one is named with the whole value
    assert!(
        out.stderr
            .contains("the other names of VRAMSHIM_TORCH_FAULT=\"drop,dorp\\u{202e}\" apply"),
        "{}",
        out.stderr
    );
    // what the environment holds reaches the terminal escaped
    assert!(!out.stderr.contains('\u{202e}'), "{}", out.stderr);
}

/// The tracer's on/off switches (`VRAMSHIM_TRACE_CLOCK`, `VRAMSHIM_TRACE_LOCKS`,
/// `VRAMSHIM_TRACE_EXIT_FLUSH`, `VRAMSHIM_PY_STACKS`) read one value or two: any other is said
/// once, in one line naming the variable, the value and the accepted forms, and the default is
/// used; the job and its trace go on.
#[test]
fn a_bad_tracer_switch_value_is_said_once_and_the_trace_goes_on() {
    let exe = build("sw_pool_wiring", "pool_wiring.c", Link::SharedRuntime, &[]);
    let dir = vramshim_testkit::TempDir::new("sw-tracer-values");
    let trace = dir.join("t.vramtrace");
    let trace = trace.to_str().unwrap();
    let cases = [
        ("VRAMSHIM_TRACE_CLOCK", "tsc", "accepted: monotonic"),
        ("VRAMSHIM_TRACE_LOCKS", "yes", "accepted: 0 or 1"),
        ("VRAMSHIM_TRACE_EXIT_FLUSH", "2", "accepted: 0 or 1"),
        (
            "VRAMSHIM_PY_STACKS",
            "2",
            "accepted: 1 (Python frames in call stacks) or 0",
        ),
    ];
    let mut env = vec![("VRAMSHIM_TRACE", trace), ("VRAMSHIM_STACKS", "8")];
    env.extend(cases.iter().map(|(var, value, _)| (*var, *value)));
    let out = preloaded(&exe, &[], &env, "sw-tracer-values");
    out.assert_success();
    common::assert_lines(&out, &["pool_wiring: ok"]);
    for (var, value, accepted) in cases {
        let lines: Vec<_> = out
            .stderr
            .lines()
            .filter(|l| l.contains(&format!("{var}=")))
            .collect();
        assert_eq!(lines.len(), 1, "{var}: one line wanted:\n{}", out.stderr);
        let line = lines[0];
        assert!(
            line.contains(&format!("{var}=\"{value}\" is not understood")),
            "{line}"
        );
        assert!(line.contains(accepted), "{line}");
        assert!(line.contains("using the default"), "{line}");
    }
    let len = std::fs::metadata(trace).map(|m| m.len()).unwrap_or(0);
    assert!(len > 0, "no trace written:\n{}", out.stderr);
}
