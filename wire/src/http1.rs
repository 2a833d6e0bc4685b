//! The pure HTTP/1.1 pieces nsqd's and nsqlookupd's HTTP servers share (nsq:
//! internal/http_api, Go net/http and net/url): status lines and reason phrases, header
//! lines and the `Date` header, and the query string and path decoding of Go's net/url.
//! The accept and I/O loops, and request-head parsing (whose details differ between the
//! two servers, as between nsqd's and nsqlookupd's routers), stay in each server.
//!
//! ```text
//! response: HTTP/1.<0|1> <code> <reason>\r\n(<name>: <value>\r\n)*\r\n<body>
//! query:    k=v&k2=v2        `+` is a space, %XX escapes; `;` or a bad escape is an error
//! ```

use crate::{json, timefmt};

/// `Content-Type` of JSON responses.
pub const JSON: &str = "application/json; charset=utf-8";
/// `Content-Type` of text responses (Go's sniffed type for plain text).
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `Content-Type` of HTML responses.
pub const HTML: &str = "text/html; charset=utf-8";
/// The header nsq's V1 API responses carry (nsq: internal/http_api V1 decorator).
pub const NSQ_V1: (&str, &str) = ("X-Nsq-Content-Type", "nsq; version=1.0");

/// The body of a V1 API error, `{"message":"<text>"}` (nsq: internal/http_api
/// RespondV1), the text escaped as Go's encoding/json does.
pub fn v1_error_body(text: &str) -> Vec<u8> {
    let mut body = String::from("{\"message\":");
    json::push_str(&mut body, text);
    body.push('}');
    body.into_bytes()
}

/// Net/http's reason phrase for `code` ("Unknown" for a code neither server sends).
pub fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        301 => "Moved Permanently",
        307 => "Temporary Redirect",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Request Entity Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Appends the status line `HTTP/1.1 <code> <reason>\r\n` (`HTTP/1.0` when `http11` is
/// false) to `out`.
pub fn write_status_line(out: &mut Vec<u8>, http11: bool, code: u16) {
    let version = if http11 { "HTTP/1.1" } else { "HTTP/1.0" };
    out.extend_from_slice(format!("{version} {code} {}\r\n", status_text(code)).as_bytes());
}

/// Appends one header line `<name>: <value>\r\n` to `out`.
pub fn write_header(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
}

/// Appends the `Date` header for `unix_secs` (net/http's format:
/// `Date: Mon, 30 Nov 2026 10:00:00 GMT\r\n`) to `out`.
pub fn write_date(out: &mut Vec<u8>, unix_secs: i64) {
    write_header(out, "Date", &timefmt::http_date(unix_secs));
}

/// A query string Go's url.ParseQuery rejects (a bad `%` escape, a `;`, bad UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadQuery;

/// Go's url.ParseQuery: `&`-separated pairs in order, `+` is a space, `%XX` escapes; a
/// bad escape or a `;` is an error (nsqd and nsqlookupd answer 400 INVALID_REQUEST).
pub fn parse_query(q: &str) -> Result<Vec<(String, String)>, BadQuery> {
    let mut out = Vec::new();
    for part in q.split('&') {
        if part.is_empty() {
            continue;
        }
        if part.contains(';') {
            return Err(BadQuery);
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((unescape_query(k)?, unescape_query(v)?));
    }
    Ok(out)
}

/// Go's url.QueryUnescape: `+` is a space, `%XX` a byte; the result must be UTF-8.
pub fn unescape_query(s: &str) -> Result<String, BadQuery> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = b.get(i + 1..i + 3).ok_or(BadQuery)?;
                let hex = std::str::from_utf8(h).map_err(|_| BadQuery)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| BadQuery)?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| BadQuery)
}

/// Percent-decodes a URL path (Go's url.PathUnescape: `+` stays `+`); `None` on a bad
/// escape. Bytes that are not UTF-8 become U+FFFD.
pub fn unescape_path(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Query parameters in order (Go's url.Values as nsq reads them: the first value of a key
/// wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(pub Vec<(String, String)>);

impl Params {
    /// The first value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_like_go() {
        let q = parse_query("topic=a%2Eb&x=1+2&&flag").unwrap();
        assert_eq!(
            q,
            [
                ("topic".into(), "a.b".into()),
                ("x".into(), "1 2".into()),
                ("flag".into(), String::new())
            ]
        );
        assert_eq!(parse_query("a=%zz"), Err(BadQuery));
        assert_eq!(parse_query("a=1;b=2"), Err(BadQuery));
        assert_eq!(parse_query("a=%ff"), Err(BadQuery));
        assert_eq!(Params(q).get("x"), Some("1 2"));
    }

    #[test]
    fn v1_error() {
        assert_eq!(
            v1_error_body("TOPIC_NOT_FOUND"),
            br#"{"message":"TOPIC_NOT_FOUND"}"#
        );
    }

    #[test]
    fn path_keeps_plus() {
        assert_eq!(unescape_path("/a+b%2F").as_deref(), Some("/a+b/"));
        assert_eq!(unescape_path("/%4"), None);
    }

    #[test]
    fn status_lines() {
        let mut v = Vec::new();
        write_status_line(&mut v, true, 404);
        write_status_line(&mut v, false, 200);
        write_header(&mut v, "Content-Length", "0");
        assert_eq!(
            v,
            b"HTTP/1.1 404 Not Found\r\nHTTP/1.0 200 OK\r\nContent-Length: 0\r\n"
        );
    }
}
