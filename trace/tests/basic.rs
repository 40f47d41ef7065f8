//! Basic round trips and bad-input messages.

mod common;

use common::*;
use vramshim_trace::*;

fn sample() -> (Header, Vec<Event>) {
    let h = sample_header();
    let mut ev = sample_prelude();
    ev.extend([Event::Alloc(op(
        5_000_000_200,
        7,
        Api::CudaMalloc,
        0x7f00_0000_0000,
        1 << 20,
    ))]);
    let mut m = op(
        5_000_000_300,
        8,
        Api::CuMemAllocAsync,
        0x7f00_0010_0000,
        4096,
    );
    m.kind = AllocKind::Async;
    m.stream = 0xdead_beef;
    m.device = 1;
    m.flags = flags::PER_THREAD_STREAM;
    m.stack = 1;
    ev.push(Event::Alloc(m));
    let mut f = op(5_000_000_400, 7, Api::CudaFree, 0x7f00_0000_0000, 1 << 20);
    f.result = 0;
    ev.push(Event::Free(f));
    let mut oom = op(5_000_000_500, 7, Api::CudaMalloc, 0, 1 << 40);
    oom.result = codes::OUT_OF_MEMORY;
    oom.flags = flags::CAP_REFUSED;
    ev.push(Event::CapRefusal {
        t_ns: 5_000_000_499,
        tid: 7,
        device: 0,
        api: Api::CudaMalloc,
        size: 1 << 40,
        in_use: 1 << 20,
        cap: 1 << 30,
    });
    ev.push(Event::Alloc(oom));
    ev.push(Event::PoolTrim {
        t_ns: 5_000_000_600,
        device: 0,
        bytes: 2 << 20,
        reason: 1,
    });
    ev.push(Event::Sync {
        t_ns: 5_000_000_700,
        tid: 7,
        device: 0,
        kind: SyncKind::PoolDevice,
        stream: 0,
        latency_ns: 10,
    });
    ev.push(Event::MemInfo {
        t_ns: 5_000_000_800,
        tid: 7,
        api: Api::CudaMemGetInfo,
        device: 0,
        free: 1 << 30,
        total: 2 << 30,
        result: 0,
    });
    ev.push(Event::Fork {
        t_ns: 5_000_000_900,
        child_pid: 99,
    });
    ev.push(Event::Counter {
        t_ns: 5_000_001_000,
        device: 0,
        live_bytes: 4096,
        reserved_bytes: 4096,
        cap: 1 << 30,
    });
    ev.push(Event::Lost {
        t_ns: 5_000_001_100,
        count: 3,
    });
    ev.push(Event::Device(DeviceInfo {
        index: 1,
        name: "Second".into(),
        total_bytes: 8 << 30,
        uuid: Some([0xab; 16]),
    }));
    ev.push(Event::ThreadExit {
        t_ns: 5_000_001_200,
        tid: 7,
    });
    (h, ev)
}

#[test]
fn round_trip_all_variants() {
    let (h, ev) = sample();
    let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
    for (i, e) in ev.iter().enumerate() {
        w.write(e).unwrap();
        if i == 5 {
            w.flush_frame().unwrap();
        }
    }
    let bytes = w.finish().unwrap();
    let mut r = TraceReader::from_reader(&bytes[..]).unwrap();
    assert_eq!(r.header(), &h);
    let got: Vec<Event> = r.by_ref().map(|e| e.unwrap()).collect();
    assert_eq!(got, ev);
    assert_eq!(r.truncation(), None);
    assert_eq!(r.frames_read(), 2);
    assert_eq!(r.end_time(), Some(5_000_001_200));
}

#[test]
fn bad_inputs_one_clear_message() {
    let e = TraceReader::from_reader(&b""[..]).err().unwrap();
    assert_eq!(e.kind, DecodeErrorKind::Empty);
    assert!(e.to_string().contains("empty"));
    let e = TraceReader::from_reader(&b"Thread,Time,Action\n"[..])
        .err()
        .unwrap();
    assert_eq!(e.kind, DecodeErrorKind::NotATrace);
    assert!(e.to_string().contains("not a vramshim trace"));
    let (h, _) = sample();
    let mut bytes = TraceWriter::new(Vec::new(), &h).unwrap().finish().unwrap();
    bytes[14..18].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let e = TraceReader::from_reader(&bytes[..]).err().unwrap();
    assert!(matches!(e.kind, DecodeErrorKind::FutureVersion { .. }));
    assert!(e.to_string().contains("newer"), "{e}");
}
