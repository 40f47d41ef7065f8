//! The one value every hook produces: what the process asked for.

use vramshim_trace::{AllocKind, Api};

/// One allocation request as decoded from a C call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub api: Api,
    pub kind: AllocKind,
    /// Device ordinal; -1 for host memory or when the calling thread has no device.
    pub device: i32,
    /// Stream the allocation is ordered on (0 = legacy default stream / none).
    pub stream: u64,
    /// Bytes requested (for pitched allocations: pitch x rows, known after the call).
    pub size: u64,
    /// `vramshim_trace::flags` bits known at decode time (`PER_THREAD_STREAM`).
    pub flags: u8,
}

impl Request {
    /// Whether this request is charged against a device.
    #[inline]
    pub(crate) fn charged(&self) -> bool {
        self.kind.is_device() && self.device >= 0
    }
}

/// Whether `api` is the runtime's (its errors are `cudaError_t`, and a refusal also sets its
/// sticky last error); else the driver's or NVML's.
#[inline]
pub(crate) fn is_runtime(api: Api) -> bool {
    (api as u16) < 20 || api == Api::CudaGetDeviceProperties
}
