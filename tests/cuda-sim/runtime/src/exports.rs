// The C symbols of the simulated libcudart. NOT a module of vramsim-runtime: each artifact
// crate (runtime12, runtime13, runtime-static) defines `const RT: Flavor` and includes this
// file, so the symbols are defined in the crate that gives them their soname and version
// node. Its build script finds every `fn NAME(` here (and `#[cfg(cudart13)]` /
// `#[cfg(not(cudart13))]` on the line before) to write the `.symver` directives.
//
// To add a function: one `fn` line below, calling an `api::` function.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use vramsim_runtime::api;
use vramsim_runtime::errors;
use vramsim_runtime::kernels::{self, cudaFuncAttributes, cudaLaunchConfig_t, dim3};
use vramsim_runtime::types::*;

const LEGACY: bool = false;
const PTDS: bool = true;

vramsim_runtime::cuda_exports! {
    fn cudaDriverGetVersion(v: *mut c_int) => api::driver_get_version(RT, v);
    fn cudaRuntimeGetVersion(v: *mut c_int) => api::runtime_get_version(RT, v);

    fn cudaGetDeviceCount(n: *mut c_int) => api::get_device_count(RT, n);
    fn cudaSetDevice(dev: c_int) => api::set_device(RT, dev);
    fn cudaGetDevice(dev: *mut c_int) => api::get_device(RT, dev);
    fn cudaGetDeviceProperties(p: *mut c_void, dev: c_int) => api::get_device_properties(RT, p, dev);
    fn cudaGetDeviceProperties_v2(p: *mut c_void, dev: c_int) => api::get_device_properties(RT, p, dev);
    fn cudaDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) => api::device_get_attribute(RT, v, attr, dev);
    fn cudaDeviceSynchronize() => api::device_synchronize(RT);
    fn cudaDeviceReset() => api::device_reset(RT);
    fn cudaDeviceCanAccessPeer(can: *mut c_int, dev: c_int, peer: c_int) => api::device_can_access_peer(RT, can, dev, peer);
    fn cudaDeviceEnablePeerAccess(peer: c_int, flags: c_uint) => api::device_enable_peer_access(RT, peer, flags);

    fn cudaMalloc(p: *mut *mut c_void, size: usize) => api::malloc(RT, p, size);
    fn cudaFree(p: *mut c_void) => api::free(RT, p);
    fn cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, w: usize, h: usize) => api::malloc_pitch(RT, p, pitch, w, h);
    fn cudaMalloc3D(pp: *mut cudaPitchedPtr, e: cudaExtent) => api::malloc_3d(RT, pp, e);
    fn cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint) => api::malloc_managed(RT, p, size, flags);
    fn cudaMallocHost(p: *mut *mut c_void, size: usize) => api::malloc_host(RT, p, size);
    fn cudaHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) => api::host_alloc(RT, p, size, flags);
    fn cudaFreeHost(p: *mut c_void) => api::free_host(RT, p);
    fn cudaMallocAsync(p: *mut *mut c_void, size: usize, s: cudaStream_t) => api::malloc_async(RT, LEGACY, p, size, s);
    fn cudaMallocAsync_ptsz(p: *mut *mut c_void, size: usize, s: cudaStream_t) => api::malloc_async(RT, PTDS, p, size, s);
    fn cudaFreeAsync(p: *mut c_void, s: cudaStream_t) => api::free_async(RT, LEGACY, p, s);
    fn cudaFreeAsync_ptsz(p: *mut c_void, s: cudaStream_t) => api::free_async(RT, PTDS, p, s);
    fn cudaMallocFromPoolAsync(p: *mut *mut c_void, size: usize, pool: CUmemoryPool, s: cudaStream_t) => api::malloc_from_pool_async(RT, LEGACY, p, size, pool, s);
    fn cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, size: usize, pool: CUmemoryPool, s: cudaStream_t) => api::malloc_from_pool_async(RT, PTDS, p, size, pool, s);
    fn cudaDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: c_int) => api::device_get_default_mem_pool(RT, pool, dev);
    fn cudaMemGetInfo(free: *mut usize, total: *mut usize) => api::mem_get_info(RT, free, total);
    fn cudaPointerGetAttributes(a: *mut cudaPointerAttributes, p: *const c_void) => api::pointer_get_attributes(RT, a, p);
    fn cudaIpcGetMemHandle(h: *mut cudaIpcMemHandle_t, p: *mut c_void) => api::ipc_get_mem_handle(RT, h, p);

    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: c_uint) => api::memcpy(RT, dst, src, n, kind);
    fn cudaMemcpyAsync(dst: *mut c_void, src: *const c_void, n: usize, kind: c_uint, s: cudaStream_t) => api::memcpy_async(RT, LEGACY, dst, src, n, kind, s);
    fn cudaMemcpyAsync_ptsz(dst: *mut c_void, src: *const c_void, n: usize, kind: c_uint, s: cudaStream_t) => api::memcpy_async(RT, PTDS, dst, src, n, kind, s);
    fn cudaMemset(p: *mut c_void, v: c_int, n: usize) => api::memset(RT, p, v, n);
    fn cudaMemsetAsync(p: *mut c_void, v: c_int, n: usize, s: cudaStream_t) => api::memset_async(RT, LEGACY, p, v, n, s);
    fn cudaMemsetAsync_ptsz(p: *mut c_void, v: c_int, n: usize, s: cudaStream_t) => api::memset_async(RT, PTDS, p, v, n, s);

    fn cudaStreamCreate(s: *mut cudaStream_t) => api::stream_create(RT, s, 0, None);
    fn cudaStreamCreateWithFlags(s: *mut cudaStream_t, flags: c_uint) => api::stream_create(RT, s, flags, None);
    fn cudaStreamCreateWithPriority(s: *mut cudaStream_t, flags: c_uint, prio: c_int) => api::stream_create(RT, s, flags, Some(prio));
    fn cudaStreamDestroy(s: cudaStream_t) => api::stream_destroy(RT, s);
    fn cudaStreamSynchronize(s: cudaStream_t) => api::stream_synchronize(RT, LEGACY, s);
    fn cudaStreamSynchronize_ptsz(s: cudaStream_t) => api::stream_synchronize(RT, PTDS, s);
    fn cudaStreamQuery(s: cudaStream_t) => api::stream_query(RT, LEGACY, s);
    fn cudaStreamQuery_ptsz(s: cudaStream_t) => api::stream_query(RT, PTDS, s);
    fn cudaStreamWaitEvent(s: cudaStream_t, e: cudaEvent_t, flags: c_uint) => api::stream_wait_event(RT, LEGACY, s, e, flags);
    fn cudaStreamWaitEvent_ptsz(s: cudaStream_t, e: cudaEvent_t, flags: c_uint) => api::stream_wait_event(RT, PTDS, s, e, flags);
    fn cudaStreamBeginCapture(s: cudaStream_t, mode: c_uint) => api::stream_begin_capture(RT, LEGACY, s, mode);
    fn cudaStreamBeginCapture_ptsz(s: cudaStream_t, mode: c_uint) => api::stream_begin_capture(RT, PTDS, s, mode);
    fn cudaStreamEndCapture(s: cudaStream_t, g: *mut CUgraph) => api::stream_end_capture(RT, LEGACY, s, g);
    fn cudaStreamEndCapture_ptsz(s: cudaStream_t, g: *mut CUgraph) => api::stream_end_capture(RT, PTDS, s, g);
    fn cudaStreamIsCapturing(s: cudaStream_t, st: *mut c_uint) => api::stream_is_capturing(RT, LEGACY, s, st);
    fn cudaStreamIsCapturing_ptsz(s: cudaStream_t, st: *mut c_uint) => api::stream_is_capturing(RT, PTDS, s, st);
    #[cfg(not(cudart13))]
    fn cudaStreamGetCaptureInfo(s: cudaStream_t, st: *mut c_uint, id: *mut u64) => api::stream_get_capture_info(RT, LEGACY, s, st, id);
    #[cfg(not(cudart13))]
    fn cudaStreamGetCaptureInfo_ptsz(s: cudaStream_t, st: *mut c_uint, id: *mut u64) => api::stream_get_capture_info(RT, PTDS, s, st, id);
    #[cfg(not(cudart13))]
    fn cudaStreamGetCaptureInfo_v2(s: cudaStream_t, st: *mut c_uint, id: *mut u64, g: *mut CUgraph, deps: *mut *const c_void, n: *mut usize) => capture_info_full(LEGACY, s, st, id, g, deps, std::ptr::null_mut(), n);
    #[cfg(not(cudart13))]
    fn cudaStreamGetCaptureInfo_v2_ptsz(s: cudaStream_t, st: *mut c_uint, id: *mut u64, g: *mut CUgraph, deps: *mut *const c_void, n: *mut usize) => capture_info_full(PTDS, s, st, id, g, deps, std::ptr::null_mut(), n);
    #[cfg(not(cudart13))]
    fn cudaStreamGetCaptureInfo_v3(s: cudaStream_t, st: *mut c_uint, id: *mut u64, g: *mut CUgraph, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) => capture_info_full(LEGACY, s, st, id, g, deps, edges, n);
    #[cfg(cudart13)]
    fn cudaStreamGetCaptureInfo(s: cudaStream_t, st: *mut c_uint, id: *mut u64, g: *mut CUgraph, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) => capture_info_full(LEGACY, s, st, id, g, deps, edges, n);
    #[cfg(cudart13)]
    fn cudaStreamGetCaptureInfo_ptsz(s: cudaStream_t, st: *mut c_uint, id: *mut u64, g: *mut CUgraph, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) => capture_info_full(PTDS, s, st, id, g, deps, edges, n);
    fn cudaThreadExchangeStreamCaptureMode(mode: *mut c_uint) => api::thread_exchange_stream_capture_mode(RT, mode);

    fn cudaEventCreate(e: *mut cudaEvent_t) => api::event_create(RT, e, 0);
    fn cudaEventCreateWithFlags(e: *mut cudaEvent_t, flags: c_uint) => api::event_create(RT, e, flags);
    fn cudaEventRecord(e: cudaEvent_t, s: cudaStream_t) => api::event_record(RT, LEGACY, e, s);
    fn cudaEventRecord_ptsz(e: cudaEvent_t, s: cudaStream_t) => api::event_record(RT, PTDS, e, s);
    fn cudaEventQuery(e: cudaEvent_t) => api::event_query(RT, e);
    fn cudaEventSynchronize(e: cudaEvent_t) => api::event_synchronize(RT, e);
    fn cudaEventDestroy(e: cudaEvent_t) => api::event_destroy(RT, e);
    fn cudaEventElapsedTime(ms: *mut f32, a: cudaEvent_t, b: cudaEvent_t) => api::event_elapsed_time(RT, ms, a, b);
    fn cudaEventElapsedTime_v2(ms: *mut f32, a: cudaEvent_t, b: cudaEvent_t) => api::event_elapsed_time(RT, ms, a, b);

    fn cudaGetDriverEntryPoint(sym: *const c_char, f: *mut *mut c_void, flags: c_ulonglong, st: *mut c_int) => api::get_driver_entry_point(RT, LEGACY, sym, f, RT.version, flags, st);
    fn cudaGetDriverEntryPoint_ptsz(sym: *const c_char, f: *mut *mut c_void, flags: c_ulonglong, st: *mut c_int) => api::get_driver_entry_point(RT, PTDS, sym, f, RT.version, flags, st);
    fn cudaGetDriverEntryPointByVersion(sym: *const c_char, f: *mut *mut c_void, ver: c_uint, flags: c_ulonglong, st: *mut c_int) => api::get_driver_entry_point(RT, LEGACY, sym, f, ver as c_int, flags, st);
    fn cudaGetDriverEntryPointByVersion_ptsz(sym: *const c_char, f: *mut *mut c_void, ver: c_uint, flags: c_ulonglong, st: *mut c_int) => api::get_driver_entry_point(RT, PTDS, sym, f, ver as c_int, flags, st);

    fn cudaMemPoolTrimTo(pool: CUmemoryPool, keep: usize) => api::mem_pool_trim_to(RT, pool, keep);
    fn cudaMemPoolSetAttribute(pool: CUmemoryPool, attr: c_int, v: *mut c_void) => api::mem_pool_attribute(RT, true, pool, attr, v);
    fn cudaMemPoolGetAttribute(pool: CUmemoryPool, attr: c_int, v: *mut c_void) => api::mem_pool_attribute(RT, false, pool, attr, v);
    fn cudaMemPoolSetAccess(pool: CUmemoryPool, descs: *const c_void, n: usize) => api::mem_pool_set_access(RT, pool, descs, n);
    fn cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) => api::host_register(RT, p, size, flags);
    fn cudaHostUnregister(p: *mut c_void) => api::host_unregister(RT, p);
    fn cudaIpcOpenMemHandle(p: *mut *mut c_void, h: cudaIpcMemHandle_t, flags: c_uint) => api::ipc_open_mem_handle(RT, p, h, flags);
    fn cudaIpcCloseMemHandle(p: *mut c_void) => api::ipc_close_mem_handle(RT, p);
    fn cudaMemcpyPeerAsync(dst: *mut c_void, dd: c_int, src: *const c_void, sd: c_int, n: usize, s: cudaStream_t) => api::memcpy_peer_async(RT, LEGACY, dst, dd, src, sd, n, s);
    fn cudaMemcpyPeerAsync_ptsz(dst: *mut c_void, dd: c_int, src: *const c_void, sd: c_int, n: usize, s: cudaStream_t) => api::memcpy_peer_async(RT, PTDS, dst, dd, src, sd, n, s);
    fn cudaLaunchHostFunc(s: cudaStream_t, f: HostFn, data: *mut c_void) => api::launch_host_func(RT, LEGACY, s, f, data);
    fn cudaLaunchHostFunc_ptsz(s: cudaStream_t, f: HostFn, data: *mut c_void) => api::launch_host_func(RT, PTDS, s, f, data);
    fn cudaStreamAddCallback(s: cudaStream_t, cb: StreamCallback, data: *mut c_void, flags: c_uint) => api::stream_add_callback(RT, LEGACY, s, cb, data, flags);
    fn cudaStreamAddCallback_ptsz(s: cudaStream_t, cb: StreamCallback, data: *mut c_void, flags: c_uint) => api::stream_add_callback(RT, PTDS, s, cb, data, flags);
    fn cudaEventRecordWithFlags(e: cudaEvent_t, s: cudaStream_t, flags: c_uint) => api::event_record_with_flags(RT, LEGACY, e, s, flags);
    fn cudaEventRecordWithFlags_ptsz(e: cudaEvent_t, s: cudaStream_t, flags: c_uint) => api::event_record_with_flags(RT, PTDS, e, s, flags);
    fn cudaStreamGetPriority(s: cudaStream_t, prio: *mut c_int) => api::stream_get_priority(RT, LEGACY, s, prio);
    fn cudaStreamGetPriority_ptsz(s: cudaStream_t, prio: *mut c_int) => api::stream_get_priority(RT, PTDS, s, prio);
    fn cudaDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) => api::device_get_stream_priority_range(RT, least, greatest);
    fn cudaDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: c_int) => api::device_get_pci_bus_id(RT, buf, len, dev);
    fn cudaProfilerStart() => api::profiler(RT);
    fn cudaProfilerStop() => api::profiler(RT);

    // Kernels: launches are no-op operations on their stream (results are not computed).
    fn cudaLaunchKernel(f: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, LEGACY, f, g, b, shmem, s);
    fn cudaLaunchKernel_ptsz(f: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, PTDS, f, g, b, shmem, s);
    fn cudaLaunchCooperativeKernel(f: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, LEGACY, f, g, b, shmem, s);
    fn cudaLaunchCooperativeKernel_ptsz(f: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, PTDS, f, g, b, shmem, s);
    fn cudaLaunchKernelExC(c: *const cudaLaunchConfig_t, f: *const c_void, _args: *mut *mut c_void) => kernels::launch_ex(RT, LEGACY, c, f);
    fn cudaLaunchKernelExC_ptsz(c: *const cudaLaunchConfig_t, f: *const c_void, _args: *mut *mut c_void) => kernels::launch_ex(RT, PTDS, c, f);
    fn __cudaLaunchKernel(k: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, LEGACY, k, g, b, shmem, s);
    fn __cudaLaunchKernel_ptsz(k: *const c_void, g: dim3, b: dim3, _args: *mut *mut c_void, shmem: usize, s: cudaStream_t) => kernels::launch(RT, PTDS, k, g, b, shmem, s);
    fn __cudaGetKernel(k: *mut *mut c_void, f: *const c_void) => kernels::get_kernel(k, f);
    fn __cudaPopCallConfiguration(g: *mut dim3, b: *mut dim3, shmem: *mut usize, s: *mut c_void) => kernels::pop_call_configuration(g, b, shmem, s);
    fn cudaFuncGetAttributes(a: *mut cudaFuncAttributes, f: *const c_void) => kernels::func_get_attributes(RT, a, f);
    fn cudaFuncSetAttribute(f: *const c_void, _attr: c_int, _v: c_int) => kernels::func_set_attribute(RT, f);
    fn cudaKernelSetAttributeForDevice(k: *const c_void, _attr: c_int, _v: c_int, dev: c_int) => api::check_device(RT, dev).and_then(|()| kernels::func_set_attribute(RT, k));
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: *const c_void, bs: c_int, _smem: usize) => kernels::occupancy(RT, n, f, bs);
    fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: *const c_void, bs: c_int, _smem: usize, _flags: c_uint) => kernels::occupancy(RT, n, f, bs);
    fn cudaGetSymbolAddress(p: *mut *mut c_void, sym: *const c_void) => kernels::get_symbol_address(RT, p, sym);
    fn cudaMemcpyToSymbol(sym: *const c_void, src: *const c_void, n: usize, off: usize, kind: c_uint) => kernels::memcpy_to_symbol(RT, sym, src, n, off, kind);

    fn cudaMemcpy2DAsync(dst: *mut c_void, dp: usize, src: *const c_void, sp: usize, w: usize, h: usize, kind: c_uint, s: cudaStream_t) => api::memcpy_2d_async(RT, LEGACY, dst, dp, src, sp, w, h, kind, s);
    fn cudaMemcpy2DAsync_ptsz(dst: *mut c_void, dp: usize, src: *const c_void, sp: usize, w: usize, h: usize, kind: c_uint, s: cudaStream_t) => api::memcpy_2d_async(RT, PTDS, dst, dp, src, sp, w, h, kind, s);
    fn cudaIpcGetEventHandle(h: *mut cudaIpcEventHandle_t, e: cudaEvent_t) => api::ipc_get_event_handle(RT, h, e);
    fn cudaIpcOpenEventHandle(e: *mut cudaEvent_t, h: cudaIpcEventHandle_t) => api::ipc_open_event_handle(RT, e, h);

    // Graphs made by capture: instantiated, launched (their memory nodes act, see cuda-sim's
    // `graph`), destroyed; graph memory as the driver counts it. Building graphs node by node
    // and user objects are cudaErrorNotSupported (801).
    fn cudaDeviceGetGraphMemAttribute(dev: c_int, attr: c_int, v: *mut c_void) => api::device_get_graph_mem_attribute(RT, dev, attr, v);
    fn cudaDeviceSetGraphMemAttribute(dev: c_int, attr: c_int, v: *mut c_void) => api::device_set_graph_mem_attribute(RT, dev, attr, v);
    fn cudaGraphCreate(g: *mut CUgraph, flags: c_uint) => api::graph_create(RT, g, flags);
    fn cudaGraphDestroy(g: CUgraph) => api::graph_destroy(RT, g);
    fn cudaGraphAddNode() => kernels::not_supported(RT);
    fn cudaGraphConditionalHandleCreate() => kernels::not_supported(RT);
    fn cudaGraphExecDestroy(e: CUgraphExec) => api::graph_exec_destroy(RT, e);
    fn cudaGraphGetNodes() => kernels::not_supported(RT);
    fn cudaGraphInstantiate(e: *mut CUgraphExec, g: CUgraph, flags: c_ulonglong) => api::graph_instantiate(RT, e, g, flags);
    fn cudaGraphInstantiateWithFlags(e: *mut CUgraphExec, g: CUgraph, flags: c_ulonglong) => api::graph_instantiate(RT, e, g, flags);
    fn cudaGraphLaunch(e: CUgraphExec, s: cudaStream_t) => api::graph_launch(RT, LEGACY, e, s);
    fn cudaGraphLaunch_ptsz(e: CUgraphExec, s: cudaStream_t) => api::graph_launch(RT, PTDS, e, s);
    fn cudaGraphNodeGetDependencies() => kernels::not_supported(RT);
    fn cudaGraphRetainUserObject() => kernels::not_supported(RT);
    fn cudaUserObjectCreate() => kernels::not_supported(RT);
    fn cudaUserObjectRelease() => kernels::not_supported(RT);
    fn cudaStreamBeginCaptureToGraph(s: cudaStream_t, g: CUgraph, deps: *const c_void, edges: *const c_void, n: usize, mode: c_uint) => api::stream_begin_capture_to_graph(RT, LEGACY, s, g, deps, edges, n, mode);
    fn cudaStreamBeginCaptureToGraph_ptsz(s: cudaStream_t, g: CUgraph, deps: *const c_void, edges: *const c_void, n: usize, mode: c_uint) => api::stream_begin_capture_to_graph(RT, PTDS, s, g, deps, edges, n, mode);
    fn cudaStreamUpdateCaptureDependencies() => kernels::not_supported(RT);
    fn cudaStreamUpdateCaptureDependencies_ptsz() => kernels::not_supported(RT);
    // Library management (loading device code at run time): not supported.
    fn cudaLibraryLoadData() => kernels::not_supported(RT);
    fn cudaLibraryLoadFromFile() => kernels::not_supported(RT);
    fn cudaLibraryUnload() => kernels::not_supported(RT);
    fn cudaLibraryGetKernel() => kernels::not_supported(RT);
    fn cudaLibraryGetKernelCount() => kernels::not_supported(RT);
    fn cudaLibraryGetGlobal() => kernels::not_supported(RT);
    fn cudaLibraryGetManaged() => kernels::not_supported(RT);
    fn cudaLibraryGetUnifiedFunction() => kernels::not_supported(RT);

    fn vramsimKernelFill(dst: *mut c_void, v: u8, n: usize, delay_us: c_uint, s: cudaStream_t) => api::kernel_fill(RT, LEGACY, dst, v, n, delay_us, s);
    fn vramsimKernelFill_ptsz(dst: *mut c_void, v: u8, n: usize, delay_us: c_uint, s: cudaStream_t) => api::kernel_fill(RT, PTDS, dst, v, n, delay_us, s);
    fn vramsimKernelCopy(dst: *mut c_void, src: *const c_void, n: usize, delay_us: c_uint, s: cudaStream_t) => api::kernel_copy(RT, LEGACY, dst, src, n, delay_us, s);
    fn vramsimKernelCopy_ptsz(dst: *mut c_void, src: *const c_void, n: usize, delay_us: c_uint, s: cudaStream_t) => api::kernel_copy(RT, PTDS, dst, src, n, delay_us, s);
    fn vramsimRuntimeSelfTestPanic() => api::self_test_panic();
}

/// `cudaStreamGetCaptureInfo` with graph outputs (12.x `_v2`/`_v3`, 13.x plain): the status
/// and id come from the driver; the simulated GPU has no graph nodes to report.
#[allow(clippy::too_many_arguments)]
unsafe fn capture_info_full(
    ptds: bool,
    s: cudaStream_t,
    st: *mut c_uint,
    id: *mut u64,
    g: *mut CUgraph,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    n: *mut usize,
) -> api::Res {
    // SAFETY: forwarded C pointers; NULL ones are skipped.
    unsafe {
        api::stream_get_capture_info(RT, ptds, s, st, id)?;
        if !g.is_null() {
            *g = std::ptr::null_mut();
        }
        if !deps.is_null() {
            *deps = std::ptr::null();
        }
        if !edges.is_null() {
            *edges = std::ptr::null();
        }
        if !n.is_null() {
            *n = 0;
        }
    }
    Ok(())
}

/// `cudaGetLastError`: returns and resets the calling thread's last error. With no usable
/// driver it reports the initialization error, as the real runtime does.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetLastError() -> cudaError_t {
    errors::guard_value(err::UNKNOWN, || {
        match vramsim_runtime::driver::driver(RT.min_driver()) {
            Err(e) => e,
            Ok(_) => errors::get_last_error(),
        }
    })
}

/// `cudaPeekAtLastError`: returns the calling thread's last error without resetting it.
#[unsafe(no_mangle)]
pub extern "C" fn cudaPeekAtLastError() -> cudaError_t {
    errors::guard_value(err::UNKNOWN, || {
        match vramsim_runtime::driver::driver(RT.min_driver()) {
            Err(e) => e,
            Ok(_) => errors::peek_last_error(),
        }
    })
}

/// `cudaGetErrorString`.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorString(e: cudaError_t) -> *const c_char {
    errors::guard_value(c"unrecognized error code".as_ptr(), || {
        errors::error_string(e)
    })
}

/// `cudaGetErrorName`.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorName(e: cudaError_t) -> *const c_char {
    errors::guard_value(c"cudaErrorUnknown".as_ptr(), || errors::error_name(e))
}


// ----------------------------------------------------------------- kernel registration
// Called by nvcc's generated host code from static constructors (at load / dlopen): they
// never touch the driver, and never fail.

/// `__cudaRegisterFatBinary`: returns the module handle (`void **`).
#[unsafe(no_mangle)]
pub extern "C" fn __cudaRegisterFatBinary(image: *mut c_void) -> *mut *mut c_void {
    errors::guard_value(std::ptr::null_mut(), || kernels::register_fat_binary(image))
}

/// `__cudaRegisterFatBinaryEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn __cudaRegisterFatBinaryEnd(_handle: *mut *mut c_void) {}

/// `__cudaUnregisterFatBinary`: at exit; the registration is simply kept.
#[unsafe(no_mangle)]
pub extern "C" fn __cudaUnregisterFatBinary(_handle: *mut *mut c_void) {}

/// `__cudaRegisterFunction`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn __cudaRegisterFunction(
    _handle: *mut *mut c_void,
    _host_fun: *const c_char,
    _device_fun: *mut c_char,
    _device_name: *const c_char,
    _thread_limit: c_int,
    _tid: *mut c_void,
    _bid: *mut c_void,
    _block: *mut c_void,
    _grid: *mut c_void,
    _warp_size: *mut c_int,
) {
    errors::guard_value((), kernels::register_function)
}

/// `__cudaRegisterVar`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn __cudaRegisterVar(
    _handle: *mut *mut c_void,
    host_var: *mut c_char,
    _device_address: *mut c_char,
    _device_name: *const c_char,
    _ext: c_int,
    size: usize,
    _constant: c_int,
    _global: c_int,
) {
    errors::guard_value((), || {
        kernels::register_var(host_var as *const c_void, size)
    })
}

/// `__cudaPushCallConfiguration` (`<<<grid, block, shmem, stream>>>`).
#[unsafe(no_mangle)]
pub extern "C" fn __cudaPushCallConfiguration(
    grid: dim3,
    block: dim3,
    shmem: usize,
    s: cudaStream_t,
) -> c_uint {
    errors::guard_value(1, || {
        kernels::push_call_configuration(grid, block, shmem, s)
    })
}
