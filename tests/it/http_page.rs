//! The live shard page at `GET /` (beyond nsqd, which answers 404 there) and the
//! `topic_names` that `GET /shards` gives for it. Other unknown paths keep nsqd's 404.
//! The page itself is exercised in headless Chromium by scripts/page-test.sh.

use crate::common;
use common::*;

/// The response head as lines, without the status line and the Date header.
fn head_lines(raw: &[u8]) -> (String, Vec<String>) {
    let text = String::from_utf8_lossy(raw);
    let head = text.split("\r\n\r\n").next().unwrap_or("").to_string();
    let mut lines = head.split("\r\n").map(String::from);
    let status = lines.next().unwrap_or_default();
    let rest = lines
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .collect();
    (status, rest)
}

#[test]
fn root_serves_the_page() {
    let b = Broker::start(2, &[]);
    let raw = b.http_raw("GET", "/", b"");
    let (status, headers) = head_lines(&raw);
    let (_, body) = split_http(&raw);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        headers,
        vec![
            "Cache-Control: no-cache".to_string(),
            "Content-Type: text/html; charset=utf-8".to_string(),
            // Over 2 KiB: chunked, as Go's net/http frames a handler's large body.
            "Connection: close".to_string(),
            "Transfer-Encoding: chunked".to_string(),
        ]
    );
    let page = String::from_utf8(body).expect("utf-8 page");
    assert!(page.starts_with("<!DOCTYPE html>"), "{}", &page[..40]);
    assert!(page.contains("<title>nsqd shards</title>"));
    // Self-contained: polls this broker, loads nothing from elsewhere.
    assert!(page.contains("getJSON('/shards')"));
    assert!(page.contains("/stats?format=json"));
    for external in ["http://", "https://", "src=", "@import", "url("] {
        assert!(
            !page.contains(external),
            "the page must not load anything ({external:?})"
        );
    }
    // A query string is still the page; other methods are 405 as on every GET route.
    let (code, body) = b.http("GET", "/?refresh=1", b"");
    assert_eq!(code, 200);
    assert_eq!(body, page.as_bytes());
    let raw = b.http_raw("POST", "/", b"");
    let (status, headers) = head_lines(&raw);
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(
        headers.contains(&"Allow: GET, OPTIONS".to_string()),
        "{headers:?}"
    );
    assert_eq!(split_http(&raw).1, br#"{"message":"METHOD_NOT_ALLOWED"}"#);
}

#[test]
fn other_unknown_paths_still_404() {
    let b = Broker::start(1, &[]);
    for path in [
        "/nope",
        "/index.html",
        "//",
        "/shards/",
        "/favicon.ico",
        "/ping/",
    ] {
        for method in ["GET", "POST"] {
            // httprouter redirects GET to a route it has without the trailing slash or
            // once cleaned (`//` is `/`, this broker's page): 301, not 404.
            if method == "GET" && matches!(path, "//" | "/shards/" | "/ping/") {
                let raw = b.http_raw(method, path, b"");
                let (status, headers) = head_lines(&raw);
                assert_eq!(status, "HTTP/1.1 301 Moved Permanently", "{method} {path}");
                let to = if path == "//" {
                    "/"
                } else {
                    path.trim_end_matches('/')
                };
                assert!(
                    headers.contains(&format!("Location: {to}")),
                    "{method} {path}: {headers:?}"
                );
                continue;
            }
            let raw = b.http_raw(method, path, b"");
            let (status, headers) = head_lines(&raw);
            assert_eq!(status, "HTTP/1.1 404 Not Found", "{method} {path}");
            assert_eq!(
                headers,
                vec![
                    "Content-Type: application/json; charset=utf-8",
                    "X-Nsq-Content-Type: nsq; version=1.0",
                    "Content-Length: 23",
                    "Connection: close",
                ],
                "{method} {path}"
            );
            assert_eq!(split_http(&raw).1, br#"{"message":"NOT_FOUND"}"#);
        }
    }
    // /ping is untouched.
    let raw = b.http_raw("GET", "/ping", b"");
    let (status, headers) = head_lines(&raw);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        headers,
        vec![
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
            "Connection: close",
        ]
    );
    assert_eq!(split_http(&raw).1, b"OK");
}

#[test]
fn shards_list_their_topics() {
    let b = Broker::start(4, &[]);
    let names = topic_names("pg", 8);
    for t in &names {
        let (code, _) = b.http("POST", &format!("/pub?topic={t}"), b"hello");
        assert_eq!(code, 200);
    }
    let (code, body) = b.http("GET", "/shards", b"");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let shards = v.as_array().expect("array");
    assert_eq!(shards.len(), 4);
    let mut seen = Vec::new();
    for s in shards {
        let list: Vec<String> = s["topic_names"]
            .as_array()
            .unwrap_or_else(|| panic!("topic_names in {s}"))
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        assert_eq!(s["topics"], list.len(), "{s}");
        let mut sorted = list.clone();
        sorted.sort();
        assert_eq!(list, sorted, "sorted");
        // The counters are still there, next to the names.
        for k in ["shard", "cpu", "messages_in", "depth", "loop_lag_us"] {
            assert!(s.get(k).is_some(), "{k} in {s}");
        }
        seen.extend(list);
    }
    seen.sort();
    let mut want = names.clone();
    want.sort();
    assert_eq!(seen, want, "every topic on exactly one shard");
    // /stats keeps its shape: no topic_names in its per-shard section.
    let stats = b.stats();
    for s in stats["shards"].as_array().unwrap() {
        assert!(s.get("topic_names").is_none(), "{s}");
    }
}
