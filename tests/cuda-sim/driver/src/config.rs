//! `VRAMSIM_*` configuration, read once when the library loads.

use std::sync::LazyLock;
use std::time::Duration;

use vramsim_devstate::parse::{
    DURATION_FORMS, SIZE_FORMS, env_or, env_or_with, parse_duration, parse_size, warn_bad,
};
use vramsim_devstate::{DEFAULT_DEVICES, DEFAULT_MEMORY, DEFAULT_NAME, MAX_DEVICES};

use crate::inject::{FailRule, parse_fail, parse_latency};

/// The version cuDriverGetVersion reports; 13000 so runtimes of 12.x and 13.x both accept it
/// and cuGetProcAddress serves every cudaVersion they ask for.
pub const DEFAULT_DRIVER_VERSION: i32 = 13000;
pub const DEFAULT_CONTEXT_OVERHEAD: u64 = 300 << 20;

pub struct Config {
    pub name: String,
    pub devices: u32,
    pub memory: u64,
    pub context_overhead: u64,
    pub stream_delay: Duration,
    /// `VRAMSIM_KERNEL_NS`: how long each kernel launch occupies its stream (0: no time).
    pub kernel_time: Duration,
    pub driver_version: i32,
    /// (base name or "*", latency)
    pub latency: Vec<(String, Duration)>,
    pub fail: Vec<FailRule>,
    /// `VRAMSIM_DEBUG=1`: one stderr line per driver call (name and result).
    pub debug: bool,
    /// `VRAMSIM_PAUSE_IN=NAME`: the first call of driver function NAME (its base name) stops
    /// on entry until the test lets it go (`inject::pause_point`), for tests of interleavings.
    pub pause_in: Option<String>,
    /// `VRAMSIM_EXPORT_TABLES_FAULT`: a deliberate defect in the private export tables, for the
    /// tests that show NVIDIA's runtime depends on them.
    pub export_fault: ExportFault,
    /// `VRAMSIM_CAPTURED_FREE_FAULT=accept`: a stream-ordered free in a capture of memory no
    /// allocation node returned succeeds and does nothing (CUDA refuses it with
    /// CUDA_ERROR_INVALID_VALUE, the capture going on), for the tests of what a library does
    /// should a driver take such a free.
    pub captured_free_accepted: bool,
}

/// What `VRAMSIM_EXPORT_TABLES_FAULT` breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFault {
    None,
    /// `refuse`: cuGetExportTable answers CUDA_ERROR_NOT_FOUND for every table.
    Refuse,
    /// `integrity`: the integrity check's keyed-hash answer (not the fixed ones) has one bit
    /// flipped.
    Integrity,
}

pub static CONFIG: LazyLock<Config> = LazyLock::new(Config::from_env);

/// Whether the simulated NVML of this process already read (and reported on) the variables.
fn nvml_reported() -> bool {
    // SAFETY: RTLD_NOLOAD only looks the library up; the handle is closed again, and the
    // symbol, if present, is the simulated NVML's `int vramsimNvmlConfigParsed(void)`.
    unsafe {
        let h = libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        );
        if h.is_null() {
            return false;
        }
        let f = libc::dlsym(h, c"vramsimNvmlConfigParsed".as_ptr());
        let done = !f.is_null() && {
            let f: extern "C" fn() -> libc::c_int = std::mem::transmute(f);
            f() != 0
        };
        libc::dlclose(h);
        done
    }
}

impl Config {
    fn from_env() -> Self {
        // Variables NVML also reads are reported by whichever library reads them first.
        let shared_warn = !nvml_reported();
        let name = match std::env::var("VRAMSIM_NAME") {
            Ok(v) if !v.is_empty() && v.len() <= 200 => v,
            Ok(v) if !v.is_empty() => {
                warn_bad(
                    "VRAMSIM_NAME",
                    &v,
                    "a device name of at most 200 characters",
                );
                DEFAULT_NAME.to_string()
            }
            _ => DEFAULT_NAME.to_string(),
        };
        let devices = env_or_with(
            "VRAMSIM_DEVICES",
            DEFAULT_DEVICES,
            "a device count from 1 to 16",
            |s| {
                s.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_DEVICES as u32).contains(n))
            },
            shared_warn,
        );
        let memory = env_or_with(
            "VRAMSIM_MEMORY",
            DEFAULT_MEMORY,
            SIZE_FORMS,
            |s| parse_size(s).filter(|n| *n >= 2 << 20),
            shared_warn,
        );
        let context_overhead = env_or(
            "VRAMSIM_CONTEXT_OVERHEAD",
            DEFAULT_CONTEXT_OVERHEAD,
            SIZE_FORMS,
            parse_size,
        );
        let stream_delay = env_or(
            "VRAMSIM_STREAM_DELAY",
            Duration::ZERO,
            DURATION_FORMS,
            parse_duration,
        );
        let kernel_time = env_or(
            "VRAMSIM_KERNEL_NS",
            Duration::ZERO,
            "nanoseconds per kernel launch, e.g. 50000 (at most 10 s)",
            |s| {
                s.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= 10_000_000_000)
                    .map(Duration::from_nanos)
            },
        );
        let driver_version = env_or(
            "VRAMSIM_DRIVER_VERSION",
            DEFAULT_DRIVER_VERSION,
            "a CUDA version number such as 12080 or 13000",
            |s| {
                s.trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|v| (2000..100000).contains(v))
            },
        );
        let latency = env_or(
            "VRAMSIM_LATENCY",
            Vec::new(),
            "a comma-separated list of NAME=DURATION, e.g. cuMemAlloc=20us,cuMemMap=5us,*=1us",
            parse_latency,
        );
        let fail = env_or(
            "VRAMSIM_FAIL",
            Vec::new(),
            "a comma-separated list of NAME:nth=N or NAME:after=SIZE, e.g. cuMemCreate:nth=10,cuMemAlloc:after=4GiB",
            parse_fail,
        );
        let debug = env_or("VRAMSIM_DEBUG", false, "0 or 1", |s| match s.trim() {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        });
        let pause_in = env_or(
            "VRAMSIM_PAUSE_IN",
            None,
            "a driver function's name, e.g. cuMemCreate",
            |s| {
                let s = s.trim();
                (!s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
                    .then(|| Some(s.to_string()))
            },
        );
        let export_fault = env_or(
            "VRAMSIM_EXPORT_TABLES_FAULT",
            ExportFault::None,
            "refuse or integrity",
            |s| match s.trim() {
                "refuse" => Some(ExportFault::Refuse),
                "integrity" => Some(ExportFault::Integrity),
                _ => None,
            },
        );
        let captured_free_accepted = env_or("VRAMSIM_CAPTURED_FREE_FAULT", false, "accept", |s| {
            (s.trim() == "accept").then_some(true)
        });
        Self {
            debug,
            pause_in,
            export_fault,
            captured_free_accepted,
            name,
            devices,
            memory,
            context_overhead,
            stream_delay,
            kernel_time,
            driver_version,
            latency,
            fail,
        }
    }
}
