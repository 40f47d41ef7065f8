//! What a CUDA driver holds on the device for the process's allocations: the one rule that
//! the cap (charging), the simulated driver (its accounting) and the analyzer ("reserved")
//! share, so the three never disagree about a byte.
//!
//! The driver hands out device memory in 2 MiB pages. A request of 2 MiB or more gets whole
//! pages of its own (rounded up); smaller requests are packed together into shared pages in
//! 512-byte units, so what they hold together is their units' total rounded up to whole pages.

/// The driver's page: large requests are rounded up to it, small ones share it.
pub const DRIVER_PAGE: u64 = 2 << 20;
/// The unit small requests are packed in.
pub const DRIVER_UNIT: u64 = 512;

/// The footprint of one allocation of `size` bytes: whole pages at or above
/// [`DRIVER_PAGE`], else its packed units (small allocations share pages; see
/// [`DriverFootprint`] for what a set of them holds). Saturates instead of overflowing.
pub fn driver_footprint(size: u64) -> u64 {
    if size >= DRIVER_PAGE {
        round_up(size, DRIVER_PAGE)
    } else {
        round_up(size.max(1), DRIVER_UNIT)
    }
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to).saturating_mul(to)
}

/// What a changing set of live allocations holds from the device: whole pages for the large
/// ones, and the small ones' packed units rounded up to whole pages. Add and remove the same
/// sizes; the figure is exact for every order of events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverFootprint {
    /// Pages of allocations of at least a page, in bytes.
    large: u64,
    /// Packed units of smaller allocations, in bytes.
    small: u64,
}

impl DriverFootprint {
    pub fn add(&mut self, size: u64) {
        let f = driver_footprint(size);
        if size >= DRIVER_PAGE {
            self.large = self.large.saturating_add(f);
        } else {
            self.small = self.small.saturating_add(f);
        }
    }

    pub fn remove(&mut self, size: u64) {
        let f = driver_footprint(size);
        if size >= DRIVER_PAGE {
            self.large = self.large.saturating_sub(f);
        } else {
            self.small = self.small.saturating_sub(f);
        }
    }

    /// Bytes held: never less than the sizes added and not removed.
    pub fn bytes(&self) -> u64 {
        self.large.saturating_add(round_up(self.small, DRIVER_PAGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_large_to_pages_and_packs_small_ones() {
        assert_eq!(driver_footprint(1), 512);
        assert_eq!(driver_footprint(513), 1024);
        assert_eq!(driver_footprint(DRIVER_PAGE), DRIVER_PAGE);
        assert_eq!(driver_footprint(DRIVER_PAGE + 1), 2 * DRIVER_PAGE);
        assert_eq!(driver_footprint(u64::MAX), u64::MAX);
        let mut f = DriverFootprint::default();
        for _ in 0..4096 {
            f.add(1000);
        }
        // 4096 x 1024 B of units = 4 MiB: two shared pages.
        assert_eq!(f.bytes(), 2 * DRIVER_PAGE);
        f.add(3 << 20);
        assert_eq!(f.bytes(), 4 * DRIVER_PAGE);
        f.remove(3 << 20);
        for _ in 0..4095 {
            f.remove(1000);
        }
        assert_eq!(f.bytes(), DRIVER_PAGE);
        f.remove(1000);
        assert_eq!(f.bytes(), 0);
    }
}
