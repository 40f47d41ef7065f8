//! Runtime API hooks (`libcudart`): reached through the PLT of programs and libraries that
//! link the shared runtime, and through our `dlsym` hook for those that `dlopen` it.
//! Device = the runtime's current device (`cudaGetDevice`).

use super::{OutPtr, Site, req, rt_device};
use crate::cuda::real;
use crate::cuda::types::*;
use crate::state::live_table::ALLOCS;
use std::ffi::{c_int, c_uint, c_void};
use vramshim_trace::{AllocKind, Api};

hooks! {
    /// The pool may serve it.
    ["cudaMalloc", 0] cudaMalloc,
    fn(dev_ptr: *mut *mut c_void, size: usize) |h| {
        let r = || req(Api::CudaMalloc, AllocKind::Runtime, rt_device(), 0, size, 0);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.linear(dev_ptr, size, true, r, move |f| unsafe { f(dev_ptr, size) })
    }

    ["cudaFree", 0] cudaFree,
    fn(dev_ptr: *mut c_void) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        h.free(&ALLOCS, Api::CudaFree, dev_ptr as u64, None, move |f| unsafe { f(dev_ptr) })
    }

    ["cudaMallocAsync", 0] cudaMallocAsync,
    ["cudaMallocAsync", 0, ptds] cudaMallocAsync_ptsz,
    fn(dev_ptr: *mut *mut c_void, size: usize, stream: cudaStream_t) |h| {
        let s = stream as u64;
        // SAFETY: forwarding the caller's arguments unchanged.
        h.stream_ordered(Api::CudaMallocAsync, rt_device, dev_ptr, size, s, None, move |f| unsafe { f(dev_ptr, size, stream) })
    }

    ["cudaFreeAsync", 0] cudaFreeAsync,
    ["cudaFreeAsync", 0, ptds] cudaFreeAsync_ptsz,
    fn(dev_ptr: *mut c_void, stream: cudaStream_t) |h| {
        let (key, s) = (dev_ptr as u64, Some(stream as u64));
        // SAFETY: forwarding the caller's arguments unchanged.
        h.free(&ALLOCS, Api::CudaFreeAsync, key, s, move |f| unsafe { f(dev_ptr, stream) })
    }

    ["cudaMallocFromPoolAsync", 0] cudaMallocFromPoolAsync,
    ["cudaMallocFromPoolAsync", 0, ptds] cudaMallocFromPoolAsync_ptsz,
    fn(
        ptr: *mut *mut c_void,
        size: usize,
        pool: cudaMemPool_t,
        stream: cudaStream_t,
    ) |h| {
        let s = stream as u64;
        // SAFETY: forwarding the caller's arguments unchanged.
        h.stream_ordered(Api::CudaMallocFromPoolAsync, rt_device, ptr, size, s, Some(pool), move |f| unsafe { f(ptr, size, pool, stream) })
    }

    /// Charged width x height; the footprint is pitch x height (known after the call).
    ["cudaMallocPitch", 0] cudaMallocPitch,
    fn(
        dev_ptr: *mut *mut c_void,
        pitch: *mut usize,
        width: usize,
        height: usize,
    ) |h| {
        h.alloc(
            &ALLOCS,
            || req(Api::CudaMallocPitch, AllocKind::Pitch, rt_device(), 0, width.saturating_mul(height), 0),
            || false,
            // SAFETY: forwarding the caller's arguments unchanged.
            move |f| unsafe { f(dev_ptr, pitch, width, height) },
            || {
                let p = super::read_usize(pitch).unwrap_or(width as u64);
                (dev_ptr.get(), p.saturating_mul(height as u64))
            },
            |_| {},
        )
    }

    /// `extent` by value.
    ["cudaMalloc3D", 0] cudaMalloc3D,
    fn(pitched: *mut cudaPitchedPtr, extent: cudaExtent) |h| {
        let rows = extent.height.max(1).saturating_mul(extent.depth.max(1));
        h.alloc(
            &ALLOCS,
            || req(Api::CudaMalloc3D, AllocKind::Pitch, rt_device(), 0, extent.width.saturating_mul(rows), 0),
            || false,
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

    ["cudaMallocManaged", 0] cudaMallocManaged,
    fn(dev_ptr: *mut *mut c_void, size: usize, fl: c_uint) |h| {
        let r = || req(Api::CudaMallocManaged, AllocKind::Managed, rt_device(), 0, size, 0);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.linear(dev_ptr, size, false, r, move |f| unsafe { f(dev_ptr, size, fl) })
    }

    /// NULL out-pointers are the runtime's business.
    ["cudaMemGetInfo", 0] cudaMemGetInfo,
    fn(free: *mut usize, total: *mut usize) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        super::meminfo_hook(h, Api::CudaMemGetInfo, real::current_runtime_device, free, total, |f| unsafe { f(free, total) })
    }

    ["cudaDeviceReset", 0] cudaDeviceReset,
    fn() |h| {
        // SAFETY: no arguments.
        h.guarded(|f| unsafe { f() }, |tok, call| {
            crate::state::counters::call_in(tok, Api::CudaDeviceReset);
            let dev = real::current_runtime_device();
            let rc = call();
            if rc == 0
                && let Some(d) = dev
            {
                super::context::reset(d);
            }
            rc
        })
    }

    /// `totalGlobalMem` reports the cap.
    ["cudaGetDeviceProperties", 0] cudaGetDeviceProperties,
    ["cudaGetDeviceProperties", 0] cudaGetDeviceProperties_v2,
    fn(prop: *mut c_void, device: c_int) |h| {
        device_properties(h, prop, device)
    }
}

fn device_properties(
    h: Site<PfnCudaGetDeviceProperties>,
    prop: *mut c_void,
    device: c_int,
) -> c_int {
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
    // SAFETY: forwarding the caller's arguments unchanged.
    super::total_mem_hook(
        h,
        Api::CudaGetDeviceProperties,
        device,
        total_ptr,
        |f| unsafe { f(prop, device) },
    )
}
