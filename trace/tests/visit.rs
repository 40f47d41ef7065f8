//! `TraceReader::visit_frame` (the analyzer's fast path) gives exactly what `next_into` gives:
//! the same events in the same order, the same errors at the same offsets, the same end time
//! and truncation, on well-formed traces of both frame layouts and on traces whose decompressed
//! columns (records and timing streams) were damaged.

mod common;

use common::*;
use proptest::prelude::*;
use vramshim_trace::*;

#[derive(Debug, PartialEq)]
enum Item {
    Ev(Event),
    Err(String, Option<u64>),
}

#[derive(Debug, PartialEq)]
struct Outcome {
    items: Vec<Item>,
    end: Option<u64>,
    truncation: Option<Truncation>,
    events: u64,
}

fn by_next_into(bytes: &[u8]) -> Option<Outcome> {
    let mut r = TraceReader::from_reader(bytes).ok()?;
    let mut items = Vec::new();
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    loop {
        match r.next_into(&mut ev) {
            Ok(true) => items.push(Item::Ev(ev.clone())),
            Ok(false) => break,
            Err(e) => {
                items.push(Item::Err(e.to_string(), e.record_offset));
                if !e.is_recoverable() {
                    break;
                }
            }
        }
    }
    Some(Outcome {
        items,
        end: r.end_time(),
        truncation: r.truncation().cloned(),
        events: r.events_read(),
    })
}

struct Collect(Vec<Item>);

impl Visitor for Collect {
    fn memop(&mut self, alloc: bool, m: &MemOp) {
        self.0.push(Item::Ev(if alloc {
            Event::Alloc(m.clone())
        } else {
            Event::Free(m.clone())
        }));
    }
    fn event(&mut self, ev: Event) {
        self.0.push(Item::Ev(ev));
    }
}

fn by_visit(bytes: &[u8]) -> Option<Outcome> {
    let mut r = TraceReader::from_reader(bytes).ok()?;
    let mut c = Collect(Vec::new());
    loop {
        match r.visit_frame(&mut c) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                c.0.push(Item::Err(e.to_string(), e.record_offset));
                if !e.is_recoverable() {
                    break;
                }
            }
        }
    }
    Some(Outcome {
        items: c.0,
        end: r.end_time(),
        truncation: r.truncation().cloned(),
        events: r.events_read(),
    })
}

/// Rewrites every columnar frame of `bytes`, applying `f(frame number, stream, bytes)` to its
/// decompressed streams (row frames are copied as they are).
fn edit_streams(bytes: &[u8], f: impl Fn(usize, usize, &mut Vec<u8>)) -> Vec<u8> {
    let hlen = u32::from_le_bytes(bytes[18..22].try_into().unwrap()) as usize;
    let mut at = 22 + hlen;
    let mut out = bytes[..at].to_vec();
    let mut frame = 0;
    while at + 32 <= bytes.len() {
        let clen = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let end = (at + 32 + clen).min(bytes.len());
        if &bytes[at..at + 4] != b"VRFC" || end < at + 32 + clen {
            out.extend_from_slice(&bytes[at..end]);
            at = end;
            frame += 1;
            continue;
        }
        let body = &bytes[at + 32..end];
        let le = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap()) as usize;
        // The directory: a stream count (9, or 10 with format v4's torch stream), then
        // (raw, compressed) lengths.
        let count = body[0] as usize;
        let mut p = 1 + 8 * count;
        let mut nb = vec![count as u8];
        let mut data = Vec::new();
        let mut raw_total = 0;
        for k in 0..count {
            let (r, c) = (le(1 + 8 * k), le(5 + 8 * k));
            let mut s = if c == 0 {
                Vec::new()
            } else {
                zstd::bulk::decompress(&body[p..p + c], r).unwrap()
            };
            p += c;
            f(frame, k, &mut s);
            let z = if s.is_empty() {
                Vec::new()
            } else {
                zstd::bulk::compress(&s, 3).unwrap()
            };
            nb.extend_from_slice(&(s.len() as u32).to_le_bytes());
            nb.extend_from_slice(&(z.len() as u32).to_le_bytes());
            data.extend_from_slice(&z);
            raw_total += s.len();
        }
        nb.extend_from_slice(&data);
        out.extend_from_slice(b"VRFC");
        out.extend_from_slice(&(nb.len() as u32).to_le_bytes());
        out.extend_from_slice(&(raw_total as u32).to_le_bytes());
        out.extend_from_slice(&bytes[at + 12..at + 32]);
        out.extend_from_slice(&nb);
        at = end;
        frame += 1;
    }
    out.extend_from_slice(&bytes[at..]);
    out
}

fn write(events: &[Event], layout: FrameLayout, every: usize) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), &sample_header()).unwrap();
    w.set_layout(layout);
    for (i, e) in events.iter().enumerate() {
        w.write(e).unwrap();
        if (i + 1) % every == 0 {
            w.flush_frame().unwrap();
        }
    }
    w.finish().unwrap()
}

fn agree(bytes: &[u8]) {
    let a = by_next_into(bytes);
    let b = by_visit(bytes);
    assert_eq!(a, b);
}

#[test]
fn small_trace_agrees() {
    let (_, ev, bytes) = small_trace();
    agree(&bytes);
    let o = by_visit(&bytes).unwrap();
    assert_eq!(o.items.len(), ev.len());
}

#[test]
fn damaged_timing_and_record_streams_agree() {
    let (_, _, bytes) = small_trace();
    for k in 0..9 {
        // Cut the stream short, lengthen it, and put a continuation bit on a byte.
        agree(&edit_streams(&bytes, |_, s, v| {
            if s == k {
                v.pop();
            }
        }));
        agree(&edit_streams(&bytes, |_, s, v| {
            if s == k {
                v.push(0x80);
            }
        }));
        agree(&edit_streams(&bytes, |f, s, v| {
            if s == k && !v.is_empty() {
                let i = (f * 7) % v.len();
                v[i] |= 0x80;
            }
        }));
    }
}

proptest! {
    #![proptest_config(vramshim_testkit::props::config(200))]

    #[test]
    fn random_traces_and_damage_agree(
        events in proptest::collection::vec(event(), 1..400),
        every in 1usize..120,
        rows in any::<bool>(),
        hits in proptest::collection::vec((0usize..9, any::<usize>(), any::<u8>()), 0..6),
    ) {
        let layout = if rows { FrameLayout::Rows } else { FrameLayout::Columnar };
        let bytes = write(&events, layout, every);
        agree(&bytes);
        let damaged = edit_streams(&bytes, |f, s, v| {
            for &(k, at, x) in &hits {
                if k == s && !v.is_empty() && at % 3 == f % 3 {
                    let i = at % v.len();
                    v[i] ^= x;
                }
            }
        });
        agree(&damaged);
    }
}
