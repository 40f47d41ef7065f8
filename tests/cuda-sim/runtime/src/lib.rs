//! Simulated CUDA runtime (libcudart): one code base for `libcudart.so.12`,
//! `libcudart.so.13` and `libcudart_static.a`.
//!
//! * [`driver`]: reaches `libcuda.so.1` exactly as NVIDIA's runtime does (`dlopen`,
//!   `dlsym("cuGetProcAddress_v2")`, then every entry point by base name and version).
//! * [`api`]: the runtime functions, as safe-ish Rust returning `Result<_, cudaError_t>`.
//! * [`errors`]: `CUresult` -> `cudaError_t`, names/strings, per-thread last error.
//! * `src/exports.rs` (not a module): the `extern "C"` symbols. Each artifact crate
//!   (`tests/cuda-sim/runtime12`, `runtime13`, `runtime-static`) defines
//!   `const RT: vramsim_runtime::api::Flavor` and `include!`s it, and its build script
//!   derives the symbol-version list from it (`build_support.rs`).
//!
//! Adding a runtime function: add the driver entry point it needs to the table in
//! `driver.rs` (one line), write the function in `api.rs`, add one `fn` line to
//! `exports.rs`. Nothing else.

pub mod api;
pub mod driver;
pub mod errors;
pub mod kernels;
pub mod types;

/// Defines `#[unsafe(no_mangle)] extern "C"` runtime functions whose body is an
/// [`api`] call returning [`api::Res`]: the body runs under [`errors::guard`] (no panic
/// crosses the C ABI; a failure becomes the thread's last error). Used by `exports.rs`.
#[macro_export]
macro_rules! cuda_exports {
    ($( $(#[$m:meta])* fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) => $body:expr; )*) => {
        $(
            $(#[$m])*
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($a: $t),*) -> $crate::types::cudaError_t {
                // SAFETY: the C caller's arguments go to the api function unchanged; its
                // contract is the CUDA function's own.
                $crate::errors::guard(|| $crate::api::code(unsafe { $body }))
            }
        )*
    };
}
