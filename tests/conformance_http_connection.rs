//! HTTP/1.1 connection handling as Go's net/http does it: keep-alive, `Connection:
//! close`, HTTP/1.0, chunked request bodies, OPTIONS and HEAD. NSQ_REFERENCE.md §7 "HTTP".

mod common;

use common::*;
use std::time::Duration;

// ----------------------------------------------------------------------------------------
// HTTP/1.1 connection handling (Go net/http behaviour)
// ----------------------------------------------------------------------------------------

/// Sends raw request bytes and reads until the server closes or 1.5 s of silence.
fn raw_exchange(b: &Broker, req: &[u8]) -> (Vec<u8>, bool) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(b.http).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
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
