//! Golden files: the fixture trace (every record type, several frames) as written by format
//! v1 (`tests/golden/small.vramtrace`, row frames) must keep decoding to `small.txt`, and as
//! written by format v2 (`small-v2.vramtrace`, columnar frames, `Torch` records) to
//! `small-v2.txt`; as written by today's writer (`small-v3.vramtrace`, `TorchDelta` records)
//! it must decode to `small-v3.txt` and today's writer must still produce it byte for byte.
//! Regenerate the v3 pair deliberately with `VRAMSHIM_BLESS=1 cargo test -p vramshim-trace
//! --test golden` (a format change also needs a new FORMAT_VERSION and docs/trace-format.md).
//! The v1 and v2 pairs are frozen: no writer produces them any more.

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;

use common::*;
use vramshim_trace::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn dump(path: &std::path::Path) -> String {
    let mut r = TraceReader::open(path).unwrap();
    let mut s = String::new();
    writeln!(s, "{:?}", r.header()).unwrap();
    for e in r.by_ref() {
        writeln!(s, "{:?}", e.unwrap()).unwrap();
    }
    writeln!(s, "truncation: {:?}", r.truncation()).unwrap();
    writeln!(s, "end: {:?}, frames: {}", r.end_time(), r.frames_read()).unwrap();
    s
}

#[test]
fn golden_v1_still_decodes() {
    let bin = dir().join("small.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("small.txt")).unwrap();
    assert_eq!(dump(&bin), want_txt, "decoding the v1 golden file changed");
}

#[test]
fn golden_v2_still_decodes() {
    let bin = dir().join("small-v2.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("small-v2.txt")).unwrap();
    assert_eq!(dump(&bin), want_txt, "decoding the v2 golden file changed");
}

#[test]
fn golden_small_trace() {
    let (_, _, bytes) = small_trace();
    let bin = dir().join("small-v3.vramtrace");
    let txt = dir().join("small-v3.txt");
    if std::env::var_os("VRAMSHIM_BLESS").is_some() {
        std::fs::write(&bin, &bytes).unwrap();
        std::fs::write(&txt, dump(&bin)).unwrap();
    }
    let want_txt = std::fs::read_to_string(&txt).unwrap();
    assert_eq!(dump(&bin), want_txt, "decoding the golden file changed");
    let golden = std::fs::read(&bin).unwrap();
    assert_eq!(
        golden, bytes,
        "the writer no longer produces the golden bytes"
    );
}

#[test]
fn golden_events_match_fixture() {
    let (h, ev, _) = small_trace();
    for (file, version) in [
        ("small.vramtrace", 1),
        ("small-v2.vramtrace", 2),
        ("small-v3.vramtrace", 3),
    ] {
        let (h2, got, errs, trunc) = read_all(&std::fs::read(dir().join(file)).unwrap()).unwrap();
        assert_eq!(h2.format_version, version, "{file}");
        assert_eq!(
            Header {
                format_version: h.format_version,
                ..h2
            },
            h,
            "{file}"
        );
        assert_eq!(got, ev, "{file}");
        assert!(errs.is_empty(), "{file}");
        assert_eq!(trunc, None, "{file}");
    }
}

#[test]
fn golden_v2_and_v3_have_columnar_and_row_frames() {
    for f in ["small-v2.vramtrace", "small-v3.vramtrace"] {
        let b = std::fs::read(dir().join(f)).unwrap();
        let count = |m: &[u8]| b.windows(4).filter(|w| *w == m).count();
        assert!(count(b"VRFC") >= 2, "too few columnar frames in {f}");
        assert!(count(b"VRFR") >= 1, "no row frame in {f}");
    }
}

#[test]
fn smallest_trace_matches_the_worked_example() {
    // docs/trace-format.md section 8.
    let b = TraceWriter::new(Vec::new(), &Header::default())
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(&b[..14], b"\x89VRAMTRACE\r\n\x1a\n");
    assert_eq!(&b[14..22], &[3, 0, 0, 0, 8, 0, 0, 0]);
    assert_eq!(&b[22..30], &[0; 8]);
    assert_eq!(&b[30..34], b"VRFR");
    assert_eq!(&b[38..46], &[6, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(&b[46..62], &[0; 16]);
    assert_eq!(&b[62..66], &[0x28, 0xb5, 0x2f, 0xfd]);
    // Stored, not compressed (section 3.1): descriptor, size, raw block header, the records.
    assert_eq!(&b[34..38], &[19, 0, 0, 0]);
    assert_eq!(&b[66..77], &[0x24, 6, 0x31, 0, 0, 1, 1, 0, 2, 1, 0]);
    assert_eq!(b.len(), 62 + 19);
}
