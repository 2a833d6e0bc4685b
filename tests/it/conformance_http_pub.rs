//! HTTP API: /pub and /mpub (text and binary mode, defer, limits and errors), compared
//! byte for byte (Date header excluded) with the nsqd 1.3.0 captures where one exists.
//! NSQ_REFERENCE.md §3 and §7 "HTTP". Requests compared with a capture are sent
//! keep-alive, as the capturing client did.

use crate::common;

use common::*;

// ----------------------------------------------------------------------------------------
// /pub
// ----------------------------------------------------------------------------------------

#[test]
fn pub_matches_capture_and_counts() {
    for_each_shards(&SHARD_COUNTS, |shards| {
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
    });
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
    for_each_shards(&SHARD_COUNTS, |shards| {
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
    });
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
    for_each_shards(&SHARD_COUNTS, |shards| {
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
    });
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
