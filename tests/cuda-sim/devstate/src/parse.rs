//! Parsing of `VRAMSIM_*` values, shared by the simulated driver and NVML so both read the
//! same configuration the same way.

use std::time::Duration;

pub const SIZE_FORMS: &str = "a byte count with an optional unit: 1048576, 512KiB, 512MiB, 16GiB, 8G, 1TiB (K/M/G/T, KB/MB/GB and KiB/MiB/GiB all mean powers of 1024)";
pub const DURATION_FORMS: &str = "a duration: 0, 500ns, 20us, 5ms, 1s";

/// Parses a size such as `16GiB`, `512MiB`, `8G`, `4096`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.contains('.') {
        let v: f64 = num.parse().ok()?;
        let bytes = v * mult as f64;
        (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Parses a duration such as `5ms`, `20us`, `1s`, `100ns`, `0`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "" if n == 0 => Duration::ZERO,
        _ => return None,
    })
}

/// Reads `var`, parses it with `parse`, and on a bad value prints one line naming the
/// variable, the value and the accepted forms, then returns `default`.
pub fn env_or<T>(var: &str, default: T, forms: &str, parse: impl Fn(&str) -> Option<T>) -> T {
    env_or_with(var, default, forms, parse, true)
}

/// As [`env_or`]; `warn: false` stays silent (another library of the stack already said it).
pub fn env_or_with<T>(
    var: &str,
    default: T,
    forms: &str,
    parse: impl Fn(&str) -> Option<T>,
    warn: bool,
) -> T {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => match parse(&v) {
            Some(x) => x,
            None => {
                if warn {
                    warn_bad(var, &v, forms);
                }
                default
            }
        },
        _ => default,
    }
}

/// The one line printed for a malformed `VRAMSIM_*` value.
pub fn warn_bad(var: &str, value: &str, forms: &str) {
    eprintln!("vramsim: ignoring {var}={value:?}: expected {forms}; using the default");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16GiB"), Some(16 << 30));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("GiB"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5ms"), Some(Duration::from_millis(5)));
        assert_eq!(parse_duration("20us"), Some(Duration::from_micros(20)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("fast"), None);
    }
}
