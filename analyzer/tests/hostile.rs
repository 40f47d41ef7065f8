//! Hostile inputs, generated here: pickles built to exhaust the stack or memory, devices that
//! never end, sizes of 2^64-1, frames that fail their checksum, traces through a pipe. Each
//! gets one message naming the file (and the byte offset or line), a non-zero exit, never a
//! panic or a signal, within a virtual-memory limit (`ulimit -v`) far below what the input
//! would take if it were followed.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

/// Virtual memory allowed to the command (KiB): the analyzer itself needs well under 64 MiB.
const LIMIT_KIB: u64 = 256 << 10;

/// `vramshim ARGS` in `dir` under `ulimit -v kib`.
fn run_limited(dir: &Path, kib: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v \"$1\" || exit 99; shift; exec \"$@\"")
        .arg("sh")
        .arg(kib.to_string())
        .arg(exe())
        .args(args)
        .current_dir(dir)
        .env("VRAMSHIM_NO_PROGRESS", "1")
        .output()
        .expect("run vramshim under sh")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Refused: exit 2 (not a signal, not a panic), one message with every word of `says`.
fn refused(o: &Output, what: &str, says: &[&str]) {
    let err = stderr(o);
    assert!(!err.contains("panicked"), "{what} panicked: {err}");
    assert_eq!(o.status.code(), Some(2), "{what}: {:?}: {err}", o.status);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: one message expected: {err}");
    for w in says {
        assert!(lines[0].contains(w), "{what}: message lacks '{w}': {err}");
    }
}

/// A pickle nested 100,000 lists deep (200 KB): dropping or walking it recursively overflows
/// any stack.
fn deep_pickle() -> Vec<u8> {
    let mut p = vec![0x80, 2];
    p.extend(std::iter::repeat_n(b']', 100_000));
    p.extend(std::iter::repeat_n(b'a', 99_999));
    p.push(b'.');
    p
}

/// 13 bytes: None memoized at index 0x0fffffff and fetched back (a memo kept as an array
/// indexed by it takes gigabytes).
fn memo_index_pickle() -> Vec<u8> {
    b"\x80\x02Nr\xff\xff\xff\x0fj\xff\xff\xff\x0f.".to_vec()
}

/// A memo bomb: t0 = None, t(n+1) = (t(n), t(n)) memoized and fetched 40 times over; copied
/// out, t40 has 2^40 leaves (about 220 bytes of pickle).
fn memo_bomb_pickle() -> Vec<u8> {
    let mut p = b"\x80\x02Nq\x00".to_vec();
    for i in 0..40u8 {
        p.extend_from_slice(&[b'h', i, b'h', i, 0x86, b'q', i + 1]);
    }
    p.push(b'.');
    p
}

/// A well-formed snapshot whose one entry has `size` (a BININT: 4 bytes, signed).
fn snapshot_with_size(size: i32) -> Vec<u8> {
    let mut p = b"\x80\x02}(\x8c\x0ddevice_traces](](}(".to_vec();
    p.extend_from_slice(b"\x8c\x06action\x8c\x05alloc");
    p.extend_from_slice(b"\x8c\x04addrJ\x00\x10\x00\x00");
    p.extend_from_slice(b"\x8c\x04sizeJ");
    p.extend_from_slice(&size.to_le_bytes());
    p.extend_from_slice(b"ueeu.");
    p
}

#[test]
fn hostile_pickles_are_refused_in_bounded_memory() {
    let d = scratch("hostile-pickle");
    let cases: [(&str, Vec<u8>, &[&str]); 4] = [
        (
            "deep.pickle",
            deep_pickle(),
            &["deep.pickle", "offset", "nested more than 100 deep"],
        ),
        (
            "memo-index.pickle",
            memo_index_pickle(),
            &["memo-index.pickle", "not a PyTorch memory snapshot"],
        ),
        (
            "memo-bomb.pickle",
            memo_bomb_pickle(),
            &["memo-bomb.pickle", "offset", "memo bomb"],
        ),
        (
            "negative.pickle",
            snapshot_with_size(-4096),
            &[
                "negative.pickle",
                "device_traces[0][0]",
                "negative 'size' -4096",
            ],
        ),
    ];
    for (name, bytes, says) in cases {
        std::fs::write(d.join(name), &bytes).unwrap();
        for args in [
            vec![
                "import",
                "--from",
                "memory-viz",
                name,
                "-o",
                "out.vramtrace",
            ],
            vec!["summary", name],
            vec!["replay", name],
        ] {
            let o = run_limited(&d, LIMIT_KIB, &args);
            refused(&o, &format!("{args:?}"), says);
        }
        assert!(
            !d.join("out.vramtrace").exists(),
            "{name}: output left behind"
        );
    }
    // The same snapshot with a plain size imports: the refusals above are about the values.
    std::fs::write(d.join("plain.pickle"), snapshot_with_size(4096)).unwrap();
    ok(
        &d,
        &[
            "import",
            "--from",
            "memory-viz",
            "plain.pickle",
            "-o",
            "plain.vramtrace",
        ],
    );
}

#[test]
fn endless_devices_are_refused_at_once() {
    let d = scratch("hostile-dev");
    let o = run_limited(
        &d,
        LIMIT_KIB,
        &[
            "import",
            "--from",
            "rmm-csv",
            "/dev/zero",
            "-o",
            "z.vramtrace",
        ],
    );
    refused(
        &o,
        "rmm-csv /dev/zero",
        &["/dev/zero", "line 1", "longer than 64 KiB"],
    );
    let o = run_limited(
        &d,
        LIMIT_KIB,
        &[
            "import",
            "--from",
            "memory-viz",
            "/dev/zero",
            "-o",
            "z.vramtrace",
        ],
    );
    refused(
        &o,
        "memory-viz /dev/zero",
        &["/dev/zero", "offset 0", "opcode 0x00"],
    );
    for args in [
        vec!["import", "/dev/zero", "-o", "z.vramtrace"],
        vec!["summary", "/dev/zero"],
        vec!["replay", "/dev/zero"],
    ] {
        let o = run_limited(&d, LIMIT_KIB, &args);
        refused(
            &o,
            &format!("{args:?}"),
            &["/dev/zero", "offset 0", "no .vramtrace magic"],
        );
    }
    assert!(!d.join("z.vramtrace").exists());
}

/// A long RMM log is imported row by row into the output: memory does not grow with it.
#[test]
fn long_logs_import_in_bounded_memory() {
    let d = scratch("hostile-long");
    let mut csv = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    let rows = 2_000_000u64;
    for i in 0..rows {
        let ptr = 0x7f00_0000_0000u64 + (i % 64) * 0x10_0000;
        let t = format!(
            "00:{:02}:{:02}.{:06}",
            (i / 60_000_000) % 60,
            (i / 1_000_000) % 60,
            i % 1_000_000
        );
        if i % 2 == 0 {
            csv.push_str(&format!("1,{t},allocate,{ptr:#x},4096,0\n"));
        } else {
            csv.push_str(&format!("1,{t},free,{ptr:#x},4096,0\n"));
        }
    }
    std::fs::write(d.join("long.csv"), csv).unwrap();
    // Every event held in memory would take about 80 MB; streamed, a few.
    let o = run_limited(
        &d,
        96 << 10,
        &["import", "long.csv", "-o", "long.vramtrace"],
    );
    assert!(o.status.success(), "{:?}: {}", o.status, stderr(&o));
    assert!(
        stderr(&o).contains(&format!("imported {rows} events")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sizes_of_2_pow_64_minus_1_fail_the_request_not_the_replay() {
    let d = scratch("hostile-size");
    std::fs::write(
        d.join("huge.csv"),
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,00:00:00.000001,allocate,0x10,18446744073709551615,0\n\
         1,00:00:00.000002,free,0x10,18446744073709551615,0\n\
         1,00:00:00.000003,allocate,0x20,18446744073709551000,0\n\
         1,00:00:00.000004,allocate,0x30,4096,0\n",
    )
    .unwrap();
    for pool in ["all", "caching", "stitch", "direct"] {
        for extra in [&[][..], &["--min-capacity"][..], &["--json"][..]] {
            let mut args = vec!["replay", "--pool", pool, "huge.csv"];
            args.extend_from_slice(extra);
            let o = run_in(&d, &args);
            let err = stderr(&o);
            assert!(!err.contains("panicked"), "{args:?}: {err}");
            assert!(o.status.success(), "{args:?}: {:?} {err}", o.status);
            let out = String::from_utf8_lossy(&o.stdout);
            if extra.is_empty() {
                assert!(out.contains("FAILS"), "{args:?}: {out}");
                assert!(out.contains("out of memory"), "{args:?}: {out}");
            }
        }
    }
    for args in [
        vec!["summary", "huge.csv"],
        vec!["diff", "huge.csv", "huge.csv"],
    ] {
        let o = run_in(&d, &args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
}

/// A trace with one byte flipped inside a frame's compressed data: the frame fails its
/// checksum and is skipped; every command says so and exits 3 after writing its output.
#[test]
fn checksum_failures_are_reported_by_every_command() {
    let d = scratch("hostile-crc");
    let good = synth(&d, "good.vramtrace", &["--events", "200000"]);
    let mut bytes = std::fs::read(&good).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(d.join("crc.vramtrace"), &bytes).unwrap();
    let commands: [&[&str]; 10] = [
        &["summary", "crc.vramtrace"],
        &["summary", "--json", "crc.vramtrace"],
        &["report", "crc.vramtrace", "-o", "r.html"],
        &["replay", "crc.vramtrace"],
        &["replay", "--json", "crc.vramtrace"],
        &["diff", "good.vramtrace", "crc.vramtrace"],
        &["diff", "--json", "crc.vramtrace", "good.vramtrace"],
        &[
            "export",
            "crc.vramtrace",
            "--format",
            "rmm-csv",
            "-o",
            "x.csv",
        ],
        &[
            "export",
            "crc.vramtrace",
            "--format",
            "perfetto",
            "-o",
            "x.pf",
        ],
        &[
            "export",
            "crc.vramtrace",
            "--format",
            "memory-viz",
            "-o",
            "x.pickle",
        ],
    ];
    for args in commands {
        let o = run_in(&d, args);
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains("crc.vramtrace") && err.contains("corrupt frame at byte"),
            "{args:?}: the skipped frame is not named: {err}"
        );
    }
    // The intact trace: exit 0 everywhere.
    ok(&d, &["replay", "good.vramtrace"]);
    ok(&d, &["diff", "good.vramtrace", "good.vramtrace"]);
}

#[test]
fn traces_through_a_pipe_read_like_files() {
    let d = scratch("hostile-pipe");
    synth(&d, "t.vramtrace", &["--events", "5000"]);
    let plain = ok(&d, &["summary", "--json", "t.vramtrace"]);
    let piped = |cmd: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("cat t.vramtrace | \"$0\" {cmd}"))
            .arg(exe())
            .current_dir(&d)
            .env("VRAMSHIM_NO_PROGRESS", "1")
            .output()
            .unwrap()
    };
    let o = piped("summary --json /dev/stdin");
    assert!(o.status.success(), "{}", stderr(&o));
    let strip = |o: &Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["traces"][0]["devices"].clone()
    };
    assert_eq!(
        strip(&o),
        strip(&plain),
        "the piped trace reads differently"
    );
    assert!(
        stderr(&o).contains("/dev/stdin is a pipe"),
        "{}",
        stderr(&o)
    );
    for cmd in [
        "replay /dev/stdin",
        "report /dev/stdin -o r.html",
        "export /dev/stdin --format memory-viz -o m.pickle",
    ] {
        let o = piped(cmd);
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
    }
    // The private copy (named on stderr) is gone afterwards.
    let o = piped("summary /dev/stdin");
    assert!(o.status.success());
    let err = stderr(&o);
    let copy = err
        .split("reading its copy ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no copy named: {err}"));
    assert!(!Path::new(copy).exists(), "{copy} left behind");
    // In a private directory of its own (never a name another user could plant first),
    // removed with it.
    let dir = Path::new(copy).parent().unwrap();
    assert!(
        dir.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vramshim-input-")),
        "{copy}"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn version_0_is_not_a_valid_version() {
    let d = scratch("hostile-v0");
    let good = synth(&d, "good.vramtrace", &["--events", "100"]);
    let mut bytes = std::fs::read(&good).unwrap();
    bytes[14..18].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(d.join("v0.vramtrace"), &bytes).unwrap();
    let o = run_in(&d, &["summary", "v0.vramtrace"]);
    refused(
        &o,
        "v0",
        &["v0.vramtrace", "version 0", "not a valid version"],
    );
    assert!(!stderr(&o).contains("newer"), "{}", stderr(&o));
}
