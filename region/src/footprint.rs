//! What an allocation costs the device: its footprint under the driver's rounding, which is
//! what the cap charges (so the device's own accounting never passes the cap).
//!
//! The rule (NVIDIA drivers since Pascal, mirrored by cuda-sim; docs/cuda-sim.md):
//! - linear memory (`cuMemAlloc`, pitched, managed, stream-ordered pool allocations) above
//!   1 MiB gets pages of its own: it costs its size rounded up to whole 2 MiB pages;
//! - up to 1 MiB it is packed with other small allocations of the process into shared 2 MiB
//!   pages (512-byte units); the page costs 2 MiB while any allocation lives in it;
//! - a VMM handle (`cuMemCreate`) costs exactly its size (a multiple of the granularity).

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
    Footprint::Own(size.div_ceil(DEVICE_PAGE).saturating_mul(DEVICE_PAGE))
}

/// The 2 MiB page an address of a packed allocation lies in.
pub fn page_of(addr: u64) -> u64 {
    addr & !(DEVICE_PAGE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes() {
        const MIB: u64 = 1 << 20;
        assert_eq!(footprint(1, false), Footprint::Packed);
        assert_eq!(footprint(1024, false), Footprint::Packed);
        assert_eq!(footprint(MIB, false), Footprint::Packed);
        assert_eq!(footprint(MIB + 1, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(2 * MIB - 1, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(2 * MIB, false), Footprint::Own(2 * MIB));
        assert_eq!(footprint(3 * MIB, false), Footprint::Own(4 * MIB));
        assert_eq!(footprint(u64::MAX, false), Footprint::Own(u64::MAX));
        assert_eq!(footprint(6 * MIB, true), Footprint::Own(6 * MIB));
        assert_eq!(footprint(0, false), Footprint::Own(0));
        assert_eq!(Footprint::Packed.worst_case(), 2 * MIB);
        assert_eq!(page_of(0x7f00_0030_0200), 0x7f00_0020_0000);
    }
}
