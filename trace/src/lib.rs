//! The `.vramtrace` event model and its encoding. No CUDA, and no FFI outside
//! [`output_file`] (the safe opening of the files vramshim writes, shared by the interposer
//! and the analyzer): the interposer produces these values, the analyzer consumes them, and
//! the file format in `docs/trace-format.md` is the only contract between the two.
//!
//! # Writing
//!
//! ```
//! use vramshim_trace::*;
//! let header = Header { pid: 42, host: "node1".into(), ..Default::default() };
//! let mut w = TraceWriter::new(Vec::new(), &header)?;
//! w.write(&Event::Alloc(MemOp {
//!     t_ns: 1_000, tid: 7, api: Api::CudaMalloc, kind: AllocKind::Runtime, flags: 0,
//!     device: 0, stream: 0, addr: 0x7f00_0000_0000, size: 1 << 20, result: 0,
//!     latency_ns: 800, stack: 0,
//! }))?;
//! w.flush_frame()?;            // everything so far survives a SIGKILL
//! let bytes: Vec<u8> = w.finish()?; // writes the end record
//! # let _ = bytes;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Many threads: each thread encodes into its own [`RecordEncoder`] (`begin(tid)`, then
//! `push(&event)`), and one thread hands the finished buffers to
//! [`TraceWriter::write_records`]. Buffers may be concatenated in any order; every buffer
//! starts with a `Context` record that resets the delta state.
//!
//! # Reading
//!
//! ```no_run
//! use vramshim_trace::*;
//! let mut r = TraceReader::open("job.vramtrace")?;   // Err: empty / not a trace / future version
//! let h: &Header = r.header();
//! # let _ = h;
//! // Convenient: an iterator of Result<Event, DecodeError>.
//! // Fast (no allocation per alloc/free event): next_into.
//! let mut ev = Event::Lost { t_ns: 0, count: 0 };
//! loop {
//!     match r.next_into(&mut ev) {
//!         Ok(true) => { /* use ev */ }
//!         Ok(false) => break,
//!         Err(e) if e.is_recoverable() => eprintln!("warning: {e}"), // frame skipped
//!         Err(e) => return Err(e),
//!     }
//! }
//! if let Some(t) = r.truncation() {
//!     eprintln!("warning: {t}"); // torn last frame, or no end record (killed)
//! }
//! # Ok::<(), DecodeError>(())
//! ```
//!
//! Events come in file order: per thread in program order, but threads' buffers interleave
//! at buffer granularity, so sort by time when a global order is needed (timestamps come
//! from one CLOCK_MONOTONIC). To order the events of one address across threads, take an
//! `Alloc` at its return (`t_ns + latency_ns`) and a `Free` at its entry (`t_ns`). `Module`, `Stack` and `Device` records precede every event that
//! refers to them *in time*, not necessarily in file order: collect them as you go.
//!
//! The decoder never panics on any input, caps every length it reads (frames at 16 MiB raw,
//! strings at 64 KiB, stacks at 1024 frames) and never allocates more than the input holds
//! plus those caps.

pub mod codec;
pub mod columns;
pub mod event;
pub mod footprint;
pub mod header;
pub mod output_file;
pub mod reader;
pub mod switches;
mod torch_run;
mod wire;
pub mod writer;

pub use codec::{RecordEncoder, RecordStats};
pub use event::*;
pub use header::{FORMAT_VERSION, MAGIC};
pub use reader::{
    DAMAGE_COUNT_MAX, DecodeError, DecodeErrorKind, FrameInfo, TraceReader, Truncation,
    TruncationReason, Visitor,
};
pub use torch_run::TorchFields;
pub use writer::{FrameLayout, TraceWriter, WriterStats};
