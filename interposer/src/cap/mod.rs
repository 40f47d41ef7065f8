//! Memory cap layer (owner: cap). Stub: everything is allowed, nothing is adjusted.

use vramshim_trace::Api;

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub in_use: u64,
    pub cap: u64,
}

/// Called once before the first charged request.
pub fn init() {}

/// Called in a forked child before it does anything else.
pub fn on_fork_child() {}

/// Reserve `bytes` on `device` for a request coming through `api`.
pub fn try_charge(_device: i32, _bytes: u64, _api: Api) -> Result<(), Refusal> {
    Ok(())
}

/// Give back a reservation made by `try_charge`.
pub fn uncharge(_device: i32, _bytes: u64) {}

/// What a memory-information query should answer given the real numbers.
pub fn adjust_meminfo(_device: i32, real_free: u64, real_total: u64) -> (u64, u64) {
    (real_free, real_total)
}
