//! The real CUDA functions, resolved lazily into `AtomicUsize` slots.
//!
//! * runtime (`cuda*`): `dlsym(RTLD_NEXT, name)` from this library, then the handle of an
//!   already-loaded `libcudart.so.13`/`.12` (`RTLD_NOLOAD`); or the address our `dlsym` /
//!   lookup hooks saw when the process resolved the name itself (recorded first).
//! * driver (`cu*`): `libcuda.so.1` opened with `RTLD_NOW|RTLD_NOLOAD` (or loaded once with
//!   `RTLD_NOW|RTLD_NODELETE`), then the real `dlsym` on that handle.
//! * NVML: `libnvidia-ml.so.1`, the same way.
//!
//! Nothing is linked: the library has no DT_NEEDED on CUDA. Typed accessors return `None`
//! when the function does not exist (no driver): callers return the error CUDA returns
//! without a driver.
//!
//! For other layers (pool's VMM backend): `if let Some(f) = crate::cuda::real::cuMemCreate() {
//! unsafe { f(&mut handle, size, &prop, 0) } }`. These calls go straight to the driver:
//! they are not intercepted, counted or traced.
#![allow(non_snake_case, non_upper_case_globals)]

use crate::cuda::types::*;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lib {
    Runtime,
    Driver,
    Nvml,
}

/// `Slot::addr` of a function known not to exist (see `Slot::settle`).
const ABSENT: usize = 1;

/// One real function: its name, its library and its address (0 = not resolved yet,
/// `ABSENT` = looked up, not there).
pub(crate) struct Slot {
    addr: AtomicUsize,
    pub name: &'static CStr,
    pub lib: Lib,
}

impl Slot {
    pub(crate) const fn new(name: &'static CStr, lib: Lib) -> Slot {
        Slot {
            addr: AtomicUsize::new(0),
            name,
            lib,
        }
    }

    /// The real address, resolving it on first use; 0 if it does not exist.
    #[inline]
    pub(crate) fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a > ABSENT {
            return a;
        }
        self.resolve(a)
    }

    /// The address if already known, without resolving.
    #[inline]
    pub(crate) fn peek(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a > ABSENT { a } else { 0 }
    }

    /// Remember an address the process itself obtained for this name (our `dlsym` or
    /// lookup hooks saw it; they never pass one of their own hooks). Never overwrites a
    /// known address (a remembered absence it does: the process found what our lookup did
    /// not).
    pub(crate) fn record(&self, addr: usize) {
        if addr == 0 {
            return;
        }
        let _ = self
            .addr
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur <= ABSENT).then_some(addr)
            });
    }

    /// `a`: the slot's value, 0 or `ABSENT`.
    #[cold]
    fn resolve(&self, a: usize) -> usize {
        if a == ABSENT {
            return 0;
        }
        #[cfg(test)]
        tests::RESOLVES.with(|n| n.set(n.get() + 1));
        let a = match self.lib {
            Lib::Runtime => resolve_runtime(self.name),
            Lib::Driver => lib_sym(&LIBCUDA, LIBCUDA_NAMES, self.name),
            Lib::Nvml => lib_sym(&LIBNVML, LIBNVML_NAMES, self.name),
        };
        // A driver or NVML function that is not there stays absent: `lib_sym` loaded the
        // library (whose symbols do not change) or remembered that it cannot be loaded.
        // Runtime functions may appear later (a runtime `dlopen`ed after our first call).
        self.settle(a, self.lib != Lib::Runtime)
    }

    /// Store what a lookup found (`a`, 0 for nothing); with `final_miss`, remember a miss,
    /// so that a process without a driver does not look again on every request.
    fn settle(&self, a: usize, final_miss: bool) -> usize {
        if a == 0 || in_this_library(a) {
            if a == 0 && final_miss {
                let _ = self
                    .addr
                    .compare_exchange(0, ABSENT, Ordering::AcqRel, Ordering::Acquire);
            }
            return 0;
        }
        match self
            .addr
            .compare_exchange(0, a, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => a,
            Err(cur) if cur > ABSENT => cur,
            // Marked absent meanwhile by a lookup that found nothing: keep what we found.
            Err(_) => {
                self.addr.store(a, Ordering::Release);
                a
            }
        }
    }
}

/// Whether `addr` lies in this library (our hooks among it): what a lookup of a real
/// function finds there is never stored as real. Asked of the dynamic linker (`dladdr`),
/// not of the hooks' table, so that this layer knows nothing of the layers above it; only
/// asked when a lookup found something (once per function).
fn in_this_library(addr: usize) -> bool {
    fn base_of(addr: usize) -> usize {
        // SAFETY: Dl_info is plain data; all-zero is a valid value for dladdr to fill.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables; info is a valid out-pointer.
        if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
    let own = base_of(in_this_library as fn(usize) -> bool as usize);
    own != 0 && base_of(addr) == own
}

// ------------------------------------------------------------------------- real dlsym

pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Address of glibc's `dlsym` (resolved with `dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34")`,
/// falling back to `GLIBC_2.2.5`). Allocation-free, lock-free, idempotent.
#[inline]
pub(crate) fn real_dlsym_addr() -> usize {
    let a = REAL_DLSYM.load(Ordering::Acquire);
    if a != 0 {
        return a;
    }
    resolve_real_dlsym()
}

#[cold]
pub(crate) extern "C" fn resolve_real_dlsym() -> usize {
    let versions: [&CStr; 3] = [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"];
    for v in versions {
        // SAFETY: dlvsym with valid NUL-terminated strings; RTLD_NEXT from this library.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            REAL_DLSYM.store(p as usize, Ordering::Release);
            return p as usize;
        }
    }
    0
}

/// Call glibc's `dlsym` (never our hook). The caller seen by glibc is this library.
#[allow(clippy::not_unsafe_ptr_arg_deref)] // the handle is only passed on to dlsym
pub(crate) fn dlsym_real(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let a = real_dlsym_addr();
    if a == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a is glibc's dlsym.
    let f: DlsymFn = unsafe { std::mem::transmute::<usize, DlsymFn>(a) };
    // SAFETY: name is NUL-terminated; handle is the caller's.
    unsafe { f(handle, name.as_ptr()) }
}

// ------------------------------------------------------------------------- libraries

static LIBCUDA: AtomicUsize = AtomicUsize::new(0);
static LIBNVML: AtomicUsize = AtomicUsize::new(0);
static LIBCUDART: AtomicUsize = AtomicUsize::new(0);
const LIBCUDA_NAMES: &[&CStr] = &[c"libcuda.so.1", c"libcuda.so"];
const LIBNVML_NAMES: &[&CStr] = &[c"libnvidia-ml.so.1", c"libnvidia-ml.so"];
const LIBCUDART_NAMES: &[&CStr] = &[c"libcudart.so.13", c"libcudart.so.12", c"libcudart.so"];

/// `cache` value after a load of the library failed: the dynamic linker searched every
/// directory for it, and a second search in the same process finds nothing new (its search
/// path is fixed at start). Even an `RTLD_NOLOAD` lookup of an absent library searches the
/// file system (glibc matches loaded objects by file identity), so neither is repeated:
/// without this a cap with no driver installed paid ~12 failed `openat` per request.
const LOAD_FAILED: usize = 1;

/// Handle of an already-loaded library of `names`, else (when `load`) load it once with
/// `RTLD_NOW|RTLD_NODELETE`. Null when it cannot be had.
fn lib_handle(cache: &AtomicUsize, names: &[&CStr], load: bool) -> *mut c_void {
    let h = cache.load(Ordering::Acquire);
    if h > LOAD_FAILED {
        return h as *mut c_void;
    }
    if h == LOAD_FAILED {
        return std::ptr::null_mut();
    }
    for n in names {
        // SAFETY: dlopen with a valid name; RTLD_NOLOAD never loads anything.
        let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            cache.store(h as usize, Ordering::Release);
            return h;
        }
    }
    if load {
        for n in names {
            // SAFETY: as above; NODELETE keeps the handle valid for the process lifetime.
            let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_NODELETE) };
            if !h.is_null() {
                cache.store(h as usize, Ordering::Release);
                return h;
            }
        }
        let _ = cache.compare_exchange(0, LOAD_FAILED, Ordering::AcqRel, Ordering::Acquire);
    }
    // Clear the dlerror state our failed dlopen left behind.
    // SAFETY: dlerror has no preconditions.
    unsafe { libc::dlerror() };
    std::ptr::null_mut()
}

fn lib_sym(cache: &AtomicUsize, names: &[&CStr], name: &CStr) -> usize {
    let h = lib_handle(cache, names, true);
    if h.is_null() {
        return 0;
    }
    dlsym_real(h, name) as usize
}

/// Handle of `libcuda.so.1` only if the process already loaded it.
pub(crate) fn libcuda_if_loaded() -> *mut c_void {
    lib_handle(&LIBCUDA, LIBCUDA_NAMES, false)
}

fn resolve_runtime(name: &CStr) -> usize {
    let p = dlsym_real(libc::RTLD_NEXT, name) as usize;
    if p != 0 && !in_this_library(p) {
        return p;
    }
    let h = lib_handle(&LIBCUDART, LIBCUDART_NAMES, false);
    if h.is_null() {
        return 0;
    }
    dlsym_real(h, name) as usize
}

// ------------------------------------------------------------------------- slots

/// The function at address `a` (0: none) as the function-pointer type `F`.
///
/// # Safety
/// `a` is 0 or the address of a function whose ABI is `F`, a function-pointer type.
#[inline(always)]
unsafe fn typed<F: Copy>(a: usize) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<usize>()) };
    // SAFETY: the caller's; F is pointer-sized.
    (a != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
}

macro_rules! real_fns {
    ($( $lib:ident $name:ident : $ty:ty ; )*) => {
        /// The slots themselves (for `record` by the lookup hooks).
        pub(crate) mod slots {
            use super::{Lib, Slot};
            $(
                pub(crate) static $name: Slot = Slot::new(
                    match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("bad name"),
                    },
                    Lib::$lib,
                );
            )*
        }
        /// The library of each real function, known at compile time (for the hooks: which
        /// of them a layer asks is its own business, as with `known`).
        #[allow(dead_code)]
        pub(crate) mod libs {
            use super::Lib;
            $(
                pub(crate) const $name: Lib = Lib::$lib;
            )*
        }
        /// The real functions if already resolved, never resolving (no call: a hook that
        /// only jumps on needs no frame; it takes its full path when one is not known yet).
        // An accessor for every name of the table: which of them a layer calls is its own
        // business, so the ones nobody calls yet are not warned about.
        #[allow(dead_code)]
        pub(crate) mod known {
            use super::*;
            $(
                #[doc = concat!("The real `", stringify!($name), "` if already resolved.")]
                #[inline(always)]
                pub(crate) fn $name() -> Option<$ty> {
                    // SAFETY: the slot holds the address of the C function of that name,
                    // whose ABI is `$ty`.
                    unsafe { typed::<$ty>(slots::$name.peek()) }
                }
            )*
        }
        $(
            #[doc = concat!("The real `", stringify!($name), "`, or `None` if it does not exist.")]
            #[inline]
            pub(crate) fn $name() -> Option<$ty> {
                // SAFETY: as in `known`.
                unsafe { typed::<$ty>(slots::$name.get()) }
            }
        )*
    };
}

real_fns! {
    // ---- runtime
    Runtime cudaMalloc: PfnCudaMalloc;
    Runtime cudaFree: PfnCudaFree;
    Runtime cudaMallocAsync: PfnCudaMallocAsync;
    Runtime cudaMallocAsync_ptsz: PfnCudaMallocAsync;
    Runtime cudaFreeAsync: PfnCudaFreeAsync;
    Runtime cudaFreeAsync_ptsz: PfnCudaFreeAsync;
    Runtime cudaMallocFromPoolAsync: PfnCudaMallocFromPoolAsync;
    Runtime cudaMallocFromPoolAsync_ptsz: PfnCudaMallocFromPoolAsync;
    Runtime cudaMallocPitch: PfnCudaMallocPitch;
    Runtime cudaMalloc3D: PfnCudaMalloc3D;
    Runtime cudaMallocManaged: PfnCudaMallocManaged;
    Runtime cudaMallocHost: PfnCudaMalloc;
    Runtime cudaHostAlloc: PfnCudaHostAlloc;
    Runtime cudaFreeHost: PfnCudaFree;
    Runtime cudaMemGetInfo: PfnCudaMemGetInfo;
    Runtime cudaDeviceReset: PfnCudaDeviceReset;
    Runtime cudaDeviceEnablePeerAccess: PfnCudaDeviceEnablePeerAccess;
    Runtime cudaGetDevice: PfnCudaGetDevice;
    Runtime cudaSetDevice: PfnCuDeviceOp;
    Runtime cudaGetDeviceProperties: PfnCudaGetDeviceProperties;
    Runtime cudaGetDeviceProperties_v2: PfnCudaGetDeviceProperties;
    Runtime cudaDeviceSynchronize: PfnCudaDeviceReset;
    Runtime cudaStreamSynchronize: PfnCuStreamSynchronize;
    Runtime cudaStreamSynchronize_ptsz: PfnCuStreamSynchronize;
    Runtime cudaEventSynchronize: PfnCuEventSynchronize;
    Runtime cudaStreamDestroy: PfnCuStreamDestroy;
    Runtime cudaStreamBeginCapture: PfnCuStreamBeginCaptureMode;
    Runtime cudaStreamBeginCapture_ptsz: PfnCuStreamBeginCaptureMode;
    Runtime cudaStreamBeginCaptureToGraph: PfnCuStreamBeginCaptureToGraph;
    Runtime cudaStreamBeginCaptureToGraph_ptsz: PfnCuStreamBeginCaptureToGraph;
    Runtime cudaStreamEndCapture: PfnCuStreamEndCapture;
    Runtime cudaStreamEndCapture_ptsz: PfnCuStreamEndCapture;
    Runtime cudaIpcGetMemHandle: PfnCudaIpcGetMemHandle;
    Runtime cudaGetDriverEntryPoint: PfnCudaGetDriverEntryPoint;
    Runtime cudaGetDriverEntryPoint_ptsz: PfnCudaGetDriverEntryPoint;
    Runtime cudaGetDriverEntryPointByVersion: PfnCudaGetDriverEntryPointByVersion;
    Runtime cudaGetDriverEntryPointByVersion_ptsz: PfnCudaGetDriverEntryPointByVersion;
    // ---- driver: hooked
    Driver cuMemAlloc_v2: PfnCuMemAlloc;
    Driver cuMemFree_v2: PfnCuMemFree;
    Driver cuMemAllocPitch_v2: PfnCuMemAllocPitch;
    Driver cuMemAllocManaged: PfnCuMemAllocManaged;
    Driver cuMemAllocAsync: PfnCuMemAllocAsync;
    Driver cuMemAllocAsync_ptsz: PfnCuMemAllocAsync;
    Driver cuMemFreeAsync: PfnCuMemFreeAsync;
    Driver cuMemFreeAsync_ptsz: PfnCuMemFreeAsync;
    Driver cuMemAllocFromPoolAsync: PfnCuMemAllocFromPoolAsync;
    Driver cuMemAllocFromPoolAsync_ptsz: PfnCuMemAllocFromPoolAsync;
    Driver cuMemCreate: PfnCuMemCreate;
    Driver cuMemRelease: PfnCuMemRelease;
    Driver cuMemGetInfo_v2: PfnCuMemGetInfo;
    Driver cuDeviceTotalMem_v2: PfnCuDeviceTotalMem;
    Driver cuMemAllocHost_v2: PfnCuMemAllocHost;
    Driver cuMemHostAlloc: PfnCuMemHostAlloc;
    Driver cuMemFreeHost: PfnCuMemFreeHost;
    Driver cuMemPoolCreate: PfnCuMemPoolCreate;
    Driver cuGetProcAddress: PfnCuGetProcAddress;
    Driver cuGetProcAddress_v2: PfnCuGetProcAddressV2;
    Driver cuStreamDestroy: PfnCuStreamDestroy;
    Driver cuStreamDestroy_v2: PfnCuStreamDestroy;
    Driver cuStreamBeginCapture: PfnCuStreamBeginCapture;
    Driver cuStreamBeginCapture_ptsz: PfnCuStreamBeginCapture;
    Driver cuStreamBeginCapture_v2: PfnCuStreamBeginCaptureMode;
    Driver cuStreamBeginCapture_v2_ptsz: PfnCuStreamBeginCaptureMode;
    Driver cuStreamBeginCaptureToGraph: PfnCuStreamBeginCaptureToGraph;
    Driver cuStreamBeginCaptureToGraph_ptsz: PfnCuStreamBeginCaptureToGraph;
    Driver cuStreamEndCapture: PfnCuStreamEndCapture;
    Driver cuStreamEndCapture_ptsz: PfnCuStreamEndCapture;
    // ---- driver: used by other layers (pool VMM backend), never hooked
    Driver cuMemMap: PfnCuMemMap;
    Driver cuMemUnmap: PfnCuMemUnmap;
    Driver cuMemSetAccess: PfnCuMemSetAccess;
    Driver cuMemAddressReserve: PfnCuMemAddressReserve;
    Driver cuMemAddressFree: PfnCuMemAddressFree;
    Driver cuMemGetAllocationGranularity: PfnCuMemGetAllocationGranularity;
    Driver cuCtxSynchronize: PfnCuCtxSynchronize;
    Driver cuIpcGetMemHandle: PfnIpcGetMemHandle;
    Driver cuStreamSynchronize: PfnCuStreamSynchronize;
    Driver cuStreamSynchronize_ptsz: PfnCuStreamSynchronize;
    Driver cuEventCreate: PfnCuEventCreate;
    Driver cuEventRecord: PfnCuEventRecord;
    Driver cuEventQuery: PfnCuEventQuery;
    Driver cuEventSynchronize: PfnCuEventSynchronize;
    Driver cuEventDestroy_v2: PfnCuEventDestroy;
    Driver cuStreamWaitEvent: PfnCuStreamWaitEvent;
    Driver cuStreamIsCapturing: PfnCuStreamIsCapturing;
    Driver cuThreadExchangeStreamCaptureMode: PfnCuThreadExchangeStreamCaptureMode;
    Driver cuCtxGetDevice: PfnCuCtxGetDevice;
    Driver cuCtxGetCurrent: PfnCuCtxGetCurrent;
    Driver cuCtxSetCurrent: PfnCuCtxSetCurrent;
    Driver cuDevicePrimaryCtxRetain: PfnCuDevicePrimaryCtxRetain;
    Driver cuDevicePrimaryCtxRelease_v2: PfnCuDeviceOp;
    Driver cuDevicePrimaryCtxReset_v2: PfnCuDeviceOp;
    Driver cuCtxCreate_v2: PfnCuCtxCreate;
    Driver cuCtxEnablePeerAccess: PfnCuCtxEnablePeerAccess;
    Driver cuCtxPushCurrent_v2: PfnCuCtxSetCurrent;
    Driver cuCtxPopCurrent_v2: PfnCuCtxGetCurrent;
    Driver cuCtxDestroy_v2: PfnCuCtxSetCurrent;
    Driver cuDeviceGetPCIBusId: PfnCuDeviceGetPCIBusId;
    Driver cuDeviceGetCount: PfnCuDeviceGetCount;
    Driver cuDeviceGetMemPool: PfnCuDeviceGetMemPool;
    Driver cuDeviceGetDefaultMemPool: PfnCuDeviceGetMemPool;
    Driver cuMemPoolTrimTo: PfnCuMemPoolTrimTo;
    Driver cuMemPoolGetAttribute: PfnCuMemPoolGetAttribute;
    // ---- NVML
    Nvml nvmlDeviceGetMemoryInfo: PfnNvmlDeviceGetMemoryInfo;
    Nvml nvmlDeviceGetMemoryInfo_v2: PfnNvmlDeviceGetMemoryInfoV2;
    Nvml nvmlDeviceGetIndex: PfnNvmlDeviceGetIndex;
    Nvml nvmlInit_v2: PfnNvmlVoid;
    Nvml nvmlShutdown: PfnNvmlVoid;
    Nvml nvmlDeviceGetHandleByIndex_v2: PfnNvmlDeviceGetHandleByIndex;
    Nvml nvmlDeviceGetHandleByPciBusId_v2: PfnNvmlDeviceGetHandleByPciBusId;
}

/// The device of the calling thread's current context, if it has one (never fails loudly:
/// a thread with no context gets `None`, HAMi's uninitialized-device bug).
pub(crate) fn current_driver_device() -> Option<c_int> {
    let f = cuCtxGetDevice()?;
    let mut d: c_int = -1;
    // SAFETY: d is a valid out-pointer.
    let rc = unsafe { f(&mut d) };
    (rc == CUDA_SUCCESS && d >= 0).then_some(d)
}

/// The runtime's current device (`cudaGetDevice`), if the runtime answers.
pub(crate) fn current_runtime_device() -> Option<c_int> {
    let f = cudaGetDevice()?;
    let mut d: c_int = -1;
    // SAFETY: d is a valid out-pointer.
    let rc = unsafe { f(&mut d) };
    (rc == cudaSuccess && d >= 0).then_some(d)
}

/// The runtime's sticky last error says `cudaErrorMemoryAllocation` after a refused
/// `cudaMalloc`, and `cudaGetLastError` returns it once: when the cap or the pool refuses a
/// runtime request, make the real runtime record it too, by asking it for an allocation no
/// device can satisfy. Called with no lock held. Not while a stream capture forbids the
/// calling thread potentially unsafe calls: that `cudaMalloc` would be one, and would
/// invalidate the capture (the last error then stays what it was). The question and the call
/// are one section a begin-capture call on another thread waits for (`captures::gated`): no
/// capture begins between them.
pub(crate) fn runtime_set_last_error_oom() {
    crate::cuda::captures::gated(|| {
        if crate::cuda::captures::forbid_unsafe_calls() {
            return;
        }
        if let Some(f) = cudaMalloc() {
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: p is a valid out-pointer; the size cannot be satisfied.
            let rc = unsafe { f(&mut p, usize::MAX) };
            if rc == 0
                && !p.is_null()
                && let Some(free) = cudaFree()
            {
                // SAFETY: p was just allocated by the runtime.
                unsafe { free(p) };
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// `Slot::resolve` calls on this thread.
        pub(super) static RESOLVES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Without a driver (or with one that lacks the function), a driver-side lookup that
    /// found nothing is not repeated on every request; what the process itself finds later
    /// is still taken.
    #[test]
    fn a_missing_driver_function_is_looked_up_once() {
        static S: Slot = Slot::new(c"vramshimTestNoSuchFunction", Lib::Nvml);
        let before = RESOLVES.with(|n| n.get());
        assert_eq!(S.get(), 0);
        assert_eq!(S.get(), 0);
        assert_eq!(S.peek(), 0);
        assert_eq!(RESOLVES.with(|n| n.get()) - before, 1, "looked up again");
        let f = a_missing_driver_function_is_looked_up_once as fn() as usize;
        S.record(f);
        assert_eq!(S.get(), f);
        // A runtime function may appear later: its miss is not remembered.
        static R: Slot = Slot::new(c"vramshimTestNoSuchFunction", Lib::Runtime);
        let before = RESOLVES.with(|n| n.get());
        assert_eq!(R.get(), 0);
        assert_eq!(R.get(), 0);
        assert_eq!(RESOLVES.with(|n| n.get()) - before, 2);
    }

    #[test]
    fn a_failed_load_is_remembered_and_not_searched_again() {
        let cache = AtomicUsize::new(0);
        let absent: &[&CStr] = &[c"libvramshim-test-no-such-library.so.9"];
        assert!(lib_handle(&cache, absent, true).is_null());
        assert_eq!(cache.load(Ordering::Acquire), LOAD_FAILED);
        // Once failed, even a name that is loaded is not looked up again under this cache:
        // the state, not another search, answers.
        let loaded: &[&CStr] = &[c"libc.so.6"];
        assert!(lib_handle(&cache, loaded, true).is_null());
        let fresh = AtomicUsize::new(0);
        assert!(!lib_handle(&fresh, loaded, false).is_null());
    }
}
