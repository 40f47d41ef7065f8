//! How the runtime reaches the driver: exactly as NVIDIA's libcudart does.
//!
//! `dlopen("libcuda.so.1")`, `dlsym(handle, "cuGetProcAddress_v2")`, then every driver entry
//! point by *base name* and minimum CUDA version through `cuGetProcAddress_v2`; the `_ptsz`
//! variants are asked for with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`. This happens
//! once, at the first CUDA call, and fills [`Driver`]. To give the runtime a new driver
//! function, add one line to the `driver_table!` invocation below.

use crate::types::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `cuGetProcAddress_v2`.
pub type GetProcFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

macro_rules! driver_table {
    ($( $field:ident = $name:literal @ $ver:literal $( [$flags:expr] )? : fn($($arg:ty),* $(,)?); )*) => {
        /// The driver entry points the runtime uses (`None`: the driver does not have it).
        #[allow(non_snake_case)]
        pub struct Driver {
            /// The driver's own `cuGetProcAddress_v2`, from `dlsym`.
            pub get_proc: GetProcFn,
            /// `cuDriverGetVersion` result.
            pub version: c_int,
            $( pub $field: Option<unsafe extern "C" fn($($arg),*) -> CUresult>, )*
        }

        impl Driver {
            /// Looks every entry point up through `get_proc`.
            ///
            /// # Safety
            /// `get_proc` must be a `cuGetProcAddress_v2` implementation.
            unsafe fn resolve(get_proc: GetProcFn) -> Driver {
                Driver {
                    get_proc,
                    version: 0,
                    $( $field: {
                        #[allow(unused_mut, unused_assignments)]
                        let mut flags = CU_GET_PROC_ADDRESS_DEFAULT;
                        $( flags = $flags; )?
                        let p = unsafe { lookup(get_proc, $name, $ver, flags) };
                        // SAFETY: the driver returned this pointer for this base name and
                        // version, whose C prototype is the one declared in the table.
                        unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($arg),*) -> CUresult>>(p) }
                    }, )*
                }
            }
        }
    };
}

const PTDS: u64 = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

driver_table! {
    cuInit = c"cuInit" @ 2000: fn(c_uint);
    cuDriverGetVersion = c"cuDriverGetVersion" @ 2020: fn(*mut c_int);
    cuDeviceGet = c"cuDeviceGet" @ 2000: fn(*mut CUdevice, c_int);
    cuDeviceGetCount = c"cuDeviceGetCount" @ 2000: fn(*mut c_int);
    cuDeviceGetName = c"cuDeviceGetName" @ 2000: fn(*mut c_char, c_int, CUdevice);
    cuDeviceGetUuid = c"cuDeviceGetUuid" @ 11040: fn(*mut c_char, CUdevice);
    cuDeviceTotalMem = c"cuDeviceTotalMem" @ 3020: fn(*mut usize, CUdevice);
    cuDeviceGetAttribute = c"cuDeviceGetAttribute" @ 2000: fn(*mut c_int, c_int, CUdevice);
    cuDeviceCanAccessPeer = c"cuDeviceCanAccessPeer" @ 4000: fn(*mut c_int, CUdevice, CUdevice);
    cuDevicePrimaryCtxRetain = c"cuDevicePrimaryCtxRetain" @ 7000: fn(*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease = c"cuDevicePrimaryCtxRelease" @ 11000: fn(CUdevice);
    cuDevicePrimaryCtxReset = c"cuDevicePrimaryCtxReset" @ 11000: fn(CUdevice);
    cuCtxSetCurrent = c"cuCtxSetCurrent" @ 4000: fn(CUcontext);
    cuCtxGetCurrent = c"cuCtxGetCurrent" @ 4000: fn(*mut CUcontext);
    cuCtxSynchronize = c"cuCtxSynchronize" @ 2000: fn();
    cuCtxEnablePeerAccess = c"cuCtxEnablePeerAccess" @ 4000: fn(CUcontext, c_uint);

    cuMemAlloc = c"cuMemAlloc" @ 3020: fn(*mut CUdeviceptr, usize);
    cuMemFree = c"cuMemFree" @ 3020: fn(CUdeviceptr);
    cuMemAllocPitch = c"cuMemAllocPitch" @ 3020: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    cuMemAllocManaged = c"cuMemAllocManaged" @ 6000: fn(*mut CUdeviceptr, usize, c_uint);
    cuMemAllocHost = c"cuMemAllocHost" @ 3020: fn(*mut *mut c_void, usize);
    cuMemHostAlloc = c"cuMemHostAlloc" @ 2020: fn(*mut *mut c_void, usize, c_uint);
    cuMemFreeHost = c"cuMemFreeHost" @ 2000: fn(*mut c_void);
    cuMemGetInfo = c"cuMemGetInfo" @ 3020: fn(*mut usize, *mut usize);
    cuMemGetAddressRange = c"cuMemGetAddressRange" @ 3020: fn(*mut CUdeviceptr, *mut usize, CUdeviceptr);
    cuMemAllocAsync = c"cuMemAllocAsync" @ 11020: fn(*mut CUdeviceptr, usize, CUstream);
    cuMemAllocAsync_ptsz = c"cuMemAllocAsync" @ 11020 [PTDS]: fn(*mut CUdeviceptr, usize, CUstream);
    cuMemFreeAsync = c"cuMemFreeAsync" @ 11020: fn(CUdeviceptr, CUstream);
    cuMemFreeAsync_ptsz = c"cuMemFreeAsync" @ 11020 [PTDS]: fn(CUdeviceptr, CUstream);
    cuMemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" @ 11020: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    cuMemAllocFromPoolAsync_ptsz = c"cuMemAllocFromPoolAsync" @ 11020 [PTDS]: fn(*mut CUdeviceptr, usize, CUmemoryPool, CUstream);
    cuDeviceGetDefaultMemPool = c"cuDeviceGetDefaultMemPool" @ 11020: fn(*mut CUmemoryPool, CUdevice);
    cuPointerGetAttribute = c"cuPointerGetAttribute" @ 4000: fn(*mut c_void, c_int, CUdeviceptr);
    cuIpcGetMemHandle = c"cuIpcGetMemHandle" @ 4010: fn(*mut c_void, CUdeviceptr);

    cuMemcpy = c"cuMemcpy" @ 4000: fn(CUdeviceptr, CUdeviceptr, usize);
    cuMemcpyHtoD = c"cuMemcpyHtoD" @ 3020: fn(CUdeviceptr, *const c_void, usize);
    cuMemcpyDtoH = c"cuMemcpyDtoH" @ 3020: fn(*mut c_void, CUdeviceptr, usize);
    cuMemcpyDtoD = c"cuMemcpyDtoD" @ 3020: fn(CUdeviceptr, CUdeviceptr, usize);
    cuMemcpyAsync = c"cuMemcpyAsync" @ 4000: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpyAsync_ptsz = c"cuMemcpyAsync" @ 4000 [PTDS]: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpyHtoDAsync = c"cuMemcpyHtoDAsync" @ 3020: fn(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyHtoDAsync_ptsz = c"cuMemcpyHtoDAsync" @ 3020 [PTDS]: fn(CUdeviceptr, *const c_void, usize, CUstream);
    cuMemcpyDtoHAsync = c"cuMemcpyDtoHAsync" @ 3020: fn(*mut c_void, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoHAsync_ptsz = c"cuMemcpyDtoHAsync" @ 3020 [PTDS]: fn(*mut c_void, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoDAsync = c"cuMemcpyDtoDAsync" @ 3020: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoDAsync_ptsz = c"cuMemcpyDtoDAsync" @ 3020 [PTDS]: fn(CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemsetD8 = c"cuMemsetD8" @ 3020: fn(CUdeviceptr, u8, usize);
    cuMemsetD8Async = c"cuMemsetD8Async" @ 3020: fn(CUdeviceptr, u8, usize, CUstream);
    cuMemsetD8Async_ptsz = c"cuMemsetD8Async" @ 3020 [PTDS]: fn(CUdeviceptr, u8, usize, CUstream);

    cuStreamCreate = c"cuStreamCreate" @ 2000: fn(*mut CUstream, c_uint);
    cuStreamCreateWithPriority = c"cuStreamCreateWithPriority" @ 5050: fn(*mut CUstream, c_uint, c_int);
    cuStreamDestroy = c"cuStreamDestroy" @ 4000: fn(CUstream);
    cuStreamSynchronize = c"cuStreamSynchronize" @ 2000: fn(CUstream);
    cuStreamSynchronize_ptsz = c"cuStreamSynchronize" @ 2000 [PTDS]: fn(CUstream);
    cuStreamQuery = c"cuStreamQuery" @ 2000: fn(CUstream);
    cuStreamQuery_ptsz = c"cuStreamQuery" @ 2000 [PTDS]: fn(CUstream);
    cuStreamWaitEvent = c"cuStreamWaitEvent" @ 3020: fn(CUstream, CUevent, c_uint);
    cuStreamWaitEvent_ptsz = c"cuStreamWaitEvent" @ 3020 [PTDS]: fn(CUstream, CUevent, c_uint);
    cuStreamBeginCapture = c"cuStreamBeginCapture" @ 10010: fn(CUstream, c_uint);
    cuStreamBeginCapture_ptsz = c"cuStreamBeginCapture" @ 10010 [PTDS]: fn(CUstream, c_uint);
    cuStreamEndCapture = c"cuStreamEndCapture" @ 10000: fn(CUstream, *mut CUgraph);
    cuStreamEndCapture_ptsz = c"cuStreamEndCapture" @ 10000 [PTDS]: fn(CUstream, *mut CUgraph);
    cuStreamIsCapturing = c"cuStreamIsCapturing" @ 10000: fn(CUstream, *mut c_uint);
    cuStreamIsCapturing_ptsz = c"cuStreamIsCapturing" @ 10000 [PTDS]: fn(CUstream, *mut c_uint);
    cuStreamGetCaptureInfo = c"cuStreamGetCaptureInfo" @ 10010: fn(CUstream, *mut c_uint, *mut u64);
    cuStreamGetCaptureInfo_ptsz = c"cuStreamGetCaptureInfo" @ 10010 [PTDS]: fn(CUstream, *mut c_uint, *mut u64);
    cuThreadExchangeStreamCaptureMode = c"cuThreadExchangeStreamCaptureMode" @ 10010: fn(*mut c_uint);
    cuGraphInstantiateWithFlags = c"cuGraphInstantiateWithFlags" @ 11040: fn(*mut CUgraphExec, CUgraph, u64);
    cuGraphCreate = c"cuGraphCreate" @ 10000: fn(*mut CUgraph, c_uint);
    cuStreamBeginCaptureToGraph = c"cuStreamBeginCaptureToGraph" @ 12030: fn(CUstream, CUgraph, *const c_void, *const c_void, usize, c_uint);
    cuStreamBeginCaptureToGraph_ptsz = c"cuStreamBeginCaptureToGraph" @ 12030 [PTDS]: fn(CUstream, CUgraph, *const c_void, *const c_void, usize, c_uint);
    cuGraphLaunch = c"cuGraphLaunch" @ 10000: fn(CUgraphExec, CUstream);
    cuGraphLaunch_ptsz = c"cuGraphLaunch" @ 10000 [PTDS]: fn(CUgraphExec, CUstream);
    cuGraphExecDestroy = c"cuGraphExecDestroy" @ 10000: fn(CUgraphExec);
    cuGraphDestroy = c"cuGraphDestroy" @ 10000: fn(CUgraph);
    cuDeviceGetGraphMemAttribute = c"cuDeviceGetGraphMemAttribute" @ 11040: fn(c_int, c_int, *mut c_void);
    cuDeviceSetGraphMemAttribute = c"cuDeviceSetGraphMemAttribute" @ 11040: fn(c_int, c_int, *mut c_void);

    cuEventCreate = c"cuEventCreate" @ 2000: fn(*mut CUevent, c_uint);
    cuEventRecord = c"cuEventRecord" @ 2000: fn(CUevent, CUstream);
    cuEventRecord_ptsz = c"cuEventRecord" @ 2000 [PTDS]: fn(CUevent, CUstream);
    cuEventQuery = c"cuEventQuery" @ 2000: fn(CUevent);
    cuEventSynchronize = c"cuEventSynchronize" @ 2000: fn(CUevent);
    cuEventDestroy = c"cuEventDestroy" @ 4000: fn(CUevent);
    cuEventElapsedTime = c"cuEventElapsedTime" @ 2000: fn(*mut f32, CUevent, CUevent);

    cuMemPoolTrimTo = c"cuMemPoolTrimTo" @ 11020: fn(CUmemoryPool, usize);
    cuMemPoolSetAttribute = c"cuMemPoolSetAttribute" @ 11020: fn(CUmemoryPool, c_int, *mut c_void);
    cuMemPoolGetAttribute = c"cuMemPoolGetAttribute" @ 11020: fn(CUmemoryPool, c_int, *mut c_void);
    cuMemPoolSetAccess = c"cuMemPoolSetAccess" @ 11020: fn(CUmemoryPool, *const c_void, usize);
    cuMemHostRegister = c"cuMemHostRegister" @ 6050: fn(*mut c_void, usize, c_uint);
    cuMemHostUnregister = c"cuMemHostUnregister" @ 4000: fn(*mut c_void);
    cuIpcOpenMemHandle = c"cuIpcOpenMemHandle" @ 11000: fn(*mut CUdeviceptr, cudaIpcMemHandle_t, c_uint);
    cuIpcCloseMemHandle = c"cuIpcCloseMemHandle" @ 4010: fn(CUdeviceptr);
    cuMemcpyPeerAsync = c"cuMemcpyPeerAsync" @ 4000: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream);
    cuMemcpyPeerAsync_ptsz = c"cuMemcpyPeerAsync" @ 4000 [PTDS]: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream);
    cuLaunchHostFunc = c"cuLaunchHostFunc" @ 10000: fn(CUstream, HostFn, *mut c_void);
    cuLaunchHostFunc_ptsz = c"cuLaunchHostFunc" @ 10000 [PTDS]: fn(CUstream, HostFn, *mut c_void);
    cuStreamAddCallback = c"cuStreamAddCallback" @ 5000: fn(CUstream, StreamCallback, *mut c_void, c_uint);
    cuStreamAddCallback_ptsz = c"cuStreamAddCallback" @ 5000 [PTDS]: fn(CUstream, StreamCallback, *mut c_void, c_uint);
    cuEventRecordWithFlags = c"cuEventRecordWithFlags" @ 11010: fn(CUevent, CUstream, c_uint);
    cuEventRecordWithFlags_ptsz = c"cuEventRecordWithFlags" @ 11010 [PTDS]: fn(CUevent, CUstream, c_uint);
    cuStreamGetPriority = c"cuStreamGetPriority" @ 5050: fn(CUstream, *mut c_int);
    cuStreamGetPriority_ptsz = c"cuStreamGetPriority" @ 5050 [PTDS]: fn(CUstream, *mut c_int);
    cuCtxGetStreamPriorityRange = c"cuCtxGetStreamPriorityRange" @ 5050: fn(*mut c_int, *mut c_int);
    cuDeviceGetPCIBusId = c"cuDeviceGetPCIBusId" @ 4010: fn(*mut c_char, c_int, CUdevice);

    cuLaunchKernel = c"cuLaunchKernel" @ 4000: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuLaunchKernel_ptsz = c"cuLaunchKernel" @ 4000 [PTDS]: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void);
    cuIpcGetEventHandle = c"cuIpcGetEventHandle" @ 4010: fn(*mut cudaIpcEventHandle_t, CUevent);
    cuIpcOpenEventHandle = c"cuIpcOpenEventHandle" @ 4010: fn(*mut CUevent, cudaIpcEventHandle_t);

    vramsimLaunchFill = c"vramsimLaunchFill" @ 2000: fn(CUstream, CUdeviceptr, u8, usize, c_uint);
    vramsimLaunchFill_ptsz = c"vramsimLaunchFill" @ 2000 [PTDS]: fn(CUstream, CUdeviceptr, u8, usize, c_uint);
    vramsimLaunchCopy = c"vramsimLaunchCopy" @ 2000: fn(CUstream, CUdeviceptr, CUdeviceptr, usize, c_uint);
    vramsimLaunchCopy_ptsz = c"vramsimLaunchCopy" @ 2000 [PTDS]: fn(CUstream, CUdeviceptr, CUdeviceptr, usize, c_uint);
}

/// One `cuGetProcAddress_v2` lookup; NULL when the driver does not have the symbol.
///
/// # Safety
/// `get_proc` must be a `cuGetProcAddress_v2` implementation.
unsafe fn lookup(get_proc: GetProcFn, name: &CStr, version: c_int, flags: u64) -> *mut c_void {
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = 0;
    // SAFETY: valid NUL-terminated name, valid out-pointers.
    let rc = unsafe { get_proc(name.as_ptr(), &mut p, version, flags, &mut status) };
    if rc != CUDA_SUCCESS || status != 0 {
        std::ptr::null_mut()
    } else {
        p
    }
}

/// Why the driver is unusable: the `cudaError_t` every call then returns.
pub type InitError = cudaError_t;

static DRIVER: OnceLock<Result<Driver, InitError>> = OnceLock::new();

/// The driver, loaded at the first call; `Err(cudaError_t)` when there is none usable.
pub fn driver(min_version: c_int) -> Result<&'static Driver, InitError> {
    DRIVER
        .get_or_init(|| load(min_version))
        .as_ref()
        .map_err(|e| *e)
}

/// The driver if it was already loaded successfully (no loading attempt).
pub fn loaded() -> Option<&'static Driver> {
    DRIVER.get().and_then(|r| r.as_ref().ok())
}

fn load(min_version: c_int) -> Result<Driver, InitError> {
    // SAFETY: plain dlopen/dlsym with NUL-terminated names.
    let get_proc = unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        if h.is_null() {
            return Err(err::INSUFFICIENT_DRIVER);
        }
        let p = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
        if p.is_null() {
            return Err(err::INSUFFICIENT_DRIVER);
        }
        std::mem::transmute::<*mut c_void, GetProcFn>(p)
    };
    // SAFETY: `get_proc` is the driver's cuGetProcAddress_v2.
    let mut d = unsafe { Driver::resolve(get_proc) };
    let (Some(init), Some(get_version)) = (d.cuInit, d.cuDriverGetVersion) else {
        return Err(err::INSUFFICIENT_DRIVER);
    };
    let mut version = 0;
    // SAFETY: valid out-pointer.
    if unsafe { get_version(&mut version) } != CUDA_SUCCESS || version < min_version {
        return Err(err::INSUFFICIENT_DRIVER);
    }
    d.version = version;
    // SAFETY: cuInit takes flags only.
    let rc = unsafe { init(0) };
    if rc != CUDA_SUCCESS {
        return Err(crate::errors::from_cu(rc));
    }
    Ok(d)
}
