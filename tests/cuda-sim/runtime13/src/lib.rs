//! `libcudart.so.13` of the simulated GPU: the C symbols of `vramsim-runtime` with soname
//! and symbol version node `libcudart.so.13` (see build.rs and ../runtime/build_support.rs).
#![allow(non_snake_case, clippy::missing_safety_doc)]

/// The runtime this library is.
const RT: vramsim_runtime::api::Flavor = vramsim_runtime::api::Flavor::V13;

include!("../../runtime/src/exports.rs");
include!(concat!(env!("OUT_DIR"), "/symver.rs"));
