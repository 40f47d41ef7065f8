//! What the trace header says about the process, and the output path.

use std::ffi::c_char;

use vramshim_trace::{DeviceInfo, FORMAT_VERSION, Header};

pub(crate) fn host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut c_char, buf.len() - 1) };
    if r != 0 {
        return "unknown".into();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Expands `%p` (pid), `%h` (host), `%t` (start time, Unix seconds) and `%%`. A forked child
/// whose pattern has no `%p` gets `.<pid>` appended, so it never clobbers its parent's file.
pub(crate) fn expand(pattern: &str, pid: u32, wall_ns: u64, forked_child: bool) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut it = pattern.chars();
    let mut has_pid = false;
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('p') => {
                has_pid = true;
                out.push_str(&pid.to_string());
            }
            Some('h') => out.push_str(&host()),
            Some('t') => out.push_str(&(wall_ns / 1_000_000_000).to_string()),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    if forked_child && !has_pid {
        out.push('.');
        out.push_str(&pid.to_string());
    }
    out
}

pub(crate) fn build(wall: u64, mono: u64) -> Header {
    Header {
        format_version: FORMAT_VERSION,
        pid: crate::sys::ids::pid(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        host: host(),
        cmdline: cmdline(),
        start_wall_ns: wall,
        start_mono_ns: mono,
        devices: devices(),
        // The environment in force, and which clock the timestamps come from.
        config: crate::config::all()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("trace.clock".to_string(), super::clock::name().to_string())])
            .chain((super::device_view().cap_limits)())
            .collect(),
    }
}

/// Devices, from the real driver, only if the process already loaded and initialised it
/// (empty otherwise; the writer retries and emits `Device` records later).
pub(crate) fn devices() -> Vec<DeviceInfo> {
    crate::cuda::driver::devices_if_initialised()
        .into_iter()
        .map(|d| DeviceInfo {
            index: d.index,
            name: d.name,
            total_bytes: d.total_bytes,
            uuid: d.uuid,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn pattern_expansion() {
        assert_eq!(
            expand("/tmp/a-%p.vramtrace", 42, 0, false),
            "/tmp/a-42.vramtrace"
        );
        assert_eq!(expand("x%t%%", 1, 7_000_000_000, false), "x7%");
        assert_eq!(expand("x.vramtrace", 9, 0, true), "x.vramtrace.9");
        assert_eq!(expand("x-%p", 9, 0, true), "x-9");
        assert!(!expand("%h", 1, 0, false).contains('%'));
        assert_eq!(expand("%q%", 1, 0, false), "%q%");
    }
}
