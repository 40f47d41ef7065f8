//! Limits set for other tools, so vramshim drops in where they are configured: HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT` and `CUDA_DEVICE_MEMORY_LIMIT_<N>`, KAI's `GPU_MEMORY_LIMIT`,
//! NVIDIA's `NVIDIA_GPU_MEMORY_LIMIT`, and the kernel's cgroup v2 `dmem.max` (hard) and
//! `dmem.min` (soft, reported only) of the process's cgroup. Pure parsing, plus the reading of
//! the cgroup files (bounded); the caller passes the environment lookup.
//!
//! The rules (docs/cap.md, "Limits from other tools"):
//! - `VRAMSHIM_CAP`, when set, replaces the variables; without it each device's cap is the
//!   smallest of the variables that apply to it (`CUDA_DEVICE_MEMORY_LIMIT_<N>` replaces
//!   `CUDA_DEVICE_MEMORY_LIMIT` for device N, as in HAMi-core).
//! - A kernel limit (`dmem.max`) bounds the device whatever the variables say: the kernel
//!   enforces it anyway, and a refusal that names it beats an unexplained failure.
//! - Every message names the source that bound.

use std::path::{Path, PathBuf};

use vramshim_region::MAX_DEVICES;
use vramshim_region::spec::{self, human_bytes};

/// HAMi-core's accepted forms (its `get_limit_from_env`: a whole number, optionally followed
/// by one of the letters k, m, g in either case for KiB, MiB, GiB; 0 means no limit).
pub(crate) const HAMI_FORMS: &str = "accepted (HAMi-core's forms): a whole number of bytes, optionally followed by k, m or g (KiB, MiB, GiB: 1073741824, 256m, 24g); 0 means no limit";
/// The forms of `GPU_MEMORY_LIMIT` and `NVIDIA_GPU_MEMORY_LIMIT`.
pub(crate) const BYTES_FORMS: &str =
    "accepted: a number of bytes (1073741824) or a size (24GiB, 512MiB, 1.5GB); 0 means no limit";

/// The HAMi-core variable that caps every device, and the prefix of its per-device form.
pub(crate) const HAMI_ALL: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// The per-device names, `CUDA_DEVICE_MEMORY_LIMIT_0` to `_15` (the devices a cap describes).
pub(crate) const HAMI_DEVICE: [&str; MAX_DEVICES] = crate::config::HAMI_DEVICE_LIMITS;
/// KAI-Scheduler's isolator.
pub(crate) const KAI: &str = "GPU_MEMORY_LIMIT";
/// NVIDIA's container toolkit (the CDI hook that applies memory limits).
pub(crate) const NVIDIA: &str = "NVIDIA_GPU_MEMORY_LIMIT";

/// One limit in bytes and where it came from, as messages name it (`NAME="value"`, or the
/// cgroup file and region).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limit {
    pub bytes: u64,
    pub origin: String,
}

/// A HAMi-core value: digits (or `0x` and hex digits, which its `strtoul(.., 0)` also reads),
/// then at most one unit letter. `Ok(None)` = 0 = no limit. Forms HAMi-core would misread
/// (`24Gi`: the unit ignored, 24 bytes; `1.5g`: 1 GiB; `0100m`: octal) are refused.
pub(crate) fn parse_hami(v: &str) -> Result<Option<u64>, String> {
    let t = v.trim();
    if t.is_empty() {
        return Err("empty value".into());
    }
    let (num, mult) = match t.as_bytes()[t.len() - 1].to_ascii_lowercase() {
        b'k' => (&t[..t.len() - 1], 1u64 << 10),
        b'm' => (&t[..t.len() - 1], 1 << 20),
        b'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n = if let Some(hex) = num.strip_prefix("0x").or_else(|| num.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("\"{t}\" is not a number"));
        }
        u64::from_str_radix(hex, 16).map_err(|_| format!("\"{t}\" is too large"))?
    } else {
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "\"{t}\" is not a whole number with an optional k, m or g"
            ));
        }
        if num.len() > 1 && num.starts_with('0') {
            return Err(format!(
                "\"{t}\" starts with 0, which HAMi-core reads as octal: write it without the leading zeros"
            ));
        }
        num.parse::<u64>()
            .map_err(|_| format!("\"{t}\" is too large"))?
    };
    let b = n
        .checked_mul(mult)
        .ok_or_else(|| format!("\"{t}\" is too large"))?;
    Ok((b > 0).then_some(b))
}

/// A `GPU_MEMORY_LIMIT` / `NVIDIA_GPU_MEMORY_LIMIT` value: bytes or a size. `Ok(None)` = 0.
pub(crate) fn parse_bytes(v: &str) -> Result<Option<u64>, String> {
    let t = v.trim();
    if t.is_empty() {
        return Err("empty value".into());
    }
    let b = spec::parse_size(t)?;
    Ok((b > 0).then_some(b))
}

fn origin(name: &str, value: &str) -> String {
    format!("{name}=\"{}\"", value.trim().escape_debug())
}

/// The caps the variables give each device (`None`: no variable applies), and one line per
/// bad value (the variable is then ignored: the other sources still apply).
pub(crate) fn from_env(
    get: &dyn Fn(&str) -> Option<String>,
    lines: &mut Vec<String>,
) -> [Option<Limit>; MAX_DEVICES] {
    let mut read = |name: &str, parse: fn(&str) -> Result<Option<u64>, String>, forms: &str| {
        // Empty reads as unset (HAMi-core: no limit).
        let v = get(name).filter(|v| !v.trim().is_empty())?;
        match parse(&v) {
            Ok(b) => b.map(|bytes| Limit {
                bytes,
                origin: origin(name, &v),
            }),
            Err(reason) => {
                lines.push(format!(
                    "vramshim: {name}=\"{}\" is not valid ({reason}); {forms}; ignoring it",
                    v.escape_debug()
                ));
                None
            }
        }
    };
    let all = read(HAMI_ALL, parse_hami, HAMI_FORMS);
    let kai = read(KAI, parse_bytes, BYTES_FORMS);
    let nvidia = read(NVIDIA, parse_bytes, BYTES_FORMS);
    let mut out: [Option<Limit>; MAX_DEVICES] = Default::default();
    for (d, slot) in out.iter_mut().enumerate() {
        let hami = read(HAMI_DEVICE[d], parse_hami, HAMI_FORMS).or_else(|| all.clone());
        // The smallest; on a tie the first in this order.
        *slot = [hami, kai.clone(), nvidia.clone()]
            .into_iter()
            .flatten()
            .min_by_key(|l| l.bytes);
    }
    out
}

/// One region of a cgroup's `dmem.max` or `dmem.min`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DmemRegion {
    /// As the kernel names it, e.g. `drm/0000:01:00.0/vram0`.
    pub region: String,
    /// The hard limit (the smallest `dmem.max` of the cgroup and its ancestors); None = max.
    pub max: Option<u64>,
    /// The `dmem.max` file that set it.
    pub max_file: Option<PathBuf>,
    /// The cgroup's own `dmem.min` (memory protected from eviction: reported, never a bound).
    pub min: Option<u64>,
}

/// Bounds on what is read: lines per file, bytes per file, cgroup depth.
const MAX_REGIONS: usize = 64;
const MAX_FILE: u64 = 64 << 10;
const MAX_DEPTH: usize = 64;

/// The cgroup v2 path of this process (the `0::` line of `/proc/self/cgroup`).
pub(crate) fn own_cgroup() -> Option<String> {
    let text = read_bounded(Path::new("/proc/self/cgroup"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

fn read_bounded(p: &Path) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(p).ok()?;
    let mut s = String::new();
    f.take(MAX_FILE).read_to_string(&mut s).ok()?;
    Some(s)
}

/// `REGION VALUE` lines (`VALUE`: bytes or `max`); malformed lines are skipped.
fn parse_dmem(text: &str) -> Vec<(String, Option<u64>)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (r, v) = (it.next()?, it.next()?);
            let v = if v == "max" {
                None
            } else {
                Some(v.parse::<u64>().ok()?)
            };
            Some((r.to_string(), v))
        })
        .take(MAX_REGIONS)
        .collect()
}

/// The dmem limits of cgroup `cgroup` (a path like `/a/b`) under the cgroup v2 mount `root`:
/// each region's smallest `dmem.max` on the way up to the root, and its own `dmem.min`.
pub(crate) fn dmem(root: &Path, cgroup: &str) -> Vec<DmemRegion> {
    let rel = cgroup.trim_start_matches('/');
    // A path that climbs out of the root (`..`) is not a cgroup path: read nothing.
    if rel.split('/').any(|c| c == "..") {
        return Vec::new();
    }
    let mut dirs = Vec::new();
    let mut dir = root.join(rel);
    loop {
        dirs.push(dir.clone());
        if dir == root || dirs.len() >= MAX_DEPTH || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    let mut out: Vec<DmemRegion> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        if let Some(text) = read_bounded(&d.join("dmem.max")) {
            for (region, v) in parse_dmem(&text) {
                let file = d.join("dmem.max");
                let e = match out.iter_mut().position(|r| r.region == region) {
                    Some(k) => &mut out[k],
                    None if out.len() < MAX_REGIONS => {
                        out.push(DmemRegion {
                            region,
                            max: None,
                            max_file: None,
                            min: None,
                        });
                        out.last_mut().expect("pushed")
                    }
                    None => continue,
                };
                if let Some(b) = v
                    && e.max.is_none_or(|m| b < m)
                {
                    e.max = Some(b);
                    e.max_file = Some(file);
                }
            }
        }
        if i == 0
            && let Some(text) = read_bounded(&d.join("dmem.min"))
        {
            for (region, v) in parse_dmem(&text) {
                match out.iter().position(|r| r.region == region) {
                    Some(k) => out[k].min = v,
                    None if out.len() < MAX_REGIONS => out.push(DmemRegion {
                        region,
                        max: None,
                        max_file: None,
                        min: v,
                    }),
                    None => {}
                }
            }
        }
    }
    out
}

/// A PCI address `domain:bus:device.function` in hex, as numbers.
pub(crate) type PciAddr = (u32, u8, u8, u8);

/// The first PCI address in `s` (`0000:01:00.0` or the 8-digit-domain `00000000:01:00.0`).
/// Works on bytes: any text (not only ASCII) is looked through without slicing inside a
/// character.
pub(crate) fn pci_addr(s: &str) -> Option<PciAddr> {
    let b = s.as_bytes();
    let hex =
        |x: &[u8]| -> Option<u32> { u32::from_str_radix(std::str::from_utf8(x).ok()?, 16).ok() };
    let is_hex = |x: &[u8]| x.iter().all(u8::is_ascii_hexdigit);
    for start in 0..b.len() {
        if !b[start].is_ascii_hexdigit() || (start > 0 && b[start - 1].is_ascii_hexdigit()) {
            continue;
        }
        let n = b[start..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        let t = &b[start + n..];
        if !(4..=8).contains(&n) || t.len() < 8 || t[0] != b':' || t[3] != b':' || t[6] != b'.' {
            continue;
        }
        let (bus, dev, func) = (&t[1..3], &t[4..6], &t[7..8]);
        if !(is_hex(bus) && is_hex(dev) && is_hex(func)) {
            continue;
        }
        return Some((
            hex(&b[start..start + n])?,
            hex(bus)? as u8,
            hex(dev)? as u8,
            hex(func)? as u8,
        ));
    }
    None
}

/// How the NVML memory limits read at set-up are kept beside the cgroup's regions: one
/// region per NVML device, named `nvml device N` (N: NVML's index), so that the rules that
/// drop them (`VRAMSHIM_CAP_FAULT=ignore-limits`) and report them are the same.
pub(crate) const NVML_REGION: &str = "nvml device ";
/// How messages name NVML's hard limit.
pub(crate) const NVML_HARD: &str = "NVML memory limit (hard)";

/// NVML's `(index, soft, hard)` limits as regions (0 or all ones: none).
pub(crate) fn nvml_regions(limits: Vec<(u32, u64, u64)>) -> Vec<DmemRegion> {
    let some = |b: u64| (b != 0 && b != u64::MAX).then_some(b);
    limits
        .into_iter()
        .filter(|&(_, soft, hard)| some(soft).is_some() || some(hard).is_some())
        .take(MAX_REGIONS)
        .map(|(i, soft, hard)| DmemRegion {
            region: format!("{NVML_REGION}{i}"),
            max: some(hard),
            max_file: None,
            min: some(soft),
        })
        .collect()
}

/// NVML's hard limit of CUDA device `d` as a limit (`hard`: bytes; 0 or all ones: none).
pub(crate) fn nvml_limit(d: usize, hard: u64) -> Option<Limit> {
    (hard != 0 && hard != u64::MAX).then(|| Limit {
        bytes: hard,
        origin: format!("{NVML_HARD} ({} on device {d})", human_bytes(hard)),
    })
}

impl DmemRegion {
    /// Whether this is an NVML device's limits (see [`NVML_REGION`]), not a cgroup region.
    pub(crate) fn is_nvml(&self) -> bool {
        self.region.starts_with(NVML_REGION)
    }

    /// The limit this region sets, named for messages (None: no hard limit).
    pub(crate) fn limit(&self) -> Option<Limit> {
        let bytes = self.max?;
        Some(Limit {
            bytes,
            origin: format!(
                "cgroup {} ({} {})",
                self.max_file
                    .as_deref()
                    .map_or_else(|| "dmem.max".into(), |p| p.display().to_string()),
                self.region,
                human_bytes(bytes)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hami_forms_as_hami_core_reads_them() {
        assert_eq!(parse_hami("256m"), Ok(Some(256 << 20)));
        assert_eq!(parse_hami("24g"), Ok(Some(24 << 30)));
        assert_eq!(parse_hami("24G"), Ok(Some(24 << 30)));
        assert_eq!(parse_hami("1024K"), Ok(Some(1 << 20)));
        assert_eq!(parse_hami("1073741824"), Ok(Some(1 << 30)));
        assert_eq!(parse_hami("0x400m"), Ok(Some(1 << 30)));
        assert_eq!(parse_hami(" 4000m "), Ok(Some(4000 << 20)));
        assert_eq!(parse_hami("0"), Ok(None));
        assert_eq!(parse_hami("0g"), Ok(None));
        for bad in [
            "",
            "m",
            "24Gi",
            "24GiB",
            "1.5g",
            "-1g",
            "0100m",
            "abc",
            "99999999999999999999",
        ] {
            assert!(parse_hami(bad).is_err(), "{bad}");
        }
        assert!(parse_hami("17179869184g").is_err(), "overflow");
    }

    #[test]
    fn byte_forms() {
        assert_eq!(parse_bytes("1073741824"), Ok(Some(1 << 30)));
        assert_eq!(parse_bytes("24GiB"), Ok(Some(24 << 30)));
        assert_eq!(parse_bytes("0"), Ok(None));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("").is_err());
    }

    fn env(vars: &[(&str, &str)]) -> ([Option<Limit>; MAX_DEVICES], Vec<String>) {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut lines = Vec::new();
        let l = from_env(
            &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            &mut lines,
        );
        (l, lines)
    }

    #[test]
    fn smallest_variable_wins_per_device_and_is_named() {
        let (l, lines) = env(&[]);
        assert!(lines.is_empty() && l.iter().all(Option::is_none));
        let (l, _) = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
            ("GPU_MEMORY_LIMIT", "2684354560"),
        ]);
        let d0 = l[0].clone().unwrap();
        assert_eq!(d0.bytes, 2 << 30);
        assert_eq!(d0.origin, "CUDA_DEVICE_MEMORY_LIMIT=\"2g\"");
        // Device 1's own HAMi limit (3g) replaces the global one; KAI's 2.5 GiB is smaller.
        let d1 = l[1].clone().unwrap();
        assert_eq!(d1.bytes, 2684354560);
        assert_eq!(d1.origin, "GPU_MEMORY_LIMIT=\"2684354560\"");
        let (l, _) = env(&[
            ("NVIDIA_GPU_MEMORY_LIMIT", "1GiB"),
            ("GPU_MEMORY_LIMIT", "0"),
        ]);
        assert!(
            l.iter()
                .all(|x| x.as_ref().unwrap().origin.starts_with("NVIDIA_"))
        );
    }

    #[test]
    fn a_bad_value_is_one_line_and_ignored() {
        let (l, lines) = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "24Gi"),
            ("GPU_MEMORY_LIMIT", "1g"),
        ]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("CUDA_DEVICE_MEMORY_LIMIT=\"24Gi\""),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("256m, 24g"), "{}", lines[0]);
        assert_eq!(l[0].as_ref().unwrap().bytes, 1 << 30);
    }

    #[test]
    fn pci_addresses() {
        assert_eq!(pci_addr("drm/0000:01:00.0/vram0"), Some((0, 1, 0, 0)));
        assert_eq!(pci_addr("00000000:65:00.1"), Some((0, 0x65, 0, 1)));
        assert_eq!(pci_addr("drm/0001:3B:1f.7/vram0"), Some((1, 0x3b, 0x1f, 7)));
        assert_eq!(pci_addr("vram0"), None);
        assert_eq!(pci_addr("drm/01:00.0"), None);
        assert_eq!(pci_addr("drm/éé0000:01:00.0/vram0"), Some((0, 1, 0, 0)));
        assert_eq!(pci_addr("é"), None);
    }

    #[test]
    fn dmem_takes_the_smallest_max_up_the_tree() {
        let root = vramshim_testkit::TempDir::new("dmem");
        let leaf = root.join("a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(
            root.join("a/dmem.max"),
            "drm/0000:01:00.0/vram0 1073741824\ndrm/0000:02:00.0/vram0 max\n",
        )
        .unwrap();
        std::fs::write(
            leaf.join("dmem.max"),
            "drm/0000:01:00.0/vram0 max\ndrm/0000:02:00.0/vram0 536870912\ngarbage\n",
        )
        .unwrap();
        std::fs::write(leaf.join("dmem.min"), "drm/0000:01:00.0/vram0 268435456\n").unwrap();
        let r = dmem(&root, "/a/b");
        let by = |n: &str| r.iter().find(|x| x.region.contains(n)).unwrap().clone();
        let one = by("01:00.0");
        assert_eq!(one.max, Some(1 << 30));
        assert_eq!(one.max_file, Some(root.join("a/dmem.max")));
        assert_eq!(one.min, Some(256 << 20));
        let two = by("02:00.0");
        assert_eq!(two.max, Some(512 << 20));
        assert!(two.limit().unwrap().origin.contains("a/b/dmem.max"));
        assert!(dmem(&root, "/../etc").is_empty());
        assert!(dmem(&root, "/none").is_empty());
    }

    #[test]
    fn nvml_limits_as_regions() {
        let r = nvml_regions(vec![(0, 0, 0), (1, 1 << 30, 2 << 30), (2, 0, u64::MAX)]);
        assert_eq!(r.len(), 1);
        assert!(r[0].is_nvml() && r[0].region == "nvml device 1");
        assert_eq!((r[0].min, r[0].max), (Some(1 << 30), Some(2 << 30)));
        assert_eq!(pci_addr(&r[0].region), None);
        let l = nvml_limit(0, 2 << 30).unwrap();
        assert_eq!(l.origin, "NVML memory limit (hard) (2 GiB on device 0)");
        assert!(nvml_limit(0, 0).is_none());
    }
}
