//! Near the device's limit: the expensive placement only where the cheap one may end in an
//! out-of-memory answer.
//!
//! A tight pool does not re-form (remap over other pages) a mapping that a place of its
//! current or previous round is in: a repeated round replays those places, so keeping them
//! is what makes a repeated workload's later rounds cost no driver call (see `rounds`). The
//! price is room: a new block whose pages an unused round mapping already mostly holds gets
//! a new mapping instead, and the layout that follows differs from the one re-forming gives.
//! On the smallest device bert needs (behind `cudaFree`) the layouts part there, and only
//! the re-formed one completes: 214 MiB (1.023 x peak live) instead of 216 (1.032).
//!
//! So the pool asks the device how much physical memory it may still take (`Device::room`:
//! the device's free memory and the cap, where known) before it makes a new mapping, and
//! when what is left is short of the request plus a quarter of what the pool holds, it
//! re-forms round mappings too. On a large device that never happens (the steady state's
//! zero driver calls are untouched); near the limit the driver calls of re-forming in later
//! rounds are the price of completing. Safety is that of any re-forming: only a mapping no
//! block uses (live, pending or cached) and no stream may still touch (no active fence) is
//! remapped, so no byte of a block moves (`Faults::pressure_reform_used` breaks exactly
//! that, for the tests that prove the checks catch it).

use super::*;

/// Under pressure when the device's room is below the request plus `1 / PRESSURE_SHARE` of
/// the bytes the pool holds. Measured on the shared traces (`pool_traces`' min device, bert
/// behind `cudaFree`, the only cell it moves): a half to a fifth of the pool is in time
/// (214 MiB), a sixth or an eighth is too late (216: the layout that fails is made by then).
const PRESSURE_SHARE: u64 = 4;

impl Stitch {
    /// Whether the device is close enough to full that a new block of `size` bytes should
    /// take the tightest layout whatever it costs in driver calls (tight pool only).
    pub(super) fn under_pressure(&self, dev: &dyn Device, size: u64) -> bool {
        if self.budget.is_none() || self.faults.pressure_off {
            return false;
        }
        dev.room()
            .is_some_and(|room| room < size.saturating_add(self.stats.reserved / PRESSURE_SHARE))
    }

    /// Mappings re-formed under pressure that a round's places were in (see the module
    /// documentation).
    pub fn pressure_reforms(&self) -> u64 {
        self.pressure_reforms
    }
}
