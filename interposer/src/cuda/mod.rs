//! CUDA as the layers above see it: the ABI types ([`types`]), the real functions resolved
//! lazily ([`real`]), what a hook decodes a call into ([`request`]), which device a memory
//! pool lives on ([`mempools`]), the stream captures under way and whether they forbid the
//! calling thread an unsafe call ([`captures`]), the driver's answers about the devices ([`driver`]) and
//! NVML's view of them ([`nvml`]). Apart from the
//! hooks, this is the only place that calls real CUDA or NVML.

pub(crate) mod captures;
pub(crate) mod driver;
pub(crate) mod mempools;
pub(crate) mod nvml;
pub(crate) mod real;
pub(crate) mod request;
pub(crate) mod types;

/// Devices 0..MAX_DEVICES are told apart (per-device counters, contexts, NVML mapping).
pub(crate) const MAX_DEVICES: usize = 64;
