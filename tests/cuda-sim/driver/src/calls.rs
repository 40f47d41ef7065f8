//! Counts of the calls a process made into the driver, by kind, read back through
//! `vramsimDriverCalls`: what a benchmark compares between runs of the same program (driver
//! calls, synchronizations, allocations per training step) without any interposer in between.
//! Counted in [`crate::guard`], which every exported function and export-table slot that
//! returns a code goes through.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What `vramsimDriverCalls` fills in: totals since the library was loaded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VramsimDriverCalls {
    /// Every call (the reading function itself excluded).
    pub calls: u64,
    /// `cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize` (any variant): calls that
    /// block the CPU until the device catches up.
    pub syncs: u64,
    /// Device memory obtained from the driver: `cuMemAlloc*` (not `cuMemAllocHost`),
    /// `cuMemCreate`.
    pub allocs: u64,
    /// Device memory given back: `cuMemFree*` (not `cuMemFreeHost`), `cuMemRelease`.
    pub frees: u64,
    /// Kernel launches: `cuLaunchKernel*`, `cuLaunchCooperativeKernel*`.
    pub launches: u64,
}

struct Counters {
    calls: AtomicU64,
    syncs: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    launches: AtomicU64,
}

static COUNTERS: Counters = Counters {
    calls: AtomicU64::new(0),
    syncs: AtomicU64::new(0),
    allocs: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    launches: AtomicU64::new(0),
};

/// The name of the reading function, which is not counted (reading must not change what is
/// read).
pub const READER: &str = "vramsimDriverCalls";

/// Which counter besides `calls` a call by this name adds to.
fn kind(name: &str) -> Option<&'static AtomicU64> {
    let c = &COUNTERS;
    if name.contains("Synchronize") {
        Some(&c.syncs)
    } else if (name.starts_with("cuMemAlloc") && !name.starts_with("cuMemAllocHost"))
        || name == "cuMemCreate"
    {
        Some(&c.allocs)
    } else if (name.starts_with("cuMemFree") && !name.starts_with("cuMemFreeHost"))
        || name == "cuMemRelease"
    {
        Some(&c.frees)
    } else if name.starts_with("cuLaunchKernel") || name.starts_with("cuLaunchCooperativeKernel") {
        Some(&c.launches)
    } else {
        None
    }
}

/// Counts one call of the function `name`.
pub fn count(name: &str) {
    if name == READER {
        return;
    }
    COUNTERS.calls.fetch_add(1, Relaxed);
    if let Some(k) = kind(name) {
        k.fetch_add(1, Relaxed);
    }
}

/// The totals now.
pub fn snapshot() -> VramsimDriverCalls {
    let c = &COUNTERS;
    VramsimDriverCalls {
        calls: c.calls.load(Relaxed),
        syncs: c.syncs.load(Relaxed),
        allocs: c.allocs.load(Relaxed),
        frees: c.frees.load(Relaxed),
        launches: c.launches.load(Relaxed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let c = &COUNTERS;
        let is = |name: &str, want: Option<&AtomicU64>| {
            assert_eq!(
                kind(name).map(|k| k as *const _),
                want.map(|k| k as *const _),
                "{name}"
            );
        };
        for n in [
            "cuCtxSynchronize",
            "cuStreamSynchronize_ptsz",
            "cuEventSynchronize",
        ] {
            is(n, Some(&c.syncs));
        }
        for n in [
            "cuMemAlloc_v2",
            "cuMemAllocAsync",
            "cuMemAllocPitch_v2",
            "cuMemCreate",
        ] {
            is(n, Some(&c.allocs));
        }
        for n in ["cuMemFree_v2", "cuMemFreeAsync_ptsz", "cuMemRelease"] {
            is(n, Some(&c.frees));
        }
        for n in ["cuLaunchKernel", "cuLaunchKernelEx_ptsz"] {
            is(n, Some(&c.launches));
        }
        for n in [
            "cuMemAllocHost_v2",
            "cuMemFreeHost",
            "cuMemcpyHtoD_v2",
            "cuLaunchHostFunc",
        ] {
            is(n, None);
        }
    }

    #[test]
    fn the_reader_is_not_counted() {
        let before = snapshot();
        count(READER);
        assert_eq!(snapshot().calls, before.calls);
        count("cuMemAlloc_v2");
        let after = snapshot();
        assert!(after.calls > before.calls && after.allocs > before.allocs);
    }
}
