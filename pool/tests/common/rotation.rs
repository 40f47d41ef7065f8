//! The rotation `pool_bench` times, as rotation.rs and stuck.rs run it on the model: eight
//! sizes, each freed stream-ordered before the next is allocated (nothing live between two
//! pairs), after a warm-up that had all eight live at once.

use vramshim_pool::{AccountingDevice, FreeMode, Policy, Request};

pub const SIZES: [u64; 8] = [512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 1000, 300_000];
pub const ASYNC: FreeMode = FreeMode::Async { stream: 0 };

/// Every size allocated at once on stream 0, then each freed stream-ordered; every block
/// checked by the device.
pub fn warm_up(p: &mut dyn Policy, dev: &mut AccountingDevice) {
    let mut warm = Vec::new();
    for s in SIZES {
        let a = p.alloc(dev, Request { size: s, stream: 0 }).unwrap();
        dev.check_alloc(a.addr, a.size, 0);
        warm.push(a.addr);
    }
    for a in warm {
        dev.check_free(a, ASYNC);
        p.free(dev, a, ASYNC).unwrap();
    }
}

/// `pairs` pairs of the rotation, every block checked by the device: the cache hits over the
/// last 10,000 of them (all of them when there are fewer).
pub fn last_hits(p: &mut dyn Policy, dev: &mut AccountingDevice, pairs: usize) -> u64 {
    let last = pairs.saturating_sub(10_000);
    let mut hits_at_last = p.stats().cache_hits;
    for i in 0..pairs {
        if i == last {
            hits_at_last = p.stats().cache_hits;
        }
        let size = SIZES[i % SIZES.len()];
        let a = p.alloc(dev, Request { size, stream: 0 }).unwrap();
        dev.check_alloc(a.addr, a.size, 0);
        dev.check_free(a.addr, ASYNC);
        p.free(dev, a.addr, ASYNC).unwrap();
    }
    p.stats().cache_hits - hits_at_last
}
