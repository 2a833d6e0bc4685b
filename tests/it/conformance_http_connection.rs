//! HTTP/1.1 connection handling as Go's net/http does it: keep-alive, `Connection:
//! close`, HTTP/1.0, chunked request bodies, OPTIONS and HEAD. NSQ_REFERENCE.md §7 "HTTP".
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::time::Duration;

// ----------------------------------------------------------------------------------------
// HTTP/1.1 connection handling (Go net/http behaviour)
// ----------------------------------------------------------------------------------------

/// Sends raw request bytes and reads until the server closes or 1.5 s of silence.
fn raw_exchange(b: &Broker, req: &[u8]) -> (Vec<u8>, bool) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(b.http).unwrap();
    // The first bytes may take a while on a loaded machine; after them, 1.5 s of quiet
    // on a connection kept alive means the answer is complete.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                s.set_read_timeout(Some(Duration::from_millis(1500)))
                    .unwrap();
            }
            Err(_) => return (out, false),
        }
    }
}

/// Splits a byte stream holding several Content-Length framed responses.
fn split_responses(mut raw: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&raw[..p]).to_ascii_lowercase();
        let len: usize = head
            .split("\r\n")
            .find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .expect("content-length");
        let end = (p + 4 + len).min(raw.len());
        out.push(raw[..end].to_vec());
        raw = &raw[end..];
    }
    out
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let b = Broker::start(1, &[]);
    let (raw, closed) = raw_exchange(
        &b,
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nPOST /pub?topic=ka HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert!(
        !closed,
        "a keep-alive connection must stay open: {}",
        show(&raw)
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 3, "{}", show(&raw));
    assert_http_exact(
        &rs[0],
        "HTTP/1.1 200 OK",
        &[
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
        ],
        b"OK",
    );
    assert_v1_text_ok(&rs[1]);
    assert_v1_error(&rs[2], "HTTP/1.1 404 Not Found", "NOT_FOUND");
    assert_eq!(b.topic_stats("ka").unwrap()["message_count"], 1);
}

#[test]
fn connection_close_request_gets_connection_close_header() {
    // net/http: a request with "Connection: close" is answered with "Connection: close"
    // (written after Date, Content-Length and a sniffed Content-Type), then the connection
    // is closed.
    let b = Broker::start(1, &[]);
    let (raw, closed) = raw_exchange(
        &b,
        b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(closed);
    assert_http_exact(
        &raw,
        "HTTP/1.1 200 OK",
        &[
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
            "Connection: close",
        ],
        b"OK",
    );
    let (raw, closed) = raw_exchange(
        &b,
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(closed);
    assert_http_exact(
        &raw,
        "HTTP/1.1 404 Not Found",
        &[
            "Content-Type: application/json; charset=utf-8",
            "X-Nsq-Content-Type: nsq; version=1.0",
            "Content-Length: 23",
            "Connection: close",
        ],
        br#"{"message":"NOT_FOUND"}"#,
    );
    let (raw, closed) = raw_exchange(
        &b,
        b"POST /topic/create?topic=cc HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(closed);
    assert_http_exact(
        &raw,
        "HTTP/1.1 200 OK",
        &[
            "X-Nsq-Content-Type: nsq; version=1.0",
            "Content-Length: 0",
            "Connection: close",
        ],
        b"",
    );
}

#[test]
fn http_1_0_request_gets_http_1_0_status_line_and_close() {
    let b = Broker::start(1, &[]);
    let (raw, closed) = raw_exchange(&b, b"GET /ping HTTP/1.0\r\n\r\n");
    assert!(closed, "HTTP/1.0 without keep-alive closes");
    assert_http_exact(
        &raw,
        "HTTP/1.0 200 OK",
        &[
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
        ],
        b"OK",
    );
}

#[test]
fn chunked_pub_body_is_accepted() {
    let b = Broker::start(1, &[]);
    let (raw, _) = raw_exchange(
        &b,
        b"POST /pub?topic=chunky HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    let rs = split_responses(&raw);
    assert_eq!(rs.len(), 1, "{}", show(&raw));
    assert_v1_text_ok(&rs[0]);
    let mut c = b.subscribe("chunky", "c");
    send(&mut c, b"RDY 1\n");
    assert_eq!(show(&read_msg(&mut c).body), "hello world");
}

#[test]
fn options_and_head() {
    // httprouter: OPTIONS answers 200 with Allow; HEAD has no route (405).
    let b = Broker::start(1, &[]);
    let (raw, _) = raw_exchange(&b, b"OPTIONS /pub HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_http_exact(
        &raw,
        "HTTP/1.1 200 OK",
        &["Allow: OPTIONS, POST", "Content-Length: 0"],
        b"",
    );
    let (raw, _) = raw_exchange(&b, b"OPTIONS /stats HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_http_exact(
        &raw,
        "HTTP/1.1 200 OK",
        &["Allow: GET, OPTIONS", "Content-Length: 0"],
        b"",
    );
    let (raw, _) = raw_exchange(&b, b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n");
    let head = headers_without_date(&raw);
    assert_eq!(head[0], "HTTP/1.1 405 Method Not Allowed", "{}", show(&raw));
    assert!(head.iter().any(|h| h == "Allow: GET, OPTIONS"), "{head:?}");
}

/// A HEAD request gets the headers only (Go's server drops a HEAD handler's body), so the
/// next response on a keep-alive connection starts right after them.
#[test]
fn head_requests_get_no_body() {
    let b = Broker::start(1, &[]);
    for path in ["/nope", "/ping", "/pub"] {
        let mut s = std::net::TcpStream::connect(b.http).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let req = format!(
            "HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        std::io::Write::write_all(&mut s, req.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut out);
        let end = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("HEAD response head")
            + 4;
        assert!(
            out[end..].starts_with(b"HTTP/1.1 200 OK\r\n"),
            "HEAD {path}: bytes after the head: {}",
            show(&out[end..])
        );
        assert!(out.ends_with(b"\r\n\r\nOK"), "{}", show(&out));
    }
}

/// A request body that ends in an error (malformed chunked framing, a chunk not followed
/// by CRLF, a 17-digit or signed chunk size, a space before `;ext`, EOF inside the body)
/// still gets nsqd's answer: 500 INTERNAL_ERROR from the handlers that read the body
/// (doPUB, doConfig PUT, doMPUB text), what the bytes before the error give in binary
/// /mpub (a complete batch publishes), the usual answer elsewhere; "Connection: close"
/// except for a Content-Length body the handler read to EOF. Expected bytes: nsqd 1.3.0
/// answering the same requests (client half-closed after sending; Date masked), and the
/// topics it left: t 1 (the trailing-space chunk size), t2 t3 t5 t6 0, t4 1.
#[test]
fn failed_request_bodies_answer_as_nsqd() {
    let cases: &[(&str, &[u8], &[u8])] = &[
        (
            "pub_bad_size",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_eof_in_chunk",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_plus_size",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_no_crlf_after_data",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_cl_eof",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_bad_query_bad_body",
            b"POST /pub?topic=%zz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "pub_bad_topic_eof",
            b"POST /pub?topic=a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "mpub_text_bad",
            b"POST /mpub?topic=t2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\na\nb\nc\n\r\nzz\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "mpub_text_eof",
            b"POST /mpub?topic=t3 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\na\nb\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "mpub_bin_complete_then_bad",
            b"POST /mpub?topic=t4&binary=true HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n\x00\x00\x00\x01\x00\x00\x00\x01z\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nOK",
        ),
        (
            "mpub_bin_short_bad",
            b"POST /mpub?topic=t5&binary=true HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n\x00\x00\x00\x02\x00\x00\r\nzz\r\n",
            b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\nConnection: close\r\n\r\n{\"message\":\"BAD_MESSAGE\"}",
        ),
        (
            "mpub_bad_topic_bad_body",
            b"POST /mpub?topic=a/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 27\r\nConnection: close\r\n\r\n{\"message\":\"INVALID_TOPIC\"}",
        ),
        (
            "ping_bad",
            b"GET /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nOK",
        ),
        (
            "config_bad",
            b"PUT /config/log_level HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ninfo\r\nzz\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "create_eof",
            b"POST /topic/create?topic=t6 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        ),
        (
            "size_space_ext",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5 ;x=y\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        (
            "size_trailing_space",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5  \r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK",
        ),
        (
            "size_17_digits",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000005\r\nhello\r\n0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
    ];
    let b = Broker::start(1, &[]);
    for (name, req, want) in cases {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(b.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(req).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .unwrap_or_else(|e| panic!("{name}: no close after {}: {e}", show(&got)));
        let got = mask_date(&got);
        assert_eq!(show(&got), show(want), "{name}");
    }
    let depth = |t: &str| b.topic_stats(t).map(|s| s["depth"].as_u64().unwrap_or(99));
    for (t, d) in [
        ("t", 1),
        ("t2", 0),
        ("t3", 0),
        ("t4", 1),
        ("t5", 0),
        ("t6", 0),
    ] {
        assert_eq!(depth(t), Some(d), "topic {t}");
    }
}

/// `Date: <value>` -> `Date: X`.
fn mask_date(raw: &[u8]) -> Vec<u8> {
    // Every response's Date (pipelined requests get several).
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(p) = rest.windows(6).position(|w| w == b"Date: ") {
        let end = rest[p..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .map_or(rest.len(), |e| p + e);
        out.extend_from_slice(&rest[..p + 6]);
        out.push(b'X');
        rest = &rest[end..];
    }
    out.extend_from_slice(rest);
    out
}

/// A case: name, request head, body sent after a pause, nsqd 1.3.0's answer.
type HeadCase = (&'static str, &'static [u8], &'static [u8], &'static [u8]);

/// Request heads as Go 1.19's net/http and httprouter take them (nsqd 1.3.0), byte for
/// byte (Date masked): `Expect: 100-continue` (100 Continue once a handler reads the
/// body; a handler that does not gets `Connection: close`), other expectations (417),
/// `OPTIONS *`, request lines (a space in the path, HTTP/1.2 accepted, 0.9/2.0/3.0
/// refused with 505), header lines (no colon, obsolete folding, control bytes, names
/// that are not tokens, an empty name), two Host headers, Content-Length syntax (+1, -1,
/// empty, two that differ), Transfer-Encoding ignored on HTTP/1.0, and httprouter's
/// redirects (trailing slash, `//`, `..`, case; 301 with an HTML body for GET, 307 for
/// POST; HEAD has no routes), request targets (control bytes, relative, empty, opaque,
/// bytes that are not UTF-8, `%` escapes). Expected bytes: nsqd 1.3.0 answering the same
/// requests.
#[test]
fn request_heads_answer_as_net_http() {
    let cases: &[HeadCase] = &[
        ("expect_cont_pub", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n", b"ab", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("expect_cont_ping", b"GET /ping HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n", b"ab", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nOK"),
        ("expect_cont_toobig", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n", b"", b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\nConnection: close\r\n\r\n{\"message\":\"MSG_TOO_BIG\"}"),
        ("expect_cont_chunked", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n", b"2\r\nab\r\n0\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("expect_cont_http10", b"POST /pub?topic=t1 HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n", b"ab", b"HTTP/1.0 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("expect_other", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nContent-Length: 2\r\n\r\n", b"ab", b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: X\r\nContent-Length: 0\r\n\r\n"),
        ("options_star", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: X\r\n\r\n"),
        ("space_in_path", b"GET /pi ng HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("no_colon", b"GET /ping HTTP/1.1\r\nHost: x\r\nBadHeader\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("nul_value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: invalid header value\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header value"),
        ("folded", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  cont\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("cl_plus", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\na", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("cl_space", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length:  1 \r\n\r\na", b"", b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("cl_two_same", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", b"", b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("cl_two_diff", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("two_hosts", b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("chunked_http10", b"POST /pub?topic=t1 HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", b"", b"HTTP/1.0 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n{\"message\":\"MSG_EMPTY\"}"),
        ("dslash", b"GET //ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\nDate: X\r\nContent-Length: 40\r\n\r\n<a href=\"/ping\">Moved Permanently</a>.\n\n"),
        ("trailing_slash", b"GET /ping/ HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\nDate: X\r\nContent-Length: 40\r\n\r\n<a href=\"/ping\">Moved Permanently</a>.\n\n"),
        ("dotdot", b"GET /a/../ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\nDate: X\r\nContent-Length: 40\r\n\r\n<a href=\"/ping\">Moved Permanently</a>.\n\n"),
        ("upper", b"GET /PING HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\nDate: X\r\nContent-Length: 40\r\n\r\n<a href=\"/ping\">Moved Permanently</a>.\n\n"),
        ("post_slash", b"POST /pub/?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na", b"", b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /pub?topic=t1\r\nDate: X\r\nContent-Length: 0\r\n\r\n"),
        ("head_slash", b"HEAD /ping/ HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n"),
        ("stats_slash_q", b"GET /stats/?format=json HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /stats?format=json\r\nDate: X\r\nContent-Length: 53\r\n\r\n<a href=\"/stats?format=json\">Moved Permanently</a>.\n\n"),
        ("bad_name_space", b"GET /ping HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: invalid header name\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header name"),
        ("space_before_colon", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A : v\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: invalid header name\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header name"),
        ("v12", b"GET /ping HTTP/1.2\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("v09", b"GET /ping HTTP/0.9\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version"),
        ("v30", b"GET /ping HTTP/3.0\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version"),
        ("v2", b"GET /ping HTTP/2.0\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version"),
        ("double_space", b"GET  /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("no_proto", b"GET /ping\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("del_value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: invalid header value\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header value"),
        ("ctl_value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: invalid header value\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header value"),
        ("tab_value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\tb\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("high_value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\xffb\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("http10_te_gzip", b"POST /pub?topic=t1 HTTP/1.0\r\nTransfer-Encoding: gzip\r\nContent-Length: 1\r\n\r\na", b"", b"HTTP/1.0 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("fold_first", b"GET /ping HTTP/1.1\r\n X-A: 1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("fold_tab", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\tcont\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("fold_host", b"GET /ping HTTP/1.1\r\nHost:\r\n x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("empty_cl", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: \r\n\r\na", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n{\"message\":\"MSG_EMPTY\"}"),
        ("cl_neg", b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\na", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("lf_only", b"GET /ping HTTP/1.1\nHost: x\n\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("empty_host_ok", b"GET /ping HTTP/1.1\r\nHost:\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("colon_only", b"GET /ping HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        (
            "expect_upper",
            b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n",
            b"a",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK",
        ),
        (
            "expect_upper_eof",
            b"POST /pub?topic=t1 HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n",
            b"",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"message\":\"INTERNAL_ERROR\"}",
        ),
        ("options_star_http10", b"OPTIONS * HTTP/1.0\r\n\r\n", b"", b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\nDate: X\r\n\r\n"),
        ("get_star", b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, OPTIONS, POST, PUT\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 32\r\n\r\n{\"message\":\"METHOD_NOT_ALLOWED\"}"),
        // `PRI * HTTP/2.0` is served as HTTP/1 (a 405 from the router), no Host needed
        // without headers; other HTTP/2.0 requests are 505.
        ("h2_preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"", b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, OPTIONS, POST, PUT\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 32\r\nConnection: close\r\n\r\n{\"message\":\"METHOD_NOT_ALLOWED\"}"),
        ("h2_pri_with_header_no_host", b"PRI * HTTP/2.0\r\nX: y\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header"),
        // No empty line before a request line, but up to 4 CR/LF bytes after a POST;
        // two Transfer-Encoding lines are 501.
        ("crlf_before_request_line", b"\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("post_then_2_crlf_dropped", b"POST /topic/create?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("post_then_3_crlf", b"POST /topic/create?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n\r\n\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\n\r\nHTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("two_transfer_encodings", b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", b"", b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nUnsupported transfer encoding"),
        // Request targets as url.ParseRequestURI reads them, and query bytes that are not UTF-8.
        ("target_relative", b"GET x/ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_control_byte", b"GET /ping?x=\x01 HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_tab", b"GET /ping?x=\x09 HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_del", b"GET /ping\x7f HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_empty", b"GET  HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_colon_first", b"GET :x HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("target_not_utf8_query", b"GET /ping?x=\xe9 HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("target_not_utf8_path", b"GET /ping\xe9 HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n{\"message\":\"NOT_FOUND\"}"),
        ("target_opaque", b"GET http:ping HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n{\"message\":\"NOT_FOUND\"}"),
        ("target_absolute_no_path", b"GET http://h HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 23\r\n\r\n{\"message\":\"NOT_FOUND\"}"),
        ("target_bad_escape_sign", b"GET /pi%+6g HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"),
        ("query_not_utf8_topic", b"POST /topic/create?topic=%ff HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 27\r\n\r\n{\"message\":\"INVALID_TOPIC\"}"),
        ("query_not_utf8_other", b"GET /ping?x=%ff HTTP/1.1\r\nHost: x\r\n\r\n", b"", b"HTTP/1.1 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"),
        ("query_bad_escape_sign", b"POST /topic/create?topic=%+f HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"", b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 29\r\n\r\n{\"message\":\"INVALID_REQUEST\"}"),
    ];
    let b = Broker::start(1, &[]);
    for (name, head, body, want) in cases {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(b.http).unwrap();
        s.write_all(head).unwrap();
        let mut got = Vec::new();
        if !body.is_empty() {
            // What arrives before the body is sent (100 Continue, or the answer).
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            let _ = s.write_all(body);
        }
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        got.extend_from_slice(&rest);
        assert_eq!(show(&mask_date(&got)), show(want), "{name}");
    }
}

/// A body the handler does not read: net/http reads and drops up to 256 KiB of it
/// (maxPostHandlerReadBytes) and keeps the connection; a longer one (Content-Length of
/// 256 KiB or more, a chunked body over it) is answered with `Connection: close` and the
/// connection closes. Expected bytes: nsqd 1.3.0 answering the same requests, then
/// whether a `GET /ping` on the same connection was answered.
#[test]
fn unread_bodies_over_256_kib_close_as_net_http() {
    const CREATED: &[u8] =
        b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\n\r\n";
    const CREATED_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const PING_405_CLOSE: &[u8] = b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, OPTIONS\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 32\r\nConnection: close\r\n\r\n{\"message\":\"METHOD_NOT_ALLOWED\"}";
    let chunked = |total: usize| -> Vec<u8> {
        let mut out = Vec::new();
        let mut left = total;
        while left > 0 {
            let k = left.min(65536);
            out.extend_from_slice(format!("{k:x}\r\n").as_bytes());
            out.extend(std::iter::repeat_n(b'a', k));
            out.extend_from_slice(b"\r\n");
            left -= k;
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    };
    let create_cl = |n: usize| -> Vec<u8> {
        let mut r = format!(
            "POST /topic/create?topic=big HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n"
        )
        .into_bytes();
        r.extend(std::iter::repeat_n(b'a', n));
        r
    };
    let create_chunked = |n: usize| -> Vec<u8> {
        let mut r = b"POST /topic/create?topic=big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        r.extend(chunked(n));
        r
    };
    let mut ping_405 = b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n".to_vec();
    ping_405.extend(std::iter::repeat_n(b'a', 300_000));
    let cases: Vec<(&str, Vec<u8>, &[u8], bool)> = vec![
        ("cl_300000", create_cl(300_000), CREATED_CLOSE, false),
        ("cl_262144", create_cl(262_144), CREATED_CLOSE, false),
        ("cl_262143", create_cl(262_143), CREATED, true),
        ("chunked_262144", create_chunked(262_144), CREATED, true),
        (
            "chunked_262145",
            create_chunked(262_145),
            CREATED_CLOSE,
            false,
        ),
        ("ping_405_300000", ping_405, PING_405_CLOSE, false),
    ];
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &[]);
        for (name, req, want, kept) in &cases {
            answer_then_ping(&b, req, want, *kept, &format!("{shards} shards, {name}"));
        }
    });
}

/// A client that asks to close (`Connection: close`, HTTP/1.0 without keep-alive) and
/// sends a body the handler leaves unread: net/http reads no more of it (its discard is
/// skipped and its body's Close, told the connection closes, reads nothing) and closes
/// at once, so the kernel resets the connection; without the close request it sends FIN
/// (closeWriteAndWait). Measured on nsqd 1.3.0 (one write, read 300 ms later): the
/// answer, then a reset, with these requests.
#[test]
fn unread_bodies_of_clients_that_ask_to_close_are_reset_as_net_http() {
    const CREATED_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    const TOO_BIG: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\nConnection: close\r\n\r\n{\"message\":\"MSG_TOO_BIG\"}";
    let req = |head: &str, n: usize| -> Vec<u8> {
        let mut r = format!("{head}Content-Length: {n}\r\n\r\n").into_bytes();
        r.extend(std::iter::repeat_n(b'x', n));
        r
    };
    let cases: Vec<(&str, Vec<u8>, &[u8], &str)> = vec![
        (
            "create, 300,000 bytes, Connection: close",
            req(
                "POST /topic/create?topic=b2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
                300_000,
            ),
            CREATED_CLOSE,
            "reset",
        ),
        (
            "pub over --max-msg-size, Connection: close",
            req(
                "POST /pub?topic=h8 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n",
                1_048_586,
            ),
            TOO_BIG,
            "reset",
        ),
        (
            "create, 300,000 bytes, keep-alive",
            req(
                "POST /topic/create?topic=b2 HTTP/1.1\r\nHost: x\r\n",
                300_000,
            ),
            CREATED_CLOSE,
            "FIN",
        ),
    ];
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &[]);
        for (name, input, want, want_end) in &cases {
            use std::io::Write;
            let what = format!("{shards} shards, {name}");
            let mut s = std::net::TcpStream::connect(b.http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // A reset that arrives while the body is still being written is reported to
            // the write (the read after it then sees an end of file).
            let wrote = s.write_all(input);
            let reset_on_write = matches!(&wrote, Err(e) if matches!(e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe));
            std::thread::sleep(Duration::from_millis(300));
            let (got, end) = read_until_closed(&mut s, &what);
            let end = if reset_on_write { "reset" } else { end };
            assert_eq!(show(&mask_date(&got)), show(want), "{what}");
            assert_eq!(end, *want_end, "{what}");
        }
    });
}

/// Sends `req` on a new connection: its answer must be `want` (Date masked) with nothing
/// after it yet; then a `GET /ping` on the same connection is answered if `kept`, else
/// the broker has closed it.
fn answer_then_ping(b: &Broker, req: &[u8], want: &[u8], kept: bool, what: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(b.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    while mask_date(&got).len() < want.len() {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    assert_eq!(show(&mask_date(&got)), show(want), "{what}");
    let _ = s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut next = Vec::new();
    let _ = s.read_to_end(&mut next);
    assert_eq!(
        next.starts_with(b"HTTP/1.1 200 OK\r\n"),
        kept,
        "{what}: after the answer got {:?}",
        String::from_utf8_lossy(&next)
    );
}

/// A response body over 2 KiB is framed as Go's net/http frames a handler's body that
/// outgrew its 2 KiB buffer (nsqd 1.3.0, captured on `/stats?format=json` with 30
/// topics): HTTP/1.1 `Transfer-Encoding: chunked` (one chunk, then `0\r\n\r\n`) and no
/// Content-Length, the connection kept unless asked otherwise; HTTP/1.0 no length at all,
/// the body runs to the close (no `Connection: keep-alive` even when asked). Smaller
/// bodies keep Content-Length.
#[test]
fn bodies_over_2_kib_are_chunked_as_net_http() {
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &[]);
        for t in 0..30 {
            b.admin(&format!("/topic/create?topic=topic{t}"));
        }
        // HTTP/1.1, Connection: close.
        let (raw, closed) = raw_exchange(
            &b,
            b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(closed);
        let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(
            headers_without_date(&raw),
            [
                "HTTP/1.1 200 OK",
                "Content-Type: application/json; charset=utf-8",
                "X-Nsq-Content-Type: nsq; version=1.0",
                "Connection: close",
                "Transfer-Encoding: chunked",
            ]
        );
        let json = dechunk(&raw[head_end..]);
        assert!(json.len() > 2048, "{}", json.len());
        let mut one_chunk = format!("{:x}\r\n", json.len()).into_bytes();
        one_chunk.extend_from_slice(&json);
        one_chunk.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(&raw[head_end..], &one_chunk[..]);
        let v: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
        assert_eq!(v["topics"].as_array().map(|t| t.len()), Some(30));
        // HTTP/1.1 keep-alive: no Connection header, the next request on the same
        // connection is answered.
        let (raw, closed) = raw_exchange(
            &b,
            b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(closed);
        let text = String::from_utf8_lossy(&raw);
        let first_head = text.split("\r\n\r\n").next().unwrap();
        assert!(
            first_head.ends_with("\r\nTransfer-Encoding: chunked"),
            "{first_head}"
        );
        assert!(!first_head.contains("Connection:"), "{first_head}");
        assert!(text.contains("\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.ends_with("Connection: close\r\n\r\nOK"),
            "{}",
            &text[text.len() - 120..]
        );
        // HTTP/1.0 asking for keep-alive: no length, no keep-alive, closed after the body.
        let (raw, closed) = raw_exchange(
            &b,
            b"GET /stats?format=json HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        );
        assert!(closed, "the body runs to the close");
        assert_eq!(
            headers_without_date(&raw),
            [
                "HTTP/1.0 200 OK",
                "Content-Type: application/json; charset=utf-8",
                "X-Nsq-Content-Type: nsq; version=1.0",
            ]
        );
        let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let v: serde_json::Value = serde_json::from_slice(&raw[head_end..]).expect("JSON");
        assert_eq!(v["topics"].as_array().map(|t| t.len()), Some(30));
        // A small body keeps its length.
        let (raw, _) = raw_exchange(
            &b,
            b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(headers_without_date(&raw).contains(&"Content-Length: 2".to_string()));
    });
}

/// A request head is read through Go's limit, 1 MiB + 4096 bytes (net/http's
/// initialReadLimitSize; nsqd 1.3.0 measured: a head of 1,052,672 bytes is served, one of
/// 1,052,673 gets the 431): within it the request is served, past it net/http's 431
/// answer comes, then the end of the stream (FIN), and the connection is closed 500 ms
/// later (closeWriteAndWait), so a client still sending reads the answer, not a reset.
#[test]
fn request_heads_are_read_up_to_net_http_s_limit() {
    use std::io::{Read, Write};
    const LIMIT: usize = (1 << 20) + 4096;
    const TOO_LARGE: &str = "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large";
    // A GET /ping whose head is `len` bytes long, then `extra` bytes more.
    let request = |len: usize, extra: usize| -> Vec<u8> {
        let mut r = b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ".to_vec();
        r.extend(std::iter::repeat_n(b'a', len - r.len() - 4));
        r.extend_from_slice(b"\r\n\r\n");
        r.extend(std::iter::repeat_n(b'z', extra));
        r
    };
    let cases = [
        (100_000, 0, true),
        (LIMIT, 0, true),
        (LIMIT + 1, 0, false),
        (LIMIT + 1, 200_000, false),
        (LIMIT + 300_000, 0, false),
    ];
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &[]);
        for (len, extra, served) in cases {
            let mut s = std::net::TcpStream::connect(b.http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(&request(len, extra));
            // Read a moment later, as a client busy elsewhere would.
            std::thread::sleep(Duration::from_millis(50));
            let mut got = Vec::new();
            let end = s.read_to_end(&mut got);
            let got = String::from_utf8_lossy(&got);
            let case = format!("{shards} shards, head of {len} bytes and {extra} more");
            assert!(end.is_ok(), "{case}: {end:?} after {got:?}");
            if served {
                assert!(
                    got.starts_with("HTTP/1.1 200 OK\r\n") && got.ends_with("\r\n\r\nOK"),
                    "{case}: {got:?}"
                );
            } else {
                assert_eq!(got, TOO_LARGE, "{case}");
                // The broker shut its side only: for 500 ms more (Go's rstAvoidanceDelay)
                // what the client still sends is taken, not reset.
                assert!(s.write_all(b"more").is_ok(), "{case}: reset at once");
            }
        }
    });
}

/// A `/pub` body over `--max-msg-size` (nsqd answers 413 from its Content-Length without
/// reading it) is read and dropped by net/http when under 256 KiB, and the connection is
/// kept; one that ends early gets `Connection: close`; HTTP/1.0 keep-alive is kept too.
/// nsqd 1.3.0's bytes, with `--max-msg-size=100` (Dates masked).
#[test]
fn small_bodies_refused_by_size_keep_the_connection_as_net_http() {
    use std::io::{Read, Write};
    const TOO_BIG: &str = "413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\n";
    const BODY: &str = "\r\n{\"message\":\"MSG_TOO_BIG\"}";
    let ping = |v: &str| {
        format!("HTTP/{v} 200 OK\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK")
    };
    let a200 = "a".repeat(200);
    let cases: Vec<(&str, String, bool, String)> = vec![
        (
            "kept",
            format!("POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{a200}GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            false,
            format!(
                "HTTP/1.1 {TOO_BIG}{BODY}{}",
                ping("1.1").replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n")
            ),
        ),
        (
            "body ends early",
            format!("POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{}", &a200[..50]),
            true,
            format!("HTTP/1.1 {TOO_BIG}Connection: close\r\n{BODY}"),
        ),
        (
            "HTTP/1.0 keep-alive",
            format!("POST /pub?topic=t HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 200\r\n\r\n{a200}GET /ping HTTP/1.0\r\n\r\n"),
            false,
            format!("HTTP/1.0 {TOO_BIG}Connection: keep-alive\r\n{BODY}{}", ping("1.0")),
        ),
    ];
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &["--max-msg-size=100"]);
        for (name, req, shut, want) in &cases {
            let mut s = std::net::TcpStream::connect(b.http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            if *shut {
                s.shutdown(std::net::Shutdown::Write).unwrap();
            }
            // Each case ends with the broker's close.
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            let text = String::from_utf8_lossy(&got)
                .split("\r\n")
                .map(|l| {
                    if l.starts_with("Date: ") {
                        "Date: X"
                    } else {
                        l
                    }
                })
                .collect::<Vec<_>>()
                .join("\r\n");
            assert_eq!(text, *want, "{shards} shards, {name}");
        }
    });
}

/// What a handler leaves of a body is net/http's: nsqd's handlers read through a
/// LimitReader (`/pub` and `PUT /config` --max-msg-size + 1 bytes, text `/mpub`
/// --max-body-size + 1, read through a 4 KiB bufio; binary `/mpub` through its count),
/// then net/http reads and drops up to 256 KiB + 1 more: the connection is kept if the
/// body ended within them, closed (`Connection: close`) if not. A text `/mpub` line over
/// --max-msg-size is refused before the body's size. Expected bytes: nsqd 1.3.0 with
/// `--max-msg-size=100 --max-body-size=1000`, chunked bodies in 8 KiB chunks, then
/// whether a `GET /ping` on the same connection was answered.
#[test]
fn bodies_left_by_the_handler_follow_net_http_s_256_kib_rule() {
    const K: usize = 262_144;
    const MSG_TOO_BIG: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\n\r\n{\"message\":\"MSG_TOO_BIG\"}";
    const MSG_TOO_BIG_CLOSE: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 25\r\nConnection: close\r\n\r\n{\"message\":\"MSG_TOO_BIG\"}";
    const BODY_TOO_BIG: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 26\r\n\r\n{\"message\":\"BODY_TOO_BIG\"}";
    const BODY_TOO_BIG_CLOSE: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 26\r\nConnection: close\r\n\r\n{\"message\":\"BODY_TOO_BIG\"}";
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK";
    const OK_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nOK";
    const INVALID_VALUE: &[u8] = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: X\r\nContent-Length: 27\r\n\r\n{\"message\":\"INVALID_VALUE\"}";
    let chunked = |method: &str, path: &str, body: &[u8]| -> Vec<u8> {
        let mut out =
            format!("{method} {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .into_bytes();
        for c in body.chunks(8192) {
            out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    };
    let pub_ = |n: usize| chunked("POST", "/pub?topic=h", &vec![b'x'; n]);
    let text = |n: usize| {
        let b: Vec<u8> = b"123456789\n".iter().copied().cycle().take(n).collect();
        chunked("POST", "/mpub?topic=h", &b)
    };
    let big_line = |rest: usize| {
        let mut b = vec![b'y'; 200];
        b.push(b'\n');
        b.extend(std::iter::repeat_n(b'z', rest));
        chunked("POST", "/mpub?topic=h", &b)
    };
    // Two messages, "abc" and "de", then bytes readMPUB never reads.
    let binary = |trailing: usize| {
        let mut b = b"\x00\x00\x00\x02\x00\x00\x00\x03abc\x00\x00\x00\x02de".to_vec();
        b.extend(std::iter::repeat_n(b't', trailing));
        b
    };
    let mut binary_cl = format!(
        "POST /mpub?topic=h&binary=true HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        binary(10).len()
    )
    .into_bytes();
    binary_cl.extend(binary(10));
    let cases: Vec<(&str, Vec<u8>, &[u8], bool)> = vec![
        ("pub_limit_plus_256k", pub_(101 + K), MSG_TOO_BIG, true),
        (
            "pub_limit_plus_256k_1",
            pub_(101 + K + 1),
            MSG_TOO_BIG_CLOSE,
            false,
        ),
        ("mpub_limit_plus_256k", text(1001 + K), BODY_TOO_BIG, true),
        (
            "mpub_limit_plus_256k_1",
            text(1001 + K + 1),
            BODY_TOO_BIG_CLOSE,
            false,
        ),
        ("mpub_line_then_256k", big_line(K - 201), MSG_TOO_BIG, true),
        // The handler's bufio read 1,001 bytes (its limit), not just the line.
        (
            "mpub_line_then_256k_500",
            big_line(K + 500),
            MSG_TOO_BIG,
            true,
        ),
        (
            "mpub_line_then_256k_4k",
            big_line(K + 4096),
            MSG_TOO_BIG_CLOSE,
            false,
        ),
        (
            "mpub_line_before_body_limit",
            big_line(900),
            MSG_TOO_BIG,
            true,
        ),
        ("mpub_binary_trailing_cl", binary_cl, OK, true),
        (
            "mpub_binary_trailing_256k_1",
            chunked("POST", "/mpub?topic=h&binary=true", &binary(K + 1)),
            OK_CLOSE,
            false,
        ),
        (
            "config_over",
            chunked("PUT", "/config/log_level", &[b'i'; 102]),
            INVALID_VALUE,
            true,
        ),
    ];
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &["--max-msg-size=100", "--max-body-size=1000"]);
        for (name, req, want, kept) in &cases {
            answer_then_ping(&b, req, want, *kept, &format!("{shards} shards, {name}"));
        }
    });
}
