//! `VRAMSHIM_CAP` and `VRAMSHIM_SHARED` parsing: pure functions, no environment access.
//!
//! Accepted `VRAMSHIM_CAP` forms:
//! - a fraction of each device in (0, 1]: `0.9`, `.5`, `1.0`, or a percentage `90%`;
//! - a size: `40GiB`, `512MiB`, `1.5GB`, `2T`, `1073741824` (bytes). IEC units (`KiB`, `MiB`,
//!   `GiB`, `TiB`, and the single letters `K`, `M`, `G`, `T`) are powers of 1024; SI units
//!   (`KB`, `MB`, `GB`, `TB`) powers of 1000; case does not matter, a space before the unit is
//!   allowed; a bare integer is bytes; a fractional size is rounded down to whole bytes;
//! - a per-device list `0=40GiB,1=0.5` (device ordinals as CUDA numbers them in the process);
//!   a device that is not listed is not capped.

use std::fmt;

/// Devices a region (and a per-device list) can describe.
pub const MAX_DEVICES: usize = 16;

/// The accepted forms, as printed in every error message.
pub const CAP_FORMS: &str = "accepted: a fraction of the device in (0, 1] (0.9 or 90%), a size (40GiB, 512MiB, 1.5GB, 1073741824 bytes) or a per-device list (0=40GiB,1=0.5)";

/// The accepted forms of `VRAMSHIM_SHARED`.
pub const SHARED_FORMS: &str = "accepted: a name of 1 to 64 letters, digits, '.', '_' or '-' (the region is /dev/shm/vramshim-<uid>-<name>) or an absolute file path";

/// The cap of one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CapValue {
    /// A share of the device's real total memory, in (0, 1].
    Fraction(f64),
    /// An absolute number of bytes (> 0).
    Bytes(u64),
}

impl CapValue {
    /// The cap in bytes for a device of `real_total` bytes.
    pub fn resolve(self, real_total: u64) -> u64 {
        match self {
            CapValue::Bytes(b) => b,
            CapValue::Fraction(f) => {
                let v = (real_total as f64 * f).floor();
                if v >= real_total as f64 {
                    real_total
                } else {
                    v as u64
                }
            }
        }
    }
}

impl fmt::Display for CapValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapValue::Fraction(x) => write!(f, "{x}"),
            CapValue::Bytes(b) => f.write_str(&human_bytes(*b)),
        }
    }
}

/// A parsed `VRAMSHIM_CAP`: one optional cap per device ordinal.
#[derive(Clone, Debug, PartialEq)]
pub struct CapSpec {
    pub devices: [Option<CapValue>; MAX_DEVICES],
    /// True for the single-value form (every device capped alike).
    pub all: bool,
}

impl CapSpec {
    /// No device capped.
    pub fn none() -> CapSpec {
        CapSpec {
            devices: [None; MAX_DEVICES],
            all: false,
        }
    }

    /// The cap of `device`, if any.
    pub fn get(&self, device: i32) -> Option<CapValue> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d).copied().flatten())
    }

    /// The highest device ordinal named by a per-device list.
    pub fn highest_listed(&self) -> Option<usize> {
        if self.all {
            return None;
        }
        self.devices.iter().rposition(|c| c.is_some())
    }

    /// The canonical text of this spec (what `parse_cap` reads back to an equal spec).
    pub fn to_text(&self) -> String {
        if self.all {
            return self.devices[0].map(canonical).unwrap_or_default();
        }
        let parts: Vec<String> = self
            .devices
            .iter()
            .enumerate()
            .filter_map(|(d, c)| c.map(|c| format!("{d}={}", canonical(c))))
            .collect();
        parts.join(",")
    }
}

fn canonical(c: CapValue) -> String {
    match c {
        CapValue::Fraction(x) => format!("{x:?}"),
        CapValue::Bytes(b) => b.to_string(),
    }
}

/// Parses a `VRAMSHIM_CAP` value. The error is the reason only (no variable name, no forms):
/// callers build the one-line message with [`cap_error_line`].
pub fn parse_cap(text: &str) -> Result<CapSpec, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty value".into());
    }
    if !t.contains('=') {
        let v = parse_cap_value(t)?;
        return Ok(CapSpec {
            devices: [Some(v); MAX_DEVICES],
            all: true,
        });
    }
    let mut spec = CapSpec::none();
    for entry in t.split(',') {
        let entry = entry.trim();
        let Some((idx, val)) = entry.split_once('=') else {
            return Err(format!("list entry \"{entry}\" is not DEVICE=CAP"));
        };
        let idx = idx.trim();
        if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("device index \"{idx}\" is not a number"));
        }
        let d: usize = idx
            .parse()
            .map_err(|_| format!("device index \"{idx}\" is too large"))?;
        if d >= MAX_DEVICES {
            return Err(format!(
                "device index {d} is out of range (0 to {})",
                MAX_DEVICES - 1
            ));
        }
        if spec.devices[d].is_some() {
            return Err(format!("device {d} is listed twice"));
        }
        let val = val.trim();
        if val.is_empty() {
            return Err(format!("device {d} has no cap after '='"));
        }
        spec.devices[d] = Some(parse_cap_value(val).map_err(|e| format!("device {d}: {e}"))?);
    }
    Ok(spec)
}

/// Parses one cap: a fraction, a percentage or a size.
pub fn parse_cap_value(t: &str) -> Result<CapValue, String> {
    let t = t.trim();
    if t.starts_with('-') {
        return Err(format!("\"{t}\" is negative"));
    }
    if let Some(p) = t.strip_suffix('%') {
        let x = parse_decimal(p.trim()).ok_or_else(|| format!("\"{t}\" is not a percentage"))?;
        return fraction(x / 100.0, t);
    }
    let (num, unit) = split_unit(t);
    if num.is_empty() {
        return Err(format!("\"{t}\" is not a number"));
    }
    if unit.is_empty() {
        if num.contains('.') {
            let x = parse_decimal(num).ok_or_else(|| format!("\"{t}\" is not a number"))?;
            return fraction(x, t);
        }
        let b: u64 = num
            .parse()
            .map_err(|_| format!("\"{t}\" is not a number"))?;
        if b == 0 {
            return Err("a cap of 0 bytes".into());
        }
        return Ok(CapValue::Bytes(b));
    }
    let b = parse_size(t)?;
    if b == 0 {
        return Err(format!("\"{t}\" is 0 bytes"));
    }
    Ok(CapValue::Bytes(b))
}

fn fraction(x: f64, t: &str) -> Result<CapValue, String> {
    if x.is_finite() && x > 0.0 && x <= 1.0 {
        Ok(CapValue::Fraction(x))
    } else {
        Err(format!("fraction {t} is not in (0, 1]"))
    }
}

fn split_unit(t: &str) -> (&str, &str) {
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    (t[..end].trim(), t[end..].trim())
}

/// Digits with at most one '.', at least one digit.
fn parse_decimal(s: &str) -> Option<f64> {
    let ok = !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && s.bytes().filter(|&b| b == b'.').count() <= 1
        && s.bytes().any(|b| b.is_ascii_digit());
    if ok { s.parse().ok() } else { None }
}

/// Parses a size with an optional IEC or SI unit (see the module docs).
pub fn parse_size(t: &str) -> Result<u64, String> {
    let (num, unit) = split_unit(t.trim());
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("unknown unit \"{unit}\" in \"{}\"", t.trim())),
    };
    let x = parse_decimal(num).ok_or_else(|| format!("\"{}\" is not a size", t.trim()))?;
    if !num.contains('.') {
        let n: u64 = num
            .parse()
            .map_err(|_| format!("\"{}\" is too large", t.trim()))?;
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("\"{}\" is too large", t.trim()));
    }
    let v = (x * mult as f64).floor();
    if v >= u64::MAX as f64 {
        return Err(format!("\"{}\" is too large", t.trim()));
    }
    Ok(v as u64)
}

/// The one stderr line for a bad `VRAMSHIM_CAP` value.
pub fn cap_error_line(value: &str, reason: &str) -> String {
    format!(
        "vramshim: VRAMSHIM_CAP=\"{}\" is not valid ({reason}); {CAP_FORMS}; running without a cap (pass-through)",
        value.escape_debug()
    )
}

/// Where the region of a `VRAMSHIM_SHARED` value lives: a name maps to
/// `/dev/shm/vramshim-<uid>-<name>`, an absolute path is used as is.
pub fn shared_path(value: &str, uid: u32) -> Result<std::path::PathBuf, String> {
    let v = value.trim();
    if v.starts_with('/') {
        if v.ends_with('/') {
            return Err(format!("\"{v}\" names a directory, not a file"));
        }
        return Ok(std::path::PathBuf::from(v));
    }
    if v.is_empty() {
        return Err("empty name".into());
    }
    if v.len() > 64 {
        return Err("name longer than 64 characters".into());
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("character {c:?} is not allowed in a name"));
    }
    if v == "." || v == ".." {
        return Err(format!("\"{v}\" is not a name"));
    }
    Ok(std::path::PathBuf::from(format!(
        "/dev/shm/vramshim-{uid}-{v}"
    )))
}

const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// Bytes for humans, the one formatter of every vramshim message and report: binary units,
/// three significant digits (`512 B`, `1.50 GiB`, `12.5 MiB`, `300 MiB`).
pub fn bytes(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.0} {}", UNITS[i])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// A size as one sets it (a cap, a request): a whole number of its largest unit as such
/// (`1 GiB`, `300 MiB`), any other size as [`bytes`] writes it (`1.50 GiB`).
pub fn human_bytes(b: u64) -> String {
    let unit = if b == 0 {
        0
    } else {
        ((63 - b.leading_zeros()) / 10) as usize
    };
    if unit > 0 && b.is_multiple_of(1u64 << (10 * unit)) {
        format!("{} {}", b >> (10 * unit), UNITS[unit])
    } else {
        bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(v: CapValue) -> CapSpec {
        CapSpec {
            devices: [Some(v); MAX_DEVICES],
            all: true,
        }
    }

    #[test]
    fn fractions() {
        assert_eq!(parse_cap("0.9"), Ok(all(CapValue::Fraction(0.9))));
        assert_eq!(parse_cap(".5"), Ok(all(CapValue::Fraction(0.5))));
        assert_eq!(parse_cap("1.0"), Ok(all(CapValue::Fraction(1.0))));
        assert_eq!(parse_cap(" 0.25 "), Ok(all(CapValue::Fraction(0.25))));
        assert_eq!(parse_cap("90%"), Ok(all(CapValue::Fraction(0.9))));
        assert_eq!(parse_cap("100%"), Ok(all(CapValue::Fraction(1.0))));
    }

    #[test]
    fn sizes_iec_and_si() {
        assert_eq!(parse_cap("40GiB"), Ok(all(CapValue::Bytes(40 << 30))));
        assert_eq!(parse_cap("512MiB"), Ok(all(CapValue::Bytes(512 << 20))));
        assert_eq!(parse_cap("1.5GB"), Ok(all(CapValue::Bytes(1_500_000_000))));
        assert_eq!(parse_cap("1.5GiB"), Ok(all(CapValue::Bytes(3 << 29))));
        assert_eq!(parse_cap("2t"), Ok(all(CapValue::Bytes(2 << 40))));
        assert_eq!(parse_cap("64 kb"), Ok(all(CapValue::Bytes(64_000))));
        assert_eq!(parse_cap("8G"), Ok(all(CapValue::Bytes(8 << 30))));
        assert_eq!(parse_cap("1073741824"), Ok(all(CapValue::Bytes(1 << 30))));
        assert_eq!(parse_cap("100B"), Ok(all(CapValue::Bytes(100))));
    }

    #[test]
    fn per_device_list() {
        let s = parse_cap("0=40GiB,1=0.5").unwrap();
        assert!(!s.all);
        assert_eq!(s.get(0), Some(CapValue::Bytes(40 << 30)));
        assert_eq!(s.get(1), Some(CapValue::Fraction(0.5)));
        assert_eq!(s.get(2), None);
        assert_eq!(s.get(-1), None);
        assert_eq!(s.highest_listed(), Some(1));
        let s = parse_cap(" 3 = 1GiB , 0=50% ").unwrap();
        assert_eq!(s.get(3), Some(CapValue::Bytes(1 << 30)));
        assert_eq!(s.get(0), Some(CapValue::Fraction(0.5)));
    }

    #[test]
    fn bad_values_are_rejected_with_a_reason() {
        for bad in [
            "1.5",
            "-1",
            "abc",
            "0=",
            "",
            "   ",
            "0",
            "0.0",
            "0GiB",
            "1.2.3",
            "12XB",
            "GiB",
            "0=abc",
            "x=1GiB",
            "16=1GiB",
            "99999999999999999999=1",
            "0=1GiB,0=2GiB",
            "0=1GiB,",
            "0=1GiB,1",
            "150%",
            "-5%",
            "nan",
            "inf",
            "1e9",
            "99999999999999999999",
            "20000000000TiB",
            "0.5.",
            "=",
        ] {
            let r = parse_cap(bad);
            assert!(r.is_err(), "{bad:?} parsed as {r:?}");
        }
        assert_eq!(
            parse_cap("1.5"),
            Err("fraction 1.5 is not in (0, 1]".into())
        );
        assert_eq!(parse_cap("-1"), Err("\"-1\" is negative".into()));
        assert_eq!(parse_cap("0="), Err("device 0 has no cap after '='".into()));
        assert_eq!(
            parse_cap("16=1GiB"),
            Err("device index 16 is out of range (0 to 15)".into())
        );
    }

    #[test]
    fn error_line_names_variable_value_and_forms() {
        let line = cap_error_line("1.5", "fraction 1.5 is not in (0, 1]");
        assert!(line.starts_with("vramshim: VRAMSHIM_CAP=\"1.5\" is not valid"));
        assert!(line.contains("0=40GiB,1=0.5") && line.contains("512MiB") && line.contains("0.9"));
        assert!(!line.contains('\n'));
        let line = cap_error_line("a\nb", "x");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn resolve_fraction_and_bytes() {
        assert_eq!(CapValue::Fraction(0.5).resolve(16 << 30), 8 << 30);
        assert_eq!(CapValue::Fraction(1.0).resolve(u64::MAX), u64::MAX);
        assert_eq!(CapValue::Fraction(0.75).resolve(1000), 750);
        assert_eq!(CapValue::Bytes(5).resolve(1000), 5);
    }

    #[test]
    fn canonical_text_round_trips() {
        for t in ["0.9", "40GiB", "0=40GiB,1=0.5", "3=1.5GB", "75%"] {
            let s = parse_cap(t).unwrap();
            assert_eq!(parse_cap(&s.to_text()).unwrap(), s, "{t}");
        }
    }

    #[test]
    fn shared_names_and_paths() {
        assert_eq!(
            shared_path("job-1.a_b", 1000).unwrap(),
            std::path::PathBuf::from("/dev/shm/vramshim-1000-job-1.a_b")
        );
        assert_eq!(
            shared_path("/tmp/x/r", 1).unwrap(),
            std::path::PathBuf::from("/tmp/x/r")
        );
        for bad in [
            "",
            "a/b",
            "..",
            ".",
            "a b",
            "é",
            "/tmp/dir/",
            &"x".repeat(65),
        ] {
            assert!(shared_path(bad, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(300 << 20), "300 MiB");
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(5 << 50), "5 PiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
        assert_eq!(bytes(1 << 30), "1.00 GiB");
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes((25 << 20) / 2), "12.5 MiB");
    }
}
