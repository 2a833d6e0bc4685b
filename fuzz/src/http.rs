//! Harnesses of the HTTP API's parsers: request heads, query strings and `/mpub` bodies.

use super::{check_range, limits, Knobs};

// ---------------------------------------------------------------- HTTP

/// The HTTP request head parser: a complete head lies within the input, parses the
/// same from exactly its own bytes, and its query goes through parse_query.
pub fn http_head(data: &[u8]) {
    if let Ok(Some(h)) = nsqd::http::parse_head(data) {
        assert!(h.head_len <= data.len());
        // The query is cut at the first `?`; the path holds one only from an escape
        // (`%3F`, as Go's URL.Path does).
        let escaped_q = data.windows(3).any(|w| w.eq_ignore_ascii_case(b"%3f"));
        assert!(!h.path.contains('?') || escaped_q);
        let again = nsqd::http::parse_head(&data[..h.head_len])
            .expect("own head refused")
            .expect("own head incomplete");
        assert_eq!(again.head_len, h.head_len);
        assert_eq!(again.query, h.query);
        let _ = nsqd::http::parse_query(&h.query);
    }
}

fn url_escape(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

/// Query-string parsing (Go's url.ParseQuery): what it accepts re-escapes to a query
/// that parses to the same pairs.
pub fn http_query(data: &[u8]) {
    let q = String::from_utf8_lossy(data);
    if let Ok(pairs) = nsqd::http::parse_query(&q) {
        let re: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{}={}", url_escape(k), url_escape(v)))
            .collect();
        let again = nsqd::http::parse_query(&re.join("&")).expect("re-escaped query refused");
        // Go drops pairs with an empty key only when the whole part is empty.
        assert_eq!(again, pairs, "query round trip differs");
    }
}

/// `/mpub` bodies, binary and text: every message non-empty, within the body and within
/// max-msg-size; text messages hold no newline; binary messages account for the body.
pub fn http_mpub(data: &[u8]) {
    let mut k = Knobs(data);
    let f = k.byte();
    let lim = limits(k.byte());
    let body = k.rest();
    let binary = f & 1 != 0;
    match nsqd::http::parse_mpub_body(body, binary, &lim) {
        Ok(ranges) => {
            let mut prev = 0;
            for r in &ranges {
                check_range(r, body.len());
                assert!(r.start >= prev);
                prev = r.end;
                assert!(!r.is_empty() && r.len() as i64 <= lim.max_msg_size);
                if !binary {
                    assert!(!body[r.clone()].contains(&b'\n'));
                }
            }
            if binary {
                assert!(!ranges.is_empty());
                let used: usize = 4 + ranges.iter().map(|r| r.len() + 4).sum::<usize>();
                assert!(used <= body.len());
            } else {
                assert!(body.len() as i64 <= lim.max_body_size);
            }
        }
        Err((status, text)) => {
            assert!(status == 413 || status == 500, "status {status}");
            assert!(!text.is_empty());
        }
    }
}
