//! Perfetto's protobuf trace format, hand-encoded (no protoc): a process track, a counter
//! track per device for in-use, reserved and cap bytes, a track per thread with a slice per
//! call (an instant when the call's latency is unknown), and instants for refusals and OOMs.
//!
//! Field numbers (protos/perfetto/trace/): Trace.packet = 1; TracePacket.timestamp = 8,
//! trusted_packet_sequence_id = 10, track_event = 11, track_descriptor = 60;
//! TrackDescriptor.uuid = 1, name = 2, process = 3, thread = 4, parent_uuid = 5, counter = 8;
//! ProcessDescriptor.pid = 1, process_name = 6; ThreadDescriptor.pid = 1, tid = 2,
//! thread_name = 5; CounterDescriptor.unit = 3 (UNIT_SIZE_BYTES = 3); TrackEvent.type = 9
//! (SLICE_BEGIN 1, SLICE_END 2, INSTANT 3, COUNTER 4), track_uuid = 11, name = 23,
//! counter_value = 30, debug_annotations = 4; DebugAnnotation.name = 10, uint_value = 3,
//! int_value = 4, string_value = 6.
//!
//! An allocation with a recorded stack carries its call site (the first frame outside CUDA and
//! vramshim, symbolized as `vramshim summary` does) as a `site` string annotation.

use std::io::{self, Write};

use vramshim_trace::{Event, Header, codes};

use super::InUse;
use crate::fastmap::FastMap;
use crate::symbols::{Module, Symbolizer};

pub const PROCESS_UUID: u64 = 1;
const THREAD_BASE: u64 = 1 << 32;
const COUNTER_BASE: u64 = 2 << 32;
const SEQ: u64 = 1;

/// A protobuf message being built.
#[derive(Default)]
pub struct Msg(pub Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        self.varint((field as u64) << 3);
        self.varint(v);
        self
    }
    pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }
    pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.varint(((field as u64) << 3) | 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }
    pub fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

pub struct PerfettoWriter<W: Write> {
    w: W,
    pid: u32,
    threads: FastMap<u32, ()>,
    devices: FastMap<i32, ()>,
    in_use: InUse,
    symbols: Symbolizer,
    sites: FastMap<u32, String>,
    pub packets: u64,
}

fn annotation(name: &str, field: u32, v: u64) -> Msg {
    let mut a = Msg::default();
    a.str(10, name).uint(field, v);
    a
}

impl<W: Write> PerfettoWriter<W> {
    pub fn new(w: W, h: &Header) -> io::Result<Self> {
        let mut p = PerfettoWriter {
            w,
            pid: h.pid,
            threads: FastMap::default(),
            devices: FastMap::default(),
            in_use: InUse::default(),
            symbols: Symbolizer::default(),
            sites: FastMap::default(),
            packets: 0,
        };
        p.symbols.set_trace_start(h.start_wall_ns);
        let name = if h.cmdline.is_empty() {
            format!("pid {}", h.pid)
        } else {
            h.cmdline.join(" ")
        };
        let mut proc_ = Msg::default();
        proc_.uint(1, h.pid as u64).str(6, &name);
        let mut td = Msg::default();
        td.uint(1, PROCESS_UUID).msg(3, &proc_);
        p.descriptor(&td)?;
        Ok(p)
    }

    fn packet(&mut self, pkt: &Msg) -> io::Result<()> {
        let mut outer = Msg::default();
        outer.msg(1, pkt);
        self.packets += 1;
        self.w.write_all(&outer.0)
    }

    fn descriptor(&mut self, td: &Msg) -> io::Result<()> {
        let mut pkt = Msg::default();
        pkt.uint(10, SEQ).msg(60, td);
        self.packet(&pkt)
    }

    fn track_event(&mut self, t: u64, te: &Msg) -> io::Result<()> {
        let mut pkt = Msg::default();
        pkt.uint(8, t).uint(10, SEQ).msg(11, te);
        self.packet(&pkt)
    }

    fn thread(&mut self, tid: u32) -> io::Result<u64> {
        let uuid = THREAD_BASE + tid as u64;
        if self.threads.insert(tid, ()).is_none() {
            let mut th = Msg::default();
            th.uint(1, self.pid as u64)
                .uint(2, tid as u64)
                .str(5, &format!("tid {tid}"));
            let mut td = Msg::default();
            td.uint(1, uuid).uint(5, PROCESS_UUID).msg(4, &th);
            self.descriptor(&td)?;
        }
        Ok(uuid)
    }

    /// Counter track uuid for (device, which): 0 = in use, 1 = reserved, 2 = cap.
    fn counter(&mut self, device: i32, which: u64) -> io::Result<u64> {
        let base = COUNTER_BASE + ((device as i64 + 1) as u64) * 4;
        if self.devices.insert(device, ()).is_none() {
            for (i, what) in ["in use", "reserved", "cap"].iter().enumerate() {
                let mut cd = Msg::default();
                cd.uint(3, 3);
                let mut td = Msg::default();
                let dev = if device < 0 {
                    "host".to_string()
                } else {
                    format!("dev{device}")
                };
                td.uint(1, base + i as u64)
                    .str(2, &format!("{dev} {what}"))
                    .uint(5, PROCESS_UUID)
                    .msg(8, &cd);
                self.descriptor(&td)?;
            }
        }
        Ok(base + which)
    }

    fn counter_value(&mut self, t: u64, device: i32, which: u64, v: u64) -> io::Result<()> {
        let uuid = self.counter(device, which)?;
        let mut te = Msg::default();
        te.uint(9, 4).uint(11, uuid).int(30, v as i64);
        self.track_event(t, &te)
    }

    fn instant(&mut self, t: u64, track: u64, name: &str, ann: &[Msg]) -> io::Result<()> {
        let mut te = Msg::default();
        te.uint(9, 3).uint(11, track).str(23, name);
        for a in ann {
            te.msg(4, a);
        }
        self.track_event(t, &te)
    }

    pub fn event(&mut self, ev: &Event) -> io::Result<()> {
        match ev {
            Event::Alloc(m) | Event::Free(m) => {
                let is_alloc = matches!(ev, Event::Alloc(_));
                let track = self.thread(m.tid)?;
                let mut ann = vec![
                    annotation("size", 3, m.size),
                    annotation("addr", 3, m.addr),
                    annotation("stream", 3, m.stream),
                    annotation("device", 4, m.device as i64 as u64),
                    annotation("result", 4, m.result as i64 as u64),
                ];
                if is_alloc && m.stack != 0 {
                    let sym = &mut self.symbols;
                    let site = self
                        .sites
                        .entry(m.stack)
                        .or_insert_with(|| sym.label(m.stack));
                    let mut a = Msg::default();
                    a.str(10, "site").str(6, site);
                    ann.push(a);
                }
                let mut te = Msg::default();
                te.uint(9, if m.latency_ns > 0 { 1 } else { 3 })
                    .uint(11, track)
                    .str(23, m.api.name());
                te.str(22, if is_alloc { "alloc" } else { "free" });
                for a in &ann {
                    te.msg(4, a);
                }
                self.track_event(m.t_ns, &te)?;
                if m.latency_ns > 0 {
                    let mut end = Msg::default();
                    end.uint(9, 2).uint(11, track);
                    self.track_event(m.t_ns + m.latency_ns as u64, &end)?;
                }
                if m.result != codes::CUDA_SUCCESS || !m.kind.is_device() {
                    if is_alloc && m.result == codes::OUT_OF_MEMORY {
                        self.instant(
                            m.t_ns,
                            PROCESS_UUID,
                            "out of memory",
                            &[annotation("size", 3, m.size)],
                        )?;
                    }
                    return Ok(());
                }
                let Some(v) = self.in_use.apply(m, is_alloc) else {
                    return Ok(());
                };
                self.counter_value(m.t_ns, m.device, 0, v)?;
            }
            Event::Counter {
                t_ns,
                device,
                reserved_bytes,
                cap,
                ..
            } => {
                self.counter_value(*t_ns, *device, 1, *reserved_bytes)?;
                if *cap > 0 {
                    self.counter_value(*t_ns, *device, 2, *cap)?;
                }
            }
            Event::CapRefusal {
                t_ns,
                size,
                in_use,
                cap,
                ..
            } => {
                let ann = [
                    annotation("size", 3, *size),
                    annotation("in_use", 3, *in_use),
                    annotation("cap", 3, *cap),
                ];
                self.instant(*t_ns, PROCESS_UUID, "cap refusal", &ann)?;
            }
            Event::Sync {
                t_ns,
                tid,
                latency_ns,
                ..
            } => {
                let track = self.thread(*tid)?;
                let mut te = Msg::default();
                te.uint(9, if *latency_ns > 0 { 1 } else { 3 })
                    .uint(11, track)
                    .str(23, "sync");
                self.track_event(*t_ns, &te)?;
                if *latency_ns > 0 {
                    let mut end = Msg::default();
                    end.uint(9, 2).uint(11, track);
                    self.track_event(t_ns + *latency_ns as u64, &end)?;
                }
            }
            Event::Module {
                base,
                size,
                file_offset,
                path,
            } => self.symbols.add_module(Module {
                base: *base,
                size: *size,
                file_offset: *file_offset,
                path: path.clone(),
            }),
            Event::Stack { id, frames } => {
                // A stack id is written once per process; a forked child's file starts over.
                self.sites.remove(id);
                self.symbols.add_stack(*id, frames.clone());
            }
            Event::PyCode {
                id, file, function, ..
            } => self.symbols.add_pycode(*id, file, function),
            _ => {}
        }
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}
