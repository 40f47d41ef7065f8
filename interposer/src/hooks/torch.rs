//! C entry points for the Python startup hook (`vramshim run` on a traced Python program):
//! attach the tensor-level tracker to PyTorch's caching allocator, and name new Python stacks.
//! Both are called through `ctypes.PyDLL` (the GIL held for the whole call); the hook's
//! thread waits for stacks to name with `vramshim_torch_wait`, through `ctypes.CDLL` (the GIL
//! released while it waits).

use std::ffi::{CStr, c_char, c_int};

use crate::tracer::torch;

/// Attaches the trace tracker to PyTorch's native caching allocator. `version` is
/// `torch.__version__` (NUL-terminated). Returns 0 when attached (or already) with the tensor
/// events' Python frames read by libvramshim.so itself, 2 when attached but the caller must
/// switch on PyTorch's own Python-stack capture for them, 1 when this process is not tracing,
/// -1 when refused (one line on stderr says why).
///
/// # Safety
/// `version` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_torch_attach(version: *const c_char) -> c_int {
    let v = if version.is_null() {
        String::new()
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(version) }
            .to_string_lossy()
            .into_owned()
    };
    std::panic::catch_unwind(|| torch::attach(&v)).unwrap_or(torch::REFUSED)
}

/// Names the Python stacks seen since the last call (writes their records). Call with the
/// GIL held; returns how many stacks were named, -1 without the GIL (when there are some).
#[unsafe(no_mangle)]
pub extern "C" fn vramshim_torch_drain() -> c_int {
    std::panic::catch_unwind(torch::drain).unwrap_or(-1)
}

/// Blocks until Python stacks PyTorch captured wait to be named by `vramshim_torch_drain`
/// (returns 1), or `timeout_ms` ran out (returns 0; a negative timeout waits with no limit).
/// Call without the GIL.
#[unsafe(no_mangle)]
pub extern "C" fn vramshim_torch_wait(timeout_ms: c_int) -> c_int {
    std::panic::catch_unwind(|| torch::wait(timeout_ms)).unwrap_or(-1)
}
