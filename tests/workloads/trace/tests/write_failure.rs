//! A trace write that fails (the file-size limit standing in for a full disk: the same
//! failed `write`, without needing a small filesystem): the library says why (errno text) and
//! how much it lost, the program runs to its end, and the trace is cut at its last whole frame
//! and ends with a `Lost` record when the disk takes it, or else is visibly cut off.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use vramshim_testkit::{Link, compile_c, interposer_lib, preload, sim_command, temp_dir};
use vramshim_trace::Event;
use vramshim_trace_tests::{read, source};

/// Bytes the trace may still grow once the job runs: a few frames, far below what 3000
/// allocation pairs write.
const HEADROOM: u64 = 4 << 10;

#[test]
fn a_failed_write_says_why_counts_what_is_lost_and_cuts_the_trace_cleanly() {
    let exe = compile_c(
        "trace_loop",
        &[&source("trace_loop.c")],
        Link::SharedRuntime,
    );
    let dir = temp_dir("trace_write_failure");
    let path = dir.join("full.vramtrace");
    let mut cmd = sim_command(&exe, "trace_write_failure");
    cmd.arg("3000");
    cmd.env("TRACE_LOOP_PROGRESS", dir.join("progress"));
    preload(&mut cmd, &interposer_lib()).env("VRAMSHIM_TRACE", &path);
    // SAFETY: an async-signal-safe call only (signal) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // A write past the file-size limit then fails with EFBIG instead of killing.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // The limit is set once the job runs (the simulated device's file is made at start and
    // must not hit it): a few frames beyond what the trace holds now.
    let limit = std::fs::metadata(&path).map_or(0, |m| m.len()) + HEADROOM;
    let lim = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit on our own child with a valid rlimit.
    let rc = unsafe {
        libc::prlimit(
            child.id() as i32,
            libc::RLIMIT_FSIZE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // One line at the failure with the reason, one at exit with the count.
    let failed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("lost so far"))
        .collect();
    assert_eq!(failed.len(), 1, "{stderr}");
    assert!(failed[0].contains("File too large"), "{stderr}");
    let at_exit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("events were not written"))
        .collect();
    assert_eq!(at_exit.len(), 1, "{stderr}");
    let lost: u64 = at_exit[0]
        .split(" events were not written")
        .next()
        .and_then(|s| s.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {:?}", at_exit[0]));
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size <= limit, "{size} > {limit}");
    let r = read(&path);
    // Cut at a whole frame: nothing torn, nothing undecodable.
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let written = r
        .events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(_) | Event::Free(_)))
        .count() as u64;
    assert!(written > 0 && written < 6000, "{written}");
    // Everything the program did is either in the trace or counted as lost.
    assert!(
        written + lost >= 6000,
        "{written} written + {lost} lost < 6000"
    );
    let in_trace: u64 = r
        .events
        .iter()
        .map(|e| match e {
            Event::Lost { count, .. } => *count,
            _ => 0,
        })
        .sum();
    if r.end.is_some() {
        assert!(
            in_trace >= lost,
            "the Lost record says {in_trace}, stderr {lost}"
        );
        assert!(at_exit[0].contains("Lost record"), "{stderr}");
    } else {
        assert!(r.truncation.is_some());
        assert!(at_exit[0].contains("cut off"), "{stderr}");
    }
    // The analyses say the trace is incomplete instead of calling what was live at its end
    // leaks (the job's allocations are live while it runs).
    let vramshim = vramshim_testkit::vramshim_exe();
    if vramshim.is_file() {
        let o = std::process::Command::new(&vramshim)
            .arg("summary")
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("at the end of the trace") && text.contains("not leaks"),
            "{text}"
        );
        assert!(!text.contains("at exit"), "{text}");
    } else {
        eprintln!("vramshim not built: the summary of the cut trace is not checked");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
