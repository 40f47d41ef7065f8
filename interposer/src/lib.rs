//! libvramshim.so. Layers, outermost first (RMM adaptor style: each does one thing and calls
//! the one below): hooks decode a C call into a `Request`; the dispatcher runs it through the
//! cap, the pool, or the real function; the tracer records the outcome.

pub mod cap;
pub mod pooling;
pub mod tracer;
