//! What every layer stands on: the per-thread state and re-entry guard ([`thread`]), the
//! thread id and process id ([`ids`]), the one clock ([`clock`]), the one spin lock
//! ([`spin`]) and the one biased lock ([`biased`]), process-wide memory barriers
//! ([`membarrier`]), a thread's end as the kernel marks it ([`life`]), the allocation-free
//! log ([`log`]), one-time set-up that a forked child can take back ([`setup`]) and the
//! test-only pause points ([`pause`]). Imports only `config`.

pub(crate) mod biased;
pub(crate) mod clock;
pub(crate) mod ids;
pub(crate) mod life;
#[macro_use]
pub(crate) mod log;
pub(crate) mod membarrier;
pub(crate) mod pause;
pub(crate) mod setup;
pub(crate) mod spin;
pub(crate) mod thread;
pub(crate) mod wired;
