//! Simulated NVML (libnvidia-ml.so.1): init, device handles, names, UUIDs and memory info,
//! read from the same shared device accounting as the simulated driver (`vramsim-devstate`),
//! so a process sees what every process on the simulated GPU holds, as nvidia-smi does.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{LazyLock, Mutex};

use vramsim_devstate::parse::{SIZE_FORMS, env_or_with, parse_size};
use vramsim_devstate::{
    DEFAULT_DEVICES, DEFAULT_MEMORY, DEFAULT_NAME, DeviceState, MAX_DEVICES, device_name,
    device_uuid, uuid_string,
};

type NvmlReturn = c_uint;
type Res = Result<(), NvmlReturn>;
type NvmlDevice = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// The version NVML reports for its driver (a CUDA 13.0-era branch).
const DRIVER_VERSION: &str = "580.65.06";
const CUDA_DRIVER_VERSION: c_int = 13000;

const HANDLE_BASE: usize = 0x7c4e_0000_0000;
const HANDLE_STEP: usize = 0x100;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2` = sizeof | 2 << 24.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const ERRORS: &[(NvmlReturn, &CStr)] = &[
    (0, c"Success"),
    (1, c"Uninitialized"),
    (2, c"Invalid Argument"),
    (3, c"Not Supported"),
    (4, c"Insufficient Permissions"),
    (6, c"Not Found"),
    (7, c"Insufficient Size"),
    (9, c"Driver Not Loaded"),
    (25, c"Argument version mismatch"),
    (999, c"Unknown Error"),
];

struct Config {
    name: String,
    devices: u32,
    memory: u64,
}

static CONFIG_PARSED: AtomicU32 = AtomicU32::new(0);

static CONFIG: LazyLock<Config> = LazyLock::new(|| {
    // The simulated driver reads the same variables and already reported a bad value once.
    let warn = !sim_driver_loaded();
    CONFIG_PARSED.store(1, Ordering::Release);
    Config {
        name: std::env::var("VRAMSIM_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_NAME.to_string()),
        devices: env_or_with(
            "VRAMSIM_DEVICES",
            DEFAULT_DEVICES,
            "a device count from 1 to 16",
            |s| {
                s.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_DEVICES as u32).contains(n))
            },
            warn,
        ),
        memory: env_or_with(
            "VRAMSIM_MEMORY",
            DEFAULT_MEMORY,
            SIZE_FORMS,
            |s| parse_size(s).filter(|n| *n >= 2 << 20),
            warn,
        ),
    }
});

/// Whether the simulated libcuda.so.1 is already loaded in this process.
fn sim_driver_loaded() -> bool {
    // SAFETY: RTLD_NOLOAD only looks the library up; the handle is closed again.
    unsafe {
        let h = libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        );
        if h.is_null() {
            return false;
        }
        let found = !libc::dlsym(h, c"vramsimDeviceStats".as_ptr()).is_null();
        libc::dlclose(h);
        found
    }
}

/// (init count, device) — nvmlInit may be called several times, each matched by a shutdown.
static STATE: Mutex<Option<&'static DeviceState>> = Mutex::new(None);
static INITS: AtomicU32 = AtomicU32::new(0);

fn device_state() -> Result<&'static DeviceState, NvmlReturn> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    STATE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ok_or(NVML_ERROR_UNINITIALIZED)
}

fn init() -> Res {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let c = &*CONFIG;
        let d = DeviceState::open_or_create(&c.name, c.devices, c.memory).map_err(|e| {
            eprintln!(
                "vramsim-nvml: cannot open the simulated device {:?}: {e}",
                c.name
            );
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        // The mapping lives as long as the process: handles may outlive nvmlShutdown misuse.
        *g = Some(Box::leak(Box::new(d)));
    }
    INITS.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

fn index_of(h: NvmlDevice) -> Result<u32, NvmlReturn> {
    let d = device_state()?;
    let v = h as usize;
    if v <= HANDLE_BASE || !(v - HANDLE_BASE).is_multiple_of(HANDLE_STEP) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = ((v - HANDLE_BASE) / HANDLE_STEP - 1) as u32;
    if i >= d.devices() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}

/// # Safety
/// `p` is NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, valid per the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// # Safety
/// `buf` is NULL or valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Res {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: buf holds len > s.len() bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn guard(body: impl FnOnce() -> Res) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

macro_rules! nvml_api {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            #[unsafe(no_mangle)]
            #[allow(clippy::missing_safety_doc, non_snake_case)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> NvmlReturn {
                guard(move || -> Res { $body })
            }
        )*
    };
}

/// (total, free, used) of device `i`: used is what every live process holds (context
/// overheads included); nothing is reported as reserved.
fn memory(i: u32) -> Result<(u64, u64, u64), NvmlReturn> {
    let d = device_state()?;
    let used = d.used(i as usize);
    let total = d.capacity();
    Ok((total, total.saturating_sub(used), used))
}

fn device_count(out: *mut c_uint) -> Res {
    let n = device_state()?.devices();
    // SAFETY: C out-pointer.
    unsafe { put(out, n) }
}

fn handle_by_index(i: c_uint, out: *mut NvmlDevice) -> Res {
    if i >= device_state()?.devices() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: C out-pointer.
    unsafe {
        put(
            out,
            (HANDLE_BASE + (i as usize + 1) * HANDLE_STEP) as NvmlDevice,
        )
    }
}

nvml_api! {
    fn nvmlInit_v2() { init() }
    fn nvmlInit() { init() }
    fn nvmlInitWithFlags(_flags: c_uint) { init() }

    fn nvmlShutdown() {
        INITS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    }

    fn nvmlDeviceGetCount_v2(count: *mut c_uint) { device_count(count) }
    fn nvmlDeviceGetCount(count: *mut c_uint) { device_count(count) }
    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, out: *mut NvmlDevice) { handle_by_index(i, out) }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, out: *mut NvmlDevice) { handle_by_index(i, out) }

    fn nvmlDeviceGetIndex(dev: NvmlDevice, out: *mut c_uint) {
        let i = index_of(dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, i) }
    }

    fn nvmlDeviceGetName(dev: NvmlDevice, name: *mut c_char, len: c_uint) {
        let i = index_of(dev)?;
        // SAFETY: caller buffer of len bytes.
        unsafe { put_str(name, len, &device_name(i)) }
    }

    fn nvmlDeviceGetUUID(dev: NvmlDevice, uuid: *mut c_char, len: c_uint) {
        let i = index_of(dev)?;
        let s = uuid_string(&device_uuid(&CONFIG.name, i));
        // SAFETY: caller buffer of len bytes.
        unsafe { put_str(uuid, len, &s) }
    }

    fn nvmlDeviceGetMemoryInfo(dev: NvmlDevice, mem: *mut NvmlMemory) {
        let (total, free, used) = memory(index_of(dev)?)?;
        // SAFETY: C out-pointer.
        unsafe { put(mem, NvmlMemory { total, free, used }) }
    }

    fn nvmlDeviceGetMemoryInfo_v2(dev: NvmlDevice, mem: *mut NvmlMemoryV2) {
        let i = index_of(dev)?;
        if mem.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null C in/out struct; the caller sets the version.
        let version = unsafe { std::ptr::addr_of!((*mem).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, free, used) = memory(i)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(mem, NvmlMemoryV2 { version, total, reserved: 0, free, used }) }
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfo) {
        processes(dev, count, infos)
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfo) {
        processes(dev, count, infos)
    }
    fn nvmlDeviceGetComputeRunningProcesses(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfo) {
        processes(dev, count, infos)
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) {
        // SAFETY: caller buffer of len bytes.
        unsafe { put_str(version, len, DRIVER_VERSION) }
    }

    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        // SAFETY: C out-pointer.
        unsafe { put(version, CUDA_DRIVER_VERSION) }
    }

    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        // SAFETY: C out-pointer.
        unsafe { put(version, CUDA_DRIVER_VERSION) }
    }

    fn nvmlDeviceGetPersistenceMode(_dev: NvmlDevice, _mode: *mut c_int) {
        Err(NVML_ERROR_NOT_SUPPORTED)
    }
}

/// Processes holding memory on the device; `*count` in: capacity of `infos`, out: needed.
fn processes(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfo) -> Res {
    let i = index_of(dev)? as usize;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let d = device_state()?;
    d.reclaim_dead();
    let list: Vec<NvmlProcessInfo> = d
        .processes()
        .into_iter()
        .filter(|p| p.used.get(i).copied().unwrap_or(0) > 0)
        .map(|p| NvmlProcessInfo {
            pid: p.pid,
            used_gpu_memory: p.used[i],
            gpu_instance_id: u32::MAX,
            compute_instance_id: u32::MAX,
        })
        .collect();
    // SAFETY: C in/out count.
    let cap = unsafe { count.read_unaligned() } as usize;
    // SAFETY: C in/out count.
    unsafe { put(count, list.len() as c_uint) }?;
    if cap < list.len() || (infos.is_null() && !list.is_empty()) {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, p) in list.iter().enumerate() {
        // SAFETY: infos holds cap >= list.len() entries.
        unsafe { infos.add(k).write_unaligned(*p) };
    }
    Ok(())
}

/// 1 once NVML has read (and reported on) the `VRAMSIM_*` variables, so a simulated driver
/// loaded later does not report a bad value a second time.
#[unsafe(no_mangle)]
pub extern "C" fn vramsimNvmlConfigParsed() -> c_int {
    CONFIG_PARSED.load(Ordering::Acquire) as c_int
}

/// `nvmlErrorString`: a static description, never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    ERRORS
        .iter()
        .find(|(c, _)| *c == result)
        .map_or(c"Unknown Error".as_ptr(), |(_, s)| s.as_ptr())
}

// nvmlDeviceGetMemoryLimits_v1 / nvmlDeviceSetMemoryLimits_v1.
mod limits;

// PyTorch's required NVML functions (PCI bus id lookup, NvLink/fabric: not supported).
mod pci;
