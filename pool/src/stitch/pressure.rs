//! Near the device's limit: the expensive placement only where the cheap one may end in an
//! out-of-memory answer.
//!
//! Two choices of the tight pool trade room for driver calls, and are right on a large device
//! but cost the smallest one a page or two:
//! - It does not re-form (remap over other pages) a mapping that a place of its current or
//!   previous round is in: a repeated round replays those places, so keeping them is what
//!   makes a repeated workload's later rounds cost no driver call (see `rounds`). A new block
//!   whose pages an unused round mapping already mostly holds then gets a new mapping, and
//!   the layout that follows differs from the one re-forming gives. On the smallest device
//!   bert needs behind `cudaFree` the layouts part there, and only the re-formed one
//!   completes.
//! - Below its budget it grows before it dissolves cached blocks (they stay formed for exact
//!   reuse, as in a caching allocator). Near the limit the pages it takes that way are the
//!   ones a later, larger block needs (t5 with stream-ordered frees, the GPU recording of
//!   ViT).
//!
//! docs/benchmarks.md ("Near the device's limit: the expensive layout only where the cheap
//! one runs out") has the devices each rule saves.
//!
//! So the pool asks the device how much physical memory it may still take (`Device::room`:
//! the device's free memory and the cap, where known) where it is about to grow or make a new
//! mapping, and when what is left is short of the request plus a quarter of what the pool
//! holds, it re-forms round mappings too and dissolves cached blocks before it grows, as it
//! does above its budget. On a large device that never happens (the steady state's zero
//! driver calls are untouched); near the limit the driver calls are the price of completing.
//! Safety is that of the paths it opens, unchanged: only a mapping no block uses (live,
//! pending or cached) and no stream may still touch (no active fence) is re-formed, so no
//! byte of a block moves (`Faults::pressure_reform_used` breaks exactly that, for the tests
//! that prove the checks catch it), and dissolving is the pool's usual path above its budget.

use super::*;

/// Under pressure when the device's room is below the request plus `1 / PRESSURE_SHARE` of
/// the bytes the pool holds. Why a quarter: the rules must act before the layout that fails
/// is made, which on bert behind `cudaFree` a sixth of the pool's bytes is too late for; a
/// quarter lies inside the shares that reach every trace's smallest device (the shares tried
/// are in docs/benchmarks.md, "Near the device's limit").
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

    /// Whether a round's mappings may be re-formed for a new block of `size` bytes: as
    /// `under_pressure`, with the whole free pages the pool holds counted as room.
    ///
    /// Why: a later round (a training loop's next pass, the pool kept) enters holding every
    /// page of its peak, so the device's room is short from its first block on; re-forming
    /// the round's mappings then moves the places the round replays onto other pages from the
    /// start, and its layout parts from the one that fitted (t5 behind `cudaFree` needed a
    /// larger device for three passes than for one). The pool's own free pages are room a
    /// new mapping takes without growing; once they too run short (near the round's peak, as
    /// in the first round) the mappings are re-formed. The price is driver calls near the
    /// limit, where completing matters more (`examples/pool_passes.rs`,
    /// `examples/pool_small.rs`; docs/benchmarks.md, "Repeated passes on the device one pass
    /// needs"). `Faults::reform_without_held` counts the device's room alone, for the test.
    pub(super) fn reform_pressure(&self, dev: &dyn Device, size: u64) -> bool {
        if self.faults.reform_without_held {
            return self.under_pressure(dev, size);
        }
        if self.budget.is_none() || self.faults.pressure_off {
            return false;
        }
        let free = (self.free_pages.len() + self.bound_free.len()) as u64 * self.gran;
        dev.room().is_some_and(|room| {
            room.saturating_add(free) < size.saturating_add(self.stats.reserved / PRESSURE_SHARE)
        })
    }

    /// Whether a large block of `size` bytes should skip the arena because the pool was told
    /// lifetime classes (`Stitch::set_lifetime_class`) and is near the device's limit.
    ///
    /// Why: the arena places by address, so blocks that die before the peak and blocks that
    /// live through it share its pages, and their deaths leave holes inside pages that live
    /// blocks pin; stitched from pages of their own class (`placement`: free ranges, mappings
    /// and fresh pages, each checked against the class), the short-lived ones empty whole
    /// pages together. On a large device the arena keeps its role (a new shape costs no
    /// driver call). The classes are worth a smaller device only with the arena skipped
    /// (`Faults::arena_mixes_lifetimes` keeps it, and the classes gain nothing on t5):
    /// `examples/pool_lifetimes.rs` measures it with oracle classes (dies before the trace's
    /// peak or not). Without classes (every pool but that example's) nothing changes.
    pub(super) fn lifetimes_near_limit(&self, dev: &dyn Device, size: u64) -> bool {
        self.lives && !self.faults.arena_mixes_lifetimes && self.under_pressure(dev, size)
    }

    /// Mappings re-formed under pressure that a round's places were in (see the module
    /// documentation).
    pub fn pressure_reforms(&self) -> u64 {
        self.pressure_reforms
    }
}
