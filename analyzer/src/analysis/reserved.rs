//! "Reserved": what the process holds from a device, the one figure every command prints.
//!
//! It is the driver's footprint of the live allocations the process made itself
//! ([`vramshim_trace::footprint`]: whole 2 MiB pages, small requests packed into shared pages)
//! plus what a pool holds for the allocations it served: vramshim's pool reports its mapped
//! pages, an imported caching allocator's log its segments, in the trace's `Counter` records.
//! A pool is never taken to hold less than its live allocations, so reserved is never below in
//! use. Computed from the allocation events as they come, so its peak is exact; periodic
//! samples only ever tell what a pool holds.

use vramshim_trace::footprint::DriverFootprint;
use vramshim_trace::{AllocKind, flags};

#[derive(Clone, Copy, Debug, Default)]
pub struct Holdings {
    /// The driver's footprint of the live allocations made without a pool.
    driver: DriverFootprint,
    /// Live bytes served by a pool.
    pooled_live: u64,
    /// What the pool last said it holds.
    pool_held: u64,
    /// Whether any allocation was served by a pool (else `Counter` figures are the live bytes,
    /// which the events give exactly).
    pooled_seen: bool,
}

impl Holdings {
    /// Bytes held from the device now.
    #[inline]
    pub fn reserved(&self) -> u64 {
        self.driver
            .bytes()
            .saturating_add(self.pool_held.max(self.pooled_live))
    }

    /// A live allocation of `size` bytes appeared (host memory holds nothing on a device).
    #[inline]
    pub fn hold(&mut self, kind: AllocKind, alloc_flags: u8, size: u64) {
        if !kind.is_device() {
            return;
        }
        if alloc_flags & flags::POOLED != 0 {
            self.pooled_seen = true;
            self.pooled_live = self.pooled_live.saturating_add(size);
        } else {
            self.driver.add(size);
        }
    }

    /// A live allocation went (the same arguments as its [`Holdings::hold`]).
    #[inline]
    pub fn release(&mut self, kind: AllocKind, alloc_flags: u8, size: u64) {
        if !kind.is_device() {
            return;
        }
        if alloc_flags & flags::POOLED != 0 {
            self.pooled_live = self.pooled_live.saturating_sub(size);
        } else {
            self.driver.remove(size);
        }
    }

    /// A `Counter` record's reserved figure; true when it changed what is held.
    #[inline]
    pub fn pool_reports(&mut self, reserved_bytes: u64) -> bool {
        if !self.pooled_seen || self.pool_held == reserved_bytes {
            return false;
        }
        self.pool_held = reserved_bytes;
        true
    }
}
