//! Tracer layer (owner: trace). Stub: tracing is off.

use vramshim_trace::Event;

/// One relaxed atomic load on the hot path.
#[inline]
pub fn enabled() -> bool {
    false
}

/// Append one event to the calling thread's buffer.
pub fn emit(_ev: Event) {}

/// Called in a forked child before it does anything else.
pub fn on_fork_child() {}

/// Called at process exit: flush everything.
pub fn on_exit() {}
