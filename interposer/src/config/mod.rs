//! The bottom layer: what the process asked for through its environment, read once at load
//! ([`env`]), and the cached switches of the layers above ([`layers`]). Imports nothing of
//! this crate.

mod env;
pub(crate) mod layers;

pub(crate) use env::{HAMI_DEVICE_LIMITS, init};
pub(crate) use env::{all, forms, raw, report, var};
