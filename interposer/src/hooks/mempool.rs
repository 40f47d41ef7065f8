//! `cuMemPoolCreate`: records which device a pool the process creates lives on
//! (`cuda::mempools`), so that allocations from it are charged to that device.

use crate::cuda::mempools;
use crate::cuda::types::*;

hooks! {
    /// Not an allocation: nothing is counted; the pool's device is recorded even when
    /// reached from inside another hook.
    ["cuMemPoolCreate", 11020] cuMemPoolCreate,
    fn(pool: *mut CUmemoryPool, props: *const CUmemPoolPropsHead) |h| {
        let f = match h.real() {
            Ok(f) => f,
            Err(missing) => return missing,
        };
        // SAFETY: forwarding the caller's arguments unchanged.
        let rc = unsafe { f(pool, props) };
        crate::pipeline::run_unguarded(h.name, (), || {
            if rc != CUDA_SUCCESS || pool.is_null() || props.is_null() {
                return;
            }
            // SAFETY: non-null pointers the caller passed and the driver accepted.
            let (p, loc) = unsafe { (*pool as u64, (*props).location) };
            if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
                mempools::remember(p, loc.id);
                crate::debug!("cuMemPoolCreate pool={p:#x} dev={} -> 0 [real]", loc.id);
            }
        });
        rc
    }
}
