//! Readers and writers of the formats other tools speak.

pub mod chrome;
pub mod memviz;
pub mod perfetto;
pub mod pickle;
pub mod rmm_csv;
pub mod vramtrace;
