//! stderr diagnostics. Level from `VRAMSHIM_LOG` (`off|warn|info|debug`, default `warn`),
//! read once at load. A disabled level costs one relaxed atomic load. Lines are formatted
//! into a stack buffer and written with one `write(2)`: no allocation, no std stream lock.
//!
//! ```ignore
//! crate::warn!("cap: {} exceeds {}", a, b);
//! crate::info!("...");
//! crate::debug!("...");
//! if crate::sys::log::enabled(crate::sys::log::Level::Debug) { /* expensive explanation */ }
//! ```
//!
//! A warning about a variable's value said while the library loads is said once per job, not
//! by every process of it that loads the library (a Python started through a pyenv shim: some
//! 35 processes): see [`load_begins`].

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Level {
    Off = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Off => "",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Whether messages of `level` are written. One relaxed load.
#[inline(always)]
pub(crate) fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Parse `VRAMSHIM_LOG`. Called from the constructor.
pub(crate) fn init() {
    let Some(v) = crate::config::var("VRAMSHIM_LOG") else {
        return;
    };
    let lvl = match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "none" => Level::Off,
        "warn" | "warning" | "1" | "" => Level::Warn,
        "info" | "2" => Level::Info,
        "debug" | "3" | "trace" => Level::Debug,
        _ => {
            write(
                Level::Warn,
                format_args!("VRAMSHIM_LOG={v:?} is not one of off|warn|info|debug; using warn"),
            );
            Level::Warn
        }
    };
    LEVEL.store(lvl as u8, Ordering::Relaxed);
    crate::config::layers::changed();
}

struct StackBuf {
    buf: [u8; 1024],
    len: usize,
    truncated: bool,
}

impl fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len; // keep one byte for '\n'
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() {
            self.truncated = true;
        }
        Ok(())
    }
}

/// The variable that carries, to the processes a job starts, the warnings about variables
/// already said in it: hashes of their text ([`said_at_load`]), comma-separated.
const SAID: &str = "VRAMSHIM_SAID";
/// At most this many warnings are carried (more are said again by the processes started).
const MAX_SAID: usize = 32;
/// Whether the library is loading (between [`load_begins`] and [`load_ends`]).
static LOADING: AtomicBool = AtomicBool::new(false);
/// The hashes inherited through [`SAID`], then those of the warnings said here at load.
static SAID_HASHES: [AtomicU64; MAX_SAID] = [const { AtomicU64::new(0) }; MAX_SAID];
static N_INHERITED: AtomicUsize = AtomicUsize::new(0);
static N_SAID: AtomicUsize = AtomicUsize::new(0);

/// The library starts loading (its constructor, before the variables are judged): the warnings
/// about a variable's value said from now to [`load_ends`] are said only if no process the job
/// started before this one said them (their hashes in [`SAID`], which that process set for
/// its children).
pub(crate) fn load_begins() {
    let mut n = 0;
    if let Some(v) = crate::config::var(SAID) {
        for h in v
            .split(',')
            .filter_map(|h| u64::from_str_radix(h.trim(), 16).ok())
        {
            if n < MAX_SAID {
                SAID_HASHES[n].store(h, Ordering::Relaxed);
                n += 1;
            }
        }
    }
    N_INHERITED.store(n, Ordering::Relaxed);
    N_SAID.store(n, Ordering::Relaxed);
    LOADING.store(true, Ordering::Release);
}

/// The library has loaded (the end of its constructor): the warnings said here are added to
/// [`SAID`] for the processes this one starts. Only while this process has a single thread:
/// `setenv` may not run while another thread may read the environment (glibc's `getenv`
/// does not lock), and this thread, in the constructor, starts none before it returns; with
/// more threads (a library loaded before ours started one) nothing is set, and the processes
/// started say the warnings again, as without this.
pub(crate) fn load_ends() {
    LOADING.store(false, Ordering::Release);
    let (inherited, n) = (
        N_INHERITED.load(Ordering::Relaxed),
        N_SAID.load(Ordering::Relaxed),
    );
    if n == inherited || !single_threaded() {
        return;
    }
    let list: Vec<String> = SAID_HASHES[..n]
        .iter()
        .map(|h| format!("{:016x}", h.load(Ordering::Relaxed)))
        .collect();
    let (Ok(name), Ok(value)) = (
        std::ffi::CString::new(SAID),
        std::ffi::CString::new(list.join(",")),
    ) else {
        return;
    };
    // SAFETY: two valid C strings; no other thread runs (checked above, and this one starts
    // none meanwhile), so none reads the environment while it changes.
    unsafe { libc::setenv(name.as_ptr(), value.as_ptr(), 1) };
}

/// Whether the process runs one thread (`/proc/self/task` lists one).
fn single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.take(2).count() == 1)
}

/// Whether a warning `msg` said while the library loads was said already by a process the job
/// started before (then it is not said again); else it is noted for the processes this one
/// starts. Only warnings about a variable's value (the message starts with its name) count.
fn said_at_load(msg: &[u8]) -> bool {
    let names = [
        &b"VRAMSHIM_"[..],
        b"CUDA_DEVICE_MEMORY_LIMIT",
        b"GPU_MEMORY_LIMIT",
        b"NVIDIA_GPU_MEMORY_LIMIT",
    ];
    if !names.iter().any(|n| msg.starts_with(n)) {
        return false;
    }
    // FNV-1a: the same text hashes the same in every process of the job
    let h = msg.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let n = N_SAID.load(Ordering::Relaxed);
    if SAID_HASHES[..n]
        .iter()
        .any(|x| x.load(Ordering::Relaxed) == h)
    {
        return true;
    }
    if n < MAX_SAID {
        SAID_HASHES[n].store(h, Ordering::Relaxed);
        N_SAID.store(n + 1, Ordering::Relaxed);
    }
    false
}

/// Write one line `vramshim[pid] level: message` to stderr (unconditionally; the macros
/// check the level first).
pub(crate) fn write(level: Level, args: fmt::Arguments<'_>) {
    let mut b = StackBuf {
        buf: [0; 1024],
        len: 0,
        truncated: false,
    };
    let _ = write!(
        b,
        "vramshim[{}] {}: ",
        crate::sys::ids::pid(),
        level.label()
    );
    let start = b.len;
    let _ = b.write_fmt(args);
    if level == Level::Warn && LOADING.load(Ordering::Acquire) && said_at_load(&b.buf[start..b.len])
    {
        return;
    }
    if b.truncated {
        let end = b.buf.len() - 4;
        b.buf[end..end + 3].copy_from_slice(b"...");
        b.len = end + 3;
    }
    b.buf[b.len] = b'\n';
    b.len += 1;
    // SAFETY: the buffer holds b.len initialized bytes.
    unsafe { libc::write(2, b.buf.as_ptr().cast(), b.len) };
}

/// `crate::warn!(fmt, args...)`: a warning line on stderr (shown by default).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        if $crate::sys::log::enabled($crate::sys::log::Level::Warn) {
            $crate::sys::log::write($crate::sys::log::Level::Warn, format_args!($($arg)*));
        }
    };
}

/// `crate::info!(fmt, args...)`: shown with `VRAMSHIM_LOG=info` or `debug`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => {
        if $crate::sys::log::enabled($crate::sys::log::Level::Info) {
            $crate::sys::log::write($crate::sys::log::Level::Info, format_args!($($arg)*));
        }
    };
}

/// `crate::debug!(fmt, args...)`: shown with `VRAMSHIM_LOG=debug`.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::sys::log::enabled($crate::sys::log::Level::Debug) {
            $crate::sys::log::write($crate::sys::log::Level::Debug, format_args!($($arg)*));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn levels_order() {
        assert!(Level::Warn < Level::Debug);
        let long = "x".repeat(5000);
        write(Level::Debug, format_args!("long line {long}"));
    }
}
