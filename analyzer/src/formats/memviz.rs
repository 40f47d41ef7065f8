//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`), both ways.
//!
//! Export: `{"segments": [...], "device_traces": [[entry...] per device], "allocator_settings":
//! {}}`. A trace with tensor-level events (PyTorch's caching allocator) exports PyTorch's own
//! entries for them (`segment_alloc`, `alloc` with the Python frames PyTorch captured,
//! `free_requested` + `free_completed`, `segment_free`, `oom`) in place of the device
//! allocations of its segments, and its segments live at the end with their tensor blocks
//! (and the free gaps between them, `inactive`). Otherwise: Every device allocation becomes `segment_alloc` + `alloc` of the same range, every
//! free `free_requested` + `free_completed` + `segment_free`, an out-of-memory failure `oom`;
//! allocations live at the end appear in `segments` (one segment, one active block each), so
//! MemoryViz's backward replay finds them. Ints are i64 (BININT or 8-byte LONG1), no category.
//!
//! Import: `alloc`/`free_completed` become Alloc/Free; an `alloc` right after a `segment_alloc`
//! of the same range is a plain allocation (that is how we export), any other is pooled and
//! the segments' total becomes the reserved counter.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::path::Path;

use vramshim_trace::{
    AllocKind, Api, Event, Header, MemOp, PyFrame, TorchOp, codes, flags, torch_action as act,
};

use super::pickle::{self, PickleWriter, Value};
use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::source::{Opened, VecSource};
use crate::symbols::{Module, Symbolizer};

struct LiveBlock {
    size: u64,
    stream: u64,
    stack: u32,
}

/// What one pass over the trace learns before writing: devices and the final live set.
type LiveSet = FastMap<(i32, u64), LiveBlock>;

/// The tensor level of a trace (Torch/PyCode/PyStack records): exported in place of the
/// device allocations PyTorch's segments made, with the Python frames PyTorch captured.
#[derive(Default)]
struct TorchLevel {
    devices: BTreeSet<i32>,
    /// Every (device, address) a PyTorch segment started at: its device allocation is
    /// exported as PyTorch's `segment_alloc` instead.
    segment_addrs: BTreeSet<(i32, u64)>,
    codes: FastMap<u32, (String, String)>,
    stacks: FastMap<u32, Vec<PyFrame>>,
    /// Segments and tensor blocks live at the end.
    segments: std::collections::BTreeMap<(i32, u64), u64>,
    blocks: std::collections::BTreeMap<(i32, u64), LiveBlock>,
}

impl TorchLevel {
    fn see(&mut self, op: &TorchOp) {
        self.devices.insert(op.device);
        match op.action {
            act::SEGMENT_ALLOC | act::SEGMENT_MAP => {
                self.segment_addrs.insert((op.device, op.addr));
                self.segments.insert((op.device, op.addr), op.size);
            }
            act::SEGMENT_FREE | act::SEGMENT_UNMAP => {
                self.segments.remove(&(op.device, op.addr));
            }
            act::ALLOC => {
                self.blocks.insert(
                    (op.device, op.addr),
                    LiveBlock {
                        size: op.size,
                        stream: op.stream,
                        stack: op.stack,
                    },
                );
            }
            act::FREE_COMPLETED => {
                self.blocks.remove(&(op.device, op.addr));
            }
            _ => {}
        }
    }

    fn frames<W: Write>(&self, p: &mut PickleWriter<W>, stack: u32) -> io::Result<()> {
        p.list_begin()?;
        for f in self.stacks.get(&stack).map(|v| v.as_slice()).unwrap_or(&[]) {
            let (file, func) = self
                .codes
                .get(&f.code)
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .unwrap_or(("??", "??"));
            p.dict_begin()?;
            p.kv_str("filename", file)?;
            p.kv_int("line", f.line as i64)?;
            p.kv_str("name", func)?;
            p.dict_end()?;
        }
        p.list_end()
    }
}

fn final_state(opened: Opened) -> Result<(Vec<i32>, LiveSet, TorchLevel), InputError> {
    let mut ev_src = opened.events;
    let mut devices = BTreeSet::new();
    let mut live: FastMap<(i32, u64), LiveBlock> = FastMap::default();
    let mut torch = TorchLevel::default();
    while let Some(ev) = ev_src.next_event() {
        match ev? {
            Event::Torch(op) => {
                devices.insert(op.device);
                torch.see(&op);
            }
            Event::PyCode {
                id, file, function, ..
            } => {
                torch.codes.insert(id, (file, function));
            }
            Event::PyStack { id, frames } => {
                torch.stacks.insert(id, frames);
            }
            Event::Alloc(m) if m.kind.is_device() && m.device >= 0 => {
                devices.insert(m.device);
                if m.result == codes::CUDA_SUCCESS && m.addr != 0 {
                    live.insert(
                        (m.device, m.addr),
                        LiveBlock {
                            size: m.size,
                            stream: m.stream,
                            stack: m.stack,
                        },
                    );
                }
            }
            Event::Free(m)
                if m.kind.is_device() && m.device >= 0 && m.result == codes::CUDA_SUCCESS =>
            {
                devices.insert(m.device);
                live.remove(&(m.device, m.addr));
            }
            _ => {}
        }
    }
    // PyTorch's segments are exported from its own events.
    live.retain(|k, _| !torch.segment_addrs.contains(k));
    Ok((devices.into_iter().collect(), live, torch))
}

fn frames<W: Write>(p: &mut PickleWriter<W>, sym: &mut Symbolizer, stack: u32) -> io::Result<()> {
    p.list_begin()?;
    for f in sym.resolved_frames(stack, 64) {
        p.dict_begin()?;
        p.kv_str("filename", f.file.as_deref().unwrap_or(&f.module))?;
        p.kv_int("line", f.line.unwrap_or(0) as i64)?;
        p.kv_str("name", f.function.as_deref().unwrap_or(&f.text))?;
        p.dict_end()?;
    }
    p.list_end()
}

/// Where an entry's frames come from.
enum Frames<'a> {
    None,
    /// A native stack, symbolized.
    Native(&'a mut Symbolizer, u32),
    /// A Python stack PyTorch captured.
    Python(&'a TorchLevel, u32),
}

fn entry<W: Write>(
    p: &mut PickleWriter<W>,
    action: &str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: i64,
    sym: Frames<'_>,
) -> io::Result<()> {
    p.dict_begin()?;
    p.kv_str("action", action)?;
    if action == "oom" {
        p.str("device_free")?;
        p.uint(addr)?;
    } else {
        p.str("addr")?;
        p.uint(addr)?;
    }
    p.str("size")?;
    p.uint(size)?;
    p.str("stream")?;
    p.uint(stream)?;
    p.kv_int("time_us", time_us)?;
    match sym {
        Frames::None => {}
        Frames::Native(s, stack) => {
            p.str("frames")?;
            frames(p, s, stack)?;
        }
        Frames::Python(t, stack) => {
            p.str("frames")?;
            t.frames(p, stack)?;
        }
    }
    p.dict_end()
}

/// Writes the snapshot. `reopen` gives a fresh pass over the trace (one per device, plus one).
pub fn export<W: Write>(
    out: W,
    reopen: &mut dyn FnMut() -> Result<Opened, InputError>,
) -> Result<(W, u64), String> {
    let first = reopen()?;
    let header = first.header.clone();
    let (devices, live, torch) = final_state(first)?;
    let wall_minus_mono = header.start_wall_ns as i128 - header.start_mono_ns as i128;
    let time_us = |t: u64| ((t as i128 + wall_minus_mono) / 1000) as i64;
    let werr = |e: io::Error| e.to_string();
    let mut p = PickleWriter::new(out).map_err(werr)?;
    let mut entries = 0u64;
    p.dict_begin().map_err(werr)?;
    p.str("device_traces").map_err(werr)?;
    p.list_begin().map_err(werr)?;
    let max_dev = devices.iter().copied().max().unwrap_or(-1);
    let mut sym = Symbolizer::default();
    sym.set_trace_start(header.start_wall_ns);
    for dev in 0..=max_dev {
        p.list_begin().map_err(werr)?;
        if devices.contains(&dev) {
            let opened = reopen()?;
            let mut src = opened.events;
            let mut sizes: FastMap<u64, u64> = FastMap::default();
            let mut in_use = 0u64;
            let total = header
                .devices
                .iter()
                .find(|d| d.index == dev)
                .map(|d| d.total_bytes)
                .unwrap_or(0);
            while let Some(ev) = src.next_event() {
                let ev = ev?;
                let r: io::Result<()> = match &ev {
                    Event::Module {
                        base,
                        size,
                        file_offset,
                        path,
                    } => {
                        sym.add_module(Module {
                            base: *base,
                            size: *size,
                            file_offset: *file_offset,
                            path: path.clone(),
                        });
                        Ok(())
                    }
                    Event::Stack { id, frames } => {
                        sym.add_stack(*id, frames.clone());
                        Ok(())
                    }
                    Event::PyCode {
                        id, file, function, ..
                    } => {
                        sym.add_pycode(*id, file, function);
                        Ok(())
                    }
                    Event::Torch(op) if op.device == dev => {
                        let t = time_us(op.t_ns);
                        let name = act::name(op.action);
                        match op.action {
                            act::ALLOC | act::OOM => {
                                entries += 1;
                                let f = Frames::Python(&torch, op.stack);
                                entry(&mut p, name, op.addr, op.size, op.stream, t, f)
                            }
                            act::FREE_COMPLETED => {
                                entries += 2;
                                entry(
                                    &mut p,
                                    "free_requested",
                                    op.addr,
                                    op.size,
                                    op.stream,
                                    t,
                                    Frames::None,
                                )
                                .and_then(|_| {
                                    entry(
                                        &mut p,
                                        name,
                                        op.addr,
                                        op.size,
                                        op.stream,
                                        t,
                                        Frames::None,
                                    )
                                })
                            }
                            act::SEGMENT_ALLOC
                            | act::SEGMENT_FREE
                            | act::SEGMENT_MAP
                            | act::SEGMENT_UNMAP => {
                                entries += 1;
                                entry(&mut p, name, op.addr, op.size, op.stream, t, Frames::None)
                            }
                            _ => Ok(()),
                        }
                    }
                    Event::Alloc(m)
                        if m.device == dev
                            && m.kind.is_device()
                            && torch.segment_addrs.contains(&(dev, m.addr)) =>
                    {
                        Ok(())
                    }
                    Event::Free(m)
                        if m.device == dev
                            && m.kind.is_device()
                            && torch.segment_addrs.contains(&(dev, m.addr)) =>
                    {
                        Ok(())
                    }
                    Event::Alloc(m) if m.device == dev && m.kind.is_device() => {
                        let t = time_us(m.t_ns);
                        if m.result == codes::CUDA_SUCCESS && m.addr != 0 {
                            sizes.insert(m.addr, m.size);
                            in_use += m.size;
                            entries += 2;
                            entry(
                                &mut p,
                                "segment_alloc",
                                m.addr,
                                m.size,
                                m.stream,
                                t,
                                Frames::None,
                            )
                            .and_then(|_| {
                                entry(
                                    &mut p,
                                    "alloc",
                                    m.addr,
                                    m.size,
                                    m.stream,
                                    t,
                                    Frames::Native(&mut sym, m.stack),
                                )
                            })
                        } else if m.result == codes::OUT_OF_MEMORY {
                            entries += 1;
                            let free = total.saturating_sub(in_use);
                            entry(
                                &mut p,
                                "oom",
                                free,
                                m.size,
                                m.stream,
                                t,
                                Frames::Native(&mut sym, m.stack),
                            )
                        } else {
                            Ok(())
                        }
                    }
                    Event::Free(m)
                        if m.device == dev
                            && m.kind.is_device()
                            && m.result == codes::CUDA_SUCCESS =>
                    {
                        match sizes.remove(&m.addr) {
                            Some(size) => {
                                in_use -= size;
                                let t = time_us(m.t_ns);
                                entries += 3;
                                entry(
                                    &mut p,
                                    "free_requested",
                                    m.addr,
                                    size,
                                    m.stream,
                                    t,
                                    Frames::None,
                                )
                                .and_then(|_| {
                                    entry(
                                        &mut p,
                                        "free_completed",
                                        m.addr,
                                        size,
                                        m.stream,
                                        t,
                                        Frames::None,
                                    )
                                })
                                .and_then(|_| {
                                    entry(
                                        &mut p,
                                        "segment_free",
                                        m.addr,
                                        size,
                                        m.stream,
                                        t,
                                        Frames::None,
                                    )
                                })
                            }
                            None => Ok(()),
                        }
                    }
                    _ => Ok(()),
                };
                r.map_err(werr)?;
            }
        }
        p.list_end().map_err(werr)?;
    }
    p.list_end().map_err(werr)?;
    // The final state, in address order.
    let mut blocks: Vec<(&(i32, u64), &LiveBlock)> = live.iter().collect();
    blocks.sort_by_key(|(k, _)| **k);
    p.str("segments").map_err(werr)?;
    p.list_begin().map_err(werr)?;
    for ((dev, addr), b) in blocks {
        let r: io::Result<()> = (|| {
            p.dict_begin()?;
            p.kv_int("device", *dev as i64)?;
            p.str("address")?;
            p.uint(*addr)?;
            for k in [
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
            ] {
                p.str(k)?;
                p.uint(b.size)?;
            }
            p.str("stream")?;
            p.uint(b.stream)?;
            p.kv_str(
                "segment_type",
                if b.size > (1 << 20) { "large" } else { "small" },
            )?;
            p.str("segment_pool_id")?;
            p.tuple_begin()?;
            p.int(0)?;
            p.int(0)?;
            p.tuple_end()?;
            p.str("is_expandable")?;
            p.bool(false)?;
            p.str("frames")?;
            frames(&mut p, &mut sym, b.stack)?;
            p.str("blocks")?;
            p.list_begin()?;
            p.dict_begin()?;
            p.str("address")?;
            p.uint(*addr)?;
            p.str("size")?;
            p.uint(b.size)?;
            p.str("requested_size")?;
            p.uint(b.size)?;
            p.kv_str("state", "active_allocated")?;
            p.str("frames")?;
            frames(&mut p, &mut sym, b.stack)?;
            p.dict_end()?;
            p.list_end()?;
            p.dict_end()
        })();
        r.map_err(werr)?;
    }
    // PyTorch's segments live at the end, with their tensor blocks and the free gaps
    // between them (inactive: PyTorch's cache).
    for (&(dev, addr), &size) in &torch.segments {
        let end = addr.saturating_add(size);
        let blocks: Vec<(u64, &LiveBlock)> = torch
            .blocks
            .range((dev, addr)..(dev, end))
            .map(|(&(_, a), b)| (a, b))
            .collect();
        let allocated: u64 = blocks.iter().map(|(_, b)| b.size).sum();
        let r: io::Result<()> = (|| {
            p.dict_begin()?;
            p.kv_int("device", dev as i64)?;
            p.str("address")?;
            p.uint(addr)?;
            p.str("total_size")?;
            p.uint(size)?;
            for k in ["allocated_size", "active_size", "requested_size"] {
                p.str(k)?;
                p.uint(allocated)?;
            }
            p.str("stream")?;
            p.uint(blocks.first().map_or(0, |(_, b)| b.stream))?;
            p.kv_str(
                "segment_type",
                if size > (1 << 20) { "large" } else { "small" },
            )?;
            p.str("segment_pool_id")?;
            p.tuple_begin()?;
            p.int(0)?;
            p.int(0)?;
            p.tuple_end()?;
            p.str("is_expandable")?;
            p.bool(false)?;
            p.str("frames")?;
            p.list_begin()?;
            p.list_end()?;
            p.str("blocks")?;
            p.list_begin()?;
            let mut at = addr;
            let gap = |p: &mut PickleWriter<W>, from: u64, to: u64| -> io::Result<()> {
                if to > from {
                    p.dict_begin()?;
                    p.str("address")?;
                    p.uint(from)?;
                    p.str("size")?;
                    p.uint(to - from)?;
                    p.str("requested_size")?;
                    p.uint(0)?;
                    p.kv_str("state", "inactive")?;
                    p.dict_end()?;
                }
                Ok(())
            };
            for (a, b) in &blocks {
                gap(&mut p, at, *a)?;
                p.dict_begin()?;
                p.str("address")?;
                p.uint(*a)?;
                p.str("size")?;
                p.uint(b.size)?;
                p.str("requested_size")?;
                p.uint(b.size)?;
                p.kv_str("state", "active_allocated")?;
                p.str("frames")?;
                torch.frames(&mut p, b.stack)?;
                p.dict_end()?;
                at = at.max(a.saturating_add(b.size));
            }
            gap(&mut p, at, end)?;
            p.list_end()?;
            p.dict_end()
        })();
        r.map_err(werr)?;
    }
    p.list_end().map_err(werr)?;
    p.str("allocator_settings").map_err(werr)?;
    p.dict_begin().map_err(werr)?;
    p.kv_str("PYTORCH_CUDA_ALLOC_CONF", "").map_err(werr)?;
    p.str("expandable_segments").map_err(werr)?;
    p.bool(false).map_err(werr)?;
    p.dict_end().map_err(werr)?;
    p.dict_end().map_err(werr)?;
    let w = p.finish().map_err(werr)?;
    Ok((w, entries))
}

/// Reads a snapshot as a trace.
pub fn open(path: &Path) -> Result<(Header, VecSource), InputError> {
    let file = std::fs::File::open(path).map_err(|e| InputError::io(path, &e))?;
    if let Ok(m) = file.metadata()
        && m.is_file()
        && m.len() > pickle::MAX_PICKLE_BYTES
    {
        return Err(InputError::new(
            path,
            None,
            format!(
                "{} bytes: larger than {} GiB, the largest memory snapshot read",
                m.len(),
                pickle::MAX_PICKLE_BYTES >> 30
            ),
        ));
    }
    // Streamed: garbage is refused at its first bytes, and memory stays within the pickle
    // reader's limits however long the input (a pipe, a device) runs.
    let v = pickle::read_from(std::io::BufReader::with_capacity(1 << 16, file)).map_err(|e| {
        InputError::at_offset(
            path,
            e.offset,
            format!("not a readable PyTorch memory snapshot: {}", e.msg),
        )
    })?;
    let events = events_of(path, &v)?;
    let header = Header {
        config: vec![
            ("import.from".into(), "memory-viz".into()),
            (
                "import.file".into(),
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        ],
        ..Header::default()
    };
    Ok((header, VecSource::new(events, vec![])))
}

/// The events of a decoded snapshot, in time order (`path` names it in messages).
pub fn events_of(path: &Path, v: &Value) -> Result<Vec<Event>, InputError> {
    let shape =
        |msg: String| InputError::new(path, None, format!("not a PyTorch memory snapshot: {msg}"));
    let traces = match v {
        Value::Dict(_) => v.get("device_traces").ok_or_else(|| {
            shape("the top-level dict has no 'device_traces' (record with torch.cuda.memory._record_memory_history first)".into())
        })?,
        other => return Err(shape(format!("the top level is a {}, expected a dict", other.type_name()))),
    };
    let traces = traces.as_list().ok_or_else(|| {
        shape(format!(
            "'device_traces' is a {}, expected a list",
            traces.type_name()
        ))
    })?;
    let mut events: Vec<Event> = Vec::new();
    for (dev, tr) in traces.iter().enumerate() {
        let entries = tr.as_list().ok_or_else(|| {
            shape(format!(
                "device_traces[{dev}] is a {}, expected a list",
                tr.type_name()
            ))
        })?;
        let dev = dev as i32;
        let mut plain: FastMap<u64, ()> = FastMap::default();
        let mut reserved: u64 = 0;
        let mut in_use: u64 = 0;
        let mut prev: Option<(&str, u64, u64)> = None;
        let mut pending_seg_free: Option<(u64, u64)> = None;
        for (i, e) in entries.iter().enumerate() {
            let at = |k: &str| format!("device_traces[{dev}][{i}]: {k}");
            if !matches!(e, Value::Dict(_)) {
                return Err(shape(at(&format!(
                    "is a {}, expected a dict",
                    e.type_name()
                ))));
            }
            let action = e
                .get("action")
                .and_then(|a| a.as_str())
                .ok_or_else(|| shape(at("no 'action' string")))?;
            // Addresses are 64-bit values that PyTorch writes as signed: taken as they are.
            let int = |k: &str| -> Result<u64, InputError> {
                e.get(k)
                    .and_then(|x| x.as_int())
                    .map(|x| x as u64)
                    .ok_or_else(|| shape(at(&format!("no integer '{k}'"))))
            };
            let size = match e.get("size").and_then(|x| x.as_int()) {
                Some(s) if s >= 0 => s as u64,
                Some(s) => return Err(shape(at(&format!("negative 'size' {s}")))),
                None => return Err(shape(at("no integer 'size'"))),
            };
            let stream = e.get("stream").and_then(|x| x.as_int()).unwrap_or(0) as u64;
            let t_ns = (e
                .get("time_us")
                .and_then(|x| x.as_int())
                .unwrap_or(0)
                .max(0) as u64)
                .saturating_mul(1000);
            let op = |addr: u64, size: u64| MemOp {
                t_ns,
                tid: 0,
                api: Api::Imported,
                kind: AllocKind::Runtime,
                flags: 0,
                device: dev,
                stream,
                addr,
                size,
                result: codes::CUDA_SUCCESS,
                latency_ns: 0,
                stack: 0,
            };
            let mut counter = false;
            match action {
                "alloc" => {
                    let addr = int("addr")?;
                    let mut m = op(addr, size);
                    if prev == Some(("segment_alloc", addr, size)) {
                        plain.insert(addr, ());
                        // The segment we skipped is this allocation.
                    } else {
                        m.kind = AllocKind::Pool;
                        m.flags = flags::POOLED;
                    }
                    in_use = in_use.checked_add(size).ok_or_else(|| {
                        shape(at("the bytes in use add up past 2^64 (sizes out of range)"))
                    })?;
                    events.push(Event::Alloc(m));
                }
                "free_completed" => {
                    let addr = int("addr")?;
                    let mut m = op(addr, size);
                    if plain.remove(&addr).is_some() {
                        pending_seg_free = Some((addr, size));
                    } else {
                        m.kind = AllocKind::Pool;
                        m.flags = flags::POOLED;
                    }
                    in_use = in_use.saturating_sub(size);
                    events.push(Event::Free(m));
                }
                "free_requested" | "snapshot" => {}
                "segment_alloc" | "segment_map" => {
                    let addr = int("addr")?;
                    // Decided on the next entry: an alloc of the same range makes it plain.
                    let next = entries.get(i + 1);
                    let paired = action == "segment_alloc"
                        && next.and_then(|n| n.get("action")).and_then(|a| a.as_str())
                            == Some("alloc")
                        && next.and_then(|n| n.get("addr")).and_then(|a| a.as_int())
                            == Some(addr as i64)
                        && next.and_then(|n| n.get("size")).and_then(|a| a.as_int())
                            == Some(size as i64);
                    if !paired {
                        reserved = reserved.checked_add(size).ok_or_else(|| {
                            shape(at(
                                "the segments add up past 2^64 bytes (sizes out of range)",
                            ))
                        })?;
                        counter = true;
                    }
                }
                "segment_free" | "segment_unmap" => {
                    let addr = int("addr")?;
                    if pending_seg_free == Some((addr, size)) && action == "segment_free" {
                        pending_seg_free = None;
                    } else {
                        reserved = reserved.saturating_sub(size);
                        counter = true;
                    }
                }
                "oom" => {
                    let mut m = op(0, size);
                    m.result = codes::OUT_OF_MEMORY;
                    events.push(Event::Alloc(m));
                }
                other => return Err(shape(at(&format!("unknown action '{other}'")))),
            }
            if counter {
                events.push(Event::Counter {
                    t_ns,
                    device: dev,
                    live_bytes: in_use,
                    reserved_bytes: reserved,
                    cap: 0,
                });
            }
            prev = Some((
                action,
                e.get("addr").and_then(|x| x.as_int()).unwrap_or(0) as u64,
                size,
            ));
        }
    }
    // Devices interleave in time.
    events.sort_by_key(|e| e.t_ns().unwrap_or(0));
    Ok(events)
}
