//! The virtual-memory API with real aliasing and real faults.
//!
//! A reservation is a PROT_NONE anonymous mapping; a physical allocation (cuMemCreate) is a
//! memfd; cuMemMap maps the memfd MAP_SHARED|MAP_FIXED into the reservation (still PROT_NONE,
//! as device memory is inaccessible until cuMemSetAccess), so one handle mapped at two
//! addresses shows the same bytes; cuMemUnmap puts PROT_NONE anonymous memory back, so a
//! later access faults. Physical memory is charged to its device at cuMemCreate and given
//! back when the handle is released and unmapped everywhere, as CUDA does.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::abi::*;
use crate::mem::PAGE;
use crate::state;

pub const GRANULARITY: u64 = PAGE;

struct Handle {
    fd: c_int,
    size: u64,
    prop: CUmemAllocationProp,
    /// Device charged for it; None for host memory and imported handles.
    charged: Option<i32>,
    refs: u32,
    maps: u32,
}

// SAFETY: the raw pointer in prop (win32 metadata) is never dereferenced.
unsafe impl Send for Handle {}

#[derive(Clone, Copy)]
struct Mapping {
    size: u64,
    handle: u64,
    access: c_int,
    /// Bit `d`: device `d` was granted access by cuMemSetAccess (what kernels of `d` need).
    devs: u16,
    dev: i32,
}

#[derive(Default)]
struct Vmm {
    handles: HashMap<u64, Handle>,
    next: u64,
    reservations: BTreeMap<u64, u64>,
    mappings: BTreeMap<u64, Mapping>,
}

static VMM: LazyLock<Mutex<Vmm>> = LazyLock::new(|| {
    Mutex::new(Vmm {
        next: 0x1000,
        ..Default::default()
    })
});

fn vmm() -> MutexGuard<'static, Vmm> {
    VMM.lock().unwrap_or_else(|e| e.into_inner())
}

fn aligned(v: u64) -> bool {
    v.is_multiple_of(GRANULARITY)
}

fn anon_none(addr: u64, len: u64, fixed: bool) -> Result<u64, CUresult> {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | libc::MAP_NORESERVE
        | if fixed { libc::MAP_FIXED } else { 0 };
    // SAFETY: either a fresh mapping, or MAP_FIXED over a range of a reservation we own.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(p as u64)
}

/// cuMemAddressReserve: `size` bytes aligned to max(`align`, 2 MiB), near `hint` if possible.
pub fn reserve(size: u64, align: u64, hint: u64) -> Result<u64, CUresult> {
    if size == 0 || !aligned(size) || (align != 0 && !align.is_power_of_two()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let align = align.max(GRANULARITY);
    let over = size + align;
    let raw = anon_none(hint, over, false)?;
    let start = raw.div_ceil(align) * align;
    // SAFETY: trimming the unaligned head and tail of the mapping just made.
    unsafe {
        if start > raw {
            libc::munmap(raw as *mut libc::c_void, (start - raw) as usize);
        }
        let end = start + size;
        if raw + over > end {
            libc::munmap(end as *mut libc::c_void, (raw + over - end) as usize);
        }
    }
    vmm().reservations.insert(start, size);
    Ok(start)
}

/// cuMemAddressFree: the exact reserved range, with nothing mapped in it any more.
pub fn free_reservation(ptr: u64, size: u64) -> Res {
    let mut v = vmm();
    if v.reservations.get(&ptr) != Some(&size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if v.mappings.range(ptr..ptr + size).next().is_some() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    v.reservations.remove(&ptr);
    // SAFETY: the reservation is ours and holds no mapping.
    unsafe { libc::munmap(ptr as *mut libc::c_void, size as usize) };
    Ok(())
}

/// cuMemCreate.
pub fn create(size: u64, prop: CUmemAllocationProp) -> Result<u64, CUresult> {
    if size == 0 || !aligned(size) || prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let charged = match prop.location.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => {
            state::check_device(prop.location.id)?;
            Some(prop.location.id)
        }
        CU_MEM_LOCATION_TYPE_HOST
        | CU_MEM_LOCATION_TYPE_HOST_NUMA
        | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => None,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if let Some(dev) = charged {
        state::charge(dev, size)?;
    }
    // SAFETY: plain syscalls on a name we own; fd checked.
    let fd = unsafe { libc::memfd_create(c"vramsim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: fd is ours.
    if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        if fd >= 0 {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
        }
        if let Some(dev) = charged {
            state::uncharge(dev, size);
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(insert_handle(Handle {
        fd,
        size,
        prop,
        charged,
        refs: 1,
        maps: 0,
    }))
}

fn insert_handle(h: Handle) -> u64 {
    let mut v = vmm();
    v.next += 1;
    let id = v.next;
    v.handles.insert(id, h);
    id
}

fn maybe_destroy(v: &mut Vmm, id: u64) {
    let done = v
        .handles
        .get(&id)
        .is_some_and(|h| h.refs == 0 && h.maps == 0);
    if done && let Some(h) = v.handles.remove(&id) {
        // SAFETY: fd is ours; no mapping of it remains.
        unsafe { libc::close(h.fd) };
        if let Some(dev) = h.charged {
            state::uncharge(dev, h.size);
        }
    }
}

/// cuMemRelease.
pub fn release(id: u64) -> Res {
    let mut v = vmm();
    let h = v
        .handles
        .get_mut(&id)
        .filter(|h| h.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    h.refs -= 1;
    maybe_destroy(&mut v, id);
    Ok(())
}

/// cuMemMap.
pub fn map(ptr: u64, size: u64, offset: u64, id: u64) -> Res {
    let mut v = vmm();
    if size == 0 || !aligned(ptr) || !aligned(size) || !aligned(offset) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let in_reservation = v
        .reservations
        .range(..=ptr)
        .next_back()
        .is_some_and(|(b, s)| ptr + size <= b + s);
    if !in_reservation {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let overlaps = v
        .mappings
        .range(..ptr + size)
        .next_back()
        .is_some_and(|(b, m)| b + m.size > ptr);
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = v
        .handles
        .get_mut(&id)
        .filter(|h| h.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if offset + size > h.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // cuMemMap's parameter note: the offset "currently must be zero"; the driver refuses any
    // other with CUDA_ERROR_NOT_SUPPORTED, so a handle is only ever mapped from its start.
    if offset != 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: MAP_FIXED inside a reservation we own, over no other mapping.
    let p = unsafe {
        libc::mmap(
            ptr as *mut libc::c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            h.fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    h.maps += 1;
    let dev = h.charged.unwrap_or(h.prop.location.id.max(0));
    v.mappings.insert(
        ptr,
        Mapping {
            size,
            handle: id,
            access: CU_MEM_ACCESS_FLAGS_PROT_NONE,
            devs: 0,
            dev,
        },
    );
    Ok(())
}

/// cuMemUnmap: the range must consist of whole mappings.
pub fn unmap(ptr: u64, size: u64) -> Res {
    let mut v = vmm();
    let inside: Vec<(u64, Mapping)> = v
        .mappings
        .range(ptr..ptr + size)
        .map(|(b, m)| (*b, *m))
        .collect();
    let covered: u64 = inside.iter().map(|(_, m)| m.size).sum();
    let whole = inside.iter().all(|(b, m)| b + m.size <= ptr + size);
    if size == 0 || inside.is_empty() || inside[0].0 != ptr || covered != size || !whole {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    anon_none(ptr, size, true)?;
    for (b, m) in inside {
        v.mappings.remove(&b);
        if let Some(h) = v.handles.get_mut(&m.handle) {
            h.maps -= 1;
        }
        maybe_destroy(&mut v, m.handle);
    }
    Ok(())
}

/// cuMemSetAccess: the whole range must be mapped.
pub fn set_access(ptr: u64, size: u64, descs: &[CUmemAccessDesc]) -> Res {
    let mut v = vmm();
    if size == 0 || descs.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
    // per device: (bits granted, bits revoked) by this call; other devices keep theirs
    let (mut grant, mut revoke) = (0u16, 0u16);
    for d in descs {
        match d.location.type_ {
            CU_MEM_LOCATION_TYPE_DEVICE => {
                state::check_device(d.location.id)?;
                let bit = 1u16 << d.location.id;
                if d.flags == CU_MEM_ACCESS_FLAGS_PROT_NONE {
                    revoke |= bit;
                } else {
                    grant |= bit;
                }
            }
            CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        if !matches!(d.flags, 0 | 1 | 3) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        flags = flags.max(d.flags);
    }
    let covering = covering(&v, ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let prot = match flags {
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE => libc::PROT_READ | libc::PROT_WRITE,
        CU_MEM_ACCESS_FLAGS_PROT_READ => libc::PROT_READ,
        _ => libc::PROT_NONE,
    };
    // SAFETY: the range is mapped by us (checked by covering()).
    if unsafe { libc::mprotect(ptr as *mut libc::c_void, size as usize, prot) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in covering {
        if let Some(m) = v.mappings.get_mut(&b) {
            m.access = flags;
            m.devs = (m.devs & !revoke) | grant;
        }
    }
    Ok(())
}

/// Bases of the mappings that together cover [ptr, ptr+size) without gaps.
fn covering(v: &Vmm, ptr: u64, size: u64) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    let mut at = ptr;
    let end = ptr + size;
    while at < end {
        let (b, m) = v.mappings.range(..=at).next_back()?;
        if b + m.size <= at {
            return None;
        }
        out.push(*b);
        at = b + m.size;
    }
    Some(out)
}

/// cuMemGetAccess: the range's widest grant, or `PROT_NONE` for a device location that was
/// granted nothing (read and read-write grants are not told apart per device).
pub fn get_access(ptr: u64, device: Option<i32>) -> Result<c_int, CUresult> {
    let v = vmm();
    let (b, m) = v
        .mappings
        .range(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ptr >= b + m.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match device {
        Some(d) if !(0..16).contains(&d) || m.devs & (1 << d) == 0 => {
            Ok(CU_MEM_ACCESS_FLAGS_PROT_NONE)
        }
        _ => Ok(m.access),
    }
}

/// Whether [ptr, ptr+len) is mapped and accessible (copies and kernels may touch it).
pub fn accessible(ptr: u64, len: u64) -> bool {
    let v = vmm();
    covering(&v, ptr, len.max(1)).is_some_and(|bs| {
        bs.iter().all(|b| {
            v.mappings
                .get(b)
                .is_some_and(|m| m.access != CU_MEM_ACCESS_FLAGS_PROT_NONE)
        })
    })
}

/// Whether work of device `dev` may touch [ptr, ptr+len) of mappings: every mapping
/// covering it grants `dev` access. `None` when the range is not (wholly) mapped.
pub fn device_may_access(dev: i32, ptr: u64, len: u64) -> Option<bool> {
    let v = vmm();
    let bs = covering(&v, ptr, len.max(1))?;
    Some(bs.iter().all(|b| {
        v.mappings
            .get(b)
            .is_some_and(|m| dev >= 0 && m.devs & (1 << dev) != 0)
    }))
}

/// The mapping containing `ptr`: (base, size, device).
pub fn mapping_of(ptr: u64) -> Option<(u64, u64, i32)> {
    let v = vmm();
    let (b, m) = v.mappings.range(..=ptr).next_back()?;
    (ptr < b + m.size).then_some((*b, m.size, m.dev))
}

/// cuMemRetainAllocationHandle.
pub fn retain(ptr: u64) -> Result<u64, CUresult> {
    let mut v = vmm();
    let (b, m) = v
        .mappings
        .range(..=ptr)
        .next_back()
        .map(|(b, m)| (*b, *m))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ptr >= b + m.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = v
        .handles
        .get_mut(&m.handle)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    h.refs += 1;
    Ok(m.handle)
}

pub fn props(id: u64) -> Result<CUmemAllocationProp, CUresult> {
    vmm()
        .handles
        .get(&id)
        .map(|h| h.prop)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// cuMemExportToShareableHandle (POSIX fd only): a dup of the memfd.
pub fn export(id: u64, handle_type: c_int) -> Result<c_int, CUresult> {
    let v = vmm();
    let h = v
        .handles
        .get(&id)
        .filter(|h| h.refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        || h.prop.requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: duplicating our own fd.
    let fd = unsafe { libc::fcntl(h.fd, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        Err(CUDA_ERROR_OUT_OF_MEMORY)
    } else {
        Ok(fd)
    }
}

/// cuMemImportFromShareableHandle: the importer is not charged (the exporter's device already
/// holds the memory).
pub fn import(fd: c_int, handle_type: c_int) -> Result<u64, CUresult> {
    if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: fstat/dup on a caller-provided fd; failures are reported.
    let (size, own) = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        (st.st_size as u64, libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0))
    };
    if own < 0 || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    };
    Ok(insert_handle(Handle {
        fd: own,
        size,
        prop,
        charged: None,
        refs: 1,
        maps: 0,
    }))
}
