//! libvramshim.so. Layers, outermost first (RMM adaptor style: each does one thing and calls
//! the one below): hooks decode a C call into a `Request`; the dispatcher runs it through the
//! cap, the pool, or the real function; the tracer records the outcome.
//!
//! Shared infrastructure for every layer: [`env`] (configuration read once at load),
//! [`log`] (`warn!`/`info!`/`debug!` to stderr without allocation), [`real`] (the real CUDA
//! functions), [`ids`] (thread id, monotonic clock), [`counters`] and [`live_table`]
//! (what the process holds), [`stats`] (reading them from tests).

pub mod env;
pub mod ffi_types;
pub mod ids;
#[macro_use]
pub mod log;
pub mod real;

pub mod counters;
pub mod dispatch;
pub mod guard;
pub mod hooks;
pub mod live_table;
pub mod membarrier;
pub mod request;
pub mod stats;

pub mod cap;
pub mod pooling;
pub mod tracer;

mod init;

/// Everything a forked child resets before it does anything else (atfork child handler):
/// the child's own memory starts empty.
fn fork_child_hooks() {
    guard::on_fork_child();
    live_table::ALLOCS.reset_leak();
    live_table::HANDLES.reset_leak();
    counters::reset();
    hooks::context::on_fork_child();
    hooks::mempool::on_fork_child();
    cap::on_fork_child();
    pooling::on_fork_child();
    tracer::on_fork_child();
}

/// Process exit (atexit handler).
fn at_exit_hooks() {
    stats::on_exit();
    hooks::context::record_startup_failure();
    tracer::on_exit();
}
