//! A trace damaged early in a huge file (or stream) is reported without reading the rest: a
//! file opened by path is measured by its size, a stream of unknown length is counted up to
//! `DAMAGE_COUNT_MAX` bytes and then reported as "at least" that many. Bounded time and
//! memory whatever the size: the bytes actually read are counted (by the stream, or by the
//! kernel for this thread) and asserted.

mod common;

use std::io::{self, Read};

use common::*;
use vramshim_trace::*;

/// The events of `r` and its truncation (every event must decode).
fn drain<R: Read>(mut r: TraceReader<R>) -> (Vec<Event>, Truncation) {
    let mut evs = Vec::new();
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    while r
        .next_into(&mut ev)
        .expect("every frame before the damage decodes")
    {
        evs.push(ev.clone());
    }
    (
        evs,
        r.truncation().cloned().expect("the trace is marked cut"),
    )
}

/// A good trace, then `tail_len` bytes that are no frame (garbage, then zeros), made as they
/// are read; counts what was read.
struct Damaged {
    good: Vec<u8>,
    tail_len: u64,
    pos: u64,
}

impl Damaged {
    fn new(good: Vec<u8>, tail_len: u64) -> Self {
        Damaged {
            good,
            tail_len,
            pos: 0,
        }
    }
}

impl Read for Damaged {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = self.good.len() as u64 + self.tail_len;
        let n = (buf.len() as u64).min(len - self.pos) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let at = self.pos + i as u64;
            *b = match self.good.get(at as usize) {
                Some(&g) => g,
                None if at - (self.good.len() as u64) < 8 => b'#',
                None => 0,
            };
        }
        self.pos += n as u64;
        Ok(n)
    }
}

fn damaged(t: &Truncation) -> (u64, u64, bool) {
    match &t.reason {
        TruncationReason::Damaged {
            frame,
            skipped,
            skipped_exact,
            ..
        } => (*frame, *skipped, *skipped_exact),
        r => panic!("not damage: {r:?}"),
    }
}

#[test]
fn a_stream_damaged_early_is_counted_up_to_the_cap_not_to_its_end() {
    let (_, ev, good) = small_trace();
    let frames = {
        let mut r = TraceReader::from_reader(&good[..]).unwrap();
        let mut e = Event::Lost { t_ns: 0, count: 0 };
        while r.next_into(&mut e).unwrap() {}
        r.frames_read()
    };
    // 8 GiB of damage, made as it is read: reading it all would take seconds and say so in
    // the count below.
    let tail = 8u64 << 30;
    let mut src = Damaged::new(good.clone(), tail);
    let r = TraceReader::from_reader(&mut src).unwrap();
    let (got, t) = drain(r);
    assert_eq!(got, ev, "every event before the damage is read");
    assert_eq!(t.offset, good.len() as u64);
    let (frame, skipped, exact) = damaged(&t);
    assert_eq!(frame, frames + 1);
    assert!(!exact, "the end was never reached: {t:?}");
    assert_eq!(skipped, DAMAGE_COUNT_MAX + 1);
    let msg = t.to_string();
    assert!(
        msg.contains(&format!("skipped at least {} bytes", DAMAGE_COUNT_MAX + 1)),
        "{msg}"
    );
    assert!(
        src.pos <= good.len() as u64 + DAMAGE_COUNT_MAX + 1,
        "read {} bytes of the damage to count it",
        src.pos - good.len() as u64
    );
}

#[test]
fn damage_that_ends_within_the_cap_is_counted_exactly() {
    let (_, ev, good) = small_trace();
    for tail in [1, 8, 9, 70_000, DAMAGE_COUNT_MAX] {
        let r = TraceReader::from_reader(Damaged::new(good.clone(), tail)).unwrap();
        let (got, t) = drain(r);
        assert_eq!(got, ev);
        let (_, skipped, exact) = damaged(&t);
        assert_eq!((skipped, exact), (tail, true), "tail {tail}: {t}");
        assert!(
            t.to_string().contains(&format!("skipped {tail} bytes")),
            "{t}"
        );
    }
    let r = TraceReader::from_reader(Damaged::new(good.clone(), DAMAGE_COUNT_MAX + 1)).unwrap();
    let (_, t) = drain(r);
    let (_, skipped, exact) = damaged(&t);
    // One byte past the cap: as many as were there, but the end was not seen.
    assert_eq!((skipped, exact), (DAMAGE_COUNT_MAX + 1, false), "{t}");
}

/// Bytes this thread has read through `read`-like calls (`rchar`), from the kernel.
fn thread_rchar() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").expect("/proc/thread-self/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar in /proc/thread-self/io")
}

#[test]
fn a_file_damaged_early_is_measured_by_its_size_not_read() {
    let (_, ev, good) = small_trace();
    let dir = vramshim_testkit::temp_dir("trace_damage");
    let path = dir.join("damaged.vramtrace");
    {
        let mut b = good.clone();
        b.extend_from_slice(b"not a frame at all");
        std::fs::write(&path, &b).unwrap();
    }
    // 16 GiB, sparse (no disk): reading the damage to its end would read all of it.
    let len = 16u64 << 30;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    let before = thread_rchar();
    let (got, t) = drain(TraceReader::open(&path).unwrap());
    let read = thread_rchar() - before;
    let _ = std::fs::remove_file(&path);
    assert_eq!(got, ev, "every event before the damage is read");
    assert_eq!(t.offset, good.len() as u64);
    let (_, skipped, exact) = damaged(&t);
    assert_eq!((skipped, exact), (len - good.len() as u64, true), "{t}");
    assert!(
        t.to_string()
            .contains(&format!("skipped {} bytes", len - good.len() as u64)),
        "{t}"
    );
    // The trace itself and a buffer's worth around the damage, not the 16 GiB after it.
    assert!(
        read < good.len() as u64 + (1 << 20),
        "read {read} bytes of a {len}-byte file damaged at byte {}",
        good.len()
    );
}
