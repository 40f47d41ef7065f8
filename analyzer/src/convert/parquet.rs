//! `vramshim export TRACE... --format parquet`: every event of one or many traces as rows of one
//! Parquet file, for SQL engines (DuckDB on one machine, Spark, Trino or DuckDB over object
//! storage across a fleet). One row per timed event; `rank` and `file` say which trace a row
//! came from, `seq` is the event's position in its trace as the analyzer orders it (by time,
//! ties in file order), so `ORDER BY t_ns, seq` within a trace is the order `vramshim summary`
//! sees.
//!
//! Written through the Arrow writer of the `parquet` crate, streamed: rows are built in record
//! batches of [`BATCH_ROWS`] and the writer closes a row group every [`GROUP_ROWS`] rows, so
//! memory stays bounded (a row group's encoded columns, the live table and the call-site names)
//! however long the traces are. The columns are described in `docs/analyzer.md` (export).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Int32Builder, Int64Builder, StringBuilder, TimestampNanosecondBuilder,
    UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use vramshim_trace::{Event, MemOp, SyncKind, codes, flags};

use crate::error::InputError;
use crate::fastmap::FastMap;
use crate::progress::Progress;
use crate::source::Opened;
use crate::symbols::{Module, Symbolizer};

/// Rows per record batch handed to the writer.
pub const BATCH_ROWS: usize = 64 * 1024;
/// Rows per row group (the unit a reader skips or reads in parallel; the writer holds one
/// encoded row group in memory).
pub const GROUP_ROWS: usize = 1 << 20;
/// The schema's version, in the file's key-value metadata (`vramshim.parquet_schema`).
pub const SCHEMA_VERSION: &str = "1";

#[derive(Clone, Debug, Default)]
pub struct ParquetStats {
    pub rows: u64,
    pub files: usize,
    /// Some input was damaged (a torn last frame, a frame that failed its checksum, or damage
    /// after the last good frame; named on stderr as a warning): everything else was exported.
    pub damaged: bool,
}

/// The columns, in file order.
pub fn schema() -> SchemaRef {
    use DataType::*;
    let f = |name: &str, t: DataType, nullable: bool| Field::new(name, t, nullable);
    Arc::new(Schema::new(vec![
        f("rank", Int32, false),
        f("file", Utf8, false),
        f("host", Utf8, false),
        f("pid", Int64, false),
        f("seq", Int64, false),
        f("t_ns", Int64, false),
        f(
            "wall_time",
            Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            true,
        ),
        f("tid", Int64, true),
        f("device", Int32, true),
        f("uuid", Utf8, true),
        f("op", Utf8, false),
        f("api", Utf8, true),
        f("kind", Utf8, true),
        f("addr", UInt64, true),
        f("size", Int64, true),
        f("stream", UInt64, true),
        f("failed", Boolean, false),
        f("result", Int32, true),
        f("flags", Int32, true),
        f("pooled", Boolean, true),
        f("cap_refused", Boolean, true),
        f("latency_ns", Int64, true),
        f("stack", Int64, true),
        f("site", Utf8, true),
        f("in_use", Int64, true),
        f("reserved", Int64, true),
        f("cap", Int64, true),
        f("free_bytes", Int64, true),
        f("total_bytes", Int64, true),
        f("child_pid", Int64, true),
        f("lost", Int64, true),
    ]))
}

/// One row before it goes into the column builders; `None` is SQL NULL.
#[derive(Default)]
struct Row {
    t_ns: u64,
    tid: Option<u32>,
    device: Option<i32>,
    op: &'static str,
    api: Option<&'static str>,
    /// For `call_failed`: the entry point's name, which the trace carries as text.
    api_text: Option<String>,
    kind: Option<&'static str>,
    addr: Option<u64>,
    size: Option<u64>,
    stream: Option<u64>,
    failed: bool,
    result: Option<i32>,
    flags: Option<u8>,
    latency_ns: Option<u32>,
    stack: Option<u32>,
    in_use: Option<u64>,
    reserved: Option<u64>,
    cap: Option<u64>,
    free_bytes: Option<u64>,
    total_bytes: Option<u64>,
    child_pid: Option<u32>,
    lost: Option<u64>,
}

/// Byte counts and times are u64 in the trace; Parquet's signed 64-bit integers (what every SQL
/// engine sums without casts) hold every real value. A value past 2^63-1 (a corrupt or hostile
/// request size) is stored as 2^63-1 rather than wrapping negative.
fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

struct Columns {
    rank: Int32Builder,
    file: StringBuilder,
    host: StringBuilder,
    pid: Int64Builder,
    seq: Int64Builder,
    t_ns: Int64Builder,
    wall_time: TimestampNanosecondBuilder,
    tid: Int64Builder,
    device: Int32Builder,
    uuid: StringBuilder,
    op: StringBuilder,
    api: StringBuilder,
    kind: StringBuilder,
    addr: UInt64Builder,
    size: Int64Builder,
    stream: UInt64Builder,
    failed: BooleanBuilder,
    result: Int32Builder,
    flags: Int32Builder,
    pooled: BooleanBuilder,
    cap_refused: BooleanBuilder,
    latency_ns: Int64Builder,
    stack: Int64Builder,
    site: StringBuilder,
    in_use: Int64Builder,
    reserved: Int64Builder,
    cap: Int64Builder,
    free_bytes: Int64Builder,
    total_bytes: Int64Builder,
    child_pid: Int64Builder,
    lost: Int64Builder,
    len: usize,
}

impl Columns {
    fn new() -> Columns {
        let n = BATCH_ROWS;
        let s = || StringBuilder::with_capacity(n, n * 8);
        Columns {
            rank: Int32Builder::with_capacity(n),
            file: s(),
            host: s(),
            pid: Int64Builder::with_capacity(n),
            seq: Int64Builder::with_capacity(n),
            t_ns: Int64Builder::with_capacity(n),
            wall_time: TimestampNanosecondBuilder::with_capacity(n).with_timezone("UTC"),
            tid: Int64Builder::with_capacity(n),
            device: Int32Builder::with_capacity(n),
            uuid: s(),
            op: s(),
            api: s(),
            kind: s(),
            addr: UInt64Builder::with_capacity(n),
            size: Int64Builder::with_capacity(n),
            stream: UInt64Builder::with_capacity(n),
            failed: BooleanBuilder::with_capacity(n),
            result: Int32Builder::with_capacity(n),
            flags: Int32Builder::with_capacity(n),
            pooled: BooleanBuilder::with_capacity(n),
            cap_refused: BooleanBuilder::with_capacity(n),
            latency_ns: Int64Builder::with_capacity(n),
            stack: Int64Builder::with_capacity(n),
            site: s(),
            in_use: Int64Builder::with_capacity(n),
            reserved: Int64Builder::with_capacity(n),
            cap: Int64Builder::with_capacity(n),
            free_bytes: Int64Builder::with_capacity(n),
            total_bytes: Int64Builder::with_capacity(n),
            child_pid: Int64Builder::with_capacity(n),
            lost: Int64Builder::with_capacity(n),
            len: 0,
        }
    }

    fn push(
        &mut self,
        t: &TraceColumns,
        seq: u64,
        r: &Row,
        uuid: Option<&str>,
        site: Option<&str>,
    ) {
        let o64 = |v: Option<u64>| v.map(i64_of);
        self.rank.append_value(t.rank);
        self.file.append_value(&t.file);
        self.host.append_value(&t.host);
        self.pid.append_value(t.pid);
        self.seq.append_value(i64_of(seq));
        self.t_ns.append_value(i64_of(r.t_ns));
        self.wall_time.append_option(t.wall(r.t_ns));
        self.tid.append_option(r.tid.map(i64::from));
        self.device.append_option(r.device);
        self.uuid.append_option(uuid);
        self.op.append_value(r.op);
        match (&r.api_text, r.api) {
            (Some(s), _) => self.api.append_value(s),
            (None, a) => self.api.append_option(a),
        }
        self.kind.append_option(r.kind);
        self.addr.append_option(r.addr);
        self.size.append_option(o64(r.size));
        self.stream.append_option(r.stream);
        self.failed.append_value(r.failed);
        self.result.append_option(r.result);
        self.flags.append_option(r.flags.map(i32::from));
        self.pooled
            .append_option(r.flags.map(|f| f & flags::POOLED != 0));
        self.cap_refused
            .append_option(r.flags.map(|f| f & flags::CAP_REFUSED != 0));
        self.latency_ns.append_option(r.latency_ns.map(i64::from));
        self.stack.append_option(r.stack.map(i64::from));
        self.site.append_option(site);
        self.in_use.append_option(o64(r.in_use));
        self.reserved.append_option(o64(r.reserved));
        self.cap.append_option(o64(r.cap));
        self.free_bytes.append_option(o64(r.free_bytes));
        self.total_bytes.append_option(o64(r.total_bytes));
        self.child_pid.append_option(r.child_pid.map(i64::from));
        self.lost.append_option(o64(r.lost));
        self.len += 1;
    }

    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, String> {
        let a: Vec<ArrayRef> = vec![
            Arc::new(self.rank.finish()),
            Arc::new(self.file.finish()),
            Arc::new(self.host.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.seq.finish()),
            Arc::new(self.t_ns.finish()),
            Arc::new(self.wall_time.finish()),
            Arc::new(self.tid.finish()),
            Arc::new(self.device.finish()),
            Arc::new(self.uuid.finish()),
            Arc::new(self.op.finish()),
            Arc::new(self.api.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.addr.finish()),
            Arc::new(self.size.finish()),
            Arc::new(self.stream.finish()),
            Arc::new(self.failed.finish()),
            Arc::new(self.result.finish()),
            Arc::new(self.flags.finish()),
            Arc::new(self.pooled.finish()),
            Arc::new(self.cap_refused.finish()),
            Arc::new(self.latency_ns.finish()),
            Arc::new(self.stack.finish()),
            Arc::new(self.site.finish()),
            Arc::new(self.in_use.finish()),
            Arc::new(self.reserved.finish()),
            Arc::new(self.cap.finish()),
            Arc::new(self.free_bytes.finish()),
            Arc::new(self.total_bytes.finish()),
            Arc::new(self.child_pid.finish()),
            Arc::new(self.lost.finish()),
        ];
        self.len = 0;
        RecordBatch::try_new(schema.clone(), a).map_err(|e| format!("parquet export: {e}"))
    }
}

/// What every row of one trace shares.
struct TraceColumns {
    rank: i32,
    file: String,
    host: String,
    pid: i64,
    /// Wall-clock and monotonic anchors from the header (0: none).
    start_wall_ns: u64,
    start_mono_ns: u64,
}

impl TraceColumns {
    fn wall(&self, t_ns: u64) -> Option<i64> {
        if self.start_wall_ns == 0 {
            return None;
        }
        let w = self.start_wall_ns as i128 + t_ns as i128 - self.start_mono_ns as i128;
        i64::try_from(w).ok()
    }
}

/// Per-trace state: the live table (so a free carries the size of the block it freed, as
/// `summary` counts it), device UUIDs and call-site names.
struct TraceState {
    /// (device, address) -> size of the live block.
    live: FastMap<(i32, u64), u64>,
    uuids: FastMap<i32, Rc<str>>,
    symbols: Symbolizer,
    /// Stack id -> the call site's name, as `summary` names it.
    sites: FastMap<u32, Rc<str>>,
}

impl TraceState {
    fn site(&mut self, stack: u32) -> Option<Rc<str>> {
        if stack == 0 {
            return None;
        }
        if let Some(s) = self.sites.get(&stack) {
            return Some(s.clone());
        }
        let s: Rc<str> = self.symbols.label(stack).into();
        self.sites.insert(stack, s.clone());
        Some(s)
    }
}

fn sync_kind(k: SyncKind) -> &'static str {
    match k {
        SyncKind::ProcessDevice => "process_device",
        SyncKind::ProcessStream => "process_stream",
        SyncKind::ProcessEvent => "process_event",
        SyncKind::PoolDevice => "pool_device",
        SyncKind::PoolEvent => "pool_event",
    }
}

fn trim_reason(r: u8) -> &'static str {
    match r {
        0 => "pressure",
        1 => "device_reset",
        2 => "explicit",
        _ => "other",
    }
}

fn mem_row(op: &'static str, m: &MemOp) -> Row {
    Row {
        t_ns: m.t_ns,
        tid: Some(m.tid),
        device: Some(m.device),
        op,
        api: Some(m.api.name()),
        kind: Some(m.kind.name()),
        addr: Some(m.addr),
        size: Some(m.size),
        stream: Some(m.stream),
        result: Some(m.result),
        flags: Some(m.flags),
        latency_ns: Some(m.latency_ns),
        stack: (m.stack != 0).then_some(m.stack),
        ..Row::default()
    }
}

/// The row for `ev`, or `None` for the records that describe rather than happen (modules,
/// stacks, devices: they update `st`).
fn row_of(ev: Event, st: &mut TraceState) -> Option<Row> {
    Some(match ev {
        Event::Alloc(m) => {
            let mut r = mem_row("alloc", &m);
            // As `summary` counts: a call that failed or returned no pointer allocated nothing.
            r.failed = m.result != codes::CUDA_SUCCESS || m.addr == 0;
            if !r.failed {
                st.live.insert((m.device, m.addr), m.size);
            }
            r
        }
        Event::Free(m) => {
            let mut r = mem_row("free", &m);
            r.failed = m.result != codes::CUDA_SUCCESS;
            // The size of the block freed, from the allocation this trace recorded; a free
            // that matches none (or frees NULL) released nothing the trace counted: 0.
            r.size = Some(if r.failed || m.addr == 0 {
                0
            } else {
                st.live.remove(&(m.device, m.addr)).unwrap_or(0)
            });
            r
        }
        Event::CapRefusal {
            t_ns,
            tid,
            device,
            api,
            size,
            in_use,
            cap,
        } => Row {
            t_ns,
            tid: Some(tid),
            device: Some(device),
            op: "cap_refusal",
            api: Some(api.name()),
            size: Some(size),
            in_use: Some(in_use),
            cap: Some(cap),
            failed: true,
            ..Row::default()
        },
        Event::PoolTrim {
            t_ns,
            device,
            bytes,
            reason,
        } => Row {
            t_ns,
            device: Some(device),
            op: "pool_trim",
            kind: Some(trim_reason(reason)),
            size: Some(bytes),
            ..Row::default()
        },
        Event::Sync {
            t_ns,
            tid,
            device,
            kind,
            stream,
            latency_ns,
        } => Row {
            t_ns,
            tid: Some(tid),
            device: Some(device),
            op: "sync",
            kind: Some(sync_kind(kind)),
            stream: Some(stream),
            latency_ns: Some(latency_ns),
            ..Row::default()
        },
        Event::MemInfo {
            t_ns,
            tid,
            api,
            device,
            free,
            total,
            result,
        } => Row {
            t_ns,
            tid: Some(tid),
            device: Some(device),
            op: "mem_info",
            api: Some(api.name()),
            free_bytes: Some(free),
            total_bytes: Some(total),
            result: Some(result),
            failed: result != codes::CUDA_SUCCESS,
            ..Row::default()
        },
        Event::ThreadStart { t_ns, tid } => Row {
            t_ns,
            tid: Some(tid),
            op: "thread_start",
            ..Row::default()
        },
        Event::ThreadExit { t_ns, tid } => Row {
            t_ns,
            tid: Some(tid),
            op: "thread_exit",
            ..Row::default()
        },
        Event::Fork { t_ns, child_pid } => Row {
            t_ns,
            op: "fork",
            child_pid: Some(child_pid),
            ..Row::default()
        },
        Event::Counter {
            t_ns,
            device,
            live_bytes,
            reserved_bytes,
            cap,
        } => Row {
            t_ns,
            device: Some(device),
            op: "counter",
            in_use: Some(live_bytes),
            reserved: Some(reserved_bytes),
            cap: Some(cap),
            ..Row::default()
        },
        // the pool's own figures: what it holds (reserved) against what is live; the rest
        // (cached, pending, budget, releases) is in the trace and `summary`
        Event::PoolStats {
            t_ns,
            device,
            reserved,
            live,
            ..
        } => Row {
            t_ns,
            device: Some(device),
            op: "pool_stats",
            in_use: Some(live),
            reserved: Some(reserved),
            ..Row::default()
        },
        Event::StreamDestroy {
            t_ns,
            tid,
            device,
            stream,
        } => Row {
            t_ns,
            tid: Some(tid),
            device: (device >= 0).then_some(device),
            op: "stream_destroy",
            stream: Some(stream),
            ..Row::default()
        },
        Event::Lost { t_ns, count } => Row {
            t_ns,
            op: "lost",
            lost: Some(count),
            ..Row::default()
        },
        Event::CallFailed {
            t_ns,
            tid,
            device,
            name,
            result,
        } => Row {
            t_ns,
            tid: Some(tid),
            device: (device >= 0).then_some(device),
            op: "call_failed",
            api_text: Some(name),
            result: Some(result),
            failed: true,
            ..Row::default()
        },
        Event::Module {
            base,
            size,
            file_offset,
            path,
        } => {
            st.symbols.add_module(Module {
                base,
                size,
                file_offset,
                path,
            });
            // A new module can name frames that were addresses before.
            st.sites.clear();
            return None;
        }
        // PyTorch's caching allocator's own events (tensors carved from its segments): their
        // own op, so that sums over `alloc`/`free` rows stay the device's.
        Event::Torch(t) => Row {
            t_ns: t.t_ns,
            tid: Some(t.tid),
            device: Some(t.device),
            op: "torch",
            kind: Some(vramshim_trace::event::torch_action::name(t.action)),
            addr: Some(t.addr),
            size: Some(t.size),
            stream: Some(t.stream),
            ..Row::default()
        },
        Event::PyCode {
            id, file, function, ..
        } => {
            st.symbols.add_pycode(id, &file, &function);
            return None;
        }
        Event::PyStack { .. } => return None,
        Event::Stack { id, frames } => {
            st.symbols.add_stack(id, frames);
            st.sites.remove(&id);
            return None;
        }
        Event::Device(d) => {
            if let Some(u) = d.uuid_text() {
                st.uuids.insert(d.index, u.into());
            }
            return None;
        }
    })
}

/// Writes every event of `traces` (in that order: `rank` is the position in the list) as one
/// Parquet file into `w`; `open` opens each (`input::open`: the readers stand below the
/// opening by format).
pub fn export<W: Write + Send>(
    traces: &[PathBuf],
    open: &mut dyn FnMut(&Path) -> Result<Opened, InputError>,
    w: W,
    out_name: &Path,
) -> Result<ParquetStats, String> {
    let schema = schema();
    let col = |name: &str| schema.index_of(name).map(|i| i as i32).unwrap_or(0);
    // Columns of (nearly) unique values are not dictionary-encoded (the writer would hash
    // every value into a dictionary it then abandons); the counters of time and order are
    // delta-encoded (consecutive rows differ by little).
    let mut props = WriterProperties::builder();
    for name in [
        "seq",
        "t_ns",
        "wall_time",
        "addr",
        "stream",
        "latency_ns",
        "in_use",
        "reserved",
        "free_bytes",
        "total_bytes",
    ] {
        props = props.set_column_dictionary_enabled(ColumnPath::from(name), false);
    }
    for name in ["seq", "t_ns", "wall_time"] {
        props = props.set_column_encoding(ColumnPath::from(name), Encoding::DELTA_BINARY_PACKED);
    }
    let props = props
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).map_err(|e| format!("parquet export: {e}"))?,
        ))
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_sorting_columns(Some(vec![
            SortingColumn {
                column_idx: col("rank"),
                descending: false,
                nulls_first: false,
            },
            SortingColumn {
                column_idx: col("seq"),
                descending: false,
                nulls_first: false,
            },
        ]))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            "vramshim.parquet_schema".to_string(),
            SCHEMA_VERSION.to_string(),
        )]))
        .build();
    let write_err =
        |e: parquet::errors::ParquetError| format!("{}: cannot write: {e}", out_name.display());
    let mut writer = ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(write_err)?;
    let mut cols = Columns::new();
    let mut stats = ParquetStats::default();
    for (rank, path) in traces.iter().enumerate() {
        let mut opened = open(path)?;
        let h = &opened.header;
        let tc = TraceColumns {
            rank: i32::try_from(rank).unwrap_or(i32::MAX),
            file: path.display().to_string(),
            host: h.host.clone(),
            pid: i64::from(h.pid),
            start_wall_ns: h.start_wall_ns,
            start_mono_ns: h.start_mono_ns,
        };
        let mut st = TraceState {
            live: FastMap::default(),
            uuids: FastMap::default(),
            symbols: Symbolizer::default(),
            sites: FastMap::default(),
        };
        st.symbols.set_trace_start(h.start_wall_ns);
        for d in &h.devices {
            if let Some(u) = d.uuid_text() {
                st.uuids.insert(d.index, u.into());
            }
        }
        let mut progress = Progress::new(&format!("reading {}", path.display()), opened.len);
        let mut seq = 0u64;
        while let Some(ev) = opened.events.next_event() {
            let Some(r) = row_of(ev?, &mut st) else {
                continue;
            };
            let uuid = r.device.and_then(|d| st.uuids.get(&d).cloned());
            let site = r.stack.and_then(|s| st.site(s));
            cols.push(&tc, seq, &r, uuid.as_deref(), site.as_deref());
            seq += 1;
            if cols.len == BATCH_ROWS {
                writer.write(&cols.finish(&schema)?).map_err(write_err)?;
                progress.update(opened.events.position());
            }
        }
        progress.finish();
        for w in opened.events.warnings() {
            eprintln!("warning: {w}");
        }
        stats.damaged |= opened.events.damaged();
        stats.rows += seq;
        stats.files += 1;
    }
    if cols.len > 0 {
        writer.write(&cols.finish(&schema)?).map_err(write_err)?;
    }
    // The footer, then everything down to the file: a write error is reported, not dropped.
    let mut inner = writer.into_inner().map_err(write_err)?;
    inner
        .flush()
        .map_err(|e| crate::error::write_error(out_name, &e))?;
    Ok(stats)
}
