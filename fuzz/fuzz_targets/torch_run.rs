//! The `TorchRun` coder (format v4, tag 25) under arbitrary input, two ways: the bytes as a
//! run's payload after a `Context` record (plain, or chained as format v5 writes it: a model
//! slot fresh or continued), in a row frame and in a columnar frame's torch stream (the
//! decoder must never panic, loop or allocate beyond its caps); and the bytes as a sequence
//! of PyTorch allocator events drawn from few values (so the model predicts and finds places
//! in its rings), encoded in buffers of one context each, plain or chained across frames,
//! and read back: every event must come back exactly; and those events, some made
//! allocations and frees, coded as the interposer's writer codes a buffer (each row of
//! consecutive tensor events in one `push_torch_all`): the same bytes as event by event,
//! every event read back exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramshim_trace::{AllocKind, Api, Event, FrameLayout, MemOp, TorchOp, TraceReader};

/// The trace tests' writers of raw records and encoded buffers.
#[path = "../../trace/tests/common/frames.rs"]
mod frames;

fn drain(bytes: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    let Ok(mut r) = TraceReader::from_reader(bytes) else {
        return out;
    };
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    for _ in 0..10_000_000 {
        match r.next_into(&mut ev) {
            Ok(true) => out.push(ev.clone()),
            Ok(false) => break,
            Err(e) if e.is_recoverable() => {}
            Err(_) => break,
        }
    }
    out
}

/// Events from the input, 8 bytes each: every field chosen among a few values.
fn events(data: &[u8]) -> Vec<Event> {
    let mut t = 1_000_000u64;
    data.chunks_exact(8)
        .map(|c| {
            let seg = [
                0x7f00_0000_0000u64,
                0x7f00_0200_0000,
                0x7e00_0000_0000,
                0,
                u64::MAX,
            ][c[0] as usize % 5];
            let off = match c[1] % 4 {
                0 => (c[2] as u64) << 9,
                1 => c[2] as u64,
                2 => (c[2] as u64).wrapping_neg(),
                _ => u64::from_le_bytes([c[2], c[3], c[4], c[5], c[6], c[7], c[1], c[0]]),
            };
            t = match c[3] % 8 {
                0 => t.wrapping_sub(c[4] as u64),
                1 => t.wrapping_add(1 << 30),
                _ => t.wrapping_add((c[4] as u64) << (c[5] % 24)),
            };
            Event::Torch(TorchOp {
                t_ns: t,
                tid: [7, 8, 9][c[5] as usize % 3],
                action: [0, 0, 2, 2, 3, 4, 8, 200][c[6] as usize % 8],
                device: [0, 1, -1][c[7] as usize % 3],
                addr: seg.wrapping_add(off),
                size: match c[6] % 5 {
                    0 => 512,
                    1 => 256 << (c[7] % 12),
                    2 => c[7] as u64,
                    3 => u64::MAX - c[7] as u64,
                    _ => 1 << 20,
                },
                stream: [0, 0, 0x55][c[4] as usize % 3],
                segment: seg,
                stack: [0, 1, 2, u32::MAX][c[2] as usize % 4],
            })
        })
        .collect()
}

/// `events(data)` with about one in eight made an allocation or a free of the same time,
/// thread, device, stream, address, size and stack (so that rows of tensor events end where
/// they do in the writer's buffers, and the coders share the context's time and thread).
fn mixed(data: &[u8]) -> Vec<Event> {
    events(data)
        .into_iter()
        .zip(data.chunks_exact(8))
        .map(|(e, c)| match e {
            Event::Torch(op) if c[1] & 0x1c == 0x1c => {
                let m = MemOp {
                    t_ns: op.t_ns,
                    tid: op.tid,
                    api: Api::CudaMalloc,
                    kind: AllocKind::Runtime,
                    flags: 0,
                    device: op.device,
                    stream: op.stream,
                    addr: op.addr,
                    size: op.size,
                    result: 0,
                    latency_ns: 0,
                    stack: op.stack,
                };
                if c[1] & 0x20 == 0 {
                    Event::Alloc(m)
                } else {
                    Event::Free(m)
                }
            }
            e => e,
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() || data.len() > 1 << 16 {
        return;
    }
    let layout = if data[0] & 1 == 0 {
        FrameLayout::Rows
    } else {
        FrameLayout::Columnar
    };
    // 1. The bytes as a run's payload.
    let payload = &data[1..];
    let n = payload.len();
    let mut recs = vec![1u8, 1, 5, 25];
    recs.extend_from_slice(&[(n as u8) | 0x80, ((n >> 7) as u8) | 0x80, (n >> 14) as u8]);
    recs.extend_from_slice(payload);
    if let Ok(file) = frames::records_trace(&recs, layout, false) {
        let got = drain(&file);
        assert!(got.len() <= n / 2 + 1);
    }
    // 2. The bytes as events: encoded in buffers of one context, each in a frame of its own
    // or all in one, read back exactly.
    let ev = events(payload);
    let per = 1 + data[0] as usize / 2;
    let per_frame = if data[0] & 2 != 0 { 1 } else { usize::MAX };
    let file = frames::buffers_trace(&ev, layout, per, per_frame, Some(7));
    assert!(drain(&file) == ev, "events did not round trip");
    // 3. (format v5) The payload after a chained `Context` record (its chain field from the
    // input: a fresh or continued model slot, the latter unknown to the reader), then the
    // events in chained contexts (each buffer one context of its first event's thread, its
    // model continued from that thread's previous buffer, across frames): read back exactly.
    let chain = data[0] & 0x7f;
    let mut recs = vec![1u8, 2, 5, chain, 25];
    recs.extend_from_slice(&[(n as u8) | 0x80, ((n >> 7) as u8) | 0x80, (n >> 14) as u8]);
    recs.extend_from_slice(payload);
    if let Ok(file) = frames::records_trace(&recs, layout, false) {
        let got = drain(&file);
        assert!(got.len() <= n / 2 + 1);
    }
    let bufs: Vec<(u32, Vec<Event>)> = ev
        .chunks(per)
        .map(|c| {
            let tid = match &c[0] {
                Event::Torch(op) => op.tid,
                _ => 7,
            };
            (tid, c.to_vec())
        })
        .collect();
    let (file, _) = frames::chained_trace(&bufs, layout, 1 + (data[0] >> 2) as usize % 4);
    assert!(drain(&file) == ev, "chained events did not round trip");
    // 4. The writer's path: the events, some allocations and frees among them, in chained
    // contexts, each row of consecutive tensor events coded in one `push_torch_all` (one
    // run header, the buffer grown for the row and again past 32 events, runs closed at an
    // event no run holds midway): the bytes of every buffer as those of the events pushed
    // one by one, and every event read back exactly.
    let ev = mixed(payload);
    let bufs: Vec<(u32, Vec<Event>)> = ev
        .chunks(per)
        .map(|c| {
            let tid = match &c[0] {
                Event::Torch(op) => op.tid,
                Event::Alloc(m) | Event::Free(m) => m.tid,
                _ => 7,
            };
            (tid, c.to_vec())
        })
        .collect();
    let per_frame = 1 + (data[0] >> 2) as usize % 4;
    let (file, rows) = frames::rows_trace(&bufs, layout, per_frame, true);
    let (_, singles) = frames::rows_trace(&bufs, layout, per_frame, false);
    assert!(rows == singles, "rows coded otherwise than event by event");
    assert!(drain(&file) == ev, "rows did not round trip");
});
