//! The simulated GPU's device-wide accounting, shared by every process that uses the same
//! `VRAMSIM_NAME`, as a real GPU's memory is shared by every process on the machine.
//!
//! The region lives in `/dev/shm/vramsim-<uid>-<name>`. The header holds the device count,
//! the capacity, the bytes in use per device (never above the capacity) and a high-water
//! mark. Each attached process owns a slot (pid + process start time from `/proc/<pid>/stat`,
//! so a reused pid cannot inherit a dead process's memory) that records what it holds, so a
//! dead process's share can be given back by whoever notices.
//!
//! Exactness: every change to the totals and slots happens under one process-shared robust
//! mutex in the region, and the totals always equal the sum of the slots when it is free. A
//! process killed while holding it (mid-update) leaves the next locker `EOWNERDEAD`: it sets
//! each total back to the sum of the slots (the dead process's slot is then drained whole by
//! the reclaim), so a SIGKILL never leaks or double-frees a byte.
//!
//! Readers (NVML, tests, `vramsim-smi`) open the region with [`DeviceState::open`] and never
//! claim a slot.

use std::cell::UnsafeCell;
use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub mod parse;

pub const MAX_DEVICES: usize = 16;
pub const MAX_SLOTS: usize = 512;
/// "VRAMSIM1" + layout revision; a mismatch re-initialises an unused region.
const MAGIC: u64 = 0x5652_414d_5349_4d04;

pub const DEFAULT_NAME: &str = "default";
pub const DEFAULT_MEMORY: u64 = 16 << 30;
pub const DEFAULT_DEVICES: u32 = 1;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    devices: AtomicU32,
    /// One past the highest slot ever claimed: scans stop there, so the untouched tail of a
    /// fresh (sparse) region file never takes memory.
    slot_hwm: AtomicU32,
    capacity: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    high_water: [AtomicU64; MAX_DEVICES],
    /// Refusals the device itself made (OOM at capacity), for tests.
    refusals: [AtomicU64; MAX_DEVICES],
    /// Guards every change of `used`, `high_water` and the slots (process-shared, robust).
    lock: UnsafeCell<libc::pthread_mutex_t>,
}

#[repr(C)]
struct Slot {
    pid: AtomicU64,
    start: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
struct Region {
    header: Header,
    slots: [Slot; MAX_SLOTS],
}

/// One process's view of what it holds (for `vramsim-smi` and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUse {
    pub pid: u32,
    pub used: Vec<u64>,
}

/// A mapping of the shared region. Cheap to share between threads.
pub struct DeviceState {
    region: *mut Region,
    path: PathBuf,
    /// When the last full liveness check (reading /proc) ran, to keep frequent readers
    /// (cuMemGetInfo in a loop) cheap.
    last_full_check: std::sync::Mutex<Option<std::time::Instant>>,
}

// SAFETY: the region is only accessed through atomics.
unsafe impl Send for DeviceState {}
// SAFETY: the region is only accessed through atomics.
unsafe impl Sync for DeviceState {}

/// Handle of the slot this process claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotId(usize);

impl DeviceState {
    /// Where the region of `name` lives.
    pub fn path(name: &str) -> PathBuf {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        // /dev/shm is memory everywhere glibc runs; a container without it gets the temp dir.
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("vramsim-{uid}-{safe}"))
    }

    /// Opens (creating it if needed) the device `name` with this configuration. A region that
    /// nobody alive uses is re-initialised when its configuration differs; a region in use
    /// keeps its own (the GPU is what it is), which the caller reads back with
    /// [`capacity`](Self::capacity) and [`devices`](Self::devices).
    pub fn open_or_create(name: &str, devices: u32, capacity: u64) -> io::Result<Self> {
        let path = Self::path(name);
        let state = Self::map(&path, true)?;
        let fd_lock = FileLock::new(&path)?;
        let h = state.header();
        let devices = devices.clamp(1, MAX_DEVICES as u32);
        let fresh = h.magic.load(Ordering::Acquire) != MAGIC;
        let differs = h.devices.load(Ordering::Acquire) != devices
            || h.capacity.load(Ordering::Acquire) != capacity;
        if fresh
            || (differs && {
                state.reclaim_dead();
                state.live_slots() == 0
            })
        {
            state.init(devices, capacity);
        }
        drop(fd_lock);
        Ok(state)
    }

    /// Deletes the region of `name` (tests clean up with it; a later process starts afresh).
    pub fn remove(name: &str) -> io::Result<()> {
        std::fs::remove_file(Self::path(name))
    }

    /// Opens an existing region for reading; never creates one.
    pub fn open(name: &str) -> io::Result<Self> {
        let path = Self::path(name);
        let state = Self::map(&path, false)?;
        if state.header().magic.load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a vramsim device region",
            ));
        }
        Ok(state)
    }

    fn map(path: &Path, create: bool) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        let flags = libc::O_RDWR | libc::O_CLOEXEC | if create { libc::O_CREAT } else { 0 };
        // SAFETY: c is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = std::mem::size_of::<Region>();
        // SAFETY: fd is ours; growing a shared file is idempotent across processes.
        let grow = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 && (st.st_size as usize) < size {
                libc::ftruncate(fd, size as libc::off_t)
            } else {
                0
            }
        };
        if grow != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: mapping a file we own of at least `size` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        // SAFETY: the mapping keeps the file alive.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            region: p.cast(),
            path: path.to_path_buf(),
            last_full_check: std::sync::Mutex::new(None),
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: region maps a whole Region for the life of self; all fields are atomics.
        unsafe { &(*self.region).header }
    }

    fn all_slots(&self) -> &[Slot; MAX_SLOTS] {
        // SAFETY: as in header().
        unsafe { &(*self.region).slots }
    }

    /// The slots ever claimed (a prefix of the table).
    fn slots(&self) -> &[Slot] {
        let n = (self.header().slot_hwm.load(Ordering::Acquire) as usize).min(MAX_SLOTS);
        &self.all_slots()[..n]
    }

    fn init(&self, devices: u32, capacity: u64) {
        let h = self.header();
        h.magic.store(0, Ordering::Release);
        // SAFETY: nobody alive uses the region (the caller holds the file lock and checked),
        // so (re)initialising the mutex in place races with no one; the attribute object is
        // local and destroyed after use.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            libc::pthread_mutex_init(h.lock.get(), &attr);
            libc::pthread_mutexattr_destroy(&mut attr);
        }
        h.devices.store(devices, Ordering::Relaxed);
        h.capacity.store(capacity, Ordering::Relaxed);
        for d in 0..MAX_DEVICES {
            h.used[d].store(0, Ordering::Relaxed);
            h.high_water[d].store(0, Ordering::Relaxed);
            h.refusals[d].store(0, Ordering::Relaxed);
        }
        for s in self.slots() {
            s.pid.store(0, Ordering::Relaxed);
            s.start.store(0, Ordering::Relaxed);
            for u in &s.used {
                u.store(0, Ordering::Relaxed);
            }
        }
        h.slot_hwm.store(0, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    pub fn file(&self) -> &PathBuf {
        &self.path
    }
    pub fn capacity(&self) -> u64 {
        self.header().capacity.load(Ordering::Acquire)
    }
    pub fn devices(&self) -> u32 {
        self.header().devices.load(Ordering::Acquire)
    }

    /// Bytes every live process together holds on `dev` (dead processes are reclaimed first).
    pub fn used(&self, dev: usize) -> u64 {
        self.reclaim_dead_throttled();
        self.used_raw(dev)
    }

    /// Reclaims exited processes at once (a signal-0 probe per slot) and does the full check
    /// (zombies, reused pids) at most every 50 ms.
    fn reclaim_dead_throttled(&self) {
        let full = {
            let mut g = self
                .last_full_check
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let due = g.is_none_or(|t| t.elapsed() >= std::time::Duration::from_millis(50));
            if due {
                *g = Some(std::time::Instant::now());
            }
            due
        };
        self.reclaim(full);
    }

    /// As [`used`](Self::used) without reclaiming first.
    pub fn used_raw(&self, dev: usize) -> u64 {
        self.header()
            .used
            .get(dev)
            .map_or(0, |u| u.load(Ordering::Acquire))
    }

    /// The most bytes ever in use at once on `dev`.
    pub fn high_water(&self, dev: usize) -> u64 {
        self.header()
            .high_water
            .get(dev)
            .map_or(0, |u| u.load(Ordering::Acquire))
    }

    /// How many requests the device refused for lack of memory.
    pub fn refusals(&self, dev: usize) -> u64 {
        self.header()
            .refusals
            .get(dev)
            .map_or(0, |u| u.load(Ordering::Acquire))
    }

    /// `capacity - used` (dead processes reclaimed first).
    pub fn free(&self, dev: usize) -> u64 {
        self.capacity().saturating_sub(self.used(dev))
    }

    /// Takes the region's lock. A holder that died mid-update left the totals possibly out
    /// of step with the slots: they are set back to the sum of the slots first.
    fn lock(&self) -> Locked<'_> {
        let m = self.header().lock.get();
        // SAFETY: the mutex was initialised by `init` in the shared mapping, which outlives
        // the guard; robust and process-shared, so a dead owner gives EOWNERDEAD.
        let r = unsafe { libc::pthread_mutex_lock(m) };
        if r == libc::EOWNERDEAD {
            if !fault_no_repair() {
                self.resum();
            }
            // SAFETY: we own the mutex now (EOWNERDEAD) and have made the state consistent.
            unsafe { libc::pthread_mutex_consistent(m) };
        }
        Locked {
            state: self,
            held: r == 0 || r == libc::EOWNERDEAD,
        }
    }

    /// Sets each device's total to the sum of the slots (under the lock).
    fn resum(&self) {
        let h = self.header();
        for d in 0..MAX_DEVICES {
            let sum: u64 = self
                .slots()
                .iter()
                .filter(|s| s.pid.load(Ordering::Acquire) != 0)
                .map(|s| s.used[d].load(Ordering::Acquire))
                .sum();
            h.used[d].store(sum, Ordering::Release);
        }
    }

    /// Claims a slot for the calling process.
    pub fn claim_slot(&self) -> Option<SlotId> {
        let (pid, start) = self_identity();
        for attempt in 0..2 {
            {
                let _g = self.lock();
                for (i, s) in self.all_slots().iter().enumerate() {
                    if s.pid.load(Ordering::Acquire) != 0 {
                        continue;
                    }
                    s.start.store(start, Ordering::Relaxed);
                    for u in &s.used {
                        u.store(0, Ordering::Relaxed);
                    }
                    s.pid.store(pid as u64, Ordering::Release);
                    self.header()
                        .slot_hwm
                        .fetch_max(i as u32 + 1, Ordering::AcqRel);
                    return Some(SlotId(i));
                }
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        None
    }

    /// Gives back everything the slot holds and frees it (process exit).
    pub fn release_slot(&self, slot: SlotId) {
        let _g = self.lock();
        let s = &self.all_slots()[slot.0];
        self.drain_slot(s);
        s.pid.store(0, Ordering::Release);
    }

    /// Gives the slot's bytes back to the totals (under the lock).
    fn drain_slot(&self, s: &Slot) {
        let h = self.header();
        for d in 0..MAX_DEVICES {
            let n = s.used[d].swap(0, Ordering::AcqRel);
            if n > 0 {
                let cur = h.used[d].load(Ordering::Acquire);
                h.used[d].store(cur.saturating_sub(n), Ordering::Release);
            }
        }
    }

    /// Reserves `bytes` on `dev` for `slot`; false when the device would exceed its capacity.
    pub fn reserve(&self, slot: SlotId, dev: usize, bytes: u64) -> bool {
        if dev >= MAX_DEVICES {
            return false;
        }
        let h = self.header();
        let cap = self.capacity();
        for attempt in 0..2 {
            {
                let _g = self.lock();
                let cur = h.used[dev].load(Ordering::Acquire);
                if let Some(next) = cur.checked_add(bytes).filter(|n| *n <= cap) {
                    h.used[dev].store(next, Ordering::Release);
                    fault_pause();
                    self.all_slots()[slot.0].used[dev].fetch_add(bytes, Ordering::AcqRel);
                    h.high_water[dev].fetch_max(next, Ordering::AcqRel);
                    return true;
                }
            }
            if attempt == 0 && self.reclaim_dead() > 0 {
                continue;
            }
            break;
        }
        h.refusals[dev].fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Gives back `bytes` on `dev` that `slot` reserved (never more than the slot holds).
    pub fn release(&self, slot: SlotId, dev: usize, bytes: u64) {
        if dev >= MAX_DEVICES || bytes == 0 {
            return;
        }
        let _g = self.lock();
        let s = &self.all_slots()[slot.0].used[dev];
        let take = s.load(Ordering::Acquire).min(bytes);
        s.fetch_sub(take, Ordering::AcqRel);
        fault_pause();
        let h = &self.header().used[dev];
        h.store(
            h.load(Ordering::Acquire).saturating_sub(take),
            Ordering::Release,
        );
    }

    /// Frees the slots of processes that are gone (or zombies: a real driver frees a process's
    /// memory when it exits, before its parent reaps it). Returns how many slots were freed.
    pub fn reclaim_dead(&self) -> usize {
        self.reclaim(true)
    }

    fn reclaim(&self, full: bool) -> usize {
        let mut n = 0;
        for s in self.slots() {
            let pid = s.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let start = s.start.load(Ordering::Acquire);
            let alive = if full {
                process_alive(pid as u32, start)
            } else {
                // SAFETY: signal 0 only probes for existence.
                let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
                r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
            };
            if alive {
                continue;
            }
            let _g = self.lock();
            if s.pid.load(Ordering::Acquire) == pid && s.start.load(Ordering::Acquire) == start {
                self.drain_slot(s);
                s.pid.store(0, Ordering::Release);
                n += 1;
            }
        }
        n
    }

    fn live_slots(&self) -> usize {
        self.slots()
            .iter()
            .filter(|s| s.pid.load(Ordering::Acquire) != 0)
            .count()
    }

    /// The processes holding memory on the device, with their per-device use.
    pub fn processes(&self) -> Vec<ProcessUse> {
        let ndev = self.devices() as usize;
        self.slots()
            .iter()
            .filter_map(|s| {
                let pid = s.pid.load(Ordering::Acquire);
                if pid == 0 {
                    return None;
                }
                let used = s.used[..ndev]
                    .iter()
                    .map(|u| u.load(Ordering::Acquire))
                    .collect();
                Some(ProcessUse {
                    pid: pid as u32,
                    used,
                })
            })
            .collect()
    }

    /// A JSON object describing the device (what `vramsim-smi` prints).
    pub fn to_json(&self) -> String {
        self.reclaim_dead();
        let ndev = self.devices() as usize;
        let list = |f: &dyn Fn(usize) -> u64| {
            (0..ndev)
                .map(|d| f(d).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let procs = self
            .processes()
            .iter()
            .map(|p| {
                let used = p
                    .used
                    .iter()
                    .map(|u| u.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                format!("{{\"pid\":{},\"used\":[{}]}}", p.pid, used)
            })
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "{{\"file\":\"{}\",\"devices\":{},\"capacity\":{},\"used\":[{}],\"high_water\":[{}],\"refusals\":[{}],\"processes\":[{}]}}",
            self.path.display(),
            ndev,
            self.capacity(),
            list(&|d| self.used_raw(d)),
            list(&|d| self.high_water(d)),
            list(&|d| self.refusals(d)),
            procs
        )
    }
}

/// The region's lock, held until dropped.
struct Locked<'a> {
    state: &'a DeviceState,
    held: bool,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if self.held {
            // SAFETY: this thread holds the mutex (taken by `lock`).
            unsafe { libc::pthread_mutex_unlock(self.state.header().lock.get()) };
        }
    }
}

/// `VRAMSIM_DEVSTATE_FAULT`, a test-only switch: `no-repair` skips setting the totals back to
/// the sum of the slots after a holder died mid-update (a SIGKILL then leaks), and `pause`
/// (with either) makes every update sleep between its two halves, so a test can kill a
/// process there.
fn devstate_fault() -> &'static str {
    static F: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    F.get_or_init(|| std::env::var("VRAMSIM_DEVSTATE_FAULT").unwrap_or_default())
}

fn fault_no_repair() -> bool {
    devstate_fault().contains("no-repair")
}

fn fault_pause() {
    if devstate_fault().contains("pause") {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

impl Drop for DeviceState {
    fn drop(&mut self) {
        // SAFETY: region was mapped by map() with this size.
        unsafe { libc::munmap(self.region.cast(), std::mem::size_of::<Region>()) };
    }
}

/// flock on the region file, so two first processes don't both initialise it.
struct FileLock(libc::c_int);

impl FileLock {
    fn new(path: &Path) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
        // SAFETY: valid path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is ours.
        unsafe { libc::flock(fd, libc::LOCK_EX) };
        Ok(Self(fd))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: fd is ours; closing releases the lock.
        unsafe { libc::close(self.0) };
    }
}

/// (pid, start time in clock ticks since boot) of the calling process.
pub fn self_identity() -> (u32, u64) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    (pid, proc_start(pid).map_or(0, |(s, _)| s))
}

/// (start time, state char) from `/proc/<pid>/stat`.
fn proc_start(pid: u32) -> Option<(u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    // After state come fields 4.. ; starttime is field 22, i.e. the 19th after state.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// Whether the process that claimed a slot as (pid, start) still runs.
pub fn process_alive(pid: u32, start: u64) -> bool {
    match proc_start(pid) {
        Some((s, state)) => s == start && state != 'Z' && state != 'X',
        None => false,
    }
}

/// The name both the driver and NVML report for device `dev`.
pub fn device_name(dev: u32) -> String {
    format!("vramsim GPU {dev} (simulated)")
}

/// The UUID both the driver (cuDeviceGetUuid) and NVML (`GPU-…`) report: stable per device
/// name and ordinal, different between simulated devices.
pub fn device_uuid(name: &str, dev: u32) -> [u8; 16] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain(dev.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&h.to_le_bytes());
    bytes[8..].copy_from_slice(&(h.rotate_left(29) ^ 0x5652_414d).to_le_bytes());
    bytes
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints UUIDs.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(t: &str) -> String {
        format!("devstate-unit-{t}-{}", std::process::id())
    }

    #[test]
    fn reserve_never_exceeds_capacity() {
        let n = name("cap");
        let s = DeviceState::open_or_create(&n, 1, 10).unwrap();
        let slot = s.claim_slot().unwrap();
        assert!(s.reserve(slot, 0, 6));
        assert!(!s.reserve(slot, 0, 5));
        assert!(s.reserve(slot, 0, 4));
        assert_eq!(s.used(0), 10);
        assert_eq!(s.high_water(0), 10);
        assert_eq!(s.refusals(0), 1);
        s.release(slot, 0, 10);
        assert_eq!(s.used(0), 0);
        s.release_slot(slot);
        let _ = std::fs::remove_file(s.file());
    }

    #[test]
    fn dead_slot_is_reclaimed() {
        let n = name("dead");
        let s = DeviceState::open_or_create(&n, 1, 100).unwrap();
        // Forge a slot for a pid that cannot exist with this start time.
        let slot = s.claim_slot().unwrap();
        assert!(s.reserve(slot, 0, 40));
        s.all_slots()[slot.0]
            .start
            .store(u64::MAX - 1, Ordering::Release);
        assert_eq!(s.used(0), 0);
        let _ = std::fs::remove_file(s.file());
    }

    #[test]
    fn identity_reads_proc() {
        let (pid, start) = self_identity();
        assert!(start > 0);
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
    }
}
