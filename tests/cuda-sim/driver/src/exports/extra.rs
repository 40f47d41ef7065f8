//! vramsim's own entry points: the "kernels" workloads launch and the device accounting tests
//! read. Also reachable through cuGetProcAddress under these names, at any version.

use std::ffi::{c_char, c_int, c_uint};

use crate::abi::*;
use crate::cu_api;
use crate::exports::memcpy::{launch_copy, launch_fill};
use crate::state;

/// What `vramsimDeviceStats` fills in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VramsimDeviceStats {
    pub capacity: u64,
    /// Bytes all live processes hold on the device now (context overheads included).
    pub used: u64,
    /// Most bytes ever held at once, by every process together.
    pub high_water: u64,
    /// Requests the device refused for lack of memory.
    pub refusals: u64,
    /// Bytes this process holds.
    pub used_by_self: u64,
}

fn stats_of(d: &vramsim_devstate::DeviceState, dev: c_int) -> Result<VramsimDeviceStats, CUresult> {
    if dev < 0 || dev as u32 >= d.devices() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let dev = dev as usize;
    let me = std::process::id();
    Ok(VramsimDeviceStats {
        capacity: d.capacity(),
        used: d.used(dev),
        high_water: d.high_water(dev),
        refusals: d.refusals(dev),
        used_by_self: d
            .processes()
            .iter()
            .find(|p| p.pid == me)
            .map_or(0, |p| p.used.get(dev).copied().unwrap_or(0)),
    })
}

cu_api! {
    /// Fills `bytes` at `dst` with `value` on stream `s` after `delay_us` (plus
    /// VRAMSIM_STREAM_DELAY).
    fn vramsimLaunchFill(s: CUstream, dst: CUdeviceptr, value: u8, bytes: usize, delay_us: c_uint) {
        launch_fill(s, dst, value, bytes, delay_us, false)
    }
    fn vramsimLaunchFill_ptsz(s: CUstream, dst: CUdeviceptr, value: u8, bytes: usize, delay_us: c_uint) {
        launch_fill(s, dst, value, bytes, delay_us, true)
    }
    /// Copies `bytes` from `src` to `dst` (both device memory) on stream `s` after `delay_us`.
    fn vramsimLaunchCopy(s: CUstream, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, delay_us: c_uint) {
        launch_copy(s, dst, src, bytes, delay_us, false)
    }
    fn vramsimLaunchCopy_ptsz(s: CUstream, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, delay_us: c_uint) {
        launch_copy(s, dst, src, bytes, delay_us, true)
    }

    /// Waits up to `ms` milliseconds for a call to stop at `VRAMSIM_PAUSE_IN`'s pause point:
    /// CUDA_SUCCESS when one did, CUDA_ERROR_NOT_READY when none did in time.
    fn vramsimPauseWait(ms: c_uint) {
        if crate::inject::pause_wait(std::time::Duration::from_millis(ms as u64)) {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }
    /// Lets the call stopped at the pause point go on.
    fn vramsimPauseRelease() {
        crate::inject::pause_release();
        Ok(())
    }

    /// Bytes all live processes hold on ordinal `dev` of this process's device (after cuInit).
    fn vramsimDeviceUsed(dev: c_int, bytes: *mut u64) {
        let st = stats_of(&state::driver()?.dev, state::physical(dev)? as c_int)?;
        // SAFETY: C out-pointer.
        unsafe { put(bytes, st.used) }
    }

    /// Most bytes ever held at once on ordinal `dev` by every process together (after cuInit).
    fn vramsimDeviceHighWater(dev: c_int, bytes: *mut u64) {
        let st = stats_of(&state::driver()?.dev, state::physical(dev)? as c_int)?;
        // SAFETY: C out-pointer.
        unsafe { put(bytes, st.high_water) }
    }

    /// Full accounting of physical device `dev` (numbered as NVML numbers devices, whatever
    /// `CUDA_VISIBLE_DEVICES` says) of the simulated device `name` (NULL: this process's
    /// VRAMSIM_NAME). Needs no cuInit, so a monitoring process can call it.
    fn vramsimDeviceStats(name: *const c_char, dev: c_int, out: *mut VramsimDeviceStats) {
        let name = if name.is_null() {
            crate::config::CONFIG.name.clone()
        } else {
            // SAFETY: C string argument.
            unsafe { cstr(name) }?.to_string()
        };
        let d = vramsim_devstate::DeviceState::open(&name).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let st = stats_of(&d, dev)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, st) }
    }
}

cu_api! {
    /// Totals of the calls this process made into the driver since it was loaded, by kind
    /// (`crate::calls`); this function itself is not counted.
    fn vramsimDriverCalls(out: *mut crate::calls::VramsimDriverCalls) {
        // SAFETY: C out-pointer.
        unsafe { put(out, crate::calls::snapshot()) }
    }
}

cu_api! {
    /// Panics inside the guard: proves a panic becomes CUDA_ERROR_UNKNOWN (999) instead of
    /// unwinding into C.
    fn vramsimSelfTestPanic() {
        panic!("vramsimSelfTestPanic: deliberate panic");
    }
}
