//! HTTP API: /ping and /info, the router's errors (unknown path, wrong method) and query
//! strings Go's url.ParseQuery rejects, compared byte for byte (Date header excluded) with
//! the nsqd 1.3.0 captures where one exists. NSQ_REFERENCE.md §3 and §7 "HTTP".
//!
//! Requests that are compared with a capture are sent keep-alive (no `Connection: close`),
//! as the capturing client did; Go's net/http adds `Connection: close` to every response
//! of a request that asked for it, so those would differ from the captures.

use crate::common;

use common::*;

// ----------------------------------------------------------------------------------------
// /ping, /info, router errors
// ----------------------------------------------------------------------------------------

#[test]
fn ping_matches_capture() {
    let b = Broker::start(1, &[]);
    let raw = b.http_keepalive("GET", "/ping", b"");
    // nsqd_ping.http: PlainText, no X-NSQ-Content-Type header.
    assert_http_exact(
        &raw,
        "HTTP/1.1 200 OK",
        &[
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
        ],
        b"OK",
    );
}

#[test]
fn info_matches_capture_layout() {
    let b = Broker::start(1, &[]);
    let raw = b.http_keepalive("GET", "/info", b"");
    let body = body_str(&raw);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let st = v["start_time"].as_i64().expect("start_time");
    assert!((st - now_s()).abs() <= 30, "start_time {st}");
    let h = hostname();
    let want = format!(
        r#"{{"version":"1.3.0","broadcast_address":"{h}","hostname":"{h}","http_port":{},"tcp_port":{},"start_time":{st},"max_heartbeat_interval":60000000000,"max_output_buffer_size":65536,"max_output_buffer_timeout":30000000000,"max_deflate_level":6}}"#,
        b.http.port(),
        b.tcp.port()
    );
    let hs = v1_json_headers(want.len());
    let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
    assert_http_exact(&raw, "HTTP/1.1 200 OK", &hs, want.as_bytes());
    // The same start_time as /stats.
    let stats = b.stats();
    assert_eq!(stats["start_time"], st);
}

#[test]
fn info_reflects_flags() {
    let b = Broker::start(
        1,
        &[
            "--max-heartbeat-interval=10s",
            "--max-output-buffer-size=100000",
            "--max-output-buffer-timeout=5s",
        ],
    );
    let (code, body) = b.http("GET", "/info", b"");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["max_heartbeat_interval"], 10_000_000_000i64,
        "nanoseconds"
    );
    assert_eq!(v["max_output_buffer_size"], 100000);
    assert_eq!(
        v["max_output_buffer_timeout"], 5_000_000_000i64,
        "nanoseconds"
    );
}

#[test]
fn unknown_path_matches_capture() {
    let b = Broker::start(1, &[]);
    // err_not_found_path.http
    assert_v1_error(
        &b.http_keepalive("GET", "/nope", b""),
        "HTTP/1.1 404 Not Found",
        "NOT_FOUND",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/topic/nope?topic=x", b""),
        "HTTP/1.1 404 Not Found",
        "NOT_FOUND",
    );
}

#[test]
fn wrong_method_matches_capture() {
    let b = Broker::start(1, &[]);
    // err_pub_get_method.http
    let raw = b.http_keepalive("GET", "/pub?topic=t", b"");
    assert_http_exact(
        &raw,
        "HTTP/1.1 405 Method Not Allowed",
        &[
            "Allow: OPTIONS, POST",
            "Content-Type: application/json; charset=utf-8",
            "X-Nsq-Content-Type: nsq; version=1.0",
            "Content-Length: 32",
        ],
        br#"{"message":"METHOD_NOT_ALLOWED"}"#,
    );
    assert!(
        b.topic_stats("t").is_none(),
        "a refused request must not create the topic"
    );
    // The other direction: POST on a GET-only endpoint.
    for (m, p) in [
        ("POST", "/stats"),
        ("POST", "/ping"),
        ("POST", "/info"),
        ("GET", "/mpub?topic=t"),
        ("GET", "/topic/create?topic=t"),
    ] {
        let (code, body) = b.http(m, p, b"");
        assert_eq!(
            (code, show(&body)),
            (405, r#"{"message":"METHOD_NOT_ALLOWED"}"#.to_string()),
            "{m} {p}"
        );
    }
}

#[test]
fn bad_query_strings() {
    let b = Broker::start(1, &[]);
    // url.ParseQuery errors: bad escapes and (Go >= 1.17) semicolons.
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=%zz", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t&x=%zz", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t;x=1", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/mpub?topic=%zz", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/topic/create?topic=%zz", b""),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/channel/create?topic=%zz&channel=c", b""),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert_v1_error(
        &b.http_keepalive("GET", "/stats?topic=%zz", b""),
        "HTTP/1.1 400 Bad Request",
        "INVALID_REQUEST",
    );
    assert!(b.stats()["topics"].as_array().unwrap().is_empty());
    // '+' decodes to a space, which is not a valid name character.
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=a+b", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    // The first of repeated parameters wins.
    let (code, _) = b.http("POST", "/pub?topic=first&topic=second", b"x");
    assert_eq!(code, 200);
    assert!(b.topic_stats("first").is_some());
    assert!(b.topic_stats("second").is_none());
}
