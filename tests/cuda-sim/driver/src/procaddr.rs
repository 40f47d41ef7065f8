//! cuGetProcAddress: one table of (base name, first CUDA version, exported symbol, per-thread
//! stream symbol). A lookup picks the newest variant whose version is <= the caller's
//! `cudaVersion`, and its `_ptsz`/`_ptds` form when the caller passes
//! CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. Addresses handed out are those of the
//! exported symbols themselves, so `dlsym(h, "cuMemAlloc_v2")` and
//! `cuGetProcAddress("cuMemAlloc", 12000)` agree.

use std::ffi::{c_int, c_void};
use std::sync::LazyLock;

use crate::abi::*;
use crate::config::CONFIG;
use crate::exports::ctx::*;
use crate::exports::device::*;
use crate::exports::extra::*;
use crate::exports::mem::*;
use crate::exports::memcpy::*;
use crate::exports::module::*;
use crate::exports::pool::*;
use crate::exports::stream::*;
use crate::exports::streamops::*;
use crate::exports::vmm::*;

pub struct Entry {
    pub base: &'static str,
    pub version: c_int,
    pub symbol: &'static str,
    pub f: usize,
    pub ptsz: Option<(&'static str, usize)>,
}

macro_rules! table {
    ($( $base:literal $ver:literal $sym:ident $(| $pt:ident)? ;)*) => {
        vec![$(
            Entry {
                base: $base,
                version: $ver,
                symbol: stringify!($sym),
                f: $sym as *const () as usize,
                ptsz: None $(.or(Some((stringify!($pt), $pt as *const () as usize))))?,
            },
        )*]
    };
}

pub static TABLE: LazyLock<Vec<Entry>> = LazyLock::new(|| {
    table! {
        "cuInit" 2000 cuInit;
        "cuDriverGetVersion" 2020 cuDriverGetVersion;
        "cuGetProcAddress" 11030 cuGetProcAddress;
        "cuGetProcAddress" 12000 cuGetProcAddress_v2;
        "cuGetExportTable" 3000 cuGetExportTable;
        "cuGetErrorString" 6000 cuGetErrorString;
        "cuGetErrorName" 6000 cuGetErrorName;
        "cuDeviceGet" 2000 cuDeviceGet;
        "cuDeviceGetCount" 2000 cuDeviceGetCount;
        "cuDeviceGetName" 2000 cuDeviceGetName;
        "cuDeviceGetUuid" 9020 cuDeviceGetUuid;
        "cuDeviceGetUuid" 11040 cuDeviceGetUuid_v2;
        "cuDeviceGetPCIBusId" 4010 cuDeviceGetPCIBusId;
        "cuDeviceTotalMem" 2000 cuDeviceTotalMem;
        "cuDeviceTotalMem" 3020 cuDeviceTotalMem_v2;
        "cuDeviceGetAttribute" 2000 cuDeviceGetAttribute;
        "cuDeviceCanAccessPeer" 4000 cuDeviceCanAccessPeer;
        "cuDeviceGetDefaultMemPool" 11020 cuDeviceGetDefaultMemPool;
        "cuDeviceGetMemPool" 11020 cuDeviceGetMemPool;
        "cuDeviceSetMemPool" 11020 cuDeviceSetMemPool;
        "cuDeviceGetGraphMemAttribute" 11040 cuDeviceGetGraphMemAttribute;
        "cuDeviceSetGraphMemAttribute" 11040 cuDeviceSetGraphMemAttribute;
        "cuDeviceGraphMemTrim" 11040 cuDeviceGraphMemTrim;
        "cuDevicePrimaryCtxRetain" 7000 cuDevicePrimaryCtxRetain;
        "cuDevicePrimaryCtxRelease" 7000 cuDevicePrimaryCtxRelease;
        "cuDevicePrimaryCtxRelease" 11000 cuDevicePrimaryCtxRelease_v2;
        "cuDevicePrimaryCtxReset" 7000 cuDevicePrimaryCtxReset;
        "cuDevicePrimaryCtxReset" 11000 cuDevicePrimaryCtxReset_v2;
        "cuDevicePrimaryCtxSetFlags" 7000 cuDevicePrimaryCtxSetFlags;
        "cuDevicePrimaryCtxSetFlags" 11000 cuDevicePrimaryCtxSetFlags_v2;
        "cuDevicePrimaryCtxGetState" 7000 cuDevicePrimaryCtxGetState;
        "cuCtxCreate" 2000 cuCtxCreate;
        "cuCtxCreate" 3020 cuCtxCreate_v2;
        "cuCtxCreate" 11040 cuCtxCreate_v3;
        "cuCtxCreate" 12050 cuCtxCreate_v4;
        "cuCtxDestroy" 2000 cuCtxDestroy;
        "cuCtxDestroy" 4000 cuCtxDestroy_v2;
        "cuCtxPushCurrent" 2000 cuCtxPushCurrent;
        "cuCtxPushCurrent" 4000 cuCtxPushCurrent_v2;
        "cuCtxPopCurrent" 2000 cuCtxPopCurrent;
        "cuCtxPopCurrent" 4000 cuCtxPopCurrent_v2;
        "cuCtxGetCurrent" 4000 cuCtxGetCurrent;
        "cuCtxSetCurrent" 4000 cuCtxSetCurrent;
        "cuCtxGetDevice" 2000 cuCtxGetDevice;
        "cuCtxGetFlags" 7000 cuCtxGetFlags;
        "cuCtxSetFlags" 12010 cuCtxSetFlags;
        "cuCtxGetId" 12000 cuCtxGetId;
        "cuCtxGetApiVersion" 3020 cuCtxGetApiVersion;
        "cuCtxSynchronize" 2000 cuCtxSynchronize;
        "cuCtxGetStreamPriorityRange" 5050 cuCtxGetStreamPriorityRange;
        "cuCtxGetLimit" 3010 cuCtxGetLimit;
        "cuCtxSetLimit" 3010 cuCtxSetLimit;
        "cuCtxGetCacheConfig" 3020 cuCtxGetCacheConfig;
        "cuCtxSetCacheConfig" 3020 cuCtxSetCacheConfig;
        "cuCtxEnablePeerAccess" 4000 cuCtxEnablePeerAccess;
        "cuCtxDisablePeerAccess" 4000 cuCtxDisablePeerAccess;
        "cuMemAlloc" 3020 cuMemAlloc_v2;
        "cuMemFree" 3020 cuMemFree_v2;
        "cuMemGetInfo" 2000 cuMemGetInfo;
        "cuMemGetInfo" 3020 cuMemGetInfo_v2;
        "cuMemAllocPitch" 3020 cuMemAllocPitch_v2;
        "cuMemAllocManaged" 6000 cuMemAllocManaged;
        "cuMemGetAddressRange" 3020 cuMemGetAddressRange_v2;
        "cuMemAllocHost" 3020 cuMemAllocHost_v2;
        "cuMemHostAlloc" 2020 cuMemHostAlloc;
        "cuMemFreeHost" 2000 cuMemFreeHost;
        "cuMemHostGetDevicePointer" 3020 cuMemHostGetDevicePointer_v2;
        "cuMemHostRegister" 6050 cuMemHostRegister_v2;
        "cuMemHostUnregister" 4000 cuMemHostUnregister;
        "cuMemAdvise" 8000 cuMemAdvise;
        "cuMemAdvise" 12020 cuMemAdvise_v2;
        "cuMemPrefetchAsync" 8000 cuMemPrefetchAsync;
        "cuMemPrefetchAsync" 12020 cuMemPrefetchAsync_v2;
        "cuIpcGetMemHandle" 4010 cuIpcGetMemHandle;
        "cuIpcOpenMemHandle" 11000 cuIpcOpenMemHandle_v2;
        "cuIpcCloseMemHandle" 4010 cuIpcCloseMemHandle;
        "cuIpcGetEventHandle" 4010 cuIpcGetEventHandle;
        "cuIpcOpenEventHandle" 4010 cuIpcOpenEventHandle;
        "cuPointerGetAttribute" 4000 cuPointerGetAttribute;
        "cuPointerGetAttributes" 7000 cuPointerGetAttributes;
        "cuMemcpy" 4000 cuMemcpy | cuMemcpy_ptds;
        "cuMemcpyHtoD" 3020 cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds;
        "cuMemcpyDtoH" 3020 cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds;
        "cuMemcpyDtoD" 3020 cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds;
        "cuMemcpyPeer" 4000 cuMemcpyPeer | cuMemcpyPeer_ptds;
        "cuMemcpyAsync" 4000 cuMemcpyAsync | cuMemcpyAsync_ptsz;
        "cuMemcpy2D" 3020 cuMemcpy2D_v2 | cuMemcpy2D_v2_ptds;
        "cuMemcpy2DUnaligned" 3020 cuMemcpy2DUnaligned_v2 | cuMemcpy2DUnaligned_v2_ptds;
        "cuMemcpy2DAsync" 3020 cuMemcpy2DAsync_v2 | cuMemcpy2DAsync_v2_ptsz;
        "cuMemcpyHtoDAsync" 3020 cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz;
        "cuMemcpyDtoHAsync" 3020 cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz;
        "cuMemcpyDtoDAsync" 3020 cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz;
        "cuMemcpyPeerAsync" 4000 cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz;
        "cuMemsetD8" 3020 cuMemsetD8_v2 | cuMemsetD8_v2_ptds;
        "cuMemsetD16" 3020 cuMemsetD16_v2 | cuMemsetD16_v2_ptds;
        "cuMemsetD32" 3020 cuMemsetD32_v2 | cuMemsetD32_v2_ptds;
        "cuMemsetD8Async" 3020 cuMemsetD8Async | cuMemsetD8Async_ptsz;
        "cuMemsetD16Async" 3020 cuMemsetD16Async | cuMemsetD16Async_ptsz;
        "cuMemsetD32Async" 3020 cuMemsetD32Async | cuMemsetD32Async_ptsz;
        "cuMemAllocAsync" 11020 cuMemAllocAsync | cuMemAllocAsync_ptsz;
        "cuMemFreeAsync" 11020 cuMemFreeAsync | cuMemFreeAsync_ptsz;
        "cuMemAllocFromPoolAsync" 11020 cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz;
        "cuMemPoolCreate" 11020 cuMemPoolCreate;
        "cuMemPoolDestroy" 11020 cuMemPoolDestroy;
        "cuMemPoolTrimTo" 11020 cuMemPoolTrimTo;
        "cuMemPoolSetAttribute" 11020 cuMemPoolSetAttribute;
        "cuMemPoolGetAttribute" 11020 cuMemPoolGetAttribute;
        "cuMemPoolSetAccess" 11020 cuMemPoolSetAccess;
        "cuMemGetAllocationGranularity" 10020 cuMemGetAllocationGranularity;
        "cuMemAddressReserve" 10020 cuMemAddressReserve;
        "cuMemAddressFree" 10020 cuMemAddressFree;
        "cuMemCreate" 10020 cuMemCreate;
        "cuMemRelease" 10020 cuMemRelease;
        "cuMemMap" 10020 cuMemMap;
        "cuMemUnmap" 10020 cuMemUnmap;
        "cuMemSetAccess" 10020 cuMemSetAccess;
        "cuMemGetAccess" 10020 cuMemGetAccess;
        "cuMemRetainAllocationHandle" 11000 cuMemRetainAllocationHandle;
        "cuMemGetAllocationPropertiesFromHandle" 10020 cuMemGetAllocationPropertiesFromHandle;
        "cuMemExportToShareableHandle" 10020 cuMemExportToShareableHandle;
        "cuMemImportFromShareableHandle" 10020 cuMemImportFromShareableHandle;
        "cuMemMapArrayAsync" 11010 cuMemMapArrayAsync;
        "cuStreamCreate" 2000 cuStreamCreate;
        "cuStreamCreateWithPriority" 5050 cuStreamCreateWithPriority;
        "cuStreamDestroy" 2000 cuStreamDestroy;
        "cuStreamDestroy" 4000 cuStreamDestroy_v2;
        "cuStreamSynchronize" 2000 cuStreamSynchronize | cuStreamSynchronize_ptsz;
        "cuStreamQuery" 2000 cuStreamQuery | cuStreamQuery_ptsz;
        "cuStreamWaitEvent" 3020 cuStreamWaitEvent | cuStreamWaitEvent_ptsz;
        "cuStreamGetPriority" 5050 cuStreamGetPriority | cuStreamGetPriority_ptsz;
        "cuStreamGetFlags" 5050 cuStreamGetFlags | cuStreamGetFlags_ptsz;
        "cuStreamGetCtx" 9020 cuStreamGetCtx;
        "cuStreamGetId" 12000 cuStreamGetId;
        "cuStreamAddCallback" 5000 cuStreamAddCallback | cuStreamAddCallback_ptsz;
        "cuLaunchHostFunc" 10000 cuLaunchHostFunc | cuLaunchHostFunc_ptsz;
        "cuStreamBeginCapture" 10000 cuStreamBeginCapture | cuStreamBeginCapture_ptsz;
        "cuStreamBeginCapture" 10010 cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz;
        "cuStreamBeginCaptureToGraph" 12030 cuStreamBeginCaptureToGraph | cuStreamBeginCaptureToGraph_ptsz;
        "cuStreamEndCapture" 10000 cuStreamEndCapture | cuStreamEndCapture_ptsz;
        "cuStreamIsCapturing" 10000 cuStreamIsCapturing | cuStreamIsCapturing_ptsz;
        "cuStreamGetCaptureInfo" 10010 cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz;
        "cuStreamGetCaptureInfo" 11030 cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz;
        "cuStreamGetCaptureInfo" 12030 cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz;
        "cuThreadExchangeStreamCaptureMode" 10010 cuThreadExchangeStreamCaptureMode;
        "cuEventCreate" 2000 cuEventCreate;
        "cuEventDestroy" 2000 cuEventDestroy;
        "cuEventDestroy" 4000 cuEventDestroy_v2;
        "cuEventRecord" 2000 cuEventRecord | cuEventRecord_ptsz;
        "cuEventRecordWithFlags" 11010 cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz;
        "cuEventQuery" 2000 cuEventQuery;
        "cuEventSynchronize" 2000 cuEventSynchronize;
        "cuEventElapsedTime" 2000 cuEventElapsedTime;
        "cuEventElapsedTime" 12080 cuEventElapsedTime_v2;
        "cuLaunchKernel" 4000 cuLaunchKernel | cuLaunchKernel_ptsz;
        "cuStreamWriteValue32" 8000 cuStreamWriteValue32 | cuStreamWriteValue32_ptsz;
        "cuStreamWriteValue32" 11070 cuStreamWriteValue32_v2 | cuStreamWriteValue32_v2_ptsz;
        "cuModuleLoad" 2000 cuModuleLoad;
        "cuModuleLoadData" 2000 cuModuleLoadData;
        "cuModuleLoadDataEx" 2010 cuModuleLoadDataEx;
        "cuModuleLoadFatBinary" 2000 cuModuleLoadFatBinary;
        "cuModuleUnload" 2000 cuModuleUnload;
        "cuModuleGetFunction" 2000 cuModuleGetFunction;
        "cuModuleGetGlobal" 3020 cuModuleGetGlobal_v2;
        "cuModuleGetLoadingMode" 11070 cuModuleGetLoadingMode;
        "cuLibraryLoadData" 12000 cuLibraryLoadData;
        "cuLibraryLoadFromFile" 12000 cuLibraryLoadFromFile;
        "cuLibraryUnload" 12000 cuLibraryUnload;
        "cuLibraryGetKernel" 12000 cuLibraryGetKernel;
        "cuLibraryGetModule" 12000 cuLibraryGetModule;
        "cuLibraryGetGlobal" 12000 cuLibraryGetGlobal;
        "cuLibraryGetKernelCount" 12040 cuLibraryGetKernelCount;
        "cuLibraryEnumerateKernels" 12040 cuLibraryEnumerateKernels;
        "cuKernelGetFunction" 12000 cuKernelGetFunction;
        "cuKernelGetLibrary" 12050 cuKernelGetLibrary;
        "cuKernelGetAttribute" 12000 cuKernelGetAttribute;
        "cuKernelSetAttribute" 12000 cuKernelSetAttribute;
        "cuKernelSetCacheConfig" 12000 cuKernelSetCacheConfig;
        "cuFuncGetAttribute" 2020 cuFuncGetAttribute;
        "cuFuncSetAttribute" 9000 cuFuncSetAttribute;
        "cuFuncSetCacheConfig" 3000 cuFuncSetCacheConfig;
        "cuFuncGetModule" 11000 cuFuncGetModule;
        "cuLaunchKernelEx" 11060 cuLaunchKernelEx | cuLaunchKernelEx_ptsz;
        "cuOccupancyMaxActiveBlocksPerMultiprocessor" 6050 cuOccupancyMaxActiveBlocksPerMultiprocessor;
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" 7000 cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
        "cuOccupancyMaxPotentialBlockSize" 6050 cuOccupancyMaxPotentialBlockSize;
        "cuOccupancyMaxPotentialBlockSizeWithFlags" 7000 cuOccupancyMaxPotentialBlockSizeWithFlags;
        "cuOccupancyAvailableDynamicSMemPerBlock" 10020 cuOccupancyAvailableDynamicSMemPerBlock;
        "cuOccupancyMaxPotentialClusterSize" 11070 cuOccupancyMaxPotentialClusterSize;
        "cuOccupancyMaxActiveClusters" 11070 cuOccupancyMaxActiveClusters;
        "cuGraphCreate" 10000 cuGraphCreate;
        "cuGraphDestroy" 10000 cuGraphDestroy;
        "cuGraphInstantiate" 10000 cuGraphInstantiate;
        "cuGraphInstantiate" 11000 cuGraphInstantiate_v2;
        "cuGraphInstantiateWithFlags" 11040 cuGraphInstantiateWithFlags;
        "cuGraphExecDestroy" 10000 cuGraphExecDestroy;
        "cuGraphLaunch" 10000 cuGraphLaunch | cuGraphLaunch_ptsz;
        "cuGraphGetNodes" 10000 cuGraphGetNodes;
        "cuGraphNodeGetType" 10000 cuGraphNodeGetType;
        "cuGraphKernelNodeGetParams" 10000 cuGraphKernelNodeGetParams;
        "cuGraphKernelNodeGetParams" 12000 cuGraphKernelNodeGetParams_v2;
        "cuGraphExecKernelNodeSetParams" 10010 cuGraphExecKernelNodeSetParams;
        "cuGraphExecKernelNodeSetParams" 12000 cuGraphExecKernelNodeSetParams_v2;
        "cuLinkCreate" 6050 cuLinkCreate_v2;
        "cuLinkAddData" 6050 cuLinkAddData_v2;
        "cuLinkAddFile" 6050 cuLinkAddFile_v2;
        "cuLinkComplete" 5050 cuLinkComplete;
        "cuLinkDestroy" 5050 cuLinkDestroy;
        "cuStreamBatchMemOp" 8000 cuStreamBatchMemOp | cuStreamBatchMemOp_ptsz;
        "cuStreamBatchMemOp" 11070 cuStreamBatchMemOp_v2 | cuStreamBatchMemOp_v2_ptsz;
        "cuStreamWaitValue32" 8000 cuStreamWaitValue32 | cuStreamWaitValue32_ptsz;
        "cuStreamWaitValue32" 11070 cuStreamWaitValue32_v2 | cuStreamWaitValue32_v2_ptsz;
        "vramsimLaunchFill" 0 vramsimLaunchFill | vramsimLaunchFill_ptsz;
        "vramsimLaunchCopy" 0 vramsimLaunchCopy | vramsimLaunchCopy_ptsz;
        "vramsimPauseWait" 0 vramsimPauseWait;
        "vramsimPauseRelease" 0 vramsimPauseRelease;
        "vramsimDeviceUsed" 0 vramsimDeviceUsed;
        "vramsimDeviceHighWater" 0 vramsimDeviceHighWater;
        "vramsimDeviceStats" 0 vramsimDeviceStats;
        "vramsimDriverCalls" 0 vramsimDriverCalls;
        "vramsimSelfTestPanic" 0 vramsimSelfTestPanic;
    }
});

/// Resolves `name` for `cuda_version` and `flags`: (pointer, CUdriverProcAddressQueryResult).
/// A missing symbol or a too-old version gives a NULL pointer with its status; a version newer
/// than the driver is CUDA_ERROR_INVALID_VALUE.
pub fn lookup(
    name: &str,
    cuda_version: c_int,
    flags: u64,
) -> Result<(*mut c_void, c_int), CUresult> {
    if cuda_version > CONFIG.driver_version || cuda_version < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut found = false;
    let mut best: Option<&Entry> = None;
    for e in TABLE.iter().filter(|e| e.base == name) {
        found = true;
        if e.version <= cuda_version && best.is_none_or(|b| e.version > b.version) {
            best = Some(e);
        }
    }
    let Some(e) = best else {
        let status = if found {
            CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
        } else {
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
        };
        return Ok((std::ptr::null_mut(), status));
    };
    let f = match e.ptsz {
        Some((_, p)) if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 => p,
        _ => e.f,
    };
    Ok((f as *mut c_void, CU_GET_PROC_ADDRESS_SUCCESS))
}
