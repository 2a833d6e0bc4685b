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

/// A parsed HTTP/1.x request head, with net/http's checks applied (Go's
/// `http.ReadRequest` and `readTransfer`, which nsqd and nsqlookupd both serve with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method as sent (`GET`, `POST`, ...).
    pub method: String,
    /// The path as sent (still escaped), for logs.
    pub raw_path: String,
    /// The unescaped path that routing uses (Go's `URL.Path`); an absolute-form target
    /// (`http://host/path`) routes on its path.
    pub path: String,
    /// The raw query; `None` when the target had no `?`.
    pub query: Option<String>,
    /// HTTP/1.1 (else HTTP/1.0).
    pub http11: bool,
    /// A `Connection` header held the token `close`.
    pub conn_close: bool,
    /// A `Connection` header held the token `keep-alive`.
    pub conn_keep_alive: bool,
    /// `Content-Length`, in bytes; `None` when absent or when the body is chunked.
    pub content_length: Option<u64>,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// The head's length in bytes, up to and including the empty line.
    pub head_len: usize,
}

impl RequestHead {
    /// Whether the connection stays open after the response, by the request alone
    /// (HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `keep-alive`).
    pub fn keep_alive(&self) -> bool {
        if self.http11 {
            !self.conn_close
        } else {
            self.conn_keep_alive && !self.conn_close
        }
    }
}

/// Why a request head was refused; [`HeadError::response`] gives net/http's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadError {
    /// Malformed: net/http's public error, `400 Bad Request` or `400 Bad Request: <why>`
    /// (its badRequestError), used as both the status line and the body.
    Bad(&'static str),
    /// A head longer than the server's limit (431).
    TooLarge,
    /// A `Transfer-Encoding` other than `chunked` (501).
    Unsupported,
    /// A protocol version other than HTTP/1.x (505, net/http's statusError).
    Version,
}

impl HeadError {
    /// The bytes net/http writes before closing (server.go `serve`): status line,
    /// plain-text type, `Connection: close` and the text (no Date, no Content-Length).
    pub fn response(self) -> Vec<u8> {
        const HEADERS: &str =
            "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n";
        let (status, text) = match self {
            HeadError::Bad(public) => (public, public),
            HeadError::TooLarge => (
                "431 Request Header Fields Too Large",
                "431 Request Header Fields Too Large",
            ),
            HeadError::Unsupported => ("501 Not Implemented", "Unsupported transfer encoding"),
            HeadError::Version => (
                "505 HTTP Version Not Supported: unsupported protocol version",
                "505 HTTP Version Not Supported: unsupported protocol version",
            ),
        };
        format!("HTTP/1.1 {status}{HEADERS}{text}").into_bytes()
    }
}

/// Header fields parsed on the stack; a request with more is parsed again with room for
/// [`MAX_HEADERS`] (net/http counts no fields, only the head's size).
const STACK_HEADERS: usize = 128;

/// The most header fields a request may carry (a head within the servers' 64 KiB limit
/// cannot hold more).
pub const MAX_HEADERS: usize = 16 * 1024;

/// Parses a request head from the start of `buf`. `Ok(None)`: incomplete (read more, up
/// to the server's head limit, then answer [`HeadError::TooLarge`]). Rules as net/http:
/// HTTP/1.1 needs `Host`; differing `Content-Length`s, an unparsable one or a transfer
/// coding other than `chunked` are refused; `chunked` wins over `Content-Length`.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; STACK_HEADERS];
    match parse_with(buf, &mut headers) {
        Err(HeadError::TooLarge) => {
            let mut many = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
            parse_with(buf, &mut many)
        }
        r => r,
    }
}

fn parse_with<'b>(
    buf: &'b [u8],
    headers: &mut [httparse::Header<'b>],
) -> Result<Option<RequestHead>, HeadError> {
    let mut req = httparse::Request::new(headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(HeadError::Version),
        Err(httparse::Error::HeaderName) => {
            return Err(HeadError::Bad("400 Bad Request: invalid header name"))
        }
        Err(_) => return Err(HeadError::Bad("400 Bad Request")),
    };
    let method = req.method.unwrap_or("").to_string();
    let target = req.path.unwrap_or("");
    let http11 = req.version == Some(1);
    let mut content_length: Option<u64> = None;
    let (mut chunked, mut conn_close, mut conn_keep_alive, mut host, mut expect_continue) =
        (false, false, false, false, false);
    for h in req.headers.iter() {
        let v = String::from_utf8_lossy(h.value);
        let v = v.trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: u64 = v.parse().map_err(|_| HeadError::Bad("400 Bad Request"))?;
            if content_length.is_some_and(|c| c != n) {
                return Err(HeadError::Bad("400 Bad Request"));
            }
            content_length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !v.eq_ignore_ascii_case("chunked") {
                return Err(HeadError::Unsupported);
            }
            chunked = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            for tok in v.split(',') {
                let tok = tok.trim();
                conn_close |= tok.eq_ignore_ascii_case("close");
                conn_keep_alive |= tok.eq_ignore_ascii_case("keep-alive");
            }
        } else if h.name.eq_ignore_ascii_case("host") {
            host = true;
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = v.eq_ignore_ascii_case("100-continue");
        }
    }
    if http11 && !host {
        return Err(HeadError::Bad(
            "400 Bad Request: missing required Host header",
        ));
    }
    if chunked {
        content_length = None;
    }
    let origin = match target.find("://") {
        Some(i) if !target.starts_with('/') => {
            let rest = &target[i + 3..];
            rest.find('/').map_or("/", |j| &rest[j..])
        }
        _ => target,
    };
    let (raw_path, query) = match origin.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (origin, None),
    };
    let path = unescape_path(raw_path).ok_or(HeadError::Bad("400 Bad Request"))?;
    Ok(Some(RequestHead {
        method,
        raw_path: raw_path.to_string(),
        path,
        query,
        http11,
        conn_close,
        conn_keep_alive,
        content_length,
        chunked,
        expect_continue,
        head_len,
    }))
}

#[cfg(test)]
mod head_tests {
    use super::*;

    #[test]
    fn parses_and_applies_net_http_rules() {
        let h = parse_request_head(b"POST /pub%2E?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: keep-alive, close\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!((h.method.as_str(), h.path.as_str()), ("POST", "/pub."));
        assert_eq!(h.raw_path, "/pub%2E");
        assert_eq!(h.query.as_deref(), Some("topic=t"));
        assert_eq!(
            (h.content_length, h.chunked, h.conn_close),
            (Some(5), false, true)
        );
        assert!(!h.keep_alive());
        assert_eq!(h.head_len, 92);
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\nHost: x\r\n"),
            Ok(None)
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\n\r\n"),
            Err(HeadError::Bad(
                "400 Bad Request: missing required Host header"
            ))
        );
        assert_eq!(
            parse_request_head(
                b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
            ),
            Err(HeadError::Bad("400 Bad Request"))
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(HeadError::Unsupported)
        );
        let h = parse_request_head(b"GET http://h:1/a?b HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.path.as_str(), h.http11, h.keep_alive()),
            ("/a", false, false)
        );
        // net/http counts no header fields: 1,000 are fine.
        let many: String = (0..1000).map(|i| format!("X-{i}: v\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n");
        assert!(parse_request_head(req.as_bytes()).unwrap().is_some());
        assert!(String::from_utf8(HeadError::TooLarge.response())
            .unwrap()
            .starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert_eq!(
            String::from_utf8(
                parse_request_head(b"GET / HTTP/1.1\r\n\r\n").unwrap_err().response()
            )
            .unwrap(),
            "HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header"
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/2.0\r\nHost: x\r\n\r\n"),
            Err(HeadError::Version)
        );
        assert_eq!(
            parse_request_head(b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n"),
            Err(HeadError::Bad("400 Bad Request: invalid header name"))
        );
    }
}
