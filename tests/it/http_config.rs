//! GET and PUT /config/:opt (nsqd: http.go doConfig): PUT takes
//! `nsqlookupd_tcp_addresses` (a JSON array) and `log_level`; an empty body or one over
//! --max-msg-size is 413 INVALID_VALUE (checked before the option name), a bad value
//! 400 INVALID_VALUE, any other option 400 INVALID_OPTION. The answer is the new value,
//! as GET gives it, from every shard.

use crate::common;

use common::Broker;
use std::io::Write;
use std::time::{Duration, Instant};

fn text(r: (u16, Vec<u8>)) -> (u16, String) {
    (r.0, String::from_utf8_lossy(&r.1).to_string())
}

fn err(code: u16, msg: &str) -> (u16, String) {
    (code, format!("{{\"message\":\"{msg}\"}}"))
}

#[test]
fn put_config_semantics() {
    let b = Broker::start(4, &["--max-msg-size=100"]);
    let get = |opt: &str| text(b.http("GET", &format!("/config/{opt}"), b""));
    let put = |opt: &str, body: &[u8]| text(b.http("PUT", &format!("/config/{opt}"), body));

    assert_eq!(get("nsqlookupd_tcp_addresses"), (200, "[]".into()));
    assert_eq!(get("log_level"), (200, "2".into()));
    assert_eq!(get("statsd_interval"), (200, "60000000000".into()));
    assert_eq!(get("statsd_mem_stats"), (200, "true".into()));
    assert_eq!(get("statsd_udp_packet_size"), (200, "508".into()));
    assert_eq!(get("statsd_address"), (200, "".into()));
    assert_eq!(get("no_such_option"), err(400, "INVALID_OPTION"));
    // JSON answers are written as Go's encoding/json writes them: <, > and & escaped
    // (nsqd 1.3.0 answers this PUT with exactly these 22 bytes).
    assert_eq!(
        put("nsqlookupd_tcp_addresses", br#"["<>&"]"#),
        (200, r#"["\u003c\u003e\u0026"]"#.into())
    );
    assert_eq!(put("nsqlookupd_tcp_addresses", b"[]"), (200, "[]".into()));

    // Body checks come first, for any option.
    assert_eq!(put("log_level", b""), err(413, "INVALID_VALUE"));
    assert_eq!(put("no_such_option", b""), err(413, "INVALID_VALUE"));
    assert_eq!(put("log_level", &[b'a'; 101]), err(413, "INVALID_VALUE"));
    assert_eq!(
        put("nsqlookupd_tcp_addresses", &[b' '; 101]),
        err(413, "INVALID_VALUE")
    );
    // A body of exactly max-msg-size is read (and here is not valid JSON).
    assert_eq!(
        put("nsqlookupd_tcp_addresses", &[b'x'; 100]),
        err(400, "INVALID_VALUE")
    );
    assert_eq!(
        put("tcp_address", b"127.0.0.1:1"),
        err(400, "INVALID_OPTION")
    );
    assert_eq!(put("no_such_option", b"1"), err(400, "INVALID_OPTION"));

    // nsqlookupd_tcp_addresses: a JSON array of strings.
    assert_eq!(
        put("nsqlookupd_tcp_addresses", b"\"a:1\""),
        err(400, "INVALID_VALUE")
    );
    assert_eq!(
        put("nsqlookupd_tcp_addresses", b"[1]"),
        err(400, "INVALID_VALUE")
    );
    assert_eq!(
        put("nsqlookupd_tcp_addresses", b"[\"a:1\""),
        err(400, "INVALID_VALUE")
    );
    let v = r#"["127.0.0.1:1","127.0.0.1:2"]"#;
    let raw = b.http_raw("PUT", "/config/nsqlookupd_tcp_addresses", v.as_bytes());
    let head = String::from_utf8_lossy(&raw);
    assert!(
        head.contains("Content-Type: application/json; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(
        head.contains("X-Nsq-Content-Type: nsq; version=1.0\r\n"),
        "{head}"
    );
    assert!(head.ends_with(&format!("\r\n\r\n{v}")), "{head}");
    for _ in 0..8 {
        // new connections land on any of the 4 shards
        assert_eq!(get("nsqlookupd_tcp_addresses"), (200, v.into()));
    }
    // Go decodes a JSON null into a nil slice, reported as null.
    assert_eq!(
        put("nsqlookupd_tcp_addresses", b"null"),
        (200, "null".into())
    );
    assert_eq!(
        put("nsqlookupd_tcp_addresses", b" [ ] "),
        (200, "[]".into())
    );

    // log_level: debug/info/warn/error/fatal (any case) as 1..5.
    assert_eq!(put("log_level", b"verbose"), err(400, "INVALID_VALUE"));
    assert_eq!(put("log_level", b"info\n"), err(400, "INVALID_VALUE"));
    for (lvl, n) in [
        ("debug", "1"),
        ("WARN", "3"),
        ("Error", "4"),
        ("fatal", "5"),
        ("info", "2"),
    ] {
        assert_eq!(put("log_level", lvl.as_bytes()), (200, n.into()));
        for _ in 0..4 {
            assert_eq!(get("log_level"), (200, n.into()));
        }
    }
}

/// The level set with PUT governs what the broker logs, on every shard.
#[test]
fn put_log_level_changes_logging() {
    let b = Broker::start(2, &[]);
    let count = |needle: &str| {
        b.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    // info: a connection's commands are logged at debug only (nsqd's IOLoop), HTTP
    // requests at info.
    let nop = |b: &Broker| {
        let mut s = b.connect_v2();
        s.write_all(b"NOP\n").unwrap();
        // The connection's close is seen after the command ran.
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = std::io::Read::read_to_end(&mut s, &mut Vec::new());
    };
    nop(&b);
    assert_eq!(count("] [NOP]"), 0, "a command logged at level info");
    let (code, _) = b.http("PUT", "/config/log_level", b"debug");
    assert_eq!(code, 200);
    for _ in 0..4 {
        nop(&b);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while count("DEBUG: PROTOCOL(V2): [127.0.0.1:") < 4 || count("] [NOP]") < 4 {
        assert!(
            Instant::now() < deadline,
            "no debug lines after PUT log_level=debug"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, _) = b.http("PUT", "/config/log_level", b"error");
    assert_eq!(code, 200);
    let before = count("GET /ping");
    for _ in 0..4 {
        let (code, _) = b.http("GET", "/ping", b"");
        assert_eq!(code, 200);
    }
    // Time for any line of those requests to reach the log.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        count("GET /ping"),
        before,
        "INFO lines logged at level error"
    );
    let (code, _) = b.http("PUT", "/config/log_level", b"info");
    assert_eq!(code, 200);
    let (code, _) = b.http("GET", "/info", b"");
    assert_eq!(code, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while count("GET /info") == 0 {
        assert!(
            Instant::now() < deadline,
            "no INFO lines after PUT log_level=info"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
