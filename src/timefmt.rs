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

pub fn now_secs() -> i64 {
    nsq_shards::message::now_unix_nanos() / 1_000_000_000
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
}
