//! Contexts: one primary context per device plus created ones, the per-thread current
//! context and its stack. The first live context of the process on a device charges the
//! per-context overhead (`VRAMSIM_CONTEXT_OVERHEAD`), the last one to go gives it back.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::Mutex;

use vramsim_devstate::MAX_DEVICES;

use crate::abi::{CUDA_ERROR_INVALID_CONTEXT, CUcontext, CUresult, Res};
use crate::config::CONFIG;
use crate::state;

/// Handles are small integers dressed as pointers; never dereferenced by anyone.
const HANDLE_BASE: usize = 0x7c0d_0000_0000;
const HANDLE_STEP: usize = 0x100;

struct Ctx {
    dev: i32,
    flags: u32,
    /// Created contexts die on destroy; primary ones live while retained.
    alive: bool,
    primary: bool,
}

struct Table {
    ctxs: Vec<Ctx>,
    primary: [Option<usize>; MAX_DEVICES],
    primary_refs: [u32; MAX_DEVICES],
    primary_flags: [u32; MAX_DEVICES],
    live_per_dev: [u32; MAX_DEVICES],
    /// `peers[a]` bit `o`: device `a` may reach device `o`'s linear memory
    /// (`cuCtxEnablePeerAccess`). Kept per device pair, not per context: the primary context
    /// is the only one most programs have.
    peers: [u16; MAX_DEVICES],
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    ctxs: Vec::new(),
    primary: [None; MAX_DEVICES],
    primary_refs: [0; MAX_DEVICES],
    primary_flags: [0; MAX_DEVICES],
    live_per_dev: [0; MAX_DEVICES],
    peers: [0; MAX_DEVICES],
});

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

fn handle(idx: usize) -> CUcontext {
    (HANDLE_BASE + (idx + 1) * HANDLE_STEP) as *mut c_void
}

fn index(h: CUcontext) -> Option<usize> {
    let v = h as usize;
    if v <= HANDLE_BASE || !(v - HANDLE_BASE).is_multiple_of(HANDLE_STEP) {
        return None;
    }
    Some((v - HANDLE_BASE) / HANDLE_STEP - 1)
}

/// Called with the table locked when a context of `dev` comes alive.
fn activate(t: &mut Table, dev: i32) -> Res {
    let d = dev as usize;
    if t.live_per_dev[d] == 0 {
        state::charge(dev, CONFIG.context_overhead)?;
    }
    t.live_per_dev[d] += 1;
    Ok(())
}

fn deactivate(t: &mut Table, dev: i32) {
    let d = dev as usize;
    t.live_per_dev[d] = t.live_per_dev[d].saturating_sub(1);
    if t.live_per_dev[d] == 0 {
        state::uncharge(dev, CONFIG.context_overhead);
    }
}

pub fn primary_retain(dev: i32) -> Result<CUcontext, CUresult> {
    state::check_device(dev)?;
    let mut t = table();
    let d = dev as usize;
    let idx = match t.primary[d] {
        Some(i) => i,
        None => {
            let flags = t.primary_flags[d];
            t.ctxs.push(Ctx {
                dev,
                flags,
                alive: false,
                primary: true,
            });
            let i = t.ctxs.len() - 1;
            t.primary[d] = Some(i);
            i
        }
    };
    if t.primary_refs[d] == 0 {
        activate(&mut t, dev)?;
        t.ctxs[idx].alive = true;
        t.ctxs[idx].flags = t.primary_flags[d];
    }
    t.primary_refs[d] += 1;
    Ok(handle(idx))
}

pub fn primary_release(dev: i32) -> Res {
    state::check_device(dev)?;
    let mut t = table();
    let d = dev as usize;
    if t.primary_refs[d] == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    t.primary_refs[d] -= 1;
    if t.primary_refs[d] == 0 {
        deactivate_primary(&mut t, dev);
        let gone = t.primary[d].map(|i| handle(i) as usize);
        drop(t);
        if let Some(h) = gone {
            crate::export_tables::context_gone(h);
        }
    }
    Ok(())
}

fn deactivate_primary(t: &mut Table, dev: i32) {
    if let Some(i) = t.primary[dev as usize]
        && t.ctxs[i].alive
    {
        t.ctxs[i].alive = false;
        // Allocations are per device here, not per context: keep them while another context
        // of the device lives.
        if !t.ctxs.iter().any(|c| c.alive && c.dev == dev) {
            drop_context_resources(dev);
        }
        deactivate(t, dev);
        forget_peers(t, dev);
    }
}

/// A device's context died: no peer access from it or to it remains.
fn forget_peers(t: &mut Table, dev: i32) {
    t.peers[dev as usize] = 0;
    for p in t.peers.iter_mut() {
        *p &= !(1 << dev);
    }
}

/// cuCtxEnablePeerAccess: the current context's device may reach `owner`'s linear memory.
pub fn enable_peer(owner: i32) -> Res {
    let me = current_device()?;
    if me == owner {
        return Err(crate::abi::CUDA_ERROR_INVALID_DEVICE);
    }
    let mut t = table();
    let bit = 1u16 << owner;
    if t.peers[me as usize] & bit != 0 {
        return Err(crate::abi::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    }
    t.peers[me as usize] |= bit;
    Ok(())
}

/// cuCtxDisablePeerAccess.
pub fn disable_peer(owner: i32) -> Res {
    let me = current_device()?;
    let mut t = table();
    let bit = 1u16 << owner;
    if t.peers[me as usize] & bit == 0 {
        return Err(crate::abi::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    }
    t.peers[me as usize] &= !bit;
    Ok(())
}

/// May work of device `accessor` touch device `owner`'s linear memory?
pub fn peer_enabled(accessor: i32, owner: i32) -> bool {
    accessor == owner
        || table()
            .peers
            .get(accessor as usize)
            .is_some_and(|p| owner >= 0 && p & (1 << owner) != 0)
}

/// What a context takes with it: its memory (linear allocations and pools of the device).
fn drop_context_resources(dev: i32) {
    crate::stream::synchronize_all();
    crate::mem::free_all_on_device(dev);
    crate::pool::reset_device(dev);
}

/// cuDevicePrimaryCtxReset: destroys the primary context's resources now, whatever its refs.
pub fn primary_reset(dev: i32) -> Res {
    state::check_device(dev)?;
    let mut t = table();
    t.primary_refs[dev as usize] = 0;
    deactivate_primary(&mut t, dev);
    let gone = t.primary[dev as usize].map(|i| handle(i) as usize);
    drop(t);
    if let Some(h) = gone {
        crate::export_tables::context_gone(h);
    }
    Ok(())
}

pub fn primary_state(dev: i32) -> Result<(u32, bool), CUresult> {
    state::check_device(dev)?;
    let t = table();
    let d = dev as usize;
    Ok((t.primary_flags[d], t.primary_refs[d] > 0))
}

pub fn primary_set_flags(dev: i32, flags: u32) -> Res {
    state::check_device(dev)?;
    let mut t = table();
    t.primary_flags[dev as usize] = flags;
    if let Some(i) = t.primary[dev as usize] {
        t.ctxs[i].flags = flags;
    }
    Ok(())
}

pub fn create(dev: i32, flags: u32) -> Result<CUcontext, CUresult> {
    state::check_device(dev)?;
    let mut t = table();
    activate(&mut t, dev)?;
    t.ctxs.push(Ctx {
        dev,
        flags,
        alive: true,
        primary: false,
    });
    let h = handle(t.ctxs.len() - 1);
    drop(t);
    // cuCtxCreate makes the new context current (pushes it).
    push(h)?;
    Ok(h)
}

pub fn destroy(h: CUcontext) -> Res {
    let idx = index(h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let mut t = table();
    let c = t.ctxs.get(idx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !c.alive || c.primary {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let dev = c.dev;
    t.ctxs[idx].alive = false;
    let others_alive = t.ctxs.iter().any(|c| c.alive && c.dev == dev);
    if !others_alive {
        drop_context_resources(dev);
    }
    deactivate(&mut t, dev);
    drop(t);
    crate::export_tables::context_gone(h as usize);
    if current_raw() == h as usize {
        CURRENT.with(|c| c.set(0));
    }
    Ok(())
}

fn validate(h: CUcontext) -> Result<i32, CUresult> {
    let idx = index(h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let t = table();
    match t.ctxs.get(idx) {
        Some(c) if c.alive => Ok(c.dev),
        _ => Err(CUDA_ERROR_INVALID_CONTEXT),
    }
}

fn current_raw() -> usize {
    CURRENT.try_with(|c| c.get()).unwrap_or(0)
}

pub fn get_current() -> CUcontext {
    current_raw() as CUcontext
}

pub fn set_current(h: CUcontext) -> Res {
    if !h.is_null() {
        validate(h)?;
    }
    CURRENT.with(|c| c.set(h as usize));
    Ok(())
}

pub fn push(h: CUcontext) -> Res {
    validate(h)?;
    let prev = current_raw();
    STACK.with(|s| s.borrow_mut().push(prev));
    CURRENT.with(|c| c.set(h as usize));
    Ok(())
}

pub fn pop() -> Result<CUcontext, CUresult> {
    let cur = current_raw();
    if cur == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let prev = STACK.with(|s| s.borrow_mut().pop()).unwrap_or(0);
    CURRENT.with(|c| c.set(prev));
    Ok(cur as CUcontext)
}

/// Device of the current context; INVALID_CONTEXT when there is none (or it died).
pub fn current_device() -> Result<i32, CUresult> {
    state::driver()?;
    let cur = current_raw();
    if cur == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    validate(cur as CUcontext)
}

pub fn device_of(h: CUcontext) -> Result<i32, CUresult> {
    validate(h)
}

pub fn flags_of_current() -> Result<u32, CUresult> {
    let idx = index(get_current()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    Ok(table().ctxs.get(idx).map_or(0, |c| c.flags))
}

/// The primary context handle of `dev` if the process has one alive (for pointer attributes).
pub fn primary_handle(dev: i32) -> CUcontext {
    let t = table();
    match t.primary.get(dev as usize).copied().flatten() {
        Some(i) if t.ctxs[i].alive => handle(i),
        _ => std::ptr::null_mut(),
    }
}
