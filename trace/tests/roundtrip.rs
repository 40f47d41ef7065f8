//! Property tests: whatever is written is read back identically, in order, with any frame
//! boundaries, through both the single-writer and the per-thread buffer paths.

mod common;

use common::*;
use proptest::prelude::*;
use vramshim_trace::*;

proptest! {
    #![proptest_config(vramshim_testkit::props::config(256))]

    #[test]
    fn writer_round_trip(
        h in header(),
        evs in proptest::collection::vec(event(), 0..120),
        flush_every in 1usize..50,
        level in 1i32..4,
        target in prop_oneof![Just(1usize << 20), 16usize..512],
        layout in proptest::sample::select(vec![FrameLayout::Auto, FrameLayout::Columnar, FrameLayout::Rows]),
    ) {
        let mut w = TraceWriter::with_level(Vec::new(), &h, level).unwrap();
        w.set_frame_target(target);
        w.set_layout(layout);
        for (i, e) in evs.iter().enumerate() {
            w.write(e).unwrap();
            if i % flush_every == flush_every - 1 {
                w.flush_frame().unwrap();
            }
        }
        let bytes = w.finish().unwrap();
        let (h2, got, errs, trunc) = read_all(&bytes).unwrap();
        prop_assert!(errs.is_empty(), "{:?}", errs);
        prop_assert_eq!(trunc, None);
        prop_assert_eq!(h2, h);
        prop_assert_eq!(got, evs);
    }

    /// Streams that repeat their field values (most records carry no context field) decode to
    /// what was written in every layout, across frame starts that reset the delta state.
    #[test]
    fn repetitive_round_trip(
        evs in proptest::collection::vec(repetitive_memop(), 0..400),
        flush_every in 1usize..60,
        layout in proptest::sample::select(vec![FrameLayout::Auto, FrameLayout::Columnar, FrameLayout::Rows]),
    ) {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.set_layout(layout);
        for (i, e) in evs.iter().enumerate() {
            w.write(e).unwrap();
            if i % flush_every == flush_every - 1 {
                w.flush_frame().unwrap();
            }
        }
        let bytes = w.finish().unwrap();
        let (_, got, errs, trunc) = read_all(&bytes).unwrap();
        prop_assert!(errs.is_empty(), "{:?}", errs);
        prop_assert_eq!(trunc, None);
        prop_assert_eq!(got, evs);
    }

    /// The tracer's path: many per-thread encoders, whole buffers concatenated into frames.
    #[test]
    fn buffers_round_trip(
        threads in proptest::collection::vec(proptest::collection::vec(event(), 0..40), 1..6),
        chunk in 1usize..20,
        columnar in any::<bool>(),
    ) {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.set_layout(if columnar { FrameLayout::Columnar } else { FrameLayout::Rows });
        let mut expect = Vec::new();
        // Interleave: thread 0 chunk, thread 1 chunk, ... (as the writer receives buffers).
        let mut encs: Vec<RecordEncoder> = threads.iter().enumerate().map(|(i, _)| {
            let mut e = RecordEncoder::new();
            e.begin(i as u32 + 1);
            e
        }).collect();
        let longest = threads.iter().map(|t| t.len()).max().unwrap_or(0);
        let mut pos = 0;
        while pos < longest {
            for (i, t) in threads.iter().enumerate() {
                for e in t.iter().skip(pos).take(chunk) {
                    encs[i].push(e);
                    expect.push(e.clone());
                }
                let (bytes, stats) = encs[i].take();
                w.write_records(&bytes, stats).unwrap();
                encs[i].set_buffer(bytes);
                encs[i].begin(i as u32 + 1);
            }
            pos += chunk;
            if pos % (2 * chunk) == 0 {
                w.flush_frame().unwrap();
            }
        }
        // Mixed with direct writes.
        let extra = Event::Lost { t_ns: 1, count: 2 };
        w.write(&extra).unwrap();
        expect.push(extra);
        let bytes = w.finish().unwrap();
        let (_, got, errs, trunc) = read_all(&bytes).unwrap();
        prop_assert!(errs.is_empty());
        prop_assert_eq!(trunc, None);
        prop_assert_eq!(got, expect);
    }
}

#[test]
fn restore_continues_deltas() {
    let mut e = RecordEncoder::new();
    e.begin(5);
    e.push(&Event::Alloc(op(1000, 5, Api::CudaMalloc, 0x1000, 10)));
    let (b, s) = e.take();
    e.restore(b, s);
    e.push(&Event::Free(op(2000, 5, Api::CudaFree, 0x1000, 10)));
    let (b, s) = e.take();
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.write_records(&b, s).unwrap();
    let bytes = w.finish().unwrap();
    let (_, got, _, _) = read_all(&bytes).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1], Event::Free(op(2000, 5, Api::CudaFree, 0x1000, 10)));
}

#[test]
fn frame_index_and_times() {
    let (_, _, bytes) = small_trace();
    let mut r = TraceReader::from_reader(&bytes[..]).unwrap();
    let mut frames = Vec::new();
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    while r.next_into(&mut ev).unwrap() {
        let f = r.current_frame().unwrap();
        if frames.last() != Some(&f) {
            frames.push(f);
        }
        if let Some(t) = ev.t_ns() {
            assert!(t >= f.t_min && t <= f.t_max, "{t} outside {f:?}");
        }
    }
    assert!(frames.len() >= 3);
    assert!(frames.windows(2).all(|w| w[0].offset < w[1].offset));
}

#[test]
fn reused_addresses_round_trip_compactly() {
    // An allocator that hands freed blocks out again: most allocs hit the recently-freed ring,
    // some with the freed size, some with another size, some beyond the ring's 16 entries.
    let mut evs = Vec::new();
    let mut t = 1_000_000u64;
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let mut next = 0x7f00_0000_0000u64;
    for i in 0..5000u64 {
        t += 700 + (i * 37) % 300;
        if i % 3 == 2 && !live.is_empty() {
            let (a, s) = live.remove((i as usize * 7) % live.len());
            evs.push(Event::Free(op(t, 3, Api::CudaFree, a, s)));
            freed.push(a);
        } else {
            let size = 4096 * (1 + i % 5);
            let addr = if !freed.is_empty() && i % 4 != 0 {
                let k = freed.len() - 1 - (i as usize % freed.len().min(20));
                freed.remove(k)
            } else {
                next += 1 << 20;
                next
            };
            evs.push(Event::Alloc(op(t, 3, Api::CudaMalloc, addr, size)));
            live.push((addr, size));
        }
    }
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    for (i, e) in evs.iter().enumerate() {
        w.write(e).unwrap();
        if i % 777 == 0 {
            w.flush_frame().unwrap();
        }
    }
    let bytes = w.finish().unwrap();
    let (_, got, errs, trunc) = read_all(&bytes).unwrap();
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(trunc, None);
    assert_eq!(got, evs);
}
