//! Readers and writers of the formats other tools speak.

pub mod chrome;
pub mod memviz;
pub mod parquet;
pub mod perfetto;
pub mod pickle;
pub mod rmm_csv;
pub mod vramtrace;

use vramshim_trace::MemOp;

use crate::fastmap::FastMap;

/// Bytes in use per device, followed through the successful allocations and frees of a
/// trace: the memory counter of the timeline exports (Chrome JSON, Perfetto).
#[derive(Default)]
pub(crate) struct InUse {
    per_device: FastMap<i32, u64>,
    live: FastMap<(i32, u64), u64>,
}

impl InUse {
    /// The device's bytes in use after `m` (an allocation when `is_alloc`, else a free), or
    /// `None` when it changes nothing: an allocation at address 0, a free of a block the
    /// trace never showed allocated.
    pub(crate) fn apply(&mut self, m: &MemOp, is_alloc: bool) -> Option<u64> {
        let cur = self.per_device.entry(m.device).or_insert(0);
        if is_alloc {
            if m.addr == 0 {
                return None;
            }
            *cur += m.size;
            self.live.insert((m.device, m.addr), m.size);
        } else {
            *cur -= self.live.remove(&(m.device, m.addr))?;
        }
        Some(*cur)
    }
}
