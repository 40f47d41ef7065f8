//! Exported C entry points. Each hook decodes its C call into a `Request` and hands it to
//! the dispatcher; lookups (`dlsym`, `cuGetProcAddress`, `cudaGetDriverEntryPoint`)
//! substitute these hooks for the real functions.

pub(crate) mod context;
pub(crate) mod current;
pub(crate) mod driver;
pub(crate) mod lookup;
pub(crate) mod mempool;
pub(crate) mod nvml;
mod pool_glue;
pub(crate) mod process;
pub(crate) mod runtime;
pub(crate) mod sync;
pub(crate) mod torch;
pub(crate) mod vmm;

use crate::cuda::real::{self, Slot};
use crate::cuda::request::Request;
use crate::cuda::types::*;
use crate::pipeline::{self, AllocCall, FreeRequest, Layered, Light, Passed, run_hook};
use crate::state::live_table::LiveTable;
use std::ffi::{CStr, c_int};
use vramshim_trace::{AllocKind, Api, flags};

/// What a runtime hook returns when there is no real runtime function (what the real
/// runtime returns without a driver).
pub(crate) const NO_RUNTIME: c_int = cudaErrorInsufficientDriver;
/// What a driver hook returns when there is no real driver function.
pub(crate) const NO_DRIVER: c_int = CUDA_ERROR_NOT_INITIALIZED;

/// The runtime's current device, or -1 (remembered per thread, see [`current`]).
#[inline(always)]
pub(crate) fn rt_device() -> i32 {
    current::rt_device()
}

/// The current context's device, or -1 for a thread with no context (the real call then
/// returns its own error; nothing is charged).
#[inline]
pub(crate) fn drv_device() -> i32 {
    real::current_driver_device().unwrap_or(-1)
}

#[inline]
pub(crate) fn read_ptr<T>(p: *mut *mut T) -> u64 {
    if p.is_null() {
        0
    } else {
        // SAFETY: non-null out-pointer the real call just filled.
        unsafe { *p as u64 }
    }
}

#[inline]
pub(crate) fn write_ptr<T>(p: *mut *mut T, v: u64) {
    if !p.is_null() {
        // SAFETY: non-null out-pointer supplied by the caller.
        unsafe { *p = v as *mut T };
    }
}

#[inline]
pub(crate) fn read_u64(p: *mut u64) -> u64 {
    if p.is_null() {
        0
    } else {
        // SAFETY: non-null out-pointer the real call just filled.
        unsafe { *p }
    }
}

#[inline]
pub(crate) fn write_u64(p: *mut u64, v: u64) {
    if !p.is_null() {
        // SAFETY: non-null out-pointer supplied by the caller.
        unsafe { *p = v };
    }
}

#[inline]
pub(crate) fn read_usize(p: *mut usize) -> Option<u64> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null out-pointer the real call just filled.
        Some(unsafe { *p } as u64)
    }
}

#[inline]
pub(crate) fn write_usize(p: *mut usize, v: u64) {
    if !p.is_null() {
        // SAFETY: non-null out-pointer supplied by the caller.
        unsafe { *p = v as usize };
    }
}

/// The request a hook decodes.
#[inline(always)]
pub(crate) fn req(
    api: Api,
    kind: AllocKind,
    device: i32,
    stream: u64,
    size: usize,
    fl: u8,
) -> Request {
    Request {
        api,
        kind,
        device,
        stream,
        size: size as u64,
        flags: fl,
    }
}

/// The plain or the per-thread-default-stream (`_ptsz`) variant of a real function, with the
/// flag its requests carry.
#[inline(always)]
pub(crate) fn variant<F>(
    ptsz: bool,
    plain: fn() -> Option<F>,
    per_thread: fn() -> Option<F>,
) -> (fn() -> Option<F>, u8) {
    if ptsz {
        (per_thread, flags::PER_THREAD_STREAM)
    } else {
        (plain, 0)
    }
}

/// A hook whose real function is missing: `missing`, logged. Out of line, by value: the
/// log's arguments are references, and inline they made every hook store its name and code
/// on the stack before it even looked at the real function.
#[cold]
#[inline(never)]
fn no_real(name: &'static str, missing: c_int) -> c_int {
    crate::debug!("{name}: no real function -> {missing}");
    missing
}

/// The common shape of a stream-ordered allocation hook (`cudaMallocAsync`,
/// `cuMemAllocFromPoolAsync` & co., plain or `_ptsz`): an `Async` request on `stream`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn async_alloc_hook<F: Copy>(
    name: &'static str,
    missing: c_int,
    (slot, fl): (fn() -> Option<F>, u8),
    api: Api,
    device: impl FnOnce() -> i32,
    stream: u64,
    size: usize,
    pool_ok: bool,
    call: impl Fn(F) -> c_int,
    read: impl FnOnce() -> (u64, u64),
    write_pool: impl FnOnce(u64),
) -> c_int {
    alloc_hook(
        name,
        missing,
        slot,
        || req(api, AllocKind::Async, device(), stream, size, fl),
        pool_ok,
        call,
        read,
        write_pool,
    )
}

/// The common shape of a stream-ordered free hook (`cudaFreeAsync`, `cuMemFreeAsync`,
/// plain or `_ptsz`).
#[inline(always)]
pub(crate) fn async_free_hook<F: Copy>(
    name: &'static str,
    missing: c_int,
    (slot, fl): (fn() -> Option<F>, u8),
    api: Api,
    key: u64,
    stream: u64,
    call: impl Fn(F) -> c_int,
) -> c_int {
    free_hook(name, missing, slot, api, key, Some(stream), fl, call)
}

/// The common shape of an allocation hook.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn alloc_hook<F: Copy>(
    name: &'static str,
    missing: c_int,
    slot: fn() -> Option<F>,
    make_req: impl FnOnce() -> Request,
    pool_ok: bool,
    call: impl Fn(F) -> c_int,
    read: impl FnOnce() -> (u64, u64),
    write_pool: impl FnOnce(u64),
) -> c_int {
    alloc_hook_in(
        name,
        missing,
        slot,
        &crate::state::live_table::ALLOCS,
        make_req,
        pool_ok,
        call,
        read,
        write_pool,
    )
}

/// [`alloc_hook`] with an explicit table (VMM handles live in their own). The mode read
/// once picks the path: pass-through inline, the paths that meet layers out of line (see
/// [`pipeline::Path`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn alloc_hook_in<F: Copy>(
    name: &'static str,
    missing: c_int,
    slot: fn() -> Option<F>,
    table: &'static LiveTable,
    make_req: impl FnOnce() -> Request,
    pool_ok: bool,
    call: impl Fn(F) -> c_int,
    read: impl FnOnce() -> (u64, u64),
    write_pool: impl FnOnce(u64),
) -> c_int {
    let Some(f) = slot() else {
        return no_real(name, missing);
    };
    pipeline::run_hook_with(
        name,
        CUDA_ERROR_UNKNOWN,
        (call, make_req, read, write_pool),
        move |(call, ..)| call(f),
        move |tok, (call, make_req, read, write_pool)| {
            // `move`: a closure borrowing `call` and `f` made every request (pass-through
            // too) store them on the stack before the mode check.
            let a = move || AllocCall {
                make_req,
                pool_ok,
                call: move || call(f),
                read,
                write_pool,
            };
            let mode = pipeline::mode();
            if mode.pass_through() {
                pipeline::alloc::<Passed>(tok, mode, table, a())
            } else if mode.light() {
                pipeline::alloc_outlined::<Light>(tok, mode, table, a())
            } else {
                pipeline::alloc_outlined::<Layered>(tok, mode, table, a())
            }
        },
    )
}

/// The common shape of a free hook.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn free_hook<F: Copy>(
    name: &'static str,
    missing: c_int,
    slot: fn() -> Option<F>,
    api: Api,
    key: u64,
    stream: Option<u64>,
    flags: u8,
    call: impl Fn(F) -> c_int,
) -> c_int {
    free_hook_in(
        name,
        missing,
        slot,
        &crate::state::live_table::ALLOCS,
        api,
        key,
        stream,
        flags,
        call,
    )
}

/// [`free_hook`] with an explicit table; the path as in [`alloc_hook_in`] (the light one
/// inline too: it adds little to the hook's frame).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn free_hook_in<F: Copy>(
    name: &'static str,
    missing: c_int,
    slot: fn() -> Option<F>,
    table: &'static LiveTable,
    api: Api,
    key: u64,
    stream: Option<u64>,
    flags: u8,
    call: impl Fn(F) -> c_int,
) -> c_int {
    let Some(f) = slot() else {
        return no_real(name, missing);
    };
    pipeline::run_hook_with(
        name,
        CUDA_ERROR_UNKNOWN,
        call,
        move |call| call(f),
        move |tok, call| {
            // Built in each branch: built before the mode check, it was stored to the
            // stack on every request.
            let req = move || FreeRequest {
                api,
                key,
                stream,
                flags,
            };
            let mode = pipeline::mode();
            if mode.pass_through() {
                pipeline::free::<Passed>(tok, mode, table, req(), move || call(f))
            } else if mode.light() {
                pipeline::free::<Light>(tok, mode, table, req(), move || call(f))
            } else {
                pipeline::free_outlined::<Layered>(tok, mode, table, req(), move || call(f))
            }
        },
    )
}

// ------------------------------------------------------------------------ hook table

/// One exported hook: its C name, its address, the real function it stands for, and the
/// base name (`cuGetProcAddress` family) it answers to.
pub(crate) struct Hook {
    pub name: &'static CStr,
    pub addr: HookAddr,
    pub slot: &'static Slot,
    /// Base name for `cuGetProcAddress` (`"cuMemAlloc"` for `cuMemAlloc_v2`).
    pub base: &'static str,
    /// The `cudaVersion` that introduced this variant: `cuGetProcAddress(base, v)` with
    /// `v >= min_version` may return it.
    pub min_version: c_int,
    /// Whether this is the per-thread-default-stream variant.
    pub ptds: bool,
}

#[derive(Clone, Copy)]
pub(crate) struct HookAddr(pub *const ());
// SAFETY: a code address, immutable.
unsafe impl Sync for HookAddr {}

macro_rules! hooks {
    ($( $module:ident :: $name:ident, $base:literal, $minv:literal, $ptds:literal; )*) => {
        /// Every hook we export and substitute.
        pub(crate) static HOOKS: &[Hook] = &[
            $(
                Hook {
                    name: match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("bad name"),
                    },
                    addr: HookAddr($module::$name as *const ()),
                    slot: &real::slots::$name,
                    base: $base,
                    min_version: $minv,
                    ptds: $ptds,
                },
            )*
        ];
    };
}

hooks! {
    runtime::cudaMalloc, "cudaMalloc", 0, false;
    runtime::cudaFree, "cudaFree", 0, false;
    runtime::cudaMallocAsync, "cudaMallocAsync", 0, false;
    runtime::cudaMallocAsync_ptsz, "cudaMallocAsync", 0, true;
    runtime::cudaFreeAsync, "cudaFreeAsync", 0, false;
    runtime::cudaFreeAsync_ptsz, "cudaFreeAsync", 0, true;
    runtime::cudaMallocFromPoolAsync, "cudaMallocFromPoolAsync", 0, false;
    runtime::cudaMallocFromPoolAsync_ptsz, "cudaMallocFromPoolAsync", 0, true;
    runtime::cudaMallocPitch, "cudaMallocPitch", 0, false;
    runtime::cudaMalloc3D, "cudaMalloc3D", 0, false;
    runtime::cudaMallocManaged, "cudaMallocManaged", 0, false;
    runtime::cudaMallocHost, "cudaMallocHost", 0, false;
    runtime::cudaHostAlloc, "cudaHostAlloc", 0, false;
    runtime::cudaFreeHost, "cudaFreeHost", 0, false;
    runtime::cudaMemGetInfo, "cudaMemGetInfo", 0, false;
    runtime::cudaDeviceReset, "cudaDeviceReset", 0, false;
    context::cudaDeviceEnablePeerAccess, "cudaDeviceEnablePeerAccess", 0, false;
    runtime::cudaGetDeviceProperties, "cudaGetDeviceProperties", 0, false;
    runtime::cudaGetDeviceProperties_v2, "cudaGetDeviceProperties", 0, false;
    lookup::cudaGetDriverEntryPoint, "cudaGetDriverEntryPoint", 0, false;
    lookup::cudaGetDriverEntryPoint_ptsz, "cudaGetDriverEntryPoint", 0, true;
    lookup::cudaGetDriverEntryPointByVersion, "cudaGetDriverEntryPointByVersion", 0, false;
    lookup::cudaGetDriverEntryPointByVersion_ptsz, "cudaGetDriverEntryPointByVersion", 0, true;
    driver::cuMemAlloc_v2, "cuMemAlloc", 3020, false;
    driver::cuMemFree_v2, "cuMemFree", 3020, false;
    driver::cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, false;
    driver::cuMemAllocManaged, "cuMemAllocManaged", 6000, false;
    driver::cuMemAllocAsync, "cuMemAllocAsync", 11020, false;
    driver::cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true;
    driver::cuMemFreeAsync, "cuMemFreeAsync", 11020, false;
    driver::cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true;
    driver::cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false;
    driver::cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true;
    vmm::cuMemCreate, "cuMemCreate", 10020, false;
    vmm::cuMemRelease, "cuMemRelease", 10020, false;
    mempool::cuMemPoolCreate, "cuMemPoolCreate", 11020, false;
    driver::cuMemGetInfo_v2, "cuMemGetInfo", 3020, false;
    driver::cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, false;
    driver::cuMemAllocHost_v2, "cuMemAllocHost", 3020, false;
    driver::cuMemHostAlloc, "cuMemHostAlloc", 2020, false;
    driver::cuMemFreeHost, "cuMemFreeHost", 2000, false;
    context::cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, false;
    context::cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, false;
    context::cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, false;
    context::cuCtxCreate_v2, "cuCtxCreate", 3020, false;
    current::cudaSetDevice, "cudaSetDevice", 0, false;
    current::cuCtxSetCurrent, "cuCtxSetCurrent", 4000, false;
    current::cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, false;
    current::cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, false;
    current::cuCtxDestroy_v2, "cuCtxDestroy", 4000, false;
    context::cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, false;
    sync::cudaDeviceSynchronize, "cudaDeviceSynchronize", 0, false;
    sync::cudaStreamSynchronize, "cudaStreamSynchronize", 0, false;
    sync::cudaStreamSynchronize_ptsz, "cudaStreamSynchronize", 0, true;
    sync::cudaEventSynchronize, "cudaEventSynchronize", 0, false;
    sync::cudaIpcGetMemHandle, "cudaIpcGetMemHandle", 0, false;
    sync::cuCtxSynchronize, "cuCtxSynchronize", 2000, false;
    sync::cuStreamSynchronize, "cuStreamSynchronize", 2000, false;
    sync::cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, true;
    sync::cuEventSynchronize, "cuEventSynchronize", 2000, false;
    sync::cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, false;
    lookup::cuGetProcAddress, "cuGetProcAddress", 11030, false;
    lookup::cuGetProcAddress_v2, "cuGetProcAddress", 12000, false;
    nvml::nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", 0, false;
    nvml::nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2", 0, false;
}

/// Whether `addr` is one of our exported hooks (never stored as a "real" function).
pub(crate) fn is_our_hook(addr: usize) -> bool {
    addr != 0 && HOOKS.iter().any(|h| h.addr.0 as usize == addr)
}

/// The hook exported under exactly this C name.
pub(crate) fn by_name(name: &[u8]) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.name.to_bytes() == name)
}

/// Whether a `dlsym` name is one of ours to look at: `cu[A-Z]*`, `cuda[A-Z]*`, `nvml[A-Z]*`.
#[inline]
pub(crate) fn is_our_prefix(name: &[u8]) -> bool {
    let upper_at = |i: usize| name.get(i).is_some_and(|c| c.is_ascii_uppercase());
    (name.starts_with(b"cuda") && upper_at(4))
        || (name.starts_with(b"cu") && upper_at(2))
        || (name.starts_with(b"nvml") && upper_at(4))
}

/// The shared body of `cudaMemGetInfo` and `cuMemGetInfo_v2`: the real query, then what the
/// cap says the process should see, written through the caller's (possibly NULL) pointers.
pub(crate) fn meminfo_hook(
    name: &'static str,
    panic_code: c_int,
    api: Api,
    device: fn() -> Option<c_int>,
    real_query: impl Fn() -> c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    run_hook(name, panic_code, &real_query, |tok| {
        pipeline::meminfo(
            tok,
            api,
            device,
            || {
                let rc = real_query();
                (rc, read_usize(free), read_usize(total))
            },
            |_, af, at| {
                write_usize(free, af);
                write_usize(total, at);
            },
        )
    })
}

/// The shared body of the total-memory queries (`cuDeviceTotalMem_v2`, `totalGlobalMem` of
/// `cudaGetDeviceProperties`): the real query fills `*total`, then the cap's answer for
/// `device` replaces it.
pub(crate) fn total_mem_hook(
    name: &'static str,
    panic_code: c_int,
    api: Api,
    device: c_int,
    real_query: impl Fn() -> c_int,
    total: *mut usize,
) -> c_int {
    run_hook(name, panic_code, &real_query, |tok| {
        pipeline::meminfo(
            tok,
            api,
            || Some(device),
            || {
                let rc = real_query();
                let t = read_usize(total);
                (rc, t, t)
            },
            |_, _, at| write_usize(total, at),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn prefixes() {
        assert!(is_our_prefix(b"cuMemAlloc_v2"));
        assert!(is_our_prefix(b"cudaMalloc"));
        assert!(is_our_prefix(b"nvmlDeviceGetMemoryInfo"));
        assert!(!is_our_prefix(b"cudnnCreate"));
        assert!(!is_our_prefix(b"cublasCreate_v2"));
        assert!(!is_our_prefix(b"cu"));
        assert!(!is_our_prefix(b"__pthread_get_minstack"));
        assert!(by_name(b"cuMemAlloc_v2").is_some());
        assert!(by_name(b"cuMemAlloc").is_none());
    }
}
