//! Hand-written C ABI types and codes (CUDA 12.x / 13.x where they agree). Codes are plain
//! integers: a value we do not know (a newer driver's error) passes through untouched.
#![allow(non_camel_case_types, non_upper_case_globals, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

/// `cudaError_t`.
pub(crate) type cudaError_t = c_int;
/// `CUresult`.
pub(crate) type CUresult = c_int;
/// `nvmlReturn_t`.
pub(crate) type nvmlReturn_t = c_int;

pub(crate) type CUdevice = c_int;
pub(crate) type CUdeviceptr = c_ulonglong;
pub(crate) type CUmemGenericAllocationHandle = c_ulonglong;
pub(crate) type CUstream = *mut c_void;
pub(crate) type CUevent = *mut c_void;
pub(crate) type CUcontext = *mut c_void;
pub(crate) type CUmemoryPool = *mut c_void;
pub(crate) type cudaStream_t = *mut c_void;
pub(crate) type cudaMemPool_t = *mut c_void;
pub(crate) type nvmlDevice_t = *mut c_void;

pub(crate) const CUDA_SUCCESS: c_int = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: c_int = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY` == `cudaErrorMemoryAllocation`.
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: c_int = 2;
pub(crate) const CUDA_ERROR_NOT_INITIALIZED: c_int = 3;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: c_int = 201;
pub(crate) const CUDA_ERROR_NOT_FOUND: c_int = 500;
pub(crate) const CUDA_ERROR_UNKNOWN: c_int = 999;

pub(crate) const cudaSuccess: c_int = 0;
pub(crate) const cudaErrorMemoryAllocation: c_int = 2;
/// What the real runtime returns for everything when there is no driver.
pub(crate) const cudaErrorInsufficientDriver: c_int = 35;
pub(crate) const cudaErrorUnknown: c_int = 999;

pub(crate) const NVML_SUCCESS: c_int = 0;
pub(crate) const NVML_ERROR_UNINITIALIZED: c_int = 1;
pub(crate) const NVML_ERROR_UNKNOWN: c_int = 999;

/// `cuGetProcAddress` flags.
pub(crate) const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 1 << 1;
/// `cudaGetDriverEntryPoint` flags.
pub(crate) const cudaEnablePerThreadDefaultStream: u64 = 0x2;

/// `CUmemLocationType`.
pub(crate) const CU_MEM_LOCATION_TYPE_INVALID: c_int = 0;
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_int = 3;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_int = 4;

/// `CUmemLocation` (8 bytes in 12.x and 13.x; 13.2+ wraps `id` in a same-size union).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemAllocFlags {
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAllocationProp` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub alloc_flags: CUmemAllocFlags,
}

/// The leading fields of `CUmemPoolProps` (the rest is only passed on, never read).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemPoolPropsHead {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
}

/// `CUmemAccessDesc` (12 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `struct cudaPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `struct cudaExtent` (passed by value to `cudaMalloc3D`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// Offset of `size_t totalGlobalMem` in `struct cudaDeviceProp`, the same in CUDA 12 and 13:
/// `char name[256]; cudaUUID_t uuid (16); char luid[8]; unsigned luidDeviceNodeMask;` + padding.
pub(crate) const CUDA_DEVICE_PROP_TOTAL_GLOBAL_MEM_OFFSET: usize = 288;

// Function-pointer types of the real functions (u32/c_int codes, never Rust enums).
pub type PfnCudaMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> cudaError_t;
pub type PfnCudaFree = unsafe extern "C" fn(*mut c_void) -> cudaError_t;
pub(crate) type PfnCudaMallocAsync =
    unsafe extern "C" fn(*mut *mut c_void, usize, cudaStream_t) -> cudaError_t;
pub type PfnCudaFreeAsync = unsafe extern "C" fn(*mut c_void, cudaStream_t) -> cudaError_t;
pub(crate) type PfnCudaMallocFromPoolAsync =
    unsafe extern "C" fn(*mut *mut c_void, usize, cudaMemPool_t, cudaStream_t) -> cudaError_t;
pub(crate) type PfnCudaMallocPitch =
    unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> cudaError_t;
pub type PfnCudaMalloc3D = unsafe extern "C" fn(*mut cudaPitchedPtr, cudaExtent) -> cudaError_t;
pub(crate) type PfnCudaMallocManaged =
    unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
pub type PfnCudaHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> cudaError_t;
pub type PfnCudaMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> cudaError_t;
pub type PfnCudaDeviceReset = unsafe extern "C" fn() -> cudaError_t;
pub type PfnCudaGetDevice = unsafe extern "C" fn(*mut c_int) -> cudaError_t;
pub type PfnCudaGetDeviceProperties = unsafe extern "C" fn(*mut c_void, c_int) -> cudaError_t;
pub(crate) type PfnCudaGetDriverEntryPoint =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_ulonglong, *mut c_int) -> cudaError_t;
pub type PfnCudaGetDriverEntryPointByVersion = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_uint,
    c_ulonglong,
    *mut c_int,
) -> cudaError_t;

pub type PfnCuMemAlloc = unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult;
pub type PfnCuMemFree = unsafe extern "C" fn(CUdeviceptr) -> CUresult;
pub(crate) type PfnCuMemAllocPitch =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
pub type PfnCuMemAllocManaged = unsafe extern "C" fn(*mut CUdeviceptr, usize, c_uint) -> CUresult;
pub type PfnCuMemAllocAsync = unsafe extern "C" fn(*mut CUdeviceptr, usize, CUstream) -> CUresult;
pub type PfnCuMemFreeAsync = unsafe extern "C" fn(CUdeviceptr, CUstream) -> CUresult;
pub(crate) type PfnCuMemAllocFromPoolAsync =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
pub type PfnCuMemCreate = unsafe extern "C" fn(
    *mut CUmemGenericAllocationHandle,
    usize,
    *const CUmemAllocationProp,
    c_ulonglong,
) -> CUresult;
pub type PfnCuMemRelease = unsafe extern "C" fn(CUmemGenericAllocationHandle) -> CUresult;
pub type PfnCuMemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type PfnCuDeviceTotalMem = unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult;
pub type PfnCuMemAllocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> CUresult;
pub type PfnCuMemHostAlloc = unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult;
pub type PfnCuMemFreeHost = unsafe extern "C" fn(*mut c_void) -> CUresult;
pub(crate) type PfnCuGetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
pub(crate) type PfnCuGetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
pub type PfnCuMemMap = unsafe extern "C" fn(
    CUdeviceptr,
    usize,
    usize,
    CUmemGenericAllocationHandle,
    c_ulonglong,
) -> CUresult;
pub type PfnCuMemUnmap = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnCuMemSetAccess =
    unsafe extern "C" fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize) -> CUresult;
pub(crate) type PfnCuMemAddressReserve =
    unsafe extern "C" fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong) -> CUresult;
pub type PfnCuMemAddressFree = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
pub(crate) type PfnCuMemGetAllocationGranularity =
    unsafe extern "C" fn(*mut usize, *const CUmemAllocationProp, c_int) -> CUresult;
pub type PfnCuCtxSynchronize = unsafe extern "C" fn() -> CUresult;
pub type PfnCuStreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
pub type PfnCuStreamDestroy = unsafe extern "C" fn(CUstream) -> CUresult;
pub type PfnCuEventCreate = unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult;
pub type PfnCuEventRecord = unsafe extern "C" fn(CUevent, CUstream) -> CUresult;
pub type PfnCuEventQuery = unsafe extern "C" fn(CUevent) -> CUresult;
pub type PfnCuEventDestroy = unsafe extern "C" fn(CUevent) -> CUresult;
pub type PfnCuEventSynchronize = unsafe extern "C" fn(CUevent) -> CUresult;
pub type PfnCuStreamWaitEvent = unsafe extern "C" fn(CUstream, CUevent, c_uint) -> CUresult;
/// `CUstreamCaptureStatus` out-parameter as a plain int.
pub type PfnCuStreamIsCapturing = unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult;
pub type PfnCuCtxGetDevice = unsafe extern "C" fn(*mut CUdevice) -> CUresult;
pub type PfnCuCtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
pub type PfnCuCtxSetCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
pub type PfnCuCtxEnablePeerAccess = unsafe extern "C" fn(CUcontext, c_uint) -> CUresult;
pub type PfnCudaDeviceEnablePeerAccess = unsafe extern "C" fn(c_int, c_uint) -> cudaError_t;
pub type PfnCuDevicePrimaryCtxRetain = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult;
pub type PfnCuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `cuDeviceGetMemPool` / `cuDeviceGetDefaultMemPool`.
pub type PfnCuDeviceGetMemPool = unsafe extern "C" fn(*mut CUmemoryPool, CUdevice) -> CUresult;
pub(crate) type PfnCuMemPoolCreate =
    unsafe extern "C" fn(*mut CUmemoryPool, *const CUmemPoolPropsHead) -> CUresult;
/// `cuMemPoolTrimTo(pool, minBytesToKeep)`.
pub type PfnCuMemPoolTrimTo = unsafe extern "C" fn(CUmemoryPool, usize) -> CUresult;
/// `cuMemPoolGetAttribute(pool, attr, value)`.
pub(crate) type PfnCuMemPoolGetAttribute =
    unsafe extern "C" fn(CUmemoryPool, c_int, *mut c_void) -> CUresult;
pub(crate) const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub(crate) const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub type PfnCuThreadExchangeStreamCaptureMode = unsafe extern "C" fn(*mut c_int) -> CUresult;
/// `cuStreamBeginCapture(stream)` (global mode).
pub type PfnCuStreamBeginCapture = unsafe extern "C" fn(CUstream) -> CUresult;
/// `cuStreamBeginCapture_v2(stream, mode)`, `cudaStreamBeginCapture(stream, mode)`.
pub type PfnCuStreamBeginCaptureMode = unsafe extern "C" fn(CUstream, c_int) -> CUresult;
/// `cuStreamBeginCaptureToGraph(stream, graph, dependencies, edge data, count, mode)`, and the
/// runtime's of the same arguments.
pub type PfnCuStreamBeginCaptureToGraph = unsafe extern "C" fn(
    CUstream,
    *mut c_void,
    *const c_void,
    *const c_void,
    usize,
    c_int,
) -> CUresult;
/// `cuStreamEndCapture(stream, CUgraph *)`, `cudaStreamEndCapture`.
pub type PfnCuStreamEndCapture = unsafe extern "C" fn(CUstream, *mut *mut c_void) -> CUresult;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` == `cudaErrorStreamCaptureUnsupported`: the
/// operation is not permitted while a capture is under way.
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: c_int = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: a thread-local capture ended on another thread
/// (it goes on).
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: c_int = 908;

pub(crate) type PfnNvmlDeviceGetMemoryInfo =
    unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_t) -> nvmlReturn_t;
pub(crate) type PfnNvmlDeviceGetMemoryInfoV2 =
    unsafe extern "C" fn(nvmlDevice_t, *mut nvmlMemory_v2_t) -> nvmlReturn_t;
/// `cuIpcGetMemHandle(CUipcMemHandle*, CUdeviceptr)`.
pub type PfnIpcGetMemHandle = unsafe extern "C" fn(*mut c_void, u64) -> c_int;
/// `cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*)`.
pub type PfnCudaIpcGetMemHandle = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
pub type PfnCuCtxCreate = unsafe extern "C" fn(*mut CUcontext, c_uint, CUdevice) -> CUresult;
pub type PfnCuDeviceOp = unsafe extern "C" fn(CUdevice) -> CUresult;
pub type PfnNvmlVoid = unsafe extern "C" fn() -> nvmlReturn_t;
pub(crate) type PfnNvmlDeviceGetHandleByIndex =
    unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
pub type PfnCuDeviceGetPCIBusId = unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult;
pub(crate) type PfnNvmlDeviceGetHandleByPciBusId =
    unsafe extern "C" fn(*const c_char, *mut nvmlDevice_t) -> nvmlReturn_t;
pub type PfnNvmlDeviceGetIndex = unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> nvmlReturn_t;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn abi_sizes() {
        assert_eq!(std::mem::size_of::<CUmemLocation>(), 8);
        assert_eq!(std::mem::size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(std::mem::size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(std::mem::size_of::<cudaExtent>(), 24);
        assert_eq!(std::mem::size_of::<nvmlMemory_v2_t>(), 40);
    }
}
