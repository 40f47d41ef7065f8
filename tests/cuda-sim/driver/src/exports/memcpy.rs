//! Copies and memsets. Device pointers are host addresses, so a copy is a memmove run on the
//! stream's worker; the synchronous forms run on the default stream (legacy, or per-thread for
//! `_ptds`) and wait for it, which orders them after earlier blocking-stream work as CUDA does.

use std::ffi::{c_uint, c_void};
use std::time::Duration;

use crate::abi::*;
use crate::cu_api;
use crate::mem;
use crate::stream::{self, SendPtr};
use crate::vmm;

/// A device range must lie in one allocation or an accessible mapping.
pub fn check_dev(ptr: u64, len: usize) -> Res {
    if len == 0 || mem::contains(ptr, len as u64) || vmm::accessible(ptr, len as u64) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

fn check_host(ptr: u64, len: usize) -> Res {
    if ptr == 0 && len > 0 {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

fn copy_work(dst: u64, src: u64, n: usize) -> Box<dyn FnOnce() + Send> {
    let (d, s) = (SendPtr(dst as usize), SendPtr(src as usize));
    Box::new(move || {
        let (d, s) = (d, s);
        if n > 0 {
            // SAFETY: both ranges were validated (device) or given by the caller (host) and
            // stay valid until the stream reaches this copy, per CUDA's rules.
            unsafe { std::ptr::copy(s.0 as *const u8, d.0 as *mut u8, n) };
        }
    })
}

fn fill_work(dst: u64, value: u32, width: usize, count: usize) -> Box<dyn FnOnce() + Send> {
    let d = SendPtr(dst as usize);
    Box::new(move || {
        let d = d;
        // SAFETY: the range was validated against a device allocation.
        unsafe {
            match width {
                1 => std::ptr::write_bytes(d.0 as *mut u8, value as u8, count),
                2 => {
                    let p = d.0 as *mut u16;
                    for i in 0..count {
                        p.add(i).write_unaligned(value as u16);
                    }
                }
                _ => {
                    let p = d.0 as *mut u32;
                    for i in 0..count {
                        p.add(i).write_unaligned(value);
                    }
                }
            }
        }
    })
}

#[derive(Clone, Copy)]
enum Dir {
    HtoD,
    DtoH,
    DtoD,
    Any,
}

fn validate(dir: Dir, dst: u64, src: u64, n: usize) -> Res {
    match dir {
        Dir::HtoD => {
            check_dev(dst, n)?;
            check_host(src, n)
        }
        Dir::DtoH => {
            check_host(dst, n)?;
            check_dev(src, n)
        }
        Dir::DtoD => {
            check_dev(dst, n)?;
            check_dev(src, n)
        }
        Dir::Any => {
            check_host(dst, n)?;
            check_host(src, n)
        }
    }
}

fn copy_sync(dir: Dir, dst: u64, src: u64, n: usize, ptds: bool) -> Res {
    let s = stream::resolve(std::ptr::null_mut(), ptds)?;
    validate(dir, dst, src, n)?;
    stream::run_sync(&s, copy_work(dst, src, n))
}

/// Device memory, or host memory the driver allocated (pinned): copies to and from it are
/// fully asynchronous.
fn non_pageable(ptr: u64) -> bool {
    mem::find(ptr).is_some() || vmm::mapping_of(ptr).is_some() || mem::host_find(ptr).is_some()
}

/// CUDA's rules for async copies with pageable host memory: the source is staged at the call
/// (the caller may reuse it at once), and a copy into pageable memory returns once done.
fn copy_async(dir: Dir, dst: u64, src: u64, n: usize, h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    validate(dir, dst, src, n)?;
    let pageable_src = n > 0 && matches!(dir, Dir::HtoD | Dir::Any) && !non_pageable(src);
    let pageable_dst = n > 0 && matches!(dir, Dir::DtoH | Dir::Any) && !non_pageable(dst);
    let work = if pageable_src {
        // SAFETY: the caller's source buffer of n bytes, valid during the call.
        let staged = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
        let d = SendPtr(dst as usize);
        Box::new(move || {
            let d = d;
            // SAFETY: dst was validated (device) or is the caller's buffer, valid until the
            // stream reaches this copy per CUDA's rules.
            unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), d.0 as *mut u8, n) };
        }) as Box<dyn FnOnce() + Send>
    } else {
        copy_work(dst, src, n)
    };
    if pageable_dst {
        stream::legacy_check(&s)?;
        if let Some(t) = s.submit(Vec::new(), Duration::ZERO, work) {
            s.wait_for(t);
        }
        Ok(())
    } else {
        stream::run_async(&s, Duration::ZERO, work)
    }
}

fn set_sync(dst: u64, value: u32, width: usize, count: usize, ptds: bool) -> Res {
    let s = stream::resolve(std::ptr::null_mut(), ptds)?;
    check_dev(dst, count * width)?;
    stream::run_sync(&s, fill_work(dst, value, width, count))
}

fn set_async(dst: u64, value: u32, width: usize, count: usize, h: CUstream, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    check_dev(dst, count * width)?;
    stream::run_async(&s, Duration::ZERO, fill_work(dst, value, width, count))
}

type P = *mut c_void;
type CP = *const c_void;
type D = CUdeviceptr;

cu_api! {
    fn cuMemcpy(dst: D, src: D, n: usize) { copy_sync(Dir::Any, dst, src, n, false) }
    fn cuMemcpy_ptds(dst: D, src: D, n: usize) { copy_sync(Dir::Any, dst, src, n, true) }
    fn cuMemcpyHtoD_v2(dst: D, src: CP, n: usize) { copy_sync(Dir::HtoD, dst, src as u64, n, false) }
    fn cuMemcpyHtoD_v2_ptds(dst: D, src: CP, n: usize) { copy_sync(Dir::HtoD, dst, src as u64, n, true) }
    fn cuMemcpyDtoH_v2(dst: P, src: D, n: usize) { copy_sync(Dir::DtoH, dst as u64, src, n, false) }
    fn cuMemcpyDtoH_v2_ptds(dst: P, src: D, n: usize) { copy_sync(Dir::DtoH, dst as u64, src, n, true) }
    fn cuMemcpyDtoD_v2(dst: D, src: D, n: usize) { copy_sync(Dir::DtoD, dst, src, n, false) }
    fn cuMemcpyDtoD_v2_ptds(dst: D, src: D, n: usize) { copy_sync(Dir::DtoD, dst, src, n, true) }
    fn cuMemcpyPeer(dst: D, _dc: CUcontext, src: D, _sc: CUcontext, n: usize) {
        copy_sync(Dir::DtoD, dst, src, n, false)
    }
    fn cuMemcpyPeer_ptds(dst: D, _dc: CUcontext, src: D, _sc: CUcontext, n: usize) {
        copy_sync(Dir::DtoD, dst, src, n, true)
    }

    fn cuMemcpyAsync(dst: D, src: D, n: usize, s: CUstream) { copy_async(Dir::Any, dst, src, n, s, false) }
    fn cuMemcpyAsync_ptsz(dst: D, src: D, n: usize, s: CUstream) { copy_async(Dir::Any, dst, src, n, s, true) }
    fn cuMemcpyHtoDAsync_v2(dst: D, src: CP, n: usize, s: CUstream) {
        copy_async(Dir::HtoD, dst, src as u64, n, s, false)
    }
    fn cuMemcpyHtoDAsync_v2_ptsz(dst: D, src: CP, n: usize, s: CUstream) {
        copy_async(Dir::HtoD, dst, src as u64, n, s, true)
    }
    fn cuMemcpyDtoHAsync_v2(dst: P, src: D, n: usize, s: CUstream) {
        copy_async(Dir::DtoH, dst as u64, src, n, s, false)
    }
    fn cuMemcpyDtoHAsync_v2_ptsz(dst: P, src: D, n: usize, s: CUstream) {
        copy_async(Dir::DtoH, dst as u64, src, n, s, true)
    }
    fn cuMemcpyDtoDAsync_v2(dst: D, src: D, n: usize, s: CUstream) { copy_async(Dir::DtoD, dst, src, n, s, false) }
    fn cuMemcpyDtoDAsync_v2_ptsz(dst: D, src: D, n: usize, s: CUstream) { copy_async(Dir::DtoD, dst, src, n, s, true) }
    fn cuMemcpyPeerAsync(dst: D, _dc: CUcontext, src: D, _sc: CUcontext, n: usize, s: CUstream) {
        copy_async(Dir::DtoD, dst, src, n, s, false)
    }
    fn cuMemcpyPeerAsync_ptsz(dst: D, _dc: CUcontext, src: D, _sc: CUcontext, n: usize, s: CUstream) {
        copy_async(Dir::DtoD, dst, src, n, s, true)
    }

    fn cuMemsetD8_v2(dst: D, v: u8, n: usize) { set_sync(dst, v as u32, 1, n, false) }
    fn cuMemsetD8_v2_ptds(dst: D, v: u8, n: usize) { set_sync(dst, v as u32, 1, n, true) }
    fn cuMemsetD16_v2(dst: D, v: u16, n: usize) { set_sync(dst, v as u32, 2, n, false) }
    fn cuMemsetD16_v2_ptds(dst: D, v: u16, n: usize) { set_sync(dst, v as u32, 2, n, true) }
    fn cuMemsetD32_v2(dst: D, v: c_uint, n: usize) { set_sync(dst, v, 4, n, false) }
    fn cuMemsetD32_v2_ptds(dst: D, v: c_uint, n: usize) { set_sync(dst, v, 4, n, true) }
    fn cuMemsetD8Async(dst: D, v: u8, n: usize, s: CUstream) { set_async(dst, v as u32, 1, n, s, false) }
    fn cuMemsetD8Async_ptsz(dst: D, v: u8, n: usize, s: CUstream) { set_async(dst, v as u32, 1, n, s, true) }
    fn cuMemsetD16Async(dst: D, v: u16, n: usize, s: CUstream) { set_async(dst, v as u32, 2, n, s, false) }
    fn cuMemsetD16Async_ptsz(dst: D, v: u16, n: usize, s: CUstream) { set_async(dst, v as u32, 2, n, s, true) }
    fn cuMemsetD32Async(dst: D, v: c_uint, n: usize, s: CUstream) { set_async(dst, v, 4, n, s, false) }
    fn cuMemsetD32Async_ptsz(dst: D, v: c_uint, n: usize, s: CUstream) { set_async(dst, v, 4, n, s, true) }
}

/// A kernel of device `dev` may touch device memory: linear memory (cuMemAlloc) of another
/// device only with peer access enabled (cuCtxEnablePeerAccess), a virtual-memory mapping
/// only when cuMemSetAccess granted `dev` access (peer access does not apply to those).
/// Real CUDA faults asynchronously (CUDA_ERROR_ILLEGAL_ADDRESS, context lost); the sim
/// refuses the launch with CUDA_ERROR_INVALID_VALUE so a test can carry on.
fn check_kernel_access(dev: i32, ptr: u64, len: usize) -> Res {
    let ok = match mem::find(ptr) {
        Some((_, a)) if matches!(a.kind, mem::Kind::Device) => crate::ctx::peer_enabled(dev, a.dev),
        Some(_) => true,
        None => vmm::device_may_access(dev, ptr, len as u64).unwrap_or(true),
    };
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The kernels of `vramsimLaunchFill`/`vramsimLaunchCopy`: validated, delayed stream work.
pub fn launch_fill(h: CUstream, dst: u64, value: u8, n: usize, delay_us: u32, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    check_dev(dst, n)?;
    check_kernel_access(s.dev, dst, n)?;
    stream::run_async(
        &s,
        Duration::from_micros(delay_us as u64),
        fill_work(dst, value as u32, 1, n),
    )
}

pub fn launch_copy(h: CUstream, dst: u64, src: u64, n: usize, delay_us: u32, ptds: bool) -> Res {
    let s = stream::resolve(h, ptds)?;
    check_dev(dst, n)?;
    check_dev(src, n)?;
    check_kernel_access(s.dev, dst, n)?;
    check_kernel_access(s.dev, src, n)?;
    stream::run_async(
        &s,
        Duration::from_micros(delay_us as u64),
        copy_work(dst, src, n),
    )
}

/// `CUDA_MEMCPY2D` (128 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaMemcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

const _: () = assert!(std::mem::size_of::<CudaMemcpy2D>() == 128);

/// Start address of one side of a 2D copy: host types use the host pointer, device and
/// unified types the device pointer; arrays are not simulated.
fn side(
    ty: c_uint,
    host: u64,
    dev: u64,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<u64, CUresult> {
    let base = match ty {
        CU_MEMORYTYPE_HOST => host,
        CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED => dev,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok(base + (y * pitch + x) as u64)
}

/// 2D copies run row by row; with pageable host memory on either side they complete before
/// returning (CUDA stages or waits for those; completing is the simple safe form of both).
fn copy_2d(p: *const CudaMemcpy2D, h: CUstream, ptds: bool, wait: bool) -> Res {
    // SAFETY: C input struct.
    let c = unsafe { get(p) }?;
    let s = stream::resolve(h, ptds)?;
    let (w, rows) = (c.width_in_bytes, c.height);
    if rows > 1 && (c.src_pitch < w || c.dst_pitch < w) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let src = side(
        c.src_memory_type,
        c.src_host as u64,
        c.src_device,
        c.src_x_in_bytes,
        c.src_y,
        c.src_pitch,
    )?;
    let dst = side(
        c.dst_memory_type,
        c.dst_host as u64,
        c.dst_device,
        c.dst_x_in_bytes,
        c.dst_y,
        c.dst_pitch,
    )?;
    let span = |pitch: usize| if rows == 0 { 0 } else { (rows - 1) * pitch + w };
    if c.src_memory_type == CU_MEMORYTYPE_DEVICE {
        check_dev(src, span(c.src_pitch))?;
    }
    if c.dst_memory_type == CU_MEMORYTYPE_DEVICE {
        check_dev(dst, span(c.dst_pitch))?;
    }
    let pageable = (c.src_memory_type == CU_MEMORYTYPE_HOST && !non_pageable(src))
        || (c.dst_memory_type == CU_MEMORYTYPE_HOST && !non_pageable(dst));
    let (sp, dp) = (c.src_pitch, c.dst_pitch);
    let (d, s_) = (SendPtr(dst as usize), SendPtr(src as usize));
    let work: Box<dyn FnOnce() + Send> = Box::new(move || {
        let (d, s_) = (d, s_);
        for r in 0..rows {
            // SAFETY: rows validated (device) or given by the caller (host), valid until the
            // stream reaches this copy.
            unsafe {
                std::ptr::copy((s_.0 + r * sp) as *const u8, (d.0 + r * dp) as *mut u8, w);
            }
        }
    });
    if wait || pageable {
        stream::run_sync(&s, work)
    } else {
        stream::run_async(&s, Duration::ZERO, work)
    }
}

cu_api! {
    fn cuMemcpy2D_v2(p: *const CudaMemcpy2D) { copy_2d(p, std::ptr::null_mut(), false, true) }
    fn cuMemcpy2D_v2_ptds(p: *const CudaMemcpy2D) { copy_2d(p, std::ptr::null_mut(), true, true) }
    fn cuMemcpy2DUnaligned_v2(p: *const CudaMemcpy2D) { copy_2d(p, std::ptr::null_mut(), false, true) }
    fn cuMemcpy2DUnaligned_v2_ptds(p: *const CudaMemcpy2D) { copy_2d(p, std::ptr::null_mut(), true, true) }
    fn cuMemcpy2DAsync_v2(p: *const CudaMemcpy2D, s: CUstream) { copy_2d(p, s, false, false) }
    fn cuMemcpy2DAsync_v2_ptsz(p: *const CudaMemcpy2D, s: CUstream) { copy_2d(p, s, true, false) }
}
