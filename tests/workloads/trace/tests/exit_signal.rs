//! `_exit` from a signal handler never hangs the job, and still ends the trace when it can.
//!
//! The handler of a SIGALRM calls `_exit` (async-signal-safe) while the main thread is inside
//! `malloc` or `free` in a loop, holding the allocator's lock. The library's `_exit` hook must
//! not allocate or take a lock on that thread (it would wait for the lock its own thread
//! holds, for ever): the trace's last flush runs on the writer thread, waited for a bounded
//! time. Each run is bounded by a watchdog; a run that outlives it is a hang. With the handler
//! interrupting nothing of the allocator's (`pause`), the trace ends with its end record and
//! holds every event.
//!
//! With `VRAMSHIM_TRACE_FAULT=exit-inline` (passed on with `VRAMSHIM_TEST_PASS`) the exiting
//! thread flushes the trace itself (which allocates): a run hangs in `malloc` inside the flush
//! and the watchdog fails the first test.

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vramshim_testkit::{Link, compile_c, interposer_lib, preload, sim_command, temp_dir};
use vramshim_trace::TruncationReason;
use vramshim_trace_tests::{only_trace, source};

const PAIRS: u64 = 300;
/// Runs with the signal inside the allocator (each takes well under a second).
const RUNS: u64 = 40;
/// A run still going after this long is hung (the hook's own bound is under a second).
const WATCHDOG: Duration = Duration::from_secs(20);

/// Runs `trace_exit_signal MODE PAIRS us` traced into `dir`; the exit status, or `None` when it
/// outlived the watchdog (then killed).
fn run_once(exe: &Path, dir: &Path, mode: &str, us: u64) -> Option<ExitStatus> {
    let mut cmd: Command = sim_command(exe, "trace_exit_signal");
    preload(&mut cmd, &interposer_lib())
        .env("VRAMSHIM_TRACE", dir.join("s-%p.vramtrace"))
        .args([mode, &PAIRS.to_string(), &us.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn trace_exit_signal");
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn exit_from_a_handler_that_interrupted_malloc_never_hangs() {
    let exe = compile_c(
        "trace_exit_signal",
        &[&source("trace_exit_signal.c")],
        Link::SharedRuntime,
    );
    let want: Vec<u64> = (0..PAIRS).map(|i| 4096 + i).collect();
    let mut ended = 0;
    for i in 0..RUNS {
        let dir = temp_dir("trace_exit_signal");
        // 5 to 45 ms into the loop: after the writer's first flushes or before them.
        let us = 5_000 + (i * 7_919) % 40_000;
        let st = run_once(&exe, &dir, "malloc", us)
            .unwrap_or_else(|| panic!("run {i} (alarm at {us} us) hung past {WATCHDOG:?}"));
        assert_eq!(st.code(), Some(3), "run {i}: {st:?}");
        let r = only_trace(&dir, &format!("run {i}"));
        assert!(r.errors.is_empty(), "run {i}: {:?}", r.errors);
        match &r.truncation {
            None => {
                // An ended trace holds every event.
                assert_eq!(r.alloc_sizes(), want, "run {i}");
                ended += 1;
            }
            // Given up: the trace reads up to the writer's last flush.
            Some(t) => assert!(
                matches!(t.reason, TruncationReason::NoEndRecord),
                "run {i}: {t:?}"
            ),
        }
    }
    eprintln!("{ended} of {RUNS} runs interrupted inside malloc ended their trace");
}

#[test]
fn exit_from_a_handler_ends_the_trace_when_it_can() {
    let exe = compile_c(
        "trace_exit_signal",
        &[&source("trace_exit_signal.c")],
        Link::SharedRuntime,
    );
    let want: Vec<u64> = (0..PAIRS).map(|i| 4096 + i).collect();
    for us in [1_000, 20_000, 120_000] {
        let dir = temp_dir("trace_exit_signal_pause");
        let st = run_once(&exe, &dir, "pause", us)
            .unwrap_or_else(|| panic!("pause run (alarm at {us} us) hung"));
        assert_eq!(st.code(), Some(3), "{st:?}");
        let r = only_trace(&dir, &format!("alarm at {us} us"));
        assert_eq!(r.truncation, None, "alarm at {us} us: no end record");
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.alloc_sizes(), want, "alarm at {us} us");
    }
}
