//! The runtime API on top of the driver table. Every function here returns
//! `Result<T, cudaError_t>`; the C exports (src/exports.rs) wrap them with
//! [`crate::errors::guard`], which records the last error and catches panics.
//!
//! # Safety
//! This module is the FFI edge: the functions take the C caller's pointers as they are.
//! Pointers that may be NULL are checked; otherwise each pointer must be valid for what the
//! corresponding CUDA function documents (e.g. `cudaMemcpy`'s `dst` for `count` bytes).
#![allow(clippy::missing_safety_doc)]

use crate::driver::{self, Driver};
use crate::errors::{self, from_cu};
use crate::types::*;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Which runtime this is: `libcudart.so.12` (12.9) or `libcudart.so.13` (13.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flavor {
    /// `cudaRuntimeGetVersion`: 12090 or 13000.
    pub version: c_int,
}

impl Flavor {
    pub const V12: Flavor = Flavor { version: 12090 };
    pub const V13: Flavor = Flavor { version: 13000 };

    /// The oldest driver (`cuDriverGetVersion`) this runtime accepts.
    pub fn min_driver(self) -> c_int {
        self.version / 1000 * 1000
    }
}

/// Result of a runtime operation.
pub type Res<T = ()> = Result<T, cudaError_t>;

/// Converts a [`Res`] to the C return code.
pub fn code(r: Res) -> cudaError_t {
    match r {
        Ok(()) => err::SUCCESS,
        Err(e) => e,
    }
}

/// Calls an optional driver entry point: `cudaErrorNotSupported` when the driver lacks it.
macro_rules! cu {
    ($d:expr, $f:ident ( $($a:expr),* $(,)? )) => {
        match $d.$f {
            // SAFETY: the pointer came from the driver's cuGetProcAddress_v2 for this entry
            // point's prototype; arguments are forwarded from the caller of the runtime API,
            // who is responsible for them exactly as with the real runtime.
            Some(f) => check(from_cu(unsafe { f($($a),*) })),
            None => Err(err::NOT_SUPPORTED),
        }
    };
    // `cu!(d, ptds => cuX_ptsz | cuX(args))`: the per-thread default stream's entry point
    // when `ptds` (a `_ptsz` runtime call), else the legacy one, with the same arguments.
    ($d:expr, $ptds:expr => $fp:ident | $f:ident ( $($a:expr),* $(,)? )) => {
        if $ptds {
            cu!($d, $fp($($a),*))
        } else {
            cu!($d, $f($($a),*))
        }
    };
}

fn check(rc: cudaError_t) -> Res {
    if rc == 0 { Ok(()) } else { Err(rc) }
}

fn nonnull<T>(p: *const T) -> Res {
    if p.is_null() {
        Err(err::INVALID_VALUE)
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------- driver, devices, contexts

const MAX_DEVICES: usize = 64;
static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];
/// Bumped by cudaDeviceReset so every thread re-binds its context.
static GENERATION: AtomicU64 = AtomicU64::new(1);
static RETAIN_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    static CURRENT_DEVICE: Cell<c_int> = const { Cell::new(0) };
    static BOUND: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

/// The loaded driver (loading it at the first call), or the error every call returns.
pub fn drv(rt: Flavor) -> Res<&'static Driver> {
    if let Some(e) = errors::sticky() {
        return Err(e);
    }
    driver::driver(rt.min_driver())
}

fn device_count(d: &Driver) -> Res<c_int> {
    let mut n = 0;
    cu!(d, cuDeviceGetCount(&mut n))?;
    Ok(n)
}

fn current_device() -> c_int {
    CURRENT_DEVICE.try_with(|c| c.get()).unwrap_or(0)
}

/// The driver, with the current device's primary context retained (first use) and current on
/// this thread: what the real runtime does before any call that touches a device.
pub fn ctx(rt: Flavor) -> Res<&'static Driver> {
    let d = drv(rt)?;
    let dev = current_device();
    bind(d, dev)?;
    Ok(d)
}

fn primary(d: &Driver, dev: c_int) -> Res<usize> {
    let slot = PRIMARY.get(dev as usize).ok_or(err::INVALID_DEVICE)?;
    let c = slot.load(Ordering::Acquire);
    if c != 0 {
        return Ok(c);
    }
    let _g = RETAIN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let c = slot.load(Ordering::Acquire);
    if c != 0 {
        return Ok(c);
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    cu!(d, cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
    slot.store(ctx as usize, Ordering::Release);
    Ok(ctx as usize)
}

fn bind(d: &Driver, dev: c_int) -> Res {
    let c = primary(d, dev)?;
    let g = GENERATION.load(Ordering::Acquire);
    if BOUND.try_with(|b| b.get()).unwrap_or((0, 0)) != (c, g) {
        cu!(d, cuCtxSetCurrent(c as CUcontext))?;
        let _ = BOUND.try_with(|b| b.set((c, g)));
    }
    Ok(())
}

pub unsafe fn driver_get_version(rt: Flavor, v: *mut c_int) -> Res {
    nonnull(v)?;
    let ver = driver::driver(rt.min_driver())
        .map(|d| d.version)
        .unwrap_or(0);
    // A driver too old for this runtime still reports its version.
    let ver = if ver == 0 {
        probe_driver_version()
    } else {
        ver
    };
    // SAFETY: checked non-null; the caller provides an int.
    unsafe { *v = ver };
    Ok(())
}

/// `cuDriverGetVersion` of a driver that loaded but was refused (too old); 0 if none.
fn probe_driver_version() -> c_int {
    // SAFETY: RTLD_NOLOAD only looks at an already loaded libcuda.so.1.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return 0;
        }
        let p = libc::dlsym(h, c"cuGetProcAddress_v2".as_ptr());
        if p.is_null() {
            return 0;
        }
        let gp = std::mem::transmute::<*mut c_void, driver::GetProcFn>(p);
        let mut f: *mut c_void = std::ptr::null_mut();
        let mut st = 0;
        if gp(c"cuDriverGetVersion".as_ptr(), &mut f, 2020, 0, &mut st) != 0 || f.is_null() {
            return 0;
        }
        let f = std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> CUresult>(f);
        let mut v = 0;
        if f(&mut v) == 0 { v } else { 0 }
    }
}

pub unsafe fn runtime_get_version(rt: Flavor, v: *mut c_int) -> Res {
    nonnull(v)?;
    // SAFETY: checked non-null.
    unsafe { *v = rt.version };
    Ok(())
}

pub unsafe fn get_device_count(rt: Flavor, n: *mut c_int) -> Res {
    nonnull(n)?;
    let d = drv(rt)?;
    let c = device_count(d)?;
    // SAFETY: checked non-null.
    unsafe { *n = c };
    if c == 0 { Err(err::NO_DEVICE) } else { Ok(()) }
}

fn valid_device(d: &Driver, dev: c_int) -> Res {
    let n = device_count(d)?;
    if dev < 0 || dev >= n || dev as usize >= MAX_DEVICES {
        return Err(err::INVALID_DEVICE);
    }
    Ok(())
}

/// Fails unless `dev` is a device of the loaded driver.
pub fn check_device(rt: Flavor, dev: c_int) -> Res {
    let d = drv(rt)?;
    valid_device(d, dev)
}

pub unsafe fn set_device(rt: Flavor, dev: c_int) -> Res {
    let d = drv(rt)?;
    valid_device(d, dev)?;
    let _ = CURRENT_DEVICE.try_with(|c| c.set(dev));
    // Since CUDA 12.0 cudaSetDevice initializes the device's primary context.
    bind(d, dev)
}

pub unsafe fn get_device(rt: Flavor, dev: *mut c_int) -> Res {
    nonnull(dev)?;
    drv(rt)?;
    // SAFETY: checked non-null.
    unsafe { *dev = current_device() };
    Ok(())
}

pub unsafe fn device_synchronize(rt: Flavor) -> Res {
    let d = ctx(rt)?;
    cu!(d, cuCtxSynchronize())
}

pub unsafe fn device_reset(rt: Flavor) -> Res {
    let d = drv(rt)?;
    let dev = current_device();
    let slot = PRIMARY.get(dev as usize).ok_or(err::INVALID_DEVICE)?;
    let _g = RETAIN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if slot.load(Ordering::Acquire) != 0 {
        cu!(d, cuDevicePrimaryCtxReset(dev))?;
        // The reset drops every retain (ours included): the next call retains it again.
        slot.store(0, Ordering::Release);
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
    Ok(())
}

pub unsafe fn device_get_attribute(rt: Flavor, v: *mut c_int, attr: c_int, dev: c_int) -> Res {
    nonnull(v)?;
    let d = drv(rt)?;
    valid_device(d, dev)?;
    cu!(d, cuDeviceGetAttribute(v, attr, dev))
}

pub unsafe fn device_can_access_peer(rt: Flavor, can: *mut c_int, dev: c_int, peer: c_int) -> Res {
    nonnull(can)?;
    let d = drv(rt)?;
    valid_device(d, dev)?;
    valid_device(d, peer)?;
    if dev == peer {
        // SAFETY: checked non-null.
        unsafe { *can = 0 };
        return Ok(());
    }
    cu!(d, cuDeviceCanAccessPeer(can, dev, peer))
}

pub unsafe fn device_enable_peer_access(rt: Flavor, peer: c_int, flags: c_uint) -> Res {
    let d = ctx(rt)?;
    valid_device(d, peer)?;
    if flags != 0 {
        return Err(err::INVALID_VALUE);
    }
    let peer_ctx = primary(d, peer)?;
    cu!(d, cuCtxEnablePeerAccess(peer_ctx as CUcontext, 0))
}

/// Reads the device's attributes into whichever `cudaDeviceProp` layout `rt` has.
pub unsafe fn get_device_properties(rt: Flavor, prop: *mut c_void, dev: c_int) -> Res {
    nonnull(prop)?;
    let d = drv(rt)?;
    valid_device(d, dev)?;
    let attr = |a: c_int, default: c_int| -> c_int {
        let mut v = 0;
        match d.cuDeviceGetAttribute {
            // SAFETY: driver entry point with a valid out-pointer.
            Some(f) if unsafe { f(&mut v, a, dev) } == 0 => v,
            _ => default,
        }
    };
    let mut total = 0usize;
    cu!(d, cuDeviceTotalMem(&mut total, dev))?;
    let mut name = [0 as c_char; 256];
    let _ = cu!(d, cuDeviceGetName(name.as_mut_ptr(), 255, dev));
    let mut uuid = [0 as c_char; 16];
    let _ = cu!(d, cuDeviceGetUuid(uuid.as_mut_ptr(), dev));

    macro_rules! fill_common {
        ($p:ident) => {
            $p.name = name;
            $p.uuid = uuid;
            $p.totalGlobalMem = total;
            $p.sharedMemPerBlock = attr(8, 49152) as usize;
            $p.regsPerBlock = attr(12, 65536);
            $p.warpSize = attr(10, 32);
            $p.memPitch = attr(11, i32::MAX) as usize;
            $p.maxThreadsPerBlock = attr(1, 1024);
            $p.maxThreadsDim = [attr(2, 1024), attr(3, 1024), attr(4, 64)];
            $p.maxGridSize = [attr(5, i32::MAX), attr(6, 65535), attr(7, 65535)];
            $p.totalConstMem = attr(9, 65536) as usize;
            $p.major = attr(75, 9);
            $p.minor = attr(76, 0);
            $p.textureAlignment = attr(14, 512) as usize;
            $p.texturePitchAlignment = attr(51, 32) as usize;
            $p.multiProcessorCount = attr(16, 132);
            $p.integrated = attr(18, 0);
            $p.canMapHostMemory = attr(19, 1);
            $p.concurrentKernels = attr(31, 1);
            $p.pciBusID = attr(33, dev + 1);
            $p.pciDeviceID = attr(34, 0);
            $p.pciDomainID = attr(50, 0);
            $p.asyncEngineCount = attr(40, 2);
            $p.unifiedAddressing = attr(41, 1);
            $p.memoryBusWidth = attr(37, 5120);
            $p.l2CacheSize = attr(38, 50 << 20);
            $p.maxThreadsPerMultiProcessor = attr(39, 2048);
            $p.streamPrioritiesSupported = attr(78, 1);
            $p.globalL1CacheSupported = attr(79, 1);
            $p.localL1CacheSupported = attr(80, 1);
            $p.sharedMemPerMultiprocessor = attr(81, 233472) as usize;
            $p.regsPerMultiprocessor = attr(82, 65536);
            $p.managedMemory = attr(83, 1);
            $p.concurrentManagedAccess = attr(89, 1);
            $p.cooperativeLaunch = attr(95, 1);
            $p.sharedMemPerBlockOptin = attr(97, 232448) as usize;
            $p.maxBlocksPerMultiProcessor = attr(106, 32);
            $p.memoryPoolsSupported = attr(115, 1);
            $p.memoryPoolSupportedHandleTypes = attr(119, 1) as c_uint;
            $p.ipcEventSupported = attr(125, 1);
        };
    }
    if rt.version >= 13000 {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut p: cudaDeviceProp13 = unsafe { std::mem::zeroed() };
        fill_common!(p);
        p.deviceNumaId = -1;
        p.hostNumaId = -1;
        // SAFETY: the caller passes a `struct cudaDeviceProp` of the CUDA 13 layout.
        unsafe { (prop as *mut cudaDeviceProp13).write_unaligned(p) };
    } else {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut p: cudaDeviceProp12 = unsafe { std::mem::zeroed() };
        fill_common!(p);
        p.clockRate = attr(13, 1_980_000);
        p.memoryClockRate = attr(36, 2_619_000);
        p.deviceOverlap = 1;
        p.computeMode = attr(20, 0);
        // SAFETY: the caller passes a `struct cudaDeviceProp` of the CUDA 12 layout.
        unsafe { (prop as *mut cudaDeviceProp12).write_unaligned(p) };
    }
    Ok(())
}

// ------------------------------------------------------------------------------- memory

fn out_ptr<T>(p: *mut *mut T, v: u64) {
    // SAFETY: callers checked `p` for NULL.
    unsafe { *p = v as usize as *mut T };
}

/// `*p` (checked non-null) gets the device pointer `alloc` produces for `size` bytes: NULL
/// first, so that a failure leaves NULL, and NULL alone for 0 bytes, which never reach the
/// driver (as CUDA's `cudaMalloc`, `cudaMallocAsync`, `cudaMallocFromPoolAsync`).
fn alloc_out(p: *mut *mut c_void, size: usize, alloc: impl FnOnce(&mut CUdeviceptr) -> Res) -> Res {
    out_ptr(p, 0);
    if size == 0 {
        return Ok(());
    }
    let mut dp: CUdeviceptr = 0;
    alloc(&mut dp)?;
    out_ptr(p, dp);
    Ok(())
}

pub unsafe fn malloc(rt: Flavor, p: *mut *mut c_void, size: usize) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    alloc_out(p, size, |dp| cu!(d, cuMemAlloc(dp, size)))
}

pub unsafe fn free(rt: Flavor, p: *mut c_void) -> Res {
    let d = ctx(rt)?;
    if p.is_null() {
        return Ok(());
    }
    cu!(d, cuMemFree(p as CUdeviceptr))
}

pub unsafe fn malloc_pitch(
    rt: Flavor,
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> Res {
    nonnull(p)?;
    nonnull(pitch)?;
    let d = ctx(rt)?;
    out_ptr(p, 0);
    if width == 0 || height == 0 {
        // SAFETY: checked non-null.
        unsafe { *pitch = 0 };
        return Ok(());
    }
    let mut dp: CUdeviceptr = 0;
    cu!(d, cuMemAllocPitch(&mut dp, pitch, width, height, 16))?;
    out_ptr(p, dp);
    Ok(())
}

pub unsafe fn malloc_3d(rt: Flavor, pp: *mut cudaPitchedPtr, e: cudaExtent) -> Res {
    nonnull(pp)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut pitch = 0usize;
    // SAFETY: local out-pointers.
    unsafe {
        malloc_pitch(
            rt,
            &mut p,
            &mut pitch,
            e.width,
            e.height.saturating_mul(e.depth),
        )
    }?;
    // SAFETY: checked non-null.
    unsafe {
        *pp = cudaPitchedPtr {
            ptr: p,
            pitch,
            xsize: e.width,
            ysize: e.height,
        }
    };
    Ok(())
}

pub unsafe fn malloc_managed(rt: Flavor, p: *mut *mut c_void, size: usize, flags: c_uint) -> Res {
    nonnull(p)?;
    if flags != 1 && flags != 2 {
        return Err(err::INVALID_VALUE);
    }
    let d = ctx(rt)?;
    out_ptr(p, 0);
    if size == 0 {
        return Err(err::INVALID_VALUE);
    }
    let mut dp: CUdeviceptr = 0;
    cu!(d, cuMemAllocManaged(&mut dp, size, flags))?;
    out_ptr(p, dp);
    Ok(())
}

pub unsafe fn malloc_host(rt: Flavor, p: *mut *mut c_void, size: usize) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    out_ptr(p, 0);
    if size == 0 {
        return Ok(());
    }
    cu!(d, cuMemAllocHost(p, size))
}

pub unsafe fn host_alloc(rt: Flavor, p: *mut *mut c_void, size: usize, flags: c_uint) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    out_ptr(p, 0);
    if size == 0 {
        return Ok(());
    }
    cu!(d, cuMemHostAlloc(p, size, flags))
}

pub unsafe fn free_host(rt: Flavor, p: *mut c_void) -> Res {
    let d = ctx(rt)?;
    if p.is_null() {
        return Ok(());
    }
    cu!(d, cuMemFreeHost(p))
}

pub unsafe fn malloc_async(
    rt: Flavor,
    ptds: bool,
    p: *mut *mut c_void,
    size: usize,
    s: CUstream,
) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    alloc_out(
        p,
        size,
        |dp| cu!(d, ptds => cuMemAllocAsync_ptsz | cuMemAllocAsync(dp, size, s)),
    )
}

pub unsafe fn malloc_from_pool_async(
    rt: Flavor,
    ptds: bool,
    p: *mut *mut c_void,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> Res {
    nonnull(p)?;
    nonnull(pool)?;
    let d = ctx(rt)?;
    alloc_out(p, size, |dp| {
        cu!(d, ptds => cuMemAllocFromPoolAsync_ptsz
            | cuMemAllocFromPoolAsync(dp, size, pool, s))
    })
}

pub unsafe fn free_async(rt: Flavor, ptds: bool, p: *mut c_void, s: CUstream) -> Res {
    let d = ctx(rt)?;
    if p.is_null() {
        return Ok(());
    }
    cu!(d, ptds => cuMemFreeAsync_ptsz | cuMemFreeAsync(p as CUdeviceptr, s))
}

pub unsafe fn device_get_default_mem_pool(rt: Flavor, pool: *mut CUmemoryPool, dev: c_int) -> Res {
    nonnull(pool)?;
    let d = ctx(rt)?;
    valid_device(d, dev)?;
    cu!(d, cuDeviceGetDefaultMemPool(pool, dev))
}

pub unsafe fn mem_get_info(rt: Flavor, free: *mut usize, total: *mut usize) -> Res {
    let d = ctx(rt)?;
    let (mut f, mut t) = (0usize, 0usize);
    cu!(d, cuMemGetInfo(&mut f, &mut t))?;
    if !free.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *free = f };
    }
    if !total.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *total = t };
    }
    Ok(())
}

pub unsafe fn pointer_get_attributes(
    rt: Flavor,
    a: *mut cudaPointerAttributes,
    p: *const c_void,
) -> Res {
    nonnull(a)?;
    let d = ctx(rt)?;
    let mut mt: c_uint = 0;
    let dp = p as CUdeviceptr;
    let known = cu!(
        d,
        cuPointerGetAttribute(
            &mut mt as *mut c_uint as *mut c_void,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            dp
        )
    );
    let mut attrs = cudaPointerAttributes {
        type_: 0,
        device: -2,
        devicePointer: std::ptr::null_mut(),
        hostPointer: p as *mut c_void,
    };
    if known.is_ok() {
        let mut managed: c_int = 0;
        let _ = cu!(
            d,
            cuPointerGetAttribute(
                &mut managed as *mut c_int as *mut c_void,
                CU_POINTER_ATTRIBUTE_IS_MANAGED,
                dp
            )
        );
        let mut ord: c_int = 0;
        let _ = cu!(
            d,
            cuPointerGetAttribute(
                &mut ord as *mut c_int as *mut c_void,
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                dp
            )
        );
        attrs.device = ord;
        attrs.type_ = if managed != 0 {
            3
        } else if mt == CU_MEMORYTYPE_HOST {
            1
        } else {
            2
        };
        attrs.devicePointer = p as *mut c_void;
        if attrs.type_ == 2 {
            attrs.hostPointer = std::ptr::null_mut();
        }
    } else if p.is_null() {
        attrs.hostPointer = std::ptr::null_mut();
    }
    // SAFETY: checked non-null.
    unsafe { a.write(attrs) };
    Ok(())
}

pub unsafe fn ipc_get_mem_handle(rt: Flavor, h: *mut cudaIpcMemHandle_t, p: *mut c_void) -> Res {
    nonnull(h)?;
    let d = ctx(rt)?;
    if p.is_null() {
        return Err(err::INVALID_VALUE);
    }
    if let Some(f) = d.cuIpcGetMemHandle {
        // SAFETY: driver entry point; CUipcMemHandle and cudaIpcMemHandle_t are both 64 bytes.
        return check(from_cu(unsafe { f(h as *mut c_void, p as CUdeviceptr) }));
    }
    // Without the driver's IPC: only memory from cuMemAlloc (not VMM-mapped) qualifies.
    let mut capable: c_int = 0;
    cu!(
        d,
        cuPointerGetAttribute(
            &mut capable as *mut c_int as *mut c_void,
            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            p as CUdeviceptr
        )
    )
    .map_err(|_| err::INVALID_VALUE)?;
    if capable == 0 {
        return Err(err::INVALID_VALUE);
    }
    let (mut base, mut size) = (0 as CUdeviceptr, 0usize);
    cu!(
        d,
        cuMemGetAddressRange(&mut base, &mut size, p as CUdeviceptr)
    )?;
    let mut bytes = [0 as c_char; 64];
    let pid = std::process::id() as u64;
    for (i, b) in pid
        .to_le_bytes()
        .iter()
        .chain(base.to_le_bytes().iter())
        .chain(size.to_le_bytes().iter())
        .enumerate()
    {
        bytes[i] = *b as c_char;
    }
    // SAFETY: checked non-null.
    unsafe { (*h).reserved = bytes };
    Ok(())
}

// ------------------------------------------------------------------------------- copies

pub unsafe fn memcpy(
    rt: Flavor,
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_uint,
) -> Res {
    let d = ctx(rt)?;
    if n == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let (dd, sd) = (dst as CUdeviceptr, src as CUdeviceptr);
    match kind {
        memcpy_kind::HOST_TO_HOST => {
            // SAFETY: both are host pointers valid for `n` bytes, as the caller promises.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
            Ok(())
        }
        memcpy_kind::HOST_TO_DEVICE => cu!(d, cuMemcpyHtoD(dd, src, n)),
        memcpy_kind::DEVICE_TO_HOST => cu!(d, cuMemcpyDtoH(dst, sd, n)),
        memcpy_kind::DEVICE_TO_DEVICE => cu!(d, cuMemcpyDtoD(dd, sd, n)),
        memcpy_kind::DEFAULT => cu!(d, cuMemcpy(dd, sd, n)),
        _ => Err(err::INVALID_MEMCPY_DIRECTION),
    }
}

pub unsafe fn memcpy_async(
    rt: Flavor,
    ptds: bool,
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_uint,
    s: CUstream,
) -> Res {
    let d = ctx(rt)?;
    if n == 0 {
        return Ok(());
    }
    if dst.is_null() || src.is_null() {
        return Err(err::INVALID_VALUE);
    }
    let (dd, sd) = (dst as CUdeviceptr, src as CUdeviceptr);
    match kind {
        memcpy_kind::HOST_TO_DEVICE => {
            cu!(d, ptds => cuMemcpyHtoDAsync_ptsz | cuMemcpyHtoDAsync(dd, src, n, s))
        }
        memcpy_kind::DEVICE_TO_HOST => {
            cu!(d, ptds => cuMemcpyDtoHAsync_ptsz | cuMemcpyDtoHAsync(dst, sd, n, s))
        }
        memcpy_kind::DEVICE_TO_DEVICE => {
            cu!(d, ptds => cuMemcpyDtoDAsync_ptsz | cuMemcpyDtoDAsync(dd, sd, n, s))
        }
        memcpy_kind::HOST_TO_HOST | memcpy_kind::DEFAULT => {
            cu!(d, ptds => cuMemcpyAsync_ptsz | cuMemcpyAsync(dd, sd, n, s))
        }
        _ => Err(err::INVALID_MEMCPY_DIRECTION),
    }
}

/// `cudaMemcpy2DAsync`: one copy when both pitches equal the width, else one per row.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_async(
    rt: Flavor,
    ptds: bool,
    dst: *mut c_void,
    dpitch: usize,
    src: *const c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: c_uint,
    s: CUstream,
) -> Res {
    ctx(rt)?;
    if width > dpitch || width > spitch {
        return Err(INVALID_PITCH_VALUE);
    }
    if width == 0 || height == 0 {
        return Ok(());
    }
    if dpitch == width && spitch == width {
        let n = width.checked_mul(height).ok_or(err::INVALID_VALUE)?;
        // SAFETY: forwarded; the caller promises both ranges.
        return unsafe { memcpy_async(rt, ptds, dst, src, n, kind, s) };
    }
    for row in 0..height {
        let (d, sr) = (
            (dst as usize).wrapping_add(row * dpitch) as *mut c_void,
            (src as usize).wrapping_add(row * spitch) as *const c_void,
        );
        // SAFETY: row `row` of both 2D ranges the caller promises.
        unsafe { memcpy_async(rt, ptds, d, sr, width, kind, s) }?;
    }
    Ok(())
}

const INVALID_PITCH_VALUE: cudaError_t = 12;

pub unsafe fn memset(rt: Flavor, p: *mut c_void, v: c_int, n: usize) -> Res {
    let d = ctx(rt)?;
    if n == 0 {
        return Ok(());
    }
    nonnull(p)?;
    cu!(d, cuMemsetD8(p as CUdeviceptr, v as u8, n))
}

pub unsafe fn memset_async(
    rt: Flavor,
    ptds: bool,
    p: *mut c_void,
    v: c_int,
    n: usize,
    s: CUstream,
) -> Res {
    let d = ctx(rt)?;
    if n == 0 {
        return Ok(());
    }
    nonnull(p)?;
    cu!(d, ptds => cuMemsetD8Async_ptsz | cuMemsetD8Async(p as CUdeviceptr, v as u8, n, s))
}

/// `vramsimKernelFill`: the simulated GPU's fill "kernel" (see docs/cuda-sim.md).
pub unsafe fn kernel_fill(
    rt: Flavor,
    ptds: bool,
    dst: *mut c_void,
    v: u8,
    n: usize,
    delay_us: c_uint,
    s: CUstream,
) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => vramsimLaunchFill_ptsz
        | vramsimLaunchFill(s, dst as CUdeviceptr, v, n, delay_us))
}

/// `vramsimKernelCopy`: the simulated GPU's copy "kernel".
pub unsafe fn kernel_copy(
    rt: Flavor,
    ptds: bool,
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    delay_us: c_uint,
    s: CUstream,
) -> Res {
    let d = ctx(rt)?;
    let (dd, sd) = (dst as CUdeviceptr, src as CUdeviceptr);
    cu!(d, ptds => vramsimLaunchCopy_ptsz | vramsimLaunchCopy(s, dd, sd, n, delay_us))
}

// ------------------------------------------------------------------------ streams, events

pub unsafe fn stream_create(
    rt: Flavor,
    s: *mut CUstream,
    flags: c_uint,
    priority: Option<c_int>,
) -> Res {
    nonnull(s)?;
    let d = ctx(rt)?;
    match (priority, d.cuStreamCreateWithPriority) {
        (Some(p), Some(_)) => cu!(d, cuStreamCreateWithPriority(s, flags, p)),
        _ => cu!(d, cuStreamCreate(s, flags)),
    }
}

pub unsafe fn stream_destroy(rt: Flavor, s: CUstream) -> Res {
    let d = ctx(rt)?;
    if s.is_null() || s as usize == 1 || s as usize == 2 {
        return Err(err::INVALID_RESOURCE_HANDLE);
    }
    cu!(d, cuStreamDestroy(s))
}

pub unsafe fn stream_synchronize(rt: Flavor, ptds: bool, s: CUstream) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamSynchronize_ptsz | cuStreamSynchronize(s))
}

pub unsafe fn stream_query(rt: Flavor, ptds: bool, s: CUstream) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamQuery_ptsz | cuStreamQuery(s))
}

pub unsafe fn stream_wait_event(
    rt: Flavor,
    ptds: bool,
    s: CUstream,
    e: CUevent,
    flags: c_uint,
) -> Res {
    let d = ctx(rt)?;
    nonnull(e)?;
    cu!(d, ptds => cuStreamWaitEvent_ptsz | cuStreamWaitEvent(s, e, flags))
}

pub unsafe fn stream_begin_capture(rt: Flavor, ptds: bool, s: CUstream, mode: c_uint) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamBeginCapture_ptsz | cuStreamBeginCapture(s, mode))
}

pub unsafe fn stream_end_capture(rt: Flavor, ptds: bool, s: CUstream, g: *mut CUgraph) -> Res {
    nonnull(g)?;
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamEndCapture_ptsz | cuStreamEndCapture(s, g))
}

pub unsafe fn stream_is_capturing(rt: Flavor, ptds: bool, s: CUstream, st: *mut c_uint) -> Res {
    nonnull(st)?;
    let d = ctx(rt)?;
    let r = cu!(d, ptds => cuStreamIsCapturing_ptsz | cuStreamIsCapturing(s, st));
    if r == Err(err::NOT_SUPPORTED) {
        // A driver without graphs never captures.
        // SAFETY: checked non-null.
        unsafe { *st = 0 };
        return Ok(());
    }
    r
}

pub unsafe fn stream_get_capture_info(
    rt: Flavor,
    ptds: bool,
    s: CUstream,
    st: *mut c_uint,
    id: *mut u64,
) -> Res {
    nonnull(st)?;
    let d = ctx(rt)?;
    let mut local_id = 0u64;
    let idp = if id.is_null() {
        &mut local_id as *mut u64
    } else {
        id
    };
    let r = cu!(d, ptds => cuStreamGetCaptureInfo_ptsz | cuStreamGetCaptureInfo(s, st, idp));
    if r == Err(err::NOT_SUPPORTED) {
        // SAFETY: checked non-null.
        unsafe { *st = 0 };
        return Ok(());
    }
    r
}

pub unsafe fn thread_exchange_stream_capture_mode(rt: Flavor, mode: *mut c_uint) -> Res {
    nonnull(mode)?;
    let d = drv(rt)?;
    match cu!(d, cuThreadExchangeStreamCaptureMode(mode)) {
        Err(err::NOT_SUPPORTED) => Ok(()),
        r => r,
    }
}

pub unsafe fn event_create(rt: Flavor, e: *mut CUevent, flags: c_uint) -> Res {
    nonnull(e)?;
    let d = ctx(rt)?;
    cu!(d, cuEventCreate(e, flags))
}

pub unsafe fn event_record(rt: Flavor, ptds: bool, e: CUevent, s: CUstream) -> Res {
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, ptds => cuEventRecord_ptsz | cuEventRecord(e, s))
}

pub unsafe fn event_query(rt: Flavor, e: CUevent) -> Res {
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, cuEventQuery(e))
}

pub unsafe fn event_synchronize(rt: Flavor, e: CUevent) -> Res {
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, cuEventSynchronize(e))
}

pub unsafe fn event_destroy(rt: Flavor, e: CUevent) -> Res {
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, cuEventDestroy(e))
}

pub unsafe fn event_elapsed_time(rt: Flavor, ms: *mut f32, a: CUevent, b: CUevent) -> Res {
    nonnull(ms)?;
    nonnull(a).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    nonnull(b).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, cuEventElapsedTime(ms, a, b))
}

// --------------------------------------------------- pools, host registration, IPC, misc

pub unsafe fn mem_pool_trim_to(rt: Flavor, pool: CUmemoryPool, keep: usize) -> Res {
    nonnull(pool)?;
    let d = ctx(rt)?;
    cu!(d, cuMemPoolTrimTo(pool, keep))
}

/// `cudaMemPoolSetAttribute` (`set`) / `cudaMemPoolGetAttribute`: the attribute numbering is
/// the driver's.
pub unsafe fn mem_pool_attribute(
    rt: Flavor,
    set: bool,
    pool: CUmemoryPool,
    attr: c_int,
    v: *mut c_void,
) -> Res {
    nonnull(pool)?;
    nonnull(v)?;
    let d = ctx(rt)?;
    if set {
        cu!(d, cuMemPoolSetAttribute(pool, attr, v))
    } else {
        cu!(d, cuMemPoolGetAttribute(pool, attr, v))
    }
}

/// `cudaMemPoolSetAccess`: `cudaMemAccessDesc` has `CUmemAccessDesc`'s layout.
pub unsafe fn mem_pool_set_access(
    rt: Flavor,
    pool: CUmemoryPool,
    descs: *const c_void,
    n: usize,
) -> Res {
    nonnull(pool)?;
    if n > 0 {
        nonnull(descs)?;
    }
    let d = ctx(rt)?;
    cu!(d, cuMemPoolSetAccess(pool, descs, n))
}

pub unsafe fn host_register(rt: Flavor, p: *mut c_void, size: usize, flags: c_uint) -> Res {
    nonnull(p)?;
    if size == 0 {
        return Err(err::INVALID_VALUE);
    }
    let d = ctx(rt)?;
    cu!(d, cuMemHostRegister(p, size, flags))
}

pub unsafe fn host_unregister(rt: Flavor, p: *mut c_void) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    cu!(d, cuMemHostUnregister(p))
}

pub unsafe fn ipc_open_mem_handle(
    rt: Flavor,
    p: *mut *mut c_void,
    h: cudaIpcMemHandle_t,
    flags: c_uint,
) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    out_ptr(p, 0);
    let mut dp: CUdeviceptr = 0;
    cu!(d, cuIpcOpenMemHandle(&mut dp, h, flags))?;
    out_ptr(p, dp);
    Ok(())
}

pub unsafe fn ipc_close_mem_handle(rt: Flavor, p: *mut c_void) -> Res {
    nonnull(p)?;
    let d = ctx(rt)?;
    cu!(d, cuIpcCloseMemHandle(p as CUdeviceptr))
}

pub unsafe fn ipc_get_event_handle(rt: Flavor, h: *mut cudaIpcEventHandle_t, e: CUevent) -> Res {
    nonnull(h)?;
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, cuIpcGetEventHandle(h, e))
}

pub unsafe fn ipc_open_event_handle(rt: Flavor, e: *mut CUevent, h: cudaIpcEventHandle_t) -> Res {
    nonnull(e)?;
    let d = ctx(rt)?;
    cu!(d, cuIpcOpenEventHandle(e, h))
}

/// `cudaMemcpyPeerAsync`: the driver wants the two devices' (primary) contexts.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_peer_async(
    rt: Flavor,
    ptds: bool,
    dst: *mut c_void,
    dst_dev: c_int,
    src: *const c_void,
    src_dev: c_int,
    n: usize,
    s: CUstream,
) -> Res {
    let d = ctx(rt)?;
    valid_device(d, dst_dev)?;
    valid_device(d, src_dev)?;
    if n == 0 {
        return Ok(());
    }
    let (dc, sc) = (
        primary(d, dst_dev)? as CUcontext,
        primary(d, src_dev)? as CUcontext,
    );
    let (dd, sd) = (dst as CUdeviceptr, src as CUdeviceptr);
    cu!(d, ptds => cuMemcpyPeerAsync_ptsz | cuMemcpyPeerAsync(dd, dc, sd, sc, n, s))
}

pub unsafe fn launch_host_func(
    rt: Flavor,
    ptds: bool,
    s: CUstream,
    f: HostFn,
    data: *mut c_void,
) -> Res {
    if f.is_none() {
        return Err(err::INVALID_VALUE);
    }
    let d = ctx(rt)?;
    cu!(d, ptds => cuLaunchHostFunc_ptsz | cuLaunchHostFunc(s, f, data))
}

pub unsafe fn stream_add_callback(
    rt: Flavor,
    ptds: bool,
    s: CUstream,
    cb: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> Res {
    if cb.is_none() || flags != 0 {
        return Err(err::INVALID_VALUE);
    }
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamAddCallback_ptsz | cuStreamAddCallback(s, cb, data, flags))
}

pub unsafe fn event_record_with_flags(
    rt: Flavor,
    ptds: bool,
    e: CUevent,
    s: CUstream,
    flags: c_uint,
) -> Res {
    nonnull(e).map_err(|_| err::INVALID_RESOURCE_HANDLE)?;
    let d = ctx(rt)?;
    cu!(d, ptds => cuEventRecordWithFlags_ptsz | cuEventRecordWithFlags(e, s, flags))
}

pub unsafe fn stream_get_priority(rt: Flavor, ptds: bool, s: CUstream, prio: *mut c_int) -> Res {
    nonnull(prio)?;
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamGetPriority_ptsz | cuStreamGetPriority(s, prio))
}

pub unsafe fn device_get_stream_priority_range(
    rt: Flavor,
    least: *mut c_int,
    greatest: *mut c_int,
) -> Res {
    let d = ctx(rt)?;
    let (mut l, mut g) = (0, 0);
    cu!(d, cuCtxGetStreamPriorityRange(&mut l, &mut g))?;
    if !least.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *least = l };
    }
    if !greatest.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *greatest = g };
    }
    Ok(())
}

pub unsafe fn device_get_pci_bus_id(rt: Flavor, buf: *mut c_char, len: c_int, dev: c_int) -> Res {
    nonnull(buf)?;
    if len <= 0 {
        return Err(err::INVALID_VALUE);
    }
    let d = drv(rt)?;
    valid_device(d, dev)?;
    cu!(d, cuDeviceGetPCIBusId(buf, len, dev))
}

/// `cudaProfilerStart` / `cudaProfilerStop`: no profiler attached, nothing to do.
pub fn profiler(rt: Flavor) -> Res {
    drv(rt).map(|_| ())
}

// ------------------------------------------------------------------- driver entry points

/// `cudaGetDriverEntryPoint[ByVersion][_ptsz]`: forwards to the driver's
/// `cuGetProcAddress_v2`. `cudaEnableDefault` means legacy stream for the plain export and
/// per-thread default stream for the `_ptsz` export, as with nvcc's `--default-stream`.
pub unsafe fn get_driver_entry_point(
    rt: Flavor,
    ptds: bool,
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Res {
    nonnull(symbol)?;
    nonnull(func)?;
    // SAFETY: checked non-null.
    unsafe { *func = std::ptr::null_mut() };
    if flags > (CUDA_ENABLE_LEGACY_STREAM | CUDA_ENABLE_PER_THREAD_DEFAULT_STREAM) {
        return Err(err::INVALID_VALUE);
    }
    let d = drv(rt)?;
    let cu_flags = match flags {
        CUDA_ENABLE_DEFAULT if ptds => CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        CUDA_ENABLE_DEFAULT => CU_GET_PROC_ADDRESS_LEGACY_STREAM,
        f => f,
    };
    let mut st: c_int = 0;
    // SAFETY: the driver's own cuGetProcAddress_v2 with valid pointers.
    let rc = unsafe { (d.get_proc)(symbol, func, version, cu_flags, &mut st) };
    if !status.is_null() {
        // SAFETY: non-null out-pointer from the caller.
        unsafe { *status = st };
    }
    match rc {
        CUDA_SUCCESS => Ok(()),
        // Not found / version not sufficient: success with a NULL pointer and the reason in
        // driverStatus, as cuGetProcAddress itself reports it.
        CUDA_ERROR_NOT_FOUND => {
            if !status.is_null() && st == 0 {
                // SAFETY: non-null out-pointer from the caller.
                unsafe { *status = 1 };
            }
            // SAFETY: checked non-null.
            unsafe { *func = std::ptr::null_mut() };
            Ok(())
        }
        e => Err(from_cu(e)),
    }
}

#[doc(hidden)]
pub fn self_test_panic() -> Res {
    panic!("vramsim runtime: deliberate panic (self test of the C ABI guard)")
}

// ---------------------------------------------------------------------------- graphs

/// `cudaGraphInstantiate` (CUDA 12's, with flags) and `cudaGraphInstantiateWithFlags`.
pub unsafe fn graph_instantiate(rt: Flavor, out: *mut CUgraphExec, g: CUgraph, flags: u64) -> Res {
    nonnull(out)?;
    let d = ctx(rt)?;
    cu!(d, cuGraphInstantiateWithFlags(out, g, flags))
}

pub unsafe fn graph_launch(rt: Flavor, ptds: bool, e: CUgraphExec, s: CUstream) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => cuGraphLaunch_ptsz | cuGraphLaunch(e, s))
}

pub unsafe fn graph_exec_destroy(rt: Flavor, e: CUgraphExec) -> Res {
    let d = drv(rt)?;
    cu!(d, cuGraphExecDestroy(e))
}

pub unsafe fn graph_destroy(rt: Flavor, g: CUgraph) -> Res {
    nonnull(g)?;
    let d = drv(rt)?;
    cu!(d, cuGraphDestroy(g))
}

/// `cudaDeviceGetGraphMemAttribute`: the driver's answer (what allocation nodes hold).
pub unsafe fn device_get_graph_mem_attribute(
    rt: Flavor,
    dev: c_int,
    attr: c_int,
    v: *mut c_void,
) -> Res {
    let d = drv(rt)?;
    cu!(d, cuDeviceGetGraphMemAttribute(dev, attr, v))
}

/// `cudaDeviceSetGraphMemAttribute`: only the two high-water marks can be reset (to 0).
pub unsafe fn device_set_graph_mem_attribute(
    rt: Flavor,
    dev: c_int,
    attr: c_int,
    v: *mut c_void,
) -> Res {
    let d = drv(rt)?;
    cu!(d, cuDeviceSetGraphMemAttribute(dev, attr, v))
}

pub unsafe fn graph_create(rt: Flavor, out: *mut CUgraph, flags: c_uint) -> Res {
    nonnull(out)?;
    let d = ctx(rt)?;
    cu!(d, cuGraphCreate(out, flags))
}

/// `cudaStreamBeginCaptureToGraph` (CUDA 12.3+): the driver's.
#[allow(clippy::too_many_arguments)]
pub unsafe fn stream_begin_capture_to_graph(
    rt: Flavor,
    ptds: bool,
    s: CUstream,
    g: CUgraph,
    deps: *const c_void,
    edges: *const c_void,
    n: usize,
    mode: c_uint,
) -> Res {
    let d = ctx(rt)?;
    cu!(d, ptds => cuStreamBeginCaptureToGraph_ptsz
        | cuStreamBeginCaptureToGraph(s, g, deps, edges, n, mode))
}
