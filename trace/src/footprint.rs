//! What a CUDA driver holds on the device for an allocation: the one rule that the cap
//! (charging), the analyzer ("reserved") and the simulated driver (its accounting, which
//! mirrors it in `tests/cuda-sim`) share, so they never disagree about a byte.
//!
//! The rule (NVIDIA drivers since Pascal; docs/cuda-sim.md says how it was established):
//! - linear memory (`cuMemAlloc`, pitched, managed, stream-ordered pool allocations) above
//!   [`PACKED_MAX`] gets 2 MiB pages of its own: it costs its size rounded up to whole pages;
//! - up to [`PACKED_MAX`] it is packed with the process's other small allocations into shared
//!   2 MiB pages in 512-byte units; a shared page costs [`DEVICE_PAGE`] while anything lives
//!   in it;
//! - a virtual-memory handle (`cuMemCreate`) costs exactly its size (a multiple of the
//!   granularity).

/// The driver's physical page for device memory (and the VMM granularity).
pub const DEVICE_PAGE: u64 = 2 << 20;
/// The largest linear allocation the driver packs into a shared page.
pub const PACKED_MAX: u64 = 1 << 20;
/// The unit (and alignment) of packed allocations.
pub const PACK_UNIT: u64 = 512;

/// How an allocation occupies the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Footprint {
    /// Pages of its own: this many bytes (a multiple of [`DEVICE_PAGE`], or a VMM handle's
    /// size).
    Own(u64),
    /// A share of a 2 MiB page packed with other small allocations: the page costs
    /// [`DEVICE_PAGE`] while any of them lives.
    Packed,
}

impl Footprint {
    /// The most this allocation can add to the device: a packed one may need a new page.
    pub fn worst_case(self) -> u64 {
        match self {
            Footprint::Own(b) => b,
            Footprint::Packed => DEVICE_PAGE,
        }
    }
}

/// The footprint of an allocation of `size` bytes; `vmm` for a `cuMemCreate` handle.
pub fn footprint(size: u64, vmm: bool) -> Footprint {
    if vmm {
        return Footprint::Own(size);
    }
    if size == 0 {
        return Footprint::Own(0);
    }
    if size <= PACKED_MAX {
        return Footprint::Packed;
    }
    Footprint::Own(round_up(size, DEVICE_PAGE))
}

/// The 2 MiB page an address of a packed allocation lies in (the driver's pages are
/// 2 MiB-aligned).
pub fn page_of(addr: u64) -> u64 {
    addr & !(DEVICE_PAGE - 1)
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

/// What a changing set of live linear allocations holds from the device, from their sizes
/// alone: whole pages for those above [`PACKED_MAX`], and the packed ones' 512-byte units
/// rounded up to whole pages. For the packed ones this is the tightest packing: the driver
/// places them first-fit, so pages it leaves partly used after frees can hold more (the cap,
/// which sees addresses, charges each page it actually touches). Add and remove the same
/// sizes; the figure is the same for every order of events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverFootprint {
    /// Pages of allocations above [`PACKED_MAX`], in bytes.
    large: u64,
    /// Packed units of smaller allocations, in bytes.
    small: u64,
}

impl DriverFootprint {
    pub fn add(&mut self, size: u64) {
        match footprint(size, false) {
            Footprint::Own(b) => self.large = self.large.saturating_add(b),
            Footprint::Packed => self.small = self.small.saturating_add(round_up(size, PACK_UNIT)),
        }
    }

    pub fn remove(&mut self, size: u64) {
        match footprint(size, false) {
            Footprint::Own(b) => self.large = self.large.saturating_sub(b),
            Footprint::Packed => self.small = self.small.saturating_sub(round_up(size, PACK_UNIT)),
        }
    }

    /// Bytes held: never less than the sizes added and not removed.
    pub fn bytes(&self) -> u64 {
        self.large.saturating_add(round_up(self.small, DEVICE_PAGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn size_classes() {
        assert_eq!(footprint(1, false), Footprint::Packed);
        assert_eq!(footprint(1024, false), Footprint::Packed);
        assert_eq!(footprint(MIB, false), Footprint::Packed);
        assert_eq!(footprint(MIB + 1, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(2 * MIB - 1, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(2 * MIB, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(3 * MIB, false), Footprint::Own(4 * MIB));
        assert!(footprint(u64::MAX, false).worst_case() >= (u64::MAX >> 1));
        assert_eq!(footprint(6 * MIB, true), Footprint::Own(6 * MIB));
        assert_eq!(footprint(0, false), Footprint::Own(0));
        assert_eq!(Footprint::Packed.worst_case(), 2 * MIB);
        assert_eq!(page_of(0x7f00_0030_0200), 0x7f00_0020_0000);
    }

    #[test]
    fn a_set_rounds_large_to_pages_and_packs_small_ones() {
        let mut f = DriverFootprint::default();
        for _ in 0..4096 {
            f.add(1000);
        }
        // 4096 x 1024 B of units = 4 MiB: two shared pages.
        assert_eq!(f.bytes(), 2 * DEVICE_PAGE);
        f.add(3 * MIB);
        assert_eq!(f.bytes(), 4 * DEVICE_PAGE);
        // Above PACKED_MAX a request gets a page of its own.
        f.add(MIB + 1);
        assert_eq!(f.bytes(), 5 * DEVICE_PAGE);
        f.remove(MIB + 1);
        f.remove(3 * MIB);
        for _ in 0..4095 {
            f.remove(1000);
        }
        assert_eq!(f.bytes(), DEVICE_PAGE);
        f.remove(1000);
        assert_eq!(f.bytes(), 0);
    }
}
