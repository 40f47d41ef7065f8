//! `VRAMSHIM_*` configuration, read once from the process environment at load.
//!
//! The constructor (`lifecycle.rs`) calls [`init`] with the `envp` glibc hands to `.init_array`
//! functions; any later call to [`var`] before that (another library's constructor calling
//! CUDA first) initializes from `environ`. The strings are the process's own environment
//! strings, which glibc never frees, so they are handed out as `&'static str` without
//! copying. Lookups never allocate and take no lock.

use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Every variable the library reads. Each has a place of its own, filled whatever the
/// number or position of other `VRAMSHIM_*` variables, so none of them can be crowded out.
pub(crate) const KNOWN: &[&str] = &KNOWN_NAMES;
const NKNOWN: usize = OURS.len() + 1 + HAMI_DEVICE_LIMITS.len() + 2;
const KNOWN_NAMES: [&str; NKNOWN] = join([
    OURS,
    // Other tools' limits, which the cap understands (cap::limits): read like ours, but not
    // listed in the trace header's configuration by `all` (the cap reports what it used).
    &["CUDA_DEVICE_MEMORY_LIMIT"],
    &HAMI_DEVICE_LIMITS,
    &["GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_LIMIT"],
]);

const OURS: &[&str] = &[
    "VRAMSHIM_CAP",
    "VRAMSHIM_CAP_CONTEXT",
    "VRAMSHIM_CAP_FAULT",
    "VRAMSHIM_CAP_STRICT",
    "VRAMSHIM_DEVICE_FAULT",
    "VRAMSHIM_LAYERS_FAULT",
    "VRAMSHIM_LOG",
    "VRAMSHIM_ON_CAP",
    "VRAMSHIM_POOL",
    "VRAMSHIM_POOL_BUDGET",
    "VRAMSHIM_POOL_DEBUG",
    "VRAMSHIM_POOL_PAUSE_FDS",
    "VRAMSHIM_REGISTRY",
    "VRAMSHIM_SHARED",
    "VRAMSHIM_SLOTS_FAULT",
    "VRAMSHIM_STACKS",
    "VRAMSHIM_STACKS_FAULT",
    "VRAMSHIM_PY_STACKS",
    "VRAMSHIM_PYFRAMES_FAULT",
    "VRAMSHIM_STATS",
    "VRAMSHIM_TABLE_FAULT",
    "VRAMSHIM_TORCH_FAULT",
    "VRAMSHIM_TRACE",
    "VRAMSHIM_TRACE_CLOCK",
    "VRAMSHIM_TRACE_CLOCK_FAULT",
    "VRAMSHIM_TRACE_EXIT_FLUSH",
    "VRAMSHIM_TRACE_FAULT",
    "VRAMSHIM_TRACE_LOCKS",
    "VRAMSHIM_TRACE_TICK_MS",
    "VRAMSHIM_TRACE_WRITER_FAULT",
    "VRAMSHIM_ENV_FAULT",
    "VRAMSHIM_CGROUP_ROOT",
    "VRAMSHIM_SAID",
];

/// HAMi-core's per-device limits, `CUDA_DEVICE_MEMORY_LIMIT_0` to `_15` (the devices a cap
/// describes), which the cap reads (`cap::limits`).
pub(crate) const HAMI_DEVICE_LIMITS: [&str; 16] = [
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_MEMORY_LIMIT_2",
    "CUDA_DEVICE_MEMORY_LIMIT_3",
    "CUDA_DEVICE_MEMORY_LIMIT_4",
    "CUDA_DEVICE_MEMORY_LIMIT_5",
    "CUDA_DEVICE_MEMORY_LIMIT_6",
    "CUDA_DEVICE_MEMORY_LIMIT_7",
    "CUDA_DEVICE_MEMORY_LIMIT_8",
    "CUDA_DEVICE_MEMORY_LIMIT_9",
    "CUDA_DEVICE_MEMORY_LIMIT_10",
    "CUDA_DEVICE_MEMORY_LIMIT_11",
    "CUDA_DEVICE_MEMORY_LIMIT_12",
    "CUDA_DEVICE_MEMORY_LIMIT_13",
    "CUDA_DEVICE_MEMORY_LIMIT_14",
    "CUDA_DEVICE_MEMORY_LIMIT_15",
];

/// The names of `parts`, in order, as one array of exactly `N`.
const fn join<const N: usize>(parts: [&[&'static str]; 4]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut n, mut p) = (0, 0);
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            out[n] = parts[p][i];
            n += 1;
            i += 1;
        }
        p += 1;
    }
    assert!(n == N);
    out
}

/// At most this many `VRAMSHIM_*` variables are listed (in environment order, for the trace
/// header); beyond it one line says how many were left out. Lookups of [`KNOWN`] names never
/// depend on it.
const MAX_VARS: usize = 256;

static KNOWN_VALS: [AtomicPtr<c_char>; NKNOWN] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; NKNOWN];
static VARS: [AtomicPtr<c_char>; MAX_VARS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_VARS];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// `VRAMSHIM_*` variables beyond [`MAX_VARS`] (not listed).
static LEFT_OUT: AtomicUsize = AtomicUsize::new(0);
/// 0 = not read, 1 = reading, 2 = ready.
static STATE: AtomicU8 = AtomicU8::new(0);

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// The name part of a `NAME=value` entry.
fn name_of(entry: &[u8]) -> &[u8] {
    entry
        .iter()
        .position(|&b| b == b'=')
        .map_or(entry, |i| &entry[..i])
}

/// Keeps `entry` (the `NAME=value` bytes at `p`) if it defines a [`KNOWN`] variable not
/// seen before (the first definition wins, as getenv has it).
fn remember_known(p: *const c_char, entry: &[u8]) {
    let name = name_of(entry);
    if let Some(k) = KNOWN.iter().position(|k| k.as_bytes() == name)
        && KNOWN_VALS[k].load(Ordering::Relaxed).is_null()
    {
        KNOWN_VALS[k].store(p as *mut c_char, Ordering::Relaxed);
    }
}

/// Whether `entry` sets one of the other tools' limit variables in [`KNOWN`].
fn is_limit_entry(entry: &[u8]) -> bool {
    (entry.starts_with(b"CUDA_DEVICE_MEMORY_LIMIT")
        || entry.starts_with(b"GPU_MEMORY_LIMIT=")
        || entry.starts_with(b"NVIDIA_GPU_MEMORY_LIMIT="))
        && entry.contains(&b'=')
}

/// The entries of a NULL-terminated environment array (none for a null array): each entry's
/// address and its `NAME=value` bytes. Allocates nothing.
fn entries(envp: *const *const c_char) -> impl Iterator<Item = (*const c_char, &'static [u8])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        if envp.is_null() {
            return None;
        }
        // SAFETY: envp is a NULL-terminated array of C strings, valid for the process
        // lifetime (glibc never frees the initial environment).
        let s = unsafe { *envp.add(i) };
        if s.is_null() {
            return None;
        }
        i += 1;
        // SAFETY: each entry is a NUL-terminated C string that lives as long as the process.
        Some((s, unsafe { CStr::from_ptr(s) }.to_bytes()))
    })
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
    // The test-only switch `VRAMSHIM_ENV_FAULT=first-32` restores a fixed table of 32
    // variables where a known name can be crowded out (tests show they catch it).
    // Read as the list switches are (`switches::switch_on`, which cannot run before this).
    let fault = entries(envp).any(|(_, b)| {
        b.strip_prefix(b"VRAMSHIM_ENV_FAULT=").is_some_and(|v| {
            v.split(|c| *c == b',')
                .any(|n| n.trim_ascii() == b"first-32")
        })
    });
    let cap_all = if fault { 32 } else { MAX_VARS };
    let (mut n, mut left_out) = (0, 0);
    for (s, bytes) in entries(envp) {
        if !(bytes.starts_with(b"VRAMSHIM_") && bytes.contains(&b'=')) {
            if is_limit_entry(bytes) {
                remember_known(s, bytes);
            }
            continue;
        }
        if n < cap_all {
            VARS[n].store(s as *mut c_char, Ordering::Relaxed);
            n += 1;
        } else {
            left_out += 1;
        }
        if cap_all == MAX_VARS {
            remember_known(s, bytes);
        }
    }
    if cap_all < MAX_VARS {
        // The fault: only the listed variables are read.
        for v in VARS.iter().take(n) {
            let p = v.load(Ordering::Relaxed);
            if let Some(b) = bytes_at(p) {
                remember_known(p, b);
            }
        }
    }
    COUNT.store(n, Ordering::Relaxed);
    LEFT_OUT.store(left_out, Ordering::Relaxed);
    STATE.store(2, Ordering::Release);
}

#[inline]
fn ensure() {
    if STATE.load(Ordering::Acquire) != 2 {
        init(std::ptr::null());
    }
}

/// The whole `NAME=value` bytes at `p` (None for null).
fn bytes_at(p: *mut c_char) -> Option<&'static [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: p points into the process environment, which lives until exit.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

fn entry(i: usize) -> Option<(&'static str, &'static str)> {
    let s = std::str::from_utf8(bytes_at(VARS[i].load(Ordering::Relaxed))?).ok()?;
    s.split_once('=')
}

/// The raw value of a [`KNOWN`] variable (None when unset or not a known name).
pub(crate) fn raw(name: &str) -> Option<&'static [u8]> {
    ensure();
    let k = KNOWN.iter().position(|k| *k == name)?;
    let b = bytes_at(KNOWN_VALS[k].load(Ordering::Relaxed))?;
    Some(&b[name.len() + 1..])
}

/// The value of `VRAMSHIM_<...>` as it was when the library was loaded (`name` is the full
/// variable name, e.g. `"VRAMSHIM_CAP"`). Empty values are returned as `Some("")`; a value
/// that is not UTF-8 reads as unset here ([`report`] says so once; [`raw`] has the bytes).
pub(crate) fn var(name: &str) -> Option<&'static str> {
    ensure();
    if KNOWN.contains(&name) {
        return raw(name).and_then(|v| std::str::from_utf8(v).ok());
    }
    let n = COUNT.load(Ordering::Relaxed);
    (0..n)
        .filter_map(entry)
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// One line per problem with the environment itself, handed to `say` (run once at load, after
/// the log level is set, with the log's warning as `say`: this layer sits below the log): a
/// known variable whose value is not UTF-8 (the cap's own variables are reported by the cap,
/// which reads them lossily), and variables left out of the listing.
pub(crate) fn report(mut say: impl FnMut(std::fmt::Arguments<'_>)) {
    ensure();
    for name in KNOWN {
        // The cap reads its own variables lossily and reports them itself.
        if matches!(
            *name,
            "VRAMSHIM_CAP" | "VRAMSHIM_SHARED" | "VRAMSHIM_CGROUP_ROOT"
        ) || !name.starts_with("VRAMSHIM_")
        {
            continue;
        }
        if let Some(v) = raw(name)
            && std::str::from_utf8(v).is_err()
        {
            say(format_args!(
                "{name}=\"{}\" is not valid UTF-8 text; {}; ignoring it",
                String::from_utf8_lossy(v).escape_debug(),
                forms(name)
            ));
        }
    }
    let left_out = LEFT_OUT.load(Ordering::Relaxed);
    if left_out > 0 {
        say(format_args!(
            "{left_out} VRAMSHIM_* variables past the first {MAX_VARS} are not listed in the trace header (the variables vramshim reads are read wherever they are)"
        ));
    }
}

/// The accepted forms of a known variable, for messages.
pub(crate) fn forms(name: &str) -> &'static str {
    match name {
        "VRAMSHIM_LOG" => "accepted: off, warn, info, debug",
        "VRAMSHIM_POOL" => "accepted: stitch, stitch-tight or off",
        "VRAMSHIM_TRACE" | "VRAMSHIM_STATS" => "accepted: a file path (%p: the pid)",
        "VRAMSHIM_STACKS" => "accepted: a number of frames from 0 to 64",
        "VRAMSHIM_TRACE_CLOCK" => {
            "accepted: monotonic (unset: the TSC where it is safe, else clock_gettime)"
        }
        "VRAMSHIM_TRACE_LOCKS" | "VRAMSHIM_TRACE_EXIT_FLUSH" | "VRAMSHIM_CAP_STRICT" => {
            "accepted: 0 or 1"
        }
        "VRAMSHIM_PY_STACKS" => {
            "accepted: 1 (Python frames in call stacks) or 0 (native frames only)"
        }
        "VRAMSHIM_CAP_CONTEXT" => "accepted: include or exclude",
        "VRAMSHIM_REGISTRY" => "accepted: off, or an absolute path",
        "VRAMSHIM_ON_CAP" => "accepted: fail, wait, wait:TIMEOUT (e.g. wait:30s) or wait:forever",
        _ => "accepted: see docs/configuration.md",
    }
}

/// Every `VRAMSHIM_*` variable that was set at load, in environment order (for the trace
/// header's configuration list).
pub(crate) fn all() -> impl Iterator<Item = (&'static str, &'static str)> {
    ensure();
    let n = COUNT.load(Ordering::Relaxed);
    // the library's own note to the processes it loads into (`sys::log::load_begins`), no
    // setting of the job
    (0..n)
        .filter_map(entry)
        .filter(|(k, _)| *k != "VRAMSHIM_SAID")
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

    /// Every `VRAMSHIM_*` name the library's sources read is in [`super::KNOWN`], so no count
    /// or position of other variables can hide it.
    #[test]
    fn every_variable_read_is_known() {
        let mut found = Vec::new();
        for (p, text) in crate::config::sources("env.rs") {
            // Read directly, or as a test switch (`switches::switch_on`; the needle is cut in
            // two so that the scan of those calls does not take it for one).
            let parts = text.split("var(\"VRAMSHIM_").skip(1);
            let switch = concat!("switch_on", "(\"VRAMSHIM_");
            for part in parts.chain(text.split(switch).skip(1)) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                found.push((format!("VRAMSHIM_{name}"), p.display().to_string()));
            }
        }
        assert!(found.len() > 20, "the scan found too little: {found:?}");
        let unknown: Vec<_> = found
            .iter()
            .filter(|(n, _)| !super::KNOWN.contains(&n.as_str()))
            .collect();
        assert!(unknown.is_empty(), "read but not in KNOWN: {unknown:?}");
    }
}
