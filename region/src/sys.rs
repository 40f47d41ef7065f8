//! The FFI edge: `mmap`/`munmap`, `geteuid`, `raise`, `futex` and the monotonic clock. Every
//! `unsafe` of the crate is here.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// A shared read-write mapping, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapped memory is only ever accessed through atomics (see `lib.rs`), so sharing
// the mapping between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` shared, read-write.
    pub fn file(file: &File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel chooses; the fd is valid for the
        // duration of the call; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        Self::checked(p, len)
    }

    /// Anonymous shared zeroed memory (shared with children forked after the call).
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping; the result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Self::checked(p, len)
    }

    fn checked(p: *mut libc::c_void, len: usize) -> io::Result<Mapping> {
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(Mapping { ptr, len })
    }

    /// The mapping viewed as a `T`. `T` must be made only of atomics (any bit pattern is a
    /// valid value, and the memory may change under us), which the callers guarantee.
    pub fn view<T>(&self) -> &T {
        assert!(
            std::mem::size_of::<T>() <= self.len,
            "mapping smaller than its layout"
        );
        assert_eq!(
            self.ptr.as_ptr() as usize % std::mem::align_of::<T>(),
            0,
            "misaligned mapping"
        );
        // SAFETY: the mapping is at least size_of::<T>() bytes, page-aligned (so aligned for T,
        // checked above), lives as long as `self`, and T (the region layout) consists only of
        // AtomicU64 fields for which every bit pattern is valid and concurrent modification by
        // other processes is allowed.
        unsafe { &*self.ptr.as_ptr().cast::<T>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len come from a successful mmap and no reference derived from the mapping
        // outlives `self` (views borrow it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The effective uid of the calling process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Ends this process at once with SIGKILL (a test switch: a member killed at this point).
pub fn kill_self() -> ! {
    // SAFETY: raise has no memory preconditions; SIGKILL cannot be caught, so it does not
    // return.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    std::process::abort()
}

/// The address of the low 32 bits of `w` (a futex word must be a 4-byte integer).
fn low_half(w: &AtomicU64) -> *const u32 {
    let p = w.as_ptr().cast::<u32>().cast_const();
    if cfg!(target_endian = "big") {
        p.wrapping_add(1)
    } else {
        p
    }
}

/// Sleeps while the low 32 bits of `w` equal `expected`, at most `timeout`, or until a
/// [`futex_wake`] on `w` from any process mapping the same memory. Returns early on a signal
/// or a changed value; the caller re-reads what it waits for either way.
pub fn futex_wait(w: &AtomicU64, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the address is 4-byte aligned and inside a live mapping (`w` borrows it); a
    // shared (not private) futex, since other processes map the same file; the timeout is a
    // valid relative timespec. The kernel only reads the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_half(w),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping in [`futex_wait`] on `w`.
pub fn futex_wake(w: &AtomicU64) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE only reads the address to find the waiters.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_half(w),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine, so that the
/// members of a group can order their waits.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
