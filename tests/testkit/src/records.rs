//! Trace records and trace files built by hand, for the tests that state a trace event by
//! event (the analyzer's unit and integration tests build their traces the same way).

use std::path::{Path, PathBuf};

use vramshim_trace::{AllocKind, Api, DeviceInfo, Event, Header, MemOp, TraceWriter};

/// A runtime allocation event of thread 1 on device 0, stream 0, with no stack; tests set what
/// they need on top (`MemOp { tid, ..memop(..) }`).
pub fn memop(t: u64, api: Api, addr: u64, size: u64, result: i32) -> MemOp {
    MemOp {
        t_ns: t,
        tid: 1,
        api,
        kind: AllocKind::Runtime,
        flags: 0,
        device: 0,
        stream: 0,
        addr,
        size,
        result,
        latency_ns: 500,
        stack: 0,
    }
}

/// `events` written as `dir/t.vramtrace`: process 9 on `host`, with one 16 GiB device 0.
pub fn write_trace(dir: &Path, host: &str, events: &[Event]) -> PathBuf {
    let header = Header {
        pid: 9,
        host: host.into(),
        devices: vec![DeviceInfo {
            index: 0,
            name: "dev0".into(),
            total_bytes: 1 << 34,
            uuid: None,
        }],
        ..Default::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    for e in events {
        w.write(e).unwrap();
    }
    let p = dir.join("t.vramtrace");
    std::fs::write(&p, w.finish().unwrap()).unwrap();
    p
}
