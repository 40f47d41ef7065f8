//! Linear device memory (cuMemAlloc & co) and pinned host memory.
//!
//! Device memory is host memory mapped with mmap, so device pointers are host addresses and
//! copies are memcpy. Charging follows a real driver (Pascal and later: 2 MiB pages, and
//! allocations above 1 MiB always page-aligned): a request of at most 1 MiB is placed in a
//! shared 2 MiB page (512-byte units, first fit), and the page is charged while any
//! allocation lives in it; larger requests get pages of their own, rounded up to 2 MiB
//! multiples and charged as such. Pages (and large allocations) are 2 MiB-aligned, as the
//! driver's are, so the page of a packed allocation is its address rounded down to 2 MiB.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, Res};
use crate::state;

pub const PAGE: u64 = 2 << 20;
pub const UNIT: u64 = 512;
/// The largest request packed into a shared page.
pub const PACKED_MAX: u64 = 1 << 20;
const UNITS: usize = (PAGE / UNIT) as usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    /// From a memory pool (cuMemAllocAsync/FromPoolAsync), with the pool's id.
    Pool(u64),
    /// A module's global variable (freed with its module).
    Global,
    /// An allocation node's memory (see `graph`).
    Graph,
}

#[derive(Clone, Copy, Debug)]
enum Backing {
    Whole {
        len: u64,
    },
    InPage {
        page: u64,
        first: usize,
        units: usize,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct Alloc {
    pub size: u64,
    pub dev: i32,
    pub kind: Kind,
    backing: Backing,
}

struct Page {
    dev: i32,
    /// Free extents of 512-byte units: start -> length, coalesced.
    free: BTreeMap<usize, usize>,
    used: usize,
}

impl Page {
    fn new(dev: i32) -> Self {
        Page {
            dev,
            free: BTreeMap::from([(0, UNITS)]),
            used: 0,
        }
    }

    /// First fit: the lowest extent that holds `n` units.
    fn find(&self, n: usize) -> Option<usize> {
        if UNITS - self.used < n {
            return None;
        }
        self.free.iter().find(|(_, l)| **l >= n).map(|(s, _)| *s)
    }

    /// Takes `n` units at `first`, the start of a free extent found by `find`.
    fn take(&mut self, first: usize, n: usize) {
        if let Some(len) = self.free.remove(&first) {
            if len > n {
                self.free.insert(first + n, len - n);
            }
            self.used += n;
        }
    }

    fn give(&mut self, first: usize, n: usize) {
        let mut start = first;
        let mut len = n;
        if let Some((&ps, &pl)) = self.free.range(..first).next_back()
            && ps + pl == first
        {
            self.free.remove(&ps);
            start = ps;
            len += pl;
        }
        if let Some(nl) = self.free.remove(&(first + n)) {
            len += nl;
        }
        self.free.insert(start, len);
        self.used -= n;
    }
}

#[derive(Default)]
struct Mem {
    allocs: BTreeMap<u64, Alloc>,
    pages: BTreeMap<u64, Page>,
    /// Pinned host allocations: base -> length.
    host: BTreeMap<u64, u64>,
}

static MEM: Mutex<Mem> = Mutex::new(Mem {
    allocs: BTreeMap::new(),
    pages: BTreeMap::new(),
    host: BTreeMap::new(),
});

fn mem() -> std::sync::MutexGuard<'static, Mem> {
    MEM.lock().unwrap_or_else(|e| e.into_inner())
}

fn map_anon(len: u64) -> Result<u64, CUresult> {
    // SAFETY: a fresh private anonymous mapping; NORESERVE so a large simulated device does
    // not need as much committed host memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(p as u64)
}

/// `len` bytes (a multiple of [`PAGE`]) at a 2 MiB-aligned address: a larger mapping with
/// its unaligned head and tail given back.
fn map_aligned(len: u64) -> Result<u64, CUresult> {
    let raw = map_anon(len + PAGE)?;
    let start = round_up(raw, PAGE);
    if start > raw {
        unmap(raw, start - raw);
    }
    let end = start + len;
    let raw_end = raw + len + PAGE;
    if raw_end > end {
        unmap(end, raw_end - end);
    }
    Ok(start)
}

fn unmap(addr: u64, len: u64) {
    // SAFETY: addr/len is a mapping this module created and nothing else refers to.
    unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
}

pub fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Allocates `size` bytes of device memory on `dev`, charging the device.
pub fn alloc(dev: i32, size: u64, kind: Kind) -> Result<u64, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut m = mem();
    if size <= PACKED_MAX {
        let units = size.div_ceil(UNIT) as usize;
        let spot = m
            .pages
            .iter()
            .filter(|(_, p)| p.dev == dev)
            .find_map(|(b, p)| p.find(units).map(|f| (*b, f)));
        let (page, first) = match spot {
            Some(s) => s,
            None => {
                state::charge(dev, PAGE)?;
                let base = match map_aligned(PAGE) {
                    Ok(b) => b,
                    Err(e) => {
                        state::uncharge(dev, PAGE);
                        return Err(e);
                    }
                };
                m.pages.insert(base, Page::new(dev));
                (base, 0)
            }
        };
        if let Some(p) = m.pages.get_mut(&page) {
            p.take(first, units);
        }
        let ptr = page + first as u64 * UNIT;
        m.allocs.insert(
            ptr,
            Alloc {
                size,
                dev,
                kind,
                backing: Backing::InPage { page, first, units },
            },
        );
        Ok(ptr)
    } else {
        let len = size
            .checked_next_multiple_of(PAGE)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        state::charge(dev, len)?;
        let ptr = match map_aligned(len) {
            Ok(p) => p,
            Err(e) => {
                state::uncharge(dev, len);
                return Err(e);
            }
        };
        m.allocs.insert(
            ptr,
            Alloc {
                size,
                dev,
                kind,
                backing: Backing::Whole { len },
            },
        );
        Ok(ptr)
    }
}

/// Frees the allocation starting at `ptr` if it is of an accepted kind.
pub fn free(ptr: u64, accept: impl Fn(Kind) -> bool) -> Result<Alloc, CUresult> {
    let mut m = mem();
    match m.allocs.get(&ptr) {
        Some(a) if accept(a.kind) => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    let a = m.allocs.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    release(&mut m, ptr, &a);
    Ok(a)
}

fn release(m: &mut Mem, ptr: u64, a: &Alloc) {
    match a.backing {
        Backing::Whole { len } => {
            unmap(ptr, len);
            state::uncharge(a.dev, len);
        }
        Backing::InPage { page, first, units } => {
            let empty = m.pages.get_mut(&page).is_some_and(|p| {
                p.give(first, units);
                p.used == 0
            });
            if empty {
                m.pages.remove(&page);
                unmap(page, PAGE);
                state::uncharge(a.dev, PAGE);
            }
        }
    }
}

/// Everything of `dev` goes (primary context reset / destroy).
pub fn free_all_on_device(dev: i32) {
    let mut m = mem();
    let doomed: Vec<(u64, Alloc)> = m
        .allocs
        .iter()
        .filter(|(_, a)| a.dev == dev)
        .map(|(p, a)| (*p, *a))
        .collect();
    for (p, a) in doomed {
        m.allocs.remove(&p);
        release(&mut m, p, &a);
    }
}

/// The allocation containing `ptr`: (base, allocation).
pub fn find(ptr: u64) -> Option<(u64, Alloc)> {
    let m = mem();
    let (b, a) = m.allocs.range(..=ptr).next_back()?;
    (ptr < b + a.size.max(1)).then_some((*b, *a))
}

/// Whether `[ptr, ptr+len)` lies in one device allocation.
pub fn contains(ptr: u64, len: u64) -> bool {
    find(ptr).is_some_and(|(b, a)| ptr + len <= b + a.size)
}

/// Pinned host memory: not charged to any device.
pub fn host_alloc(size: u64) -> Result<u64, CUresult> {
    let len = round_up(size.max(1), 4096);
    let p = map_anon(len)?;
    mem().host.insert(p, len);
    Ok(p)
}

pub fn host_free(ptr: u64) -> Res {
    let len = mem().host.remove(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    unmap(ptr, len);
    Ok(())
}

/// The pinned host allocation containing `ptr`: (base, length).
pub fn host_find(ptr: u64) -> Option<(u64, u64)> {
    let m = mem();
    let (b, l) = m.host.range(..=ptr).next_back()?;
    (ptr < b + l).then_some((*b, *l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_first_fit_and_coalescing() {
        let mut p = Page::new(0);
        assert_eq!(p.find(1), Some(0));
        p.take(0, 100);
        assert_eq!(p.find(1), Some(100));
        p.take(100, 100);
        p.take(200, 3000);
        p.give(100, 100);
        assert_eq!(p.find(100), Some(100));
        assert_eq!(p.find(101), Some(3200));
        assert_eq!(p.find(UNITS - 3200), Some(3200));
        assert_eq!(p.find(UNITS - 3199), None);
        p.give(0, 100);
        assert_eq!(p.find(200), Some(0));
        p.give(200, 3000);
        assert_eq!(p.used, 0);
        assert_eq!(p.free.len(), 1);
        assert_eq!(p.find(UNITS), Some(0));
    }
}
