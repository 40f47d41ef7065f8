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

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};

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
    let _ = b.write_fmt(args);
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
