//! The NVML functions PyTorch's CUDA initialisation requires (c10/cuda/driver_api.cpp looks
//! them up when `libnvidia-ml.so.1` loads and fails without them): a device handle by PCI bus
//! id (the driver's `cuDeviceGetPCIBusId` form, `00000000:BB:00.0`, bus = ordinal + 1), and the
//! NvLink queries, which answer `NVML_ERROR_NOT_SUPPORTED` (no NvLink here), and the fabric
//! query (no fabric).
//! (File owned by the "pytorch" engineer; see docs/pytorch.md.)

use std::ffi::{CStr, c_char, c_uint, c_void};

use super::{NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED, NvmlDevice, NvmlReturn};
use super::{Res, device_state, guard, handle_by_index, index_of};

const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;

/// `[domain:]bus:device.function` in hex -> the device ordinal (bus - 1).
fn ordinal_of(bus_id: &str) -> Option<u32> {
    let parts: Vec<&str> = bus_id.trim().split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0", *b, *df),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let func = u32::from_str_radix(func, 16).ok()?;
    (domain == 0 && dev == 0 && func == 0 && bus >= 1).then(|| bus - 1)
}

fn handle_by_pci_bus_id(id: *const c_char, out: *mut NvmlDevice) -> Result<(), NvmlReturn> {
    if id.is_null() || out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let n = device_state()?.devices();
    // SAFETY: NUL-terminated string from the caller.
    let s = unsafe { CStr::from_ptr(id) }.to_string_lossy();
    match ordinal_of(&s) {
        Some(i) if i < n => handle_by_index(i, out),
        _ => Err(NVML_ERROR_NOT_FOUND),
    }
}

fn not_supported(dev: NvmlDevice) -> Result<(), NvmlReturn> {
    index_of(dev)?;
    Err(NVML_ERROR_NOT_SUPPORTED)
}

/// `nvmlDeviceGetGpuFabricInfoV`: success with state `NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`
/// (0), as a GPU outside an NvSwitch fabric reports. `nvmlGpuFabricInfo_v2_t`: version (set by
/// the caller), clusterUuid[16], status, cliqueId, state (unsigned char), healthMask: 36 bytes;
/// everything after the version is zeroed.
fn fabric_info_v(dev: NvmlDevice, info: *mut c_void) -> Result<(), NvmlReturn> {
    index_of(dev)?;
    if info.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller passes an nvmlGpuFabricInfoV_t (36 bytes, v1 32).
    unsafe { std::ptr::write_bytes((info as *mut u8).add(4), 0, 28) };
    Ok(())
}

nvml_api! {
    fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, out: *mut NvmlDevice) { handle_by_pci_bus_id(id, out) }
    fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, out: *mut NvmlDevice) { handle_by_pci_bus_id(id, out) }
    fn nvmlDeviceGetNvLinkRemoteDeviceType(dev: NvmlDevice, _link: c_uint, _ty: *mut c_uint) { not_supported(dev) }
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(dev: NvmlDevice, _link: c_uint, _pci: *mut c_void) { not_supported(dev) }
    fn nvmlDeviceGetNvLinkRemotePciInfo(dev: NvmlDevice, _link: c_uint, _pci: *mut c_void) { not_supported(dev) }
    fn nvmlDeviceGetGpuFabricInfoV(dev: NvmlDevice, info: *mut c_void) { fabric_info_v(dev, info) }
    fn nvmlDeviceGetGpuFabricInfo(dev: NvmlDevice, _info: *mut c_void) { not_supported(dev) }
}

#[cfg(test)]
mod tests {
    use super::ordinal_of;

    #[test]
    fn bus_ids() {
        assert_eq!(ordinal_of("00000000:01:00.0"), Some(0));
        assert_eq!(ordinal_of("0000:0A:00.0"), Some(9));
        assert_eq!(ordinal_of("02:00.0"), Some(1));
        assert_eq!(ordinal_of("00000000:00:00.0"), None);
        assert_eq!(ordinal_of("00000001:01:00.0"), None);
        assert_eq!(ordinal_of("garbage"), None);
    }
}
