//! C types and constants of the runtime and driver API, as plain integers (never Rust enums:
//! an unknown value coming back from a driver must not be undefined behaviour).

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `cudaError_t`.
pub type cudaError_t = c_uint;
/// `CUresult`.
pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type cudaStream_t = CUstream;
pub type cudaEvent_t = CUevent;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;

pub mod err {
    //! `cudaError_t` values used by the runtime itself.
    use super::cudaError_t;
    pub const SUCCESS: cudaError_t = 0;
    pub const INVALID_VALUE: cudaError_t = 1;
    pub const MEMORY_ALLOCATION: cudaError_t = 2;
    pub const INITIALIZATION_ERROR: cudaError_t = 3;
    pub const INVALID_MEMCPY_DIRECTION: cudaError_t = 21;
    pub const INSUFFICIENT_DRIVER: cudaError_t = 35;
    pub const NO_DEVICE: cudaError_t = 100;
    pub const INVALID_DEVICE: cudaError_t = 101;
    pub const INVALID_RESOURCE_HANDLE: cudaError_t = 400;
    pub const SYMBOL_NOT_FOUND: cudaError_t = 500;
    pub const NOT_READY: cudaError_t = 600;
    pub const NOT_SUPPORTED: cudaError_t = 801;
    pub const UNKNOWN: cudaError_t = 999;
}

/// `cudaMemcpyKind`.
pub mod memcpy_kind {
    pub const HOST_TO_HOST: u32 = 0;
    pub const HOST_TO_DEVICE: u32 = 1;
    pub const DEVICE_TO_HOST: u32 = 2;
    pub const DEVICE_TO_DEVICE: u32 = 3;
    pub const DEFAULT: u32 = 4;
}

/// `CU_GET_PROC_ADDRESS_*` flags.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `cudaGetDriverEntryPoint` flags.
pub const CUDA_ENABLE_DEFAULT: u64 = 0;
pub const CUDA_ENABLE_LEGACY_STREAM: u64 = 1;
pub const CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUpointer_attribute` values.
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
pub const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
pub const CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// `struct cudaPointerAttributes`.
#[repr(C)]
pub struct cudaPointerAttributes {
    pub type_: c_uint,
    pub device: c_int,
    pub devicePointer: *mut c_void,
    pub hostPointer: *mut c_void,
}

/// `struct cudaPitchedPtr`.
#[repr(C)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `struct cudaExtent`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaIpcMemHandle_t` (same layout as `CUipcMemHandle`; passed by value to
/// `cudaIpcOpenMemHandle`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaIpcMemHandle_t {
    pub reserved: [c_char; 64],
}

/// `cudaIpcEventHandle_t` (same layout as `CUipcEventHandle`; passed by value to
/// `cudaIpcOpenEventHandle`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaIpcEventHandle_t {
    pub reserved: [c_char; 64],
}

/// `cudaHostFn_t` / `CUhostFn`.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
/// `cudaStreamCallback_t` / `CUstreamCallback` (status is a `cudaError_t` / `CUresult`).
pub type StreamCallback = Option<unsafe extern "C" fn(CUstream, c_uint, *mut c_void)>;

/// `struct cudaDeviceProp` of CUDA 12.8/12.9 (`libcudart.so.12`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaDeviceProp12 {
    pub name: [c_char; 256],
    pub uuid: [c_char; 16],
    pub luid: [c_char; 8],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub memPitch: usize,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub clockRate: c_int,
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub deviceOverlap: c_int,
    pub multiProcessorCount: c_int,
    pub kernelExecTimeoutEnabled: c_int,
    pub integrated: c_int,
    pub canMapHostMemory: c_int,
    pub computeMode: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture1DMipmap: c_int,
    pub maxTexture1DLinear: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture2DMipmap: [c_int; 2],
    pub maxTexture2DLinear: [c_int; 3],
    pub maxTexture2DGather: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub maxTexture3DAlt: [c_int; 3],
    pub maxTextureCubemap: c_int,
    pub maxTexture1DLayered: [c_int; 2],
    pub maxTexture2DLayered: [c_int; 3],
    pub maxTextureCubemapLayered: [c_int; 2],
    pub maxSurface1D: c_int,
    pub maxSurface2D: [c_int; 2],
    pub maxSurface3D: [c_int; 3],
    pub maxSurface1DLayered: [c_int; 2],
    pub maxSurface2DLayered: [c_int; 3],
    pub maxSurfaceCubemap: c_int,
    pub maxSurfaceCubemapLayered: [c_int; 2],
    pub surfaceAlignment: usize,
    pub concurrentKernels: c_int,
    pub ECCEnabled: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub pciDomainID: c_int,
    pub tccDriver: c_int,
    pub asyncEngineCount: c_int,
    pub unifiedAddressing: c_int,
    pub memoryClockRate: c_int,
    pub memoryBusWidth: c_int,
    pub l2CacheSize: c_int,
    pub persistingL2CacheMaxSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub streamPrioritiesSupported: c_int,
    pub globalL1CacheSupported: c_int,
    pub localL1CacheSupported: c_int,
    pub sharedMemPerMultiprocessor: usize,
    pub regsPerMultiprocessor: c_int,
    pub managedMemory: c_int,
    pub isMultiGpuBoard: c_int,
    pub multiGpuBoardGroupID: c_int,
    pub hostNativeAtomicSupported: c_int,
    pub singleToDoublePrecisionPerfRatio: c_int,
    pub pageableMemoryAccess: c_int,
    pub concurrentManagedAccess: c_int,
    pub computePreemptionSupported: c_int,
    pub canUseHostPointerForRegisteredMem: c_int,
    pub cooperativeLaunch: c_int,
    pub cooperativeMultiDeviceLaunch: c_int,
    pub sharedMemPerBlockOptin: usize,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub maxBlocksPerMultiProcessor: c_int,
    pub accessPolicyMaxWindowSize: c_int,
    pub reservedSharedMemPerBlock: usize,
    pub hostRegisterSupported: c_int,
    pub sparseCudaArraySupported: c_int,
    pub hostRegisterReadOnlySupported: c_int,
    pub timelineSemaphoreInteropSupported: c_int,
    pub memoryPoolsSupported: c_int,
    pub gpuDirectRDMASupported: c_int,
    pub gpuDirectRDMAFlushWritesOptions: c_uint,
    pub gpuDirectRDMAWritesOrdering: c_int,
    pub memoryPoolSupportedHandleTypes: c_uint,
    pub deferredMappingCudaArraySupported: c_int,
    pub ipcEventSupported: c_int,
    pub clusterLaunch: c_int,
    pub unifiedFunctionPointers: c_int,
    pub reserved: [c_int; 63],
}

/// `struct cudaDeviceProp` of CUDA 13.0 (`libcudart.so.13`): `clockRate`, `deviceOverlap`,
/// `kernelExecTimeoutEnabled`, `computeMode`, `maxTexture1DLinear`, `memoryClockRate`,
/// `singleToDoublePrecisionPerfRatio` and `cooperativeMultiDeviceLaunch` are gone; NUMA,
/// MPS and PCI ids were added.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaDeviceProp13 {
    pub name: [c_char; 256],
    pub uuid: [c_char; 16],
    pub luid: [c_char; 8],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub memPitch: usize,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub multiProcessorCount: c_int,
    pub integrated: c_int,
    pub canMapHostMemory: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture1DMipmap: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture2DMipmap: [c_int; 2],
    pub maxTexture2DLinear: [c_int; 3],
    pub maxTexture2DGather: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub maxTexture3DAlt: [c_int; 3],
    pub maxTextureCubemap: c_int,
    pub maxTexture1DLayered: [c_int; 2],
    pub maxTexture2DLayered: [c_int; 3],
    pub maxTextureCubemapLayered: [c_int; 2],
    pub maxSurface1D: c_int,
    pub maxSurface2D: [c_int; 2],
    pub maxSurface3D: [c_int; 3],
    pub maxSurface1DLayered: [c_int; 2],
    pub maxSurface2DLayered: [c_int; 3],
    pub maxSurfaceCubemap: c_int,
    pub maxSurfaceCubemapLayered: [c_int; 2],
    pub surfaceAlignment: usize,
    pub concurrentKernels: c_int,
    pub ECCEnabled: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub pciDomainID: c_int,
    pub tccDriver: c_int,
    pub asyncEngineCount: c_int,
    pub unifiedAddressing: c_int,
    pub memoryBusWidth: c_int,
    pub l2CacheSize: c_int,
    pub persistingL2CacheMaxSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub streamPrioritiesSupported: c_int,
    pub globalL1CacheSupported: c_int,
    pub localL1CacheSupported: c_int,
    pub sharedMemPerMultiprocessor: usize,
    pub regsPerMultiprocessor: c_int,
    pub managedMemory: c_int,
    pub isMultiGpuBoard: c_int,
    pub multiGpuBoardGroupID: c_int,
    pub hostNativeAtomicSupported: c_int,
    pub pageableMemoryAccess: c_int,
    pub concurrentManagedAccess: c_int,
    pub computePreemptionSupported: c_int,
    pub canUseHostPointerForRegisteredMem: c_int,
    pub cooperativeLaunch: c_int,
    pub sharedMemPerBlockOptin: usize,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub maxBlocksPerMultiProcessor: c_int,
    pub accessPolicyMaxWindowSize: c_int,
    pub reservedSharedMemPerBlock: usize,
    pub hostRegisterSupported: c_int,
    pub sparseCudaArraySupported: c_int,
    pub hostRegisterReadOnlySupported: c_int,
    pub timelineSemaphoreInteropSupported: c_int,
    pub memoryPoolsSupported: c_int,
    pub gpuDirectRDMASupported: c_int,
    pub gpuDirectRDMAFlushWritesOptions: c_uint,
    pub gpuDirectRDMAWritesOrdering: c_int,
    pub memoryPoolSupportedHandleTypes: c_uint,
    pub deferredMappingCudaArraySupported: c_int,
    pub ipcEventSupported: c_int,
    pub clusterLaunch: c_int,
    pub unifiedFunctionPointers: c_int,
    pub deviceNumaConfig: c_int,
    pub deviceNumaId: c_int,
    pub mpsEnabled: c_int,
    pub hostNumaId: c_int,
    pub gpuPciDeviceID: c_uint,
    pub gpuPciSubsystemID: c_uint,
    pub hostNumaMultinodeIpcSupported: c_int,
    pub reserved: [c_int; 56],
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn device_prop_layouts() {
        // sizeof(struct cudaDeviceProp) of the 12.x headers.
        assert_eq!(size_of::<cudaDeviceProp12>(), 1032);
        assert_eq!(offset_of!(cudaDeviceProp12, totalGlobalMem), 288);
        assert_eq!(offset_of!(cudaDeviceProp13, totalGlobalMem), 288);
        // 13.0 dropped 8 int fields, added 7 and shrank reserved[63] to reserved[56] (layout
        // from the 13.0 headers as bindgen'd by cudarc's cuda-13000 feature).
        assert_eq!(size_of::<cudaDeviceProp13>(), 1008);
        assert_eq!(offset_of!(cudaDeviceProp12, multiProcessorCount), 388);
        assert_eq!(offset_of!(cudaDeviceProp13, multiProcessorCount), 384);
    }

    #[test]
    fn small_struct_layouts() {
        assert_eq!(size_of::<cudaPointerAttributes>(), 24);
        assert_eq!(size_of::<cudaPitchedPtr>(), 32);
        assert_eq!(size_of::<cudaExtent>(), 24);
        assert_eq!(size_of::<cudaIpcMemHandle_t>(), 64);
    }
}
