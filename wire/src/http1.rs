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

/// The longest request head served, in bytes (request line, headers and the blank line):
/// Go's http.Server reads a head through a limit of `DefaultMaxHeaderBytes` (1 MiB) plus
/// 4096 (server.go initialReadLimitSize); a head that does not end within it is answered
/// [`HeadError::TooLarge`] (431) and the connection closed. nsqd and nsqlookupd use it.
pub const MAX_HEAD: usize = (1 << 20) + 4096;

/// What net/http reads and drops of a request body its handler left unread, so the
/// connection can be reused (Go: maxPostHandlerReadBytes, 256 KiB). A longer one (a
/// Content-Length of this much or more, a chunked body over it) is answered with
/// `Connection: close` and left unread.
pub const MAX_POST_HANDLER_READ: u64 = 256 << 10;

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
        417 => "Expectation Failed",
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

/// net/http buffers this much of a response body before it gives up on Content-Length
/// and chunks (bufferBeforeChunkingSize).
pub const CHUNKING_THRESHOLD: usize = 2048;

/// How a request asked for its response to be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// A HEAD request: headers only.
    pub head: bool,
    /// HTTP/1.1 (else HTTP/1.0).
    pub http11: bool,
    /// The connection closes after this response.
    pub close: bool,
    /// An HTTP/1.0 request that asked for `Connection: keep-alive`.
    pub keep_alive_10: bool,
}

/// Frames a response as Go's net/http does for a handler that set `headers` (written
/// sorted, as Go writes them) and wrote `body` in one piece (chunkWriter.writeHeader, the
/// server nsqd and nsqlookupd both answer with): status line, the handler's headers,
/// `Date`; then `Content-Length` unless the handler set it, or for a body over
/// [`CHUNKING_THRESHOLD`] `Transfer-Encoding: chunked` (HTTP/1.1) or no length and a
/// close (HTTP/1.0); a HEAD answer has no body, and no length when it has none or a big
/// one; the `sniffed_type` (Go's DetectContentType) when the handler set no
/// Content-Type and the body is not empty; `Connection: close` on HTTP/1.1 when the
/// connection closes (unless the handler set it), `Connection: keep-alive` on HTTP/1.0
/// when it stays open. Returns the bytes and whether the connection must close.
pub fn encode_response(
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
    sniffed_type: Option<&str>,
    f: &Framing,
) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(256 + body.len());
    write_status_line(&mut out, f.http11, status);
    for (k, v) in headers {
        write_header(&mut out, k, v);
    }
    write_date(&mut out, timefmt::now_secs());
    let big = body.len() > CHUNKING_THRESHOLD;
    let mut close = f.close;
    let mut chunked = false;
    let has = |name: &str| headers.iter().any(|(k, _)| *k == name);
    if !big {
        let head_without_body = f.head && body.is_empty();
        if !head_without_body && !has("Content-Length") {
            out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
    } else if !f.head {
        if f.http11 {
            chunked = true;
        } else {
            // HTTP/1.0 cannot chunk: the body runs until the connection closes.
            close = true;
        }
    }
    if !has("Content-Type") && !body.is_empty() {
        if let Some(t) = sniffed_type {
            out.extend_from_slice(format!("Content-Type: {t}\r\n").as_bytes());
        }
    }
    let handler_closes = headers
        .iter()
        .any(|(k, v)| *k == "Connection" && v.eq_ignore_ascii_case("close"));
    if close && f.http11 && !handler_closes {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if !close && f.keep_alive_10 && !f.http11 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    if chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !f.head {
        if chunked {
            out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
            out.extend_from_slice(b"\r\n0\r\n\r\n");
        } else {
            out.extend_from_slice(body);
        }
    }
    (out, close)
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

/// Go's url.QueryUnescape: `+` is a space, `%XX` a byte (two hex digits, else an
/// error). Go keeps the bytes as they are; bytes that are not UTF-8 become U+FFFD here,
/// which no topic, channel or option name accepts either.
pub fn unescape_query(s: &str) -> Result<String, BadQuery> {
    percent_decode(s.as_bytes(), true)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .ok_or(BadQuery)
}

/// Percent-decodes a URL path (Go's url.PathUnescape: `+` stays `+`); `None` on a bad
/// escape. Bytes that are not UTF-8 become U+FFFD.
pub fn unescape_path(s: &str) -> Option<String> {
    percent_decode(s.as_bytes(), false).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Go's url.unescape: `%` and two hex digits is a byte (anything else after `%` is an
/// error); `+` is a space in a query (`plus_is_space`).
fn percent_decode(b: &[u8], plus_is_space: bool) -> Option<Vec<u8>> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hi = hex(*b.get(i + 1)?)?;
                let lo = hex(*b.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
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
        // Go keeps bytes that are not UTF-8 (U+FFFD here); an escape needs two hex
        // digits (Rust's from_str_radix would take "+f").
        assert_eq!(
            parse_query("a=%ff"),
            Ok(vec![("a".into(), "\u{fffd}".into())])
        );
        assert_eq!(parse_query("a=%+f"), Err(BadQuery));
        assert_eq!(unescape_path("/%-1"), None);
        assert_eq!(Params(q).get("x"), Some("1 2"));
    }

    #[test]
    fn request_targets_as_go_s_parse_request_uri() {
        let t = |m: &str, raw: &[u8]| {
            RequestTarget::parse(m, raw).map(|t| (t.path, t.query.unwrap_or_default()))
        };
        let ok = |p: &str, q: &str| Some((p.to_string(), q.to_string()));
        assert_eq!(t("GET", b"/ping?a=1"), ok("/ping", "a=1"));
        assert_eq!(t("GET", b"*"), ok("*", ""));
        assert_eq!(t("GET", b"http://h/ping?x"), ok("/ping", "x"));
        assert_eq!(t("GET", b"HTTP://h"), ok("", ""));
        assert_eq!(t("GET", b"http:ping"), ok("", ""));
        assert_eq!(t("GET", b"/a\xe9"), ok("/a\u{fffd}", ""));
        assert_eq!(t("CONNECT", b"h:80"), ok("", ""));
        for bad in [
            &b""[..],
            b"x/ping",
            b":x",
            b"/p\x01",
            b"/p?\t",
            b"/p\x7f",
            b"/%zz",
        ] {
            assert_eq!(t("GET", bad), None, "{bad:?}");
        }
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
    /// `Expect: 100-continue` (a token of an `Expect` header).
    pub expect_continue: bool,
    /// An `Expect` header without `100-continue` (net/http answers 417).
    pub expect_unknown: bool,
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

/// Parses a request head from the start of `buf`. `Ok(None)`: incomplete (read more, up
/// to the server's head limit, then answer [`HeadError::TooLarge`]). The rules are
/// those of Go 1.19's net/http (nsqd 1.3.0's), in its order:
/// * request line (`http.readRequest`): `METHOD SP URI SP PROTO`, cut at the first two
///   spaces; a missing part, a method that is not a token or a version that is not
///   `HTTP/d.d` is a plain 400; lines end in LF with an optional CR before it;
/// * header lines (`textproto.ReadMIMEHeader`): a line without `:` or a first line that
///   starts with a space is a plain 400; a line starting with a space or tab continues
///   the previous one (obsolete folding, joined with one space); an empty name is
///   skipped; more than one `Host` is a plain 400;
/// * body framing (`readTransfer`): on HTTP/1.0 `Transfer-Encoding` is ignored; on
///   HTTP/1.1 more than one is a plain 400 and anything but `chunked` 501; `chunked`
///   wins over `Content-Length`; `Content-Length`s must agree (compared trimmed) and be
///   digits only (an empty one means none), else a plain 400;
/// * server checks (`conn.readRequest`): a major version other than 1 is 505 (not
///   `PRI * HTTP/2.0`, served as HTTP/1 and, without headers, closed after); HTTP/1.1
///   without `Host` is `400 Bad Request: missing required Host header`; a `Host` with
///   bytes Go refuses is `... malformed Host header`; a header name that is not a token
///   is `... invalid header name`, a value with a control byte other than tab
///   `... invalid header value`.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    const BAD: HeadError = HeadError::Bad("400 Bad Request");
    // The head: lines up to the first empty one.
    let mut lines: Vec<&[u8]> = Vec::new();
    let mut pos = 0;
    let head_len = loop {
        let Some(nl) = buf[pos..].iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let mut line = &buf[pos..pos + nl];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        pos += nl + 1;
        if line.is_empty() {
            if lines.is_empty() {
                // An empty request line is malformed for Go (its server only drops up
                // to 4 CR/LF bytes after a POST: [`PostCrlf`]).
                return Err(BAD);
            }
            break pos;
        }
        lines.push(line);
    };
    let request_line = lines[0];
    let sp = |b: &[u8]| b.iter().position(|&c| c == b' ');
    let sp1 = sp(request_line).ok_or(BAD)?;
    let (method, rest) = (&request_line[..sp1], &request_line[sp1 + 1..]);
    let sp2 = sp(rest).ok_or(BAD)?;
    let (target, proto) = (&rest[..sp2], &rest[sp2 + 1..]);
    if method.is_empty() || !method.iter().all(|&b| is_token_byte(b)) {
        return Err(BAD);
    }
    // A token is ASCII.
    let method = String::from_utf8_lossy(method).into_owned();
    let proto = std::str::from_utf8(proto).map_err(|_| BAD)?;
    let (major, minor) = parse_http_version(proto).ok_or(BAD)?;
    let target = RequestTarget::parse(&method, target).ok_or(BAD)?;
    // Header fields, with obsolete line folding joined.
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for (i, line) in lines[1..].iter().enumerate() {
        if line[0] == b' ' || line[0] == b'\t' {
            if i == 0 {
                return Err(BAD);
            }
            if let Some(last) = fields.last_mut() {
                let more = trim_ows(line);
                if !more.is_empty() {
                    if !last.1.is_empty() {
                        last.1.push(b' ');
                    }
                    last.1.extend_from_slice(more);
                }
            }
            continue;
        }
        let colon = line.iter().position(|&b| b == b':').ok_or(BAD)?;
        let name = &line[..colon];
        if name.is_empty() {
            continue;
        }
        fields.push((name.to_vec(), trim_ows(&line[colon + 1..]).to_vec()));
    }
    let named = |n: &'static str| {
        fields
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(n.as_bytes()))
            .map(|(_, v)| v.as_slice())
    };
    let hosts: Vec<&[u8]> = named("host").collect();
    if hosts.len() > 1 {
        return Err(BAD);
    }
    // `PRI * HTTP/2.0` (an HTTP/2 preface) is served as HTTP/1 (http1ServerSupportsRequest);
    // without headers (isH2Upgrade) it needs no Host and closes after its answer.
    let pri = method == "PRI" && target.raw_path == "*" && (major, minor) == (2, 0);
    let h2_preface = pri && fields.is_empty();
    // readTransfer.
    let http11 = (major, minor) >= (1, 1);
    let mut chunked = false;
    let tes: Vec<&[u8]> = named("transfer-encoding").collect();
    if http11 && !tes.is_empty() {
        // Go 1.19: more than one is "too many transfer encodings", answered as an
        // unsupported one (501).
        if tes.len() > 1 {
            return Err(HeadError::Unsupported);
        }
        if !tes[0].eq_ignore_ascii_case(b"chunked") {
            return Err(HeadError::Unsupported);
        }
        chunked = true;
    }
    let mut content_length = None;
    let lens: Vec<&[u8]> = named("content-length").collect();
    if let Some(first) = lens.first() {
        if lens.iter().any(|l| l != first) {
            return Err(BAD);
        }
        if !first.is_empty() && !chunked {
            if first.len() > 19 || !first.iter().all(u8::is_ascii_digit) {
                return Err(BAD);
            }
            let n: u64 = std::str::from_utf8(first)
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n| n <= i64::MAX as u64)
                .ok_or(BAD)?;
            content_length = Some(n);
        }
    }
    // The server's own checks.
    if major != 1 && !pri {
        return Err(HeadError::Version);
    }
    if http11 && hosts.is_empty() && !h2_preface {
        return Err(HeadError::Bad(
            "400 Bad Request: missing required Host header",
        ));
    }
    if hosts
        .first()
        .is_some_and(|h| !h.iter().all(|&b| valid_host_byte(b)))
    {
        return Err(HeadError::Bad("400 Bad Request: malformed Host header"));
    }
    for (k, v) in &fields {
        if !k.iter().copied().all(is_token_byte) {
            return Err(HeadError::Bad("400 Bad Request: invalid header name"));
        }
        if v.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(HeadError::Bad("400 Bad Request: invalid header value"));
        }
    }
    let (mut conn_close, mut conn_keep_alive, mut expect_continue) = (false, false, false);
    for v in named("connection") {
        for tok in v.split(|&b| b == b',') {
            let tok = trim_ows(tok);
            conn_close |= tok.eq_ignore_ascii_case(b"close");
            conn_keep_alive |= tok.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    conn_close |= h2_preface;
    let mut expect_other = false;
    for v in named("expect") {
        for tok in v.split(|&b| b == b',') {
            if trim_ows(tok).eq_ignore_ascii_case(b"100-continue") {
                expect_continue = true;
            }
        }
        expect_other |= !v.is_empty();
    }
    Ok(Some(RequestHead {
        method,
        raw_path: target.raw_path,
        path: target.path,
        query: target.query,
        http11,
        conn_close,
        conn_keep_alive,
        content_length,
        chunked,
        expect_continue,
        expect_unknown: expect_other && !expect_continue,
        head_len,
    }))
}

/// The CR/LF bytes Go's server drops before the next request head: up to 4 after a POST
/// (conn.readRequest: "RFC 7230 section 3 tolerance for old buggy clients"). Call
/// [`PostCrlf::drop_from`] before each parse attempt and [`PostCrlf::after`] once a
/// request was read.
#[derive(Default, Debug, Clone, Copy)]
pub struct PostCrlf(usize);

impl PostCrlf {
    /// The CR/LF bytes to drop from the start of `buf` now (the rest of the allowance
    /// stays for bytes not arrived yet; a byte that is not CR/LF ends it).
    pub fn drop_from(&mut self, buf: &[u8]) -> usize {
        let k = buf
            .iter()
            .take(self.0)
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        self.0 = if buf.len() > k { 0 } else { self.0 - k };
        k
    }

    /// After a request with `method`: 4 after a POST, else none.
    pub fn after(&mut self, method: &str) {
        self.0 = if method == "POST" { 4 } else { 0 };
    }
}

/// A request target as Go's url.ParseRequestURI reads it (http.readRequest).
struct RequestTarget {
    raw_path: String,
    path: String,
    query: Option<String>,
}

impl RequestTarget {
    /// `None` where Go answers a plain 400: an empty target, a control byte (below 0x20
    /// or 0x7f), a `:` first, a target that is neither `*`, nor a path, nor has a
    /// scheme (`x/ping`), a bad `%` escape in the path. Bytes that are not UTF-8 are
    /// kept as Go keeps them (U+FFFD here once unescaped). An absolute-form target
    /// (`http://host/path`) routes on its path; one with a scheme and no `/` after it is
    /// opaque (an empty path, as Go's).
    fn parse(method: &str, target: &[u8]) -> Option<RequestTarget> {
        let owned: Vec<u8>;
        let mut t = target;
        // CONNECT may name just an authority (Go prefixes "http://").
        if method == "CONNECT" && !t.starts_with(b"/") {
            owned = [&b"http://"[..], t].concat();
            t = &owned;
        }
        if t.is_empty() || t.iter().any(|&b| b < 0x20 || b == 0x7f) {
            return None;
        }
        if t == b"*" {
            return Some(RequestTarget {
                raw_path: "*".into(),
                path: "*".into(),
                query: None,
            });
        }
        // getScheme: letters, then letters, digits, `+`, `-`, `.`, up to a `:`.
        let mut scheme = false;
        for (i, &c) in t.iter().enumerate() {
            match c {
                b'a'..=b'z' | b'A'..=b'Z' => {}
                b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
                b':' if i == 0 => return None,
                b':' => {
                    scheme = true;
                    t = &t[i + 1..];
                    break;
                }
                _ => break,
            }
        }
        let (mut rest, query) = match t.iter().position(|&b| b == b'?') {
            Some(q) => (
                &t[..q],
                Some(String::from_utf8_lossy(&t[q + 1..]).into_owned()),
            ),
            None => (t, None),
        };
        if !rest.starts_with(b"/") {
            if !scheme {
                return None;
            }
            rest = b"";
        } else if scheme && rest.starts_with(b"//") {
            let authority = &rest[2..];
            rest = authority
                .iter()
                .position(|&b| b == b'/')
                .map_or(&b""[..], |j| &authority[j..]);
        }
        let raw_path = String::from_utf8_lossy(rest).into_owned();
        let path = unescape_path(&raw_path)?;
        Some(RequestTarget {
            raw_path,
            path,
            query,
        })
    }
}

/// httprouter's CleanPath (nsqd's and nsqlookupd's router): resolves `.`, `..` and
/// doubled slashes, adds a leading slash, keeps a trailing one.
pub fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let mut out = format!("/{}", parts.join("/"));
    let trailing = p.ends_with('/') || p.ends_with("/.") || p.ends_with("/..");
    if trailing && out != "/" {
        out.push('/');
    }
    out
}

/// Go 1.19's `ParseHTTPVersion`: `HTTP/1.1`, `HTTP/1.0`, or `HTTP/` digit `.` digit.
fn parse_http_version(v: &str) -> Option<(u8, u8)> {
    match v {
        "HTTP/1.1" => return Some((1, 1)),
        "HTTP/1.0" => return Some((1, 0)),
        _ => {}
    }
    let b = v.as_bytes();
    if b.len() != 8 || !v.starts_with("HTTP/") || b[6] != b'.' {
        return None;
    }
    let (maj, min) = (b[5], b[7]);
    (maj.is_ascii_digit() && min.is_ascii_digit()).then(|| (maj - b'0', min - b'0'))
}

/// An RFC 7230 token byte (httpguts.IsTokenRune).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte Go's httpguts.ValidHostHeader accepts.
fn valid_host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!$&'()*+,-.:;=[]_~%@".contains(&b) || b >= 0x80
}

/// Trims spaces and tabs at both ends (textproto.TrimBytes).
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
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
