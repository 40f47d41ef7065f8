//! Virtual-memory management entry points. Creating, releasing, mapping, unmapping, reserving
//! and granting access are allowed during any stream capture, in every mode and on every
//! thread, and leave the capture untouched: the driver does not check them (unlike
//! `cuMemAlloc`), since they neither synchronize nor touch any stream.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use crate::abi::*;
use crate::cu_api;
use crate::inject;
use crate::state;
use crate::vmm;

cu_api! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, _option: c_int) {
        state::driver()?;
        // SAFETY: C input struct.
        let p = unsafe { get(prop) }?;
        if p.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            state::check_device(p.location.id)?;
        }
        // SAFETY: C out-pointer.
        unsafe { put(granularity, vmm::GRANULARITY as usize) }
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, _flags: c_ulonglong) {
        state::driver()?;
        if ptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = vmm::reserve(size as u64, alignment as u64, addr)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(ptr, p) }
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        state::driver()?;
        vmm::free_reservation(ptr, size as u64)
    }

    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) {
        state::driver()?;
        // SAFETY: C input struct.
        let p = unsafe { get(prop) }?;
        if handle.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        inject::on_bytes("cuMemCreate", size as u64)?;
        let h = vmm::create(size as u64, p)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(handle, h) }
    }

    fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        state::driver()?;
        vmm::release(handle)
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) {
        state::driver()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        vmm::map(ptr, size as u64, offset as u64, handle)
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        state::driver()?;
        vmm::unmap(ptr, size as u64)
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        state::driver()?;
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: an array of `count` descriptors (C contract).
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        vmm::set_access(ptr, size as u64, descs)
    }

    fn cuMemGetAccess(flags: *mut c_ulonglong, location: *const CUmemLocation, ptr: CUdeviceptr) {
        state::driver()?;
        // SAFETY: C input struct.
        let loc = unsafe { get(location) }?;
        let dev = (loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE).then_some(loc.id);
        let a = vmm::get_access(ptr, dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(flags, a as c_ulonglong) }
    }

    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        state::driver()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = vmm::retain(addr as u64)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(handle, h) }
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) {
        state::driver()?;
        let p = vmm::props(handle)?;
        // SAFETY: C out-pointer.
        unsafe { put(prop, p) }
    }

    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: c_int, _flags: c_ulonglong) {
        state::driver()?;
        let fd = vmm::export(handle, handle_type)?;
        // SAFETY: for POSIX fds the out-parameter is an int (C contract).
        unsafe { put(shareable.cast::<c_int>(), fd) }
    }

    fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: c_int) {
        state::driver()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX fd travels in the pointer-sized argument itself.
        let h = vmm::import(os_handle as usize as c_int, handle_type)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(handle, h) }
    }

    fn cuMemMapArrayAsync(_info: *mut c_void, _count: c_uint, _s: CUstream) {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}
