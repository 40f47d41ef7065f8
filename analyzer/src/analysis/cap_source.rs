//! Which limit set a cap, from the trace header's `cap.limit` entries (written by the
//! library: one per source in force, `devices=all|0,1|pci:ADDR bytes=N|fraction=F
//! source=TEXT`). A refusal's cap is named by the source whose value it is: the bytes of a
//! variable or a kernel limit, else a fraction of the device (`VRAMSHIM_CAP=0.5`).

use vramshim_trace::Header;

/// One `cap.limit` entry.
#[derive(Debug, PartialEq)]
struct Entry<'a> {
    /// None: every device (`all`, or a kernel limit named by PCI address: the trace does not
    /// say which ordinal that is).
    devices: Option<Vec<i32>>,
    bytes: Option<u64>,
    fraction: bool,
    source: &'a str,
}

fn parse(v: &str) -> Option<Entry<'_>> {
    let (head, source) = v.split_once(" source=")?;
    let mut e = Entry {
        devices: None,
        bytes: None,
        fraction: false,
        source,
    };
    for part in head.split_whitespace() {
        if let Some(d) = part.strip_prefix("devices=") {
            if d != "all" && !d.starts_with("pci:") {
                e.devices = Some(d.split(',').filter_map(|x| x.parse().ok()).collect());
            }
        } else if let Some(b) = part.strip_prefix("bytes=") {
            e.bytes = Some(b.parse().ok()?);
        } else if part.starts_with("fraction=") {
            e.fraction = true;
        }
    }
    Some(e)
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
    // A device-specific entry before one for every device; a variable before a kernel limit
    // of the same value (the library names the kernel only when it is strictly smaller).
    let exact = |specific: bool| {
        entries
            .iter()
            .filter(|e| e.bytes == Some(cap) && e.devices.is_some() == specific)
            .min_by_key(|e| e.source.starts_with("cgroup "))
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
}
