//! Chained contexts (format v5): a thread's `TorchRun` model continues from its previous
//! buffer's, across frames, so that a reader must follow the chain in file order. Every event
//! comes back however the chains run (many threads, more than the model slots); a damaged
//! frame costs, beyond its own events, only the contexts that continue a chain it held, up to
//! that chain's next fresh start (never a wrong event: a continued model the reader does not
//! have is refused, not guessed); a file cut anywhere reads every whole frame before the cut.

mod common;

use std::path::PathBuf;

use common::frames::{buffers_trace, chained_trace};
use common::read_all;
use vramshim_trace::codec::{FRESH_CONTEXTS, MODEL_SLOTS};
use vramshim_trace::*;

fn gpt2_torch() -> Vec<TorchOp> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/data/gpt2-tensors.vramtrace");
    let r = TraceReader::open(p).unwrap();
    r.filter_map(|e| match e.unwrap() {
        Event::Torch(op) => Some(op),
        _ => None,
    })
    .collect()
}

/// A GPT-2 run's events as thread buffers: each thread's events in order, `per_buf` a
/// buffer, the threads' buffers interleaved (as the writer takes them tick by tick), a MemOp
/// among them now and then.
fn thread_buffers(per_buf: usize) -> Vec<(u32, Vec<Event>)> {
    let ops = gpt2_torch();
    let mut by_tid: std::collections::BTreeMap<u32, Vec<Event>> = Default::default();
    for op in &ops {
        by_tid
            .entry(op.tid)
            .or_default()
            .push(Event::Torch(op.clone()));
    }
    let mut per_thread: Vec<Vec<(u32, Vec<Event>)>> = by_tid
        .into_iter()
        .map(|(tid, ev)| {
            ev.chunks(per_buf)
                .enumerate()
                .map(|(i, c)| {
                    let mut c = c.to_vec();
                    if i % 3 == 1 {
                        let t = match &c[c.len() / 2] {
                            Event::Torch(op) => op.t_ns,
                            _ => 0,
                        };
                        c.insert(
                            c.len() / 2,
                            Event::Alloc(common::op(t, tid, Api::CudaMalloc, 0x7f00_0000, 4096)),
                        );
                    }
                    (tid, c)
                })
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    while per_thread.iter().any(|t| !t.is_empty()) {
        for t in &mut per_thread {
            if !t.is_empty() {
                out.push(t.remove(0));
            }
        }
    }
    out
}

/// Every event through the visitor, damaged frames passed over.
fn collect_visited(bytes: &[u8]) -> Vec<Event> {
    common::visit_all(bytes, true)
}

/// Every event comes back, in order, in both layouts and through both read paths, with
/// buffers of a few events (most of a chain's events then come after its first buffer); and
/// the chain is used: the file is smaller than with a fresh model in every buffer.
#[test]
fn chained_buffers_round_trip() {
    for per_buf in [40, 200, 1024] {
        let bufs = thread_buffers(per_buf);
        let want: Vec<Event> = bufs.iter().flat_map(|b| b.1.clone()).collect();
        for layout in [FrameLayout::Auto, FrameLayout::Rows, FrameLayout::Columnar] {
            let (bytes, info) = chained_trace(&bufs, layout, 3);
            assert!(info.iter().any(|i| !i.0), "some contexts continue a chain");
            let (h, got, errs, trunc) = read_all(&bytes).unwrap();
            assert_eq!(h.format_version, 5);
            assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
            assert!(got == want, "{per_buf} {layout:?}");
            assert!(
                collect_visited(&bytes) == want,
                "visit_frame {per_buf} {layout:?}"
            );
            if per_buf == 40 && layout == FrameLayout::Columnar {
                let mut plain = Vec::new();
                for (tid, ev) in &bufs {
                    plain.extend(ev.iter().cloned());
                    let _ = tid;
                }
                let fresh = buffers_trace(&plain, layout, per_buf, 3 * per_buf, None);
                assert!(
                    bytes.len() * 10 < fresh.len() * 9,
                    "chained {} bytes, fresh models {}",
                    bytes.len(),
                    fresh.len()
                );
            }
        }
    }
}

/// More threads than model slots: a thread that gets a slot another thread used starts it
/// afresh, and every event still comes back.
#[test]
fn more_threads_than_model_slots() {
    let ops = gpt2_torch();
    let mut bufs = Vec::new();
    for (i, c) in ops.chunks(25).enumerate() {
        let tid = 100 + (i % (MODEL_SLOTS + 9)) as u32;
        let ev: Vec<Event> = c
            .iter()
            .map(|op| Event::Torch(TorchOp { tid, ..op.clone() }))
            .collect();
        bufs.push((tid, ev));
    }
    let want: Vec<Event> = bufs.iter().flat_map(|b| b.1.clone()).collect();
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let (bytes, _) = chained_trace(&bufs, layout, 5);
        let (_, got, errs, trunc) = read_all(&bytes).unwrap();
        assert!(errs.is_empty() && trunc.is_none(), "{errs:?} {trunc:?}");
        assert!(got == want);
    }
}

/// The frames of `bytes` (offset, length), from the envelopes.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let mut p = 22 + hlen;
    let mut out = Vec::new();
    while p + 32 <= bytes.len() {
        let clen = u32::from_le_bytes(bytes[p + 4..p + 8].try_into().unwrap()) as usize;
        out.push((p, 32 + clen));
        p += 32 + clen;
    }
    out
}

/// A frame in the middle damaged (its data garbled: the frame fails its checksum and is
/// skipped): what comes back is exactly every event but that frame's and those of the
/// contexts that continue a chain it held, up to each chain's next fresh start; each such
/// context is one recoverable error; at most `FRESH_CONTEXTS - 1` contexts of a chain are
/// lost after the frame; everything else (the other threads' contexts in the same frames, the
/// MemOps of a skipped context before its first run) comes back. With the reader's check of
/// the chain's count removed, it continues from a model it does not have, and this fails.
#[test]
fn a_damaged_frame_costs_its_chains_up_to_their_fresh_start() {
    let bufs = thread_buffers(60);
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let per_frame = 2;
        let (bytes, info) = chained_trace(&bufs, layout, per_frame);
        let fr = frames(&bytes);
        for bad in [3, 11, fr.len() / 2] {
            let mut dmg = bytes.clone();
            let (off, len) = fr[bad];
            for b in &mut dmg[off + 48..off + len.min(200)] {
                *b ^= 0x5a;
            }
            // The expected events: per buffer, kept unless its frame is the damaged one or its
            // chain lost a context there and has not started afresh since.
            let mut broken: std::collections::HashSet<u32> = Default::default();
            let mut want = Vec::new();
            let mut skipped_contexts = 0;
            let mut lost_after: std::collections::HashMap<u32, usize> = Default::default();
            for ((tid, ev), &(fresh, frame)) in bufs.iter().zip(&info) {
                if frame == bad {
                    broken.insert(*tid);
                    continue;
                }
                if fresh {
                    broken.remove(tid);
                }
                if broken.contains(tid) {
                    skipped_contexts += 1;
                    *lost_after.entry(*tid).or_default() += 1;
                    // Its MemOps before the first `TorchRun` come back.
                    want.extend(
                        ev.iter()
                            .take_while(|e| !matches!(e, Event::Torch(_)))
                            .cloned(),
                    );
                    continue;
                }
                want.extend(ev.iter().cloned());
            }
            assert!(skipped_contexts > 0, "the damage must reach a later frame");
            assert!(lost_after.values().all(|&n| n < FRESH_CONTEXTS as usize));
            let (_, got, errs, trunc) = read_all(&dmg).unwrap();
            assert_eq!(trunc, None);
            let frame_errs = errs
                .iter()
                .filter(|e| matches!(e.kind, DecodeErrorKind::CorruptFrame(_)))
                .count();
            let model_errs = errs
                .iter()
                .filter(|e| {
                    matches!(&e.kind, DecodeErrorKind::CorruptRecord(m) if m.contains("not read whole"))
                })
                .count();
            assert_eq!(frame_errs, 1, "{errs:?}");
            assert_eq!(model_errs, skipped_contexts, "{layout:?} frame {bad}");
            assert_eq!(errs.len(), 1 + skipped_contexts, "{errs:?}");
            assert!(
                got == want,
                "{layout:?} frame {bad}: {} events, {} expected",
                got.len(),
                want.len()
            );
            assert!(
                collect_visited(&dmg) == want,
                "visit_frame {layout:?} frame {bad}"
            );
        }
    }
}

/// A file cut anywhere (a SIGKILL mid-write) reads every whole frame before the cut and
/// nothing of the torn one: chains only look back.
#[test]
fn a_cut_anywhere_reads_every_whole_frame_before_it() {
    let bufs = thread_buffers(50);
    let (bytes, info) = chained_trace(&bufs, FrameLayout::Auto, 2);
    let fr = frames(&bytes);
    for (k, &(off, len)) in fr.iter().enumerate().step_by(5) {
        for cut in [off, off + 1, off + 31, off + len / 2, off + len - 1] {
            let (_, got, errs, trunc) = read_all(&bytes[..cut]).unwrap();
            assert!(errs.is_empty(), "{errs:?}");
            assert!(
                trunc.is_some(),
                "cut at {cut}: no end record, or a torn frame"
            );
            let want: Vec<Event> = bufs
                .iter()
                .zip(&info)
                .filter(|(_, i)| i.1 < k)
                .flat_map(|(b, _)| b.1.clone())
                .collect();
            assert!(got == want, "cut at {cut} (frame {k})");
        }
    }
}

/// A corrupt record in the middle of a chained context's run (the run cut short: its events
/// up to the cut are read, then the rest of the frame is skipped) leaves the slot's model
/// half-updated: the chain's next context, in the next frame, is refused as continuing a
/// model the reader does not have, and none of its events come back. With the reader's
/// `abandon` of the slot removed, it decodes that context with the half-updated model and
/// this fails.
#[test]
fn a_corrupt_record_inside_a_chained_context_breaks_its_chain() {
    let ops = gpt2_torch();
    let a: Vec<Event> = ops[..60].iter().cloned().map(Event::Torch).collect();
    let b: Vec<Event> = ops[60..120].iter().cloned().map(Event::Torch).collect();
    let tid = match &a[0] {
        Event::Torch(op) => op.tid,
        _ => 0,
    };
    let mut enc = RecordEncoder::new();
    enc.clear();
    enc.context_chained(tid);
    for e in &a {
        enc.push(e);
    }
    let b1 = enc.bytes().to_vec();
    enc.clear();
    enc.context_chained(tid);
    for e in &b {
        enc.push(e);
    }
    let b2 = enc.bytes().to_vec();
    // b1: the context record (tag, len, payload), then one run: tag 25, a 3-byte length, the
    // events. The run cut short inside an event (the first cut from its middle on that
    // leaves a partial event: a corrupt record after the events before it).
    let ctx_len = 2 + b1[1] as usize;
    assert_eq!(b1[ctx_len], 25);
    let pay = &b1[ctx_len + 4..];
    let st = RecordStats {
        records: 2,
        t_min: u64::MAX,
        t_max: 0,
    };
    let trace = |h: usize, layout: FrameLayout| {
        let mut cut = b1[..ctx_len].to_vec();
        cut.extend_from_slice(&[
            25,
            (h as u8) | 0x80,
            ((h >> 7) as u8) | 0x80,
            (h >> 14) as u8,
        ]);
        cut.extend_from_slice(&pay[..h]);
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.set_layout(layout);
        w.write_records(&cut, st).unwrap();
        w.flush_frame().unwrap();
        let first = w.stats().file_bytes;
        w.write_records(&b2, st).unwrap();
        w.flush_frame().unwrap();
        (w.finish().unwrap(), first)
    };
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let (bytes, first) = (pay.len() / 2..pay.len())
            .map(|h| trace(h, layout))
            .find(|(bytes, first)| {
                let (_, _, errs, _) = read_all(bytes).unwrap();
                errs.first().is_some_and(|e| e.offset < *first)
            })
            .expect("a cut inside an event");
        let (_, got, errs, _) = read_all(&bytes).unwrap();
        assert!(
            !got.is_empty() && got.len() < a.len(),
            "{layout:?}: {}",
            got.len()
        );
        assert!(
            got[..] == a[..got.len()],
            "{layout:?}: the events before the cut"
        );
        assert_eq!(errs.len(), 2, "{layout:?}: {errs:?}");
        assert!(errs[1].offset >= first);
        assert!(
            matches!(&errs[1].kind, DecodeErrorKind::CorruptRecord(m) if m.contains("not read whole")),
            "{layout:?}: {errs:?}"
        );
    }
}

/// The names a skipped context defines (a chained context whose model the reader lacks after a
/// damaged frame: `Stack`, `PyCode` and `PyStack` records after its first `TorchRun`, as a
/// thread's buffer holds them when it meets a new stack mid-buffer) are read all the same:
/// they are untimed and depend on no state, and they are written once a process, so a later
/// event that names them (in any later frame, a fresh chain's too) would otherwise lose its
/// stack for good. Reading them as the skip passes over them, they come back; skipping them
/// with the rest of the context, this fails.
#[test]
fn a_skipped_context_still_defines_its_stacks() {
    let ops = gpt2_torch();
    let tid = ops[0].tid;
    let defs = [
        Event::PyCode {
            id: 7,
            file: "train.py".into(),
            function: "forward".into(),
            first_line: 10,
        },
        Event::PyStack {
            id: 9,
            frames: vec![PyFrame { code: 7, line: 12 }],
        },
        Event::Stack {
            id: 11,
            frames: vec![0x1000, 0x2000],
        },
    ];
    let mut enc = RecordEncoder::new();
    let mut buffers = Vec::new();
    // The first context of the chain (its frame damaged below), then one that continues it
    // and names a new stack between its runs.
    enc.clear();
    enc.context_chained(tid);
    for op in &ops[..60] {
        enc.push(&Event::Torch(op.clone()));
    }
    buffers.push(enc.bytes().to_vec());
    enc.clear();
    enc.context_chained(tid);
    for op in &ops[60..90] {
        enc.push(&Event::Torch(op.clone()));
    }
    for d in &defs {
        enc.push(d);
    }
    for op in &ops[90..120] {
        enc.push(&Event::Torch(op.clone()));
    }
    buffers.push(enc.bytes().to_vec());
    let st = RecordStats {
        records: 1,
        t_min: u64::MAX,
        t_max: 0,
    };
    for layout in [FrameLayout::Rows, FrameLayout::Columnar] {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.set_layout(layout);
        for b in &buffers {
            w.write_records(b, st).unwrap();
            w.flush_frame().unwrap();
        }
        let mut bytes = w.finish().unwrap();
        let (off, len) = frames(&bytes)[0];
        for b in &mut bytes[off + 48..off + len.min(200)] {
            *b ^= 0x5a;
        }
        let (_, got, errs, _) = read_all(&bytes).unwrap();
        assert!(
            errs.iter().any(|e| matches!(&e.kind, DecodeErrorKind::CorruptRecord(m) if m.contains("not read whole"))),
            "{layout:?}: the second context is skipped: {errs:?}"
        );
        assert!(
            !got.iter().any(|e| matches!(e, Event::Torch(_))),
            "{layout:?}: no tensor event of the skipped context comes back"
        );
        for d in &defs {
            assert!(
                got.contains(d),
                "{layout:?}: {d:?} lost with the skipped context"
            );
        }
        let visited = collect_visited(&bytes);
        for d in &defs {
            assert!(visited.contains(d), "{layout:?} visit_frame: {d:?} lost");
        }
    }
}
