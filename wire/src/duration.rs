//! Go durations (Go: time.ParseDuration and time.Duration.String), as nsqd's flags,
//! config file and /stats use them.

use std::time::Duration;

/// Parses a Go duration such as `60s`, `250ms`, `1h30m`, `1.5s`, `100us`; a bare `0` is
/// zero. Errors name the bad value.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?} (use Go syntax, e.g. 60s, 250ms, 1h)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_len == 0 {
            return Err(err());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += n * unit;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go's `time.Duration.String()` does (`1m0s`, `250ms`,
/// `1.235858905s`).
pub fn go_duration_string(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return trim_frac(format!("{:.3}", ns as f64 / 1e3)) + "µs";
    }
    if ns < 1_000_000_000 {
        return trim_frac(format!("{:.6}", ns as f64 / 1e6)) + "ms";
    }
    let h = ns / 3_600_000_000_000;
    let m = (ns / 60_000_000_000) % 60;
    let s_ns = ns % 60_000_000_000;
    let secs = trim_frac(format!(
        "{}.{:09}",
        s_ns / 1_000_000_000,
        s_ns % 1_000_000_000
    )) + "s";
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

fn trim_frac(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("abc").is_err());
        assert_eq!(go_duration_string(Duration::from_millis(1235)), "1.235s");
        assert_eq!(go_duration_string(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration_string(Duration::from_millis(250)), "250ms");
    }
}
