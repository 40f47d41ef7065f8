//! libvramshim.so, in layers that each import only from the layers below them (RMM adaptor
//! style: each does one thing and calls the one below), bottom first:
//!
//! * [`config`]: the `VRAMSHIM_*` environment read once, and the cached layer switches;
//! * [`sys`]: thread state and re-entry, ids, the one clock, memory barriers, the log;
//! * [`cuda`]: ABI types, the real CUDA and NVML functions and the queries made of them, the
//!   decoded request;
//! * [`cap`], [`pool`], [`tracer`], [`state`] (live tables, counters): side by side, none
//!   importing another;
//! * [`pipeline`]: one request through the cap, the pool or the real function, recorded in
//!   the state and handed to the tracer;
//! * [`hooks`]: the exported C entry points, decoding calls for the pipeline;
//! * [`lifecycle`]: the constructor, and what each layer does at fork and at exit.
//!
//! `tests/layering.rs` checks the order on every `crate::` path of every module.

pub(crate) mod config;
#[macro_use]
pub(crate) mod sys;
pub(crate) mod cuda;

pub(crate) mod cap;
pub(crate) mod pool;
pub(crate) mod state;
pub mod tracer;

pub(crate) mod pipeline;

pub(crate) mod hooks;

mod lifecycle;
