//! The `.vramtrace` event model and its encoding. No FFI, no CUDA: the interposer
//! produces these values, the analyzer consumes them, and the file format in
//! `docs/trace-format.md` is the only contract between the two.

pub mod event;

pub use event::*;
