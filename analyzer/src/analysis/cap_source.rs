//! Which limit set a cap, from the trace header's `cap.limit` entries (written by the
//! library: one per source in force, `devices=all|0,1|pci:ADDR|nvml:N bytes=N|fraction=F
//! kind=group|env|tool|cgroup|nvml source=TEXT`; traces before `kind` lack it). A refusal's
//! cap is named by the source whose value it is: the bytes of a group's budget, a variable or
//! a kernel or driver limit, else a fraction of the device (`VRAMSHIM_CAP=0.5`).

use vramshim_trace::Header;

/// One `cap.limit` entry.
#[derive(Debug, PartialEq)]
struct Entry<'a> {
    /// None: every device (`all`, or a limit named by PCI address or NVML index: the trace
    /// does not say which ordinal that is).
    devices: Option<Vec<i32>>,
    bytes: Option<u64>,
    fraction: bool,
    kind: Option<&'a str>,
    source: &'a str,
}

impl Entry<'_> {
    /// Which of two sources of the same value the library names: a group's budget (it
    /// bounds the group's total, so it refuses first), then a variable, then the kernel's
    /// limit, then the driver's (the library names a kernel or driver limit only when it is
    /// strictly smaller, and the cgroup's on a tie with NVML's).
    fn rank(&self) -> u8 {
        let kind = self.kind.unwrap_or(if self.source.starts_with("cgroup ") {
            "cgroup"
        } else if self.source.starts_with("NVML ") {
            "nvml"
        } else {
            "env"
        });
        match kind {
            "group" => 0,
            "cgroup" => 2,
            "nvml" => 3,
            _ => 1,
        }
    }
}

fn parse(v: &str) -> Option<Entry<'_>> {
    let (head, source) = v.split_once(" source=")?;
    let mut e = Entry {
        devices: None,
        bytes: None,
        fraction: false,
        kind: None,
        source,
    };
    for part in head.split_whitespace() {
        if let Some(d) = part.strip_prefix("devices=") {
            if d != "all" && !d.starts_with("pci:") && !d.starts_with("nvml:") {
                e.devices = Some(d.split(',').filter_map(|x| x.parse().ok()).collect());
            }
        } else if let Some(b) = part.strip_prefix("bytes=") {
            e.bytes = Some(b.parse().ok()?);
        } else if part.starts_with("fraction=") {
            e.fraction = true;
        } else if let Some(k) = part.strip_prefix("kind=") {
            e.kind = Some(k);
        }
    }
    Some(e)
}

/// One limit in force as the trace header lists it (`summary` shows them, `--json` has them
/// as `cap_limits`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CapLimit {
    /// `all`, ordinals (`0,1`), `pci:ADDR` (a cgroup's region) or `nvml:N` (NVML's index), as
    /// the library wrote it.
    pub devices: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Where it came from: `group`, `env`, `tool`, `cgroup`, `nvml` (None: a trace written
    /// before the library said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub source: String,
}

impl CapLimit {
    /// Where it came from, in words.
    pub fn origin(&self) -> &'static str {
        match self.kind.as_deref() {
            Some("group") => "the group's budget",
            Some("env") => "VRAMSHIM_CAP",
            Some("tool") => "another tool's variable",
            Some("cgroup") => "the cgroup",
            Some("nvml") => "NVML (the driver)",
            _ => "the library",
        }
    }

    /// The devices it bounds, in words.
    pub fn devices_text(&self) -> String {
        let d = self.devices.as_str();
        if d == "all" {
            "every device".into()
        } else if let Some(a) = d.strip_prefix("pci:") {
            format!("the device at PCI {a}")
        } else if let Some(n) = d.strip_prefix("nvml:") {
            format!("NVML device {n}")
        } else if d.contains(',') {
            format!("devices {}", d.replace(',', ", "))
        } else {
            format!("device {d}")
        }
    }
}

/// The header's `cap.limit` entries, in order (entries that do not parse are left out).
pub fn limits(header: &Header) -> Vec<CapLimit> {
    header
        .config
        .iter()
        .filter(|(k, _)| k == "cap.limit")
        .filter_map(|(_, v)| {
            let e = parse(v)?;
            let head = v.split_once(" source=")?.0;
            let field = |name: &str| {
                head.split_whitespace()
                    .find_map(|p| p.strip_prefix(name))
                    .map(str::to_string)
            };
            Some(CapLimit {
                devices: field("devices=")?,
                bytes: e.bytes,
                fraction: field("fraction=").and_then(|f| f.parse().ok()),
                kind: e.kind.map(str::to_string),
                source: e.source.to_string(),
            })
        })
        .collect()
}

/// The source of cap `cap` (bytes) on `device`, when the trace lists its limits.
pub fn cap_source(header: &Header, device: i32, cap: u64) -> Option<String> {
    let entries: Vec<Entry> = header
        .config
        .iter()
        .filter(|(k, _)| k == "cap.limit")
        .filter_map(|(_, v)| parse(v))
        .filter(|e| e.devices.as_ref().is_none_or(|d| d.contains(&device)))
        .collect();
    // A device-specific entry before one for every device; of the same value, as the
    // library names them (`Entry::rank`).
    let exact = |specific: bool| {
        entries
            .iter()
            .filter(|e| e.bytes == Some(cap) && e.devices.is_some() == specific)
            .min_by_key(|e| e.rank())
    };
    exact(true)
        .or_else(|| exact(false))
        .or_else(|| entries.iter().find(|e| e.fraction))
        .map(|e| e.source.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(entries: &[&str]) -> Header {
        Header {
            config: entries
                .iter()
                .map(|v| ("cap.limit".to_string(), v.to_string()))
                .collect(),
            ..Header::default()
        }
    }

    #[test]
    fn the_source_whose_value_the_cap_is() {
        let h = header(&[
            "devices=all bytes=1073741824 source=GPU_MEMORY_LIMIT=\"1073741824\"",
            "devices=0 bytes=268435456 source=CUDA_DEVICE_MEMORY_LIMIT_0=\"256m\"",
            "devices=pci:0000:01:00.0 bytes=536870912 source=cgroup /x/dmem.max (drm/0000:01:00.0/vram0 512 MiB)",
        ]);
        assert_eq!(
            cap_source(&h, 0, 268435456).as_deref(),
            Some("CUDA_DEVICE_MEMORY_LIMIT_0=\"256m\"")
        );
        assert_eq!(
            cap_source(&h, 1, 1 << 30).as_deref(),
            Some("GPU_MEMORY_LIMIT=\"1073741824\"")
        );
        assert!(
            cap_source(&h, 0, 512 << 20)
                .unwrap()
                .starts_with("cgroup /x/dmem.max")
        );
        assert_eq!(cap_source(&h, 0, 12345), None);
        let h = header(&["devices=all fraction=0.5 source=VRAMSHIM_CAP=\"0.5\""]);
        assert_eq!(
            cap_source(&h, 3, 8 << 30).as_deref(),
            Some("VRAMSHIM_CAP=\"0.5\"")
        );
        assert_eq!(cap_source(&Header::default(), 0, 1), None);
    }

    #[test]
    fn the_limits_as_listed() {
        let h = header(&[
            "devices=all bytes=268435456 kind=group source=VRAMSHIM_CAP=\"268435456\" of the budget shared by VRAMSHIM_SHARED=\"job\"",
            "devices=0,1 fraction=0.5 kind=env source=VRAMSHIM_CAP=\"0=0.5,1=0.5\"",
            "devices=nvml:0 bytes=201326592 kind=nvml source=NVML memory limit (hard) (192 MiB on NVML device 0)",
            "devices=pci:0000:01:00.0 bytes=1 source=cgroup /x/dmem.max (drm/0000:01:00.0/vram0 1 B)",
            "garbage",
        ]);
        let l = limits(&h);
        assert_eq!(l.len(), 4, "{l:?}");
        assert_eq!(
            (l[0].origin(), l[0].devices_text(), l[0].bytes),
            (
                "the group's budget",
                "every device".to_string(),
                Some(256 << 20)
            )
        );
        assert_eq!(
            (l[1].devices_text(), l[1].fraction, l[1].bytes),
            ("devices 0, 1".to_string(), Some(0.5), None)
        );
        assert_eq!(
            (l[2].origin(), l[2].devices_text()),
            ("NVML (the driver)", "NVML device 0".to_string())
        );
        assert_eq!((l[3].origin(), l[3].kind.as_deref()), ("the library", None));
        assert!(
            l[3].devices_text()
                .starts_with("the device at PCI 0000:01:00.0")
        );
    }

    /// NVML's limits (by NVML index before the cap mapped them, by ordinal after) and a
    /// group's budget are named; of the same value the group's, then a variable's, then the
    /// kernel's, then the driver's.
    #[test]
    fn nvml_limits_and_a_groups_budget() {
        let nvml = "NVML memory limit (hard) (192 MiB on NVML device 0)";
        let h = header(&[
            &format!("devices=nvml:0 bytes=201326592 kind=nvml source={nvml}"),
            "devices=all bytes=1073741824 kind=env source=VRAMSHIM_CAP=\"1GiB\"",
        ]);
        assert_eq!(cap_source(&h, 0, 192 << 20).as_deref(), Some(nvml));
        assert_eq!(cap_source(&h, 3, 192 << 20).as_deref(), Some(nvml));
        let group = "VRAMSHIM_CAP=\"268435456\" of the budget shared by VRAMSHIM_SHARED=\"job\"";
        let h = header(&[
            "devices=1 bytes=268435456 kind=nvml source=NVML memory limit (hard) (256 MiB on device 1)",
            "devices=1 bytes=268435456 kind=cgroup source=cgroup /x/dmem.max (drm/0000:02:00.0/vram0 256 MiB)",
            "devices=all bytes=268435456 kind=tool source=GPU_MEMORY_LIMIT=\"268435456\"",
            &format!("devices=all bytes=268435456 kind=group source={group}"),
        ]);
        assert_eq!(cap_source(&h, 0, 256 << 20).as_deref(), Some(group));
        // A device-specific entry still comes first; of those, the cgroup's.
        assert!(cap_source(&h, 1, 256 << 20).unwrap().starts_with("cgroup "));
        // Traces without `kind`: told apart by the source.
        let h = header(&[
            "devices=all bytes=268435456 source=NVML memory limit (hard) (256 MiB on NVML device 0)",
            "devices=all bytes=268435456 source=cgroup /x/dmem.max (drm/0000:02:00.0/vram0 256 MiB)",
        ]);
        assert!(cap_source(&h, 0, 256 << 20).unwrap().starts_with("cgroup "));
    }
}
