//! Simulated CUDA driver (libcuda.so.1).
//!
//! Device memory is real host memory (device pointers are host addresses), the device's use is
//! accounted in a shared-memory region common to every process with the same `VRAMSIM_NAME`,
//! streams are worker threads, and the virtual-memory API really maps memfds. See
//! `docs/cuda-sim.md` for what is and is not simulated.

pub mod abi;
pub mod calls;
pub mod config;
pub mod ctx;
pub mod export_tables;
pub mod exports;
pub mod graph;
pub mod image;
pub mod inject;
pub mod integrity;
pub mod mem;
pub mod module;
pub mod pool;
pub mod procaddr;
pub mod state;
pub mod stream;
pub mod visible;
pub mod vmm;

use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

use abi::{CUDA_ERROR_UNKNOWN, CUresult, Res};

/// Body of every exported function: injection, then the work, with panics turned into
/// CUDA_ERROR_UNKNOWN (unwinding out of `extern "C"` would abort the host process).
pub fn guard(name: &str, body: impl FnOnce() -> Res) -> CUresult {
    calls::count(name);
    inject::pause_point(name);
    let rc = match catch_unwind(AssertUnwindSafe(|| {
        inject::on_call(name)?;
        body()
    })) {
        Ok(r) => abi::code(r),
        Err(_) => CUDA_ERROR_UNKNOWN,
    };
    if config::CONFIG.debug {
        debug_line(name, rc);
    }
    rc
}

/// One line per call, written with a single write(2) so lines of threads don't interleave.
fn debug_line(name: &str, rc: CUresult) {
    let line = format!("vramsim: {name} -> {rc}\n");
    // SAFETY: writing a valid buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Declares exported driver functions: `#[no_mangle] extern "C"`, returning a `CUresult`, with
/// the body (returning `Res`) run through [`guard`].
#[macro_export]
macro_rules! cu_api {
    ($( $(#[$m:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            $(#[$m])*
            #[unsafe(no_mangle)]
            #[allow(clippy::missing_safety_doc, non_snake_case)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::abi::CUresult {
                $crate::guard(stringify!($name), move || -> $crate::abi::Res { $body })
            }
        )*
    };
}

extern "C" fn on_load(_argc: c_int, _argv: *const *const u8, _envp: *const *const u8) {
    // Parse VRAMSIM_* now so a bad value is reported once, at start, even if unused.
    let _ = catch_unwind(|| {
        std::sync::LazyLock::force(&config::CONFIG);
        // SAFETY: registering plain extern "C" fns with no captured state.
        unsafe {
            libc::atexit(on_exit);
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

extern "C" fn on_fork_child() {
    state::after_fork_in_child();
}

extern "C" fn on_exit() {
    let _ = catch_unwind(state::process_exit);
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn(c_int, *const *const u8, *const *const u8) = on_load;
