//! Strings a trace carries (its command line, host, device names, configuration, module paths)
//! reach the terminal from `summary`, `diff` and `replay` without their control characters: a
//! trace from someone else cannot send escape sequences to the reader's terminal (retitle it,
//! move the cursor, clear or rewrite what is shown) nor forge lines of the summary.

mod common;
use common::*;

use std::path::Path;

use vramshim_trace::{Api, DeviceInfo, Event, Header, MemOp, TraceWriter, codes};

/// ESC (an OSC retitle and a CSI clear), BEL, the 8-bit CSI, a right-to-left override, a
/// line separator, a carriage return and a line break followed by a forged summary line.
const HOSTILE: &str = "x\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}1A\u{202e}\u{2028}\r\nFORGED: no leaks";

fn op(t: u64, api: Api, addr: u64, size: u64, result: i32) -> MemOp {
    MemOp {
        stack: 1,
        ..memop(t, api, addr, size, result)
    }
}

/// The trace; `size` is its allocation's (two sizes make `diff` list the call site).
fn write(path: &Path, size: u64) {
    let header = Header {
        pid: 7,
        host: HOSTILE.into(),
        cmdline: vec!["python".into(), "-c".into(), HOSTILE.into()],
        devices: vec![DeviceInfo {
            index: 0,
            name: HOSTILE.into(),
            total_bytes: 1 << 30,
            uuid: None,
        }],
        config: vec![("VRAMSHIM_CAP".into(), HOSTILE.into())],
        ..Default::default()
    };
    let records = vec![
        Event::Module {
            base: 0x1000_0000,
            size: 0x1000,
            file_offset: 0,
            path: format!("/lib/{HOSTILE}.so"),
        },
        Event::Stack {
            id: 1,
            frames: vec![0x1000_0010],
        },
    ];
    write_trace(path, &header, records, size);
}

/// Writes the trace of `header` to `path`: `records` (the modules, code objects and stacks the
/// events name), then an allocation of `size` at stack 1, a refused one (a post-mortem) and the
/// free of the first.
fn write_trace(path: &Path, header: &Header, records: Vec<Event>, size: u64) {
    let mut w = TraceWriter::new(Vec::new(), header).unwrap();
    let events = [
        Event::Alloc(op(1_000, Api::CudaMalloc, 0x7000_0000, size, 0)),
        Event::Alloc(op(2_000, Api::CudaMalloc, 0, 1 << 31, codes::OUT_OF_MEMORY)),
        Event::Free(op(3_000, Api::CudaFree, 0x7000_0000, size, 0)),
    ];
    for e in records.iter().chain(&events) {
        w.write(e).unwrap();
    }
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

/// What `vramshim ARGS` printed holds none of the hostile strings' control characters, and no
/// line of it starts with their forged text.
fn clean(args: &[&str], text: &str) {
    for c in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\u{2028}', '\r'] {
        assert!(
            !text.contains(c),
            "vramshim {args:?} printed {c:?} it was given:\n{text}"
        );
    }
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED")),
        "vramshim {args:?} let its input forge a line:\n{text}"
    );
}

#[test]
fn trace_strings_reach_the_terminal_without_control_characters() {
    let d = scratch("terminal");
    write(&d.join("a.vramtrace"), 1 << 20);
    write(&d.join("b.vramtrace"), 4 << 20);
    for args in [
        vec!["summary", "a.vramtrace"],
        vec!["summary", "--each", "a.vramtrace", "b.vramtrace"],
        vec!["diff", "a.vramtrace", "b.vramtrace"],
        vec!["replay", "a.vramtrace"],
    ] {
        let out = ok(&d, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        clean(&args, &text);
        assert!(
            text.contains("FORGED") || args[0] == "replay",
            "vramshim {args:?} does not show the trace's strings at all:\n{text}"
        );
    }
    // The command line is still there, its line break shown as an escape.
    let out = ok(&d, &["summary", "a.vramtrace"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("python -c x\\u{1b}]0;pwned\\u{7}"),
        "the command line, escaped:\n{text}"
    );
    assert!(text.contains("\\r\\nFORGED: no leaks"), "{text}");
}

/// A trace file another user named: its name's control characters do not reach the terminal
/// in the one message about it, whether it is refused (not a trace) or read but torn.
#[test]
fn file_names_reach_the_terminal_without_control_characters() {
    let d = scratch("terminal-names");
    let name = "t\u{1b}]0;pwned\u{7}\nFORGED.vramtrace";
    std::fs::write(d.join(name), b"not a trace at all").unwrap();
    let torn = "torn\u{1b}[2J.vramtrace";
    write(&d.join("whole.vramtrace"), 1 << 20);
    let bytes = std::fs::read(d.join("whole.vramtrace")).unwrap();
    std::fs::write(d.join(torn), &bytes[..bytes.len() - 8]).unwrap();
    for (file, code) in [(name, 2), (torn, 3)] {
        for args in [
            vec!["summary", file],
            vec!["export", file, "--format", "chrome-json", "-o", "out.json"],
            vec!["replay", file],
            vec!["report", file, "-o", "out.html"],
            vec!["diff", file, "whole.vramtrace"],
        ] {
            let out = run_in(&d, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "vramshim {args:?}: {err}");
            clean(&args, &err);
            assert!(err.contains("\\u{1b}"), "the name, escaped: {err}");
        }
    }
}

/// `vramshim import`'s "imported ... from FILE into OUT" line: both names escaped.
#[test]
fn import_names_reach_the_terminal_without_control_characters() {
    let d = scratch("terminal-import");
    let csv = "log\u{1b}]0;pwned\u{7}\nFORGED.csv";
    std::fs::write(
        d.join(csv),
        "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x10,64,0\n1,00:00:00.000002,free,0x10,64,0\n",
    )
    .unwrap();
    let out_name = "out\u{1b}[2J.vramtrace";
    let args = ["import", csv, "--from", "rmm-csv", "-o", out_name];
    let out = run_in(&d, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("imported 2 events"), "{err}");
    clean(&args, &err);
    assert!(
        err.contains("log\\u{1b}]0;pwned\\u{7}\\nFORGED.csv") && err.contains("out\\u{1b}[2J"),
        "the names, escaped: {err}"
    );
}

/// Characters that reorder or hide text without being controls: right-to-left override and
/// embedding, isolates, marks, the Arabic letter mark, a line separator.
const REORDERING: [char; 9] = [
    '\u{202e}', '\u{202b}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', '\u{200f}', '\u{061c}',
    '\u{2028}',
];

/// A Python file and a module path that reorder themselves where they are shown:
/// `train\u{202e}yp.evil` reads as `trainlive.py`.
const PY_FILE: &str = "/home/u/train\u{202e}yp.evil\u{2066}x\u{2069}\u{200f}\u{061c}";
const MODULE: &str = "/opt/lib\u{202b}gro\u{2067}s\u{2068}o\u{2028}.so";

/// The trace: an allocation whose stack is a Python frame (of `PY_FILE`) over a native one (of
/// `MODULE`), then a refused one (a post-mortem), in a process whose command line names both.
fn write_reordering(path: &Path, size: u64) {
    let header = Header {
        pid: 7,
        host: "h\u{202e}ost".into(),
        cmdline: vec!["python".into(), PY_FILE.into()],
        devices: vec![DeviceInfo {
            index: 0,
            name: "GPU\u{2066}0\u{2069}".into(),
            total_bytes: 1 << 30,
            uuid: None,
        }],
        ..Default::default()
    };
    let records = vec![
        Event::Module {
            base: 0x1000_0000,
            size: 0x1000,
            file_offset: 0,
            path: MODULE.into(),
        },
        Event::PyCode {
            id: 3,
            file: PY_FILE.into(),
            function: "step\u{202e}".into(),
            first_line: 10,
        },
        Event::Stack {
            id: 1,
            frames: vec![1 << 63 | 3 << 32 | 12, 0x1000_0010],
        },
    ];
    write_trace(path, &header, records, size);
}

/// The JSON outputs (`summary --json` with its post-mortem, `diff --json`, `replay --json`, the
/// chrome-json export) write those characters as `\uXXXX` escapes, as the text outputs do
/// (JSON needs only controls escaped): no name a trace carries reorders what shows the JSON,
/// and a JSON reader gets the names back as they were.
#[test]
fn json_outputs_escape_reordering_characters() {
    let d = scratch("terminal-json");
    write_reordering(&d.join("a.vramtrace"), 1 << 20);
    write_reordering(&d.join("b.vramtrace"), 4 << 20);
    for args in [
        vec!["summary", "--json", "a.vramtrace"],
        vec!["summary", "--json", "a.vramtrace", "b.vramtrace"],
        vec!["diff", "--json", "a.vramtrace", "b.vramtrace"],
        vec!["replay", "--json", "a.vramtrace"],
        vec![
            "export",
            "a.vramtrace",
            "--format",
            "chrome-json",
            "-o",
            "a.json",
        ],
    ] {
        let out = ok(&d, &args);
        let text = if args[0] == "export" {
            std::fs::read_to_string(d.join("a.json")).unwrap()
        } else {
            String::from_utf8(out.stdout).unwrap()
        };
        for c in REORDERING {
            assert!(
                !text.contains(c),
                "vramshim {args:?} wrote {c:?} unescaped:\n{text}"
            );
        }
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("vramshim {args:?}: not JSON ({e}):\n{text}"));
        // the names are all there, escaped, and read back as they were
        let back = v.to_string();
        let wanted: &[&str] = match args[0] {
            // the command line, and the stacks: the Python frame, the module's file
            "summary" => &[
                PY_FILE,
                "step\u{202e} (train\u{202e}yp.evil\u{2066}x\u{2069}\u{200f}\u{061c}:12)",
                "lib\u{202b}gro\u{2067}s\u{2068}o\u{2028}.so+0x10",
            ],
            "export" => &[PY_FILE],
            _ => &[],
        };
        for s in wanted {
            assert!(
                back.contains(s),
                "vramshim {args:?}: {s:?} missing from\n{text}"
            );
        }
        if args.len() == 3 && args[0] == "summary" {
            // the post-mortem of the refused allocation, its frames read back whole
            let pm = &v["traces"][0]["devices"][0]["post_mortems"][0];
            assert_eq!(pm["frames"][0], wanted[1], "{text}");
            assert_eq!(pm["frames"][1], wanted[2], "{text}");
        }
        if !wanted.is_empty() {
            assert!(
                text.contains("train\\u202eyp.evil\\u2066x\\u2069\\u200f\\u061c"),
                "{text}"
            );
        }
    }
}
