//! Linear device memory, pinned host memory, memory info and pointer attributes.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::ctx;
use crate::cu_api;
use crate::inject;
use crate::mem::{self, Kind};
use crate::pool;
use crate::state;
use crate::stream;
use crate::vmm;

fn alloc(api: &str, dptr: *mut CUdeviceptr, size: usize, kind: Kind) -> Res {
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = ctx::current_device()?;
    stream::capture_unsafe_check(None)?;
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    inject::on_bytes(api, size as u64)?;
    let p = mem::alloc(dev, size as u64, kind)?;
    // SAFETY: C out-pointer, checked above.
    unsafe { put(dptr, p) }
}

/// cuMemFree_v2: waits for the device (every stream idle) first, as the real one does.
pub fn free(dptr: CUdeviceptr) -> Res {
    state::driver()?;
    if dptr == 0 {
        return Ok(());
    }
    ctx::current_device()?;
    stream::capture_unsafe_check(None)?;
    stream::synchronize_all();
    if crate::graph::is_graph_alloc(dptr) {
        return crate::graph::free_outside(dptr);
    }
    if pool::free_now(dptr)? {
        return Ok(());
    }
    mem::free(dptr, |k| matches!(k, Kind::Device | Kind::Managed)).map(|_| ())
}

/// (free, total) of the current context's device: device-wide, every process counted.
fn info() -> Result<(u64, u64), CUresult> {
    let phys = state::physical(ctx::current_device()?)?;
    let d = state::driver()?;
    Ok((d.dev.free(phys), d.dev.capacity()))
}

/// The allocation containing `ptr`: (base, size, device, memory type, pool).
pub fn range_of(ptr: u64) -> Option<(u64, u64, i32, c_uint, Option<Kind>)> {
    if let Some((b, a)) = mem::find(ptr) {
        let ty = if a.kind == Kind::Managed {
            CU_MEMORYTYPE_UNIFIED
        } else {
            CU_MEMORYTYPE_DEVICE
        };
        return Some((b, a.size, a.dev, ty, Some(a.kind)));
    }
    if let Some((b, len, dev)) = vmm::mapping_of(ptr) {
        return Some((b, len, dev, CU_MEMORYTYPE_DEVICE, None));
    }
    mem::host_find(ptr).map(|(b, l)| (b, l, -1, CU_MEMORYTYPE_HOST, None))
}

/// One pointer attribute, written to `data` (whose type depends on the attribute).
///
/// # Safety
/// `data` is valid for the attribute's type, per the C contract.
unsafe fn pointer_attribute(data: *mut c_void, attr: c_int, ptr: u64) -> Res {
    let r = range_of(ptr);
    let (base, size, dev, ty, kind) = r.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ctx_h = if dev >= 0 {
        ctx::primary_handle(dev)
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: data points to the attribute's type (C contract).
    unsafe {
        match attr {
            CU_POINTER_ATTRIBUTE_CONTEXT => put(data.cast::<CUcontext>(), ctx_h),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => put(data.cast::<c_uint>(), ty),
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER | CU_POINTER_ATTRIBUTE_HOST_POINTER => {
                put(data.cast::<u64>(), ptr)
            }
            CU_POINTER_ATTRIBUTE_SYNC_MEMOPS | CU_POINTER_ATTRIBUTE_MAPPED => {
                put(data.cast::<c_int>(), 1)
            }
            CU_POINTER_ATTRIBUTE_BUFFER_ID => put(data.cast::<u64>(), base),
            CU_POINTER_ATTRIBUTE_IS_MANAGED => {
                put(data.cast::<c_int>(), (kind == Some(Kind::Managed)) as c_int)
            }
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => put(data.cast::<c_int>(), dev.max(0)),
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => put(data.cast::<u64>(), base),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => put(data.cast::<usize>(), size as usize),
            CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => put(data.cast::<c_int>(), 3),
            CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => put(
                data.cast::<CUmemoryPool>(),
                pool::pool_of(base).unwrap_or(std::ptr::null_mut()),
            ),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
}

cu_api! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        alloc("cuMemAlloc", dptr, bytesize, Kind::Device)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, _flags: c_uint) {
        alloc("cuMemAllocManaged", dptr, bytesize, Kind::Managed)
    }

    fn cuMemAllocPitch_v2(
        dptr: *mut CUdeviceptr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_size: c_uint,
    ) {
        if pitch.is_null() || !matches!(element_size, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = mem::round_up(width as u64, 512) as usize;
        let total = p.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        alloc("cuMemAllocPitch", dptr, total, Kind::Device)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(pitch, p) }
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        free(dptr)
    }

    fn cuMemGetInfo_v2(free_out: *mut usize, total_out: *mut usize) {
        let (f, t) = info()?;
        // SAFETY: C out-pointers.
        unsafe {
            put(free_out, f as usize)?;
            put(total_out, t as usize)
        }
    }

    fn cuMemGetInfo(free_out: *mut c_uint, total_out: *mut c_uint) {
        let (f, t) = info()?;
        // SAFETY: C out-pointers (the 32-bit v1 ABI).
        unsafe {
            put(free_out, f.min(u32::MAX as u64) as c_uint)?;
            put(total_out, t.min(u32::MAX as u64) as c_uint)
        }
    }

    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        ctx::current_device()?;
        let (b, s, dev, _, _) = range_of(dptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
        if dev < 0 {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        // Either out-pointer may be NULL.
        if !pbase.is_null() {
            // SAFETY: non-null C out-pointer.
            unsafe { put(pbase, b) }?;
        }
        if !psize.is_null() {
            // SAFETY: non-null C out-pointer.
            unsafe { put(psize, s as usize) }?;
        }
        Ok(())
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) {
        state::driver()?;
        if data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: data is valid for the attribute's type (C contract).
        unsafe { pointer_attribute(data, attribute, ptr) }
    }

    fn cuPointerGetAttributes(n: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) {
        state::driver()?;
        if attributes.is_null() || data.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let known = range_of(ptr).is_some();
        for i in 0..n as usize {
            // SAFETY: arrays of n entries (C contract).
            let (a, d) = unsafe { (*attributes.add(i), *data.add(i)) };
            if d.is_null() {
                continue;
            }
            if known {
                // SAFETY: d is valid for attribute a's type.
                unsafe { pointer_attribute(d, a, ptr) }?;
            } else if a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE {
                // Unregistered host memory: type 0, as the real driver reports it.
                // SAFETY: d is a c_uint for MEMORY_TYPE.
                unsafe { put(d.cast::<c_uint>(), 0) }?;
            }
        }
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        ctx::current_device()?;
        if pp.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = mem::host_alloc(bytesize as u64)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(pp, p as *mut c_void) }
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, _flags: c_uint) {
        ctx::current_device()?;
        if pp.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = mem::host_alloc(bytesize as u64)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(pp, p as *mut c_void) }
    }

    fn cuMemFreeHost(p: *mut c_void) {
        state::driver()?;
        stream::synchronize_all();
        mem::host_free(p as u64)
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut CUdeviceptr, p: *mut c_void, _flags: c_uint) {
        ctx::current_device()?;
        mem::host_find(p as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: C out-pointer.
        unsafe { put(dptr, p as u64) }
    }

    fn cuMemHostRegister_v2(p: *mut c_void, _bytesize: usize, _flags: c_uint) {
        ctx::current_device()?;
        if p.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        ctx::current_device()?;
        if p.is_null() { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
    }

    fn cuMemAdvise(_dptr: CUdeviceptr, _count: usize, _advice: c_int, _dev: CUdevice) {
        ctx::current_device().map(|_| ())
    }

    fn cuMemAdvise_v2(_dptr: CUdeviceptr, _count: usize, _advice: c_int, _loc: CUmemLocation) {
        ctx::current_device().map(|_| ())
    }

    fn cuMemPrefetchAsync(_dptr: CUdeviceptr, _count: usize, _dev: CUdevice, s: CUstream) {
        stream::resolve(s, false).map(|_| ())
    }

    fn cuMemPrefetchAsync_v2(_dptr: CUdeviceptr, _count: usize, _loc: CUmemLocation, _flags: c_uint, s: CUstream) {
        stream::resolve(s, false).map(|_| ())
    }
}

/// `CUipcMemHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

cu_api! {
    /// Legacy IPC: a handle for a cuMemAlloc allocation (its base address and the pid);
    /// other memory (VMM mappings, pools, host) is CUDA_ERROR_INVALID_VALUE. Opening a handle in
    /// another process is not simulated (device memory is private anonymous memory here).
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) {
        ctx::current_device()?;
        match mem::find(dptr) {
            Some((b, a)) if b == dptr && matches!(a.kind, Kind::Device) => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let mut h = CUipcMemHandle { reserved: [0; 64] };
        h.reserved[..8].copy_from_slice(&dptr.to_le_bytes());
        h.reserved[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        h.reserved[12..20].copy_from_slice(b"vramsim\0");
        // SAFETY: C out-pointer.
        unsafe { put(handle, h) }
    }

    fn cuIpcOpenMemHandle_v2(_dptr: *mut CUdeviceptr, _handle: CUipcMemHandle, _flags: c_uint) {
        ctx::current_device()?;
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }

    fn cuIpcCloseMemHandle(_dptr: CUdeviceptr) {
        ctx::current_device()?;
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}
