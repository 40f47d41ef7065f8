//! Load-time setup, kept tiny (a process that never touches CUDA must not notice us):
//! read `VRAMSHIM_*`, set the log level, register the atexit and fork-child handlers.
//! Threads, files and CUDA are only touched on the first CUDA call, by the layers.

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
    crate::env::init(envp);
    crate::log::init();
    crate::env::report();
    // Parse VRAMSHIM_CAP & co. now (one line per bad value); nothing is attached yet.
    crate::cap::init();
    if crate::log::enabled(crate::log::Level::Info) {
        announce();
    }
    // Resolve glibc's dlsym now, while nothing else runs (it is also resolved lazily).
    crate::real::real_dlsym_addr();
    // SAFETY: registering plain extern "C" functions with libc.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(atfork_child));
    }
}

/// `VRAMSHIM_LOG=info`: one line saying what this process runs with.
#[cold]
fn announce() {
    let set = |k: &str| crate::env::var(k).map(str::trim).filter(|v| !v.is_empty());
    let cap = match (set("VRAMSHIM_CAP"), set("VRAMSHIM_SHARED")) {
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
        crate::ids::pid(),
        set("VRAMSHIM_POOL").unwrap_or("off"),
        set("VRAMSHIM_TRACE").map_or_else(|| "off".to_string(), |t| format!("{t:?}")),
        set("VRAMSHIM_STACKS").map_or_else(|| "off".to_string(), |n| format!("{n} frames")),
    );
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        crate::at_exit_hooks();
    });
}

extern "C" fn atfork_child() {
    let _ = std::panic::catch_unwind(|| {
        crate::ids::on_fork_child();
        crate::fork_child_hooks();
    });
}
