//! The writer thread's work follows the events: a tick that finds nothing new writes no
//! frame, and a slow program's few events per tick all reach the file.

use vramshim_testkit::{Link, compile_c, interposer_lib, preload, run, sim_command, temp_dir};
use vramshim_trace::Event;
use vramshim_trace_tests::{read, source};

/// Frames in a trace file (walking the envelopes).
fn frame_count(bytes: &[u8]) -> usize {
    let hl = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let mut p = 22 + hl;
    let mut n = 0;
    while p + 32 <= bytes.len() {
        let c = u32::from_le_bytes(bytes[p + 4..p + 8].try_into().unwrap()) as usize;
        p += 32 + c;
        n += 1;
    }
    assert_eq!(p, bytes.len(), "the trace does not end at a frame boundary");
    n
}

/// `trace_idle SECONDS [PERIOD_US]` traced; returns the trace's frames, its events and the
/// number of synchronizations the program says it made.
fn traced(tag: &str, args: &[&str]) -> (usize, Vec<Event>, usize) {
    let (frames, events, made, _, _) = traced_env(tag, args, &[]);
    (frames, events, made)
}

/// [`traced`] with more environment; also returns the program's stderr and how long it ran
/// (its compilation not counted).
fn traced_env(
    tag: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (usize, Vec<Event>, usize, String, std::time::Duration) {
    let exe = compile_c(
        "trace_idle",
        &[&source("trace_idle.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir(tag);
    let path = dir.join("t.vramtrace");
    let mut cmd = sim_command(&exe, tag);
    cmd.args(args);
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", &path);
    cmd.envs(env.iter().copied());
    let t0 = std::time::Instant::now();
    let out = run(&mut cmd);
    let ran = t0.elapsed();
    out.assert_success();
    let made = out
        .stdout
        .trim()
        .strip_prefix("syncs ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("trace_idle printed {:?}", out.stdout));
    let r = read(&path);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(r.end.is_some(), "no end record");
    (
        frame_count(&std::fs::read(&path).unwrap()),
        r.events,
        made,
        out.stderr,
        ran,
    )
}

/// 2 s asleep after one allocation is 40 ticks of the writer: it writes the allocation (and
/// its counter), the device once known, and the end; no frame for the ticks between.
#[test]
fn an_idle_process_gets_no_frame_per_tick() {
    let (frames, events, _) = traced("trace_idle", &["2"]);
    assert!(
        frames <= 6,
        "{frames} frames for a process asleep for 40 ticks: {events:?}"
    );
}

/// One synchronization every 5 ms for 1 s: every one is in the trace, in the small frames
/// the ticks write.
#[test]
fn a_slow_program_loses_no_event_between_ticks() {
    let (frames, events, made) = traced("trace_slow", &["1", "5000"]);
    let syncs = events
        .iter()
        .filter(|e| matches!(e, Event::Sync { .. }))
        .count();
    assert!(made > 0);
    assert_eq!(syncs, made, "syncs traced / made");
    assert!(frames >= 2, "{frames} frames");
}

/// `VRAMSHIM_TRACE_TICK_MS` (a benchmark switch) stretches the drain period: a program that
/// synchronizes every 5 ms for 1 s gets a frame per 400 ms tick at most (plus the first
/// events' and the end's), where 50 ms ticks write one every tick; every event still reaches
/// the file.
#[test]
fn the_tick_switch_sets_the_drain_period() {
    let (frames, events, made, err, ran) = traced_env(
        "trace_tick",
        &["1", "5000"],
        &[("VRAMSHIM_TRACE_TICK_MS", "400")],
    );
    // The program's own run only (not its compilation): a bound that load only loosens,
    // and that 50 ms ticks (20 a second) exceed.
    let ticks = ran.as_millis() as usize / 400;
    let syncs = events
        .iter()
        .filter(|e| matches!(e, Event::Sync { .. }))
        .count();
    assert_eq!(syncs, made, "syncs traced / made");
    assert!(
        frames <= ticks + 3,
        "{frames} frames in {ticks} ticks of 400 ms"
    );
    assert!(!err.contains("VRAMSHIM_TRACE_TICK_MS"), "{err}");
}

/// A value it does not accept: one line that names the variable and the accepted values,
/// and the default period; the trace is whole.
#[test]
fn a_bad_tick_switch_is_one_line() {
    for bad in ["0", "abc", "60001", "-5"] {
        let (_, events, made, err, _) = traced_env(
            "trace_tick_bad",
            &["1", "20000"],
            &[("VRAMSHIM_TRACE_TICK_MS", bad)],
        );
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("VRAMSHIM_TRACE_TICK_MS"))
            .collect();
        assert_eq!(lines.len(), 1, "{bad}: {err}");
        assert!(
            lines[0].contains("from 1 to 60000") && lines[0].contains("50 ms"),
            "{}",
            lines[0]
        );
        let syncs = events
            .iter()
            .filter(|e| matches!(e, Event::Sync { .. }))
            .count();
        assert_eq!(syncs, made, "{bad}: syncs traced / made");
    }
}
