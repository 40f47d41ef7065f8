//! Byte sizes and durations for humans, and size arguments from humans.

/// `1.5 GiB`, `512 B`: binary units, three significant digits.
pub fn bytes(n: u64) -> String {
    const U: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.0} {}", U[i])
    } else if v >= 10.0 {
        format!("{v:.1} {}", U[i])
    } else {
        format!("{v:.2} {}", U[i])
    }
}

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

/// Parses `1073741824`, `512M`, `8GiB`, `1.5g`, `24GB` (powers of 1024 throughout; RAM and
/// VRAM sizes are binary whatever the suffix says).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "bad size '{s}': unknown unit '{unit}' (use B, K, M, G, T)"
            ));
        }
    };
    if num.is_empty() {
        return Err(format!("bad size '{s}': expected a number like 512M or 8G"));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("bad size '{s}': too large"));
    }
    let f: f64 = num
        .parse()
        .map_err(|_| format!("bad size '{s}': expected a number like 512M or 8G"))?;
    let v = f * mult as f64;
    if !(0.0..1.8e19).contains(&v) {
        return Err(format!("bad size '{s}': out of range"));
    }
    Ok(v.round() as u64)
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
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes_delta(-2048), "-2.00 KiB");
    }
}
