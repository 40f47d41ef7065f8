//! The pool's statistics for the program itself: why it holds what it holds.
//!
//! * `int vramshim_pool_stats(int device, uint64_t *out, size_t n)`: writes the first `n` of
//!   [`FIELDS`] (in that order) for `device`'s pool and returns how many fields there are,
//!   or -1 when the device has no pool (the pool is off, or nothing was pooled there yet);
//! * `long long vramshim_pool_stat(int device, const char *name)`: one field by name, or -1;
//! * the same fields under `pools` in `vramshim_stats_json` / `VRAMSHIM_STATS`, and as
//!   `vramshim_counter("pool.<device>.<field>")`.
//!
//! A program finds them with `dlsym(RTLD_DEFAULT, ...)` (absent: libvramshim.so is not loaded).
//! Values are read under the pool's lock, so they are one consistent snapshot; blocks kept
//! by a thread's cache of stream-ordered frees count as live until the pool takes them back.

use std::ffi::{CStr, c_char, c_int, c_longlong};
use vramshim_pool::Stats;

/// The fields, in the order `vramshim_pool_stats` writes them (bytes unless said otherwise).
pub(crate) const FIELDS: [&str; 18] = [
    // physical pages held
    "reserved",
    // requested bytes of live blocks
    "live",
    // freed blocks kept formed for reuse (part of reserved)
    "cached",
    // cudaFree'd blocks waiting for a synchronization
    "pending",
    // what the pool promises to hold at most with blocks cached (0: no budget)
    "budget",
    // the live peak the budget is a share of
    "recent_peak_live",
    // pages given back to the driver (count)
    "releases",
    "peak_reserved",
    "peak_live",
    // mapped address ranges held (count)
    "mappings",
    // counts from here on
    "allocs",
    "frees",
    "cache_hits",
    "syncs",
    "trims",
    "oom_retries",
    // blocks a driver took as free nodes of a graph (count; CUDA refuses such frees): the
    // graph's, live for good
    "graph_freed",
    // their requested bytes (part of live)
    "graph_freed_bytes",
];

/// The values of [`FIELDS`], in order.
pub(crate) fn values(
    s: &Stats,
    (graph_freed, graph_freed_bytes): (u64, u64),
) -> [u64; FIELDS.len()] {
    [
        s.reserved,
        s.live,
        s.cached,
        s.pending,
        s.budget,
        s.recent_peak_live,
        s.releases,
        s.peak_reserved,
        s.peak_live,
        s.mappings,
        s.allocs,
        s.frees,
        s.cache_hits,
        s.syncs,
        s.trims,
        s.oom_retries,
        graph_freed,
        graph_freed_bytes,
    ]
}

/// One field of `device`'s pool by name.
pub(crate) fn field(device: i32, name: &str) -> Option<u64> {
    let i = FIELDS.iter().position(|f| *f == name)?;
    super::stats_with_graph_freed(device).map(|(s, g)| values(&s, g)[i])
}

/// `{"<device>":{"reserved":...,...},...}` for every device with a pool.
pub(crate) fn json() -> String {
    use std::fmt::Write as _;
    let mut out = String::from("{");
    let mut first = true;
    for d in 0..super::MAX_DEVICES as i32 {
        let Some((s, g)) = super::stats_with_graph_freed(d) else {
            continue;
        };
        let _ = write!(out, "{}\"{d}\":{{", if first { "" } else { "," });
        first = false;
        for (i, (f, v)) in FIELDS.iter().zip(values(&s, g)).enumerate() {
            let _ = write!(out, "{}\"{f}\":{v}", if i == 0 { "" } else { "," });
        }
        out.push('}');
    }
    out.push('}');
    out
}

/// See the module documentation.
///
/// # Safety
/// `out` must point to `n` writable `u64`s (or be NULL, with any `n`: nothing is written).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_pool_stats(device: c_int, out: *mut u64, n: usize) -> c_int {
    std::panic::catch_unwind(|| {
        let Some((s, g)) = super::stats_with_graph_freed(device) else {
            return -1;
        };
        let v = values(&s, g);
        if !out.is_null() {
            for (i, x) in v.iter().take(n).enumerate() {
                // SAFETY: the caller provides n writable u64s; i < n.
                unsafe { *out.add(i) = *x };
            }
        }
        v.len() as c_int
    })
    .unwrap_or(-1)
}

/// See the module documentation.
///
/// # Safety
/// `name` must be a NUL-terminated string (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_pool_stat(device: c_int, name: *const c_char) -> c_longlong {
    if name.is_null() {
        return -1;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: the caller's NUL-terminated string.
        let n = unsafe { CStr::from_ptr(name) }.to_str().ok()?;
        field(device, n)
    })
    .ok()
    .flatten()
    .map(|v| v.min(i64::MAX as u64) as c_longlong)
    .unwrap_or(-1)
}
