//! Modules, libraries, kernels and functions (`cuModule*`, `cuLibrary*`, `cuKernel*`,
//! `cuFunc*`), occupancy, `cuLaunchKernelEx`, and the families answered "not supported"
//! (graphs, the JIT linker, stream memory waits and batches) that NVIDIA's libraries look up
//! and can live without. Kernels are not executed: a launch is an empty operation in stream
//! order. See `crate::module` for what a module holds.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::*;
use crate::cu_api;
use crate::{ctx, module, stream};

type N = *mut c_void;

/// The current context's device, for a module loaded now.
fn current_dev() -> Result<i32, CUresult> {
    ctx::current_device()
}

/// Loads a module into the current context's device or, `library`, a library, which needs no
/// current context: CUDA 12's libraries are context-independent (cuLibraryLoadData's documented
/// answers have no CUDA_ERROR_INVALID_CONTEXT), and NVIDIA's runtime loads its kernel libraries
/// lazily on whichever thread first launches one of their kernels, before it makes its context
/// current there.
///
/// # Safety
/// `image` is NULL or a whole image (see `module::read_image`).
unsafe fn load(out: *mut CUmodule, image: *const c_void, library: bool) -> Res {
    if out.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = if library {
        crate::state::driver()?;
        None
    } else {
        Some(current_dev()?)
    };
    // SAFETY: per this function's contract.
    let symbols = unsafe { module::read_image(image.cast()) };
    if crate::config::CONFIG.debug {
        // SAFETY: every image starts with a 4-byte magic.
        let magic = unsafe { (image as *const u32).read_unaligned() };
        eprintln!(
            "vramsim: image {magic:#x}: {} globals, {} kernels{}",
            symbols.globals.len(),
            symbols.kernels.len(),
            if symbols.parsed {
                ""
            } else {
                " (no cubin read)"
            }
        );
    }
    // SAFETY: C out-pointer, checked above.
    unsafe { put(out, module::load(dev, symbols)) }
}

/// Loads the file `path` (an image of any kind), read whole (at most 1 GiB), as `load`.
///
/// # Safety
/// `path` is NULL or a C string.
unsafe fn load_file(out: *mut CUmodule, path: *const c_char, library: bool) -> Res {
    // SAFETY: C string argument.
    let path = unsafe { cstr(path) }?;
    let meta = std::fs::metadata(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if meta.len() > crate::image::MAX_IMAGE {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let mut bytes = std::fs::read(path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    // Room for a 4-byte magic even in a tiny file.
    bytes.resize(bytes.len().max(8), 0);
    // SAFETY: `bytes` is the whole image.
    unsafe { load(out, bytes.as_ptr().cast(), library) }
}

/// # Safety
/// `name` is NULL or a C string.
unsafe fn name_arg<'a>(name: *const c_char) -> Result<&'a str, CUresult> {
    // SAFETY: per this function's contract.
    unsafe { cstr(name) }
}

/// Writes a global's address and size to the (each optional) out-pointers.
fn put_global(dptr: *mut CUdeviceptr, bytes: *mut usize, g: (u64, u64)) -> Res {
    if !dptr.is_null() {
        // SAFETY: non-null C out-pointer.
        unsafe { put(dptr, g.0) }?;
    }
    if !bytes.is_null() {
        // SAFETY: non-null C out-pointer.
        unsafe { put(bytes, g.1 as usize) }?;
    }
    Ok(())
}

/// Blocks of `block_size` threads (and `smem` dynamic shared bytes) resident per SM on the
/// simulated device (2048 threads, 32 blocks, 64 Ki registers at 32 per thread, 228 KiB of
/// shared memory of which 1 KiB per block is reserved).
fn blocks_per_sm(f: CUfunction, block_size: c_int, smem: usize) -> Result<c_int, CUresult> {
    if block_size <= 0 || block_size > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let regs = module::attribute(f, 4).unwrap_or(32).max(1);
    let warps = (block_size + 31) / 32;
    let by_threads = 64 / warps;
    let by_regs = 65536 / (regs * warps * 32);
    let per_block = smem + module::attribute(f, 1).unwrap_or(0) as usize + 1024;
    let by_smem = (233472 / per_block) as c_int;
    Ok(by_threads.min(by_regs).min(by_smem).min(32))
}

/// Blocks per cluster a launch configuration asks for (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION),
/// 1 without one.
fn cluster_blocks(c: &CUlaunchConfig) -> u32 {
    const CLUSTER_DIMENSION: u32 = 4;
    const ATTR_SIZE: usize = 72; // {id, pad to 8, 64-byte value union}
    if c.attrs.is_null() || c.num_attrs > 64 {
        return 1;
    }
    (0..c.num_attrs as usize)
        .find_map(|i| {
            // SAFETY: the caller's array of num_attrs launch attributes.
            let a = unsafe { (c.attrs as *const u8).add(i * ATTR_SIZE) };
            // SAFETY: as above; the id, then x, y, z of the cluster dimension at offset 8.
            let (id, dims) = unsafe {
                (
                    (a as *const u32).read_unaligned(),
                    (a.add(8) as *const [u32; 3]).read_unaligned(),
                )
            };
            (id == CLUSTER_DIMENSION).then(|| dims.iter().map(|&d| d.max(1)).product())
        })
        .unwrap_or(1)
}

/// # Safety
/// `config` is NULL or a launch configuration.
unsafe fn read_config(config: *const CUlaunchConfig) -> Result<CUlaunchConfig, CUresult> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: per this function's contract.
    Ok(unsafe { config.read_unaligned() })
}

fn not_supported() -> Res {
    Err(CUDA_ERROR_NOT_SUPPORTED)
}

/// `CUlaunchConfig`: grid and block dimensions, dynamic shared memory, stream, attributes.
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

fn launch_ex(config: *const CUlaunchConfig, ptsz: bool) -> Res {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer to the caller's launch configuration.
    let c = unsafe { config.read_unaligned() };
    if c.grid.contains(&0) || c.block.contains(&0) || c.block.iter().product::<c_uint>() > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = stream::resolve(c.stream, ptsz)?;
    stream::run_async(&s, crate::config::CONFIG.kernel_time, Box::new(|| {}))
}

cu_api! {
    fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) {
        // SAFETY: the image the caller passes.
        unsafe { load(module, image, false) }
    }
    fn cuModuleLoadDataEx(
        module: *mut CUmodule, image: *const c_void, _n: c_uint, _options: *mut c_int,
        _values: *mut *mut c_void,
    ) {
        // SAFETY: the image the caller passes (JIT options do not apply: nothing is compiled).
        unsafe { load(module, image, false) }
    }
    fn cuModuleLoadFatBinary(module: *mut CUmodule, fatbin: *const c_void) {
        // SAFETY: the fat binary the caller passes.
        unsafe { load(module, fatbin, false) }
    }
    fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) {
        current_dev()?;
        // SAFETY: C string argument.
        unsafe { load_file(module, fname, false) }
    }
    fn cuModuleUnload(module: CUmodule) { module::unload(module) }
    fn cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char) {
        // SAFETY: C string argument.
        let name = unsafe { name_arg(name) }?;
        let h = module::function(module, name)?;
        // SAFETY: C out-pointer.
        unsafe { put(f, h) }
    }
    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char) {
        // SAFETY: C string argument.
        let name = unsafe { name_arg(name) }?;
        put_global(dptr, bytes, module::global(module, name, current_dev().ok())?)
    }
    /// CU_MODULE_LAZY_LOADING (2) unless CUDA_MODULE_LOADING=EAGER, as the driver decides.
    fn cuModuleGetLoadingMode(mode: *mut c_int) {
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
        // SAFETY: C out-pointer.
        unsafe { put(mode, if eager { 1 } else { 2 }) }
    }

    fn cuLibraryLoadData(
        library: *mut CUmodule, code: *const c_void, _jit_options: *mut c_int,
        _jit_values: *mut *mut c_void, _n_jit: c_uint, _lib_options: *mut c_int,
        _lib_values: *mut *mut c_void, _n_lib: c_uint,
    ) {
        // SAFETY: the image the caller passes.
        unsafe { load(library, code, true) }
    }
    fn cuLibraryLoadFromFile(
        library: *mut CUmodule, fname: *const c_char, _jit_options: *mut c_int,
        _jit_values: *mut *mut c_void, _n_jit: c_uint, _lib_options: *mut c_int,
        _lib_values: *mut *mut c_void, _n_lib: c_uint,
    ) {
        crate::state::driver()?;
        // SAFETY: C string argument.
        unsafe { load_file(library, fname, true) }
    }
    fn cuLibraryUnload(library: CUmodule) { module::unload(library) }
    fn cuLibraryGetKernel(kernel: *mut CUfunction, library: CUmodule, name: *const c_char) {
        // SAFETY: C string argument.
        let name = unsafe { name_arg(name) }?;
        let h = module::function(library, name)?;
        // SAFETY: C out-pointer.
        unsafe { put(kernel, h) }
    }
    /// The library's module in the current context (201 without one).
    fn cuLibraryGetModule(module: *mut CUmodule, library: CUmodule) {
        module::kernels(library)?;
        current_dev()?;
        // SAFETY: C out-pointer.
        unsafe { put(module, library) }
    }
    fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUmodule, name: *const c_char) {
        // SAFETY: C string argument.
        let name = unsafe { name_arg(name) }?;
        // Per context: allocated on the current context's device (201 without one).
        let dev = current_dev()?;
        put_global(dptr, bytes, module::global(library, name, Some(dev))?)
    }
    fn cuLibraryGetKernelCount(count: *mut c_uint, library: CUmodule) {
        let n = module::kernels(library)?.len();
        // SAFETY: C out-pointer.
        unsafe { put(count, n as c_uint) }
    }
    fn cuLibraryEnumerateKernels(kernels: *mut CUfunction, n: c_uint, library: CUmodule) {
        let all = module::kernels(library)?;
        if kernels.is_null() || (n as usize) < all.len() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (i, k) in all.into_iter().enumerate() {
            // SAFETY: the caller's array of n >= all.len() handles.
            unsafe { put(kernels.add(i), k) }?;
        }
        Ok(())
    }

    /// The kernel's function in the current context (201 without one).
    fn cuKernelGetFunction(f: *mut CUfunction, kernel: CUfunction) {
        module::check_function(kernel)?;
        current_dev()?;
        // SAFETY: C out-pointer.
        unsafe { put(f, kernel) }
    }
    fn cuKernelGetLibrary(library: *mut CUmodule, kernel: CUfunction) {
        let m = module::module_of(kernel)?;
        // SAFETY: C out-pointer.
        unsafe { put(library, m) }
    }
    fn cuKernelGetAttribute(pi: *mut c_int, attr: c_int, kernel: CUfunction, _dev: CUdevice) {
        let v = module::attribute(kernel, attr)?;
        // SAFETY: C out-pointer.
        unsafe { put(pi, v) }
    }
    fn cuKernelSetAttribute(attr: c_int, value: c_int, kernel: CUfunction, _dev: CUdevice) {
        module::set_attribute(kernel, attr, value)
    }
    fn cuKernelSetCacheConfig(kernel: CUfunction, _config: c_int, _dev: CUdevice) {
        module::check_function(kernel)
    }

    fn cuFuncGetAttribute(pi: *mut c_int, attr: c_int, f: CUfunction) {
        let v = module::attribute(f, attr)?;
        // SAFETY: C out-pointer.
        unsafe { put(pi, v) }
    }
    fn cuFuncSetAttribute(f: CUfunction, attr: c_int, value: c_int) {
        module::set_attribute(f, attr, value)
    }
    fn cuFuncSetCacheConfig(f: CUfunction, _config: c_int) { module::check_function(f) }
    fn cuFuncGetModule(out: *mut CUmodule, f: CUfunction) {
        let m = module::module_of(f)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, m) }
    }

    fn cuLaunchKernelEx(config: *const CUlaunchConfig, _f: CUfunction, _params: *mut N, _extra: *mut N) {
        launch_ex(config, false)
    }
    fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, _f: CUfunction, _params: *mut N, _extra: *mut N) {
        launch_ex(config, true)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize) {
        let b = blocks_per_sm(f, block, smem)?;
        // SAFETY: C out-pointer.
        unsafe { put(n, b) }
    }
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        n: *mut c_int, f: CUfunction, block: c_int, smem: usize, _flags: c_uint,
    ) {
        let b = blocks_per_sm(f, block, smem)?;
        // SAFETY: C out-pointer.
        unsafe { put(n, b) }
    }
    fn cuOccupancyMaxPotentialBlockSize(
        min_grid: *mut c_int, block: *mut c_int, f: CUfunction, _smem_of: *mut c_void,
        smem: usize, limit: c_int,
    ) {
        let b = if limit > 0 { limit.min(1024) } else { 1024 };
        let per_sm = blocks_per_sm(f, b, smem)?;
        // SAFETY: C out-pointers.
        unsafe {
            put(min_grid, per_sm * 132)?;
            put(block, b)
        }
    }
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(
        min_grid: *mut c_int, block: *mut c_int, f: CUfunction, _smem_of: *mut c_void,
        smem: usize, limit: c_int, _flags: c_uint,
    ) {
        let b = if limit > 0 { limit.min(1024) } else { 1024 };
        let per_sm = blocks_per_sm(f, b, smem)?;
        // SAFETY: C out-pointers.
        unsafe {
            put(min_grid, per_sm * 132)?;
            put(block, b)
        }
    }
    /// Largest cluster: 8 blocks (portable), 16 once non-portable sizes are allowed, as on H100.
    fn cuOccupancyMaxPotentialClusterSize(size: *mut c_int, f: CUfunction, config: *const CUlaunchConfig) {
        // SAFETY: the caller's launch configuration.
        unsafe { read_config(config) }?;
        let non_portable = module::attribute(f, 14)? != 0;
        // SAFETY: C out-pointer.
        unsafe { put(size, if non_portable { 16 } else { 8 }) }
    }
    /// Clusters of the configuration's size resident at once: the device's block slots for
    /// this block size divided by the cluster size.
    fn cuOccupancyMaxActiveClusters(n: *mut c_int, f: CUfunction, config: *const CUlaunchConfig) {
        // SAFETY: the caller's launch configuration.
        let c = unsafe { read_config(config) }?;
        let threads = c.block.iter().map(|&d| d.max(1)).product::<u32>().min(1025) as c_int;
        let per_sm = blocks_per_sm(f, threads, c.shared_mem_bytes as usize)?;
        let clusters = (per_sm as u32 * 132) / cluster_blocks(&c);
        // SAFETY: C out-pointer.
        unsafe { put(n, clusters as c_int) }
    }
    fn cuOccupancyAvailableDynamicSMemPerBlock(out: *mut usize, f: CUfunction, blocks: c_int, block: c_int) {
        module::check_function(f)?;
        if blocks <= 0 || block <= 0 || block > 1024 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let per_block = (233472 / blocks as usize).saturating_sub(1024).min(232448);
        // SAFETY: C out-pointer.
        unsafe { put(out, per_block) }
    }
}

// Graphs, the JIT linker and stream memory waits/batches: "not supported". NVIDIA's libraries
// look these up by name at load and use them only on paths that a simulated device (no
// kernels executed) cannot honour anyway; the argument lists are not read.
cu_api! {
    fn cuGraphGetNodes() { not_supported() }
    fn cuGraphNodeGetType() { not_supported() }
    fn cuGraphKernelNodeGetParams() { not_supported() }
    fn cuGraphKernelNodeGetParams_v2() { not_supported() }
    fn cuGraphExecKernelNodeSetParams() { not_supported() }
    fn cuGraphExecKernelNodeSetParams_v2() { not_supported() }
    fn cuLinkCreate_v2() { not_supported() }
    fn cuLinkAddData_v2() { not_supported() }
    fn cuLinkAddFile_v2() { not_supported() }
    fn cuLinkComplete() { not_supported() }
    fn cuLinkDestroy() { not_supported() }
    fn cuStreamBatchMemOp() { not_supported() }
    fn cuStreamBatchMemOp_v2() { not_supported() }
    fn cuStreamBatchMemOp_ptsz() { not_supported() }
    fn cuStreamBatchMemOp_v2_ptsz() { not_supported() }
    fn cuStreamWaitValue32() { not_supported() }
    fn cuStreamWaitValue32_v2() { not_supported() }
    fn cuStreamWaitValue32_ptsz() { not_supported() }
    fn cuStreamWaitValue32_v2_ptsz() { not_supported() }
}
