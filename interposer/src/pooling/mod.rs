//! Pool layer (owner: pool). Stub: nothing is pooled.

use vramshim_trace::{AllocKind, Api};

/// One request as the dispatcher hands it to the pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolRequest {
    pub api: Api,
    pub kind: AllocKind,
    pub device: i32,
    /// Stream the allocation is ordered on (0 = legacy default stream).
    pub stream: u64,
    pub size: u64,
}

#[inline]
pub fn enabled() -> bool {
    false
}

/// `None`: not for the pool, take the real path. `Some(Ok(ptr))` / `Some(Err(cuda_code))` otherwise.
pub fn alloc(_req: &PoolRequest) -> Option<Result<u64, i32>> {
    None
}

/// `None`: not pool memory, take the real path. `stream` is `Some` for stream-ordered frees.
pub fn free(_ptr: u64, _stream: Option<u64>) -> Option<i32> {
    None
}

/// Called in a forked child before it does anything else.
pub fn on_fork_child() {}
