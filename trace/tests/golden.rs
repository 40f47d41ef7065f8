//! Golden files: the fixture trace (every event kind up to `Device`, tag 16; several frames) as
//! written by format v1 (`tests/golden/small.vramtrace`, row frames) must keep decoding to
//! `small.txt`, and as written by format v2 (`small-v2.vramtrace`, columnar frames) to
//! `small-v2.txt`, as written by format v3 (`small-v3.vramtrace`) to `small-v3.txt` and by
//! format v4 (`small-v4.vramtrace`) to `small-v4.txt`; as written by today's writer
//! (`small-v5.vramtrace`) it must decode to `small-v5.txt` and today's writer must still
//! produce it byte for byte. The records that fixture predates (tags 19-25: PyTorch allocator
//! events, Python stacks, pool statistics) are in a second fixture: as format v3 wrote it
//! (`TorchDelta` records), `tensors-v3.vramtrace` / `.txt`, and as format v4 wrote it
//! (`TorchRun` records, with a frame of repeating steps that exercises every form of their
//! events), `tensors-v4.vramtrace` / `.txt`, both frozen; as today's writer writes it (the v4
//! fixture, then frames of chained contexts: `Context` records that name a model slot, whose
//! model continues across frames and starts afresh), `tensors-v5.vramtrace` / `.txt`, held to
//! the same rules as `small-v5`. Regenerate the v5 files deliberately with `VRAMSHIM_BLESS=1
//! cargo test -p vramshim-trace --test golden` (a format change also needs a new
//! FORMAT_VERSION and docs/trace-format.md). The v1 to v4 files are frozen: no writer produces
//! them any more.

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;

use common::*;
use vramshim_trace::codec::{tag, torch_head};
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
fn golden_v3_still_decodes() {
    let bin = dir().join("small-v3.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("small-v3.txt")).unwrap();
    assert_eq!(dump(&bin), want_txt, "decoding the v3 golden file changed");
}

#[test]
fn golden_v4_still_decodes() {
    let bin = dir().join("small-v4.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("small-v4.txt")).unwrap();
    assert_eq!(dump(&bin), want_txt, "decoding the v4 golden file changed");
}

#[test]
fn golden_small_trace() {
    let (_, _, bytes) = small_trace();
    let bin = dir().join("small-v5.vramtrace");
    let txt = dir().join("small-v5.txt");
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
        ("small-v4.vramtrace", 4),
        ("small-v5.vramtrace", 5),
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
fn golden_v2_to_v5_have_columnar_and_row_frames() {
    for f in [
        "small-v2.vramtrace",
        "small-v3.vramtrace",
        "small-v4.vramtrace",
        "small-v5.vramtrace",
    ] {
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
    assert_eq!(&b[14..22], &[5, 0, 0, 0, 8, 0, 0, 0]);
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

/// The records the small fixture predates (tags 19 to 24), in three frames: a failed call and
/// Python code and stacks (columnar); PyTorch allocator events in every `TorchDelta` form (the
/// segment as one of the three most recent or a new one, the action escaped, the thread,
/// device and stream changed, offsets and sizes in granules and not, a stack or none) and the
/// `Torch` record written for what a `TorchDelta` cannot hold, among MemOps that share the
/// thread state (columnar); the pool's statistics (rows). Returns the frames' events.
fn tensor_frames() -> Vec<Vec<Event>> {
    let t0 = 5_000_001_000u64;
    let mut first = sample_prelude();
    first.push(Event::CallFailed {
        t_ns: t0,
        tid: 7,
        device: 0,
        name: "cuCtxCreate_v2".into(),
        result: 2,
    });
    first.push(Event::PyCode {
        id: 1,
        file: "train.py".into(),
        function: "Model.forward".into(),
        first_line: 40,
    });
    first.push(Event::PyCode {
        id: 2,
        file: "train.py".into(),
        function: "<module>".into(),
        first_line: 1,
    });
    first.push(Event::PyStack {
        id: 1,
        frames: vec![PyFrame { code: 1, line: 42 }, PyFrame { code: 2, line: 90 }],
    });
    let torch = |t_ns: u64, action: u8, addr: u64, size: u64, segment: u64, stack: u32| {
        torch_event(t_ns, 7, action, addr, size, segment, stack)
    };
    let seg = [
        0x7f10_0000_0000u64,
        0x7f10_0400_0000,
        0x7f10_0800_0000,
        0x7f10_0c00_0000,
    ];
    let mut t = t0 + 100;
    let mut next = |dt: u64| {
        t += dt;
        t
    };
    let mut ev = Vec::new();
    // Segments 0, 1 and 2 made (each new to the state), blocks carved out of each.
    for &s in &seg[..3] {
        ev.push(torch(
            next(50),
            torch_action::SEGMENT_ALLOC,
            s,
            20 << 20,
            s,
            0,
        ));
    }
    for i in 0..6u64 {
        let s = seg[(i % 3) as usize];
        ev.push(torch(
            next(30),
            torch_action::ALLOC,
            s + (i << 20),
            512 << i,
            s,
            1,
        ));
    }
    // An allocation the interposer saw among them on another thread (the thread state is
    // shared with MemOps).
    ev.push(Event::Alloc(op(
        next(10),
        8,
        Api::CudaMalloc,
        0x7f20_0000_0000,
        2 << 20,
    )));
    // Back on thread 7: the most recent segment, then the third most recent.
    ev.push(torch(
        next(600),
        torch_action::FREE_COMPLETED,
        seg[2] + (5 << 20),
        512 << 5,
        seg[2],
        0,
    ));
    ev.push(torch(
        next(20),
        torch_action::FREE_COMPLETED,
        seg[0] + (3 << 20),
        512 << 3,
        seg[0],
        0,
    ));
    // A fourth segment, an escaped action.
    ev.push(torch(
        next(20),
        torch_action::SEGMENT_MAP,
        seg[3],
        2 << 20,
        seg[3],
        0,
    ));
    ev.push(torch(next(20), 9, seg[3], 0, seg[3], 0));
    // The second most recent segment.
    ev.push(torch(
        next(20),
        torch_action::FREE_COMPLETED,
        seg[0],
        512,
        seg[0],
        0,
    ));
    // A segment out of the three recent ones, below the most recent (a negative delta); an
    // offset and a size that are not whole granules.
    ev.push(torch(
        next(20),
        torch_action::ALLOC,
        seg[1] + 100,
        100,
        seg[1],
        1,
    ));
    // Another thread, device and stream.
    ev.push(Event::Torch(TorchOp {
        t_ns: next(20),
        tid: 9,
        action: torch_action::ALLOC,
        device: 1,
        addr: seg[2] + (8 << 20),
        size: 1 << 20,
        stream: 0xdead_beef,
        segment: seg[2],
        stack: 0,
    }));
    // An offset a `TorchDelta` cannot hold: a `Torch` record.
    ev.push(torch(
        next(20),
        torch_action::ALLOC,
        seg[0].wrapping_add((1 << 62) + 3),
        256,
        seg[0],
        0,
    ));
    // PyTorch's out-of-memory event: no segment, the free bytes as the address.
    ev.push(torch(next(20), torch_action::OOM, 123 << 20, 1 << 40, 0, 1));
    ev.push(Event::Free(op(
        next(100),
        8,
        Api::CudaFree,
        0x7f20_0000_0000,
        2 << 20,
    )));
    let last = vec![
        Event::PoolStats {
            t_ns: next(100),
            device: 0,
            reserved: 64 << 20,
            live: 40 << 20,
            cached: 8 << 20,
            pending: 2 << 20,
            budget: 66 << 20,
            releases: 3,
        },
        Event::ThreadExit {
            t_ns: next(100),
            tid: 7,
        },
    ];
    vec![first, ev, last]
}

/// The tensor fixture as format v4 holds it: the v3 fixture's frames, then a frame of three
/// repeating training steps on two threads' contexts (predicted events, places found in the
/// rings, every time form; `run_frame`).
fn tensor_frames_v4() -> Vec<Vec<Event>> {
    let mut f = tensor_frames();
    f.insert(f.len() - 1, run_frame());
    f
}

/// Three steps of a training loop: each allocates blocks of a repeating sequence of sizes
/// (with stacks), frees them in another order and allocates some again at the addresses it
/// freed; the gaps take one to three bytes and, once, a varint (a gap past 2^24 ns, then one
/// going backward); a second thread's events in between.
fn run_frame() -> Vec<Event> {
    let seg = 0x7f10_0000_0000u64;
    let mut t = 9_000_000_000u64;
    let mut ev = Vec::new();
    let torch = |t: u64, tid: u32, action: u8, addr: u64, size: u64, stack: u32| {
        torch_event(t, tid, action, addr, size, seg, stack)
    };
    for step in 0..3u64 {
        let base = seg + step * 0x10_0000;
        for i in 0..6u64 {
            t += [40, 700, 90_000, 3_000][(i % 4) as usize];
            ev.push(torch(
                t,
                11,
                0,
                base + i * 0x4000,
                512 << i,
                1 + i as u32 % 2,
            ));
        }
        for i in [3u64, 1, 5, 0] {
            t += 200;
            ev.push(torch(t, 11, 2, base + i * 0x4000, 512 << i, 0));
        }
        for i in [0u64, 5] {
            t += 300;
            ev.push(torch(t, 11, 0, base + i * 0x4000, 512 << i, 3));
        }
        t += 2_000;
        ev.push(torch(t, 12, 0, base + 0x8_0000, 1 << 20, 0));
        t += 100;
        ev.push(torch(t, 11, 2, base + 0x4000 * 2, 512 << 2, 0));
    }
    t += 1 << 25;
    ev.push(torch(t, 11, 0, seg + 0x40_0000, 256, 0));
    ev.push(torch(t - 10, 11, 2, seg + 0x40_0000, 256, 0));
    // Blocks of another segment, then of this one again (the second most recent), twice.
    let other = seg + (64 << 20);
    for i in 0..2u64 {
        t += 50;
        let mut e = torch(t, 11, 0, other + 512 * i, 512, 0);
        if let Event::Torch(op) = &mut e {
            op.segment = other;
        }
        ev.push(e);
        t += 50;
        ev.push(torch(t, 11, 0, seg + 0x50_0000 + 512 * i, 512, 0));
    }
    ev
}

/// The tensor fixture written: columnar frames, then rows; for format v5, the frames of
/// chained contexts (`chained_frames`) before the last one.
fn tensor_trace() -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_header()).unwrap();
    let frames = tensor_frames_v4();
    for (i, f) in frames.iter().enumerate() {
        w.set_layout(if i + 1 < frames.len() {
            FrameLayout::Columnar
        } else {
            FrameLayout::Rows
        });
        if i + 1 == frames.len() {
            write_chained(&mut w, &chained_frames());
            w.set_layout(FrameLayout::Rows);
        }
        for e in f {
            w.write(e).unwrap();
        }
        w.flush_frame().unwrap();
    }
    w.finish().unwrap()
}

/// The events of the tensor fixture as format v5 holds them.
fn tensor_events_v5() -> Vec<Event> {
    let mut f = tensor_frames_v4();
    let last = f.pop().unwrap_or_default();
    let mut ev: Vec<Event> = f.concat();
    for frame in chained_frames() {
        for (_, c) in frame {
            ev.extend(c);
        }
    }
    ev.extend(last);
    ev
}

/// Frames of chained contexts (format v5), as the interposer's writer makes them: each a list
/// of (thread, its buffer's events). Thread 11's model continues across frames through 17
/// contexts (the 17th starts afresh: `FRESH_CONTEXTS`), thread 12's through 3, interleaved
/// with a plain context (the writer's own records) and MemOps; the frames alternate layouts.
fn chained_frames() -> Vec<Vec<(u32, Vec<Event>)>> {
    let all = run_frame();
    let steps: Vec<Vec<Event>> = all.chunks(7).map(<[Event]>::to_vec).collect();
    let mut frames = Vec::new();
    let mut k = 0;
    for f in 0..6 {
        let mut frame = Vec::new();
        for _ in 0..3 {
            let ev: Vec<Event> = steps[k % steps.len()]
                .iter()
                .map(|e| match e {
                    Event::Torch(op) => Event::Torch(TorchOp { tid: 11, ..*op }),
                    e => e.clone(),
                })
                .collect();
            frame.push((11, ev));
            k += 1;
        }
        if f < 3 {
            let mut ev = vec![torch_event(
                9_500_000_000 + f as u64,
                12,
                0,
                0x7f20_0000_0000 + 512 * f as u64,
                512,
                0x7f20_0000_0000,
                4,
            )];
            ev.push(Event::Alloc(op(
                9_500_000_100 + f as u64,
                12,
                Api::CudaMalloc,
                0x7f30_0000_0000,
                4096,
            )));
            frame.push((12, ev));
        }
        frames.push(frame);
    }
    frames
}

/// `frames` (of `chained_frames`) written through `w`: each buffer encoded as one chained
/// context, a plain context of the writer's own records among them.
fn write_chained(w: &mut TraceWriter<Vec<u8>>, frames: &[Vec<(u32, Vec<Event>)>]) {
    let mut enc = RecordEncoder::new();
    for (i, frame) in frames.iter().enumerate() {
        w.set_layout(if i % 2 == 0 {
            FrameLayout::Columnar
        } else {
            FrameLayout::Rows
        });
        for (tid, ev) in frame {
            enc.clear();
            enc.context_chained(*tid);
            for e in ev {
                enc.push(e);
            }
            w.write_encoded(&enc).unwrap();
        }
        w.flush_frame().unwrap();
    }
}

/// The tensor fixture as format v4 wrote it still decodes: to its text and to the fixture's
/// events.
#[test]
fn golden_tensor_v4_still_decodes() {
    let bin = dir().join("tensors-v4.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("tensors-v4.txt")).unwrap();
    assert_eq!(
        dump(&bin),
        want_txt,
        "decoding the v4 tensor golden file changed"
    );
    let (h, got, errs, trunc) = read_all(&std::fs::read(&bin).unwrap()).unwrap();
    assert_eq!(h.format_version, 4);
    assert_eq!(got, tensor_frames_v4().concat());
    assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
}

/// The tensor fixture as format v3 wrote it (`TorchDelta` records) still decodes: to its text
/// and to the fixture's events.
#[test]
fn golden_tensor_v3_still_decodes() {
    let bin = dir().join("tensors-v3.vramtrace");
    let want_txt = std::fs::read_to_string(dir().join("tensors-v3.txt")).unwrap();
    assert_eq!(
        dump(&bin),
        want_txt,
        "decoding the v3 tensor golden file changed"
    );
    let (h, got, errs, trunc) = read_all(&std::fs::read(&bin).unwrap()).unwrap();
    assert_eq!(h.format_version, 3);
    assert_eq!(got, tensor_frames().concat());
    assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
}

/// Today's writer produces `tensors-v5.vramtrace` byte for byte (so a change to the
/// `TorchRun` coding, or to another record the small fixture lacks, cannot pass
/// unnoticed); it decodes to `tensors-v5.txt` and to the fixture's events. Regenerate it
/// deliberately with `VRAMSHIM_BLESS=1` (see the top of this file).
#[test]
fn golden_tensor_trace() {
    let bytes = tensor_trace();
    let bin = dir().join("tensors-v5.vramtrace");
    let txt = dir().join("tensors-v5.txt");
    if std::env::var_os("VRAMSHIM_BLESS").is_some() {
        std::fs::write(&bin, &bytes).unwrap();
        std::fs::write(&txt, dump(&bin)).unwrap();
    }
    let want_txt = std::fs::read_to_string(&txt).unwrap();
    assert_eq!(
        dump(&bin),
        want_txt,
        "decoding the tensor golden file changed"
    );
    let golden = std::fs::read(&bin).unwrap();
    let (h, got, errs, trunc) = read_all(&golden).unwrap();
    assert_eq!(h, sample_header());
    assert_eq!(got, tensor_events_v5(), "the tensor golden file's events");
    assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
    assert!(
        golden.windows(4).any(|w| w == b"VRFC") && golden.windows(4).any(|w| w == b"VRFR"),
        "both frame layouts"
    );
    assert_eq!(
        golden, bytes,
        "the writer no longer produces the tensor golden bytes"
    );
}

/// The tensor fixture's frames of PyTorch events, as the writer's encoder makes their
/// records (one context per frame, as a frame's records begin with a `Context`), hold every
/// form of a `TorchRun` event they mean to pin: predicted and explicit, a place found in the
/// ring and an explicit one in each recent segment or a new one, every time form, a changed
/// thread, device and stream, a stack, an escaped action; and a `Torch` record for what a
/// `TorchRun` cannot hold, among MemOps.
#[test]
fn tensor_fixture_holds_every_torch_record_form() {
    let frames = tensor_frames_v4();
    let (mut ctrls, mut heads, mut tags) = (Vec::new(), Vec::new(), Vec::new());
    for frame in [&frames[1], &frames[2]] {
        let mut enc = RecordEncoder::new();
        enc.begin(0);
        for e in frame {
            enc.push(e);
        }
        let b = enc.bytes();
        let mut at = 0;
        // The runs' events of the context, in order (its model runs on through them).
        let mut runs = Vec::new();
        while at < b.len() {
            let t = b[at];
            tags.push(t);
            if t == tag::TORCH_RUN {
                let len = b[at + 1] as usize & 0x7f
                    | (b[at + 2] as usize & 0x7f) << 7
                    | (b[at + 3] as usize) << 14;
                runs.extend_from_slice(&b[at + 4..at + 4 + len]);
                at += 4 + len;
            } else {
                let len = b[at + 1] as usize;
                assert!(len < 0x80);
                at += 2 + len;
            }
        }
        ctrls.extend(run_controls(&runs, &mut heads));
    }
    let explicit = |c: &u8| c & 0x04 != 0;
    assert!(ctrls.iter().any(explicit) && !ctrls.iter().all(explicit));
    for tf in 0..4u8 {
        assert!(ctrls.iter().any(|c| c & 3 == tf), "no time form {tf}");
    }
    assert!(ctrls.iter().any(|c| c >> 3 < 28), "no place from a ring");
    for k in 0..4u8 {
        assert!(
            ctrls.iter().any(|c| c >> 3 == 28 + k),
            "no explicit place in recent segment {k}"
        );
    }
    for (bit, what) in [
        (torch_head::TID, "thread"),
        (torch_head::PLACE, "device and stream"),
        (torch_head::STACK, "stack"),
    ] {
        assert!(heads.iter().any(|h| h & bit != 0), "no event with a {what}");
        assert!(
            heads.iter().any(|h| h & bit == 0),
            "every event with a {what}"
        );
    }
    assert!(
        heads
            .iter()
            .any(|h| h & torch_head::ACTION_ESCAPE == torch_head::ACTION_ESCAPE),
        "no event with an escaped action"
    );
    for t in [tag::TORCH, tag::ALLOC, tag::FREE_REF, tag::TORCH_RUN] {
        assert!(tags.contains(&t), "no record with tag {t}: {tags:?}");
    }
}

/// The control bytes (and the head bytes of explicit events) of a context's run events.
fn run_controls(run: &[u8], heads: &mut Vec<u8>) -> Vec<u8> {
    vramshim_trace::codec::torch_run_layout(run)
        .expect("the run decodes")
        .into_iter()
        .map(|(ctrl, head)| {
            if let Some(h) = head {
                heads.push(h);
            }
            ctrl
        })
        .collect()
}

/// The chained frames of the v5 fixture hold what they mean to pin: thread 11's contexts
/// continue its model (counts 0 to 16, in slot 0) and the 17th starts afresh; thread 12's
/// take slot 1; and thread 11's continued contexts predict events (explicit bit clear) that a
/// fresh model could not.
#[test]
fn chained_fixture_continues_and_starts_afresh() {
    let mut enc = RecordEncoder::new();
    let mut chains = Vec::new();
    for frame in chained_frames() {
        for (tid, ev) in frame {
            enc.clear();
            enc.context_chained(tid);
            let b = enc.bytes();
            assert_eq!(b[0], tag::CONTEXT);
            // tag, len, tid (one byte), chain varint
            let (mut v, mut sh, mut p) = (0u64, 0, 3);
            loop {
                v |= ((b[p] & 0x7f) as u64) << sh;
                sh += 7;
                p += 1;
                if b[p - 1] & 0x80 == 0 {
                    break;
                }
            }
            chains.push((tid, v >> 7, (v >> 1) & 63, v & 1));
            for e in &ev {
                enc.push(e);
            }
        }
    }
    let t11: Vec<_> = chains.iter().filter(|c| c.0 == 11).collect();
    assert_eq!(t11.len(), 18);
    for (i, c) in t11.iter().enumerate() {
        assert_eq!((c.1, c.2), (i as u64, 0), "thread 11's count and slot");
        let fresh = i == 0 || i == vramshim_trace::codec::FRESH_CONTEXTS as usize;
        assert_eq!(
            c.3 == 1,
            fresh,
            "context {i} of thread 11 starts afresh or not"
        );
    }
    let t12: Vec<_> = chains.iter().filter(|c| c.0 == 12).collect();
    assert_eq!(
        t12.iter().map(|c| (c.1, c.2, c.3)).collect::<Vec<_>>(),
        [(0, 1, 1), (1, 1, 0), (2, 1, 0)]
    );
}
