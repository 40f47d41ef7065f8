//! PyTorch allocator events on disk: format v3 writes them as `TorchDelta` records (tag 24,
//! fields as deltas from the context's previous one); format v2's `Torch` records (tag 20,
//! plain varints) are still read.

use vramshim_trace::*;

fn torch(t_ns: u64, action: u8, addr: u64, size: u64, segment: u64, stack: u32) -> Event {
    Event::Torch(TorchOp {
        t_ns,
        tid: 4242,
        action,
        device: 0,
        addr,
        size,
        stream: 0,
        segment,
        stack,
    })
}

/// Events as a training step makes them: blocks carved out of two segments, freed, stacks on
/// the allocations, a segment event, and every rarer case: another thread, another device
/// and stream, an action above 14 (the escape byte), an `oom` (segment 0, `addr` the free
/// bytes), addresses below their segment, offsets and sizes that are not whole granules, and
/// values at the ends of the u64 range (offsets and sizes a `TorchDelta` cannot hold: a
/// `Torch` record then).
fn sequence() -> Vec<Event> {
    let (s1, s2) = (0x7fd0_0aa0_0000u64, 0x7fd0_0a00_0000u64);
    let mut ev = vec![torch(1_000, 3, s1, 2 << 20, s1, 0)];
    let mut t = 2_000u64;
    for i in 0..64u64 {
        let seg = if i % 3 == 0 { s2 } else { s1 };
        t += 1_500 + (i * 7919) % 3_000;
        ev.push(torch(
            t,
            0,
            seg + 512 * i,
            256 << (i % 6),
            seg,
            40 + (i % 4) as u32,
        ));
        t += 900;
        ev.push(torch(t, 2, seg + 512 * i, 256 << (i % 6), seg, 0));
    }
    let mut other = TorchOp {
        t_ns: t + 10,
        tid: 99,
        action: 0,
        device: 1,
        addr: s1 + 4096,
        size: 512,
        stream: 0xdead_beef,
        segment: s1,
        stack: 7,
    };
    ev.push(Event::Torch(other.clone()));
    other.action = 200;
    other.t_ns -= 5; // time going backwards within the context: a negative delta
    ev.push(Event::Torch(other));
    ev.push(torch(t + 20, 15, s1, 512, s1, 0));
    ev.push(torch(t + 30, 8, 123 << 20, 1 << 40, 0, 0));
    ev.push(torch(t + 40, 0, s1 - 512, 512, s1, 0));
    ev.push(torch(t + 45, 0, s1 + 100, 100, s1, 0));
    ev.push(torch(t + 46, 0, s2 - 3, 1 << 62, s2, 0));
    ev.push(torch(
        t + 47,
        0,
        s2.wrapping_add(1 << 62),
        (1 << 63) + 256,
        s2,
        0,
    ));
    ev.push(torch(t + 50, 0, u64::MAX, u64::MAX, 0, u32::MAX));
    ev.push(torch(u64::MAX, 4, 0, 0, u64::MAX, 1));
    ev
}

fn read_back(bytes: &[u8]) -> (u32, Vec<Event>) {
    let mut r = TraceReader::from_reader(bytes).unwrap();
    let v = r.header().format_version;
    let ev: Vec<Event> = r.by_ref().map(|e| e.unwrap()).collect();
    assert_eq!(r.truncation(), None);
    (v, ev)
}

/// Every field comes back, in every layout, through contexts (several threads' buffers in
/// one frame, as the interposer's writer concatenates them) and across frames.
#[test]
fn torch_deltas_round_trip() {
    let ev = sequence();
    for layout in [FrameLayout::Auto, FrameLayout::Rows, FrameLayout::Columnar] {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.set_layout(layout);
        for (i, chunk) in ev.chunks(37).enumerate() {
            // Each chunk as one thread buffer (a Context record first), two per frame.
            let mut enc = RecordEncoder::new();
            enc.begin(1000 + i as u32);
            for e in chunk {
                enc.push(e);
            }
            w.write_records(enc.bytes(), enc.stats()).unwrap();
            if i % 2 == 1 {
                w.flush_frame().unwrap();
            }
        }
        let (v, got) = read_back(&w.finish().unwrap());
        assert_eq!(v, FORMAT_VERSION);
        assert_eq!(got, ev, "{layout:?}");
    }
}

/// A training step's events take well under half of the v2 layout's bytes before compression
/// (what the writer thread spends its time compressing).
#[test]
fn torch_deltas_are_small() {
    let ev = sequence();
    let steady = &ev[1..129];
    let mut enc = RecordEncoder::new();
    enc.begin(4242);
    for e in steady {
        enc.push(e);
    }
    let new = enc.len() as f64 / steady.len() as f64;
    let old: usize = steady
        .iter()
        .map(|e| v2_torch_record(0, e).len())
        .sum::<usize>();
    let old = old as f64 / steady.len() as f64;
    assert!(new <= 12.0, "{new:.2} bytes a record (v2 layout {old:.2})");
    assert!(new * 2.0 < old, "{new:.2} bytes a record against {old:.2}");
}

/// A `Torch` record (tag 20) as format v2 wrote it: `dt` from `prev_t`, then every field.
fn v2_torch_record(prev_t: u64, e: &Event) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let zz = |v: i64| ((v << 1) ^ (v >> 63)) as u64;
    let Event::Torch(op) = e else { panic!() };
    let mut p = Vec::new();
    varint(&mut p, zz(op.t_ns.wrapping_sub(prev_t) as i64));
    varint(&mut p, op.tid as u64);
    p.push(op.action);
    varint(&mut p, zz(op.device as i64));
    for v in [op.addr, op.size, op.stream, op.segment, op.stack as u64] {
        varint(&mut p, v);
    }
    let mut r = vec![20u8];
    varint(&mut r, p.len() as u64);
    r.extend_from_slice(&p);
    r
}

/// A v2 file (version 2 in its preamble, `Torch` records) still reads: the same events.
#[test]
fn v2_torch_records_still_decode() {
    let ev = sequence();
    let mut recs = vec![1u8, 2, 0x90, 0x21]; // Context, tid 4240 (as a varint)
    let mut t = 0;
    for e in &ev {
        recs.extend(v2_torch_record(t, e));
        t = e.t_ns().unwrap();
    }
    let st = RecordStats {
        records: ev.len() as u32 + 1,
        t_min: 1_000,
        t_max: u64::MAX,
    };
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.set_layout(FrameLayout::Rows);
    w.write_records(&recs, st).unwrap();
    let mut bytes = w.finish().unwrap();
    bytes[14..18].copy_from_slice(&2u32.to_le_bytes());
    let (v, got) = read_back(&bytes);
    assert_eq!(v, 2);
    assert_eq!(got, ev);
}
