//! The library's life: load-time setup, kept tiny (a process that never touches CUDA must
//! not notice us: read `VRAMSHIM_*`, set the log level, register the atexit and fork-child
//! handlers), and what every layer does at fork and at exit. Threads, files and CUDA are
//! only touched on the first CUDA call, by the layers. The top of the layers: it may call
//! any of them.

use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

extern "C" fn constructor(_argc: c_int, _argv: *const *const c_char, envp: *const *const c_char) {
    init(envp);
}

// glibc passes (argc, argv, envp) to .init_array functions.
#[used]
#[unsafe(link_section = ".init_array")]
static INIT_ARRAY: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = constructor;

/// Idempotent; normally run by the constructor.
pub(crate) fn init(envp: *const *const c_char) {
    if INITIALIZED.swap(true, Ordering::AcqRel) {
        return;
    }
    wire();
    crate::config::init(envp);
    // The warnings about variables said from here to `load_ends` are said once per job.
    crate::sys::log::load_begins();
    crate::sys::log::init();
    crate::config::report(|line| crate::warn!("{line}"));
    // Parse VRAMSHIM_CAP & co. now (one line per bad value); nothing is attached yet.
    crate::cap::init();
    // Reading two variables and setting two atomics: the tracer starts its writer and file
    // on the first event, not here.
    let _ = std::panic::catch_unwind(crate::tracer::init);
    crate::sys::log::load_ends();
    if crate::sys::log::enabled(crate::sys::log::Level::Info) {
        announce();
    }
    // Resolve glibc's dlsym now, while nothing else runs (it is also resolved lazily).
    crate::cuda::real::real_dlsym_addr();
    // And glibc's `_exit`, which the `_exit` hook must not look up (it may run in a signal
    // handler, where `dlsym` is not safe).
    crate::hooks::process::init();
    // SAFETY: registering plain extern "C" functions with libc.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(atfork_child));
    }
}

/// Hand the layers side by side what they read of each other, so that none imports another:
/// the pool's pages are charged to the cap (and it maps no more than the cap lets the
/// process see), and the trace's per-device
/// counters carry the pool's reserve and the cap, and the pool's own waits are recorded.
fn wire() {
    crate::state::stats::set_pool_view(crate::state::stats::PoolStatsView {
        field: crate::pool::c_stats::field,
        json: crate::pool::c_stats::json,
    });
    crate::pool::set_cap_view(crate::pool::CapView {
        charges_pages: crate::cap::charges_pool_pages,
        charge_page: crate::cap::charge_pool_page,
        uncharge_pages: crate::cap::uncharge_pool_page,
        clear_refusal: crate::cap::clear_pool_refusal,
        visible_total: crate::cap::total_for,
        headroom: crate::cap::pool_headroom,
    });
    crate::pool::set_wait_view(crate::pool::WaitView {
        wait: crate::hooks::sync::pool_wait,
    });
    crate::tracer::set_device_view(crate::tracer::DeviceView {
        pool_reserved: |d| crate::pool::stats(d).map(|s| s.reserved),
        pool_stats: |d| {
            crate::pool::stats(d).map(|s| {
                [
                    s.reserved, s.live, s.cached, s.pending, s.budget, s.releases,
                ]
            })
        },
        cap: |d, total| {
            crate::cap::global()
                .filter(|c| c.is_capped(d))
                .map_or(0, |c| c.total_for(d, total))
        },
        cap_limits: crate::cap::trace_config,
    });
}

/// `VRAMSHIM_LOG=info`: one line saying what this process runs with.
#[cold]
fn announce() {
    let set = |k: &str| {
        crate::config::var(k)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let cap = match (set("VRAMSHIM_CAP"), set("VRAMSHIM_SHARED")) {
        // Limits set for other tools or by the kernel (cap::limits): named when set up.
        (None, None) if crate::cap::global().is_some() => "from other tools' limits".to_string(),
        (None, None) => "off".to_string(),
        (Some(c), None) => format!("{c:?}"),
        (c, Some(s)) => format!("{:?} shared by {s:?}", c.unwrap_or("")),
    };
    let cap = match (crate::cap::global().is_some(), set("VRAMSHIM_CAP_CONTEXT")) {
        (false, _) if cap == "off" => "cap off".to_string(),
        (false, _) => format!("cap {cap} (not in force)"),
        (true, Some("exclude")) => format!("cap {cap} (the CUDA context not counted)"),
        (true, _) => format!("cap {cap} (the CUDA context counted)"),
    };
    crate::info!(
        "pid {}: {cap}; pool {}; trace {}; stacks {}",
        crate::sys::ids::pid(),
        set("VRAMSHIM_POOL").unwrap_or("off"),
        set("VRAMSHIM_TRACE").map_or_else(|| "off".to_string(), |t| format!("{t:?}")),
        set("VRAMSHIM_STACKS").map_or_else(|| "off".to_string(), |n| format!("{n} frames")),
    );
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        at_exit_hooks();
    });
}

extern "C" fn atfork_child() {
    let _ = std::panic::catch_unwind(|| {
        fork_child_hooks();
    });
}

/// Everything a forked child resets before it does anything else (atfork child handler):
/// the child's own memory starts empty.
fn fork_child_hooks() {
    use crate::state::{counters, live_table};
    crate::sys::ids::on_fork_child();
    crate::sys::thread::on_fork_child();
    live_table::ALLOCS.reset_leak();
    live_table::HANDLES.reset_leak();
    counters::reset();
    crate::hooks::context::on_fork_child();
    crate::cuda::mempools::on_fork_child();
    crate::cuda::captures::on_fork_child();
    crate::cap::on_fork_child();
    crate::pool::on_fork_child();
    crate::tracer::on_fork_child();
}

/// Process exit (atexit handler).
fn at_exit_hooks() {
    crate::state::stats::on_exit();
    crate::pipeline::registry::on_exit();
    crate::hooks::context::record_startup_failure();
    crate::tracer::on_exit();
}
