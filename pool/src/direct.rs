//! `direct`: one driver call per request, as a process without any caching allocator
//! (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`, JAX's platform allocator) makes. Allocation is the
//! device's `malloc` (driver rounding: blocks under a page packed into shared pages, larger
//! ones rounded to whole pages); free is the device's `free`, which synchronizes (as
//! `cudaFree` does), whatever the free mode.

use crate::device::Device;
use crate::fxhash::FxMap;
use crate::{Alloc, FreeMode, Policy, PoolError, Request, Stats, round_up};

#[derive(Default)]
pub struct Direct {
    /// ptr -> (requested, charged)
    live: FxMap<u64, (u64, u64)>,
    stats: Stats,
}

impl Direct {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes the driver charges for `size` (approximation used for `reserved`).
    fn charged(gran: u64, size: u64) -> u64 {
        if size < gran {
            round_up(size.max(1), crate::ALIGN)
        } else {
            round_up(size, gran)
        }
    }
}

impl Policy for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn alloc(&mut self, dev: &mut dyn Device, req: Request) -> Result<Alloc, PoolError> {
        if let Some(e) = crate::refuse_oversized(&req, &self.stats) {
            return Err(e);
        }
        let size = req.size.max(1);
        let addr = match dev.malloc(size) {
            Ok(a) => a,
            Err(e) if e.is_oom() => {
                return Err(PoolError::OutOfMemory {
                    requested: req.size,
                    reserved: self.stats.reserved,
                    live: self.stats.live,
                    why: e,
                });
            }
            Err(e) => return Err(PoolError::Device(e)),
        };
        let charged = Self::charged(dev.granularity(), size);
        self.live.insert(addr, (req.size, charged));
        self.stats.allocs += 1;
        self.stats.add_live(req.size);
        let r = self.stats.reserved + charged;
        self.stats.set_reserved(r);
        Ok(Alloc {
            addr,
            size: round_up(size, crate::ALIGN),
        })
    }

    fn free(&mut self, dev: &mut dyn Device, addr: u64, _mode: FreeMode) -> Result<u64, PoolError> {
        let Some(&(req, charged)) = self.live.get(&addr) else {
            return Err(PoolError::UnknownPointer(addr));
        };
        dev.free(addr).map_err(PoolError::Device)?;
        self.live.remove(&addr);
        self.stats.frees += 1;
        self.stats.live -= req;
        let r = self.stats.reserved - charged;
        self.stats.set_reserved(r);
        Ok(req)
    }

    fn trim(&mut self, _dev: &mut dyn Device) -> Result<u64, PoolError> {
        self.stats.trims += 1;
        Ok(0)
    }

    fn note_process_sync(&mut self) {
        self.stats.process_syncs += 1;
    }

    fn owns(&self, addr: u64) -> bool {
        self.live.contains_key(&addr)
    }

    fn contains(&self, addr: u64) -> bool {
        self.live
            .iter()
            .any(|(&a, &(req, _))| addr >= a && addr < a + req.max(1))
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn reset(&mut self) {
        self.live.clear();
        self.stats.live = 0;
        self.stats.reserved = 0;
    }
}
