//! AUTH with `--auth-http-address` (nsqd: protocol_v2.go AUTH and CheckAuth,
//! internal/auth/authorizations.go): IDENTIFY's `auth_required`, the auth server query
//! (GET and POST), the JSON reply, the checks on SUB/PUB/MPUB/DPUB with nsqd's exact
//! error frames, TTL expiry, an unreachable or hanging auth server, and the
//! authorizations following a connection handed to another shard.
//!
//! The auth server is a tiny std::net HTTP server in this file: it records each request
//! and answers the reply set for the request's secret.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request the auth server received.
#[derive(Clone, Debug)]
struct Recorded {
    /// The request line, e.g. `GET /auth?... HTTP/1.1`.
    request_line: String,
    /// Header lines as sent.
    headers: Vec<String>,
    body: String,
}

#[derive(Default)]
struct AuthServerState {
    /// secret -> (status, JSON body).
    replies: HashMap<String, (u16, String)>,
    requests: Vec<Recorded>,
    /// Accept and read, but never answer.
    hang: bool,
}

/// A tiny HTTP auth server on 127.0.0.1 (one thread, one request per connection).
struct AuthServer {
    addr: SocketAddr,
    state: Arc<Mutex<AuthServerState>>,
}

impl AuthServer {
    fn start() -> AuthServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind auth server");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(AuthServerState::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve(conn, st));
            }
        });
        AuthServer { addr, state }
    }

    /// Answers `secret` with `status` and `body`.
    fn reply(&self, secret: &str, status: u16, body: &str) {
        self.state
            .lock()
            .unwrap()
            .replies
            .insert(secret.to_string(), (status, body.to_string()));
    }

    fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    fn set_hang(&self, hang: bool) {
        self.state.lock().unwrap().hang = hang;
    }
}

fn serve(mut conn: TcpStream, st: Arc<Mutex<AuthServerState>>) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_string();
    let headers: Vec<String> = lines.map(str::to_string).collect();
    let len = headers
        .iter()
        .find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while raw.len() < head_end + 4 + len {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    let body = String::from_utf8_lossy(&raw[head_end + 4..head_end + 4 + len]).to_string();
    let secret = if request_line.starts_with("POST") {
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["secret"][0].as_str().map(str::to_string))
            .unwrap_or_default()
    } else {
        request_line
            .split_whitespace()
            .nth(1)
            .and_then(|t| t.split_once('?'))
            .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("secret=")))
            .map(|s| s.replace('+', " ").replace("%26", "&"))
            .unwrap_or_default()
    };
    let (hang, reply) = {
        let mut s = st.lock().unwrap();
        s.requests.push(Recorded {
            request_line,
            headers,
            body,
        });
        let reply = s
            .replies
            .get(&secret)
            .cloned()
            .unwrap_or((404, r#"{"message":"NOT_FOUND"}"#.to_string()));
        (s.hang, reply)
    };
    if hang {
        // A server that never answers (within any client's timeout).
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    let (status, body) = reply;
    let resp = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(resp.as_bytes());
}

/// A grant reply: `ttl` seconds, publish on topics matching `pub_re`, subscribe on
/// topic `sub_re` to channels matching `chan_re`.
fn grant(ttl: i64, pub_re: &str, sub_re: &str, chan_re: &str) -> String {
    format!(
        r#"{{"ttl":{ttl},"identity":"alice","identity_url":"http://auth.example/alice","authorizations":[{{"topic":"{pub_re}","channels":[".*"],"permissions":["publish"]}},{{"topic":"{sub_re}","channels":["{chan_re}"],"permissions":["subscribe"]}}]}}"#
    )
}

const AUTH_REPLY: &str =
    r#"{"identity":"alice","identity_url":"http://auth.example/alice","permission_count":2}"#;

fn auth_cmd(secret: &str) -> Vec<u8> {
    let mut v = b"AUTH\n".to_vec();
    v.extend(sized(secret.as_bytes()));
    v
}

fn broker_with(auth: &AuthServer, shards: usize, extra: &[&str]) -> Broker {
    let addr = format!("--auth-http-address={}", auth.addr);
    let mut args = vec![addr.as_str()];
    args.extend_from_slice(extra);
    Broker::start(shards, &args)
}

/// A connection that sent AUTH `secret` and got [`AUTH_REPLY`].
fn authed(b: &Broker, secret: &str) -> TcpStream {
    let mut s = b.connect_v2();
    send(&mut s, &auth_cmd(secret));
    expect_frame(&mut s, 0, AUTH_REPLY.as_bytes());
    s
}

#[test]
fn identify_reports_auth_required() {
    let auth = AuthServer::start();
    let b = broker_with(&auth, 1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"feature_negotiation":true}"#));
    expect_frame(
        &mut s,
        0,
        br#"{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,"sample_rate":0,"auth_required":true,"output_buffer_size":16384,"output_buffer_timeout":250}"#,
    );
    // /config shows the address as nsqd's cfg name.
    let (code, body) = b.http("GET", "/config/auth_http_addresses", b"");
    assert_eq!((code, show(&body)), (200, format!("[\"{}\"]", auth.addr)));

    // The config file's `auth_http_addresses` turns AUTH on too.
    let cfg = b.data_dir.join("auth.toml");
    std::fs::write(&cfg, format!("auth_http_addresses = [\"{}\"]\n", auth.addr)).unwrap();
    let b2 = Broker::start(1, &[&format!("--config={}", cfg.display())]);
    let mut s = b2.connect_v2();
    send(&mut s, &pub_cmd("t", b"x"));
    expect_fatal(&mut s, "E_AUTH_FIRST AUTH required before PUB");
}

#[test]
fn commands_need_auth_first() {
    let auth = AuthServer::start();
    let b = broker_with(&auth, 1, &[]);
    let cases: [(&[u8], &str); 4] = [
        (&pub_cmd("t", b"x"), "E_AUTH_FIRST AUTH required before PUB"),
        (
            &mpub_cmd("t", &[b"x"]),
            "E_AUTH_FIRST AUTH required before MPUB",
        ),
        (
            &dpub_cmd("t", 10, b"x"),
            "E_AUTH_FIRST AUTH required before DPUB",
        ),
        (b"SUB t c\n", "E_AUTH_FIRST AUTH required before SUB"),
    ];
    for (cmd, want) in cases {
        let mut s = b.connect_v2();
        send(&mut s, cmd);
        expect_fatal(&mut s, want);
    }
    // MPUB is checked before its body is read: the line alone gets the answer, and a
    // bad body does not come first.
    let mut s = b.connect_v2();
    send(&mut s, b"MPUB t\n");
    expect_fatal(&mut s, "E_AUTH_FIRST AUTH required before MPUB");
    let mut s = b.connect_v2();
    send(&mut s, b"MPUB t\n\x00\x00\x00\x00");
    expect_fatal(&mut s, "E_AUTH_FIRST AUTH required before MPUB");
    // Errors nsqd finds before the auth check still come first.
    let mut s = b.connect_v2();
    send(&mut s, b"PUB t\n\x00\x00\x00\x00");
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB invalid message body size 0");
    let mut s = b.connect_v2();
    send(&mut s, b"SUB t bad!\n");
    expect_fatal(
        &mut s,
        "E_BAD_CHANNEL SUB channel name \"bad!\" is not valid",
    );
    let mut s = b.connect_v2();
    send(&mut s, b"DPUB t 99999999\n");
    expect_fatal(
        &mut s,
        "E_INVALID DPUB timeout 99999999 out of range 0-3600000",
    );
    // No topic was created by any of them, and nobody asked the auth server.
    assert!(b.topic_stats("t").is_none());
    assert!(auth.requests().is_empty());
    // The HTTP API is not subject to AUTH, as in nsqd.
    b.http_pub("t", b"over http");
    b.wait_topic_field("t", "message_count", 1);
}

#[test]
fn auth_body_errors() {
    let auth = AuthServer::start();
    let b = broker_with(&auth, 1, &["--max-body-size=1000"]);
    let cases: [(&[u8], &str, bool); 5] = [
        (
            b"AUTH secret\n\x00\x00\x00\x06secret",
            "E_INVALID AUTH invalid number of parameters",
            false,
        ),
        (
            b"AUTH\n\x00\x00\x00\x00",
            "E_BAD_BODY AUTH invalid body size 0",
            false,
        ),
        (
            b"AUTH\n\x00\x00\x03\xe9",
            "E_BAD_BODY AUTH body too big 1001 > 1000",
            false,
        ),
        (
            b"AUTH\n\x00\x00",
            "E_BAD_BODY AUTH failed to read body size",
            true,
        ),
        (
            b"AUTH\n\x00\x00\x00\x10short",
            "E_BAD_BODY AUTH failed to read body",
            true,
        ),
    ];
    for (cmd, want, eof) in cases {
        let mut s = b.connect_v2();
        send(&mut s, cmd);
        if eof {
            s.shutdown(Shutdown::Write).unwrap();
        }
        expect_fatal(&mut s, want);
    }
    assert!(auth.requests().is_empty());
}

#[test]
fn auth_then_publish_and_subscribe() {
    let auth = AuthServer::start();
    auth.reply("s3cr&t x", 200, &grant(3600, "^allowed", "^allowed", "^ch"));
    let b = broker_with(&auth, 1, &[]);

    // AUTH works before IDENTIFY, and answers nsqd's JSON.
    let mut s = authed(&b, "s3cr&t x");
    let reqs = auth.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].request_line,
        "GET /auth?common_name=&remote_ip=127.0.0.1&secret=s3cr%26t+x&tls=false HTTP/1.1"
    );
    assert!(
        reqs[0]
            .headers
            .contains(&"Accept: application/vnd.nsq; version=1.0".to_string()),
        "{:?}",
        reqs[0].headers
    );
    send(&mut s, &pub_cmd("allowed_t", b"a"));
    expect_ok(&mut s);
    send(&mut s, &mpub_cmd("allowed_t", &[b"b", b"c"]));
    expect_ok(&mut s);
    send(&mut s, &dpub_cmd("allowed_t", 10, b"d"));
    expect_ok(&mut s);
    // A second AUTH is refused once authorized (after its body was read).
    send(&mut s, &auth_cmd("s3cr&t x"));
    expect_fatal(&mut s, "E_INVALID AUTH already set");
    // Within the TTL the answer is cached: one query in all.
    assert_eq!(auth.requests().len(), 1);

    // Denied topic, for each publish command.
    let denied: [(Vec<u8>, &str); 3] = [
        (
            pub_cmd("other", b"x"),
            "E_UNAUTHORIZED AUTH failed for PUB on \"other\" \"\"",
        ),
        (
            mpub_cmd("other", &[b"x"]),
            "E_UNAUTHORIZED AUTH failed for MPUB on \"other\" \"\"",
        ),
        (
            dpub_cmd("other", 5, b"x"),
            "E_UNAUTHORIZED AUTH failed for DPUB on \"other\" \"\"",
        ),
    ];
    for (cmd, want) in denied {
        let mut s = authed(&b, "s3cr&t x");
        send(&mut s, &cmd);
        expect_fatal(&mut s, want);
    }
    // A denied MPUB answers before its body and creates nothing.
    let mut s = authed(&b, "s3cr&t x");
    send(&mut s, b"MPUB other\n");
    expect_fatal(
        &mut s,
        "E_UNAUTHORIZED AUTH failed for MPUB on \"other\" \"\"",
    );
    assert!(b.topic_stats("other").is_none());

    // Subscribe: the channel must match too, and publish rights do not give it.
    let mut s = authed(&b, "s3cr&t x");
    send(&mut s, b"SUB allowed_t nope\n");
    expect_fatal(
        &mut s,
        "E_UNAUTHORIZED AUTH failed for SUB on \"allowed_t\" \"nope\"",
    );
    let mut s = authed(&b, "s3cr&t x");
    send(&mut s, b"SUB other ch\n");
    expect_fatal(
        &mut s,
        "E_UNAUTHORIZED AUTH failed for SUB on \"other\" \"ch\"",
    );
    let mut s = authed(&b, "s3cr&t x");
    send(&mut s, b"SUB allowed_t ch1\n");
    expect_ok(&mut s);
    send(&mut s, b"RDY 10\n");
    for want in [&b"a"[..], b"b", b"c", b"d"] {
        let m = read_msg(&mut s);
        assert_eq!(m.body, want);
    }
    // /stats shows the identity of an authorized client.
    let ch = b.channel_stats("allowed_t", "ch1").unwrap();
    let c = &ch["clients"][0];
    assert_eq!(
        (&c["authed"], &c["auth_identity"], &c["auth_identity_url"]),
        (
            &serde_json::json!(true),
            &serde_json::json!("alice"),
            &serde_json::json!("http://auth.example/alice")
        ),
        "{ch}"
    );
    // AUTH after SUB: wrong state.
    send(&mut s, &auth_cmd("s3cr&t x"));
    expect_fatal(&mut s, "E_INVALID cannot AUTH in current state");
}

#[test]
fn auth_failures() {
    let auth = AuthServer::start();
    auth.reply(
        "none",
        200,
        r#"{"ttl":60,"identity":"nobody","authorizations":[]}"#,
    );
    auth.reply("zero_ttl", 200, &grant(0, ".*", ".*", ".*"));
    auth.reply(
        "bad_perm",
        200,
        r#"{"ttl":60,"authorizations":[{"topic":"t","channels":[".*"],"permissions":["admin"]}]}"#,
    );
    auth.reply("bad_re", 200,
        r#"{"ttl":60,"authorizations":[{"topic":"(","channels":[".*"],"permissions":["publish"]}]}"#);
    auth.reply("not_json", 200, "<html>");
    auth.reply("error", 500, r#"{"message":"INTERNAL_ERROR"}"#);
    let b = broker_with(&auth, 1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &auth_cmd("none"));
    expect_fatal(&mut s, "E_UNAUTHORIZED AUTH no authorizations found");
    for secret in [
        "zero_ttl", "bad_perm", "bad_re", "not_json", "error", "unknown",
    ] {
        let mut s = b.connect_v2();
        send(&mut s, &auth_cmd(secret));
        expect_fatal(&mut s, "E_AUTH_FAILED AUTH failed");
    }
    // The reason is logged, never sent to the client.
    assert!(wait_until(Duration::from_secs(5), || b
        .log
        .lock()
        .unwrap()
        .iter()
        .any(
            |l| l.contains("AUTH failed") && l.contains("invalid TTL 0 (must be >0)")
        )));

    // Auth server down: E_AUTH_FAILED.
    let down = free_port();
    let b = Broker::start(1, &[&format!("--auth-http-address=127.0.0.1:{down}")]);
    let mut s = b.connect_v2();
    send(&mut s, &auth_cmd("x"));
    expect_fatal(&mut s, "E_AUTH_FAILED AUTH failed");

    // With a dead address and a live one, each AUTH finds the live one.
    auth.reply("ok", 200, &grant(60, ".*", ".*", ".*"));
    let b = Broker::start(
        1,
        &[
            &format!("--auth-http-address=127.0.0.1:{down}"),
            &format!("--auth-http-address={}", auth.addr),
        ],
    );
    for _ in 0..4 {
        let mut s = authed(&b, "ok");
        send(&mut s, &pub_cmd("t", b"x"));
        expect_ok(&mut s);
    }
}

#[test]
fn ttl_expiry_queries_again() {
    let auth = AuthServer::start();
    auth.reply("s", 200, &grant(1, "^t$", "^t$", ".*"));
    let b = broker_with(&auth, 1, &[]);
    let mut s = authed(&b, "s");
    send(&mut s, &pub_cmd("t", b"1"));
    expect_ok(&mut s);
    assert_eq!(auth.requests().len(), 1);
    // A second connection that will find the auth server failing after expiry.
    let mut s2 = authed(&b, "s");
    assert_eq!(auth.requests().len(), 2);
    // The grant changes on the server; it is seen only after the TTL.
    auth.reply("s", 200, &grant(1, "^u$", "^u$", ".*"));
    send(&mut s, &pub_cmd("t", b"2"));
    expect_ok(&mut s);
    assert_eq!(auth.requests().len(), 2);
    // Past the grant's 1 s TTL: the next command makes the broker ask again.
    std::thread::sleep(Duration::from_millis(1300));
    send(&mut s, &pub_cmd("t", b"3"));
    expect_fatal(&mut s, "E_UNAUTHORIZED AUTH failed for PUB on \"t\" \"\"");
    let reqs = auth.requests();
    assert_eq!(reqs.len(), 3);
    assert!(reqs[2].request_line.contains("&secret=s&"), "{reqs:?}");
    // A failing re-query after expiry: E_AUTH_FAILED.
    auth.reply("s", 503, "{}");
    send(&mut s2, &pub_cmd("u", b"x"));
    expect_fatal(&mut s2, "E_AUTH_FAILED AUTH failed");
}

#[test]
fn post_method_and_full_url() {
    let auth = AuthServer::start();
    auth.reply("p", 200, &grant(60, ".*", ".*", ".*"));
    let url = format!("--auth-http-address=http://{}/custom/path", auth.addr);
    let b = Broker::start(1, &[&url, "--auth-http-request-method=post"]);
    let mut s = authed(&b, "p");
    send(&mut s, &pub_cmd("t", b"x"));
    expect_ok(&mut s);
    let reqs = auth.requests();
    assert_eq!(reqs[0].request_line, "POST /custom/path HTTP/1.1");
    assert_eq!(
        reqs[0].body,
        r#"{"common_name":[""],"remote_ip":["127.0.0.1"],"secret":["p"],"tls":["false"]}"#
    );
    assert!(reqs[0]
        .headers
        .contains(&"Content-Type: application/json".to_string()));

    // GET to a full URL: the query string is appended to it.
    let b = Broker::start(1, &[&url]);
    let _s = authed(&b, "p");
    let reqs = auth.requests();
    assert_eq!(
        reqs.last().unwrap().request_line,
        "GET /custom/path?common_name=&remote_ip=127.0.0.1&secret=p&tls=false HTTP/1.1"
    );
}

/// A hanging auth server costs the waiting client its request timeout and nothing else:
/// the shard keeps serving other connections meanwhile.
#[test]
fn slow_auth_server_does_not_block_the_shard() {
    let auth = AuthServer::start();
    auth.set_hang(true);
    let b = broker_with(&auth, 1, &["--http-client-request-timeout=1500ms"]);
    let mut waiting = b.connect_v2();
    send(&mut waiting, &auth_cmd("slow"));
    assert!(wait_until(Duration::from_secs(5), || !auth
        .requests()
        .is_empty()));
    let t0 = Instant::now();
    let mut other = b.connect_v2();
    send(&mut other, &identify_cmd("{}"));
    expect_ok(&mut other);
    let (code, _) = b.http("GET", "/ping", b"");
    assert_eq!(code, 200);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    expect_fatal(&mut waiting, "E_AUTH_FAILED AUTH failed");
}

/// The authorizations (and the secret, for a re-query) move with a connection handed to
/// the shard that owns its topic.
#[test]
fn authorization_survives_shard_hand_off() {
    let auth = AuthServer::start();
    auth.reply("h", 200, &grant(1, "^ho_", "^ho_", "^c$"));
    for_each_shards(&[2, 4], |shards| {
        let b = broker_with(&auth, shards, &[]);
        let topics = topic_names("ho_", 8);
        for t in &topics {
            let mut sub = authed(&b, "h");
            send(&mut sub, &line(&format!("SUB {t} c")));
            expect_ok(&mut sub);
            send(&mut sub, b"RDY 5\n");
            let mut p = authed(&b, "h");
            send(&mut p, &pub_cmd(t, b"m1"));
            expect_ok(&mut p);
            assert_eq!(read_msg(&mut sub).body, b"m1");
        }
        // Some of those connections did move to another shard.
        let stats = b.stats();
        let moved: u64 = stats["shards"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["handoffs_sent"].as_u64()).sum())
            .unwrap_or(0);
        assert!(moved > 0, "no hand-off happened: {}", stats["shards"]);
        // A producer moved to its topic's shard re-queries with its secret after expiry.
        let before = auth.requests().len();
        let mut producers: Vec<TcpStream> = topics
            .iter()
            .map(|t| {
                let mut p = authed(&b, "h");
                send(&mut p, &pub_cmd(t, b"x"));
                expect_ok(&mut p);
                p
            })
            .collect();
        assert_eq!(auth.requests().len(), before + topics.len());
        // Past the grants' 1 s TTL: each connection asks again.
        std::thread::sleep(Duration::from_millis(1300));
        for (p, t) in producers.iter_mut().zip(&topics) {
            send(p, &pub_cmd(t, b"y"));
            expect_ok(p);
            send(p, &pub_cmd("not_ho", b"z"));
            expect_fatal(p, "E_UNAUTHORIZED AUTH failed for PUB on \"not_ho\" \"\"");
        }
        assert_eq!(auth.requests().len(), before + 2 * topics.len());
    });
}

/// A reply with many authorizations (40,000 regexes to compile) is parsed off the
/// shard's thread: while one connection's AUTH waits for it, the shard keeps answering
/// others at once (parsed inline, every other client of the shard waited for the whole
/// parse: about 1 s for 100,000 authorizations in a release build). The big grant
/// still works.
#[test]
fn a_huge_auth_reply_does_not_stall_the_shard() {
    let auth = AuthServer::start();
    let mut authorizations: Vec<String> = (0..40_000)
        .map(|i| {
            format!(r#"{{"topic":"^t{i}x$","channels":["^c{i}$"],"permissions":["subscribe"]}}"#)
        })
        .collect();
    authorizations.push(r#"{"topic":"^huge_","channels":[".*"],"permissions":["publish"]}"#.into());
    let body = format!(
        r#"{{"ttl":3600,"identity":"bulk","identity_url":"","authorizations":[{}]}}"#,
        authorizations.join(",")
    );
    auth.reply("huge", 200, &body);
    let b = broker_with(&auth, 1, &[]);
    let mut s = b.connect_v2();
    // The HTTP connection is opened first: it lives on the same (only) shard.
    let mut http = TcpStream::connect(b.http).unwrap();
    http.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let t0 = Instant::now();
    send(&mut s, &auth_cmd("huge"));
    let pinger = std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let t = Instant::now();
            http.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut buf = [0u8; 256];
            let got = http.read(&mut buf).unwrap();
            assert!(
                buf[..got].starts_with(b"HTTP/1.1 200"),
                "{}",
                show(&buf[..got])
            );
            worst = worst.max(t.elapsed());
            n += 1;
            std::thread::sleep(Duration::from_millis(5));
            if STOP.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
        }
        (worst, n)
    });
    static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let count = authorizations.len();
    expect_frame(
        &mut s,
        0,
        format!(r#"{{"identity":"bulk","identity_url":"","permission_count":{count}}}"#).as_bytes(),
    );
    let auth_took = t0.elapsed();
    STOP.store(true, std::sync::atomic::Ordering::Release);
    let (worst, pings) = pinger.join().unwrap();
    eprintln!("AUTH answered after {auth_took:?}; {pings} pings meanwhile, the slowest {worst:?}");
    assert!(
        auth_took >= Duration::from_millis(200),
        "the reply parsed too fast to tell ({auth_took:?}): make it bigger"
    );
    assert!(
        worst * 3 < auth_took,
        "a ping waited {worst:?} of the AUTH's {auth_took:?}: the parse ran on the shard"
    );
    send(&mut s, &pub_cmd("huge_t", b"a"));
    expect_ok(&mut s);
    send(&mut s, &pub_cmd("t1x", b"a"));
    expect_fatal(&mut s, "E_UNAUTHORIZED AUTH failed for PUB on \"t1x\" \"\"");
}
