//! Civil time formatting without a clock library: HTTP dates, RFC 3339 and nsqd's log
//! timestamps, all in UTC.

/// (year, month 1-12, day 1-31) of days since 1970-01-01 (H. Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

struct Parts {
    y: i64,
    mo: u32,
    d: u32,
    h: i64,
    mi: i64,
    s: i64,
    wd: usize,
}

fn parts(unix_secs: i64) -> Parts {
    let days = unix_secs.div_euclid(86400);
    let rem = unix_secs.rem_euclid(86400);
    let (y, mo, d) = civil(days);
    Parts {
        y,
        mo,
        d,
        h: rem / 3600,
        mi: (rem / 60) % 60,
        s: rem % 60,
        wd: (days + 4).rem_euclid(7) as usize,
    }
}

const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `Sun, 29 Nov 2026 19:39:42 GMT` (RFC 7231 IMF-fixdate).
pub fn http_date(unix_secs: i64) -> String {
    let p = parts(unix_secs);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[p.wd],
        p.d,
        MONTHS[(p.mo - 1) as usize],
        p.y,
        p.h,
        p.mi,
        p.s
    )
}

/// `2026-11-29T19:39:41Z`.
pub fn rfc3339(unix_secs: i64) -> String {
    let p = parts(unix_secs);
    format!(
        "{}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        p.y, p.mo, p.d, p.h, p.mi, p.s
    )
}

/// nsqd's log timestamp: `2026/11/29 19:39:41.709417`.
pub fn log_stamp(unix_nanos: i64) -> String {
    let secs = unix_nanos.div_euclid(1_000_000_000);
    let micros = unix_nanos.rem_euclid(1_000_000_000) / 1000;
    let p = parts(secs);
    format!(
        "{}/{:02}/{:02} {:02}:{:02}:{:02}.{:06}",
        p.y, p.mo, p.d, p.h, p.mi, p.s, micros
    )
}

/// Days since 1970-01-01 of a civil date (the inverse of `civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `<digits>[.<1-9 digits>]` as nanoseconds times `unit_ns` for the integer part.
fn decimal_ns(s: &str) -> Option<i64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.contains('.') && (frac.is_empty() || frac.len() > 9) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = int.parse().ok()?;
    let frac_ns: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// Parses a point in time given as Unix seconds (`1795981182`, fractions up to ns:
/// `1795981182.25`) or RFC 3339 (`2026-11-29T19:39:42Z`, `2026-11-29T20:39:42.5+01:00`;
/// a space in place of the offset's `+`, which is what an unescaped `+` in a query
/// string becomes, is accepted). Returns Unix nanoseconds; `None` for anything else, a
/// field out of range (Go's time.Parse ranges: no leap second) or a time outside i64
/// nanoseconds (years 1678-2262).
pub fn parse_time_ns(s: &str) -> Option<i64> {
    if !s.contains('-') || s.len() < 20 {
        return decimal_ns(s);
    }
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)? as u32, num(8..10)? as u32);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || !(1..=12).contains(&mo) || d == 0 || d > days_in_month(y, mo) {
        return None;
    }
    if h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac_ns = 0i64;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 || n > 9 {
            return None;
        }
        frac_ns = format!("{:0<9}", &r[..n]).parse().ok()?;
        rest = &r[n..];
    }
    let offset_s = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' | b' ' => 1,
                b'-' => -1,
                _ => return None,
            };
            let o = rest.get(1..)?;
            let ob = o.as_bytes();
            if o.len() != 5 || ob[2] != b':' {
                return None;
            }
            let oh: i64 = o.get(0..2)?.parse().ok()?;
            let om: i64 = o.get(3..5)?.parse().ok()?;
            if !o[0..2]
                .bytes()
                .chain(o[3..5].bytes())
                .all(|c| c.is_ascii_digit())
                || oh > 23
                || om > 59
            {
                return None;
            }
            sign * (oh * 3600 + om * 60)
        }
    };
    let secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - offset_s;
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

/// The wall clock now, Unix seconds.
pub fn now_secs() -> i64 {
    now_unix_nanos() / 1_000_000_000
}

/// The wall clock now, Unix ns (0 before 1970).
pub fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        // 2026-11-29T19:39:42Z, a Sunday (from an nsqd capture's Date header).
        let t = 1795981182;
        assert_eq!(http_date(t), "Sun, 29 Nov 2026 19:39:42 GMT");
        assert_eq!(rfc3339(t - 1), "2026-11-29T19:39:41Z");
        assert_eq!(
            log_stamp(t * 1_000_000_000 + 709417000),
            "2026/11/29 19:39:42.709417"
        );
    }

    #[test]
    fn parses_times() {
        let t = 1795981182i64;
        let ns = |s: i64| s * 1_000_000_000;
        assert_eq!(parse_time_ns("1795981182"), Some(ns(t)));
        assert_eq!(parse_time_ns("1795981182.25"), Some(ns(t) + 250_000_000));
        assert_eq!(parse_time_ns("0"), Some(0));
        assert_eq!(parse_time_ns("2026-11-29T19:39:42Z"), Some(ns(t)));
        assert_eq!(parse_time_ns("2026-11-29t19:39:42z"), Some(ns(t)));
        assert_eq!(
            parse_time_ns("2026-11-29T20:39:42.5+01:00"),
            Some(ns(t) + 500_000_000)
        );
        assert_eq!(parse_time_ns("2026-11-29T20:39:42 01:00"), Some(ns(t)));
        assert_eq!(parse_time_ns("2026-11-29T18:39:42-01:00"), Some(ns(t)));
        assert_eq!(parse_time_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time_ns("2024-02-29T00:00:00Z"), Some(ns(1709164800)));
        for bad in [
            "",
            "abc",
            "-1",
            "1.",
            ".5",
            "1.1234567891",
            "1e9",
            " 1",
            "99999999999999999999",
            "2026-11-29",
            "2026-11-29T19:39:42",
            "2026-11-29 19:39:42Z",
            "2026-13-29T19:39:42Z",
            "2023-02-29T19:39:42Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T19:39:60Z",
            "2026-11-29T19:39:42+1:00",
            "2026-11-29T19:39:42.Z",
            "2026-11-29T19:39:42Zjunk",
            "3000-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_time_ns(bad), None, "{bad:?}");
        }
    }
}
