//! Streams, events, capture, host functions and kernel launches.

use std::ffi::{c_int, c_uint, c_void};
use std::time::Duration;

use crate::abi::*;
use crate::ctx;
use crate::cu_api;
use crate::stream::{self, SendPtr};

type HostFn = unsafe extern "C" fn(*mut c_void);
type StreamCallback = unsafe extern "C" fn(CUstream, CUresult, *mut c_void);

fn synchronize(h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    stream::legacy_check(&s)?;
    stream::capture_unsafe_check(Some(&s))?;
    s.synchronize();
    Ok(())
}

fn query(h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    stream::legacy_check(&s)?;
    stream::capture_unsafe_check(Some(&s))?;
    if s.idle() {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}

fn wait_event(h: CUstream, e: CUevent, flags: c_uint, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    let ev = stream::event(e)?;
    stream::legacy_check(&s)?;
    stream::wait_check(&s, &ev, flags)?;
    ev.wait_on(&s);
    Ok(())
}

fn record(e: CUevent, h: CUstream, ptds: bool) -> Res {
    let ev = stream::event(e)?;
    let s = stream::resolve(h, ptds)?;
    stream::legacy_check(&s)?;
    ev.record(&s);
    Ok(())
}

fn priority(h: CUstream, out: *mut c_int, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    // SAFETY: C out-pointer.
    unsafe { put(out, s.priority) }
}

fn flags(h: CUstream, out: *mut c_uint, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    // SAFETY: C out-pointer.
    unsafe { put(out, s.flags) }
}

fn host_func(h: CUstream, f: Option<HostFn>, data: *mut c_void, ptds: bool) -> Res {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let s = stream::resolve(h, ptds)?;
    let d = SendPtr(data as usize);
    stream::run_async(
        &s,
        Duration::ZERO,
        Box::new(move || {
            let d = d;
            // SAFETY: the caller's host function with its own user data, as CUDA calls it.
            unsafe { f(d.0 as *mut c_void) }
        }),
    )
}

fn add_callback(h: CUstream, cb: Option<StreamCallback>, data: *mut c_void, ptds: bool) -> Res {
    let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let s = stream::resolve(h, ptds)?;
    let (d, sh) = (SendPtr(data as usize), SendPtr(h as usize));
    stream::run_async(
        &s,
        Duration::ZERO,
        Box::new(move || {
            let (d, sh) = (d, sh);
            // SAFETY: the caller's callback with its own user data, as CUDA calls it.
            unsafe { cb(sh.0 as CUstream, CUDA_SUCCESS, d.0 as *mut c_void) }
        }),
    )
}

fn begin_capture(h: CUstream, mode: c_int, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    stream::begin_capture(&s, mode)
}

/// `cuStreamBeginCaptureToGraph`: the capture's nodes are added to `graph` at its end.
/// Dependencies on the graph's nodes are not simulated (the graph exposes no node handles):
/// only none is accepted.
fn begin_capture_to_graph(h: CUstream, graph: CUgraph, n: usize, mode: c_int, ptds: bool) -> Res {
    if !crate::graph::exists(graph) || n > 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = stream::resolve(h, ptds)?;
    stream::begin_capture_into(&s, mode, graph as usize)
}

fn end_capture(h: CUstream, graph: *mut *mut c_void, ptds: bool) -> Res {
    if graph.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = stream::resolve(h, ptds)?;
    let r = stream::end_capture(&s);
    // SAFETY: C out-pointer, checked above.
    unsafe { put(graph, *r.as_ref().unwrap_or(&std::ptr::null_mut())) }?;
    r.map(|_| ())
}

fn is_capturing(h: CUstream, status: *mut c_int, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    // SAFETY: C out-pointer.
    unsafe { put(status, s.capture().status) }
}

/// cuStreamGetCaptureInfo v1/v2/v3 share their first three out-parameters; the rest (graph,
/// dependencies, edge data, count) report an empty capture.
///
/// # Safety
/// Pointers are NULL or valid out-parameters of the named types.
#[allow(clippy::too_many_arguments)]
unsafe fn capture_info(
    h: CUstream,
    ptds: bool,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    num: *mut usize,
) -> Res {
    let s = stream::resolve(h, ptds)?;
    let c = s.capture();
    // SAFETY: out-parameters per the caller's contract; the optional ones may be NULL.
    unsafe {
        put(status, c.status)?;
        if !id.is_null() {
            put(id, c.id)?;
        }
        if !graph.is_null() {
            put(graph, std::ptr::null_mut())?;
        }
        if !deps.is_null() {
            put(deps, std::ptr::null())?;
        }
        if !edges.is_null() {
            put(edges, std::ptr::null())?;
        }
        if !num.is_null() {
            put(num, 0)?;
        }
    }
    Ok(())
}

type N = *mut c_void;

cu_api! {
    fn cuStreamCreate(out: *mut CUstream, flags: c_uint) {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = stream::create(flags, 0)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, s) }
    }

    fn cuStreamCreateWithPriority(out: *mut CUstream, flags: c_uint, priority: c_int) {
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = stream::create(flags, priority)?;
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, s) }
    }

    fn cuStreamDestroy_v2(s: CUstream) { ctx::current_device()?; stream::destroy(s) }
    fn cuStreamDestroy(s: CUstream) { ctx::current_device()?; stream::destroy(s) }
    fn cuStreamSynchronize(s: CUstream) { synchronize(s, false) }
    fn cuStreamSynchronize_ptsz(s: CUstream) { synchronize(s, true) }
    fn cuStreamQuery(s: CUstream) { query(s, false) }
    fn cuStreamQuery_ptsz(s: CUstream) { query(s, true) }
    fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) { wait_event(s, e, flags, false) }
    fn cuStreamWaitEvent_ptsz(s: CUstream, e: CUevent, flags: c_uint) { wait_event(s, e, flags, true) }
    fn cuStreamGetPriority(s: CUstream, p: *mut c_int) { priority(s, p, false) }
    fn cuStreamGetPriority_ptsz(s: CUstream, p: *mut c_int) { priority(s, p, true) }
    fn cuStreamGetFlags(s: CUstream, f: *mut c_uint) { flags(s, f, false) }
    fn cuStreamGetFlags_ptsz(s: CUstream, f: *mut c_uint) { flags(s, f, true) }
    fn cuStreamGetCtx(s: CUstream, out: *mut CUcontext) {
        let st = stream::resolve(s, false)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, ctx::primary_handle(st.dev)) }
    }
    fn cuStreamGetId(s: CUstream, out: *mut u64) {
        let st = stream::resolve(s, false)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, st.handle as u64) }
    }
    fn cuLaunchHostFunc(s: CUstream, f: Option<HostFn>, data: *mut c_void) { host_func(s, f, data, false) }
    fn cuLaunchHostFunc_ptsz(s: CUstream, f: Option<HostFn>, data: *mut c_void) { host_func(s, f, data, true) }
    fn cuStreamAddCallback(s: CUstream, cb: Option<StreamCallback>, data: *mut c_void, _flags: c_uint) {
        add_callback(s, cb, data, false)
    }
    fn cuStreamAddCallback_ptsz(s: CUstream, cb: Option<StreamCallback>, data: *mut c_void, _flags: c_uint) {
        add_callback(s, cb, data, true)
    }

    fn cuStreamBeginCapture(s: CUstream) { begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, false) }
    fn cuStreamBeginCapture_ptsz(s: CUstream) { begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, true) }
    fn cuStreamBeginCapture_v2(s: CUstream, mode: c_int) { begin_capture(s, mode, false) }
    fn cuStreamBeginCapture_v2_ptsz(s: CUstream, mode: c_int) { begin_capture(s, mode, true) }
    fn cuStreamBeginCaptureToGraph(s: CUstream, g: CUgraph, _deps: *const c_void, _edges: *const c_void, n: usize, mode: c_int) {
        begin_capture_to_graph(s, g, n, mode, false)
    }
    fn cuStreamBeginCaptureToGraph_ptsz(s: CUstream, g: CUgraph, _deps: *const c_void, _edges: *const c_void, n: usize, mode: c_int) {
        begin_capture_to_graph(s, g, n, mode, true)
    }
    fn cuStreamEndCapture(s: CUstream, g: *mut N) { end_capture(s, g, false) }
    fn cuStreamEndCapture_ptsz(s: CUstream, g: *mut N) { end_capture(s, g, true) }
    fn cuStreamIsCapturing(s: CUstream, st: *mut c_int) { is_capturing(s, st, false) }
    fn cuStreamIsCapturing_ptsz(s: CUstream, st: *mut c_int) { is_capturing(s, st, true) }
    fn cuStreamGetCaptureInfo(s: CUstream, st: *mut c_int, id: *mut u64) {
        // SAFETY: out-parameters of the v1 signature.
        unsafe { capture_info(s, false, st, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()) }
    }
    fn cuStreamGetCaptureInfo_ptsz(s: CUstream, st: *mut c_int, id: *mut u64) {
        // SAFETY: out-parameters of the v1 signature.
        unsafe { capture_info(s, true, st, id, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()) }
    }
    fn cuStreamGetCaptureInfo_v2(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut N, deps: *mut *const c_void, num: *mut usize) {
        // SAFETY: out-parameters of the v2 signature.
        unsafe { capture_info(s, false, st, id, g, deps, std::ptr::null_mut(), num) }
    }
    fn cuStreamGetCaptureInfo_v2_ptsz(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut N, deps: *mut *const c_void, num: *mut usize) {
        // SAFETY: out-parameters of the v2 signature.
        unsafe { capture_info(s, true, st, id, g, deps, std::ptr::null_mut(), num) }
    }
    fn cuStreamGetCaptureInfo_v3(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut N, deps: *mut *const c_void, edges: *mut *const c_void, num: *mut usize) {
        // SAFETY: out-parameters of the v3 signature.
        unsafe { capture_info(s, false, st, id, g, deps, edges, num) }
    }
    fn cuStreamGetCaptureInfo_v3_ptsz(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut N, deps: *mut *const c_void, edges: *mut *const c_void, num: *mut usize) {
        // SAFETY: out-parameters of the v3 signature.
        unsafe { capture_info(s, true, st, id, g, deps, edges, num) }
    }
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) {
        // SAFETY: C in/out pointer.
        let m = unsafe { get(mode) }?;
        let prev = stream::exchange_capture_mode(m)?;
        // SAFETY: C in/out pointer.
        unsafe { put(mode, prev) }
    }

    fn cuEventCreate(out: *mut CUevent, flags: c_uint) {
        ctx::current_device()?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, stream::event_create(flags)) }
    }
    fn cuEventDestroy_v2(e: CUevent) { stream::event_destroy(e) }
    fn cuEventDestroy(e: CUevent) { stream::event_destroy(e) }
    fn cuEventRecord(e: CUevent, s: CUstream) { record(e, s, false) }
    fn cuEventRecord_ptsz(e: CUevent, s: CUstream) { record(e, s, true) }
    fn cuEventRecordWithFlags(e: CUevent, s: CUstream, _flags: c_uint) { record(e, s, false) }
    fn cuEventRecordWithFlags_ptsz(e: CUevent, s: CUstream, _flags: c_uint) { record(e, s, true) }
    fn cuEventQuery(e: CUevent) {
        let ev = stream::event(e)?;
        // Potentially unsafe during capture, as for CUDA (PyTorch avoids it while capturing).
        stream::capture_unsafe_check(None)?;
        if ev.is_complete() { Ok(()) } else { Err(CUDA_ERROR_NOT_READY) }
    }
    fn cuEventSynchronize(e: CUevent) {
        let ev = stream::event(e)?;
        stream::capture_unsafe_check(None)?;
        ev.synchronize();
        Ok(())
    }
    fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) { elapsed(ms, start, end) }

    fn cuLaunchKernel(
        _f: N, _gx: c_uint, _gy: c_uint, _gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint,
        _shmem: c_uint, s: CUstream, _params: *mut N, _extra: *mut N,
    ) {
        let s = stream::resolve(s, false)?;
        stream::run_async(&s, crate::config::CONFIG.kernel_time, Box::new(|| {}))
    }
    fn cuLaunchKernel_ptsz(
        _f: N, _gx: c_uint, _gy: c_uint, _gz: c_uint, _bx: c_uint, _by: c_uint, _bz: c_uint,
        _shmem: c_uint, s: CUstream, _params: *mut N, _extra: *mut N,
    ) {
        let s = stream::resolve(s, true)?;
        stream::run_async(&s, crate::config::CONFIG.kernel_time, Box::new(|| {}))
    }
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Res {
    let (a, b) = (stream::event(start)?, stream::event(end)?);
    if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let (ta, tb) = (a.time()?, b.time()?);
    let d = if tb >= ta {
        (tb - ta).as_secs_f32()
    } else {
        -(ta - tb).as_secs_f32()
    };
    // SAFETY: C out-pointer.
    unsafe { put(ms, d * 1000.0) }
}

/// `CUipcEventHandle`: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcEventHandle {
    pub reserved: [u8; 64],
}

const CU_EVENT_INTERPROCESS: c_uint = 0x4;

cu_api! {
    /// Legacy IPC event handle of an interprocess event (created with
    /// CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING).
    fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, e: CUevent) {
        let ev = stream::event(e)?;
        if ev.flags & CU_EVENT_INTERPROCESS == 0 || ev.flags & CU_EVENT_DISABLE_TIMING == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut h = CUipcEventHandle { reserved: [0; 64] };
        h.reserved[..8].copy_from_slice(&(e as u64).to_le_bytes());
        h.reserved[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        h.reserved[12..20].copy_from_slice(b"vramsimE");
        // SAFETY: C out-pointer.
        unsafe { put(handle, h) }
    }

    /// Opening works for a handle of this same process (the event itself); events of other
    /// processes are not simulated (CUDA_ERROR_NOT_SUPPORTED).
    fn cuIpcOpenEventHandle(out: *mut CUevent, handle: CUipcEventHandle) {
        ctx::current_device()?;
        let r = &handle.reserved;
        if &r[12..20] != b"vramsimE" {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let pid = u32::from_le_bytes([r[8], r[9], r[10], r[11]]);
        if pid != std::process::id() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let e = u64::from_le_bytes(r[..8].try_into().map_err(|_| CUDA_ERROR_INVALID_VALUE)?) as usize as CUevent;
        stream::event(e)?;
        // SAFETY: C out-pointer.
        unsafe { put(out, e) }
    }
}

fn instantiate(out: *mut CUgraphExec, graph: CUgraph, flags: u64) -> Res {
    ctx::current_device()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = crate::graph::instantiate(graph, flags)?;
    // SAFETY: C out-pointer, checked above.
    unsafe { put(out, e) }
}

fn graph_launch(exec: CUgraphExec, h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    stream::legacy_check(&s)?;
    crate::graph::launch(exec, &s)
}

// Graphs made by capture (see `graph`): instantiated, launched and destroyed; the log
// arguments of the old instantiation entry points are not written.
cu_api! {
    fn cuGraphCreate(out: *mut CUgraph, flags: c_uint) {
        ctx::current_device()?;
        if out.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: C out-pointer, checked above.
        unsafe { put(out, crate::graph::create()) }
    }
    fn cuGraphDestroy(g: CUgraph) { crate::graph::destroy(g) }
    fn cuGraphInstantiate(out: *mut CUgraphExec, g: CUgraph, _err: *mut N, _log: *mut i8, _len: usize) {
        instantiate(out, g, 0)
    }
    fn cuGraphInstantiate_v2(out: *mut CUgraphExec, g: CUgraph, _err: *mut N, _log: *mut i8, _len: usize) {
        instantiate(out, g, 0)
    }
    fn cuGraphInstantiateWithFlags(out: *mut CUgraphExec, g: CUgraph, flags: u64) {
        instantiate(out, g, flags)
    }
    fn cuGraphExecDestroy(e: CUgraphExec) { crate::graph::exec_destroy(e) }
    fn cuGraphLaunch(e: CUgraphExec, s: CUstream) { graph_launch(e, s, false) }
    fn cuGraphLaunch_ptsz(e: CUgraphExec, s: CUstream) { graph_launch(e, s, true) }
}
