//! `libcudart_static.a` of the simulated GPU (CUDA 12.9 flavour). Link a C program with
//! `libcudart_static.a -lpthread -ldl -lm -lrt -lgcc_s -lc`; it reaches `libcuda.so.1`
//! through `dlopen` at run time, exactly as NVIDIA's static runtime does.
#![allow(non_snake_case, clippy::missing_safety_doc)]

/// The runtime this library is.
const RT: vramsim_runtime::api::Flavor = vramsim_runtime::api::Flavor::V12;

include!("../../runtime/src/exports.rs");
