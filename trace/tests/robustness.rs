//! Bad input: truncation at every byte, corrupt bytes, hostile lengths, random garbage.
//! The decoder must never panic, never loop, never allocate beyond its caps, and always
//! return a prefix of what was written plus a clear report.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use proptest::prelude::*;
use vramshim_trace::*;

/// Counts live heap bytes so tests can bound what the decoder allocates.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Caps from docs/trace-format.md section 6 (frame raw 16 MiB + compressed 16.2 MiB) plus
/// zstd's context and slack. Tests run in parallel threads, so this is a loose bound on
/// the whole process; what it catches is a decoder trusting a 4 GiB length.
const ALLOC_BOUND: usize = 160 << 20;

#[test]
fn truncated_at_every_offset_gives_prefix_or_clear_error() {
    let (h, ev, bytes) = small_trace();
    let mut last = 0;
    for cut in 0..=bytes.len() {
        match read_all(&bytes[..cut]) {
            Err(e) => {
                assert!(cut < 22 + 200, "header error at cut {cut}: {e}");
                let msg = e.to_string();
                assert!(
                    matches!(
                        e.kind,
                        DecodeErrorKind::Empty | DecodeErrorKind::TruncatedHeader
                    ),
                    "cut {cut}: {msg}"
                );
                assert!(cut != 0 || msg.contains("empty"));
            }
            Ok((h2, got, errs, trunc)) => {
                assert_eq!(h2, h);
                assert!(errs.is_empty(), "cut {cut}: {errs:?}");
                assert_eq!(&ev[..got.len()], &got[..], "cut {cut}: not a prefix");
                assert!(
                    got.len() >= last,
                    "cut {cut}: fewer events than a shorter file"
                );
                last = got.len();
                if cut == bytes.len() {
                    assert_eq!(trunc, None);
                    assert_eq!(got.len(), ev.len());
                } else {
                    let t = trunc.unwrap_or_else(|| panic!("cut {cut}: truncation not reported"));
                    assert!(t.offset <= cut as u64);
                    let msg = t.to_string();
                    assert!(
                        msg.contains("truncated") || msg.contains("without an end record"),
                        "{msg}"
                    );
                }
            }
        }
    }
    assert_eq!(last, ev.len());
}

#[test]
fn torn_frame_reports_offset_and_keeps_earlier_frames() {
    let (_, ev, bytes) = small_trace();
    let last = *frame_offsets(&bytes).last().unwrap() as usize;
    let cut = last + 40; // inside the last frame's zstd data
    let (_, got, errs, trunc) = read_all(&bytes[..cut]).unwrap();
    assert!(errs.is_empty());
    let t = trunc.unwrap();
    assert_eq!(t.offset, last as u64);
    assert!(matches!(t.reason, TruncationReason::TornFrame { .. }));
    assert!(got.len() < ev.len() && !got.is_empty());
}

/// The frames of `bytes` (a whole trace): their offsets, read back.
fn frame_offsets(bytes: &[u8]) -> Vec<u64> {
    let mut r = TraceReader::from_reader(bytes).unwrap();
    let mut offsets = Vec::new();
    let mut e = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut e).unwrap() {
        let f = r.current_frame().unwrap();
        if offsets.last() != Some(&f.offset) {
            offsets.push(f.offset);
        }
    }
    offsets
}

#[test]
fn garbage_after_the_last_frame_keeps_every_frame_before_it() {
    let (_, ev, bytes) = small_trace();
    let frames = frame_offsets(&bytes).len() as u64;
    let noise: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    // Garbage, zeros (a preallocated or half-flushed file), and a torn frame's own first
    // bytes repeated in the wrong place: each after every good frame.
    let torn_copy = bytes[frame_offsets(&bytes)[0] as usize..][..40].to_vec();
    let mut wrong_len = torn_copy.clone();
    wrong_len[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    for tail in [noise.clone(), vec![0u8; 70_000], b"\n".to_vec(), wrong_len] {
        let mut b = bytes.clone();
        b.extend_from_slice(&tail);
        let (_, got, errs, trunc) = read_all(&b).unwrap();
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(got, ev, "every event before the damage is read");
        let t = trunc.expect("the trace is marked cut");
        assert_eq!(t.offset, bytes.len() as u64);
        match &t.reason {
            TruncationReason::Damaged {
                frame,
                skipped,
                skipped_exact,
                ..
            } => {
                assert_eq!(*frame, frames + 1);
                assert_eq!(*skipped, tail.len() as u64);
                assert!(*skipped_exact);
            }
            r => panic!("{r:?}"),
        }
        assert!(t.is_damage());
        let msg = t.to_string();
        assert!(
            msg.contains(&format!("byte {}", bytes.len()))
                && msg.contains(&format!("frame {}", frames + 1))
                && msg.contains(&format!("skipped {} bytes", tail.len())),
            "{msg}"
        );
    }
    // Still refused whole: a file that is not a trace at all.
    let e = read_all(&noise).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::NotATrace);
}

#[test]
fn not_a_trace_empty_future_version() {
    let e = read_all(b"").unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::Empty);
    let e = read_all(b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x1,2,0\n")
        .unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::NotATrace);
    assert_eq!(
        e.to_string(),
        "not a vramshim trace (no .vramtrace magic at byte 0)"
    );
    let e = read_all(&[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::NotATrace);
    let (_, _, mut bytes) = small_trace();
    bytes[14..18].copy_from_slice(&7u32.to_le_bytes());
    let e = read_all(&bytes).unwrap_err();
    assert_eq!(
        e.kind,
        DecodeErrorKind::FutureVersion {
            found: 7,
            supported: FORMAT_VERSION
        }
    );
    assert!(e.to_string().contains("version 7 is newer"), "{e}");
    // Version 0 is no version at all, not a newer one.
    bytes[14..18].copy_from_slice(&0u32.to_le_bytes());
    let e = read_all(&bytes).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::InvalidVersion);
    assert!(e.to_string().contains("version 0"), "{e}");
    assert!(e.to_string().contains("not a valid version"), "{e}");
    assert!(!e.to_string().contains("newer"), "{e}");
}

#[test]
fn corrupt_frame_is_skipped_with_offset() {
    let (_, ev, mut bytes) = small_trace();
    // Corrupt a byte inside the first frame's zstd data (the checksum catches it).
    let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let first = 22 + hlen;
    bytes[first + 32 + 12] ^= 0x55;
    let (_, got, errs, trunc) = read_all(&bytes).unwrap();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].offset, first as u64);
    assert!(
        errs[0].to_string().contains(&format!("byte {first}")),
        "{}",
        errs[0]
    );
    assert_eq!(trunc, None);
    // Later frames survive: the tail of the trace is intact.
    assert!(!got.is_empty());
    assert_eq!(&ev[ev.len() - got.len()..], &got[..]);
}

#[test]
fn corrupt_record_names_offsets() {
    // A frame holding a MemOp with an impossible api number.
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.write(&Event::Lost { t_ns: 1, count: 1 }).unwrap();
    let (bytes_ok, stats) = {
        let mut e = RecordEncoder::new();
        e.begin(1);
        e.push(&Event::Alloc(op(5, 1, Api::CudaMalloc, 1, 1)));
        e.take()
    };
    let mut bad = bytes_ok.clone();
    // Context(3 bytes) then Alloc: tag, len, mask(api bit set), api varint -> 200.
    assert_eq!(bad[3], 3);
    assert!(bad[5] & 1 == 1);
    bad[6] = 100;
    w.write_records(&bad, stats).unwrap();
    w.flush_frame().unwrap();
    w.write(&Event::Lost { t_ns: 2, count: 2 }).unwrap();
    let bytes = w.finish().unwrap();
    let (_, got, errs, _) = read_all(&bytes).unwrap();
    assert_eq!(errs.len(), 1);
    // Context(3) + Lost(4) + Context(3), then the bad Alloc.
    assert_eq!(errs[0].record_offset, Some(3 + 4 + 3));
    assert!(
        errs[0]
            .to_string()
            .contains("corrupt record at byte 10 of the frame at byte"),
        "{}",
        errs[0]
    );
    assert_eq!(
        got,
        vec![
            Event::Lost { t_ns: 1, count: 1 },
            Event::Lost { t_ns: 2, count: 2 }
        ]
    );
}

#[test]
fn unknown_record_types_and_trailing_fields_are_skipped() {
    let mut e = RecordEncoder::new();
    e.begin(0);
    let (mut raw, mut stats) = e.take();
    // Unknown tag 200 with a 5-byte payload.
    raw.extend_from_slice(&[200, 5, 1, 2, 3, 4, 5]);
    // A Lost record with two extra (future) payload bytes: tag 15, len 4, dt=zigzag(9)=18, count 3, extra.
    raw.extend_from_slice(&[15, 4, 18, 3, 0xAA, 0xBB]);
    stats.records += 2;
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.write_records(&raw, stats).unwrap();
    let bytes = w.finish().unwrap();
    let (_, got, errs, trunc) = read_all(&bytes).unwrap();
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(trunc, None);
    assert_eq!(got, vec![Event::Lost { t_ns: 9, count: 3 }]);
}

#[test]
fn hostile_lengths_do_not_allocate() {
    let (_, _, bytes) = small_trace();
    let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let first = 22 + hlen;
    // Header length claims 4 GiB.
    let mut b = bytes.clone();
    b[18..22].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = read_all(&b).unwrap_err();
    assert!(matches!(e.kind, DecodeErrorKind::BadHeader(_)), "{e}");
    // Header length claims 4 MiB but the file ends: truncated header, tiny allocation.
    let mut b = bytes[..100].to_vec();
    b[18..22].copy_from_slice(&(4u32 << 20).to_le_bytes());
    let e = read_all(&b).unwrap_err();
    assert_eq!(e.kind, DecodeErrorKind::TruncatedHeader);
    // Frame claims 16 MiB compressed and raw, but holds 10 bytes: torn, nothing big allocated.
    let mut b = bytes[..first + 32 + 10].to_vec();
    b[first + 4..first + 8].copy_from_slice(&(16u32 << 20).to_le_bytes());
    b[first + 8..first + 12].copy_from_slice(&(16u32 << 20).to_le_bytes());
    let (_, got, _, trunc) = read_all(&b).unwrap();
    assert!(got.is_empty());
    assert!(matches!(
        trunc.unwrap().reason,
        TruncationReason::TornFrame { .. }
    ));
    // Frame claims more than the maximum: the trace ends there, damaged, named clearly.
    let mut b = bytes.clone();
    b[first + 4..first + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let (_, got, errs, trunc) = read_all(&b).unwrap();
    assert!(got.is_empty() && errs.is_empty(), "{errs:?}");
    let t = trunc.unwrap();
    assert_eq!(t.offset, first as u64);
    assert!(
        matches!(&t.reason, TruncationReason::Damaged { frame: 1, skipped, skipped_exact: true, what }
            if *skipped == (b.len() - first) as u64 && what.contains("impossible lengths")),
        "{t:?}"
    );
    assert!(PEAK.load(Ordering::Relaxed) < ALLOC_BOUND);
}

fn mutate(bytes: &[u8], ops: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for &(pos, val, op) in ops {
        if b.is_empty() {
            break;
        }
        let p = pos % b.len();
        match op % 4 {
            0 => b[p] = val,
            1 => b[p] ^= 1 << (val % 8),
            2 => b.insert(p, val),
            _ => {
                b.remove(p);
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(2000))]

    /// Fuzz-like: mutated real traces (mostly past the header, where frames live).
    #[test]
    fn mutated_traces_never_panic(ops in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        let (_, ev, bytes) = small_trace();
        let b = mutate(&bytes, &ops);
        if let Ok((_, got, errs, _)) = read_all(&b) {
            // Without an error, what comes out is bounded by what went in (plus mutations
            // can at most split one frame's records differently).
            if errs.is_empty() {
                prop_assert!(got.len() <= ev.len() + 64);
            }
        }
        prop_assert!(PEAK.load(Ordering::Relaxed) < ALLOC_BOUND);
    }

    /// Garbage after a valid preamble, and uncompressed garbage inside valid frames.
    #[test]
    fn random_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..2000), raw in proptest::collection::vec(any::<u8>(), 0..600)) {
        let (_, _, bytes) = small_trace();
        let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
        let mut b = bytes[..22 + hlen].to_vec();
        b.extend_from_slice(b"VRFR");
        b.extend_from_slice(&tail);
        let _ = read_all(&b);
        // A well-formed frame whose records are random bytes.
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.write_records(&raw, RecordStats { records: 0, t_min: u64::MAX, t_max: 0 }).unwrap();
        let b = w.finish().unwrap();
        let _ = read_all(&b);
        let _ = read_all(&raw);
        prop_assert!(PEAK.load(Ordering::Relaxed) < ALLOC_BOUND);
    }
}

/// Rebuilds the first frame (columnar) of `bytes` with stream `k` replaced by `f(stream)`.
fn edit_column(bytes: &[u8], k: usize, f: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let first = 22 + hlen;
    assert_eq!(&bytes[first..first + 4], b"VRFC");
    let clen = u32::from_le_bytes(bytes[first + 4..first + 8].try_into().unwrap()) as usize;
    let body = &bytes[first + 32..first + 32 + clen];
    let le = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap()) as usize;
    let mut streams = Vec::new();
    // The directory: a stream count (9, or 10 with format v4's torch stream), then lengths.
    let count = body[0] as usize;
    let mut at = 1 + 8 * count;
    for i in 0..count {
        let (r, c) = (le(1 + 8 * i), le(5 + 8 * i));
        let raw = if c == 0 {
            Vec::new()
        } else {
            zstd::bulk::decompress(&body[at..at + c], r).unwrap()
        };
        streams.push(raw);
        at += c;
    }
    f(&mut streams[k]);
    let mut nb = vec![count as u8];
    let mut data = Vec::new();
    for s in &streams {
        let c = if s.is_empty() {
            Vec::new()
        } else {
            zstd::bulk::compress(s, 3).unwrap()
        };
        nb.extend_from_slice(&(s.len() as u32).to_le_bytes());
        nb.extend_from_slice(&(c.len() as u32).to_le_bytes());
        data.extend_from_slice(&c);
    }
    nb.extend_from_slice(&data);
    let raw_total: usize = streams.iter().map(|s| s.len()).sum();
    let mut out = bytes[..first].to_vec();
    out.extend_from_slice(b"VRFC");
    out.extend_from_slice(&(nb.len() as u32).to_le_bytes());
    out.extend_from_slice(&(raw_total as u32).to_le_bytes());
    out.extend_from_slice(&bytes[first + 12..first + 32]);
    out.extend_from_slice(&nb);
    out.extend_from_slice(&bytes[first + 32 + clen..]);
    out
}

#[test]
fn short_timing_column_is_a_corrupt_record_not_a_panic() {
    let (_, ev, bytes) = small_trace();
    // Sanity: an unchanged rebuild reads back identically.
    let same = edit_column(&bytes, 3, |_| {});
    assert_eq!(read_all(&same).unwrap().1, ev);
    // The first frame holds the 7 allocations; drop the last alloc latency low byte.
    let b = edit_column(&bytes, 3, |s| {
        s.pop();
    });
    let (_, got, errs, trunc) = read_all(&b).unwrap();
    assert_eq!(errs.len(), 1, "{errs:?}");
    let msg = errs[0].to_string();
    assert!(msg.contains("timing column ends"), "{msg}");
    assert!(errs[0].record_offset.is_some());
    assert_eq!(trunc, None);
    // The first frame is the 3 prelude events and 5 allocations: the 5th allocation lost its
    // column entry, so the frame yields 7 events; every later frame is intact.
    let want: Vec<Event> = ev[..7].iter().chain(&ev[8..]).cloned().collect();
    assert_eq!(got, want);
    // A directory that does not add up is a corrupt frame, skipped.
    let mut b = same.clone();
    let hlen = u32::from_le_bytes(b[18..22].try_into().unwrap()) as usize;
    b[22 + hlen + 32 + 1] ^= 1;
    let (_, _, errs, _) = read_all(&b).unwrap();
    assert!(
        matches!(errs[0].kind, DecodeErrorKind::CorruptFrame(_)),
        "{errs:?}"
    );
}

/// `before`, `record` (of tag `tag`) and `after` in one batch of thread `tid`, written and
/// read back: as written, and with the record's tag changed to one no reader knows (as a
/// reader that predates the record sees it). No error and no truncation either way; the
/// unknown record is skipped whole and the events around it read as written, with the same
/// times.
fn round_trips_and_is_skipped_when_unknown(
    tid: u32,
    before: &[Event],
    record: &Event,
    tag: u8,
    after: &[Event],
) {
    for unknown in [false, true] {
        let mut e = RecordEncoder::new();
        e.begin(tid);
        for ev in before {
            e.push(ev);
        }
        let start = e.bytes().len();
        e.push(record);
        for ev in after {
            e.push(ev);
        }
        let (mut raw, st) = e.take();
        assert_eq!(raw[start], tag, "{record:?} is tag {tag}");
        if unknown {
            raw[start] = 250;
        }
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.write_records(&raw, st).unwrap();
        let bytes = w.finish().unwrap();
        let (_, got, errs, trunc) = read_all(&bytes).unwrap();
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(trunc, None);
        let mut want = before.to_vec();
        if !unknown {
            want.push(record.clone());
        }
        want.extend_from_slice(after);
        assert_eq!(got, want, "tag unknown to the reader: {unknown}");
    }
}

/// The pool's statistics record (tag 23) reads back as written, and a reader that does not
/// know its tag (every reader before it) skips it whole and reads on with the same times (the
/// record carries its time in full, so skipping it leaves the delta state as the writer's).
#[test]
fn pool_stats_records_round_trip_and_are_skipped_by_older_readers() {
    let stats = Event::PoolStats {
        t_ns: 5,
        device: 0,
        reserved: 220 << 20,
        live: 209 << 20,
        cached: 3 << 20,
        pending: 0,
        budget: 222 << 20,
        releases: 7,
    };
    let lost = Event::Lost { t_ns: 9, count: 3 };
    round_trips_and_is_skipped_when_unknown(0, &[], &stats, 23, &[lost]);
}

/// A stream's destroy (tag 26) reads back as written, and a reader that does not know its tag
/// (every reader before it) skips it whole and reads on with the same times (the record
/// carries its time in full, as `PoolStats` does, so skipping it leaves the delta state as
/// the writer's).
#[test]
fn stream_destroy_records_round_trip_and_are_skipped_by_older_readers() {
    let destroy = Event::StreamDestroy {
        t_ns: 5_000_000_123,
        tid: 4242,
        device: 1,
        stream: 0x7c5e_0000_0200,
    };
    let before = Event::ThreadStart { t_ns: 7, tid: 4242 };
    let after = Event::Lost { t_ns: 9, count: 3 };
    round_trips_and_is_skipped_when_unknown(4242, &[before], &destroy, 26, &[after]);
}
