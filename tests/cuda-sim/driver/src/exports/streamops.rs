//! Stream memory operations (`cuStreamWriteValue32`), which PyTorch's CUDA initialisation
//! requires the driver to have (c10/cuda/driver_api.cpp looks it up with the expandable
//! segments' VMM functions and fails without it). The value is written when the stream
//! reaches the operation, as a 32-bit store to device memory.
//! (File owned by the "pytorch" engineer; see docs/pytorch.md.)

use std::ffi::c_uint;
use std::time::Duration;

use crate::abi::*;
use crate::cu_api;
use crate::exports::memcpy::check_dev;
use crate::stream::{self, SendPtr};

fn write_value32(h: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint, ptds: bool) -> Res {
    // CU_STREAM_WRITE_VALUE_DEFAULT (0) and _NO_MEMORY_BARRIER (1) only.
    if flags > 1 || !addr.is_multiple_of(4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = stream::resolve(h, ptds)?;
    check_dev(addr, 4)?;
    let p = SendPtr(addr as usize);
    stream::run_async(
        &s,
        Duration::ZERO,
        Box::new(move || {
            let p = p;
            // SAFETY: a 4-byte aligned range checked against device memory at submission.
            unsafe { std::ptr::write_volatile(p.0 as *mut u32, value) }
        }),
    )
}

cu_api! {
    fn cuStreamWriteValue32(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value32(s, addr, value, flags, false)
    }
    fn cuStreamWriteValue32_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value32(s, addr, value, flags, true)
    }
    fn cuStreamWriteValue32_v2(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value32(s, addr, value, flags, false)
    }
    fn cuStreamWriteValue32_v2_ptsz(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value32(s, addr, value, flags, true)
    }
}
