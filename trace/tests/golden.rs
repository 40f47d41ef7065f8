//! Golden file: `tests/golden/small.vramtrace` (every record type, several frames) must keep
//! decoding to `tests/golden/small.txt`, and today's writer must still produce it byte for
//! byte. Regenerate deliberately with `VRAMSHIM_BLESS=1 cargo test -p vramshim-trace --test golden`
//! (a format change also needs a new FORMAT_VERSION and docs/trace-format.md).

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
fn golden_small_trace() {
    let (_, _, bytes) = small_trace();
    let bin = dir().join("small.vramtrace");
    let txt = dir().join("small.txt");
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
    let (h2, got, errs, trunc) =
        read_all(&std::fs::read(dir().join("small.vramtrace")).unwrap()).unwrap();
    assert_eq!(h2, h);
    assert_eq!(got, ev);
    assert!(errs.is_empty());
    assert_eq!(trunc, None);
}

#[test]
fn smallest_trace_matches_the_worked_example() {
    // docs/trace-format.md section 8.
    let b = TraceWriter::new(Vec::new(), &Header::default())
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(&b[..14], b"\x89VRAMTRACE\r\n\x1a\n");
    assert_eq!(&b[14..22], &[1, 0, 0, 0, 8, 0, 0, 0]);
    assert_eq!(&b[22..30], &[0; 8]);
    assert_eq!(&b[30..34], b"VRFR");
    assert_eq!(&b[38..46], &[6, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(&b[46..62], &[0; 16]);
    assert_eq!(&b[62..66], &[0x28, 0xb5, 0x2f, 0xfd]);
}
