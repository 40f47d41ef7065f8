//! Stream-ordered memory pools (cuMemAllocAsync, cuMemFreeAsync, cuMemPool*).
//!
//! A pool's blocks come from the same packed device allocator as cuMemAlloc. cuMemFreeAsync
//! gives a block back to its pool when the stream reaches the free; the pool then keeps
//! cached blocks up to its release threshold (default 0) and returns the rest to the device
//! at once (a real pool waits for the next synchronization; releasing at the stream point is
//! the simplification). A cached block is reused by a later request of the same rounded size
//! on any stream: it only entered the cache once the freeing stream had finished with it.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use crate::abi::*;
use crate::mem::{self, Kind, UNIT};
use crate::state;
use crate::stream::Stream;

const POOL_BASE: usize = 0x7c90_0000_0000;
const STEP: usize = 0x100;

#[derive(Default)]
struct Pool {
    dev: i32,
    is_default: bool,
    release_threshold: u64,
    reuse_flags: [i32; 3],
    reserved: u64,
    reserved_high: u64,
    used: u64,
    used_high: u64,
    /// Live blocks: ptr -> rounded size.
    live: HashMap<u64, u64>,
    /// Cached blocks: (ptr, rounded size).
    cache: Vec<(u64, u64)>,
}

struct Pools {
    pools: HashMap<u64, Pool>,
    next: u64,
    /// Current pool per device (cuDeviceSetMemPool), default pool otherwise.
    current: HashMap<i32, u64>,
    freeing: HashSet<u64>,
}

static POOLS: LazyLock<Mutex<Pools>> = LazyLock::new(|| {
    Mutex::new(Pools {
        pools: HashMap::new(),
        next: 1000,
        current: HashMap::new(),
        freeing: HashSet::new(),
    })
});

fn pools() -> MutexGuard<'static, Pools> {
    POOLS.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn handle(id: u64) -> CUmemoryPool {
    (POOL_BASE + id as usize * STEP) as *mut c_void
}

fn id_of(h: CUmemoryPool) -> Result<u64, CUresult> {
    let v = h as usize;
    if v <= POOL_BASE || !(v - POOL_BASE).is_multiple_of(STEP) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(((v - POOL_BASE) / STEP) as u64)
}

/// The default pool of `dev` (id dev+1), created on first use.
pub fn default_pool(dev: i32) -> Result<CUmemoryPool, CUresult> {
    state::check_device(dev)?;
    let id = dev as u64 + 1;
    pools().pools.entry(id).or_insert_with(|| Pool {
        dev,
        is_default: true,
        ..Default::default()
    });
    Ok(handle(id))
}

pub fn current_pool(dev: i32) -> Result<CUmemoryPool, CUresult> {
    let cur = pools().current.get(&dev).copied();
    match cur {
        Some(id) => Ok(handle(id)),
        None => default_pool(dev),
    }
}

pub fn set_current_pool(dev: i32, pool: CUmemoryPool) -> Res {
    state::check_device(dev)?;
    let id = id_of(pool)?;
    let mut p = pools();
    match p.pools.get(&id) {
        Some(pl) if pl.dev == dev => {
            p.current.insert(dev, id);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

pub fn create(dev: i32) -> Result<CUmemoryPool, CUresult> {
    state::check_device(dev)?;
    let mut p = pools();
    p.next += 1;
    let id = p.next;
    p.pools.insert(
        id,
        Pool {
            dev,
            ..Default::default()
        },
    );
    Ok(handle(id))
}

pub fn destroy(h: CUmemoryPool) -> Res {
    let id = id_of(h)?;
    let mut p = pools();
    match p.pools.get(&id) {
        Some(pl) if !pl.is_default => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    trim_locked(&mut p, id, 0);
    p.pools.remove(&id);
    p.current.retain(|_, v| *v != id);
    Ok(())
}

/// Allocates from pool `h` (or the device's current pool when `h` is None).
pub fn alloc(h: Option<CUmemoryPool>, size: u64) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = match h {
        Some(h) => h,
        None => current_pool(crate::ctx::current_device()?)?,
    };
    let id = id_of(h)?;
    let rounded = mem::round_up(size, UNIT);
    let mut p = pools();
    let pl = p.pools.get_mut(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ptr = match pl.cache.iter().position(|(_, s)| *s == rounded) {
        Some(i) => pl.cache.swap_remove(i).0,
        None => {
            let ptr = mem::alloc(pl.dev, rounded, Kind::Pool(id))?;
            pl.reserved += rounded;
            pl.reserved_high = pl.reserved_high.max(pl.reserved);
            ptr
        }
    };
    pl.used += rounded;
    pl.used_high = pl.used_high.max(pl.used);
    pl.live.insert(ptr, rounded);
    Ok(ptr)
}

fn owner(p: &Pools, ptr: u64) -> Option<u64> {
    p.pools
        .iter()
        .find(|(_, pl)| pl.live.contains_key(&ptr))
        .map(|(id, _)| *id)
}

/// cuMemFreeAsync: invalid at once for an unknown or already freed pointer; the block goes
/// back to its pool when `s` reaches this point.
pub fn free_async(ptr: u64, s: &Arc<Stream>) -> Res {
    let id = {
        let mut p = pools();
        let Some(id) = owner(&p, ptr) else {
            drop(p);
            return free_linear_async(ptr, s);
        };
        if !p.freeing.insert(ptr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        id
    };
    let queued = s.submit(
        Vec::new(),
        Duration::ZERO,
        Box::new(move || give_back(id, ptr)),
    );
    if queued.is_none() {
        // A capture begun since the caller checked the stream (a race of the program's):
        // never executed, so the pool takes the block back now to stay consistent.
        give_back(id, ptr);
    }
    Ok(())
}

/// cuMemFreeAsync of cuMemAlloc memory: freed when the stream reaches it.
fn free_linear_async(ptr: u64, s: &Arc<Stream>) -> Res {
    match mem::find(ptr) {
        Some((b, a)) if b == ptr && matches!(a.kind, Kind::Device | Kind::Managed) => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    {
        let mut p = pools();
        if !p.freeing.insert(ptr) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let work = move || {
        pools().freeing.remove(&ptr);
        let _ = mem::free(ptr, |k| matches!(k, Kind::Device | Kind::Managed));
    };
    if s.submit(Vec::new(), Duration::ZERO, Box::new(work))
        .is_none()
    {
        pools().freeing.remove(&ptr);
        let _ = mem::free(ptr, |k| matches!(k, Kind::Device | Kind::Managed));
    }
    Ok(())
}

fn give_back(id: u64, ptr: u64) {
    let mut p = pools();
    p.freeing.remove(&ptr);
    if let Some(pl) = p.pools.get_mut(&id)
        && let Some(size) = pl.live.remove(&ptr)
    {
        pl.used -= size;
        pl.cache.push((ptr, size));
        let keep = pl.release_threshold;
        trim_locked(&mut p, id, keep);
    }
}

/// cuMemFree_v2 on pool memory: frees it now (the caller synchronized).
pub fn free_now(ptr: u64) -> Result<bool, CUresult> {
    let mut p = pools();
    let Some(id) = owner(&p, ptr) else {
        return Ok(false);
    };
    if p.freeing.contains(&ptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(pl) = p.pools.get_mut(&id)
        && let Some(size) = pl.live.remove(&ptr)
    {
        pl.used -= size;
        pl.reserved -= size;
        mem::free(ptr, |k| k == Kind::Pool(id))?;
    }
    Ok(true)
}

fn trim_locked(p: &mut Pools, id: u64, keep: u64) {
    let Some(pl) = p.pools.get_mut(&id) else {
        return;
    };
    while pl.reserved > keep {
        let Some((ptr, size)) = pl.cache.pop() else {
            break;
        };
        let _ = mem::free(ptr, |k| k == Kind::Pool(id));
        pl.reserved -= size;
    }
}

pub fn trim_to(h: CUmemoryPool, keep: u64) -> Res {
    let id = id_of(h)?;
    let mut p = pools();
    if !p.pools.contains_key(&id) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    trim_locked(&mut p, id, keep);
    Ok(())
}

/// A device's pools lose everything when its context goes (memory already freed by mem).
pub fn reset_device(dev: i32) {
    let mut p = pools();
    for pl in p.pools.values_mut().filter(|pl| pl.dev == dev) {
        pl.live.clear();
        pl.cache.clear();
        pl.reserved = 0;
        pl.used = 0;
    }
}

/// Pool attribute as u64 (the int attributes are widened).
pub fn get_attr(h: CUmemoryPool, attr: i32) -> Result<u64, CUresult> {
    let id = id_of(h)?;
    let p = pools();
    let pl = p.pools.get(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(match attr {
        1..=3 => pl.reuse_flags[(attr - 1) as usize] as u64,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.release_threshold,
        CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => pl.reserved,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => pl.reserved_high,
        CU_MEMPOOL_ATTR_USED_MEM_CURRENT => pl.used,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH => pl.used_high,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

pub fn set_attr(h: CUmemoryPool, attr: i32, v: u64) -> Res {
    let id = id_of(h)?;
    let mut p = pools();
    let pl = p.pools.get_mut(&id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        1..=3 => pl.reuse_flags[(attr - 1) as usize] = v as i32,
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => pl.release_threshold = v,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if v == 0 => pl.reserved_high = pl.reserved,
        CU_MEMPOOL_ATTR_USED_MEM_HIGH if v == 0 => pl.used_high = pl.used,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let keep = pl.release_threshold;
    trim_locked(&mut p, id, keep);
    Ok(())
}

/// Whether `attr` is one of the int-valued attributes (1..=3).
pub fn is_int_attr(attr: i32) -> bool {
    (1..=3).contains(&attr)
}

/// The pool handle owning `ptr`, for pointer attributes.
pub fn pool_of(ptr: u64) -> Option<CUmemoryPool> {
    owner(&pools(), ptr).map(handle)
}
