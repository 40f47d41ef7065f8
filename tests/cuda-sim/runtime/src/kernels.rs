//! Kernels on a GPU that runs no device code: registration (what nvcc's generated host code
//! calls when a library with device code is loaded), launches (no-op operations completing
//! on their stream), function attributes, occupancy, `__device__` variables, and the graph
//! and library-management calls, which return `cudaErrorNotSupported`.
//!
//! **Kernel results are not computed**: a launch is an empty operation on its stream. It
//! orders like a kernel (a later event or synchronize waits for it; it is counted, not run,
//! while the stream captures), but it writes nothing.
#![allow(clippy::missing_safety_doc)]

use crate::api::{Flavor, Res, ctx};
use crate::types::*;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

/// `dim3`: passed by value (12 bytes, two integer registers in the SysV ABI).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dim3 {
    pub x: c_uint,
    pub y: c_uint,
    pub z: c_uint,
}

/// The head of `cudaLaunchConfig_t` (the attributes that follow are ignored).
#[repr(C)]
pub struct cudaLaunchConfig_t {
    pub grid_dim: dim3,
    pub block_dim: dim3,
    pub dynamic_smem_bytes: usize,
    pub stream: cudaStream_t,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `struct cudaFuncAttributes` (CUDA 12.x and 13.0: 144 bytes, `reserved[16]` at the end).
#[repr(C)]
pub struct cudaFuncAttributes {
    pub shared_size_bytes: usize,
    pub const_size_bytes: usize,
    pub local_size_bytes: usize,
    pub max_threads_per_block: c_int,
    pub num_regs: c_int,
    pub ptx_version: c_int,
    pub binary_version: c_int,
    pub cache_mode_ca: c_int,
    pub max_dynamic_shared_size_bytes: c_int,
    pub preferred_shmem_carveout: c_int,
    pub cluster_dim_must_be_set: c_int,
    pub required_cluster_width: c_int,
    pub required_cluster_height: c_int,
    pub required_cluster_depth: c_int,
    pub cluster_scheduling_policy_preference: c_int,
    pub non_portable_cluster_size_allowed: c_int,
    pub reserved: [c_int; 16],
}

/// Error codes used only here.
pub const INVALID_CONFIGURATION: cudaError_t = 9;
pub const INVALID_SYMBOL: cudaError_t = 13;
pub const INVALID_DEVICE_FUNCTION: cudaError_t = 98;

// ------------------------------------------------------------------------ registration

/// One fat binary registered by `__cudaRegisterFatBinary`: the handle handed back is the
/// address of `image` (a `void **`, as the real runtime's), never freed (the registration
/// outlives every launch; unregistering happens at exit).
struct FatBinary {
    image: *mut c_void,
}

/// A `__device__` / `__constant__` variable: its size, and the simulated device memory
/// backing it (allocated at the first `cudaGetSymbolAddress` / `cudaMemcpyToSymbol`).
struct Var {
    size: usize,
    storage: Option<Box<[u8]>>,
}

#[derive(Default)]
struct Registry {
    fat_binaries: usize,
    functions: usize,
    vars: HashMap<usize, Var>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Registry::default))
}

/// `__cudaRegisterFatBinary`: runs from the static constructors of a library with device
/// code, before `main` / at `dlopen`. It must not touch the driver (the real runtime defers
/// module loading too).
pub fn register_fat_binary(image: *mut c_void) -> *mut *mut c_void {
    registry(|r| r.fat_binaries += 1);
    let b = Box::leak(Box::new(FatBinary { image }));
    &mut b.image as *mut *mut c_void
}

/// `__cudaRegisterFunction`: the host stub becomes a launchable kernel. Only counted.
pub fn register_function() {
    registry(|r| r.functions += 1);
}

/// `__cudaRegisterVar`: remembers the variable's size for `cudaGetSymbolAddress` /
/// `cudaMemcpyToSymbol`.
pub fn register_var(host_var: *const c_void, size: usize) {
    if host_var.is_null() {
        return;
    }
    registry(|r| {
        r.vars.insert(
            host_var as usize,
            Var {
                size,
                storage: None,
            },
        );
    });
}

/// (fat binaries, functions, variables) registered so far (for tests).
pub fn registered() -> (usize, usize, usize) {
    registry(|r| (r.fat_binaries, r.functions, r.vars.len()))
}

/// The backing memory of a registered variable and its size.
fn symbol(sym: *const c_void) -> Res<(*mut u8, usize)> {
    if sym.is_null() {
        return Err(INVALID_SYMBOL);
    }
    registry(|r| {
        let v = r.vars.get_mut(&(sym as usize)).ok_or(INVALID_SYMBOL)?;
        let size = v.size;
        let s = v
            .storage
            .get_or_insert_with(|| vec![0u8; size.max(1)].into_boxed_slice());
        Ok((s.as_mut_ptr(), size))
    })
}

pub unsafe fn get_symbol_address(rt: Flavor, p: *mut *mut c_void, sym: *const c_void) -> Res {
    if p.is_null() {
        return Err(err::INVALID_VALUE);
    }
    ctx(rt)?;
    let (a, _) = symbol(sym)?;
    // SAFETY: checked non-null out-pointer.
    unsafe { *p = a as *mut c_void };
    Ok(())
}

/// `cudaMemcpyToSymbol`: the variable's memory is host memory here, so any source (host or
/// simulated device memory, which is host memory too) is copied directly.
pub unsafe fn memcpy_to_symbol(
    rt: Flavor,
    sym: *const c_void,
    src: *const c_void,
    n: usize,
    offset: usize,
    kind: c_uint,
) -> Res {
    ctx(rt)?;
    if kind > memcpy_kind::DEFAULT {
        return Err(err::INVALID_MEMCPY_DIRECTION);
    }
    let (a, size) = symbol(sym)?;
    if offset.checked_add(n).is_none_or(|end| end > size) {
        return Err(err::INVALID_VALUE);
    }
    if n == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(err::INVALID_VALUE);
    }
    // SAFETY: the destination lies inside the variable's storage (checked above); the
    // caller promises `src` is valid for `n` bytes.
    unsafe { std::ptr::copy(src as *const u8, a.add(offset), n) };
    Ok(())
}

// --------------------------------------------------------------------------- launches

thread_local! {
    /// `<<<...>>>` configurations pushed by `__cudaPushCallConfiguration` (nvcc's stubs pop
    /// them right away in `__cudaPopCallConfiguration`).
    static CALL_CONFIG: std::cell::RefCell<Vec<(dim3, dim3, usize, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

pub fn push_call_configuration(grid: dim3, block: dim3, shmem: usize, s: cudaStream_t) -> c_uint {
    let _ = CALL_CONFIG.try_with(|c| c.borrow_mut().push((grid, block, shmem, s as usize)));
    0
}

pub unsafe fn pop_call_configuration(
    grid: *mut dim3,
    block: *mut dim3,
    shmem: *mut usize,
    s: *mut c_void,
) -> Res {
    let top = CALL_CONFIG
        .try_with(|c| c.borrow_mut().pop())
        .ok()
        .flatten()
        .ok_or(err::INVALID_VALUE)?;
    // SAFETY: out-pointers from nvcc's stub; NULL ones are skipped.
    unsafe {
        if !grid.is_null() {
            *grid = top.0;
        }
        if !block.is_null() {
            *block = top.1;
        }
        if !shmem.is_null() {
            *shmem = top.2;
        }
        if !s.is_null() {
            *(s as *mut usize) = top.3;
        }
    }
    Ok(())
}

/// A kernel launch: validated like a real one (a function, no zero dimension), then an empty
/// operation on `s` through the driver's `cuLaunchKernel`. Nothing is computed.
pub unsafe fn launch(
    rt: Flavor,
    ptds: bool,
    func: *const c_void,
    grid: dim3,
    block: dim3,
    shmem: usize,
    s: cudaStream_t,
) -> Res {
    let d = ctx(rt)?;
    if func.is_null() {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    let dims = [grid.x, grid.y, grid.z, block.x, block.y, block.z];
    if dims.contains(&0) || block.x.saturating_mul(block.y).saturating_mul(block.z) > 1024 {
        return Err(INVALID_CONFIGURATION);
    }
    let shmem = c_uint::try_from(shmem).map_err(|_| INVALID_CONFIGURATION)?;
    let f = if ptds {
        d.cuLaunchKernel_ptsz
    } else {
        d.cuLaunchKernel
    };
    let Some(f) = f else {
        return Err(err::NOT_SUPPORTED);
    };
    // SAFETY: the driver's cuLaunchKernel; the function handle is opaque to it (device code
    // is not run) and the parameter arrays are NULL.
    let rc = unsafe {
        f(
            func as *mut c_void,
            grid.x,
            grid.y,
            grid.z,
            block.x,
            block.y,
            block.z,
            shmem,
            s,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(crate::errors::from_cu(rc))
    }
}

pub unsafe fn launch_ex(
    rt: Flavor,
    ptds: bool,
    config: *const cudaLaunchConfig_t,
    func: *const c_void,
) -> Res {
    if config.is_null() {
        return Err(err::INVALID_VALUE);
    }
    // SAFETY: non-null cudaLaunchConfig_t from the caller.
    let c = unsafe { &*config };
    // SAFETY: forwarded.
    unsafe {
        launch(
            rt,
            ptds,
            func,
            c.grid_dim,
            c.block_dim,
            c.dynamic_smem_bytes,
            c.stream,
        )
    }
}

/// `__cudaGetKernel`: the kernel handle is the host stub's address.
pub unsafe fn get_kernel(kernel: *mut *mut c_void, func: *const c_void) -> Res {
    if kernel.is_null() {
        return Err(err::INVALID_VALUE);
    }
    if func.is_null() {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    // SAFETY: checked non-null out-pointer.
    unsafe { *kernel = func as *mut c_void };
    Ok(())
}

// ------------------------------------------------------------- attributes, occupancy

pub unsafe fn func_get_attributes(
    rt: Flavor,
    a: *mut cudaFuncAttributes,
    func: *const c_void,
) -> Res {
    if a.is_null() {
        return Err(err::INVALID_VALUE);
    }
    ctx(rt)?;
    if func.is_null() {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    let v = cudaFuncAttributes {
        shared_size_bytes: 0,
        const_size_bytes: 0,
        local_size_bytes: 0,
        max_threads_per_block: 1024,
        num_regs: 32,
        ptx_version: 90,
        binary_version: 90,
        cache_mode_ca: 0,
        max_dynamic_shared_size_bytes: 48 * 1024,
        preferred_shmem_carveout: -1,
        cluster_dim_must_be_set: 0,
        required_cluster_width: 0,
        required_cluster_height: 0,
        required_cluster_depth: 0,
        cluster_scheduling_policy_preference: 0,
        non_portable_cluster_size_allowed: 0,
        reserved: [0; 16],
    };
    // SAFETY: the caller passes a `struct cudaFuncAttributes`.
    unsafe { a.write_unaligned(v) };
    Ok(())
}

/// `cudaFuncSetAttribute` / `cudaKernelSetAttributeForDevice`: accepted, nothing to change.
pub fn func_set_attribute(rt: Flavor, func: *const c_void) -> Res {
    ctx(rt)?;
    if func.is_null() {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    Ok(())
}

/// `cudaOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags]`: 2048 threads and 32 blocks
/// per multiprocessor (compute capability 9.0), registers and shared memory not limiting.
pub unsafe fn occupancy(rt: Flavor, n: *mut c_int, func: *const c_void, block_size: c_int) -> Res {
    if n.is_null() || block_size <= 0 {
        return Err(err::INVALID_VALUE);
    }
    ctx(rt)?;
    if func.is_null() {
        return Err(INVALID_DEVICE_FUNCTION);
    }
    if block_size > 1024 {
        // SAFETY: checked non-null.
        unsafe { *n = 0 };
        return Ok(());
    }
    // SAFETY: checked non-null.
    unsafe { *n = (2048 / block_size).clamp(1, 32) };
    Ok(())
}

/// Everything the simulated GPU cannot do (graphs beyond capture status, user objects,
/// library management): `cudaErrorNotSupported` (801), nothing written.
pub fn not_supported(rt: Flavor) -> Res {
    crate::api::drv(rt)?;
    Err(err::NOT_SUPPORTED)
}
