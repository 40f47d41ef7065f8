//! `VRAMSHIM_*` configuration, read once from the process environment at load.
//!
//! The constructor (`init.rs`) calls [`init`] with the `envp` glibc hands to `.init_array`
//! functions; any later call to [`var`] before that (another library's constructor calling
//! CUDA first) initializes from `environ`. The strings are the process's own environment
//! strings, which glibc never frees, so they are handed out as `&'static str` without
//! copying. Lookups never allocate and take no lock.

use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// At most this many `VRAMSHIM_*` variables are remembered.
const MAX_VARS: usize = 32;

static VARS: [AtomicPtr<c_char>; MAX_VARS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_VARS];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// 0 = not read, 1 = reading, 2 = ready.
static STATE: AtomicU8 = AtomicU8::new(0);

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// Read the environment. `envp` may be null (then `environ` is used).
pub(crate) fn init(envp: *const *const c_char) {
    if STATE
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire)
        .is_err()
    {
        // Someone else is reading (or has read) it; wait for them.
        while STATE.load(Ordering::Acquire) == 1 {
            std::hint::spin_loop();
        }
        return;
    }
    let envp = if envp.is_null() {
        // SAFETY: `environ` is glibc's environment array, valid for the process lifetime.
        unsafe { environ }
    } else {
        envp
    };
    let mut n = 0;
    if !envp.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: envp is a NULL-terminated array of C strings.
            let s = unsafe { *envp.add(i) };
            if s.is_null() || n == MAX_VARS {
                break;
            }
            // SAFETY: each entry is a NUL-terminated C string.
            let bytes = unsafe { CStr::from_ptr(s) }.to_bytes();
            if bytes.starts_with(b"VRAMSHIM_") && bytes.contains(&b'=') {
                VARS[n].store(s as *mut c_char, Ordering::Relaxed);
                n += 1;
            }
            i += 1;
        }
    }
    COUNT.store(n, Ordering::Relaxed);
    STATE.store(2, Ordering::Release);
}

#[inline]
fn ensure() {
    if STATE.load(Ordering::Acquire) != 2 {
        init(std::ptr::null());
    }
}

fn entry(i: usize) -> Option<(&'static str, &'static str)> {
    let p = VARS[i].load(Ordering::Relaxed);
    if p.is_null() {
        return None;
    }
    // SAFETY: p points into the process environment, which lives until exit.
    let bytes: &'static [u8] = unsafe { CStr::from_ptr(p) }.to_bytes();
    let s = std::str::from_utf8(bytes).ok()?;
    let (k, v) = s.split_once('=')?;
    Some((k, v))
}

/// The value of `VRAMSHIM_<...>` as it was when the library was loaded (`name` is the full
/// variable name, e.g. `"VRAMSHIM_CAP"`). Empty values are returned as `Some("")`.
pub fn var(name: &str) -> Option<&'static str> {
    ensure();
    let n = COUNT.load(Ordering::Relaxed);
    (0..n)
        .filter_map(entry)
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Every `VRAMSHIM_*` variable that was set at load, in environment order (for the trace
/// header's configuration list).
pub fn all() -> impl Iterator<Item = (&'static str, &'static str)> {
    ensure();
    let n = COUNT.load(Ordering::Relaxed);
    (0..n).filter_map(entry)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_process_environment() {
        // The test harness's environment has no VRAMSHIM_ variable we rely on; just make sure
        // lookups work and do not panic.
        let _ = super::var("VRAMSHIM_DOES_NOT_EXIST");
        assert!(super::var("VRAMSHIM_DOES_NOT_EXIST").is_none());
        let _ = super::all().count();
    }
}
