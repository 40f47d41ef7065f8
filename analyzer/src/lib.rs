//! The analysis side of vramshim as a library: open a trace (a `.vramtrace`, an RMM log or a
//! PyTorch memory snapshot), analyze it in one streaming pass, and render or convert the result.
//! The `vramshim` subcommands are thin wrappers over these modules.

pub mod analysis;
pub mod convert;
pub mod error;
pub mod formats;
pub mod input;
pub mod progress;
pub mod render;
pub mod synth;
pub mod units;
pub mod whatif;

pub use analysis::{Analysis, Options, TraceReport};
pub use error::InputError;
