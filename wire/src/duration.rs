//! Go durations (Go: time.ParseDuration and time.Duration.String), as nsqd's flags,
//! config file and /stats use them.

use std::fmt;
use std::time::Duration;

/// Why a Go duration did not parse; its `Display` is Go's text (time.ParseDuration), or
/// this crate's for a negative one where none is allowed. Each variant holds the text
/// that was parsed (the unit's too, for [`DurationError::UnknownUnit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DurationError {
    /// `time: invalid duration "x"`: not a duration, or out of range.
    Invalid(String),
    /// `time: missing unit in duration "x"`.
    MissingUnit(String),
    /// `time: unknown unit "u" in duration "x"`.
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole text parsed.
        duration: String,
    },
    /// `negative duration "x"` ([`parse_duration`]).
    Negative(String),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Invalid(d) => write!(f, "time: invalid duration {}", time_quote(d)),
            DurationError::MissingUnit(d) => {
                write!(f, "time: missing unit in duration {}", time_quote(d))
            }
            DurationError::UnknownUnit { unit, duration } => write!(
                f,
                "time: unknown unit {} in duration {}",
                time_quote(unit),
                time_quote(duration)
            ),
            DurationError::Negative(d) => write!(f, "negative duration {}", time_quote(d)),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses a Go duration such as `60s`, `250ms`, `1h30m`, `1.5s`, `100us` for a flag
/// that takes no negative value: [`parse_go_duration`], then refused when negative.
/// Errors are Go's texts (`time: invalid duration "abc"`), or `negative duration
/// "-5s"`.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let ns = parse_go_duration(s)?;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Negative(s.to_string()))
}

/// Go's `time.ParseDuration` (Go 1.19, time/format.go), exactly: `[-+]?([0-9]*(\.[0-9]*)?
/// unit)+` with units `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`, or a bare `0`;
/// integer arithmetic with Go's overflow checks (at most 2^63-1 ns, -2^63 ns when
/// negative) and Go's float rounding of fractions. Returns nanoseconds. Errors are Go's
/// texts: `time: invalid duration "x"`, `time: missing unit in duration "x"`, `time:
/// unknown unit "u" in duration "x"`, quoted as Go's time package quotes.
pub fn parse_go_duration(orig: &str) -> Result<i64, DurationError> {
    const LIMIT: u64 = 1 << 63;
    let invalid = || DurationError::Invalid(orig.to_string());
    let mut s = orig.as_bytes();
    let mut neg = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: u64 = 0;
    while let Some(&c0) = s.first() {
        if !(c0 == b'.' || c0.is_ascii_digit()) {
            return Err(invalid());
        }
        // [0-9]* (Go: leadingInt; an overflow is an invalid duration)
        let mut v: u64 = 0;
        let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
        for &c in &s[..digits] {
            if v > LIMIT / 10 {
                return Err(invalid());
            }
            v = v * 10 + u64::from(c - b'0');
            if v > LIMIT {
                return Err(invalid());
            }
        }
        let pre = digits > 0;
        s = &s[digits..];
        // (\.[0-9]*)? (Go: leadingFraction; digits past the precision are dropped)
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
            let mut overflow = false;
            for &c in &s[..digits] {
                if overflow {
                    continue;
                }
                if f > (LIMIT - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let y = f * 10 + u64::from(c - b'0');
                if y > LIMIT {
                    overflow = true;
                    continue;
                }
                f = y;
                scale *= 10.0;
            }
            post = digits > 0;
            s = &s[digits..];
        }
        if !pre && !post {
            return Err(invalid());
        }
        let unit_len = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(orig.to_string()));
        }
        let (u, rest) = s.split_at(unit_len);
        s = rest;
        let unit: u64 = match u {
            b"ns" => 1,
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => {
                return Err(DurationError::UnknownUnit {
                    unit: String::from_utf8_lossy(u).into_owned(),
                    duration: orig.to_string(),
                })
            }
        };
        if v > LIMIT / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            // Go: float64 is nanosecond-accurate for fractions of an hour.
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        d += v;
        if d > LIMIT {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((d as i64).wrapping_neg());
    }
    i64::try_from(d).map_err(|_| invalid())
}

/// Go's time package `quote`: `"`-quoted, `"` and `\\` escaped, every byte of a
/// character below a space or beyond ASCII written as `\xNN`.
pub fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if (c as u32) < 0x20 || (c as u32) >= 0x80 {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                out.push_str(&format!("\\x{byte:02x}"));
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
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
        return trim_frac(format!("{}.{:03}", ns / 1_000, ns % 1_000)) + "µs";
    }
    if ns < 1_000_000_000 {
        return trim_frac(format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000)) + "ms";
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
        assert_eq!(
            parse_duration("-5s").map_err(|e| e.to_string()),
            Err("negative duration \"-5s\"".to_string())
        );
        assert_eq!(go_duration_string(Duration::from_millis(1235)), "1.235s");
        assert_eq!(go_duration_string(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration_string(Duration::from_millis(250)), "250ms");
    }

    /// Go 1.19's answers (time.ParseDuration), also where float arithmetic drifted.
    #[test]
    fn go_parse_duration_exactly() {
        let max = i64::MAX;
        for (s, want) in [
            ("2562047h47m16.854775807s", Ok(max)),
            ("9223372036854775807ns", Ok(max)),
            ("-9223372036854775808ns", Ok(i64::MIN)),
            ("0.000000001s", Ok(1)),
            ("1.000000001s", Ok(1_000_000_001)),
            ("1.0000000019s", Ok(1_000_000_001)),
            (".5s", Ok(500_000_000)),
            ("5.s", Ok(5_000_000_000)),
            ("+1h", Ok(3_600_000_000_000)),
            ("1h1h", Ok(7_200_000_000_000)),
            ("3µs", Ok(3_000)),
            ("3μs", Ok(3_000)),
        ] {
            assert_eq!(parse_go_duration(s), want, "{s}");
        }
        for s in [
            "9223372036854775808ns",
            "2562047h47m16.854775808s",
            "99999999999999999999999h",
            "3000000h",
            ".s",
            "-.s",
            "",
            "-",
            "1s.s",
        ] {
            assert_eq!(
                parse_go_duration(s).map_err(|e| e.to_string()),
                Err(format!("time: invalid duration {}", time_quote(s))),
                "{s}"
            );
        }
        assert_eq!(
            parse_go_duration("1\u{e9}").map_err(|e| e.to_string()),
            Err("time: unknown unit \"\\xc3\\xa9\" in duration \"1\\xc3\\xa9\"".into())
        );
        assert_eq!(
            parse_go_duration("1\n").map_err(|e| e.to_string()),
            Err("time: unknown unit \"\\x0a\" in duration \"1\\x0a\"".into())
        );
        assert_eq!(
            parse_go_duration("12").map_err(|e| e.to_string()),
            Err("time: missing unit in duration \"12\"".into())
        );
        assert_eq!(
            go_duration_string(Duration::from_nanos(max as u64)),
            "2562047h47m16.854775807s"
        );
        assert_eq!(
            go_duration_string(Duration::from_nanos(1_234_567)),
            "1.234567ms"
        );
        assert_eq!(
            go_duration_string(Duration::from_nanos(999_999_999)),
            "999.999999ms"
        );
        assert_eq!(go_duration_string(Duration::from_nanos(1_500)), "1.5µs");
    }
}
