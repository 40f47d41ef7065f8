//! Driver API hooks (`libcuda`): reached by programs linked with `-lcuda`, and, through our
//! `dlsym` / `cuGetProcAddress` / `cudaGetDriverEntryPoint` substitution, by the runtime
//! (shared or static), frameworks and ctypes. Device = the current context's device; a
//! thread with no context gets -1 (nothing charged, the real call returns its own error).

use super::{OutPtr, Site, drv_device, req};
use crate::cuda::real;
use crate::cuda::types::*;
use crate::state::live_table::ALLOCS;
use std::ffi::{c_int, c_uint};
use vramshim_trace::{AllocKind, Api};

hooks! {
    /// The pool may serve it.
    ["cuMemAlloc", 3020] cuMemAlloc_v2,
    fn(dptr: *mut CUdeviceptr, size: usize) |h| {
        // Reached by the runtime's cudaMalloc through our lookup hooks: straight to the driver.
        if let Some(f) = crate::sys::thread::nested_real(real::known::cuMemAlloc_v2) {
            // SAFETY: forwarding the caller's arguments unchanged.
            return unsafe { f(dptr, size) };
        }
        mem_alloc(h, dptr, size)
    }

    ["cuMemFree", 3020] cuMemFree_v2,
    fn(dptr: CUdeviceptr) |h| {
        if let Some(f) = crate::sys::thread::nested_real(real::known::cuMemFree_v2) {
            // SAFETY: forwarding the caller's arguments unchanged.
            return unsafe { f(dptr) };
        }
        mem_free(h, dptr)
    }

    /// Charged width x height; the footprint is pitch x height (known after the call).
    ["cuMemAllocPitch", 3020] cuMemAllocPitch_v2,
    fn(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        elem: c_uint,
    ) |h| {
        h.alloc(
            &ALLOCS,
            || req(Api::CuMemAllocPitch, AllocKind::Pitch, drv_device(), 0, width.saturating_mul(height), 0),
            || false,
            // SAFETY: forwarding the caller's arguments unchanged.
            move |f| unsafe { f(dptr, pitch, width, height, elem) },
            || {
                let p = super::read_usize(pitch).unwrap_or(width as u64);
                (dptr.get(), p.saturating_mul(height as u64))
            },
            |_| {},
        )
    }

    ["cuMemAllocManaged", 6000] cuMemAllocManaged,
    fn(dptr: *mut CUdeviceptr, size: usize, fl: c_uint) |h| {
        let r = || req(Api::CuMemAllocManaged, AllocKind::Managed, drv_device(), 0, size, 0);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.linear(dptr, size, false, r, move |f| unsafe { f(dptr, size, fl) })
    }

    ["cuMemAllocAsync", 11020] cuMemAllocAsync,
    ["cuMemAllocAsync", 11020, ptds] cuMemAllocAsync_ptsz,
    fn(dptr: *mut CUdeviceptr, size: usize, s: CUstream) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        h.stream_ordered(Api::CuMemAllocAsync, drv_device, dptr, size, s as u64, None, move |f| unsafe { f(dptr, size, s) })
    }

    ["cuMemFreeAsync", 11020] cuMemFreeAsync,
    ["cuMemFreeAsync", 11020, ptds] cuMemFreeAsync_ptsz,
    fn(dptr: CUdeviceptr, s: CUstream) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        h.free(&ALLOCS, Api::CuMemFreeAsync, dptr, Some(s as u64), move |f| unsafe { f(dptr, s) })
    }

    ["cuMemAllocFromPoolAsync", 11020] cuMemAllocFromPoolAsync,
    ["cuMemAllocFromPoolAsync", 11020, ptds] cuMemAllocFromPoolAsync_ptsz,
    fn(
        dptr: *mut CUdeviceptr,
        size: usize,
        pool: CUmemoryPool,
        s: CUstream,
    ) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        h.stream_ordered(Api::CuMemAllocFromPoolAsync, drv_device, dptr, size, s as u64, Some(pool), move |f| unsafe { f(dptr, size, pool, s) })
    }

    ["cuMemGetInfo", 3020] cuMemGetInfo_v2,
    fn(free: *mut usize, total: *mut usize) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        super::meminfo_hook(h, Api::CuMemGetInfo, real::current_driver_device, free, total, |f| unsafe { f(free, total) })
    }

    /// Reports the cap.
    ["cuDeviceTotalMem", 3020] cuDeviceTotalMem_v2,
    fn(bytes: *mut usize, dev: CUdevice) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        super::total_mem_hook(h, Api::CuDeviceTotalMem, dev, bytes, |f| unsafe { f(bytes, dev) })
    }
}

#[inline(never)]
fn mem_alloc(h: Site<PfnCuMemAlloc>, dptr: *mut CUdeviceptr, size: usize) -> c_int {
    let r = || req(Api::CuMemAlloc, AllocKind::Driver, drv_device(), 0, size, 0);
    // SAFETY: forwarding the caller's arguments unchanged.
    h.linear(dptr, size, true, r, move |f| unsafe { f(dptr, size) })
}

#[inline(never)]
fn mem_free(h: Site<PfnCuMemFree>, dptr: CUdeviceptr) -> c_int {
    // SAFETY: forwarding the caller's arguments unchanged.
    h.free(&ALLOCS, Api::CuMemFree, dptr, None, move |f| unsafe {
        f(dptr)
    })
}
