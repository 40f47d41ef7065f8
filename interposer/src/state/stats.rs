//! Reading the counters and the live table from outside the hot path:
//! * `vramshim_stats_json(buf, len)` / `vramshim_counter(name)`: exported C functions a test
//!   program can call (found with `dlsym(RTLD_DEFAULT, ...)`);
//! * `VRAMSHIM_STATS=path` (`%p` = pid): the same JSON written at exit;
//! * `VRAMSHIM_LOG=debug`: a summary line at exit.
//!
//! Counter names for `vramshim_counter`: `calls.<api>` (e.g. `calls.cudaMalloc`),
//! `live_bytes.<dev>`, `live_bytes.<dev>.<kind>`, `live_count.<dev>`,
//! `live_count.<dev>.<kind>`, `peak_bytes.<dev>` where
//! `<dev>` is a device ordinal, `host` or `unknown`, and `<kind>` one of
//! `runtime|driver|async|managed|pitch|vmm-handle|host|pool`; `live_entries`,
//! `live_handles`, `unknown_frees`, `cap_refusals`, `alloc_failures`, `pooled`, `panics`,
//! `pool.<dev>.<field>` (the pool's statistics: `pool::c_stats::FIELDS`),
//! and `nested` (hooks the *calling thread* passed straight through because an outer hook
//! was active). Unknown names give -1.
//!
//! Live bytes and counts are exact whenever no request is in flight; `peak_bytes` is exact
//! when one thread allocates, and an upper bound within `counters::SLACK` per thread
//! otherwise (see `counters`).

use crate::state::counters::{self, HOST_SLOT, MAX_DEVICES, UNKNOWN_SLOT};
use crate::state::live_table::{self, ALLOCS, HANDLES};
use std::ffi::{CStr, c_char, c_longlong};
use std::fmt::Write as _;
use vramshim_trace::{AllocKind, Api};

/// (entries, bytes) live in a slot, optionally of one kind: a scan of the live tables
/// (reads only; not for the hot path).
pub(crate) fn live_scan(slot_: usize, kind: Option<AllocKind>) -> (u64, u64) {
    let (mut n, mut b) = (0u64, 0u64);
    let mut visit = |_: u64, e: &live_table::Entry| {
        if counters::slot(e.device, e.kind) == slot_ && kind.is_none_or(|k| k == e.kind) {
            n += 1;
            b = b.wrapping_add(e.size);
        }
    };
    ALLOCS.for_each(&mut visit);
    HANDLES.for_each(&mut visit);
    (n, b)
}

/// Live bytes of one kind in a slot.
pub(crate) fn live_bytes_kind(slot: usize, kind: AllocKind) -> u64 {
    live_scan(slot, Some(kind)).1
}

/// Live entries of one kind in a slot.
pub(crate) fn live_count_kind(slot: usize, kind: AllocKind) -> u64 {
    live_scan(slot, Some(kind)).0
}

/// Live entries of a slot (all kinds).
pub(crate) fn live_count(slot: usize) -> u64 {
    live_scan(slot, None).0
}

fn slot_name(s: usize) -> String {
    match s {
        HOST_SLOT => "host".into(),
        UNKNOWN_SLOT => "unknown".into(),
        d => d.to_string(),
    }
}

fn parse_slot(s: &str) -> Option<usize> {
    match s {
        "host" => Some(HOST_SLOT),
        "unknown" => Some(UNKNOWN_SLOT),
        d => d.parse::<usize>().ok().filter(|d| *d < MAX_DEVICES),
    }
}

fn parse_kind(s: &str) -> Option<AllocKind> {
    AllocKind::ALL.iter().copied().find(|k| k.name() == s)
}

/// One counter by name; `None` for unknown names.
pub(crate) fn counter(name: &str) -> Option<u64> {
    let mut parts = name.split('.');
    let head = parts.next()?;
    let a = parts.next();
    let b = parts.next();
    if parts.next().is_some() {
        return None;
    }
    Some(match (head, a, b) {
        ("calls", Some(api), None) => {
            counters::calls(Api::ALL.iter().copied().find(|x| x.name() == api)?)
        }
        ("live_bytes", Some(s), None) => counters::live_bytes(parse_slot(s)?),
        ("live_bytes", Some(s), Some(k)) => live_bytes_kind(parse_slot(s)?, parse_kind(k)?),
        ("live_count", Some(s), None) => live_count(parse_slot(s)?),
        ("live_count", Some(s), Some(k)) => live_count_kind(parse_slot(s)?, parse_kind(k)?),
        ("peak_bytes", Some(s), None) => counters::peak_bytes(parse_slot(s)?),
        ("live_entries", None, None) => ALLOCS.len() as u64,
        ("live_handles", None, None) => HANDLES.len() as u64,
        ("unknown_frees", None, None) => counters::unknown_frees(),
        ("nested", None, None) => crate::sys::thread::nested_on_this_thread(),
        ("cap_refusals", None, None) => counters::cap_refusals(),
        ("alloc_failures", None, None) => counters::alloc_failures(),
        ("pooled", None, None) => counters::pooled_count(),
        ("panics", None, None) => counters::panics(),
        ("pool", Some(d), Some(f)) => (POOL_VIEW.get()?.field)(d.parse().ok()?, f)?,
        _ => return None,
    })
}

/// The pool's statistics, read through functions the pool layer provides (wired at start-up:
/// the pool stands beside this layer, not below it).
pub(crate) struct PoolStatsView {
    /// One field of one device's pool.
    pub field: fn(i32, &str) -> Option<u64>,
    /// Every device's pool as one JSON object.
    pub json: fn() -> String,
}

static POOL_VIEW: std::sync::OnceLock<PoolStatsView> = std::sync::OnceLock::new();

/// Install the pool's statistics view (once; later calls are ignored).
pub(crate) fn set_pool_view(view: PoolStatsView) {
    let _ = POOL_VIEW.set(view);
}

/// The separator before a JSON member: none before the first (`first` is then cleared).
fn sep(first: &mut bool) -> &'static str {
    if std::mem::replace(first, false) {
        ""
    } else {
        ","
    }
}

/// Everything as one JSON object.
pub(crate) fn json() -> String {
    let mut s = String::with_capacity(2048);
    let _ = write!(s, "{{\"pid\":{},\"calls\":{{", crate::sys::ids::pid());
    let mut first = true;
    for api in Api::ALL {
        let n = counters::calls(*api);
        if n != 0 {
            let _ = write!(s, "{}\"{}\":{}", sep(&mut first), api.name(), n);
        }
    }
    s.push_str("},\"devices\":{");
    let mut first = true;
    for slot in counters::used_slots() {
        let _ = write!(
            s,
            "{}\"{}\":{{\"live_bytes\":{},\"live_count\":{},\"peak_bytes\":{},\"by_kind\":{{",
            sep(&mut first),
            slot_name(slot),
            counters::live_bytes(slot),
            live_count(slot),
            counters::peak_bytes(slot),
        );
        let mut kfirst = true;
        for k in AllocKind::ALL {
            let (b, c) = (live_bytes_kind(slot, *k), live_count_kind(slot, *k));
            if b != 0 || c != 0 {
                let _ = write!(
                    s,
                    "{}\"{}\":{{\"bytes\":{},\"count\":{}}}",
                    sep(&mut kfirst),
                    k.name(),
                    b,
                    c
                );
            }
        }
        s.push_str("}}");
    }
    let _ = write!(
        s,
        "}},\"live_entries\":{},\"live_handles\":{},\"unknown_frees\":{},\"cap_refusals\":{},\"alloc_failures\":{},\"pooled\":{},\"panics\":{},\"pools\":{}}}",
        ALLOCS.len(),
        HANDLES.len(),
        counters::unknown_frees(),
        counters::cap_refusals(),
        counters::alloc_failures(),
        counters::pooled_count(),
        counters::panics(),
        POOL_VIEW
            .get()
            .map_or_else(|| "{}".to_string(), |v| (v.json)())
    );
    s
}

/// Write the stats JSON into `buf` (NUL-terminated, truncated to `len - 1` bytes). Returns
/// the full length of the JSON (without NUL), so a caller can retry with a bigger buffer.
///
/// # Safety
/// `buf` must point to `len` writable bytes (or be NULL with `len == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_stats_json(buf: *mut c_char, len: usize) -> usize {
    std::panic::catch_unwind(|| {
        let j = json();
        if !buf.is_null() && len > 0 {
            let n = j.len().min(len - 1);
            // SAFETY: the caller provides len writable bytes; n < len.
            unsafe {
                std::ptr::copy_nonoverlapping(j.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        j.len()
    })
    .unwrap_or(0)
}

/// One counter by name (see the module docs), or -1 for an unknown name.
///
/// # Safety
/// `name` must be a NUL-terminated string (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramshim_counter(name: *const c_char) -> c_longlong {
    if name.is_null() {
        return -1;
    }
    std::panic::catch_unwind(|| {
        // SAFETY: the caller's NUL-terminated string.
        let n = unsafe { CStr::from_ptr(name) }.to_str().ok()?;
        counter(n)
    })
    .ok()
    .flatten()
    .map(|v| v.min(i64::MAX as u64) as c_longlong)
    .unwrap_or(-1)
}

/// Expand `%p` (pid) in a path.
fn expand(path: &str) -> String {
    path.replace("%p", &crate::sys::ids::pid().to_string())
}

/// At exit: `VRAMSHIM_STATS` dump and the debug summary.
pub(crate) fn on_exit() {
    if let Some(p) = crate::config::var("VRAMSHIM_STATS").filter(|p| !p.is_empty()) {
        let path = expand(p);
        // Only an earlier stats file (or a new one) is written: never a symlink, a FIFO,
        // another user's file or any other file (docs/threat-model.md).
        let written = vramshim_trace::output_file::create(
            std::path::Path::new(&path),
            vramshim_trace::output_file::Replace::Marked(b"{\"pid\":"),
        )
        .map_err(|e| e.to_string())
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, (json() + "\n").as_bytes()).map_err(|e| e.to_string())
        });
        if let Err(e) = written {
            crate::warn!("VRAMSHIM_STATS: {path:?} {e}; no stats written");
        }
    }
    if crate::sys::log::enabled(crate::sys::log::Level::Debug) {
        let mut line = String::new();
        for slot in counters::used_slots() {
            let _ = write!(
                line,
                " [{}: live {} B in {} allocations, peak {} B]",
                slot_name(slot),
                counters::live_bytes(slot),
                live_count(slot),
                counters::peak_bytes(slot),
            );
        }
        crate::debug!("exit: unknown frees {}{}", counters::unknown_frees(), line);
    }
}
