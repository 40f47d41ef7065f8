//! NVML's per-device memory limits (driver r615+): `nvmlDeviceGetMemoryLimits_v1` and
//! `nvmlDeviceSetMemoryLimits_v1` with `nvmlGetMemoryLimits_v1_t` / `nvmlSetMemoryLimits_v1_t`
//! `{ char *nameSpace; unsigned long long softLimit, hardLimit, currentUsed; }` (the layout of
//! NVIDIA's own bindings). Limits come from `VRAMSIM_NVML_MEMORY_LIMITS` (`N=HARD[/SOFT]`,
//! comma-separated, N an NVML index); a device without one answers `NVML_ERROR_NOT_SUPPORTED`,
//! as a driver without the feature would. A set is kept for this process only (the sim has
//! no daemon to hold it node-wide).

use std::ffi::c_char;
use std::sync::{LazyLock, Mutex};

use vramsim_devstate::MAX_DEVICES;
use vramsim_devstate::parse::{SIZE_FORMS, parse_size};

use super::{
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NvmlDevice, NvmlReturn, Res, guard,
    index_of, memory, put,
};

/// `nvmlGetMemoryLimits_v1_t` (and the setter's struct, the same fields).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NvmlMemoryLimitsV1 {
    pub name_space: *mut c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
    pub current_used: u64,
}

/// (soft, hard) per NVML index; 0 = none.
type Table = [Option<(u64, u64)>; MAX_DEVICES];

/// `VRAMSIM_NVML_MEMORY_LIMITS`: `N=HARD[/SOFT]`, comma-separated. A bad entry is said once
/// on stderr (what, the accepted forms) and skipped.
fn parse(v: &str) -> Result<Table, String> {
    let mut t: Table = [None; MAX_DEVICES];
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (i, rest) = part
            .split_once('=')
            .ok_or_else(|| format!("\"{part}\" has no '='"))?;
        let i: usize = i
            .trim()
            .parse()
            .ok()
            .filter(|&i| i < MAX_DEVICES)
            .ok_or_else(|| format!("\"{i}\" is not a device index from 0 to 15"))?;
        let (hard, soft) = rest.split_once('/').unwrap_or((rest, "0"));
        let size = |s: &str| parse_size(s.trim()).ok_or_else(|| format!("\"{s}\": {SIZE_FORMS}"));
        t[i] = Some((size(soft)?, size(hard)?));
    }
    Ok(t)
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    let v = std::env::var("VRAMSIM_NVML_MEMORY_LIMITS").unwrap_or_default();
    Mutex::new(parse(&v).unwrap_or_else(|why| {
        eprintln!(
            "vramsim: VRAMSIM_NVML_MEMORY_LIMITS=\"{}\" is not valid ({why}); accepted: N=HARD[/SOFT] entries, comma-separated (0=8GiB/6GiB,1=4GiB); no NVML memory limits",
            v.escape_debug()
        );
        [None; MAX_DEVICES]
    }))
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

fn get(dev: NvmlDevice, out: *mut NvmlMemoryLimitsV1) -> Res {
    let i = index_of(dev)?;
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let (soft, hard) = table()[i as usize].ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    let (_, _, used) = memory(i)?;
    // SAFETY: non-null C in/out struct; nameSpace is the caller's (NULL: the device's own).
    let name_space = unsafe { std::ptr::addr_of!((*out).name_space).read_unaligned() };
    // SAFETY: C out-pointer, checked above.
    unsafe {
        put(
            out,
            NvmlMemoryLimitsV1 {
                name_space,
                soft_limit: soft,
                hard_limit: hard,
                current_used: used,
            },
        )
    }
}

fn set(dev: NvmlDevice, limits: *const NvmlMemoryLimitsV1) -> Res {
    let i = index_of(dev)?;
    if limits.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null C struct.
    let l = unsafe { limits.read_unaligned() };
    if l.soft_limit > l.hard_limit && l.hard_limit != 0 {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    table()[i as usize] = Some((l.soft_limit, l.hard_limit));
    Ok(())
}

#[unsafe(no_mangle)]
#[allow(clippy::missing_safety_doc, non_snake_case)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    dev: NvmlDevice,
    limits: *mut NvmlMemoryLimitsV1,
) -> NvmlReturn {
    guard(move || get(dev, limits))
}

#[unsafe(no_mangle)]
#[allow(clippy::missing_safety_doc, non_snake_case)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    dev: NvmlDevice,
    limits: *const NvmlMemoryLimitsV1,
) -> NvmlReturn {
    guard(move || set(dev, limits))
}

#[cfg(test)]
mod tests {
    #[test]
    fn forms() {
        let t = super::parse("0=8GiB/6GiB, 1=4GiB").unwrap();
        assert_eq!(t[0], Some((6 << 30, 8 << 30)));
        assert_eq!(t[1], Some((0, 4 << 30)));
        assert!(super::parse("x=1").is_err());
        assert!(super::parse("16=1GiB").is_err());
        assert!(super::parse("0=lots").is_err());
    }
}
