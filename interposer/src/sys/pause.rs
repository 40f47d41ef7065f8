//! Test-only pause points (`VRAMSHIM_POOL_DEBUG=pause-begin`, `pause-request`,
//! `pause-settled`): the library
//! stops where a thread found it must wait for another one, until the workload lets it go, so
//! that a test orders the threads of a race by handshake instead of by sleeping (a sleep
//! races the library's own waits, which give up after a while).
//!
//! The workload names two of its file descriptors in `VRAMSHIM_POOL_PAUSE_FDS=NOTIFY,RESUME`.
//! At an armed point the library writes one byte, `P`, to NOTIFY, then reads one byte from
//! RESUME (or its end) before it goes on. Each point stops once per process, at its first
//! wait. Off (the default, and in every process that does not name a point), a point costs
//! the test of one static initialized once; only the begin-capture hooks and the library's
//! waits for each other reach one, never an allocation served from a cache.

use std::ffi::c_int;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the library may stop.
#[derive(Clone, Copy)]
pub(crate) enum Point {
    /// A begin-capture hook waits for a decision in flight on another thread (a pool request
    /// under the pool's lock, a gated section) before its real begin call
    /// (`pause-begin`).
    Begin = 0,
    /// A decision whether a capture forbids a call waits for another thread's begin-capture
    /// call in flight (`pause-request`).
    Request = 1,
    /// The cap emptied the driver's pools for a request, which has yet to charge and make its
    /// real call (`pause-settled`): where a begin on another thread may come.
    Settled = 2,
}

/// The switch name of each [`Point`], in its order (as [`read`] asks for them).
const NAMES: [&str; 3] = ["pause-begin", "pause-request", "pause-settled"];

struct Armed {
    /// The points not stopped at yet.
    points: [AtomicBool; 3],
    notify: c_int,
    resume: c_int,
}

/// The armed points and the workload's descriptors; `None` when no point is named (or the
/// descriptors are not given: said once).
fn armed() -> Option<&'static Armed> {
    static READ: OnceLock<Option<Armed>> = OnceLock::new();
    READ.get_or_init(read).as_ref()
}

fn read() -> Option<Armed> {
    let on = [
        crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "pause-begin"),
        crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "pause-request"),
        crate::config::switch_on("VRAMSHIM_POOL_DEBUG", "pause-settled"),
    ];
    if !on.contains(&true) {
        return None;
    }
    let value = crate::config::var("VRAMSHIM_POOL_PAUSE_FDS").unwrap_or("");
    let Some((notify, resume)) = parse_fds(value) else {
        crate::warn!(
            "VRAMSHIM_POOL_DEBUG names a pause point but VRAMSHIM_POOL_PAUSE_FDS={value:?} is not NOTIFY,RESUME (two file descriptors): the library never stops (testing only)"
        );
        return None;
    };
    crate::warn!(
        "VRAMSHIM_POOL_DEBUG: the library stops at its first wait of {} until the workload writes to descriptor {resume} (testing only)",
        NAMES
            .iter()
            .zip(on)
            .filter(|&(_, on)| on)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Some(Armed {
        points: on.map(AtomicBool::new),
        notify,
        resume,
    })
}

/// `NOTIFY,RESUME`: two non-negative descriptor numbers.
fn parse_fds(value: &str) -> Option<(c_int, c_int)> {
    let (a, b) = value.split_once(',')?;
    let fd = |s: &str| s.trim().parse::<c_int>().ok().filter(|&n| n >= 0);
    Some((fd(a)?, fd(b)?))
}

/// The calling thread is about to wait at `point` if `waits()` says so (asked only while the
/// point is armed): then, the first time, it stops there until the workload lets it go.
#[inline]
pub(crate) fn at(point: Point, waits: impl FnOnce() -> bool) {
    if let Some(a) = armed()
        && a.points[point as usize].load(Ordering::Relaxed)
        && waits()
        && a.points[point as usize].swap(false, Ordering::Relaxed)
    {
        stop(a);
    }
}

#[cold]
#[inline(never)]
fn stop(a: &Armed) {
    crate::debug!("pause point: stopped; the workload lets it go");
    // SAFETY: writes one byte from a live buffer; the descriptor is the workload's (a bad one
    // fails the call, which is then not waited for).
    let wrote = unsafe { libc::write(a.notify, b"P".as_ptr().cast(), 1) } == 1;
    if !wrote {
        crate::warn!("pause point: descriptor {} refused the notice", a.notify);
        return;
    }
    let mut byte = 0u8;
    loop {
        // SAFETY: reads at most one byte into a live local.
        let n = unsafe { libc::read(a.resume, (&raw mut byte).cast(), 1) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_fds;

    #[test]
    fn the_descriptors_parse_as_documented() {
        assert_eq!(parse_fds("40,41"), Some((40, 41)));
        assert_eq!(parse_fds(" 3 , 4 "), Some((3, 4)));
        for bad in ["", "40", "40,", ",41", "a,b", "-1,4", "40;41", "40,41,42"] {
            assert_eq!(parse_fds(bad), None, "{bad:?}");
        }
    }
}
