//! Which device a memory pool belongs to, so that `cudaMallocFromPoolAsync` and
//! `cuMemAllocFromPoolAsync` are charged to the pool's device rather than the caller's
//! current one (a process may allocate from device 1's pool while device 0 is current).
//!
//! A pool's device never changes. Pools the process creates pass through the
//! `cuMemPoolCreate` hook (the runtime's `cudaMemPoolCreate` reaches it through our
//! `cuGetProcAddress` substitution), which records the location; default and current pools
//! are found by asking each device for its pools. Answers are cached in a small append-only
//! table (a process has few pools).

use crate::cuda::real;
use crate::cuda::types::*;
use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

const CAP: usize = 256;

struct Known {
    pool: AtomicU64,
    device: AtomicI32,
}

static KNOWN: [Known; CAP] = [const {
    Known {
        pool: AtomicU64::new(0),
        device: AtomicI32::new(-1),
    }
}; CAP];
static LEN: AtomicUsize = AtomicUsize::new(0);

fn cached(pool: u64) -> Option<&'static Known> {
    let n = LEN.load(Acquire).min(CAP);
    KNOWN[..n].iter().find(|k| k.pool.load(Acquire) == pool)
}

/// Remember that `pool` lives on `device` (a handle the driver hands out again after a
/// destroy gets its new device).
pub(crate) fn remember(pool: u64, device: i32) {
    if pool == 0 || device < 0 {
        return;
    }
    if let Some(k) = cached(pool) {
        k.device.store(device, Release);
        return;
    }
    let i = LEN.fetch_add(1, AcqRel);
    if i >= CAP {
        LEN.store(CAP, Release);
        return;
    }
    KNOWN[i].device.store(device, Release);
    KNOWN[i].pool.store(pool, Release);
}

/// The device `pool` belongs to, or None (not a pool we know of: the caller falls back to
/// the current device, and the real call returns its own error for a bad handle).
pub(crate) fn device_of(pool: CUmemoryPool) -> Option<i32> {
    let p = pool as u64;
    if p == 0 {
        return None;
    }
    if let Some(k) = cached(p) {
        let d = k.device.load(Acquire);
        if d >= 0 {
            return Some(d);
        }
    }
    let d = ask_devices(p)?;
    remember(p, d);
    Some(d)
}

/// Search every device's default and current pool.
#[cold]
fn ask_devices(pool: u64) -> Option<i32> {
    let count = real::cuDeviceGetCount()?;
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    if unsafe { count(&mut n) } != CUDA_SUCCESS {
        return None;
    }
    let getters = [
        real::cuDeviceGetMemPool(),
        real::cuDeviceGetDefaultMemPool(),
    ];
    (0..n).find(|&d| {
        getters.iter().flatten().any(|g| {
            let mut out: CUmemoryPool = std::ptr::null_mut();
            // SAFETY: out is a valid out-pointer; d is a device ordinal below the count.
            unsafe { g(&mut out, d) == CUDA_SUCCESS && out as u64 == pool }
        })
    })
}

/// The pools of `device` the process may have allocated from: its default and current pool
/// and every pool recorded on it (cold: the cap asks when it would refuse a request).
pub(crate) fn pools_of(device: i32) -> Vec<CUmemoryPool> {
    let mut out: Vec<CUmemoryPool> = Vec::new();
    for g in [
        real::cuDeviceGetDefaultMemPool(),
        real::cuDeviceGetMemPool(),
    ]
    .into_iter()
    .flatten()
    {
        let mut p: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer; the driver checks the ordinal.
        if unsafe { g(&mut p, device) } == CUDA_SUCCESS && !p.is_null() && !out.contains(&p) {
            out.push(p);
        }
    }
    let n = LEN.load(Acquire).min(CAP);
    for k in &KNOWN[..n] {
        let p = k.pool.load(Acquire) as CUmemoryPool;
        if !p.is_null() && k.device.load(Acquire) == device && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Forget everything (fork child: handles do not survive into a child's own contexts).
pub(crate) fn on_fork_child() {
    for k in KNOWN.iter() {
        k.pool.store(0, Relaxed);
        k.device.store(-1, Relaxed);
    }
    LEN.store(0, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn remembers_and_updates() {
        remember(0x5000, 1);
        remember(0x6000, 0);
        assert_eq!(device_of(0x5000 as CUmemoryPool), Some(1));
        remember(0x5000, 2);
        assert_eq!(device_of(0x5000 as CUmemoryPool), Some(2));
        assert_eq!(device_of(std::ptr::null_mut()), None);
    }
}
