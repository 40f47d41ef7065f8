//! Exported C entry points. Each hook decodes its C call into a `Request` and hands it to
//! the dispatcher; lookups (`dlsym`, `cuGetProcAddress`, `cudaGetDriverEntryPoint`)
//! substitute these hooks for the real functions.

use crate::cuda::real::{self, Lib, Slot};
use crate::cuda::request::Request;
use crate::cuda::types::*;
use crate::pipeline::{self, AllocCall, FreeCall, run_hook};
use crate::state::live_table::LiveTable;
use crate::sys::thread::Token;
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

/// A caller's out-pointer for an address or a handle (`void **`, `CUdeviceptr *`, a VMM
/// handle), possibly NULL.
pub(crate) trait OutPtr: Copy {
    /// What the real call wrote (0 for NULL).
    fn get(self) -> u64;
    /// Writes `v` (nothing for NULL).
    fn set(self, v: u64);
    /// Whether it is NULL (the pool never serves a request it could not hand back).
    fn is_null(self) -> bool;
}

impl<T> OutPtr for *mut *mut T {
    #[inline]
    fn get(self) -> u64 {
        // SAFETY: a non-null out-pointer of the caller's, which the real call just filled.
        if self.is_null() {
            0
        } else {
            unsafe { *self as u64 }
        }
    }
    #[inline]
    fn set(self, v: u64) {
        if !self.is_null() {
            // SAFETY: non-null out-pointer supplied by the caller.
            unsafe { *self = v as *mut T };
        }
    }
    #[inline(always)]
    fn is_null(self) -> bool {
        <*mut *mut T>::is_null(self)
    }
}

impl OutPtr for *mut u64 {
    #[inline]
    fn get(self) -> u64 {
        // SAFETY: a non-null out-pointer of the caller's, which the real call just filled.
        if self.is_null() { 0 } else { unsafe { *self } }
    }
    #[inline]
    fn set(self, v: u64) {
        if !self.is_null() {
            // SAFETY: non-null out-pointer supplied by the caller.
            unsafe { *self = v };
        }
    }
    #[inline(always)]
    fn is_null(self) -> bool {
        <*mut u64>::is_null(self)
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

/// A hook whose real function is missing: the code the C call gets without it (what the
/// real library's absence means to its callers), logged. Out of line, by value: the log's
/// arguments are references, and inline they made every hook store its name and code on
/// the stack before it even looked at the real function.
#[cold]
#[inline(never)]
fn no_real(name: &'static str, lib: Lib) -> c_int {
    let missing = match lib {
        Lib::Runtime => NO_RUNTIME,
        Lib::Driver => NO_DRIVER,
        Lib::Nvml => NVML_ERROR_UNINITIALIZED,
    };
    crate::debug!("{name}: no real function -> {missing}");
    missing
}

// ------------------------------------------------------------------------ hook sites

/// What a hook's body knows of itself, made by [`hooks!`] from the hook's one declaration:
/// its C name (for messages), the real function of that name, typed, and its library, and
/// whether it is the per-thread-default-stream (`_ptsz`) variant.
///
/// Two words (its constant part behind a reference): passed in registers, so a hook that
/// hands it to an out-of-line body needs no stack frame on the paths that return early.
#[derive(Clone, Copy)]
pub(crate) struct Site<F> {
    about: &'static SiteInfo,
    pub real: fn() -> Option<F>,
}

/// The constant part of a [`Site`].
pub(crate) struct SiteInfo {
    pub name: &'static str,
    pub lib: Lib,
    pub ptds: bool,
}

impl<F> std::ops::Deref for Site<F> {
    type Target = SiteInfo;
    #[inline(always)]
    fn deref(&self) -> &SiteInfo {
        self.about
    }
}

impl<F: Copy> Site<F> {
    /// The real function, or the code the C call returns without it.
    #[inline(always)]
    pub(crate) fn real(self) -> Result<F, c_int> {
        match (self.real)() {
            Some(f) => Ok(f),
            None => Err(no_real(self.name, self.lib)),
        }
    }

    /// `runtime` for a runtime hook, else `driver` (families of the two APIs that share a
    /// body).
    #[inline(always)]
    pub(crate) fn by_lib<T>(self, runtime: T, driver: T) -> T {
        if self.lib == Lib::Runtime {
            runtime
        } else {
            driver
        }
    }

    /// The trace flags of this variant's requests.
    #[inline(always)]
    pub(crate) fn stream_flags(self) -> u8 {
        if self.ptds {
            flags::PER_THREAD_STREAM
        } else {
            0
        }
    }

    /// An allocation of `size` bytes whose address the real call writes through `out`
    /// (which the pool writes instead when it serves the request; `pool_ok`: it may).
    #[inline(always)]
    pub(crate) fn linear(
        self,
        out: impl OutPtr,
        size: usize,
        pool_ok: bool,
        make_req: impl FnOnce() -> Request,
        call: impl Fn(F) -> c_int,
    ) -> c_int {
        self.alloc(
            &crate::state::live_table::ALLOCS,
            make_req,
            move || pool_ok && !out.is_null(),
            call,
            move || (out.get(), size as u64),
            move |p| out.set(p),
        )
    }

    /// A stream-ordered allocation of `size` bytes into `out`: from the process's own
    /// `pool` when it names one (charged to that pool's device when known; never served by
    /// our pool: the process chose that one), else from the device's current pool
    /// (`device()`; our pool may serve it).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn stream_ordered(
        self,
        api: Api,
        device: impl Fn() -> i32,
        out: impl OutPtr,
        size: usize,
        stream: u64,
        pool: Option<CUmemoryPool>,
        call: impl Fn(F) -> c_int,
    ) -> c_int {
        let fl = self.stream_flags();
        let r = move || {
            let dev = match pool {
                Some(p) => crate::cuda::mempools::device_of(p).unwrap_or_else(&device),
                None => device(),
            };
            req(api, AllocKind::Async, dev, stream, size, fl)
        };
        self.linear(out, size, pool.is_none(), r, call)
    }

    /// The common shape of an allocation hook: `make_req` decodes the request, `call` makes
    /// the real call, `read` gives the address and size it produced, `write_pool` writes an
    /// address the pool served; `pool_ok` says whether the pool may serve it, asked only where
    /// the request is built (a value computed before the mode check costs pass-through its
    /// instructions on every request). The mode read once picks the path: pass-through inline, the paths that meet
    /// layers out of line (see [`pipeline::Path`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn alloc(
        self,
        table: &'static LiveTable,
        make_req: impl FnOnce() -> Request,
        pool_ok: impl FnOnce() -> bool,
        call: impl Fn(F) -> c_int,
        read: impl FnOnce() -> (u64, u64),
        write_pool: impl FnOnce(u64),
    ) -> c_int {
        let f = match self.real() {
            Ok(f) => f,
            Err(missing) => return missing,
        };
        pipeline::run_hook_with(
            self.name,
            CUDA_ERROR_UNKNOWN,
            (call, make_req, read, write_pool),
            move |(call, ..)| call(f),
            move |tok, (call, make_req, read, write_pool)| {
                // `move`: a closure borrowing `call` and `f` made every request (pass-through
                // too) store them on the stack before the mode check.
                let a = move || AllocCall {
                    make_req,
                    pool_ok: pool_ok(),
                    call: move || call(f),
                    read,
                    write_pool,
                };
                pipeline::run(tok, table, a)
            },
        )
    }

    /// The common shape of a free hook (`stream`: `Some` for stream-ordered frees); the path
    /// as in [`Site::alloc`] (the light one inline too: it adds little to the hook's frame).
    #[inline(always)]
    pub(crate) fn free(
        self,
        table: &'static LiveTable,
        api: Api,
        key: u64,
        stream: Option<u64>,
        call: impl Fn(F) -> c_int,
    ) -> c_int {
        let f = match self.real() {
            Ok(f) => f,
            Err(missing) => return missing,
        };
        let flags = self.stream_flags();
        pipeline::run_hook_with(
            self.name,
            CUDA_ERROR_UNKNOWN,
            call,
            move |call| call(f),
            move |tok, call| {
                let req = move || FreeCall {
                    api,
                    key,
                    stream,
                    flags,
                    call: move || call(f),
                };
                pipeline::run(tok, table, req)
            },
        )
    }

    /// A depth-guarded hook beyond allocations (queries, synchronizations): a nested call
    /// goes straight to the real function (`call`); the outermost runs `body` with the
    /// thread's token and the real call.
    #[inline(always)]
    pub(crate) fn guarded(
        self,
        call: impl Fn(F) -> c_int,
        body: impl FnOnce(&Token, &dyn Fn() -> c_int) -> c_int,
    ) -> c_int {
        let f = match self.real() {
            Ok(f) => f,
            Err(missing) => return missing,
        };
        let real = || call(f);
        // 999 is the unknown error of the runtime, the driver and NVML alike.
        run_hook(self.name, CUDA_ERROR_UNKNOWN, real, |tok| body(tok, &real))
    }

    /// A hook that is never depth-guarded (lookups, context lifetime): the real function
    /// called by `body`, a panic turned into an error code.
    #[inline(always)]
    pub(crate) fn unguarded(self, body: impl FnOnce(F) -> c_int) -> c_int {
        match self.real() {
            Ok(f) => pipeline::run_unguarded(self.name, CUDA_ERROR_UNKNOWN, || body(f)),
            Err(missing) => missing,
        }
    }
}

/// A compile-time check that a hook has the ABI of the real function it stands for.
pub(crate) const fn same_abi<F: Copy>(_real: fn() -> Option<F>, _hook: F) {}

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

/// Declares exported hooks, each once: `[base, version(, ptds)] name, ... fn(args) |site|
/// body` makes, for each name, the C entry point `name` (`#[no_mangle]`, so the C name is the
/// Rust name) running `body`, its entry in the module's `TABLE` for the lookups ([`Hook`]:
/// the C name, the address, the real slot of the same name, the `cuGetProcAddress` base
/// name, the version that introduced it, whether it is the `_ptsz` variant), and the
/// [`Site`] its body gets. Variants with the same arguments share one body. Each entry point
/// must have the ABI of the real function of the same name (checked at compile time).
macro_rules! hooks {
    ($(
        $(#[doc = $doc:literal])*
        $([$base:literal, $minv:literal $(, $ptds:ident)?] $name:ident,)+
        fn $args:tt |$site:ident| $body:block
    )*) => {
        $(
            hooks!(@entry [$(#[doc = $doc])*] $args $site $body $([$($ptds)?] $name)+);
        )*
        /// This module's hooks, for the lookups.
        pub(super) const TABLE: &[$crate::hooks::Hook] = &[$($(
            $crate::hooks::Hook {
                name: match std::ffi::CStr::from_bytes_with_nul(
                    concat!(stringify!($name), "\0").as_bytes(),
                ) {
                    Ok(c) => c,
                    Err(_) => panic!("bad name"),
                },
                addr: $crate::hooks::HookAddr($name as *const ()),
                slot: &$crate::cuda::real::slots::$name,
                base: $base,
                min_version: $minv,
                ptds: hooks!(@ptds $($ptds)?),
            },
        )+)*];
        // Each hook has the ABI of its real function.
        const _: () = {$($(
            $crate::hooks::same_abi($crate::cuda::real::$name, $name);
        )+)*};
    };
    // One entry point per name of an entry, all with the entry's docs and body.
    (@entry $docs:tt $args:tt $site:ident $body:block $([$($ptds:ident)?] $name:ident)+) => {
        $(hooks!(@fn $docs [$($ptds)?] $name $args $site $body);)+
    };
    (@fn [$($doc:tt)*] [$($ptds:ident)?] $name:ident $args:tt $site:ident $body:block) => {
        $($doc)*
        ///
        /// # Safety
        /// C ABI: the contract of the real function of the same name.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name $args -> std::ffi::c_int {
            let $site = $crate::hooks::Site {
                about: &$crate::hooks::SiteInfo {
                    name: stringify!($name),
                    lib: $crate::cuda::real::libs::$name,
                    ptds: hooks!(@ptds $($ptds)?),
                },
                real: $crate::cuda::real::$name,
            };
            $body
        }
    };
    (@ptds ptds) => { true };
    (@ptds) => { false };
}

// The hook modules, after the macro they declare their hooks with.
pub(crate) mod capture;
pub(crate) mod context;
pub(crate) mod current;
pub(crate) mod driver;
pub(crate) mod host;
pub(crate) mod lookup;
pub(crate) mod mempool;
pub(crate) mod nvml;
mod pool_glue;
pub(crate) mod process;
pub(crate) mod runtime;
pub(crate) mod sync;
pub(crate) mod torch;
pub(crate) mod vmm;

/// Every hook we export and substitute, by module.
static HOOKS: [&[Hook]; 11] = [
    runtime::TABLE,
    driver::TABLE,
    host::TABLE,
    vmm::TABLE,
    mempool::TABLE,
    context::TABLE,
    current::TABLE,
    sync::TABLE,
    capture::TABLE,
    lookup::TABLE,
    nvml::TABLE,
];

/// Every hook we export and substitute.
pub(crate) fn all() -> impl Iterator<Item = &'static Hook> {
    HOOKS.iter().flat_map(|t| t.iter())
}

/// Whether `addr` is one of our exported hooks (never stored as a "real" function).
pub(crate) fn is_our_hook(addr: usize) -> bool {
    addr != 0 && all().any(|h| h.addr.0 as usize == addr)
}

/// The hook exported under exactly this C name.
pub(crate) fn by_name(name: &[u8]) -> Option<&'static Hook> {
    all().find(|h| h.name.to_bytes() == name)
}

/// Whether a `dlsym` name is one of ours to look at: `cu[A-Z]*`, `cuda[A-Z]*`, `nvml[A-Z]*`.
#[inline]
pub(crate) fn is_our_prefix(name: &[u8]) -> bool {
    let upper_at = |i: usize| name.get(i).is_some_and(|c| c.is_ascii_uppercase());
    (name.starts_with(b"cuda") && upper_at(4))
        || (name.starts_with(b"cu") && upper_at(2))
        || (name.starts_with(b"nvml") && upper_at(4))
}

/// The shared body of the memory queries: the real query (`call`), then what the cap says
/// the process should see of `device` (see [`pipeline::meminfo`]): `read` gives the (free,
/// total) the real query wrote, `write` writes the answer back over it.
pub(crate) fn query_hook<F: Copy>(
    h: Site<F>,
    api: Api,
    device: impl FnOnce() -> Option<c_int>,
    call: impl Fn(F) -> c_int,
    read: impl FnOnce() -> (Option<u64>, Option<u64>),
    write: impl FnOnce(i32, u64, u64),
) -> c_int {
    h.guarded(call, |tok, call| {
        let real = || {
            let rc = call();
            let (free, total) = if rc == 0 { read() } else { (None, None) };
            (rc, free, total)
        };
        pipeline::meminfo(tok, api, device, real, write)
    })
}

/// `cudaMemGetInfo` and `cuMemGetInfo_v2`: the cap's view written through the caller's
/// (possibly NULL) pointers.
pub(crate) fn meminfo_hook<F: Copy>(
    h: Site<F>,
    api: Api,
    device: fn() -> Option<c_int>,
    free: *mut usize,
    total: *mut usize,
    call: impl Fn(F) -> c_int,
) -> c_int {
    let read = || (read_usize(free), read_usize(total));
    let write = |_, af, at| {
        write_usize(free, af);
        write_usize(total, at);
    };
    query_hook(h, api, device, call, read, write)
}

/// The total-memory queries (`cuDeviceTotalMem_v2`, `totalGlobalMem` of
/// `cudaGetDeviceProperties`): the cap's answer for `device` written over `*total`.
pub(crate) fn total_mem_hook<F: Copy>(
    h: Site<F>,
    api: Api,
    device: c_int,
    total: *mut usize,
    call: impl Fn(F) -> c_int,
) -> c_int {
    let read = || (read_usize(total), read_usize(total));
    let write = |_, _, at| write_usize(total, at);
    query_hook(h, api, || Some(device), call, read, write)
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
