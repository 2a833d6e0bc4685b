//! Draining mode (nsqd RFC nsqio/nsq#1302, docs/draining.md): `PUT /config/drain` or
//! SIGTERM with `--sigterm=drain` makes the node refuse publishes (TCP `E_PUB_FAILED PUB
//! failed draining` and MPUB's, DPUB's; HTTP 503 EXITING) and the creation of topics and
//! channels, lets consumers of existing channels receive everything, then exits 0
//! through the clean shutdown once every channel is empty. `PUT /config/shutdown` (or
//! SIGINT) shuts down cleanly at once, during a drain too.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Generous: the debug build on a loaded 2-core machine.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

/// `GET /info` parsed.
fn info(http: SocketAddr) -> serde_json::Value {
    let (code, body) = split_http(&http_raw(http, "GET", "/info", b""));
    assert_eq!(code, 200);
    serde_json::from_slice(&body).unwrap()
}

/// The channel's (depth, in_flight_count, deferred_count) in /stats, if it exists.
fn channel_counts(b: &Broker, topic: &str, channel: &str) -> Option<(u64, u64, u64)> {
    let c = b.channel_stats(topic, channel)?;
    Some((
        c["depth"].as_u64()?,
        c["in_flight_count"].as_u64()?,
        c["deferred_count"].as_u64()?,
    ))
}

fn topic_depth(b: &Broker, topic: &str) -> Option<u64> {
    b.topic_stats(topic)?["depth"].as_u64()
}

/// Publishes `n` messages to `topic` over TCP (each answered OK).
fn publish(b: &Broker, topic: &str, n: usize) {
    let mut s = b.connect_v2();
    for i in 0..n {
        send(&mut s, &pub_cmd(topic, format!("m{i}").as_bytes()));
        expect_ok(&mut s);
    }
}

/// A consumer of `topic`/`channel` with RDY `rdy` (SUB answered OK).
fn consumer(b: &Broker, topic: &str, channel: &str, rdy: u32) -> TcpStream {
    let mut s = b.connect_v2();
    send(&mut s, format!("SUB {topic} {channel}\n").as_bytes());
    expect_ok(&mut s);
    send(&mut s, format!("RDY {rdy}\n").as_bytes());
    s
}

/// Reads the next message and FINs it; returns its body.
fn take_and_fin(s: &mut TcpStream) -> Vec<u8> {
    let (ft, data) = read_frame_skip_hb(s).unwrap();
    assert_eq!(ft, 2, "expected a message, got {}", show(&data));
    let (_, _, id, body) = parse_message(&data);
    send(s, format!("FIN {id}\n").as_bytes());
    body
}

fn create_channel(b: &Broker, topic: &str, channel: &str) {
    assert_eq!(
        b.http("POST", &format!("/topic/create?topic={topic}"), b"")
            .0,
        200
    );
    let path = format!("/channel/create?topic={topic}&channel={channel}");
    assert_eq!(b.http("POST", &path, b"").0, 200);
}

fn put(b: &Broker, what: &str) -> (u16, Vec<u8>) {
    b.http("PUT", &format!("/config/{what}"), b"")
}

/// Refusals on the wire while draining, byte-exact, with 1, 2 and 4 shards; what
/// exists keeps working; `/info` says `"draining": true` (no such key before); the
/// process exits 0 once the last message is FINed.
#[test]
fn refusals_then_exit_after_last_fin() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let mut b = Broker::start(shards, &[]);
        create_channel(&b, "t", "c");
        publish(&b, "t", 3);
        assert!(info(b.http).get("draining").is_none(), "{}", info(b.http));

        assert_eq!(put(&b, "drain"), (200, Vec::new()));
        assert_eq!(info(b.http)["draining"], true);

        // TCP: every publishing command fails fatally with nsqd's E_*_FAILED framing.
        let mut s = b.connect_v2();
        send(&mut s, &pub_cmd("t", b"x"));
        expect_fatal(&mut s, "E_PUB_FAILED PUB failed draining");
        let mut s = b.connect_v2();
        send(&mut s, &mpub_cmd("t", &[b"x", b"y"]));
        expect_fatal(&mut s, "E_MPUB_FAILED MPUB failed draining");
        let mut s = b.connect_v2();
        let mut dpub = b"DPUB t 1000\n".to_vec();
        dpub.extend(sized(b"x"));
        send(&mut s, &dpub);
        expect_fatal(&mut s, "E_DPUB_FAILED DPUB failed draining");
        // A new topic too (nothing is created for it).
        let mut s = b.connect_v2();
        send(&mut s, &pub_cmd("fresh", b"x"));
        expect_fatal(&mut s, "E_PUB_FAILED PUB failed draining");

        // HTTP: 503 in nsqd's error style, exactly.
        let exiting = (503, br#"{"message":"EXITING"}"#.to_vec());
        assert_eq!(b.http("POST", "/pub?topic=t", b"x"), exiting);
        assert_eq!(b.http("POST", "/pub?topic=t&defer=1000", b"x"), exiting);
        assert_eq!(b.http("POST", "/mpub?topic=t", b"x\ny\n"), exiting);
        assert_eq!(b.http("POST", "/topic/create?topic=fresh", b""), exiting);
        assert_eq!(
            b.http("POST", "/channel/create?topic=t&channel=new", b""),
            exiting
        );
        // What exists is still there to use.
        assert_eq!(b.http("POST", "/topic/create?topic=t", b"").0, 200);
        assert_eq!(
            b.http("POST", "/channel/create?topic=t&channel=c", b"").0,
            200
        );

        // SUB to a new topic or channel: a fatal error; to an existing one: OK.
        let mut s = b.connect_v2();
        send(&mut s, b"SUB fresh c\n");
        expect_fatal(
            &mut s,
            "E_NSQD_DRAINING SUB create channel fresh:c failed. nsqd is draining",
        );
        let mut s = b.connect_v2();
        send(&mut s, b"SUB t other\n");
        expect_fatal(
            &mut s,
            "E_NSQD_DRAINING SUB create channel t:other failed. nsqd is draining",
        );
        let stats = b.stats();
        let names: Vec<_> = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic_name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(names, ["t"], "nothing new was created");
        assert_eq!(channel_counts(&b, "t", "other"), None);

        // The consumer gets the whole backlog; the broker waits for the last FIN.
        let mut c = consumer(&b, "t", "c", 1);
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(take_and_fin(&mut c));
        }
        assert!(b.daemon.exited().is_none(), "exited with a message left");
        assert_eq!(info(b.http)["draining"], true);
        got.push(take_and_fin(&mut c));
        got.sort();
        assert_eq!(got, [b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec()]);
        let st = b
            .daemon
            .wait_exit(EXIT_WITHIN)
            .expect("exits after the drain");
        assert!(st.success(), "exit status {st:?}");
        assert!(b.daemon.log_contains("NSQ: drain complete"));
    });
}

/// `PUT /config/shutdown` during a drain shuts down cleanly at once (exit 0): the
/// channel's undelivered messages are kept, and a restart on the same data path finds
/// them (checkpointed as on SIGTERM). A second `PUT /config/drain` changes nothing.
#[test]
fn shutdown_during_drain_keeps_the_backlog() {
    let mut b = Broker::start(2, &[]);
    create_channel(&b, "t", "c");
    publish(&b, "t", 5);
    assert_eq!(put(&b, "drain"), (200, Vec::new()));
    assert_eq!(put(&b, "drain"), (200, Vec::new()));
    assert_eq!(info(b.http)["draining"], true);
    assert!(b.daemon.exited().is_none());
    assert_eq!(put(&b, "shutdown"), (200, Vec::new()));
    let st = b.daemon.wait_exit(EXIT_WITHIN).expect("exits");
    assert!(st.success(), "exit status {st:?}");

    let dir = b.data_dir.clone();
    let b2 = Broker::start_in(&dir, 2, &[]);
    assert_eq!(channel_counts(&b2, "t", "c"), Some((5, 0, 0)));
    assert!(
        info(b2.http).get("draining").is_none(),
        "a restart does not drain"
    );
}

/// A drain started by `PUT /config/drain` on a node with the default `--sigterm` is not
/// cut short by SIGTERM (a supervisor's stop): the node still exits only once the
/// backlog is consumed.
#[test]
fn sigterm_after_an_http_drain_does_not_cut_it_short() {
    let mut b = Broker::start(2, &[]);
    create_channel(&b, "t", "c");
    publish(&b, "t", 2);
    assert_eq!(put(&b, "drain"), (200, Vec::new()));
    b.daemon.signal(15);
    wait_for("the SIGTERM logged", || {
        b.daemon.log_contains("SIGTERM during the drain")
    });
    assert!(b.daemon.exited().is_none(), "SIGTERM ended the drain");
    let mut c = consumer(&b, "t", "c", 10);
    for _ in 0..2 {
        take_and_fin(&mut c);
    }
    let st = b
        .daemon
        .wait_exit(EXIT_WITHIN)
        .expect("exits after the drain");
    assert!(st.success(), "exit status {st:?}");
}

/// `PUT /config/shutdown` without a drain: a clean shutdown, exit 0.
#[test]
fn shutdown_without_drain() {
    let mut b = Broker::start(1, &[]);
    publish(&b, "t", 1);
    assert_eq!(put(&b, "shutdown"), (200, Vec::new()));
    let st = b.daemon.wait_exit(EXIT_WITHIN).expect("exits");
    assert!(st.success(), "exit status {st:?}");
}

/// A topic with messages but no channel does not hold the drain (nothing could consume
/// them: no channel may be created while draining); its messages stay in the data path
/// and a restart finds them. A node without anything to deliver exits at once.
#[test]
fn topic_without_channels_does_not_hold_the_drain() {
    let mut b = Broker::start(2, &[]);
    publish(&b, "orphan", 4);
    assert_eq!(put(&b, "drain").0, 200);
    let st = b.daemon.wait_exit(EXIT_WITHIN).expect("exits");
    assert!(st.success(), "exit status {st:?}");
    assert!(
        b.daemon
            .log_contains("4 message(s) of topics without channels stay in the data path"),
        "{}",
        b.daemon.log_text()
    );
    let b2 = Broker::start_in(&b.data_dir.clone(), 2, &[]);
    assert_eq!(topic_depth(&b2, "orphan"), Some(4));
}

/// The next datagram on the notify socket, if one comes within 30 s.
fn notify_recv(sock: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 4096];
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).trim().to_string())
}

/// A broker with `--sigterm=drain` under a systemd-like notify socket.
fn drain_on_sigterm_broker(dir: &std::path::Path) -> (Broker, UnixDatagram, PathBuf) {
    let sock_path = dir.join("notify.sock");
    let _ = std::fs::remove_file(&sock_path);
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    let b = Broker::start_in_cmd(dir, 2, &["--sigterm=drain"], |cmd: &mut Command| {
        cmd.env("NOTIFY_SOCKET", &sock_path);
    });
    assert_eq!(notify_recv(&sock).as_deref(), Some("READY=1"));
    (b, sock, sock_path)
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nsqd-drain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--sigterm=drain`: SIGTERM starts the drain and tells systemd `STOPPING=1` at once;
/// a second SIGTERM changes nothing (the drain goes on); the consumer takes the backlog
/// and the process exits 0.
#[test]
fn sigterm_drains_and_a_second_sigterm_does_not_cut_it_short() {
    let dir = fresh_dir("sigterm");
    let (mut b, sock, _) = drain_on_sigterm_broker(&dir);
    create_channel(&b, "t", "c");
    publish(&b, "t", 3);
    assert_eq!(
        b.http("GET", "/config/sigterm", b""),
        (200, b"drain".to_vec())
    );
    b.daemon.signal(15);
    assert_eq!(notify_recv(&sock).as_deref(), Some("STOPPING=1"));
    wait_for("/info draining", || info(b.http)["draining"] == true);
    // Refused at once, whichever shard owns the topic.
    let mut s = b.connect_v2();
    send(&mut s, &pub_cmd("t", b"late"));
    expect_fatal(&mut s, "E_PUB_FAILED PUB failed draining");
    b.daemon.signal(15);
    wait_for("the second SIGTERM logged", || {
        b.daemon.log_contains("SIGTERM during the drain")
    });
    assert!(
        b.daemon.exited().is_none(),
        "a second SIGTERM ended the drain"
    );
    let mut c = consumer(&b, "t", "c", 10);
    for _ in 0..3 {
        take_and_fin(&mut c);
    }
    let st = b
        .daemon
        .wait_exit(EXIT_WITHIN)
        .expect("exits after the drain");
    assert!(st.success(), "exit status {st:?}");
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGINT during a drain shuts down cleanly at once (exit 0), messages kept.
#[test]
fn sigint_during_drain_shuts_down_now() {
    let dir = fresh_dir("sigint");
    let (mut b, _sock, _) = drain_on_sigterm_broker(&dir);
    create_channel(&b, "t", "c");
    publish(&b, "t", 2);
    b.daemon.signal(15);
    wait_for("/info draining", || info(b.http)["draining"] == true);
    b.daemon.signal(2);
    let st = b.daemon.wait_exit(EXIT_WITHIN).expect("exits on SIGINT");
    assert!(st.success(), "exit status {st:?}");
    drop(b);
    let b2 = Broker::start_in(&dir, 2, &[]);
    assert_eq!(channel_counts(&b2, "t", "c"), Some((2, 0, 0)));
    drop(b2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--sigterm` takes `clean-shutdown` (the default, /config shows it) or `drain`; the
/// config file's `sigterm` too; anything else fails the start.
#[test]
fn sigterm_option_values() {
    let b = Broker::start(1, &[]);
    assert_eq!(
        b.http("GET", "/config/sigterm", b""),
        (200, b"clean-shutdown".to_vec())
    );
    assert_eq!(b.http("GET", "/config/drain", b"").0, 400);
    drop(b);

    let dir = fresh_dir("cfg");
    let cfg = dir.join("nsqd.cfg");
    std::fs::write(&cfg, "sigterm = \"drain\"\n").unwrap();
    let b = Broker::start(1, &[&format!("--config={}", cfg.display())]);
    assert_eq!(
        b.http("GET", "/config/sigterm", b""),
        (200, b"drain".to_vec())
    );
    drop(b);

    let out = Command::new(env!("CARGO_BIN_EXE_nsqd"))
        .arg("--sigterm=later")
        .output()
        .unwrap();
    assert!(!out.status.success());
    std::fs::write(&cfg, "sigterm = \"later\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nsqd"))
        .arg(format!("--config={}", cfg.display()))
        .arg(format!("--data-path={}", dir.display()))
        .arg("--tcp-address=127.0.0.1:0")
        .arg("--http-address=127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"invalid sigterm="later" (valid: "clean-shutdown", "drain")"#),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// pynsq consumers receive a 2,000-message backlog while a pynsq producer is refused
/// with E_PUB_FAILED (scripts/clients/pynsq_drain.py); the broker then exits 0.
#[test]
fn pynsq_consumers_drain_the_backlog_while_the_producer_is_refused() {
    let Some(py) = common::pynsq_python() else {
        return;
    };
    for_each_shards(&[1, 4], |shards| {
        let mut b = Broker::start(shards, &[]);
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/clients/pynsq_drain.py");
        let out = Command::new(&py)
            .arg(script)
            .arg(b.tcp.to_string())
            .arg(b.http.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pynsq_drain.py failed:\n{}\nbroker log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            b.daemon.log_text()
        );
        let st = b
            .daemon
            .wait_exit(EXIT_WITHIN)
            .expect("exits after the drain");
        assert!(st.success(), "exit status {st:?}");
    });
}

/// A deferred message holds the drain until it falls due, is delivered and FINed; while
/// it is in flight the node stays up too.
#[test]
fn deferred_and_in_flight_messages_hold_the_drain() {
    let mut b = Broker::start(2, &[]);
    create_channel(&b, "t", "c");
    let mut p = b.connect_v2();
    let mut dpub = b"DPUB t 1000\n".to_vec();
    dpub.extend(sized(b"later"));
    send(&mut p, &dpub);
    expect_ok(&mut p);
    assert_eq!(channel_counts(&b, "t", "c"), Some((0, 0, 1)));
    let mut c = consumer(&b, "t", "c", 1);
    assert_eq!(put(&b, "drain").0, 200);
    let (ft, data) = read_frame_skip_hb(&mut c).unwrap();
    assert_eq!(ft, 2);
    let (_, _, id, body) = parse_message(&data);
    assert_eq!(body, b"later");
    // In flight now: the node waits for its FIN.
    assert_eq!(channel_counts(&b, "t", "c"), Some((0, 1, 0)));
    assert!(
        b.daemon.exited().is_none(),
        "exited with a message in flight"
    );
    send(&mut c, format!("FIN {id}\n").as_bytes());
    let st = b
        .daemon
        .wait_exit(EXIT_WITHIN)
        .expect("exits after the FIN");
    assert!(st.success(), "exit status {st:?}");
}
