//! Lookup hooks: `dlsym`, `cuGetProcAddress`/`_v2`, `cudaGetDriverEntryPoint`/`ByVersion`
//! (+ `_ptsz`). Without them the runtime's own driver calls, statically linked cudart,
//! frameworks and ctypes all escape.
//!
//! Rule for every lookup: the real resolver runs first with the caller's arguments; then,
//! if the address it returned is the real function of one of our hooks, the hook is handed
//! back instead. "Is the real function of" is decided by pointer identity against the real
//! address of each variant (resolved by exact name from the real library), with a
//! fallback for drivers whose resolver returns other addresses: the base name + version +
//! flags choose a variant, confirmed by asking the real resolver again at the version
//! that introduced that variant (an ABI-changing `_v3` is then never mistaken for `_v2`).
//! Lookups are never depth-guarded: the runtime initializes itself inside our outer
//! `cudaMalloc` and its lookups must still be substituted.

use super::{Hook, NO_DRIVER, Site, all, by_name, is_our_hook, is_our_prefix};
use crate::cuda::real;
use crate::cuda::types::*;
use crate::pipeline::run_unguarded;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};

// ------------------------------------------------------------------------------ dlsym

/// Decide what our `dlsym` returns: a hook address, or 0 = "let glibc's dlsym answer"
/// (the stub then tail-jumps into it with the caller's return address intact, so
/// `RTLD_NEXT` and `RTLD_DEFAULT` keep the caller's semantics). Allocation-free, lock-free,
/// re-entrant; names that are not `cu[A-Z]*`, `cuda[A-Z]*`, `nvml[A-Z]*` are never looked at
/// beyond their first bytes.
extern "C" fn dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> usize {
    real::real_dlsym_addr();
    if handle == libc::RTLD_NEXT || symbol.is_null() {
        return 0;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: symbol is the caller's NUL-terminated name.
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        if !is_our_prefix(name) {
            return 0;
        }
        let Some(h) = by_name(name) else {
            return 0;
        };
        let found = real::dlsym_real(handle, h.name) as usize;
        if found == 0 {
            return 0; // absent: glibc says so (and sets dlerror)
        }
        if !is_our_hook(found) {
            h.slot.record(found);
        }
        crate::debug!(
            "dlsym({}) -> hook (real {:#x})",
            h.name.to_str().unwrap_or("?"),
            found
        );
        h.addr.0 as usize
    })
    .unwrap_or(0)
}

/// Our exported `dlsym`: a naked stub that asks [`dlsym_decide`] and, when it says 0,
/// jumps (does not call) into glibc's `dlsym`, so glibc sees the original caller.
///
/// # Safety
/// C ABI: `dlsym`'s contract.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // rsp = 8 mod 16 at entry; two pushes + 8 bytes realign it for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        decide = sym dlsym_decide,
        real = sym crate::cuda::real::REAL_DLSYM,
    )
}

/// Non-x86_64 fallback: a plain function (RTLD_NEXT from other libraries then resolves
/// relative to this library).
///
/// # Safety
/// C ABI: `dlsym`'s contract.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let h = dlsym_decide(handle, symbol);
    if h != 0 {
        return h as *mut c_void;
    }
    let a = real::real_dlsym_addr();
    if a == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a is glibc's dlsym.
    let f: unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void =
        unsafe { std::mem::transmute(a) };
    // SAFETY: forwarding the caller's arguments.
    unsafe { f(handle, symbol) }
}

// ------------------------------------------------------------------------- substitution

/// Base names whose ABI changed across CUDA majors: never substituted by name.
const ABI_CONFLICT_BASES: &[&[u8]] = &[
    b"cuCtxCreate",
    b"cuMemAdvise",
    b"cuMemPrefetchAsync",
    b"cuGraphAddDependencies",
    b"cuGraphRemoveDependencies",
    b"cuGraphNodeGetDependencies",
    b"cuGraphNodeGetDependentNodes",
    b"cuGraphGetEdges",
    b"cuStreamGetCaptureInfo",
    b"cuGraphAddNode",
];

fn family(name: &[u8]) -> impl Iterator<Item = &'static Hook> + '_ {
    all().filter(move |h| h.base.as_bytes() == name || h.name.to_bytes() == name)
}

/// Replace `*pfn` (what the real resolver returned for `symbol`) by our hook for exactly
/// that variant, if we hook it. `version`/`ptds` are the caller's request.
pub(crate) fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, ptds: bool) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: pfn is the caller's out-pointer, just filled by the real resolver.
    let p = unsafe { *pfn } as usize;
    if p == 0 || is_our_hook(p) {
        return;
    }
    // SAFETY: the caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !is_our_prefix(name) || family(name).next().is_none() {
        return;
    }
    let chosen = identity(name, p).or_else(|| by_version(name, p, version, ptds));
    if let Some(h) = chosen {
        h.slot.record(p);
        crate::debug!(
            "lookup {}@{}{} -> hook {} (real {:#x})",
            String::from_utf8_lossy(name),
            version,
            if ptds { " ptds" } else { "" },
            h.name.to_str().unwrap_or("?"),
            p
        );
        // SAFETY: as above.
        unsafe { *pfn = h.addr.0 as *mut c_void };
    }
}

/// The hook whose real variant lives at `p`.
fn identity(name: &[u8], p: usize) -> Option<&'static Hook> {
    family(name).find(|h| h.slot.peek() == p || h.slot.get() == p)
}

/// Name fallback: the variant `version`/`ptds` selects, confirmed by the real resolver.
fn by_version(name: &[u8], p: usize, version: c_int, ptds: bool) -> Option<&'static Hook> {
    if ABI_CONFLICT_BASES.contains(&name) {
        return None;
    }
    let h = family(name)
        .filter(|h| h.min_version <= version && h.base.as_bytes() == name)
        .max_by_key(|h| (h.ptds == ptds, h.min_version))?;
    // Confirm: at the version that introduced `h`, the resolver must return the same code.
    let check = real_lookup(h.base, h.min_version, ptds);
    (check == p).then_some(h)
}

/// Ask the real driver resolver (no substitution).
fn real_lookup(base: &str, version: c_int, ptds: bool) -> usize {
    let mut buf = [0u8; 64];
    if base.len() >= buf.len() {
        return 0;
    }
    buf[..base.len()].copy_from_slice(base.as_bytes());
    let fl = if ptds {
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    } else {
        0
    };
    let mut out: *mut c_void = std::ptr::null_mut();
    let rc = if let Some(f) = real::cuGetProcAddress_v2() {
        let mut st: c_int = 0;
        // SAFETY: buf is NUL-terminated; out/st are valid out-pointers.
        unsafe { f(buf.as_ptr().cast(), &mut out, version, fl, &mut st) }
    } else if let Some(f) = real::cuGetProcAddress() {
        // SAFETY: as above.
        unsafe { f(buf.as_ptr().cast(), &mut out, version, fl) }
    } else {
        return 0;
    };
    if rc == 0 { out as usize } else { 0 }
}

// ------------------------------------------------------------------------- cuGetProcAddress

/// The shared body of `cuGetProcAddress` (4 arguments, CUDA 11.3+) and `_v2` (5 arguments,
/// CUDA 12.0+; what `cuda.h` calls `cuGetProcAddress`): the real resolver of the hook's own
/// variant (`v2`), else the other one (`status`, when asked for, said from the answer),
/// then the substitution.
fn proc_address<F>(
    h: Site<F>,
    v2: bool,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    run_unguarded(h.name, CUDA_ERROR_UNKNOWN, || {
        let use_v2 = if v2 {
            real::cuGetProcAddress_v2().is_some()
        } else {
            real::cuGetProcAddress().is_none()
        };
        let rc = if use_v2 {
            let Some(f) = real::cuGetProcAddress_v2() else {
                return NO_DRIVER;
            };
            // SAFETY: forwarding the caller's arguments unchanged (the status out-pointer
            // is optional).
            unsafe { f(symbol, pfn, version, flags, status) }
        } else {
            let Some(f) = real::cuGetProcAddress() else {
                return NO_DRIVER;
            };
            // SAFETY: forwarding the caller's arguments unchanged.
            let rc = unsafe { f(symbol, pfn, version, flags) };
            if !status.is_null() {
                // SAFETY: non-null out-pointers supplied by the caller.
                let found = rc == 0 && !pfn.is_null() && !unsafe { *pfn }.is_null();
                // SAFETY: as above.
                unsafe { *status = if found { 0 } else { 1 } };
            }
            rc
        };
        if rc == CUDA_SUCCESS {
            substitute(
                symbol,
                pfn,
                version,
                flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0,
            );
        }
        rc
    })
}

// --------------------------------------------------------------- cudaGetDriverEntryPoint

/// The shared body of the runtime's lookups (`cudaGetDriverEntryPoint`, `ByVersion`, and
/// their `_ptsz` variants, which ask for the per-thread default stream when `flags` is 0):
/// the real lookup (`call`), then the substitution at `version`.
fn entry_point<F: Copy>(
    h: Site<F>,
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_int,
    flags: c_ulonglong,
    call: impl FnOnce(F) -> c_int,
) -> c_int {
    h.unguarded(|f| {
        let rc = call(f);
        if rc == 0 {
            let ptds = flags & cudaEnablePerThreadDefaultStream != 0 || (h.ptds && flags == 0);
            substitute(symbol, func, version, ptds);
        }
        rc
    })
}

/// The caller's version for [`substitute`].
fn version_of(version: c_uint) -> c_int {
    version.min(c_int::MAX as c_uint) as c_int
}

hooks! {
    ["cuGetProcAddress", 11030] cuGetProcAddress,
    fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) |h| {
        proc_address(h, false, symbol, pfn, version, flags, std::ptr::null_mut())
    }

    ["cuGetProcAddress", 12000] cuGetProcAddress_v2,
    fn(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: c_int,
        flags: u64,
        status: *mut c_int,
    ) |h| {
        proc_address(h, true, symbol, pfn, version, flags, status)
    }

    ["cudaGetDriverEntryPoint", 0] cudaGetDriverEntryPoint,
    ["cudaGetDriverEntryPoint", 0, ptds] cudaGetDriverEntryPoint_ptsz,
    fn(
        symbol: *const c_char,
        func: *mut *mut c_void,
        flags: c_ulonglong,
        status: *mut c_int,
    ) |h| {
        // SAFETY: forwarding the caller's arguments unchanged.
        entry_point(h, symbol, func, c_int::MAX, flags, |f| unsafe { f(symbol, func, flags, status) })
    }

    /// PyTorch's: version 12000, `cudaEnableDefault`.
    ["cudaGetDriverEntryPointByVersion", 0] cudaGetDriverEntryPointByVersion,
    ["cudaGetDriverEntryPointByVersion", 0, ptds] cudaGetDriverEntryPointByVersion_ptsz,
    fn(
        symbol: *const c_char,
        func: *mut *mut c_void,
        version: c_uint,
        flags: c_ulonglong,
        status: *mut c_int,
    ) |h| {
        let v = version_of(version);
        // SAFETY: forwarding the caller's arguments unchanged.
        entry_point(h, symbol, func, v, flags, |f| unsafe { f(symbol, func, version, flags, status) })
    }
}
