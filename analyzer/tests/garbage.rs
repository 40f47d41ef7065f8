//! Every command fed every kind of bad input: one message naming the file and the offset or
//! line, a non-zero exit, never a panic.

mod common;
use common::*;
use std::path::Path;

struct Bad {
    file: &'static str,
    /// Words the message must contain (besides the file name).
    says: &'static [&'static str],
}

fn make_inputs(d: &Path) -> Vec<Bad> {
    let good = synth(d, "good.vramtrace", &["--events", "3000"]);
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(d.join("torn.vramtrace"), &bytes[..bytes.len() * 2 / 3]).unwrap();
    let mut future = bytes.clone();
    future[14..18].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(d.join("future.vramtrace"), &future).unwrap();
    std::fs::write(d.join("empty.vramtrace"), b"").unwrap();
    let mut noise = Vec::new();
    let mut x: u32 = 12345;
    for _ in 0..5000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x as u8);
    }
    std::fs::write(d.join("noise.bin"), &noise).unwrap();
    std::fs::write(
        d.join("badrow.csv"),
        "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x10,64,0\n1,00:00:00.000002,allocate,0x20,lots,0\n",
    )
    .unwrap();
    std::fs::write(
        d.join("badtime.csv"),
        "Thread,Time,Action,Pointer,Size,Stream\n1,yesterday,free,0x10,64,0\n",
    )
    .unwrap();
    std::fs::write(d.join("wrongheader.csv"), "a,b,c\n1,2,3\n").unwrap();
    // pickle.dumps([1, 2], protocol=2): a pickle, but not a snapshot.
    std::fs::write(d.join("list.pickle"), b"\x80\x02]q\x00(K\x01K\x02e.").unwrap();
    // A pickle that would run code: refused, never executed.
    std::fs::write(
        d.join("evil.pickle"),
        b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.",
    )
    .unwrap();
    std::fs::write(
        d.join("cut.pickle"),
        b"\x80\x02}q\x00(X\x0d\x00\x00\x00device_traces",
    )
    .unwrap();
    vec![
        Bad {
            file: "missing.vramtrace",
            says: &["no such file"],
        },
        Bad {
            file: "empty.vramtrace",
            says: &["empty"],
        },
        Bad {
            file: "noise.bin",
            says: &["not a vramshim trace"],
        },
        Bad {
            file: "future.vramtrace",
            says: &["version 99", "newer"],
        },
        Bad {
            file: "badrow.csv",
            says: &["line 3", "Size"],
        },
        Bad {
            file: "badtime.csv",
            says: &["line 2", "Time"],
        },
        Bad {
            file: "wrongheader.csv",
            says: &["line 1", "not an RMM log"],
        },
        Bad {
            file: "list.pickle",
            says: &["not a PyTorch memory snapshot", "list"],
        },
        Bad {
            file: "evil.pickle",
            says: &["offset 2", "GLOBAL"],
        },
        Bad {
            file: "cut.pickle",
            says: &["offset", "truncated"],
        },
        Bad {
            file: ".",
            says: &["directory"],
        },
    ]
}

fn commands(file: &str) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<String>>();
    vec![
        s(&["summary", file]),
        s(&["summary", "--json", file]),
        s(&["report", file, "-o", "out.html"]),
        s(&["export", file, "--format", "perfetto", "-o", "out.pf"]),
        s(&["export", file, "--format", "chrome-json", "-o", "out.json"]),
        s(&["export", file, "--format", "memory-viz", "-o", "out.pickle"]),
        s(&["export", file, "--format", "rmm-csv", "-o", "out.csv"]),
        s(&["replay", file]),
        s(&["diff", file, "good.vramtrace"]),
        s(&["diff", "good.vramtrace", file]),
    ]
}

fn check(d: &Path, args: &[String], bad: &Bad) {
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = run_in(d, &argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked"),
        "vramshim {argv:?} panicked: {err}"
    );
    assert!(
        !out.status.success(),
        "vramshim {argv:?} accepted {}: {err}",
        bad.file
    );
    assert_eq!(out.status.code(), Some(2), "vramshim {argv:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "vramshim {argv:?}: one message expected, got: {err}"
    );
    let name = bad.file.trim_start_matches("./");
    assert!(
        lines[0].contains(name),
        "vramshim {argv:?}: message does not name {name}: {err}"
    );
    for w in bad.says {
        assert!(
            lines[0].contains(w),
            "vramshim {argv:?}: message lacks '{w}': {err}"
        );
    }
}

#[test]
fn every_command_rejects_every_bad_input_with_one_message() {
    let d = scratch("garbage");
    for bad in make_inputs(&d) {
        for args in commands(bad.file) {
            check(&d, &args, &bad);
        }
    }
}

#[test]
fn import_rejects_bad_inputs_too() {
    let d = scratch("garbage-import");
    let inputs = make_inputs(&d);
    for bad in inputs.iter().filter(|b| b.file.ends_with(".csv")) {
        check(
            &d,
            &[
                "import".into(),
                bad.file.into(),
                "--from".into(),
                "rmm-csv".into(),
                "-o".into(),
                "x.vramtrace".into(),
            ],
            bad,
        );
        assert!(
            !d.join("x.vramtrace").exists(),
            "a failed import left a file behind"
        );
    }
    for bad in inputs.iter().filter(|b| b.file.ends_with(".pickle")) {
        check(
            &d,
            &[
                "import".into(),
                bad.file.into(),
                "--from".into(),
                "memory-viz".into(),
                "-o".into(),
                "x.vramtrace".into(),
            ],
            bad,
        );
    }
    let out = run_in(&d, &["import", "noise.bin", "-o", "x.vramtrace"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("noise.bin"));
}

/// Runs `vramshim ARGS` on a damaged trace: no panic, exit 3 (everything readable was used,
/// the output made, the damage reported); its stderr.
fn used_but_damaged(d: &Path, args: &[&str]) -> String {
    let out = run_in(d, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{args:?}: a damaged trace is read up to the damage, the output made, and the damage \
         reported: {err}"
    );
    err
}

#[test]
fn torn_trace_is_used_and_reported() {
    let d = scratch("garbage-torn");
    make_inputs(&d);
    for args in [
        vec!["summary", "torn.vramtrace"],
        vec!["report", "torn.vramtrace", "-o", "t.html"],
    ] {
        let err = used_but_damaged(&d, &args);
        assert!(
            err.contains("torn.vramtrace") && err.contains("torn"),
            "{err}"
        );
        assert!(err.contains("byte"), "the message names the offset: {err}");
    }
    for args in [
        vec!["replay", "torn.vramtrace"],
        vec![
            "export",
            "torn.vramtrace",
            "--format",
            "rmm-csv",
            "-o",
            "t.csv",
        ],
    ] {
        let out = run_in(&d, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn garbage_after_the_last_frame_is_used_and_reported_once() {
    let d = scratch("garbage-tail");
    let good = synth(&d, "good.vramtrace", &["--events", "3000"]);
    let mut bytes = std::fs::read(&good).unwrap();
    let good_len = bytes.len();
    // A crash-proof trace with garbage after its last good frame.
    bytes.extend((0..5000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    std::fs::write(d.join("tail.vramtrace"), &bytes).unwrap();
    let clean = run_in(&d, &["summary", "--json", "good.vramtrace"]);
    assert_eq!(clean.status.code(), Some(0));
    let clean: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    let events = &clean["traces"][0]["events"];
    let where_ = format!("byte {good_len}");
    for args in [
        vec!["summary", "tail.vramtrace"],
        vec!["summary", "--json", "tail.vramtrace"],
        vec!["report", "tail.vramtrace", "-o", "t.html"],
        vec![
            "export",
            "tail.vramtrace",
            "--format",
            "rmm-csv",
            "-o",
            "t.csv",
        ],
        vec!["replay", "tail.vramtrace"],
    ] {
        let err = used_but_damaged(&d, &args);
        assert_eq!(
            err.matches("trace damaged").count(),
            1,
            "{args:?}: said once: {err}"
        );
        assert!(
            err.contains("tail.vramtrace")
                && err.contains(&where_)
                && err.contains("frame ")
                && err.contains("skipped 5000 bytes"),
            "{args:?}: names where and what was skipped: {err}"
        );
    }
    // Every event before the damage, and the result marked cut like a killed process's trace.
    let out = run_in(&d, &["summary", "--json", "tail.vramtrace"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(&v["traces"][0]["events"], events);
    assert_eq!(v["traces"][0]["torn"], true);
    let out = run_in(&d, &["summary", "tail.vramtrace"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("the trace is cut off"), "{text}");
    assert!(
        text.contains("cap 20.0 GiB: 1 refusals"),
        "the refusal before the damage is explained: {text}"
    );
    // Garbage from the first byte is still not a trace.
    std::fs::write(d.join("noise.vramtrace"), &bytes[good_len..]).unwrap();
    let out = run_in(&d, &["summary", "noise.vramtrace"]);
    assert_eq!(out.status.code(), Some(2));
}
