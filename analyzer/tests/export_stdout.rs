//! `vramshim export -o -` writes to standard output (no file named `-`): every format's bytes
//! equal those of `-o FILE` for the same trace when standard output is a pipe; to a terminal a
//! binary format is refused with one line and a non-zero exit, and a text format is written.

mod common;
use common::*;

use std::process::{Command, Stdio};

const FORMATS: [&str; 5] = [
    "perfetto",
    "chrome-json",
    "memory-viz",
    "rmm-csv",
    "parquet",
];

#[test]
fn dash_writes_each_format_to_standard_output() {
    let d = scratch("export-stdout");
    let trace = synth(&d, "t.vramtrace", &[]);
    for f in FORMATS {
        let file = format!("t.{f}");
        ok(
            &d,
            &["export", trace.to_str().unwrap(), "-f", f, "-o", &file],
        );
        let want = std::fs::read(d.join(&file)).unwrap();
        let out = ok(&d, &["export", trace.to_str().unwrap(), "-f", f, "-o", "-"]);
        assert!(!want.is_empty(), "{f}: the file export wrote something");
        assert!(
            out.stdout == want,
            "{f}: standard output ({} bytes) equals the file export ({} bytes)",
            out.stdout.len(),
            want.len()
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("to standard output"),
            "{f}: says where it wrote: {err}"
        );
        assert!(!d.join("-").exists(), "{f}: no file named '-' was written");
    }
}

/// `vramshim export TRACE -f FORMAT -o -` with standard output on a terminal (a pseudo-terminal
/// that a helper drains): (exit code, stdout bytes, stderr).
/// python3 is one of the build's requirements (README), so its absence fails the test.
fn export_to_terminal(d: &std::path::Path, trace: &str, format: &str) -> (i32, usize, String) {
    const PTY: &str = r#"
import os, subprocess, sys, threading
m, s = os.openpty()
got = []
def drain():
    while True:
        try:
            b = os.read(m, 65536)
        except OSError:
            return
        if not b:
            return
        got.append(len(b))
t = threading.Thread(target=drain, daemon=True)
t.start()
r = subprocess.run(sys.argv[1:], stdout=s, stderr=subprocess.PIPE)
os.close(s)
t.join(5)
sys.stdout.write("%d %d\n" % (r.returncode, sum(got)))
sys.stdout.write(r.stderr.decode(errors="replace"))
"#;
    let py = python().expect("python3 (to open a pseudo-terminal with)");
    let out = Command::new(py)
        .arg("-c")
        .arg(PTY)
        .arg(exe())
        .args(["export", trace, "-f", format, "-o", "-"])
        .current_dir(d)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .stdin(Stdio::null())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (first, rest) = text.split_once('\n').unwrap();
    let mut w = first.split(' ');
    let code = w.next().unwrap().parse().unwrap();
    let bytes = w.next().unwrap().parse().unwrap();
    (code, bytes, rest.to_string())
}

#[test]
fn dash_refuses_binary_formats_to_a_terminal_and_writes_text_ones() {
    let d = scratch("export-tty");
    let trace = synth(&d, "t.vramtrace", &[]);
    let trace = trace.to_str().unwrap();
    for f in ["perfetto", "memory-viz", "parquet"] {
        let (code, bytes, err) = export_to_terminal(&d, trace, f);
        assert_ne!(code, 0, "{f}: refused: {err}");
        assert_eq!(bytes, 0, "{f}: nothing written to the terminal: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{f}: one line: {err}");
        assert!(
            err.contains(&format!("--format {f} is binary")) && err.contains("-o FILE"),
            "{f}: says what and what to do: {err}"
        );
        assert!(!d.join("-").exists(), "{f}: no file named '-'");
    }
    for f in ["chrome-json", "rmm-csv"] {
        let (code, bytes, err) = export_to_terminal(&d, trace, f);
        assert_eq!(code, 0, "{f}: written: {err}");
        assert!(bytes > 0, "{f}: text reached the terminal: {err}");
        assert!(!d.join("-").exists(), "{f}: no file named '-'");
    }
}

/// A reader that goes away (`vramshim summary --json | head -c0`, `vramshim summary T | head
/// -1`, `vramshim replay --json T | head`, `vramshim export ... -o - | head`) ends the
/// command as it ends other Unix tools: quietly, never with a panic's message.
#[test]
fn a_reader_that_leaves_ends_the_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let d = scratch("reader-leaves");
    let trace = synth(&d, "t.vramtrace", &[]);
    for args in [
        vec!["summary", trace.to_str().unwrap()],
        vec!["summary", "--json", trace.to_str().unwrap()],
        vec!["replay", "--json", trace.to_str().unwrap()],
        vec![
            "export",
            trace.to_str().unwrap(),
            "-f",
            "chrome-json",
            "-o",
            "-",
        ],
    ] {
        let mut child = Command::new(exe())
            .args(&args)
            .current_dir(&d)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The read end closes before the command writes (or, on a slow machine, after it
        // wrote everything into the pipe's buffer: then it ends normally).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: no panic: {err}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: ends by SIGPIPE or normally, not {:?}: {err}",
            out.status
        );
    }
}
