//! Process-wide driver state: initialisation and this process's slot in the device region.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use vramsim_devstate::{DeviceState, SlotId};

use crate::abi::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_OUT_OF_MEMORY, CUresult, Res,
};
use crate::config::CONFIG;

pub struct Driver {
    pub dev: DeviceState,
    /// Physical device index of each ordinal (`CUDA_VISIBLE_DEVICES`, read at cuInit).
    visible: Vec<u32>,
    /// (pid, slot): a forked child gets its own slot on its first charge.
    slot: Mutex<Option<(u32, SlotId)>>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();
static INITIALIZED: AtomicBool = AtomicBool::new(false);
/// Set at exit once the slot is given back: later frees must not touch a slot that another
/// process may already have claimed.
static EXITED: AtomicBool = AtomicBool::new(false);
/// Set in the child of a fork made after cuInit: as with a real driver, CUDA is unusable
/// there (stream workers and locks of the parent did not come along).
static FORKED_AFTER_INIT: AtomicBool = AtomicBool::new(false);

/// pthread_atfork child handler.
pub fn after_fork_in_child() {
    if INITIALIZED.load(Ordering::Acquire) {
        FORKED_AFTER_INIT.store(true, Ordering::Release);
    }
}

/// cuInit: opens the shared device.
pub fn init() -> Res {
    if FORKED_AFTER_INIT.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let r = DRIVER.get_or_init(|| {
        let cfg = &*CONFIG;
        let visible = crate::visible::parse(
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            cfg.devices,
            &|d| vramsim_devstate::uuid_string(&vramsim_devstate::device_uuid(&cfg.name, d)),
        );
        if visible.is_empty() {
            return Err(CUDA_ERROR_NO_DEVICE);
        }
        match DeviceState::open_or_create(&cfg.name, cfg.devices, cfg.memory) {
            Ok(dev) => Ok(Driver {
                dev,
                visible,
                slot: Mutex::new(None),
            }),
            Err(e) => {
                eprintln!(
                    "vramsim: cannot open the simulated device {:?} ({}): {e}",
                    cfg.name,
                    DeviceState::path(&cfg.name).display()
                );
                Err(CUDA_ERROR_NO_DEVICE)
            }
        }
    });
    match r {
        Ok(_) => {
            INITIALIZED.store(true, Ordering::Release);
            Ok(())
        }
        Err(e) => Err(*e),
    }
}

/// The driver, or CUDA_ERROR_NOT_INITIALIZED before a successful cuInit.
pub fn driver() -> Result<&'static Driver, CUresult> {
    if FORKED_AFTER_INIT.load(Ordering::Acquire) || !INITIALIZED.load(Ordering::Acquire) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

pub fn device_count() -> Result<i32, CUresult> {
    Ok(driver()?.visible.len() as i32)
}

/// The physical device behind ordinal `dev` (what the shared device state, NVML, the PCI bus
/// id and the UUID are indexed by).
pub fn physical(dev: i32) -> Result<usize, CUresult> {
    let d = driver()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| d.visible.get(i))
        .map(|&p| p as usize)
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

pub fn check_device(dev: i32) -> Res {
    if dev < 0 || dev >= device_count()? {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(())
}

pub fn capacity() -> u64 {
    driver().map_or(0, |d| d.dev.capacity())
}

impl Driver {
    fn slot(&self) -> Option<SlotId> {
        if EXITED.load(Ordering::Acquire) {
            return None;
        }
        let pid = std::process::id();
        let mut g = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        match *g {
            Some((p, s)) if p == pid => Some(s),
            _ => {
                let s = self.dev.claim_slot()?;
                *g = Some((pid, s));
                Some(s)
            }
        }
    }

    /// Charges `bytes` to device `dev`; OUT_OF_MEMORY at capacity.
    pub fn charge(&self, dev: i32, bytes: u64) -> Res {
        if bytes == 0 {
            return Ok(());
        }
        let phys = *self
            .visible
            .get(dev as usize)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)? as usize;
        let slot = self.slot().ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        if self.dev.reserve(slot, phys, bytes) {
            Ok(())
        } else {
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }

    pub fn uncharge(&self, dev: i32, bytes: u64) {
        if let (Some(slot), Some(&phys)) = (self.slot(), self.visible.get(dev as usize)) {
            self.dev.release(slot, phys as usize, bytes);
        }
    }
}

pub fn charge(dev: i32, bytes: u64) -> Res {
    driver()?.charge(dev, bytes)
}

pub fn uncharge(dev: i32, bytes: u64) {
    if let Ok(d) = driver() {
        d.uncharge(dev, bytes);
    }
}

/// atexit: a real driver frees everything a process held when it exits.
pub fn process_exit() {
    if let Some(Ok(d)) = DRIVER.get() {
        let mut g = d.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((pid, s)) = *g
            && pid == std::process::id()
        {
            EXITED.store(true, Ordering::Release);
            *g = None;
            d.dev.release_slot(s);
        }
    }
}
