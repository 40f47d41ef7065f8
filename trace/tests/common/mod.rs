//! Shared strategies and fixtures for the trace tests; traces of raw records or encoded
//! buffers ([`frames`]).
#![allow(dead_code)]

pub mod frames;

use proptest::prelude::*;
use vramshim_trace::*;

pub fn api() -> impl Strategy<Value = Api> {
    proptest::sample::select(Api::ALL.to_vec())
}

pub fn kind() -> impl Strategy<Value = AllocKind> {
    proptest::sample::select(AllocKind::ALL.to_vec())
}

pub fn sync_kind() -> impl Strategy<Value = SyncKind> {
    (0u8..5).prop_map(|v| SyncKind::from_u8(v).unwrap())
}

/// Mostly "realistic" values, sometimes extremes.
fn u64v() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..4096,
        any::<u64>(),
        Just(u64::MAX),
        0x7f00_0000_0000u64..0x7f10_0000_0000
    ]
}

fn i32v() -> impl Strategy<Value = i32> {
    prop_oneof![-1i32..8, any::<i32>()]
}

pub fn memop() -> impl Strategy<Value = MemOp> {
    (
        (
            u64v(),
            prop_oneof![1u32..4, any::<u32>()],
            api(),
            kind(),
            any::<u8>(),
            i32v(),
        ),
        (
            u64v(),
            u64v(),
            u64v(),
            prop_oneof![Just(0i32), any::<i32>()],
            any::<u32>(),
            prop_oneof![Just(0u32), any::<u32>()],
        ),
    )
        .prop_map(
            |(
                (t_ns, tid, api, kind, flags, device),
                (stream, addr, size, result, latency_ns, stack),
            )| MemOp {
                t_ns,
                tid,
                api,
                kind,
                flags,
                device,
                stream,
                addr,
                size,
                result,
                latency_ns,
                stack,
            },
        )
}

pub fn string() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z/._-]{0,40}", any::<String>()]
}

pub fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => memop().prop_map(Event::Alloc),
        4 => memop().prop_map(Event::Free),
        1 => (u64v(), any::<u32>(), i32v(), api(), u64v(), u64v(), u64v()).prop_map(
            |(t_ns, tid, device, api, size, in_use, cap)| Event::CapRefusal { t_ns, tid, device, api, size, in_use, cap }
        ),
        1 => (u64v(), i32v(), u64v(), any::<u8>()).prop_map(|(t_ns, device, bytes, reason)| Event::PoolTrim { t_ns, device, bytes, reason }),
        1 => (u64v(), any::<u32>(), i32v(), sync_kind(), u64v(), any::<u32>()).prop_map(
            |(t_ns, tid, device, kind, stream, latency_ns)| Event::Sync { t_ns, tid, device, kind, stream, latency_ns }
        ),
        1 => (u64v(), any::<u32>(), api(), i32v(), u64v(), u64v(), any::<i32>()).prop_map(
            |(t_ns, tid, api, device, free, total, result)| Event::MemInfo { t_ns, tid, api, device, free, total, result }
        ),
        1 => (u64v(), any::<u32>()).prop_map(|(t_ns, tid)| Event::ThreadStart { t_ns, tid }),
        1 => (u64v(), any::<u32>()).prop_map(|(t_ns, tid)| Event::ThreadExit { t_ns, tid }),
        1 => (u64v(), any::<u32>()).prop_map(|(t_ns, child_pid)| Event::Fork { t_ns, child_pid }),
        1 => (u64v(), u64v(), u64v(), string()).prop_map(|(base, size, file_offset, path)| Event::Module { base, size, file_offset, path }),
        1 => (any::<u32>(), proptest::collection::vec(u64v(), 0..40)).prop_map(|(id, frames)| Event::Stack { id, frames }),
        1 => (u64v(), i32v(), u64v(), u64v(), u64v()).prop_map(
            |(t_ns, device, live_bytes, reserved_bytes, cap)| Event::Counter { t_ns, device, live_bytes, reserved_bytes, cap }
        ),
        1 => (u64v(), i32v(), (u64v(), u64v(), u64v()), (u64v(), u64v(), u64v())).prop_map(
            |(t_ns, device, (reserved, live, cached), (pending, budget, releases))| Event::PoolStats { t_ns, device, reserved, live, cached, pending, budget, releases }
        ),
        1 => (u64v(), any::<u32>(), i32v(), u64v()).prop_map(|(t_ns, tid, device, stream)| Event::StreamDestroy { t_ns, tid, device, stream }),
        1 => (u64v(), u64v()).prop_map(|(t_ns, count)| Event::Lost { t_ns, count }),
        1 => (u64v(), any::<u32>(), i32v(), string(), any::<i32>()).prop_map(|(t_ns, tid, device, name, result)| Event::CallFailed { t_ns, tid, device, name, result }),
        1 => (i32v(), string(), u64v(), proptest::option::of(any::<[u8; 16]>())).prop_map(|(index, name, total_bytes, uuid)| Event::Device(DeviceInfo { index, name, total_bytes, uuid })),
        1 => (u64v(), any::<u32>(), any::<u8>(), i32v(), (u64v(), u64v(), u64v(), u64v()), any::<u32>()).prop_map(
            |(t_ns, tid, action, device, (addr, size, stream, segment), stack)| Event::Torch(TorchOp { t_ns, tid, action, device, addr, size, stream, segment, stack })
        ),
        1 => (any::<u32>(), string(), string(), any::<u32>()).prop_map(|(id, file, function, first_line)| Event::PyCode { id, file, function, first_line }),
        1 => (any::<u32>(), proptest::collection::vec((any::<u32>(), any::<u32>()), 0..40)).prop_map(
            |(id, f)| Event::PyStack { id, frames: f.into_iter().map(|(code, line)| PyFrame { code, line }).collect() }
        ),
    ]
}

pub fn header() -> impl Strategy<Value = Header> {
    (
        any::<u32>(),
        any::<u32>(),
        string(),
        proptest::collection::vec(string(), 0..5),
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec((i32v(), string(), u64v()), 0..4),
        proptest::collection::vec((string(), string()), 0..4),
    )
        .prop_map(|(pid, ppid, host, cmdline, w, m, devs, config)| Header {
            format_version: FORMAT_VERSION,
            pid,
            ppid,
            host,
            cmdline,
            start_wall_ns: w,
            start_mono_ns: m,
            devices: devs
                .into_iter()
                .map(|(index, name, total_bytes)| DeviceInfo {
                    index,
                    name,
                    total_bytes,
                    // The header's device list has no UUID field.
                    uuid: None,
                })
                .collect(),
            config,
        })
}

pub fn op(t: u64, tid: u32, api: Api, addr: u64, size: u64) -> MemOp {
    MemOp {
        t_ns: t,
        tid,
        api,
        kind: AllocKind::Runtime,
        flags: 0,
        device: 0,
        stream: 0,
        addr,
        size,
        result: 0,
        latency_ns: 500,
        stack: 0,
    }
}

/// A PyTorch allocator event of thread `tid` on device 0, stream 0.
pub fn torch_event(
    t_ns: u64,
    tid: u32,
    action: u8,
    addr: u64,
    size: u64,
    segment: u64,
    stack: u32,
) -> Event {
    Event::Torch(TorchOp {
        t_ns,
        tid,
        action,
        device: 0,
        addr,
        size,
        stream: 0,
        segment,
        stack,
    })
}

/// A small trace with every record type, in several frames.
/// The header every sample trace of these tests carries.
pub fn sample_header() -> Header {
    Header {
        format_version: FORMAT_VERSION,
        pid: 1234,
        ppid: 1,
        host: "node1".into(),
        cmdline: vec!["python".into(), "train.py".into()],
        start_wall_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 5_000_000_000,
        devices: vec![DeviceInfo {
            index: 0,
            name: "Simulated GPU".into(),
            total_bytes: 16 << 30,
            uuid: None,
        }],
        config: vec![("VRAMSHIM_TRACE".into(), "t.vramtrace".into())],
    }
}

/// The records a sample trace starts with: a thread, the module map and one stack.
pub fn sample_prelude() -> Vec<Event> {
    vec![
        Event::ThreadStart {
            t_ns: 5_000_000_100,
            tid: 7,
        },
        Event::Module {
            base: 0x5555_0000_0000,
            size: 4096,
            file_offset: 0,
            path: "/bin/app".into(),
        },
        Event::Stack {
            id: 1,
            frames: vec![0x5555_0000_1234, 0x5555_0000_0042, 0x7fff_0000_0000],
        },
    ]
}

pub fn small_trace() -> (Header, Vec<Event>, Vec<u8>) {
    let h = sample_header();
    let mut ev = sample_prelude();
    let mut t = 5_000_000_200;
    for i in 0..6u64 {
        let mut m = op(
            t,
            7,
            Api::CudaMalloc,
            0x7f00_0000_0000 + i * 0x10_0000,
            (i + 1) << 20,
        );
        m.stack = 1;
        ev.push(Event::Alloc(m));
        t += 150;
    }
    let mut m = op(t, 8, Api::CuMemAllocAsync, 0x7f00_1000_0000, 4096);
    m.kind = AllocKind::Async;
    m.stream = 0xdead_beef;
    m.device = 1;
    m.flags = flags::PER_THREAD_STREAM;
    ev.push(Event::Alloc(m));
    for i in 0..6u64 {
        ev.push(Event::Free(op(
            t + 100 * i,
            7,
            Api::CudaFree,
            0x7f00_0000_0000 + i * 0x10_0000,
            (i + 1) << 20,
        )));
    }
    t += 1000;
    let mut oom = op(t, 7, Api::CudaMalloc, 0, 1 << 40);
    oom.result = codes::OUT_OF_MEMORY;
    oom.flags = flags::CAP_REFUSED;
    ev.push(Event::CapRefusal {
        t_ns: t,
        tid: 7,
        device: 0,
        api: Api::CudaMalloc,
        size: 1 << 40,
        in_use: 1 << 20,
        cap: 1 << 30,
    });
    ev.push(Event::Alloc(oom));
    ev.push(Event::PoolTrim {
        t_ns: t + 100,
        device: 0,
        bytes: 2 << 20,
        reason: 1,
    });
    ev.push(Event::Sync {
        t_ns: t + 200,
        tid: 7,
        device: 0,
        kind: SyncKind::PoolDevice,
        stream: 0,
        latency_ns: 10,
    });
    ev.push(Event::MemInfo {
        t_ns: t + 300,
        tid: 7,
        api: Api::CudaMemGetInfo,
        device: 0,
        free: 1 << 30,
        total: 2 << 30,
        result: 0,
    });
    ev.push(Event::Fork {
        t_ns: t + 400,
        child_pid: 99,
    });
    ev.push(Event::Counter {
        t_ns: t + 500,
        device: 0,
        live_bytes: 4096,
        reserved_bytes: 4096,
        cap: 1 << 30,
    });
    ev.push(Event::Lost {
        t_ns: t + 600,
        count: 3,
    });
    ev.push(Event::Device(DeviceInfo {
        index: 1,
        name: "Second".into(),
        total_bytes: 8 << 30,
        uuid: None,
    }));
    ev.push(Event::ThreadExit {
        t_ns: t + 700,
        tid: 7,
    });
    // Both frame layouts: columnar first (forced: the frames are small), then rows.
    let mut w = TraceWriter::new(Vec::new(), &h).unwrap();
    w.set_layout(FrameLayout::Columnar);
    for (i, e) in ev.iter().enumerate() {
        w.write(e).unwrap();
        if i % 8 == 7 {
            w.flush_frame().unwrap();
            if i >= 16 {
                w.set_layout(FrameLayout::Rows);
            }
        }
    }
    let bytes = w.finish().unwrap();
    (h, ev, bytes)
}

/// Header, events, recoverable errors, truncation.
pub type ReadAll = (Header, Vec<Event>, Vec<DecodeError>, Option<Truncation>);

/// Reads everything: events, errors, truncation.
pub fn read_all(bytes: &[u8]) -> Result<ReadAll, DecodeError> {
    let mut r = TraceReader::from_reader(bytes)?;
    let mut evs = Vec::new();
    let mut errs = Vec::new();
    let mut ev = Event::Lost { t_ns: 0, count: 0 };
    let mut guard = 0usize;
    loop {
        guard += 1;
        assert!(guard < 10_000_000, "reader does not terminate");
        match r.next_into(&mut ev) {
            Ok(true) => evs.push(ev.clone()),
            Ok(false) => break,
            Err(e) => {
                let fatal = !e.is_recoverable();
                errs.push(e);
                if fatal {
                    // After a fatal error the reader must report the end.
                    assert!(!r.next_into(&mut ev).unwrap_or(true));
                    break;
                }
            }
        }
    }
    Ok((r.header().clone(), evs, errs, r.truncation().cloned()))
}

/// What a visitor of a trace's frames ([`TraceReader::visit_frame`]) is given, in order, as
/// events.
pub struct Visited(pub Vec<Event>);

impl Visitor for Visited {
    fn memop(&mut self, alloc: bool, m: &MemOp) {
        self.0.push(if alloc {
            Event::Alloc(m.clone())
        } else {
            Event::Free(m.clone())
        });
    }
    fn event(&mut self, ev: Event) {
        self.0.push(ev);
    }
}

/// Every event of `bytes` read frame by frame through [`Visited`]: a frame the reader reports
/// damaged (a recoverable error) is passed over when `skip_damaged`; any other error, or any
/// error at all without `skip_damaged`, fails the test.
pub fn visit_all(bytes: &[u8], skip_damaged: bool) -> Vec<Event> {
    let mut r = TraceReader::from_reader(bytes).unwrap();
    let mut c = Visited(Vec::new());
    loop {
        match r.visit_frame(&mut c) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) if skip_damaged && e.is_recoverable() => {}
            Err(e) => panic!("{e}"),
        }
    }
    c.0
}

/// MemOps drawn from a few values per field, as a real stream repeats them: most records then
/// carry no context field (the decoder's one-test path), and api/kind 0 (`Unknown`/`Runtime`,
/// the slot's initial values, written without a field) follow other values across resets.
pub fn repetitive_memop() -> impl Strategy<Value = Event> {
    (
        (
            any::<bool>(),
            0u64..1_000_000,
            1u32..3,
            proptest::sample::select(vec![Api::Unknown, Api::CudaMalloc, Api::CudaFreeAsync]),
            proptest::sample::select(vec![AllocKind::Runtime, AllocKind::Pool]),
            proptest::sample::select(vec![0u8, 4]),
        ),
        (
            0i32..2,
            proptest::sample::select(vec![0u64, 7]),
            0x7f00_0000_0000u64..0x7f00_0000_4000,
            0u64..4096,
            prop_oneof![8 => Just(0i32), 1 => Just(2i32)],
            0u32..3000,
            0u32..3,
        ),
    )
        .prop_map(
            |(
                (alloc, t_ns, tid, api, kind, flags),
                (device, stream, addr, size, result, latency_ns, stack),
            )| {
                let m = MemOp {
                    t_ns,
                    tid,
                    api,
                    kind,
                    flags,
                    device,
                    stream,
                    addr: addr & !0xff,
                    size,
                    result,
                    latency_ns,
                    stack,
                };
                if alloc {
                    Event::Alloc(m)
                } else {
                    Event::Free(m)
                }
            },
        )
}
