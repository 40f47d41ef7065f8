//! Traces made of raw records or of encoded buffers, as the `TorchRun` tests (torch_runs.rs)
//! and the `torch_run` fuzz target write them; the fuzz target includes this file by its path,
//! so it uses nothing but `vramshim_trace`.

use vramshim_trace::{Event, FrameLayout, Header, RecordEncoder, RecordStats, TraceWriter};

/// `records` (raw records, as an encoder's buffer holds them) written as one frame of
/// `layout` with no time range; with `end_alone` the end record goes in a frame of its own,
/// so that nothing follows the records in theirs.
pub fn records_trace(
    records: &[u8],
    layout: FrameLayout,
    end_alone: bool,
) -> std::io::Result<Vec<u8>> {
    let mut w = TraceWriter::new(Vec::new(), &Header::default())?;
    w.set_layout(layout);
    let st = RecordStats {
        records: 1,
        t_min: u64::MAX,
        t_max: 0,
    };
    w.write_records(records, st)?;
    if end_alone {
        w.flush_frame()?;
    }
    w.finish()
}

/// `ev` written as the interposer's writer thread writes events: in buffers of at most
/// `per_buf` events, each encoded as one context (`tid`; by default the thread of the
/// buffer's first event if it is a tensor event, else 1), the buffers concatenated into
/// frames of about `per_frame` events (a frame is flushed once it holds that many).
pub fn buffers_trace(
    ev: &[Event],
    layout: FrameLayout,
    per_buf: usize,
    per_frame: usize,
    tid: Option<u32>,
) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.set_layout(layout);
    let mut enc = RecordEncoder::new();
    let mut in_frame = 0;
    for chunk in ev.chunks(per_buf) {
        enc.begin(tid.unwrap_or(match &chunk[0] {
            Event::Torch(op) => op.tid,
            _ => 1,
        }));
        for e in chunk {
            enc.push(e);
        }
        w.write_encoded(&enc).unwrap();
        in_frame += chunk.len();
        if in_frame >= per_frame {
            w.flush_frame().unwrap();
            in_frame = 0;
        }
    }
    w.finish().unwrap()
}

/// `bufs` (each a thread and its buffer's events) written as the interposer's writer thread
/// writes them since format v5: each buffer one chained context
/// ([`RecordEncoder::context_chained`]), `per_frame` buffers a frame. Returns the file and,
/// per buffer, whether its context started its model afresh and the frame it went into.
pub fn chained_trace(
    bufs: &[(u32, Vec<Event>)],
    layout: FrameLayout,
    per_frame: usize,
) -> (Vec<u8>, Vec<(bool, usize)>) {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.set_layout(layout);
    let mut enc = RecordEncoder::new();
    let mut info = Vec::new();
    for (i, (tid, ev)) in bufs.iter().enumerate() {
        enc.clear();
        enc.context_chained(*tid);
        // The context record: tag, len, tid, then the chain field, whose bit 0 says fresh.
        let b = enc.bytes();
        let mut p = 2;
        while b[p] & 0x80 != 0 {
            p += 1;
        }
        info.push((b[p + 1] & 1 == 1, i / per_frame));
        for e in ev {
            enc.push(e);
        }
        w.write_encoded(&enc).unwrap();
        if (i + 1) % per_frame == 0 {
            w.flush_frame().unwrap();
        }
    }
    (w.finish().unwrap(), info)
}

/// `bufs` written as the interposer's writer thread codes a thread's buffer: each buffer one
/// chained context, every row of consecutive tensor events given to
/// [`RecordEncoder::push_torch_all`] at once, the other events pushed one by one;
/// `per_frame` buffers a frame. With `rows` false every event is pushed by itself (the
/// bytes must be the same). Returns the file and each buffer's encoded bytes.
pub fn rows_trace(
    bufs: &[(u32, Vec<Event>)],
    layout: FrameLayout,
    per_frame: usize,
    rows: bool,
) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.set_layout(layout);
    let mut enc = RecordEncoder::new();
    let mut coded = Vec::new();
    let mut ops = Vec::new();
    for (i, (tid, ev)) in bufs.iter().enumerate() {
        enc.clear();
        enc.context_chained(*tid);
        let mut rest = &ev[..];
        while let Some(e) = rest.first() {
            let row = rest
                .iter()
                .take_while(|e| rows && matches!(e, Event::Torch(_)))
                .count();
            if row == 0 {
                enc.push(e);
                rest = &rest[1..];
                continue;
            }
            ops.clear();
            ops.extend(rest[..row].iter().filter_map(|e| match e {
                Event::Torch(op) => Some(op.clone()),
                _ => None,
            }));
            assert_eq!(enc.push_torch_all(&ops), row);
            rest = &rest[row..];
        }
        coded.push(enc.bytes().to_vec());
        w.write_encoded(&enc).unwrap();
        if (i + 1) % per_frame == 0 {
            w.flush_frame().unwrap();
        }
    }
    (w.finish().unwrap(), coded)
}
