//! A bad `VRAMSHIM_*` value is said once per job, not by every process of it that loads the
//! library (a Python started through a pyenv shim runs some 35): the first process to say it
//! notes it in the environment its children inherit (`VRAMSHIM_SAID`), and they say it only
//! for another value.

mod common;

use vramshim_testkit::run_with_preload;

/// How many lines of `stderr` contain `needle`.
fn count(stderr: &str, needle: &str) -> usize {
    stderr.lines().filter(|l| l.contains(needle)).count()
}

/// Seven processes load the library, three generations deep (a shell, its child and the
/// child's two, one more, and a child given another bad value for one of the variables with
/// its own child): each bad value is said once, the other value once too. With the note not
/// set (`sys::log::load_ends` returning before its `setenv`, a temporary edit) the log's line
/// comes five times, the cap's seven (and `vramshim run`'s case below three): the tests fail.
#[test]
fn a_bad_value_is_said_once_by_a_chain_of_processes() {
    let script = "sh -c 'sh -c true; sh -c true'; sh -c true; \
                  VRAMSHIM_LOG=loud sh -c 'sh -c true'";
    let env = [
        ("VRAMSHIM_LOG", "verbose"),
        ("VRAMSHIM_CAP_CONTEXT", "bogus"),
    ];
    let o = run_with_preload(
        std::path::Path::new("/bin/sh"),
        &["-c", script],
        &env,
        Some(&common::lib()),
        "said-once",
    );
    o.assert_success();
    assert_eq!(
        count(&o.stderr, "VRAMSHIM_LOG=\"verbose\""),
        1,
        "{}",
        o.stderr
    );
    assert_eq!(
        count(&o.stderr, "VRAMSHIM_CAP_CONTEXT=\"bogus\""),
        1,
        "{}",
        o.stderr
    );
    assert_eq!(count(&o.stderr, "VRAMSHIM_LOG=\"loud\""), 1, "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 3, "{}", o.stderr);
}

/// Under `vramshim run` (which refuses a bad flag itself, before anything starts) a bad value
/// in the job's environment is said once too, whatever the command starts.
#[test]
fn a_bad_value_is_said_once_under_vramshim_run() {
    let vramshim = vramshim_testkit::vramshim_exe();
    let o = run_with_preload(
        &vramshim,
        &["run", "--", "sh", "-c", "sh -c true; sh -c true"],
        &[
            ("VRAMSHIM_LOG", "verbose"),
            ("VRAMSHIM_LIB", common::lib().to_str().unwrap()),
        ],
        None,
        "said-once-run",
    );
    o.assert_success();
    assert_eq!(
        count(&o.stderr, "VRAMSHIM_LOG=\"verbose\""),
        1,
        "{}",
        o.stderr
    );
    // a bad flag: refused by the command, one line, nothing started
    let o = run_with_preload(
        &vramshim,
        &["run", "--cap", "lots", "--", "sh", "-c", "echo started"],
        &[("VRAMSHIM_LIB", common::lib().to_str().unwrap())],
        None,
        "said-once-run-flag",
    );
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
}
