//! What every layer stands on: the per-thread state and re-entry guard ([`thread`]), the
//! thread id, process id and monotonic clock ([`ids`]), process-wide memory barriers
//! ([`membarrier`]) and the allocation-free log ([`log`]). Imports only `config`.

pub(crate) mod ids;
#[macro_use]
pub(crate) mod log;
pub(crate) mod membarrier;
pub(crate) mod thread;
pub(crate) mod wired;
