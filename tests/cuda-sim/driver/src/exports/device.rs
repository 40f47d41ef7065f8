//! Initialisation, versions, devices, error strings and entry-point lookup.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::*;
use crate::config::CONFIG;
use crate::cu_api;
use crate::procaddr;
use crate::state;

/// Simulated device attributes (an H100-like part; CC 9.0) of physical device `phys`.
pub(crate) fn attribute(attr: c_int, phys: i32) -> Option<c_int> {
    Some(match attr {
        1 => 1024,        // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,    // MAX_BLOCK_DIM_X/Y
        4 => 64,          // MAX_BLOCK_DIM_Z
        5 => 2147483647,  // MAX_GRID_DIM_X
        6 | 7 => 65535,   // MAX_GRID_DIM_Y/Z
        8 => 49152,       // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,       // TOTAL_CONSTANT_MEMORY
        10 => 32,         // WARP_SIZE
        11 => 2147483647, // MAX_PITCH
        12 => 65536,      // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,  // CLOCK_RATE (kHz)
        14 => 512,        // TEXTURE_ALIGNMENT
        15 => 1,          // GPU_OVERLAP
        16 => 132,        // MULTIPROCESSOR_COUNT
        17 => 0,          // KERNEL_EXEC_TIMEOUT
        18 => 0,          // INTEGRATED
        19 => 1,          // CAN_MAP_HOST_MEMORY
        20 => 0,          // COMPUTE_MODE default
        31 => 1,          // CONCURRENT_KERNELS
        32 => 0,          // ECC_ENABLED
        33 => phys + 1,   // PCI_BUS_ID
        34 => 0,          // PCI_DEVICE_ID
        35 => 0,          // TCC_DRIVER
        36 => 2_619_000,  // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,       // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,   // L2_CACHE_SIZE
        39 => 2048,       // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,          // ASYNC_ENGINE_COUNT
        41 => 1,          // UNIFIED_ADDRESSING
        50 => 0,          // PCI_DOMAIN_ID
        75 => 9,          // COMPUTE_CAPABILITY_MAJOR
        76 => 0,          // COMPUTE_CAPABILITY_MINOR
        78 => 1,          // STREAM_PRIORITIES_SUPPORTED
        81 => 233472,     // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,      // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,          // MANAGED_MEMORY
        84 => 0,          // MULTI_GPU_BOARD
        86 => 1,          // HOST_NATIVE_ATOMIC_SUPPORTED
        88 => 0,          // PAGEABLE_MEMORY_ACCESS
        89 => 1,          // CONCURRENT_MANAGED_ACCESS
        95 | 96 => 1,     // COOPERATIVE_LAUNCH
        97 => 232448,     // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        99 => 1,          // HOST_REGISTER_SUPPORTED
        102 => 1,         // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,         // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        104 | 105 => 0,   // WIN32 handles
        106 => 32,        // MAX_BLOCKS_PER_MULTIPROCESSOR
        111 => 1024,      // RESERVED_SHARED_MEMORY_PER_BLOCK
        115 => 1,         // MEMORY_POOLS_SUPPORTED
        119 => 1,         // MEMPOOL_SUPPORTED_HANDLE_TYPES (posix fd)
        // GPU_PCI_DEVICE_ID / _SUBSYSTEM_ID: device << 16 | vendor, an H100 SXM's (cuBLAS
        // reads them).
        139 => 0x2330_10de,
        140 => 0x16c1_10de,
        _ if (1..=150).contains(&attr) => 0,
        _ => return None,
    })
}

pub(crate) fn uuid(phys: usize) -> CUuuid {
    CUuuid {
        bytes: vramsim_devstate::device_uuid(&CONFIG.name, phys as u32),
    }
}

/// Copies a string into a caller buffer of `len` bytes, truncating, always NUL-terminated.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_int, s: &str) -> Res {
    if buf.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: buf holds len > n bytes per the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

fn device_name(phys: usize) -> String {
    vramsim_devstate::device_name(phys as u32)
}

cu_api! {
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        state::init()
    }

    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: C out-pointer.
        unsafe { put(version, CONFIG.driver_version) }
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        let n = state::device_count()?;
        // SAFETY: C out-pointer.
        unsafe { put(count, n) }
    }

    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        state::check_device(ordinal)?;
        // SAFETY: C out-pointer.
        unsafe { put(device, ordinal) }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let phys = state::physical(dev)?;
        // SAFETY: buffer of len bytes from the caller.
        unsafe { put_str(name, len, &device_name(phys)) }
    }

    fn cuDeviceGetUuid(out: *mut CUuuid, dev: CUdevice) {
        let phys = state::physical(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, uuid(phys)) }
    }

    fn cuDeviceGetUuid_v2(out: *mut CUuuid, dev: CUdevice) {
        let phys = state::physical(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, uuid(phys)) }
    }

    fn cuDeviceGetPCIBusId(bus: *mut c_char, len: c_int, dev: CUdevice) {
        let phys = state::physical(dev)?;
        // SAFETY: buffer of len bytes from the caller.
        unsafe { put_str(bus, len, &format!("00000000:{:02X}:00.0", phys + 1)) }
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        state::check_device(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(bytes, state::capacity() as usize) }
    }

    fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) {
        state::check_device(dev)?;
        // SAFETY: C out-pointer (the 32-bit v1 ABI).
        unsafe { put(bytes, state::capacity().min(u32::MAX as u64) as c_uint) }
    }

    fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) {
        let phys = state::physical(dev)?;
        let v = attribute(attrib, phys as i32).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: C out-pointer.
        unsafe { put(pi, v) }
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        state::check_device(dev)?;
        state::check_device(peer)?;
        // SAFETY: C out-pointer.
        unsafe { put(can, (dev != peer) as c_int) }
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        let p = crate::pool::default_pool(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(pool, p) }
    }

    fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) {
        let p = crate::pool::current_pool(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(pool, p) }
    }

    fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) {
        crate::pool::set_current_pool(dev, pool)
    }

    // Graph memory: what allocation nodes hold (`graph`: live in launches, "used"; backing
    // the nodes, "reserved"; current and high). NVIDIA's runtime forwards its
    // cudaDeviceGet/SetGraphMemAttribute and cudaDeviceGraphMemTrim here; PyTorch's
    // cudaMallocAsync backend resets the high-water marks in torch.cuda.reset_peak_memory_stats.
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) {
        state::check_device(dev)?;
        if value.is_null() || !(0..=3).contains(&attr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let v = crate::graph::mem_attribute(dev, attr);
        // SAFETY: the four attributes are cuuint64_t (C contract); checked non-null.
        unsafe { value.cast::<u64>().write_unaligned(v) };
        Ok(())
    }

    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) {
        state::check_device(dev)?;
        // Only the two high-water marks (USED_MEM_HIGH = 1, RESERVED_MEM_HIGH = 3) can be
        // set, and only to 0 (a reset).
        if value.is_null() || !(attr == 1 || attr == 3) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: cuuint64_t per the attribute (C contract); checked non-null.
        if unsafe { value.cast::<u64>().read_unaligned() } != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::graph::reset_high(dev, attr);
        Ok(())
    }

    fn cuDeviceGraphMemTrim(dev: CUdevice) {
        state::check_device(dev)
    }

    fn cuGetErrorString(error: CUresult, out: *mut *const c_char) {
        let e = ERRORS.iter().find(|(c, _, _)| *c == error);
        // SAFETY: C out-pointer.
        unsafe { put(out, e.map_or(std::ptr::null(), |(_, _, s)| s.as_ptr())) }?;
        e.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGetErrorName(error: CUresult, out: *mut *const c_char) {
        let e = ERRORS.iter().find(|(c, _, _)| *c == error);
        // SAFETY: C out-pointer.
        unsafe { put(out, e.map_or(std::ptr::null(), |(_, n, _)| n.as_ptr())) }?;
        e.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
        // SAFETY: C string argument.
        let name = unsafe { cstr(symbol) }?;
        let (p, _status) = procaddr::lookup(name, cuda_version, flags)?;
        // SAFETY: C out-pointer.
        unsafe { put(pfn, p) }?;
        // The 11.x ABI reports a missing symbol as an error.
        if p.is_null() { Err(CUDA_ERROR_NOT_FOUND) } else { Ok(()) }
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        cuda_version: c_int,
        flags: u64,
        symbol_status: *mut c_int,
    ) {
        // SAFETY: C string argument.
        let name = unsafe { cstr(symbol) }?;
        if pfn.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (p, status) = procaddr::lookup(name, cuda_version, flags)?;
        if p.is_null() && CONFIG.debug {
            eprintln!("vramsim: cuGetProcAddress {name}@{cuda_version}: not served");
        }
        // SAFETY: C out-pointer, checked above.
        unsafe { put(pfn, p) }?;
        if !symbol_status.is_null() {
            // SAFETY: optional C out-pointer, non-null.
            unsafe { put(symbol_status, status) }?;
        }
        Ok(())
    }

    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        if id.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null pointer to the caller's 16-byte UUID.
        let id = unsafe { id.read_unaligned() }.bytes;
        let found = crate::export_tables::lookup(&id);
        if CONFIG.debug {
            eprintln!("vramsim: cuGetExportTable {}", crate::export_tables::format_uuid(&id));
        }
        // SAFETY: C out-pointer.
        unsafe { put(table, found.unwrap_or(std::ptr::null())) }?;
        found.map(|_| ()).ok_or(CUDA_ERROR_NOT_FOUND)
    }
}
