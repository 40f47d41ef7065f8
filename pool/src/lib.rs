//! Allocation policies over a `Device` trait. No FFI: the same code runs inside the
//! interposer (over the CUDA virtual-memory API) and inside `vramshim replay` (over an
//! accounting device).
