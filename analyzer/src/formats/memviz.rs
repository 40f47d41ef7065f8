//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`), both ways.

use std::path::Path;

use vramshim_trace::Header;

use crate::error::InputError;
use crate::input::VecSource;

pub fn open(path: &Path) -> Result<(Header, VecSource), InputError> {
    Err(InputError::new(
        path,
        None,
        "memory-viz import not available yet",
    ))
}
