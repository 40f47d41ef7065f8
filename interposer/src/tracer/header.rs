//! What the trace header says about the process, and the output path.

use std::ffi::{c_char, c_int};

use vramshim_trace::{DeviceInfo, FORMAT_VERSION, Header};

pub(crate) fn wall_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

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

type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int;

/// Devices, from the real driver, only if the process already loaded and initialised it
/// (empty otherwise; the writer retries and emits `Device` records later).
pub(crate) fn devices() -> Vec<DeviceInfo> {
    if crate::cuda::real::libcuda_if_loaded().is_null() {
        return Vec::new();
    }
    let count = crate::cuda::real::driver_symbol(c"cuDeviceGetCount");
    let get = crate::cuda::real::driver_symbol(c"cuDeviceGet");
    let name = crate::cuda::real::driver_symbol(c"cuDeviceGetName");
    // `_v2` gives a MIG instance its own UUID; plain `cuDeviceGetUuid` the parent GPU's.
    let uuid = match crate::cuda::real::driver_symbol(c"cuDeviceGetUuid_v2") {
        0 => crate::cuda::real::driver_symbol(c"cuDeviceGetUuid"),
        a => a,
    };
    let Some(total) = crate::cuda::real::cuDeviceTotalMem_v2() else {
        return Vec::new();
    };
    if count == 0 || get == 0 || name == 0 {
        return Vec::new();
    }
    // SAFETY: the addresses are the real driver functions of these names, with these ABIs.
    let (count, get, name) = unsafe {
        (
            std::mem::transmute::<usize, CuDeviceGetCount>(count),
            std::mem::transmute::<usize, CuDeviceGet>(get),
            std::mem::transmute::<usize, CuDeviceGetName>(name),
        )
    };
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    if unsafe { count(&mut n) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.clamp(0, 64) {
        let mut dev: c_int = -1;
        // SAFETY: dev is a valid out-pointer.
        if unsafe { get(&mut dev, i) } != 0 {
            continue;
        }
        let mut buf = [0u8; 256];
        // SAFETY: buf is writable for the length passed.
        let rc = unsafe { name(buf.as_mut_ptr() as *mut c_char, buf.len() as c_int - 1, dev) };
        let nm = if rc == 0 {
            let k = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..k]).into_owned()
        } else {
            String::new()
        };
        let mut bytes: usize = 0;
        // SAFETY: bytes is a valid out-pointer.
        let rc = unsafe { total(&mut bytes, dev) };
        let id = (uuid != 0)
            .then(|| {
                // SAFETY: `uuid` is the real driver's cuDeviceGetUuid(_v2), whose ABI is
                // CuDeviceGetUuid (CUuuid is 16 bytes).
                let f = unsafe { std::mem::transmute::<usize, CuDeviceGetUuid>(uuid) };
                let mut id = [0u8; 16];
                // SAFETY: id is a valid 16-byte out-pointer; the driver checks the ordinal.
                (unsafe { f(&mut id, dev) } == 0).then_some(id)
            })
            .flatten();
        out.push(DeviceInfo {
            index: i,
            name: nm,
            total_bytes: if rc == 0 { bytes as u64 } else { 0 },
            uuid: id,
        });
    }
    out
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
