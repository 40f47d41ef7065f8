//! Runtime API hooks (`libcudart`): reached through the PLT of programs and libraries that
//! link the shared runtime, and through our `dlsym` hook for those that `dlopen` it.
//! Device = the runtime's current device (`cudaGetDevice`).

use super::{
    NO_RUNTIME, alloc_hook, async_alloc_hook, async_free_hook, free_hook, read_ptr, req, rt_device,
    variant, write_ptr,
};
use crate::cuda::real;
use crate::cuda::types::*;
use crate::pipeline::{self, run_hook};
use std::ffi::{c_int, c_uint, c_void};
use vramshim_trace::{AllocKind, Api};

/// # Safety
/// C ABI: called by CUDA programs with `cudaMalloc`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> c_int {
    alloc_hook(
        "cudaMalloc",
        NO_RUNTIME,
        real::cudaMalloc,
        || req(Api::CudaMalloc, AllocKind::Runtime, rt_device(), 0, size, 0),
        !dev_ptr.is_null(),
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr, size) },
        move || (read_ptr(dev_ptr), size as u64),
        move |p| write_ptr(dev_ptr, p),
    )
}

/// # Safety
/// C ABI: `cudaFree`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> c_int {
    free_hook(
        "cudaFree",
        NO_RUNTIME,
        real::cudaFree,
        Api::CudaFree,
        dev_ptr as u64,
        None,
        0,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr) },
    )
}

fn malloc_async(
    name: &'static str,
    ptsz: bool,
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> c_int {
    async_alloc_hook(
        name,
        NO_RUNTIME,
        variant(ptsz, real::cudaMallocAsync, real::cudaMallocAsync_ptsz),
        Api::CudaMallocAsync,
        rt_device,
        stream as u64,
        size,
        !dev_ptr.is_null(),
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr, size, stream) },
        move || (read_ptr(dev_ptr), size as u64),
        move |p| write_ptr(dev_ptr, p),
    )
}

/// # Safety
/// C ABI: `cudaMallocAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocAsync(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> c_int {
    malloc_async("cudaMallocAsync", false, dev_ptr, size, stream)
}

/// # Safety
/// C ABI: `cudaMallocAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocAsync_ptsz(
    dev_ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> c_int {
    malloc_async("cudaMallocAsync_ptsz", true, dev_ptr, size, stream)
}

fn free_async(name: &'static str, ptsz: bool, dev_ptr: *mut c_void, stream: cudaStream_t) -> c_int {
    async_free_hook(
        name,
        NO_RUNTIME,
        variant(ptsz, real::cudaFreeAsync, real::cudaFreeAsync_ptsz),
        Api::CudaFreeAsync,
        dev_ptr as u64,
        stream as u64,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr, stream) },
    )
}

/// # Safety
/// C ABI: `cudaFreeAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFreeAsync(dev_ptr: *mut c_void, stream: cudaStream_t) -> c_int {
    free_async("cudaFreeAsync", false, dev_ptr, stream)
}

/// # Safety
/// C ABI: `cudaFreeAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(dev_ptr: *mut c_void, stream: cudaStream_t) -> c_int {
    free_async("cudaFreeAsync_ptsz", true, dev_ptr, stream)
}

fn malloc_from_pool(
    name: &'static str,
    ptsz: bool,
    ptr: *mut *mut c_void,
    size: usize,
    pool: cudaMemPool_t,
    stream: cudaStream_t,
) -> c_int {
    async_alloc_hook(
        name,
        NO_RUNTIME,
        variant(
            ptsz,
            real::cudaMallocFromPoolAsync,
            real::cudaMallocFromPoolAsync_ptsz,
        ),
        Api::CudaMallocFromPoolAsync,
        || crate::cuda::mempools::device_of(pool).unwrap_or_else(rt_device),
        stream as u64,
        size,
        false, // the process chose a specific pool
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(ptr, size, pool, stream) },
        move || (read_ptr(ptr), size as u64),
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaMallocFromPoolAsync`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: cudaMemPool_t,
    stream: cudaStream_t,
) -> c_int {
    malloc_from_pool("cudaMallocFromPoolAsync", false, ptr, size, pool, stream)
}

/// # Safety
/// C ABI: `cudaMallocFromPoolAsync_ptsz`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocFromPoolAsync_ptsz(
    ptr: *mut *mut c_void,
    size: usize,
    pool: cudaMemPool_t,
    stream: cudaStream_t,
) -> c_int {
    malloc_from_pool(
        "cudaMallocFromPoolAsync_ptsz",
        true,
        ptr,
        size,
        pool,
        stream,
    )
}

/// # Safety
/// C ABI: `cudaMallocPitch`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocPitch(
    dev_ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> c_int {
    alloc_hook(
        "cudaMallocPitch",
        NO_RUNTIME,
        real::cudaMallocPitch,
        || {
            req(
                Api::CudaMallocPitch,
                AllocKind::Pitch,
                rt_device(),
                0,
                width.saturating_mul(height),
                0,
            )
        },
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr, pitch, width, height) },
        || {
            let p = if pitch.is_null() {
                width
            } else {
                // SAFETY: non-null out-pointer the real call just filled.
                unsafe { *pitch }
            };
            (read_ptr(dev_ptr), p.saturating_mul(height) as u64)
        },
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaMalloc3D`'s contract (`extent` by value).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMalloc3D(pitched: *mut cudaPitchedPtr, extent: cudaExtent) -> c_int {
    let rows = extent.height.max(1).saturating_mul(extent.depth.max(1));
    alloc_hook(
        "cudaMalloc3D",
        NO_RUNTIME,
        real::cudaMalloc3D,
        || {
            req(
                Api::CudaMalloc3D,
                AllocKind::Pitch,
                rt_device(),
                0,
                extent.width.saturating_mul(rows),
                0,
            )
        },
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(pitched, extent) },
        || {
            if pitched.is_null() {
                return (0, 0);
            }
            // SAFETY: non-null out-pointer the real call just filled.
            let pp = unsafe { *pitched };
            (pp.ptr as u64, pp.pitch.saturating_mul(rows) as u64)
        },
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaMallocManaged`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocManaged(
    dev_ptr: *mut *mut c_void,
    size: usize,
    fl: c_uint,
) -> c_int {
    alloc_hook(
        "cudaMallocManaged",
        NO_RUNTIME,
        real::cudaMallocManaged,
        || {
            req(
                Api::CudaMallocManaged,
                AllocKind::Managed,
                rt_device(),
                0,
                size,
                0,
            )
        },
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(dev_ptr, size, fl) },
        move || (read_ptr(dev_ptr), size as u64),
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaMallocHost`'s contract. Traced, never charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMallocHost(ptr: *mut *mut c_void, size: usize) -> c_int {
    alloc_hook(
        "cudaMallocHost",
        NO_RUNTIME,
        real::cudaMallocHost,
        || req(Api::CudaMallocHost, AllocKind::Host, -1, 0, size, 0),
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(ptr, size) },
        move || (read_ptr(ptr), size as u64),
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaHostAlloc`'s contract. Traced, never charged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaHostAlloc(ptr: *mut *mut c_void, size: usize, fl: c_uint) -> c_int {
    alloc_hook(
        "cudaHostAlloc",
        NO_RUNTIME,
        real::cudaHostAlloc,
        || req(Api::CudaHostAlloc, AllocKind::Host, -1, 0, size, 0),
        false,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(ptr, size, fl) },
        move || (read_ptr(ptr), size as u64),
        |_| {},
    )
}

/// # Safety
/// C ABI: `cudaFreeHost`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFreeHost(ptr: *mut c_void) -> c_int {
    free_hook(
        "cudaFreeHost",
        NO_RUNTIME,
        real::cudaFreeHost,
        Api::CudaFreeHost,
        ptr as u64,
        None,
        0,
        // SAFETY: forwarding the caller's arguments unchanged.
        move |f| unsafe { f(ptr) },
    )
}

/// # Safety
/// C ABI: `cudaMemGetInfo`'s contract (NULL out-pointers are the runtime's business).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    let Some(f) = real::cudaMemGetInfo() else {
        return NO_RUNTIME;
    };
    super::meminfo_hook(
        "cudaMemGetInfo",
        cudaErrorUnknown,
        Api::CudaMemGetInfo,
        real::current_runtime_device,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(free, total) },
        free,
        total,
    )
}

/// # Safety
/// C ABI: `cudaDeviceReset`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaDeviceReset() -> c_int {
    let Some(f) = real::cudaDeviceReset() else {
        return NO_RUNTIME;
    };
    run_hook(
        "cudaDeviceReset",
        cudaErrorUnknown,
        // SAFETY: no arguments.
        || unsafe { f() },
        |tok| {
            crate::state::counters::call_in(tok, Api::CudaDeviceReset);
            let dev = real::current_runtime_device();
            // SAFETY: no arguments.
            let rc = unsafe { f() };
            if rc == 0
                && let Some(d) = dev
            {
                pipeline::device_reset(d);
                super::pool_glue::on_device_reset(d);
                super::context::destroyed(d);
            }
            rc
        },
    )
}

fn device_properties(
    name: &'static str,
    slot: fn() -> Option<PfnCudaGetDeviceProperties>,
    prop: *mut c_void,
    device: c_int,
) -> c_int {
    let Some(f) = slot() else {
        return NO_RUNTIME;
    };
    let total_ptr = if prop.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: totalGlobalMem lies at this offset in every cudaDeviceProp layout (CUDA 12
        // and 13); the struct is far larger.
        unsafe {
            prop.cast::<u8>()
                .add(CUDA_DEVICE_PROP_TOTAL_GLOBAL_MEM_OFFSET)
        }
        .cast::<usize>()
    };
    super::total_mem_hook(
        name,
        cudaErrorUnknown,
        Api::CudaGetDeviceProperties,
        device,
        // SAFETY: forwarding the caller's arguments unchanged.
        || unsafe { f(prop, device) },
        total_ptr,
    )
}

/// # Safety
/// C ABI: `cudaGetDeviceProperties`' contract; `totalGlobalMem` reports the cap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDeviceProperties(prop: *mut c_void, device: c_int) -> c_int {
    device_properties(
        "cudaGetDeviceProperties",
        real::cudaGetDeviceProperties,
        prop,
        device,
    )
}

/// # Safety
/// C ABI: `cudaGetDeviceProperties_v2` (what CUDA 12 headers call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaGetDeviceProperties_v2(prop: *mut c_void, device: c_int) -> c_int {
    device_properties(
        "cudaGetDeviceProperties_v2",
        real::cudaGetDeviceProperties_v2,
        prop,
        device,
    )
}
