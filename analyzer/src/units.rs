//! Byte sizes and durations for humans, and size arguments from humans.

pub use vramshim_region::spec::bytes;

/// Signed byte difference: `+1.00 MiB`, `-512 B`, `0 B`.
pub fn bytes_delta(d: i128) -> String {
    let s = bytes(d.unsigned_abs().min(u64::MAX as u128) as u64);
    match d.signum() {
        1 => format!("+{s}"),
        -1 => format!("-{s}"),
        _ => s,
    }
}

/// `12.3 s`, `4.5 ms`, `800 ns`.
pub fn duration_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns >= 3_600_000_000_000 {
        let s = ns / 1_000_000_000;
        format!("{}h{:02}m{:02}s", s / 3600, (s / 60) % 60, s % 60)
    } else if ns >= 60_000_000_000 {
        let s = ns / 1_000_000_000;
        format!("{}m{:02}s", s / 60, s % 60)
    } else if ns >= 1_000_000_000 {
        format!("{:.3} s", f / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.3} ms", f / 1e6)
    } else if ns >= 1_000 {
        format!("{:.3} us", f / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// `2026-11-24 21:05:01.123456 UTC` for wall-clock ns since the Unix epoch (microseconds:
/// enough to order the processes of one machine).
pub fn wall_utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar, in 400-year
    // eras of 146,097 days).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:06} UTC",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        (ns % 1_000_000_000) / 1_000
    )
}

/// Parses a size as `VRAMSHIM_CAP` reads one (vramshim_region::spec::parse_size), so a size
/// means the same on every command: `1073741824` (bytes), `512M`, `8GiB`, `1.5g` (powers of
/// 1024), `24GB` (powers of 1000). A bare number with a fraction (`1.5`) is refused: it is
/// no number of bytes, and `--cap` of `run` reads it as a fraction of the device.
pub fn parse_size(s: &str) -> Result<u64, String> {
    const FORMS: &str =
        "accepted: 512MiB, 8GiB, 8G (powers of 1024), 24GB (powers of 1000), 1073741824 (bytes)";
    let t = s.trim();
    if t.contains('.') && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "bad size '{s}': not a whole number of bytes (a fraction of the device is not a size here); {FORMS}"
        ));
    }
    if t.starts_with('-') {
        return Err(format!("bad size '{s}': negative; {FORMS}"));
    }
    vramshim_region::spec::parse_size(t).map_err(|e| format!("bad size '{s}': {e}; {FORMS}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wall_clock_dates() {
        assert_eq!(wall_utc(0), "1970-01-01 00:00:00.000000 UTC");
        // date -u -d @1763780400 = 2025-11-22 03:00:00; a leap day; a century rule.
        assert_eq!(
            wall_utc(1_763_780_400_123_456_789),
            "2025-11-22 03:00:00.123456 UTC"
        );
        assert_eq!(
            wall_utc(1_709_164_800_000_000_000),
            "2024-02-29 00:00:00.000000 UTC"
        );
        assert_eq!(
            wall_utc(951_868_800_000_000_000),
            "2000-03-01 00:00:00.000000 UTC"
        );
    }
    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5Q").is_err());
        // The same meaning as VRAMSHIM_CAP (run --cap): SI units are powers of 1000, and a
        // bare fraction is no size.
        assert_eq!(parse_size("24GB").unwrap(), 24_000_000_000);
        assert_eq!(
            parse_size("24GB").unwrap(),
            vramshim_region::spec::parse_size("24GB").unwrap()
        );
        assert!(
            parse_size("1.5")
                .unwrap_err()
                .contains("not a whole number")
        );
        assert!(parse_size("-1G").is_err());
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes_delta(-2048), "-2.00 KiB");
    }
}
