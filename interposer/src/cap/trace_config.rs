//! The limits in force, for the trace header's configuration: one `cap.limit` entry per
//! source, `devices=all|0,1|pci:0000:01:00.0|nvml:N bytes=N|fraction=F kind=K source=TEXT`,
//! so that the analyzer names the source of a refusal's cap (the one whose value it is) as
//! the refusal line does. `kind` says where the limit came from:
//! - `group`: the cap of the shared region of `VRAMSHIM_SHARED` (the group's budget), when
//!   the region exists as the header is written (its creator's caps);
//! - `env`: `VRAMSHIM_CAP`; `tool`: another tool's variable (HAMi-core's, KAI's, NVIDIA's);
//! - `cgroup`: a cgroup's `dmem.max`; `nvml`: NVML's hard memory limit (the driver's, as
//!   NVIDIA's container toolkit sets it).
//!
//! NVML's limits are always named by NVML's index (`nvml:N`, as `nvidia-smi` and the
//! container toolkit's hook that sets them number the devices), whether the header is
//! written before or after the cap's set-up: only the index is known at every moment (the
//! CUDA ordinal needs the driver's device list, which a header may precede), and a trace
//! names a limit the same way whenever it was written. A cgroup's limits are named by CUDA
//! ordinal once the cap has mapped them to the process's devices (its set-up), else by PCI
//! address. Every limit is listed, whichever of a device's limits is the smallest.

use vramshim_region::spec::human_bytes;
use vramshim_region::{CapSpec, CapValue, MAX_DEVICES, Region};

use super::limits::{self, NVML_HARD, NVML_REGION};

/// The `cap.limit` entries of the process's cap (none without one).
pub(crate) fn trace_config() -> Vec<(String, String)> {
    let Some(cap) = super::global() else {
        return Vec::new();
    };
    let s = &cap.settings;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |devices: &str, value: &str, kind: &str, source: &str| {
        out.push((
            "cap.limit".into(),
            format!("devices={devices} {value} kind={kind} source={source}"),
        ))
    };
    // The group's budget, as refusals by it name it.
    let group = match (&s.shared, cap.region.get()) {
        (Some((name, _)), Some(r)) => Some((name, r.caps(), r.cap_text())),
        (Some((name, path)), None) => Region::open(path)
            .ok()
            .map(|r| (name, r.caps(), r.cap_text())),
        (None, _) => None,
    };
    if let Some((name, caps, text)) = &group {
        let source = format!(
            "VRAMSHIM_CAP=\"{text}\" of the budget shared by VRAMSHIM_SHARED=\"{}\"",
            name.escape_debug()
        );
        let origin: [Option<String>; MAX_DEVICES] =
            std::array::from_fn(|d| caps.devices[d].map(|_| source.clone()));
        for (devices, value, source) in by_source(&origin, caps) {
            push(&devices, &value, "group", &source);
        }
    }
    // The process's own caps, from the variables.
    for (devices, value, source) in by_source(&s.origin, &s.spec) {
        let kind = if source.starts_with("VRAMSHIM_CAP=") {
            "env"
        } else {
            "tool"
        };
        push(&devices, &value, kind, &source);
    }
    // NVML's limits, as read at the cap's start (by NVML index).
    for r in s.dmem.iter().filter(|r| r.is_nvml()) {
        if let Some(hard) = r.max {
            let index = r.region.trim_start_matches(NVML_REGION);
            push(
                &format!("nvml:{index}"),
                &format!("bytes={hard}"),
                "nvml",
                &format!("{NVML_HARD} ({} on NVML device {index})", human_bytes(hard)),
            );
        }
    }
    // The cgroup's limits: per CUDA device once mapped, else as read. Every one, also where
    // NVML's limit of the device is smaller: both bound it, and a reader explaining a refusal
    // sees both (the refusal's value names the one that bound).
    match cap.kernel_cgroup.get() {
        Some(mapped) => {
            for (d, ls) in mapped.iter().enumerate() {
                for l in ls {
                    push(
                        &d.to_string(),
                        &format!("bytes={}", l.bytes),
                        "cgroup",
                        &l.origin,
                    );
                }
            }
        }
        None => {
            for r in s.dmem.iter().filter(|r| !r.is_nvml()) {
                if let (Some(l), Some(a)) = (r.limit(), limits::pci_addr(&r.region)) {
                    push(
                        &format!("pci:{:04x}:{:02x}:{:02x}.{:x}", a.0, a.1, a.2, a.3),
                        &format!("bytes={}", l.bytes),
                        "cgroup",
                        &l.origin,
                    );
                }
            }
        }
    }
    out
}

/// `(devices, value, source)` per source of `origin` (what set each device's cap in
/// `spec`): `devices` is `all` or the ordinals, `value` `bytes=N` or `fraction=F` (of the
/// source's first device).
fn by_source(
    origin: &[Option<String>; MAX_DEVICES],
    spec: &CapSpec,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for o in origin.iter().flatten() {
        if seen.contains(&o.as_str()) {
            continue;
        }
        seen.push(o);
        let devs: Vec<usize> = (0..MAX_DEVICES)
            .filter(|&d| origin[d].as_deref() == Some(o.as_str()))
            .collect();
        let devices = if devs.len() == MAX_DEVICES {
            "all".to_string()
        } else {
            devs.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let value = match spec.devices[devs[0]] {
            Some(CapValue::Bytes(b)) => format!("bytes={b}"),
            Some(CapValue::Fraction(f)) => format!("fraction={f}"),
            None => continue,
        };
        out.push((devices, value, o.clone()));
    }
    out
}
