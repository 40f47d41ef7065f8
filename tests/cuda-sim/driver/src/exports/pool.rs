//! Stream-ordered allocation and memory pools.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::cu_api;
use crate::graph;
use crate::inject;
use crate::pool;
use crate::stream;

fn alloc_async(
    api: &str,
    dptr: *mut CUdeviceptr,
    size: usize,
    p: Option<CUmemoryPool>,
    h: CUstream,
    ptds: bool,
) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = stream::resolve(h, ptds)?;
    // Work on the legacy stream, as a stream-ordered free is (see `legacy_check`).
    stream::legacy_check(&s)?;
    // On a capturing stream: an allocation node of the graph (see `graph`). On one that does
    // not capture it allocates at once, which a capture forbids by the mode rules.
    let c = s.capture();
    if c.status == CU_STREAM_CAPTURE_STATUS_NONE {
        stream::capture_unsafe_check(None)?;
    }
    inject::on_bytes(api, size as u64)?;
    let ptr = match c.status {
        CU_STREAM_CAPTURE_STATUS_ACTIVE => {
            let ptr = graph::capture_alloc(c.id, s.dev, size as u64)?;
            s.captured_node();
            ptr
        }
        CU_STREAM_CAPTURE_STATUS_INVALIDATED => return Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        _ => pool::alloc(p, size as u64)?,
    };
    // SAFETY: C out-pointer, checked above.
    unsafe { put(dptr, ptr) }
}

fn free_async(dptr: CUdeviceptr, h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    if dptr == 0 {
        return Ok(());
    }
    stream::legacy_check(&s)?;
    let c = s.capture();
    match c.status {
        CU_STREAM_CAPTURE_STATUS_ACTIVE if graph::is_graph_alloc(dptr) => {
            graph::capture_free(c.id, dptr)?;
            s.captured_node();
            Ok(())
        }
        // On a capturing stream the free would be a free node, and a free node takes only the
        // address of a graph allocation (cuMemFreeAsync's documentation: "During stream
        // capture, this function results in the creation of a free node and must therefore be
        // passed the address of a graph allocation"; cuGraphAddMemFreeNode:
        // CUDA_ERROR_INVALID_VALUE for "an address that was not returned by an allocation
        // node"). Memory of a stream-ordered pool allocated outside the capture, cuMemAlloc
        // memory and mapped virtual memory are refused alike; the driver refuses the argument,
        // not the capture, which goes on (still active, it ends with a graph). The memory is
        // not freed and stays the caller's.
        CU_STREAM_CAPTURE_STATUS_ACTIVE if crate::config::CONFIG.captured_free_accepted => Ok(()),
        CU_STREAM_CAPTURE_STATUS_ACTIVE => Err(CUDA_ERROR_INVALID_VALUE),
        CU_STREAM_CAPTURE_STATUS_INVALIDATED => Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        // On a stream that does not capture the free is made at once, which a capture forbids
        // by the mode rules.
        _ => {
            stream::capture_unsafe_check(None)?;
            if graph::is_graph_alloc(dptr) {
                graph::free_outside(dptr)
            } else {
                pool::free_async(dptr, &s)
            }
        }
    }
}

cu_api! {
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        alloc_async("cuMemAllocAsync", dptr, size, None, s, false)
    }
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, s: CUstream) {
        alloc_async("cuMemAllocAsync", dptr, size, None, s, true)
    }
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, p: CUmemoryPool, s: CUstream) {
        alloc_async("cuMemAllocFromPoolAsync", dptr, size, Some(p), s, false)
    }
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, p: CUmemoryPool, s: CUstream) {
        alloc_async("cuMemAllocFromPoolAsync", dptr, size, Some(p), s, true)
    }
    fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) { free_async(dptr, s, false) }
    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) { free_async(dptr, s, true) }

    fn cuMemPoolCreate(out: *mut CUmemoryPool, props: *const CUmemPoolProps) {
        // A pool belongs to the device named in its properties, not to a context: NVIDIA's
        // runtime (cudaMemPoolCreate, which RMM's CudaAsyncMemoryResource calls first thing)
        // creates one with no context current, so only an initialized driver is required.
        crate::state::driver()?;
        // SAFETY: C input struct.
        let props = unsafe { get(props) }?;
        if props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = pool::create(props.location.id)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, p) }
    }

    fn cuMemPoolDestroy(p: CUmemoryPool) {
        stream::synchronize_all();
        pool::destroy(p)
    }

    fn cuMemPoolTrimTo(p: CUmemoryPool, keep: usize) {
        // It gives memory back to the device at once: potentially unsafe during a capture.
        stream::capture_unsafe_check(None)?;
        pool::trim_to(p, keep as u64)
    }

    fn cuMemPoolSetAttribute(p: CUmemoryPool, attr: c_int, value: *mut c_void) {
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: value points to an int or a cuuint64_t depending on attr (C contract).
        let v = unsafe {
            if pool::is_int_attr(attr) { *value.cast::<c_int>() as u64 } else { *value.cast::<u64>() }
        };
        pool::set_attr(p, attr, v)
    }

    fn cuMemPoolGetAttribute(p: CUmemoryPool, attr: c_int, value: *mut c_void) {
        let v = pool::get_attr(p, attr)?;
        // SAFETY: value points to an int or a cuuint64_t depending on attr (C contract).
        unsafe {
            if pool::is_int_attr(attr) { put(value.cast::<c_int>(), v as c_int) } else { put(value.cast::<u64>(), v) }
        }
    }

    fn cuMemPoolSetAccess(_p: CUmemoryPool, _map: *const CUmemAccessDesc, _count: usize) {
        Ok(())
    }
}
