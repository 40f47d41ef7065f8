//! `TorchRun` records (format v4, tag 25): PyTorch allocator events coded against a model of
//! the context's earlier events, their payloads stored in a columnar frame's torch stream.
//! A real GPT-2 run's events come back exactly, however they are cut into buffers and
//! frames and in every layout; they take fewer bytes than the v3 records zstd compressed;
//! and a damaged run is a corrupt record (the rest of its frame skipped), never a panic, a
//! hang or a wrong event taken for a right one where the model has nothing to refer to.

mod common;

use std::path::PathBuf;

use common::frames::{buffers_trace, records_trace};
use common::read_all;
use proptest::prelude::*;
use vramshim_trace::codec::tag;
use vramshim_trace::*;

fn gpt2_events() -> Vec<Event> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/data/gpt2-tensors.vramtrace");
    let r = TraceReader::open(p).unwrap();
    let ev: Vec<Event> = r.map(|e| e.unwrap()).collect();
    assert!(ev.len() > 5000);
    ev
}

/// Every event of a GPT-2 run comes back, in order, field for field: buffers of 1 to 1024
/// events, frames of 30 to 5000, every layout (row frames keep the runs inline, columnar ones
/// in the torch stream), read event by event and frame by frame.
#[test]
fn gpt2_events_round_trip() {
    let ev = gpt2_events();
    for (per_buf, per_frame) in [(1024, 2000), (7, 30), (1024, 430), (300, 5000), (1, 64)] {
        for layout in [FrameLayout::Auto, FrameLayout::Rows, FrameLayout::Columnar] {
            let bytes = buffers_trace(&ev, layout, per_buf, per_frame, None);
            let (h, got, errs, trunc) = read_all(&bytes).unwrap();
            assert_eq!(h.format_version, FORMAT_VERSION);
            assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
            assert_eq!(got.len(), ev.len());
            for (i, (a, b)) in got.iter().zip(&ev).enumerate() {
                assert_eq!(a, b, "event {i}, {layout:?}, {per_buf}/{per_frame}");
            }
            // The visitor sees the same events (any error fails).
            let visited = common::visit_all(&bytes, false);
            assert!(
                visited == ev,
                "visit_frame, {layout:?}, {per_buf}/{per_frame}"
            );
        }
    }
}

/// The coder's own bytes: a GPT-2 run's PyTorch events take under 6 bytes each as `TorchRun`
/// payloads in the writer thread's buffers (1024 events, one thread each), where a
/// `TorchDelta` record took ~12 before zstd; and the file of the whole trace in 2000-event
/// frames is smaller than format v3's 6.97 bytes an event.
#[test]
fn gpt2_events_are_small() {
    let ev = gpt2_events();
    let torch: Vec<&Event> = ev.iter().filter(|e| matches!(e, Event::Torch(_))).collect();
    let mut by_tid: std::collections::BTreeMap<u32, Vec<&Event>> = Default::default();
    for e in &torch {
        if let Event::Torch(op) = e {
            by_tid.entry(op.tid).or_default().push(e);
        }
    }
    let (mut payload, mut n) = (0usize, 0usize);
    for evs in by_tid.values() {
        for chunk in evs.chunks(1024) {
            let mut enc = RecordEncoder::new();
            enc.begin(0);
            for e in chunk {
                enc.push(e);
            }
            payload += enc.torch_bytes();
            n += chunk.len();
        }
    }
    let per = payload as f64 / n as f64;
    assert!(per < 6.0, "{per:.2} bytes an event");
    let bytes = buffers_trace(&ev, FrameLayout::Auto, 1024, 2000, None);
    let per = bytes.len() as f64 / ev.len() as f64;
    assert!(per < 6.97, "{per:.2} file bytes an event");
}

/// A run's first record in a frame, found in row frames of a small trace of one context.
fn run_trace() -> (Vec<u8>, Vec<Event>) {
    let ev: Vec<Event> = gpt2_events()
        .into_iter()
        .filter(|e| matches!(e, Event::Torch(op) if op.tid == 28283))
        .take(600)
        .collect();
    (buffers_trace(&ev, FrameLayout::Rows, 600, 600, None), ev)
}

/// Where the `TorchRun` record's payload starts in the raw records of `bytes` (one row
/// frame): returns the records and the payload's range.
fn run_records(ev: &[Event]) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut enc = RecordEncoder::new();
    enc.begin(28283);
    for e in ev {
        enc.push(e);
    }
    let b = enc.bytes().to_vec();
    // Context record (tag, length, tid), then the run: tag, 3 length bytes.
    let at = 2 + b[1] as usize;
    assert_eq!(b[at], tag::TORCH_RUN);
    let len = (b[at + 1] & 0x7f) as usize
        | ((b[at + 2] & 0x7f) as usize) << 7
        | (b[at + 3] as usize) << 14;
    assert_eq!(at + 4 + len, b.len(), "one run");
    (b, at + 4..at + 4 + len)
}

/// `records` as one frame, the end record in a frame of its own: nothing follows the run in
/// its frame.
fn frame_of(records: &[u8], layout: FrameLayout) -> Vec<u8> {
    records_trace(records, layout, true).unwrap()
}

/// A run whose length says more than its frame (or the torch stream) holds, or whose last
/// event is cut short: a corrupt record; the events before the damage come back unchanged,
/// and nothing after it in the frame is made up.
#[test]
fn cut_runs_are_corrupt_records() {
    let (_, ev) = run_trace();
    let (recs, run) = run_records(&ev);
    for cut in [1usize, 2, 3, 10, 100, run.len() / 2, run.len() - 1] {
        for keep_len in [false, true] {
            let mut r = recs.clone();
            r.truncate(run.end - cut);
            if keep_len {
                // The length says what is there: the cut falls inside an event (or between
                // two: then fewer events come back, and no error).
                let n = run.len() - cut;
                let h = run.start - 3;
                r[h] = n as u8 | 0x80;
                r[h + 1] = (n >> 7) as u8 | 0x80;
                r[h + 2] = (n >> 14) as u8;
            }
            for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
                let (_, got, errs, _) = read_all(&frame_of(&r, layout)).unwrap();
                assert!(errs.len() <= 1, "cut {cut}, {layout:?}: {errs:?}");
                assert!(keep_len || errs.len() == 1, "cut {cut}, {layout:?}");
                if let Some(e) = errs.first() {
                    assert!(matches!(e.kind, DecodeErrorKind::CorruptRecord(_)), "{e}");
                }
                assert!(got.len() < ev.len(), "cut {cut}, {layout:?}");
                assert_eq!(got[..], ev[..got.len()], "cut {cut}, {layout:?}");
            }
        }
    }
}

/// References the model cannot resolve are corrupt records, not events: a place in a ring
/// that holds nothing yet, a prediction where nothing was learnt, reserved head bits.
#[test]
fn unresolvable_references_are_corrupt_records() {
    // Context tid 5, then a run of one event: control byte, [head], time.
    let cases: [(&[u8], &str); 3] = [
        // Explicit (action 0, size 1 granule), place: entry 3 of the still empty free ring.
        (&[0x04 | 3 << 3, 0x00, 0x02, 0x10], "ring reference"),
        // Predicted, at the context's first event.
        (&[28 << 3, 0x00, 0x10], "predicted where nothing was learnt"),
        // Explicit, with bit 3 of the head byte (reserved) set.
        (&[0x04 | 28 << 3, 0x08, 0x02, 0x00, 0x10], "event head"),
    ];
    for (ev, what) in cases {
        let mut recs = vec![tag::CONTEXT, 1, 5, tag::TORCH_RUN, ev.len() as u8];
        recs.extend_from_slice(ev);
        for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
            let (_, got, errs, _) = read_all(&frame_of(&recs, layout)).unwrap();
            assert!(got.is_empty(), "{what}: {got:?}");
            assert_eq!(errs.len(), 1, "{what}");
            assert!(errs[0].to_string().contains(what), "{what}: {}", errs[0]);
        }
    }
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(300))]

    /// Random damage to a run's bytes (in a row frame and in the torch stream of a columnar
    /// frame): the reader ends, never panics, and at most reports the frame's rest corrupt.
    #[test]
    fn damaged_runs_never_panic(flips in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8)) {
        let (_, ev) = run_trace();
        let (mut recs, run) = run_records(&ev);
        for (at, x) in flips {
            let i = run.start + at as usize % run.len();
            recs[i] ^= x | 1;
        }
        for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
            let (_, got, errs, _) = read_all(&frame_of(&recs, layout)).unwrap();
            prop_assert!(errs.len() <= 1);
            prop_assert!(got.len() <= ev.len() * 2);
        }
    }

    /// Random bytes as a run's payload: no panic, bounded output.
    #[test]
    fn random_runs_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..3000)) {
        let mut recs = vec![tag::CONTEXT, 1, 5, tag::TORCH_RUN];
        let n = payload.len();
        recs.extend_from_slice(&[(n as u8) | 0x80, ((n >> 7) as u8) | 0x80, (n >> 14) as u8]);
        recs.extend_from_slice(&payload);
        for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
            let (_, got, errs, _) = read_all(&frame_of(&recs, layout)).unwrap();
            prop_assert!(errs.len() <= 1);
            // Every event takes at least two bytes (control byte, time).
            prop_assert!(got.len() <= n / 2);
        }
    }
}

/// An encoder that never wrote a `Context` (a new one, or one cleared or taken from) still
/// opens a `TorchRun` record for its first PyTorch event: the run's header is written, not
/// its length laid over the event's bytes, and the events come back.
#[test]
fn first_run_of_an_encoder_without_context_has_its_header() {
    let ev: Vec<Event> = gpt2_events()
        .into_iter()
        .filter(|e| matches!(e, Event::Torch(op) if op.tid == 28283))
        .take(50)
        .collect();
    let check = |enc: &mut RecordEncoder, what: &str| {
        for e in &ev {
            enc.push(e);
        }
        let b = enc.bytes().to_vec();
        assert_eq!(b[0], tag::TORCH_RUN, "{what}: the run's tag comes first");
        let mut records = Vec::new();
        let mut ctx = RecordEncoder::new();
        ctx.begin(0);
        records.extend_from_slice(ctx.bytes());
        records.extend_from_slice(&b);
        let (_, got, errs, _) = read_all(&frame_of(&records, FrameLayout::Rows)).unwrap();
        assert!(errs.is_empty(), "{what}: {errs:?}");
        let got: Vec<Event> = got
            .into_iter()
            .filter(|e| matches!(e, Event::Torch(_)))
            .collect();
        assert_eq!(got, ev, "{what}");
    };
    check(&mut RecordEncoder::new(), "new encoder");
    let mut enc = RecordEncoder::new();
    enc.begin(28283);
    enc.push(&ev[0]);
    enc.clear();
    check(&mut enc, "cleared encoder");
    let mut enc = RecordEncoder::new();
    enc.begin(28283);
    enc.push(&ev[0]);
    let _ = enc.take();
    enc.clear();
    check(&mut enc, "taken, then cleared");
}

/// Tag 25 is a `TorchRun` only in format 4 and later: a row frame of a version 1, 2 or 3 file
/// that holds one (its writer never wrote one: damage, or a v4 frame spliced into an older
/// file) reads as a corrupt record, its events not decoded with v4's rules; a columnar frame
/// with a torch stream is a corrupt frame there (10 streams where 9 are expected). The same
/// bytes read as version 4 give the events back.
#[test]
fn torch_runs_in_older_versions_are_corrupt_records() {
    let (_, ev) = run_trace();
    let (recs, _) = run_records(&ev);
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let bytes = frame_of(&recs, layout);
        let (_, got, errs, _) = read_all(&bytes).unwrap();
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(got, ev);
        // (Columnar frames are format 2 and later: a version 1 reader does not take them.)
        let first = if layout == FrameLayout::Columnar {
            2
        } else {
            1
        };
        for v in first..4u32 {
            let mut old = bytes.clone();
            old[14..18].copy_from_slice(&v.to_le_bytes());
            let (h, got, errs, _) = read_all(&old).unwrap();
            assert_eq!(h.format_version, v);
            assert!(
                got.is_empty(),
                "version {v}, {layout:?}: {} events",
                got.len()
            );
            let e = errs.first().expect("an error");
            match layout {
                FrameLayout::Rows => {
                    assert_eq!(errs.len(), 1, "version {v}: {errs:?}");
                    assert!(
                        matches!(e.kind, DecodeErrorKind::CorruptRecord(_))
                            && e.to_string().contains("tag 25"),
                        "version {v}: {e}"
                    );
                }
                _ => assert!(
                    matches!(e.kind, DecodeErrorKind::CorruptFrame(_)),
                    "version {v}: {e}"
                ),
            }
        }
    }
}

/// `push_torch_all` (the writer thread's call for a row of a thread's `Torch` entries) writes
/// the bytes that `push_torch` of each event writes, with the same statistics: in rows of
/// every length, cut anywhere, with events no `TorchRun` holds (a `Torch` record between two
/// runs) among them, after other records, and across the run's length limit (2^21 bytes).
#[test]
fn push_torch_all_writes_what_push_torch_writes() {
    let ev: Vec<TorchOp> = gpt2_events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Torch(op) => Some(op),
            _ => None,
        })
        .collect();
    let odd = |op: &TorchOp| TorchOp {
        size: u64::MAX - 3,
        ..op.clone()
    };
    // The events, with a few no run holds; then as many again, to pass 2^21 bytes of runs.
    let mut all: Vec<TorchOp> = Vec::new();
    for (i, op) in ev.iter().enumerate() {
        all.push(op.clone());
        if i % 997 == 5 {
            all.push(odd(op));
        }
    }
    let one = |ops: &[TorchOp], rows: &[usize], sync_every: usize| {
        let mut a = RecordEncoder::new();
        let mut b = RecordEncoder::new();
        a.begin(7);
        b.begin(7);
        let mut at = 0;
        for (k, &n) in rows.iter().cycle().enumerate() {
            if at >= ops.len() {
                break;
            }
            let row = &ops[at..(at + n).min(ops.len())];
            for op in row {
                a.push_torch(op);
            }
            b.push_torch_all(row);
            if k % sync_every == sync_every - 1 {
                // Another record between rows: the next row opens a new run.
                let s = Event::Sync {
                    t_ns: row[0].t_ns,
                    tid: 7,
                    device: 0,
                    kind: SyncKind::ProcessDevice,
                    stream: 0,
                    latency_ns: 10,
                };
                a.push(&s);
                b.push(&s);
            }
            at += row.len();
        }
        assert_eq!(a.bytes(), b.bytes(), "rows {rows:?}");
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(
            (sa.records, sa.t_min, sa.t_max, a.torch_bytes()),
            (sb.records, sb.t_min, sb.t_max, b.torch_bytes())
        );
        a.bytes().len()
    };
    for rows in [&[1usize][..], &[2, 3], &[7, 1, 64], &[1000], &[100_000]] {
        one(&all, rows, 5);
    }
    // One run of more than 2^21 bytes' worth of events (no other record, no odd event): the
    // run is closed and a new one opened at the limit, by both.
    let mut long = Vec::new();
    while long.len() < 600_000 {
        long.extend_from_slice(&ev);
    }
    assert!(one(&long, &[100_000, 3], usize::MAX) > 1 << 21);
}

/// A ring reference names a place, address and segment: an address that comes back in
/// another segment (PyTorch gave the segment back and the driver mapped the range again)
/// is not named by the ring entry of its old segment. The encoder finds places through an
/// index of its own, not through the decoder's rings; the index compares both.
#[test]
fn an_address_in_another_segment_is_not_its_old_place() {
    let t = |i: u64, action: u8, seg: u64| {
        Event::Torch(TorchOp {
            t_ns: 1_000 + i * 100,
            tid: 7,
            action,
            device: 0,
            addr: 0x7000_0000_1000,
            size: 4096,
            stream: 0,
            segment: seg,
            stack: 3,
        })
    };
    let (s1, s2) = (0x7000_0000_0000, 0x7000_0000_0800);
    let mut ev = Vec::new();
    for round in 0..4u64 {
        let seg = if round % 2 == 0 { s1 } else { s2 };
        // Allocated, freed, allocated again at the same address: the last two are found in
        // the rings when the segment is the same, and must not be when it changed.
        ev.push(t(round * 3, 0, seg));
        ev.push(t(round * 3 + 1, 2, seg));
    }
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let bytes = buffers_trace(&ev, layout, 64, 64, None);
        let (_, got, errs, trunc) = read_all(&bytes).unwrap();
        assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
        assert_eq!(got, ev, "{layout:?}");
    }
}

/// The records' time range (what a frame's index says it holds) is exactly the least and the
/// greatest time of the events coded, however the times go (up, back, equal, a jump), with
/// rows of any length, events no run holds among them and rows that need the buffer to grow.
/// (The coder takes a row's times in full only where they turn back.)
#[test]
fn push_torch_all_keeps_the_exact_time_range() {
    let mut rng = vramshim_testkit::XorShift(0x2545_f491_4f6c_dd1d);
    let mut rnd = move || rng.next_u64();
    for case in 0..200 {
        let n = 1 + (rnd() % 300) as usize;
        let mut t = 1_000_000 + rnd() % 1000;
        let ops: Vec<TorchOp> = (0..n)
            .map(|i| {
                t = match rnd() % 8 {
                    0 => t.saturating_sub(rnd() % 5000),
                    1 => t,
                    2 => t + (rnd() % (1 << 30)),
                    _ => t + rnd() % 3000,
                };
                TorchOp {
                    t_ns: t,
                    tid: 9,
                    action: (rnd() % 3) as u8,
                    device: 0,
                    addr: 0x7000_0000_0000 + (i as u64 % 16) * 4096,
                    // Now and then a size no run holds: a `Torch` record among the row.
                    size: if rnd() % 40 == 0 { u64::MAX - 1 } else { 4096 },
                    stream: 0,
                    segment: 0x7000_0000_0000,
                    stack: (rnd() % 4) as u32,
                }
            })
            .collect();
        let mut enc = RecordEncoder::new();
        enc.begin(9);
        let mut at = 0;
        while at < ops.len() {
            let k = (1 + rnd() % 70) as usize;
            let row = &ops[at..(at + k).min(ops.len())];
            assert_eq!(enc.push_torch_all(row), row.len());
            at += row.len();
        }
        let st = enc.stats();
        let lo = ops.iter().map(|o| o.t_ns).min().unwrap();
        let hi = ops.iter().map(|o| o.t_ns).max().unwrap();
        assert_eq!((st.t_min, st.t_max), (lo, hi), "case {case}");
        assert_eq!(st.records as usize, 1 + ops.len(), "case {case}");
    }
}

/// A place never pushed is never found, however the encoder indexes its rings: after one
/// allocation pushed its place, a free of the null place (address 0 in segment 0: the fields
/// an index entry holds before anything was put in it) in another index entry is coded
/// explicitly, not as the newest place of the ring. (Found by the `torch_run` fuzz target.)
#[test]
fn a_place_never_pushed_is_not_found_in_an_unused_index_entry() {
    let op = |tid: u32, action: u8, addr: u64, seg: u64| {
        Event::Torch(TorchOp {
            t_ns: 999_999,
            tid,
            action,
            device: 0,
            addr,
            size: 512,
            stream: 0,
            segment: seg,
            stack: 0,
        })
    };
    let seg = 0x7f00_0200_0000;
    let ev = vec![op(7, 0, seg, seg), op(8, 2, 0, 0)];
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        for per_frame in [1, usize::MAX] {
            let bytes = buffers_trace(&ev, layout, 115, per_frame, Some(7));
            let (_, got, errs, trunc) = read_all(&bytes).unwrap();
            assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
            assert_eq!(got, ev, "{layout:?}");
        }
    }
}
