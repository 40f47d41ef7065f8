//! Virtual-memory API hooks: physical memory is charged by handle at `cuMemCreate` (by
//! `prop->location`, never by the calling thread's context) and given back at
//! `cuMemRelease`. Host locations (NCCL's `cuMemHostEnable`) are traced, never charged.
//! Mapping calls (`cuMemMap`, `cuMemAddressReserve`, ...) are not hooked: one handle can be
//! mapped many times.

use super::{OutPtr, req};
use crate::cuda::types::*;
use crate::state::live_table::HANDLES;
use std::ffi::c_ulonglong;
use vramshim_trace::{AllocKind, Api};

/// (kind, device) of a `cuMemCreate` from its properties.
fn classify(prop: *const CUmemAllocationProp) -> (AllocKind, i32) {
    if prop.is_null() {
        return (AllocKind::VmmHandle, -1);
    }
    // SAFETY: non-null pointer to the caller's CUmemAllocationProp; only the first 16 bytes
    // (type, handle types, location) are read, identical in CUDA 12 and 13.
    let loc = unsafe { (*prop).location };
    match loc.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE if loc.id >= 0 => (AllocKind::VmmHandle, loc.id),
        CU_MEM_LOCATION_TYPE_HOST
        | CU_MEM_LOCATION_TYPE_HOST_NUMA
        | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => (AllocKind::Host, -1),
        // Invalid location: nothing charged; the real call reports the error.
        _ => (AllocKind::VmmHandle, -1),
    }
}

hooks! {
    ["cuMemCreate", 10020] cuMemCreate,
    fn(
        handle: *mut CUmemGenericAllocationHandle,
        size: usize,
        prop: *const CUmemAllocationProp,
        fl: c_ulonglong,
    ) |h| {
        let r = || {
            let (kind, device) = classify(prop);
            req(Api::CuMemCreate, kind, device, 0, size, 0)
        };
        h.alloc(
            &HANDLES,
            r,
            || false,
            // SAFETY: forwarding the caller's arguments unchanged.
            move |f| unsafe { f(handle, size, prop, fl) },
            move || (handle.get(), size as u64),
            |_| {},
        )
    }

    ["cuMemRelease", 10020] cuMemRelease,
    fn(handle: CUmemGenericAllocationHandle) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        h.free(&HANDLES, Api::CuMemRelease, handle, None, move |f| unsafe { f(handle) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn host_locations_are_not_device_memory() {
        let mut p = CUmemAllocationProp {
            type_: 1,
            requested_handle_types: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_HOST_NUMA,
                id: 0,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: Default::default(),
        };
        assert_eq!(classify(&p), (AllocKind::Host, -1));
        p.location = CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 3,
        };
        assert_eq!(classify(&p), (AllocKind::VmmHandle, 3));
        assert_eq!(classify(std::ptr::null()), (AllocKind::VmmHandle, -1));
    }
}
