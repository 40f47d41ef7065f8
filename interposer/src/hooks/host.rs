//! Page-locked host memory, through the runtime and the driver alike: traced, never charged
//! (it is not the device's memory).

use super::req;
use crate::state::live_table::ALLOCS;
use std::ffi::{c_uint, c_void};
use vramshim_trace::{AllocKind, Api};

hooks! {
    ["cudaMallocHost", 0] cudaMallocHost,
    ["cuMemAllocHost", 3020] cuMemAllocHost_v2,
    fn(ptr: *mut *mut c_void, size: usize) |h| {
        let api = h.by_lib(Api::CudaMallocHost, Api::CuMemAllocHost);
        let r = || req(api, AllocKind::Host, -1, 0, size, 0);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.linear(ptr, size, false, r, move |f| unsafe { f(ptr, size) })
    }

    ["cudaHostAlloc", 0] cudaHostAlloc,
    ["cuMemHostAlloc", 2020] cuMemHostAlloc,
    fn(ptr: *mut *mut c_void, size: usize, fl: c_uint) |h| {
        let api = h.by_lib(Api::CudaHostAlloc, Api::CuMemHostAlloc);
        let r = || req(api, AllocKind::Host, -1, 0, size, 0);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.linear(ptr, size, false, r, move |f| unsafe { f(ptr, size, fl) })
    }

    ["cudaFreeHost", 0] cudaFreeHost,
    ["cuMemFreeHost", 2000] cuMemFreeHost,
    fn(ptr: *mut c_void) |h| {
        let api = h.by_lib(Api::CudaFreeHost, Api::CuMemFreeHost);
        // SAFETY: forwarding the caller's arguments unchanged.
        h.free(&ALLOCS, api, ptr as u64, None, move |f| unsafe { f(ptr) })
    }
}
