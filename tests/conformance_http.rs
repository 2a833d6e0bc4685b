//! HTTP API: /ping, /info, /pub, /mpub, /stats (json and text, filters, clients and
//! producers) and the router errors, compared byte for byte (Date header excluded) with
//! the nsqd 1.3.0 captures where one exists. NSQ_REFERENCE.md §3 and §7 "HTTP".
//!
//! Requests that are compared with a capture are sent keep-alive (no `Connection: close`),
//! as the capturing client did; Go's net/http adds `Connection: close` to every response
//! of a request that asked for it, so those would differ from the captures.

mod common;

use common::*;
use std::time::Duration;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string()
}

fn body_str(raw: &[u8]) -> String {
    String::from_utf8(split_http(raw).1).expect("utf-8 body")
}

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

// ----------------------------------------------------------------------------------------
// /pub
// ----------------------------------------------------------------------------------------

#[test]
fn pub_matches_capture_and_counts() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        for t in topic_names("hpub", 3) {
            // nsqd_pub_hello.http
            assert_v1_text_ok(&b.http_keepalive("POST", &format!("/pub?topic={t}"), b"hello"));
            let ts = b.topic_stats(&t).expect("topic created");
            assert_eq!(
                ts["depth"], 1,
                "no channels: the message stays in the topic"
            );
            assert_eq!(ts["message_count"], 1);
            assert_eq!(ts["message_bytes"], 5);
        }
    }
}

#[test]
fn pub_errors_match_captures() {
    let b = Broker::start(1, &[]);
    // err_pub_empty_body.http
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t", b""),
        "HTTP/1.1 400 Bad Request",
        "MSG_EMPTY",
    );
    // err_pub_missing_topic.http
    assert_v1_error(
        &b.http_keepalive("POST", "/pub", b"x"),
        "HTTP/1.1 400 Bad Request",
        "MISSING_ARG_TOPIC",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topics=t", b"x"),
        "HTTP/1.1 400 Bad Request",
        "MISSING_ARG_TOPIC",
    );
    // err_pub_bad_topic_name.http, err_pub_topic_too_long.http
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=bad!topic", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    let long = "a".repeat(65);
    assert_v1_error(
        &b.http_keepalive("POST", &format!("/pub?topic={long}"), b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    // A trailing newline is not allowed by the name rule ($ is end of text).
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=abc%0A", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    // err_pub_bad_defer.http
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t&defer=abc", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_DEFER",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t&defer=-1", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_DEFER",
    );
    assert_v1_error(
        &b.http_keepalive("POST", "/pub?topic=t&defer=3600001", b"x"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_DEFER",
    );
    assert_v1_text_ok(&b.http_keepalive("POST", "/pub?topic=t&defer=3600000", b"x"));
    // Percent-decoding of the query.
    assert_v1_text_ok(&b.http_keepalive("POST", "/pub?topic=pct%2Etopic", b"x"));
    assert!(b.topic_stats("pct.topic").is_some());
}

#[test]
fn pub_check_order() {
    let b = Broker::start(1, &["--max-msg-size=100"]);
    // The body is checked before the query: no topic and an empty body -> MSG_EMPTY.
    let (code, body) = b.http("POST", "/pub", b"");
    assert_eq!(
        (code, show(&body)),
        (400, r#"{"message":"MSG_EMPTY"}"#.into())
    );
    // Too big before anything else.
    let (code, body) = b.http("POST", "/pub?topic=bad!", &[b'x'; 101]);
    assert_eq!(
        (code, show(&body)),
        (413, r#"{"message":"MSG_TOO_BIG"}"#.into())
    );
    // The topic is created before the defer value is checked.
    let (code, body) = b.http("POST", "/pub?topic=made_anyway&defer=nope", b"x");
    assert_eq!(
        (code, show(&body)),
        (400, r#"{"message":"INVALID_DEFER"}"#.into())
    );
    let ts = b
        .topic_stats("made_anyway")
        .expect("topic created before INVALID_DEFER");
    assert_eq!(ts["message_count"], 0);
    // Exactly max is accepted.
    let (code, body) = b.http("POST", "/pub?topic=exact", &[b'x'; 100]);
    assert_eq!((code, show(&body)), (200, "OK".into()));
}

#[test]
fn pub_too_big_matches_capture() {
    // err_pub_too_big.http: default --max-msg-size, a 1048577-byte body; Go answers
    // before reading the body and closes the keep-alive connection.
    let b = Broker::start(1, &[]);
    let raw = b.http_keepalive("POST", "/pub?topic=t", &vec![b'x'; 1048577]);
    assert_http_exact(
        &raw,
        "HTTP/1.1 413 Request Entity Too Large",
        &[
            "Content-Type: application/json; charset=utf-8",
            "X-Nsq-Content-Type: nsq; version=1.0",
            "Content-Length: 25",
            "Connection: close",
        ],
        br#"{"message":"MSG_TOO_BIG"}"#,
    );
    // nsqd_pub_exactly_max.http
    assert_v1_text_ok(&b.http_keepalive("POST", "/pub?topic=big", &vec![b'x'; 1048576]));
    let ts = b.topic_stats("big").unwrap();
    assert_eq!(ts["message_bytes"], 1048576);
    assert!(
        b.topic_stats("t").is_none(),
        "MSG_TOO_BIG comes before the topic is created"
    );
}

#[test]
fn pub_defer_goes_to_deferred_queue() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        for t in topic_names("hdefer", 3) {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=ch"));
            // nsqd_pub_deferred.http
            assert_v1_text_ok(&b.http_keepalive(
                "POST",
                &format!("/pub?topic={t}&defer=1000"),
                b"later",
            ));
            b.wait_channel_field(&t, "ch", "deferred_count", 1);
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["depth"], 0);
            assert_eq!(ch["message_count"], 1);
            // Due after 1 s: moves to the channel queue.
            b.wait_channel_field(&t, "ch", "deferred_count", 0);
            b.wait_channel_field(&t, "ch", "depth", 1);
        }
    }
}

// ----------------------------------------------------------------------------------------
// /mpub
// ----------------------------------------------------------------------------------------

fn go_nsq_mpub_body(bodies: &[&[u8]]) -> Vec<u8> {
    let mut v = (bodies.len() as u32).to_be_bytes().to_vec();
    for b in bodies {
        v.extend(sized(b));
    }
    v
}

#[test]
fn mpub_text_mode() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        let ts = topic_names("mpub_text", 4);
        // nsqd_mpub_newline.http
        assert_v1_text_ok(&b.http_keepalive(
            "POST",
            &format!("/mpub?topic={}", ts[0]),
            b"a\nb\nc\nd",
        ));
        assert_v1_text_ok(&b.http_keepalive(
            "POST",
            &format!("/mpub?topic={}", ts[1]),
            b"a\nb\nc\nd\n",
        ));
        // Empty lines are skipped.
        assert_v1_text_ok(&b.http_keepalive(
            "POST",
            &format!("/mpub?topic={}", ts[2]),
            b"\n\na\n\nb\n\n",
        ));
        assert_v1_text_ok(&b.http_keepalive(
            "POST",
            &format!("/mpub?topic={}&binary=false", ts[3]),
            b"x\ny\nz",
        ));
        b.wait_topic_field(&ts[0], "depth", 4);
        b.wait_topic_field(&ts[1], "depth", 4);
        b.wait_topic_field(&ts[2], "depth", 2);
        b.wait_topic_field(&ts[3], "depth", 3);
        assert_eq!(b.topic_stats(&ts[0]).unwrap()["message_bytes"], 4);
        // binary=0 is text too.
        let (code, _) = b.http("POST", &format!("/mpub?topic={}&binary=0", ts[3]), b"p\nq");
        assert_eq!(code, 200);
        b.wait_topic_field(&ts[3], "depth", 5);
    }
}

#[test]
fn mpub_text_mode_keeps_carriage_returns_and_order() {
    let b = Broker::start(2, &[]);
    let mut c = b.subscribe("mpub_cr", "ch");
    send(&mut c, b"RDY 10\n");
    let (code, _) = b.http("POST", "/mpub?topic=mpub_cr", b"one\r\ntwo\nthree");
    assert_eq!(code, 200);
    assert_eq!(show(&read_msg(&mut c).body), "one\\x0d");
    assert_eq!(show(&read_msg(&mut c).body), "two");
    assert_eq!(show(&read_msg(&mut c).body), "three");
}

#[test]
fn mpub_binary_mode() {
    let b = Broker::start(1, &[]);
    let five: Vec<Vec<u8>> = (0..5).map(|i| vec![b'0' + i as u8; 100]).collect();
    let refs: Vec<&[u8]> = five.iter().map(|v| v.as_slice()).collect();
    let body = go_nsq_mpub_body(&refs);
    // nsqd_mpub_binary.http
    assert_v1_text_ok(&b.http_keepalive("POST", "/mpub?topic=mb1&binary=true", &body));
    assert_v1_text_ok(&b.http_keepalive("POST", "/mpub?topic=mb2&binary=1", &body));
    // Any unrecognised value means binary.
    assert_v1_text_ok(&b.http_keepalive("POST", "/mpub?topic=mb3&binary=yes_please", &body));
    for t in ["mb1", "mb2", "mb3"] {
        b.wait_topic_field(t, "depth", 5);
        assert_eq!(b.topic_stats(t).unwrap()["message_bytes"], 500);
    }
    // Binary bodies may contain newlines.
    let mut c = b.subscribe("mb4", "ch");
    send(&mut c, b"RDY 10\n");
    let body = go_nsq_mpub_body(&[b"line1\nline2", b"\n"]);
    let (code, _) = b.http("POST", "/mpub?topic=mb4&binary=true", &body);
    assert_eq!(code, 200);
    assert_eq!(show(&read_msg(&mut c).body), "line1\\x0aline2");
    assert_eq!(show(&read_msg(&mut c).body), "\\x0a");
}

#[test]
fn mpub_empty_body_is_ok() {
    let b = Broker::start(1, &[]);
    // nsqd_mpub_empty_body_is_ok.http
    assert_v1_text_ok(&b.http_keepalive("POST", "/mpub?topic=mempty", b""));
    let ts = b.topic_stats("mempty").expect("topic is created");
    assert_eq!(ts["message_count"], 0);
    assert_v1_text_ok(&b.http_keepalive("POST", "/mpub?topic=mempty", b"\n\n\n"));
    assert_eq!(b.topic_stats("mempty").unwrap()["message_count"], 0);
}

#[test]
fn mpub_errors() {
    let b = Broker::start(1, &["--max-msg-size=100", "--max-body-size=1000"]);
    let e = |raw: Vec<u8>, status: &str, msg: &str| assert_v1_error(&raw, status, msg);
    e(
        b.http_keepalive("POST", "/mpub", b"a\nb"),
        "HTTP/1.1 400 Bad Request",
        "MISSING_ARG_TOPIC",
    );
    e(
        b.http_keepalive("POST", "/mpub?topic=bad!t", b"a\nb"),
        "HTTP/1.1 400 Bad Request",
        "INVALID_TOPIC",
    );
    let raw = b.http("POST", "/mpub?topic=me", &[b'x'; 1001]);
    assert_eq!(
        (raw.0, show(&raw.1)),
        (413, r#"{"message":"BODY_TOO_BIG"}"#.into())
    );
    // BODY_TOO_BIG comes before the topic checks.
    let raw = b.http("POST", "/mpub?topic=bad!t", &[b'x'; 1001]);
    assert_eq!(
        (raw.0, show(&raw.1)),
        (413, r#"{"message":"BODY_TOO_BIG"}"#.into())
    );
    let mut text = b"ok\n".to_vec();
    text.extend([b'y'; 101]);
    let raw = b.http("POST", "/mpub?topic=me", &text);
    assert_eq!(
        (raw.0, show(&raw.1)),
        (413, r#"{"message":"MSG_TOO_BIG"}"#.into())
    );
    // Binary errors: the TCP code without E_.
    let binary_cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\x00\x00\x00\x00".to_vec(), "BAD_BODY"),
        (b"\x00\x00".to_vec(), "BAD_BODY"),
        (b"\x00\x00\x00\xc8".to_vec(), "BAD_BODY"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x00".to_vec(), "BAD_MESSAGE"),
        (b"\x00\x00\x00\x02\x00\x00\x00\x01x".to_vec(), "BAD_MESSAGE"),
        (
            b"\x00\x00\x00\x01\x00\x00\x00\x05ab".to_vec(),
            "BAD_MESSAGE",
        ),
        (go_nsq_mpub_body(&[&[b'z'; 101]]), "BAD_MESSAGE"),
    ];
    for (body, code) in binary_cases {
        let raw = b.http("POST", "/mpub?topic=me&binary=true", &body);
        assert_eq!(
            (raw.0, show(&raw.1)),
            (413, format!("{{\"message\":\"{code}\"}}")),
            "body {}",
            show(&body)
        );
    }
    // Nothing was published by the failed batches.
    assert_eq!(
        b.topic_stats("me").map(|t| t["message_count"].clone()),
        Some(0.into())
    );
}

// ----------------------------------------------------------------------------------------
// /stats
// ----------------------------------------------------------------------------------------

const AFTER_PUB_TOPICS: &str = r#""topics":[{"topic_name":"t","channels":[],"depth":1,"backend_depth":0,"message_count":1,"message_bytes":5,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;

const CAPTURE_TOPICS: &str = r#""topics":[{"topic_name":"t","channels":[{"channel_name":"c","depth":6,"backend_depth":0,"in_flight_count":0,"deferred_count":1,"message_count":7,"requeue_count":0,"timeout_count":0,"client_count":0,"clients":[],"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],"depth":0,"backend_depth":0,"message_count":7,"message_bytes":33,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;

const CAPTURE_TEXT_TAIL: &str = "\nTopics:\n   [t              ] depth: 0     be-depth: 0     msgs: 7        e2e%: \n      [c                        ] depth: 6     be-depth: 0     inflt: 0    def: 1    re-q: 0     timeout: 0     msgs: 7        e2e%: \n\nProducers: None\n";

const MEMORY_KEYS: [&str; 9] = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
];

/// Checks the layout of a /stats JSON body: the exact prefix up to the topics, the exact
/// topics array, the memory object's keys in order (values vary), then
/// `"producers":<producers>`. Extra keys after producers are tolerated.
fn assert_stats_json(body: &str, topics: &str, with_memory: bool, producers: &str) {
    let prefix = r#"{"version":"1.3.0","health":"OK","start_time":"#;
    assert!(body.starts_with(prefix), "stats prefix: {body}");
    let rest = &body[prefix.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    assert!(digits >= 10, "start_time digits: {body}");
    let rest = &rest[digits..];
    let want_topics = format!(",{topics}");
    assert!(
        rest.starts_with(&want_topics),
        "topics differ.\nwant: {topics}\ngot:  {}",
        &rest[..rest.len().min(topics.len() + 200)]
    );
    let mut rest = &rest[want_topics.len()..];
    if with_memory {
        assert!(
            rest.starts_with(r#","memory":{"#),
            "memory object expected: {rest}"
        );
        rest = &rest[r#","memory":{"#.len()..];
        for (i, k) in MEMORY_KEYS.iter().enumerate() {
            let key = if i == 0 {
                format!("\"{k}\":")
            } else {
                format!(",\"{k}\":")
            };
            assert!(rest.starts_with(&key), "memory key {k} expected at: {rest}");
            rest = &rest[key.len()..];
            let n = rest.bytes().take_while(u8::is_ascii_digit).count();
            assert!(n > 0, "memory value of {k}: {rest}");
            rest = &rest[n..];
        }
        assert!(rest.starts_with('}'), "memory object end: {rest}");
        rest = &rest[1..];
    } else {
        assert!(
            !body.contains(r#""memory""#),
            "memory must be omitted: {body}"
        );
    }
    let want_prod = format!(r#","producers":{producers}"#);
    assert!(
        rest.starts_with(&want_prod),
        "producers: want {want_prod} at: {rest}"
    );
    assert!(body.ends_with('}'));
    serde_json::from_str::<serde_json::Value>(body).expect("valid JSON");
}

#[test]
fn stats_json_empty_broker() {
    let b = Broker::start(1, &[]);
    let raw = b.http_keepalive("GET", "/stats?format=json", b"");
    let body = body_str(&raw);
    assert_stats_json(&body, r#""topics":[]"#, true, "null");
    let hs = v1_json_headers(body.len());
    let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
    assert_http_exact(&raw, "HTTP/1.1 200 OK", &hs, body.as_bytes());
}

/// Rebuilds the state of the capture nsqd_stats_json.body on topic `t`: 7 messages,
/// 33 bytes, channel c created after the first one, one deferred.
fn build_capture_state(b: &Broker) {
    b.http_pub("t", b"hello");
    b.wait_topic_field("t", "depth", 1);
    let raw = b.http_keepalive("GET", "/stats?format=json", b"");
    assert_stats_json(&body_str(&raw), AFTER_PUB_TOPICS, true, "null");
    // nsqd_create_channel.http
    assert_v1_empty_ok(&b.http_keepalive("POST", "/channel/create?topic=t&channel=c", b""));
    let (code, _) = b.http("POST", "/mpub?topic=t", b"m1\nm2\nm3\nm4\nm5");
    assert_eq!(code, 200);
    let (code, _) = b.http("POST", "/pub?topic=t&defer=600000", b"deferred-message-1");
    assert_eq!(code, 200);
    b.wait_topic_field("t", "depth", 0);
    b.wait_channel_field("t", "c", "depth", 6);
    b.wait_channel_field("t", "c", "deferred_count", 1);
}

#[test]
fn stats_json_matches_capture() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        build_capture_state(&b);
        let raw = b.http_keepalive("GET", "/stats?format=json", b"");
        let body = body_str(&raw);
        assert_stats_json(&body, CAPTURE_TOPICS, true, "null");
        let hs = v1_json_headers(body.len());
        let hs: Vec<&str> = hs.iter().map(String::as_str).collect();
        assert_http_exact(&raw, "HTTP/1.1 200 OK", &hs, body.as_bytes());
        // nsqd_stats_json_topic_channel.body: the same with filters.
        let (_, body) = b.http("GET", "/stats?format=json&topic=t&channel=c", b"");
        assert_stats_json(
            &String::from_utf8(body).unwrap(),
            CAPTURE_TOPICS,
            true,
            "null",
        );
    }
}

/// The text stats from "Topics:" on must equal nsqd's output; DESIGN.md allows this
/// implementation to append its own section (e.g. `Shards:`) after nsqd's last line,
/// separated by a blank line.
fn assert_text_tail(got: &str, want: &str) {
    assert!(
        got.starts_with(want),
        "text stats differ.\nwant: {want:?}\ngot:  {got:?}"
    );
    let extra = &got[want.len()..];
    assert!(
        extra.is_empty() || extra.starts_with('\n'),
        "unexpected text after nsqd's output: {extra:?}"
    );
}

/// True when the JSON stats body has `"producers":<want>` as a top-level member right
/// before the end of the object or before extra top-level keys.
fn producers_are(body: &str, want: &str) -> bool {
    let key = format!(r#","producers":{want}"#);
    match body.rfind(&key) {
        Some(i) => {
            let after = &body[i + key.len()..];
            after == "}" || after.starts_with(",\"")
        }
        None => false,
    }
}

#[test]
fn stats_text_matches_capture() {
    let b = Broker::start(1, &[]);
    build_capture_state(&b);
    for q in ["/stats", "/stats?format=text", "/stats?format=xml"] {
        let raw = b.http_keepalive("GET", q, b"");
        let body = body_str(&raw);
        assert_http_exact(
            &raw,
            "HTTP/1.1 200 OK",
            &[
                "X-Nsq-Content-Type: nsq; version=1.0",
                &format!("Content-Length: {}", body.len()),
                "Content-Type: text/plain; charset=utf-8",
            ],
            body.as_bytes(),
        );
        let lines: Vec<&str> = body.split('\n').collect();
        assert!(lines[0].starts_with("nsqd v1.3.0 (built w/"), "{body}");
        assert!(
            lines[1].starts_with("start_time ")
                && lines[1].len() >= "start_time 2026-11-29T19:39:41Z".len(),
            "{body}"
        );
        assert!(lines[2].starts_with("uptime "), "{body}");
        assert_eq!(lines[3], "");
        assert_eq!(lines[4], "Health: OK");
        assert_eq!(lines[5], "");
        assert_eq!(lines[6], "Memory:");
        for (i, k) in MEMORY_KEYS.iter().enumerate() {
            let l = lines[7 + i];
            let prefix = format!("   {k:<25}\t");
            assert!(
                l.starts_with(&prefix),
                "memory line {l:?} should start with {prefix:?}"
            );
            assert!(
                l[prefix.len()..].bytes().all(|c| c.is_ascii_digit()),
                "{l:?}"
            );
        }
        assert_eq!(lines[16], "");
        let tail_start = body.find("\nTopics:").expect("Topics:");
        assert_text_tail(&body[tail_start..], CAPTURE_TEXT_TAIL);
        assert_eq!(body[..tail_start].matches('\n').count(), 16);
    }
}

#[test]
fn stats_text_empty_and_paused() {
    let b = Broker::start(1, &[]);
    let (_, body) = b.http("GET", "/stats", b"");
    let body = String::from_utf8(body).unwrap();
    let tail = body.find("\nTopics:").map(|i| &body[i - 1..]).unwrap_or("");
    assert_text_tail(tail, "\n\nTopics: None\n\nProducers: None\n");
    b.admin("/topic/create?topic=pz");
    b.admin("/channel/create?topic=pz&channel=cz");
    b.admin("/topic/pause?topic=pz");
    b.admin("/channel/pause?topic=pz&channel=cz");
    let (_, body) = b.http("GET", "/stats?include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    let want = "\nTopics:\n*P [pz             ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n   *P [cz                       ] depth: 0     be-depth: 0     inflt: 0    def: 0    re-q: 0     timeout: 0     msgs: 0        e2e%: \n\nProducers: None\n";
    let tail = body.find("\nTopics:").map(|i| &body[i..]).unwrap_or("");
    assert_text_tail(tail, want);
    assert!(
        !body.contains("Memory:"),
        "include_mem=false drops the memory block: {body}"
    );
}

#[test]
fn stats_text_lists_clients_and_producers() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(
        r#"{"hostname":"cons.host","user_agent":"ua/1"}"#,
        "tc",
        "ch",
    );
    send(&mut c, b"RDY 5\n");
    let port = c.local_addr().unwrap().port();
    let mut p = b.connect_v2();
    send(
        &mut p,
        &identify_cmd(r#"{"hostname":"prod.host","user_agent":"pa/2"}"#),
    );
    expect_ok(&mut p);
    send(&mut p, &pub_cmd("tc", b"x"));
    expect_ok(&mut p);
    send(&mut p, &pub_cmd("tc", b"y"));
    expect_ok(&mut p);
    let pport = p.local_addr().unwrap().port();
    let mut body = String::new();
    let ok = wait_until(Duration::from_secs(5), || {
        body = String::from_utf8(b.http("GET", "/stats", b"").1).unwrap();
        body.contains("inflt: 2 ")
    });
    assert!(ok, "{body}");
    let id = format!("cons.host:{port} ua/1");
    let want_client = format!(
        "        [V2 {id:<21}] state: 3 inflt: {:<4} rdy: {:<4} fin: {:<8} re-q: {:<8} msgs: {:<8} connected: ",
        2, 5, 0, 0, 2
    );
    assert!(
        body.contains(&want_client),
        "want line starting {want_client:?} in:\n{body}"
    );
    let pid = format!("prod.host:{pport} pa/2");
    let want_prod = format!(
        "\nProducers:\n   [V2 {pid:<21}] msgs: {:<8} topics: tc=2 connected: ",
        2
    );
    assert!(body.contains(&want_prod), "want {want_prod:?} in:\n{body}");
}

#[test]
fn stats_json_include_mem_and_clients() {
    let b = Broker::start(2, &[]);
    b.admin("/topic/create?topic=im");
    let want_topics = r#""topics":[{"topic_name":"im","channels":[],"depth":0,"backend_depth":0,"message_count":0,"message_bytes":0,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;
    for q in ["include_mem=false", "include_mem=0"] {
        let (_, body) = b.http("GET", &format!("/stats?format=json&{q}"), b"");
        assert_stats_json(
            &String::from_utf8(body).unwrap(),
            want_topics,
            false,
            "null",
        );
    }
    for q in ["include_mem=true", "include_mem=1", "include_mem=maybe"] {
        let (_, body) = b.http("GET", &format!("/stats?format=json&{q}"), b"");
        assert_stats_json(&String::from_utf8(body).unwrap(), want_topics, true, "null");
    }
    // A consumer: include_clients=false gives clients null and client_count 1.
    let _c = b.subscribe("im", "ch");
    let (_, body) = b.http(
        "GET",
        "/stats?format=json&include_clients=false&include_mem=false",
        b"",
    );
    let want_topics = r#""topics":[{"topic_name":"im","channels":[{"channel_name":"ch","depth":0,"backend_depth":0,"in_flight_count":0,"deferred_count":0,"message_count":0,"requeue_count":0,"timeout_count":0,"client_count":1,"clients":null,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],"depth":0,"backend_depth":0,"message_count":0,"message_bytes":0,"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}]"#;
    assert_stats_json(
        &String::from_utf8(body).unwrap(),
        want_topics,
        false,
        "null",
    );
    let st = b.stats();
    assert_eq!(
        st["topics"][0]["channels"][0]["clients"]
            .as_array()
            .map(|a| a.len()),
        Some(1)
    );
}

#[test]
fn stats_json_client_object_is_exact() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(
        r#"{"client_id":"cid","hostname":"h.example","user_agent":"conformance/2.0","sample_rate":0}"#,
        "cj",
        "ch",
    );
    send(&mut c, b"RDY 7\n");
    b.http_pub("cj", b"m");
    let m = read_msg(&mut c);
    send(&mut c, &line(&format!("FIN {}", m.id)));
    b.wait_channel_field("cj", "ch", "in_flight_count", 0);
    let local = c.local_addr().unwrap();
    let (_, body) = b.http("GET", "/stats?format=json&topic=cj", b"");
    let body = String::from_utf8(body).unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cts = st["topics"][0]["channels"][0]["clients"][0]["connect_ts"]
        .as_i64()
        .expect("connect_ts");
    let want = format!(
        r#""clients":[{{"client_id":"cid","hostname":"h.example","version":"V2","remote_address":"{local}","state":3,"ready_count":7,"in_flight_count":0,"message_count":1,"finish_count":1,"requeue_count":0,"connect_ts":{cts},"sample_rate":0,"deflate":false,"snappy":false,"user_agent":"conformance/2.0","tls":false,"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"","tls_negotiated_protocol_is_mutual":false}}]"#
    );
    assert!(body.contains(&want), "want {want}\nin {body}");
}

#[test]
fn stats_json_producers_and_pub_counts() {
    let b = Broker::start(2, &[]);
    let mut p = b.connect_v2();
    send(
        &mut p,
        &identify_cmd(r#"{"client_id":"prod","hostname":"p.example","user_agent":"pub/1"}"#),
    );
    expect_ok(&mut p);
    // A connection that has not published is not a producer.
    let (_, body) = b.http("GET", "/stats?format=json&include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    assert!(producers_are(&body, "null"), "{body}");
    send(&mut p, &pub_cmd("pc", b"1"));
    expect_ok(&mut p);
    send(&mut p, &mpub_cmd("pc", &[b"2", b"3"]));
    expect_ok(&mut p);
    let local = p.local_addr().unwrap();
    let (_, body) = b.http("GET", "/stats?format=json&include_mem=false", b"");
    let body = String::from_utf8(body).unwrap();
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cts = st["producers"][0]["connect_ts"]
        .as_i64()
        .expect("producer listed");
    let want = format!(
        r#""producers":[{{"client_id":"prod","hostname":"p.example","version":"V2","remote_address":"{local}","state":0,"ready_count":0,"in_flight_count":0,"message_count":0,"finish_count":0,"requeue_count":0,"connect_ts":{cts},"sample_rate":0,"deflate":false,"snappy":false,"user_agent":"pub/1","pub_counts":[{{"topic":"pc","count":3}}],"tls":false,"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"","tls_negotiated_protocol_is_mutual":false}}]"#
    );
    assert!(body.contains(&want), "want {want}\nin {body}");
    // Upstream quirk: only one topic is listed in pub_counts.
    send(&mut p, &pub_cmd("pc2", b"x"));
    expect_ok(&mut p);
    let st = b.stats();
    assert_eq!(
        st["producers"][0]["pub_counts"].as_array().unwrap().len(),
        1,
        "{}",
        st["producers"]
    );
    // include_clients=false: producers null.
    let (_, body) = b.http(
        "GET",
        "/stats?format=json&include_mem=false&include_clients=false",
        b"",
    );
    let body = String::from_utf8(body).unwrap();
    assert!(producers_are(&body, "null"), "{body}");
}

#[test]
fn stats_filters() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        let ts = topic_names("filt", 4);
        for t in &ts {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=zz"));
            b.admin(&format!("/channel/create?topic={t}&channel=aa"));
        }
        b.admin(&format!(
            "/channel/create?topic={}&channel=only_here",
            ts[2]
        ));
        // Sorted by name across shards; channels sorted too.
        let st = b.stats();
        let names: Vec<&str> = st["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic_name"].as_str().unwrap())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "shards={shards}: topics sorted by name");
        assert_eq!(names.len(), 4);
        for t in st["topics"].as_array().unwrap() {
            let chans: Vec<&str> = t["channels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["channel_name"].as_str().unwrap())
                .collect();
            let mut sorted = chans.clone();
            sorted.sort();
            assert_eq!(chans, sorted, "channels sorted by name");
            assert_eq!((chans[0], chans[chans.len() - 1]), ("aa", "zz"));
        }
        // Topic filter.
        let (_, body) = b.http("GET", &format!("/stats?format=json&topic={}", ts[1]), b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["topics"].as_array().unwrap().len(), 1);
        assert_eq!(v["topics"][0]["topic_name"], ts[1].as_str());
        // Channel filter applies to every topic; topics without it are left out.
        let (_, body) = b.http("GET", "/stats?format=json&channel=only_here", b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let topics = v["topics"].as_array().unwrap();
        assert_eq!(topics.len(), 1);
        assert_eq!(topics[0]["topic_name"], ts[2].as_str());
        assert_eq!(topics[0]["channels"].as_array().unwrap().len(), 1);
        let (_, body) = b.http("GET", "/stats?format=json&channel=aa", b"");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["topics"].as_array().unwrap().len(), 4);
        for t in v["topics"].as_array().unwrap() {
            assert_eq!(t["channels"].as_array().unwrap().len(), 1);
            assert_eq!(t["channels"][0]["channel_name"], "aa");
        }
        // Unknown topic: "topics":null. Unknown channel: "topics":[].
        let (_, body) = b.http(
            "GET",
            "/stats?format=json&topic=nope&include_mem=false",
            b"",
        );
        let body = String::from_utf8(body).unwrap();
        assert_stats_json(&body, r#""topics":null"#, false, "null");
        let (_, body) = b.http(
            "GET",
            "/stats?format=json&channel=nope&include_mem=false",
            b"",
        );
        let body = String::from_utf8(body).unwrap();
        assert_stats_json(&body, r#""topics":[]"#, false, "null");
    }
}

#[test]
fn stats_counts_across_shards() {
    for shards in SHARD_COUNTS {
        let b = Broker::start(shards, &[]);
        let ts = topic_names("cnt", 5);
        let mut p = b.connect_v2();
        for (i, t) in ts.iter().enumerate() {
            for _ in 0..=i {
                send(&mut p, &pub_cmd(t, b"abc"));
                expect_ok(&mut p);
            }
        }
        for (i, t) in ts.iter().enumerate() {
            let st = b
                .topic_stats(t)
                .unwrap_or_else(|| panic!("shards={shards}: {t} missing"));
            assert_eq!(st["message_count"], (i + 1) as u64);
            assert_eq!(st["message_bytes"], 3 * (i + 1) as u64);
            assert_eq!(st["depth"], (i + 1) as u64);
        }
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
