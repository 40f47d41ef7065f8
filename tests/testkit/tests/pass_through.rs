//! `VRAMSHIM_TEST_PASS` hands fault switches to the programs a test spawns, while every other
//! inherited `VRAMSHIM_*`/`VRAMSIM_*` variable stays removed (tests start from a clean state).

use std::process::Command;
use vramshim_testkit::{PASS_VAR, parse_pass, run, sim_command};

/// Set in the re-run of this test binary: that run is the "test process" whose environment
/// holds `VRAMSHIM_TEST_PASS`.
const CHILD: &str = "VRAMSHIM_TESTKIT_PASS_CHILD";

#[test]
fn pass_through_reaches_spawned_programs() {
    if std::env::var_os(CHILD).is_some() {
        // The test process as `VRAMSHIM_TEST_PASS=... cargo test` starts it: what does a
        // program it runs through sim_command see?
        let out = run(&mut sim_command("env", "pass-through"));
        out.assert_success();
        let env: Vec<&str> = out.stdout.lines().collect();
        assert!(
            env.contains(&"VRAMSHIM_CAP_FAULT=racy-charge"),
            "the pass-through did not reach the program:\n{}",
            out.stdout
        );
        assert!(env.contains(&"VRAMSIM_DEVSTATE_FAULT=pause"), "{env:?}");
        // Anything else set for the test process stays behind.
        assert!(
            !env.iter().any(|l| l.starts_with("VRAMSHIM_LOG=")),
            "{env:?}"
        );
        assert!(!env.iter().any(|l| l.starts_with(PASS_VAR)), "{env:?}");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let o = run(Command::new(me)
        .args([
            "--exact",
            "pass_through_reaches_spawned_programs",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env(
            PASS_VAR,
            "VRAMSHIM_CAP_FAULT=racy-charge; VRAMSIM_DEVSTATE_FAULT=pause",
        )
        .env("VRAMSHIM_LOG", "debug"));
    o.assert_success();
    assert!(o.stdout.contains("1 passed"), "{}", o.stdout);
}

#[test]
fn pass_values_are_checked() {
    assert_eq!(parse_pass(""), Ok(vec![]));
    assert_eq!(
        parse_pass("VRAMSHIM_CAP_FAULT=no-reclaim;;VRAMSHIM_POOL_DEBUG=a=b;"),
        Ok(vec![
            ("VRAMSHIM_CAP_FAULT".into(), "no-reclaim".into()),
            ("VRAMSHIM_POOL_DEBUG".into(), "a=b".into()),
        ])
    );
    for (bad, why) in [
        ("VRAMSHIM_CAP_FAULT", "has no '='"),
        ("LD_PRELOAD=/x.so", "is not a VRAMSHIM_* or VRAMSIM_*"),
        ("VRAMSHIM_=x", "is not a VRAMSHIM_* or VRAMSIM_*"),
        ("vramshim_cap=1", "is not a VRAMSHIM_* or VRAMSIM_*"),
        ("VRAMSHIM_TEST_PASS=x", "is not a VRAMSHIM_* or VRAMSIM_*"),
    ] {
        let e = parse_pass(bad).unwrap_err();
        assert!(
            e.starts_with(PASS_VAR) && e.contains(why) && e.contains("accepted: NAME=VALUE"),
            "{bad}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
