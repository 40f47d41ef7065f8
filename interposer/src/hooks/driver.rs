//! Driver API hooks (`libcuda`): reached by programs linked with `-lcuda`, and, through our
//! `dlsym` / `cuGetProcAddress` / `cudaGetDriverEntryPoint` substitution, by the runtime
//! (shared or static), frameworks and ctypes. Device = the current context's device; a
//! thread with no context gets -1 (nothing charged, the real call returns its own error).

use super::{
    NO_DRIVER, alloc_hook, async_alloc_hook, async_free_hook, drv_device, free_hook, read_ptr,
    read_u64, req, variant, write_ptr, write_u64,
};
use crate::cuda::real;
use crate::cuda::types::*;
use std::ffi::{c_int, c_uint, c_void};
use vramshim_trace::{AllocKind, Api};

/// # Safety
/// C ABI: `cuMemAlloc_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> c_int {
    // Reached by the runtime's cudaMalloc through our lookup hooks: straight to the driver.
    if let Some(f) = crate::sys::thread::nested_real(real::known::cuMemAlloc_v2) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(dptr, size) };
    }
    mem_alloc(dptr, size)
}

#[inline(never)]
fn mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> c_int {
    alloc_hook(
        "cuMemAlloc_v2",
        NO_DRIVER,
        real::cuMemAlloc_v2,
        || req(Api::CuMemAlloc, AllocKind::Driver, drv_device(), 0, size, 0),
        !dptr.is_null(),
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, size) },
        move || (read_u64(dptr), size as u64),
        move |p| write_u64(dptr, p),
    )
}

/// # Safety
/// C ABI: `cuMemFree_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> c_int {
    if let Some(f) = crate::sys::thread::nested_real(real::known::cuMemFree_v2) {
        // SAFETY: forwarding the caller's arguments unchanged.
        return unsafe { f(dptr) };
    }
    mem_free(dptr)
}

#[inline(never)]
fn mem_free(dptr: CUdeviceptr) -> c_int {
    free_hook(
        "cuMemFree_v2",
        NO_DRIVER,
        real::cuMemFree_v2,
        Api::CuMemFree,
        dptr,
        None,
        0,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr) },
    )
}

/// # Safety
/// C ABI: `cuMemAllocPitch_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> c_int {
    alloc_hook(
        "cuMemAllocPitch_v2",
        NO_DRIVER,
        real::cuMemAllocPitch_v2,
        || {
            req(
                Api::CuMemAllocPitch,
                AllocKind::Pitch,
                drv_device(),
                0,
                width.saturating_mul(height),
                0,
            )
        },
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, pitch, width, height, elem) },
        || {
            let p = super::read_usize(pitch).unwrap_or(width as u64);
            (read_u64(dptr), p.saturating_mul(height as u64))
        },
        |_| {},
    )
}

/// # Safety
/// C ABI: `cuMemAllocManaged`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    fl: c_uint,
) -> c_int {
    alloc_hook(
        "cuMemAllocManaged",
        NO_DRIVER,
        real::cuMemAllocManaged,
        || {
            req(
                Api::CuMemAllocManaged,
                AllocKind::Managed,
                drv_device(),
                0,
                size,
                0,
            )
        },
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, size, fl) },
        move || (read_u64(dptr), size as u64),
        |_| {},
    )
}

fn alloc_async(
    name: &'static str,
    ptsz: bool,
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> c_int {
    async_alloc_hook(
        name,
        NO_DRIVER,
        variant(ptsz, real::cuMemAllocAsync, real::cuMemAllocAsync_ptsz),
        Api::CuMemAllocAsync,
        drv_device,
        s as u64,
        size,
        !dptr.is_null(),
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, size, s) },
        move || (read_u64(dptr), size as u64),
        move |p| write_u64(dptr, p),
    )
}

/// # Safety
/// C ABI: `cuMemAllocAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> c_int {
    alloc_async("cuMemAllocAsync", false, dptr, size, s)
}

/// # Safety
/// C ABI: `cuMemAllocAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> c_int {
    alloc_async("cuMemAllocAsync_ptsz", true, dptr, size, s)
}

fn free_async(name: &'static str, ptsz: bool, dptr: CUdeviceptr, s: CUstream) -> c_int {
    async_free_hook(
        name,
        NO_DRIVER,
        variant(ptsz, real::cuMemFreeAsync, real::cuMemFreeAsync_ptsz),
        Api::CuMemFreeAsync,
        dptr,
        s as u64,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, s) },
    )
}

/// # Safety
/// C ABI: `cuMemFreeAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> c_int {
    free_async("cuMemFreeAsync", false, dptr, s)
}

/// # Safety
/// C ABI: `cuMemFreeAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) -> c_int {
    free_async("cuMemFreeAsync_ptsz", true, dptr, s)
}

fn alloc_from_pool(
    name: &'static str,
    ptsz: bool,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> c_int {
    async_alloc_hook(
        name,
        NO_DRIVER,
        variant(
            ptsz,
            real::cuMemAllocFromPoolAsync,
            real::cuMemAllocFromPoolAsync_ptsz,
        ),
        Api::CuMemAllocFromPoolAsync,
        || crate::cuda::mempools::device_of(pool).unwrap_or_else(drv_device),
        s as u64,
        size,
        false, // the process chose a specific pool
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dptr, size, pool, s) },
        move || (read_u64(dptr), size as u64),
        |_| {},
    )
}

/// # Safety
/// C ABI: `cuMemAllocFromPoolAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> c_int {
    alloc_from_pool("cuMemAllocFromPoolAsync", false, dptr, size, pool, s)
}

/// # Safety
/// C ABI: `cuMemAllocFromPoolAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> c_int {
    alloc_from_pool("cuMemAllocFromPoolAsync_ptsz", true, dptr, size, pool, s)
}

/// # Safety
/// C ABI: `cuMemGetInfo_v2`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    let Some(f) = real::cuMemGetInfo_v2() else {
        return NO_DRIVER;
    };
    super::meminfo_hook(
        "cuMemGetInfo_v2",
        CUDA_ERROR_UNKNOWN,
        Api::CuMemGetInfo,
        real::current_driver_device,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(free, total) },
        free,
        total,
    )
}

/// # Safety
/// C ABI: `cuDeviceTotalMem_v2`'s contract; reports the cap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> c_int {
    let Some(f) = real::cuDeviceTotalMem_v2() else {
        return NO_DRIVER;
    };
    super::total_mem_hook(
        "cuDeviceTotalMem_v2",
        CUDA_ERROR_UNKNOWN,
        Api::CuDeviceTotalMem,
        dev,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(bytes, dev) },
        bytes,
    )
}

/// # Safety
/// C ABI: `cuMemAllocHost_v2`'s contract. Traced, never charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> c_int {
    alloc_hook(
        "cuMemAllocHost_v2",
        NO_DRIVER,
        real::cuMemAllocHost_v2,
        || req(Api::CuMemAllocHost, AllocKind::Host, -1, 0, size, 0),
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(pp, size) },
        move || (read_ptr(pp), size as u64),
        move |p| write_ptr(pp, p),
    )
}

/// # Safety
/// C ABI: `cuMemHostAlloc`'s contract. Traced, never charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, fl: c_uint) -> c_int {
    alloc_hook(
        "cuMemHostAlloc",
        NO_DRIVER,
        real::cuMemHostAlloc,
        || req(Api::CuMemHostAlloc, AllocKind::Host, -1, 0, size, 0),
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(pp, size, fl) },
        move || (read_ptr(pp), size as u64),
        move |p| write_ptr(pp, p),
    )
}

/// # Safety
/// C ABI: `cuMemFreeHost`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    free_hook(
        "cuMemFreeHost",
        NO_DRIVER,
        real::cuMemFreeHost,
        Api::CuMemFreeHost,
        p as u64,
        None,
        0,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(p) },
    )
}
