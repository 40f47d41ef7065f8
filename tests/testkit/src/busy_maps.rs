//! The busy-mappings workload: a serving loop that never synchronizes the device. Blocks of
//! changing shapes (2-40 MiB, drawn from one xorshift stream) are allocated on one stream, the
//! oldest of `window` live blocks freed on that stream before each allocation, and every
//! `wait_every` allocations the process waits for its stream alone. One definition for the
//! pool's tests (`pool/tests/busy_mappings.rs`) and the interposer's model of the live run
//! (`tests/workloads/pool/busy_maps.c`, which draws the same sizes from the same seed).

use crate::XorShift;
use vramshim_pool::stitch::Stitch;
use vramshim_pool::{AccountingDevice, FreeMode, MIB, Policy, Request};

/// The one stream the workload runs on.
pub const STREAM: u64 = 7;
/// The xorshift state the sizes are drawn from (`busy_maps.c` starts from it too).
pub const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Runs `steps` allocations of the workload through `p` on `dev` (checking it, when its
/// checking is on, as the pool's requests go), waiting for the stream after every
/// `wait_every` allocations (never when 0). Returns the most mappings the pool held after an
/// allocation and the blocks still live, oldest first.
pub fn serve(
    p: &mut Stitch,
    dev: &mut AccountingDevice,
    steps: u64,
    window: usize,
    wait_every: u64,
) -> (u64, Vec<u64>) {
    let run = serve_shrinking(p, dev, steps, (window, steps, window), wait_every);
    (run.most_mappings, run.live)
}

/// What [`serve_shrinking`] saw.
pub struct Served {
    /// the most mappings the pool held after an allocation
    pub most_mappings: u64,
    /// the most pages the pool held after an allocation
    pub most_pages: u64,
    /// the blocks still live, oldest first
    pub live: Vec<u64>,
}

/// [`serve`] whose live window shrinks: `(window, shrink_at, shrunk)` frees the oldest of
/// `window` live blocks before each allocation, and of `shrunk` from allocation `shrink_at`
/// on (`busy_maps.c`'s `WINDOW SHRINK_AT SHRUNK`).
pub fn serve_shrinking(
    p: &mut Stitch,
    dev: &mut AccountingDevice,
    steps: u64,
    (window, shrink_at, shrunk): (usize, u64, usize),
    wait_every: u64,
) -> Served {
    let freed = FreeMode::Async { stream: STREAM };
    let mut sizes = XorShift(SEED);
    let (mut most_mappings, mut most_pages) = (0, 0);
    let mut live = std::collections::VecDeque::new();
    for step in 0..steps {
        let w = if step < shrink_at { window } else { shrunk };
        while live.len() >= w {
            let a = live.pop_front().unwrap();
            dev.check_free(a, freed);
            p.free(dev, a, freed).unwrap();
        }
        let size = 2 * MIB + sizes.below(38 * MIB);
        let a = p
            .alloc(
                dev,
                Request {
                    size,
                    stream: STREAM,
                },
            )
            .unwrap()
            .addr;
        dev.check_alloc(a, size, STREAM);
        live.push_back(a);
        most_mappings = most_mappings.max(p.mappings());
        most_pages = most_pages.max(p.pages());
        if wait_every > 0 && (step + 1) % wait_every == 0 {
            dev.stream_sync(STREAM);
        }
    }
    Served {
        most_mappings,
        most_pages,
        live: live.into(),
    }
}
