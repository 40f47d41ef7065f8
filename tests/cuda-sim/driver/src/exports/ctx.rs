//! Primary and created contexts.

use std::ffi::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::ctx;
use crate::cu_api;
use crate::state;
use crate::stream;

fn create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let c = ctx::create(dev, flags)?;
    // SAFETY: C out-pointer, checked above.
    unsafe { put(pctx, c) }
}

fn release(dev: CUdevice) -> Res {
    ctx::primary_release(dev)
}

fn reset(dev: CUdevice) -> Res {
    ctx::primary_reset(dev)
}

fn set_flags(dev: CUdevice, flags: c_uint) -> Res {
    ctx::primary_set_flags(dev, flags)
}

fn pop(pctx: *mut CUcontext) -> Res {
    state::driver()?;
    let c = ctx::pop()?;
    if !pctx.is_null() {
        // SAFETY: optional C out-pointer, non-null.
        unsafe { put(pctx, c) }?;
    }
    Ok(())
}

fn push(c: CUcontext) -> Res {
    state::driver()?;
    ctx::push(c)
}

fn destroy(c: CUcontext) -> Res {
    state::driver()?;
    ctx::destroy(c)
}

cu_api! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = ctx::primary_retain(dev)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(pctx, c) }
    }
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) { release(dev) }
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) { release(dev) }
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) { reset(dev) }
    fn cuDevicePrimaryCtxReset(dev: CUdevice) { reset(dev) }
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) { set_flags(dev, flags) }
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) { set_flags(dev, flags) }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let (f, a) = ctx::primary_state(dev)?;
        // SAFETY: C out-pointers.
        unsafe {
            put(flags, f)?;
            put(active, a as c_int)
        }
    }

    fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) { create(pctx, flags, dev) }
    fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) { create(pctx, flags, dev) }
    fn cuCtxCreate_v3(pctx: *mut CUcontext, _params: *mut c_void, _n: c_int, flags: c_uint, dev: CUdevice) {
        create(pctx, flags, dev)
    }
    fn cuCtxCreate_v4(pctx: *mut CUcontext, _params: *mut c_void, flags: c_uint, dev: CUdevice) {
        create(pctx, flags, dev)
    }
    fn cuCtxDestroy_v2(c: CUcontext) { destroy(c) }
    fn cuCtxDestroy(c: CUcontext) { destroy(c) }
    fn cuCtxPushCurrent_v2(c: CUcontext) { push(c) }
    fn cuCtxPushCurrent(c: CUcontext) { push(c) }
    fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) { pop(pctx) }
    fn cuCtxPopCurrent(pctx: *mut CUcontext) { pop(pctx) }

    fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        state::driver()?;
        // SAFETY: C out-pointer.
        unsafe { put(pctx, ctx::get_current()) }
    }

    fn cuCtxSetCurrent(c: CUcontext) {
        state::driver()?;
        ctx::set_current(c)
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = ctx::current_device()?;
        // SAFETY: C out-pointer.
        unsafe { put(dev, d) }
    }

    fn cuCtxGetFlags(flags: *mut c_uint) {
        ctx::current_device()?;
        // SAFETY: C out-pointer.
        unsafe { put(flags, ctx::flags_of_current()?) }
    }

    fn cuCtxSetFlags(_flags: c_uint) {
        ctx::current_device().map(|_| ())
    }

    fn cuCtxGetId(c: CUcontext, id: *mut u64) {
        let c = if c.is_null() { ctx::get_current() } else { c };
        ctx::device_of(c)?;
        // SAFETY: C out-pointer.
        unsafe { put(id, c as u64) }
    }

    fn cuCtxGetApiVersion(c: CUcontext, version: *mut c_uint) {
        let c = if c.is_null() { ctx::get_current() } else { c };
        ctx::device_of(c)?;
        // SAFETY: C out-pointer.
        unsafe { put(version, 12000) }
    }

    fn cuCtxSynchronize() {
        let dev = ctx::current_device()?;
        stream::ctx_sync_check(dev)?;
        stream::synchronize_all();
        Ok(())
    }

    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        ctx::current_device()?;
        // Either pointer may be NULL.
        if !least.is_null() {
            // SAFETY: non-null C out-pointer.
            unsafe { put(least, 0) }?;
        }
        if !greatest.is_null() {
            // SAFETY: non-null C out-pointer.
            unsafe { put(greatest, -5) }?;
        }
        Ok(())
    }

    fn cuCtxGetLimit(value: *mut usize, limit: c_int) {
        ctx::current_device()?;
        let v = match limit {
            0 => 1024,       // STACK_SIZE
            1 => 1 << 20,    // PRINTF_FIFO_SIZE
            2 => 8 << 20,    // MALLOC_HEAP_SIZE
            3 => 2,          // DEV_RUNTIME_SYNC_DEPTH
            4 => 2048,       // DEV_RUNTIME_PENDING_LAUNCH_COUNT
            5 => 32,         // MAX_L2_FETCH_GRANULARITY
            6 => 0,          // PERSISTING_L2_CACHE_SIZE
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: C out-pointer.
        unsafe { put(value, v) }
    }

    fn cuCtxSetLimit(_limit: c_int, _value: usize) {
        ctx::current_device().map(|_| ())
    }

    fn cuCtxGetCacheConfig(config: *mut c_int) {
        ctx::current_device()?;
        // SAFETY: C out-pointer.
        unsafe { put(config, 0) }
    }

    fn cuCtxSetCacheConfig(_config: c_int) {
        ctx::current_device().map(|_| ())
    }

    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) {
        ctx::current_device()?;
        let owner = ctx::device_of(peer)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        ctx::enable_peer(owner)
    }

    fn cuCtxDisablePeerAccess(peer: CUcontext) {
        ctx::current_device()?;
        ctx::disable_peer(ctx::device_of(peer)?)
    }
}
