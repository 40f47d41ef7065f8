//! A progress line on stderr for long work, shown only when stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total: u64,
    enabled: bool,
    last: Instant,
    drawn: bool,
}

impl Progress {
    /// `total` is in the unit passed to `update` (bytes of input, usually); 0 = unknown.
    pub fn new(label: &str, total: u64) -> Progress {
        Progress::maybe(label, total, true)
    }

    /// Like `new`, but never shown when `want` is false.
    pub fn maybe(label: &str, total: u64, want: bool) -> Progress {
        let enabled = want
            && std::io::stderr().is_terminal()
            && std::env::var_os("VRAMSHIM_NO_PROGRESS").is_none();
        Progress {
            label: label.to_string(),
            total,
            enabled,
            last: Instant::now(),
            drawn: false,
        }
    }

    /// Cheap to call often: redraws at most 10 times a second.
    #[inline]
    pub fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last) < Duration::from_millis(100) {
            return;
        }
        self.last = now;
        self.draw(done);
    }

    fn draw(&mut self, done: u64) {
        let mut err = std::io::stderr().lock();
        if self.total > 0 {
            let frac = (done as f64 / self.total as f64).clamp(0.0, 1.0);
            let width = 30;
            let filled = (frac * width as f64) as usize;
            let _ = write!(
                err,
                "\r{} [{}{}] {:5.1}%",
                self.label,
                "#".repeat(filled),
                " ".repeat(width - filled),
                frac * 100.0
            );
        } else {
            let _ = write!(err, "\r{} {}", self.label, done);
        }
        let _ = err.flush();
        self.drawn = true;
    }

    pub fn finish(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}\r", " ".repeat(self.label.len() + 48));
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
