//! Error codes: driver-to-runtime mapping, names and strings, and the per-thread last error
//! with the real runtime's semantics.
//!
//! * Every failing call stores its code as the calling thread's last error (except
//!   `cudaErrorNotReady`, which is a status, not an error).
//! * A successful call leaves it alone: the last error is that of the last *failing* call.
//! * `cudaGetLastError` returns it and resets it to `cudaSuccess`; `cudaPeekAtLastError`
//!   returns it and leaves it.
//! * Sticky errors (the context is corrupt: illegal address, launch failure, ...) are
//!   process-wide: every later call returns them and `cudaGetLastError` cannot clear them.

use crate::types::*;
use std::cell::Cell;
use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicU32, Ordering};

thread_local! {
    static LAST: Cell<cudaError_t> = const { Cell::new(0) };
}
static STICKY: AtomicU32 = AtomicU32::new(0);

/// Maps a `CUresult` to the `cudaError_t` the real runtime returns for it. The two enums
/// share their numbering for every code the driver returns (1 invalid value, 2 out of
/// memory, 3 not initialized, 100 no device, 101 invalid device, 201 invalid context ->
/// cudaErrorDeviceUninitialized, 400 invalid handle -> cudaErrorInvalidResourceHandle,
/// 500 not found -> cudaErrorSymbolNotFound, 600 not ready, 700 illegal address, ...).
pub fn from_cu(rc: CUresult) -> cudaError_t {
    rc
}

fn is_sticky(e: cudaError_t) -> bool {
    matches!(e, 214 | 700 | 701 | 714 | 715 | 716 | 717 | 718 | 719 | 720)
}

/// Records the outcome of a runtime call (sets the last error on failure) and returns it.
pub fn record(rc: cudaError_t) -> cudaError_t {
    if rc != 0 && rc != err::NOT_READY {
        if is_sticky(rc) {
            STICKY.store(rc, Ordering::Relaxed);
        }
        // try_with: a call from a TLS destructor at thread exit must not panic.
        let _ = LAST.try_with(|l| l.set(rc));
    }
    rc
}

/// The sticky error, if the context is corrupt.
pub fn sticky() -> Option<cudaError_t> {
    match STICKY.load(Ordering::Relaxed) {
        0 => None,
        e => Some(e),
    }
}

/// `cudaGetLastError`.
pub fn get_last_error() -> cudaError_t {
    if let Some(e) = sticky() {
        return e;
    }
    LAST.try_with(|l| l.replace(0)).unwrap_or(0)
}

/// `cudaPeekAtLastError`.
pub fn peek_last_error() -> cudaError_t {
    if let Some(e) = sticky() {
        return e;
    }
    LAST.try_with(|l| l.get()).unwrap_or(0)
}

/// Runs the body of an exported function: a panic becomes `cudaErrorUnknown` (never unwinds
/// into C), and the result is recorded as the thread's last error.
pub fn guard(f: impl FnOnce() -> cudaError_t) -> cudaError_t {
    let rc = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(err::UNKNOWN);
    record(rc)
}

/// Like [`guard`] for functions that return something other than an error code.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(fallback)
}

macro_rules! error_table {
    ($( $code:literal $name:ident $text:literal ),* $(,)?) => {
        fn lookup(e: cudaError_t) -> Option<(&'static CStr, &'static CStr)> {
            match e {
                $( $code => Some((
                    CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).unwrap_or(c""),
                    CStr::from_bytes_with_nul(concat!($text, "\0").as_bytes()).unwrap_or(c""),
                )), )*
                _ => None,
            }
        }
    };
}

error_table! {
    0 cudaSuccess "no error",
    1 cudaErrorInvalidValue "invalid argument",
    2 cudaErrorMemoryAllocation "out of memory",
    3 cudaErrorInitializationError "initialization error",
    4 cudaErrorCudartUnloading "driver shutting down",
    9 cudaErrorInvalidConfiguration "invalid configuration argument",
    12 cudaErrorInvalidPitchValue "invalid pitch argument",
    13 cudaErrorInvalidSymbol "invalid device symbol",
    16 cudaErrorInvalidHostPointer "invalid host pointer",
    17 cudaErrorInvalidDevicePointer "invalid device pointer",
    21 cudaErrorInvalidMemcpyDirection "invalid copy direction for memcpy",
    34 cudaErrorStubLibrary "CUDA driver is a stub library",
    35 cudaErrorInsufficientDriver "CUDA driver version is insufficient for CUDA runtime version",
    98 cudaErrorInvalidDeviceFunction "invalid device function",
    100 cudaErrorNoDevice "no CUDA-capable device is detected",
    101 cudaErrorInvalidDevice "invalid device ordinal",
    200 cudaErrorInvalidKernelImage "device kernel image is invalid",
    201 cudaErrorDeviceUninitialized "invalid device context",
    208 cudaErrorAlreadyMapped "resource already mapped",
    211 cudaErrorNotMapped "resource not mapped",
    300 cudaErrorInvalidSource "device kernel image is invalid",
    400 cudaErrorInvalidResourceHandle "invalid resource handle",
    401 cudaErrorIllegalState "the operation cannot be performed in the present state",
    500 cudaErrorSymbolNotFound "named symbol not found",
    600 cudaErrorNotReady "device not ready",
    700 cudaErrorIllegalAddress "an illegal memory access was encountered",
    704 cudaErrorPeerAccessAlreadyEnabled "peer access is already enabled",
    705 cudaErrorPeerAccessNotEnabled "peer access has not been enabled",
    708 cudaErrorSetOnActiveProcess "cannot set while device is active in this process",
    712 cudaErrorHostMemoryAlreadyRegistered "part or all of the requested memory range is already mapped",
    713 cudaErrorHostMemoryNotRegistered "pointer does not correspond to a registered memory region",
    719 cudaErrorLaunchFailure "unspecified launch failure",
    800 cudaErrorNotPermitted "operation not permitted",
    801 cudaErrorNotSupported "operation not supported",
    900 cudaErrorStreamCaptureUnsupported "operation not permitted when stream is capturing",
    901 cudaErrorStreamCaptureInvalidated "operation failed due to a previous error during capture",
    902 cudaErrorStreamCaptureMerge "operation would result in a merge of separate capture sequences",
    903 cudaErrorStreamCaptureUnmatched "capture was not ended in the same stream as it began",
    904 cudaErrorStreamCaptureUnjoined "capturing stream has unjoined work",
    905 cudaErrorStreamCaptureIsolation "dependency created on uncaptured work in another stream",
    906 cudaErrorStreamCaptureImplicit "operation would make the legacy stream depend on a capturing blocking stream",
    907 cudaErrorCapturedEvent "operation not permitted on an event last recorded in a capturing stream",
    908 cudaErrorStreamCaptureWrongThread "attempt to terminate a thread-local capture sequence from another thread",
    999 cudaErrorUnknown "unknown error",
}

/// `cudaGetErrorName`.
pub fn error_name(e: cudaError_t) -> *const c_char {
    match lookup(e) {
        Some((name, _)) => name.as_ptr(),
        None => c"cudaErrorUnknown".as_ptr(),
    }
}

/// `cudaGetErrorString`.
pub fn error_string(e: cudaError_t) -> *const c_char {
    match lookup(e) {
        Some((_, text)) => text.as_ptr(),
        None => c"unrecognized error code".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> String {
        // SAFETY: the tables hand out static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    #[test]
    fn names_and_strings() {
        assert_eq!(s(error_name(2)), "cudaErrorMemoryAllocation");
        assert_eq!(s(error_string(2)), "out of memory");
        assert_eq!(s(error_name(35)), "cudaErrorInsufficientDriver");
        assert_eq!(s(error_string(424242)), "unrecognized error code");
    }

    #[test]
    fn last_error_is_per_thread_get_resets_peek_does_not() {
        assert_eq!(get_last_error(), 0);
        record(2);
        record(0);
        assert_eq!(peek_last_error(), 2);
        std::thread::spawn(|| assert_eq!(peek_last_error(), 0))
            .join()
            .unwrap();
        assert_eq!(get_last_error(), 2);
        assert_eq!(get_last_error(), 0);
        record(err::NOT_READY);
        assert_eq!(get_last_error(), 0);
    }

    #[test]
    fn guard_turns_a_panic_into_unknown() {
        let rc = guard(|| panic!("boom"));
        assert_eq!(rc, err::UNKNOWN);
        assert_eq!(get_last_error(), err::UNKNOWN);
    }
}
