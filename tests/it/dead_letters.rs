//! Maximum attempts and dead letters (beyond nsqd; docs/dead-letters-and-rate-limits.md)
//! over real TCP and HTTP: messages REQ'd or timed out past the maximum appear in
//! `<topic>.dead` with their bodies unchanged and are finished in their channel,
//! `dead_count` in /stats and /metrics, the per-channel override and its HTTP errors,
//! the override across a restart and a kill -9, nothing lost to a kill -9 while
//! messages are being dead-lettered, and a pynsq consumer that always fails.

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BAD_REQ: &str = "HTTP/1.1 400 Bad Request";
const NOT_FOUND: &str = "HTTP/1.1 404 Not Found";

/// Reads message frames from `s` (heartbeats skipped) until `n` have come.
fn read_messages(s: &mut TcpStream, n: usize) -> Vec<(u16, String, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(s).expect("a message");
            assert_eq!(ft, 2, "a message frame: {}", show(&data));
            let (_, attempts, id, body) = parse_message(&data);
            (attempts, id, body)
        })
        .collect()
}

/// Bodies of the first `n` messages a fresh consumer of `topic` gets (FIN'd).
fn consume_bodies(b: &Broker, topic: &str, n: usize) -> Vec<Vec<u8>> {
    let mut s = b.subscribe(topic, "inspect");
    send(&mut s, b"RDY 100\n");
    let got = read_messages(&mut s, n);
    for (_, id, _) in &got {
        send(&mut s, &line(&format!("FIN {id}")));
    }
    let mut bodies: Vec<Vec<u8>> = got.into_iter().map(|(_, _, b)| b).collect();
    bodies.sort();
    bodies
}

#[test]
fn messages_reqd_max_attempts_times_go_to_the_dead_letter_topic() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--max-attempts=3"]);
        let (code, body) = b.http("GET", "/config/max_attempts", b"");
        assert_eq!((code, show(&body)), (200, "3".to_string()), "in /config");
        let mut s = b.subscribe("orders", "billing");
        send(&mut s, b"RDY 10\n");
        let bodies: Vec<Vec<u8>> = (0..4).map(|i| format!("order-{i}").into_bytes()).collect();
        for body in &bodies {
            b.http_pub("orders", body);
        }
        // Every delivery fails (REQ 0) until the broker stops redelivering.
        let mut attempts: BTreeMap<Vec<u8>, u16> = BTreeMap::new();
        for _ in 0..bodies.len() * 3 {
            let (att, id, body) = read_messages(&mut s, 1).remove(0);
            let seen = attempts.entry(body).or_insert(0);
            *seen += 1;
            assert_eq!(att, *seen, "the frame's attempts count deliveries");
            assert!(att <= 3, "never delivered past --max-attempts");
            send(&mut s, &line(&format!("REQ {id} 0")));
        }
        assert!(attempts.values().all(|&a| a == 3), "{attempts:?}");
        b.wait_channel_field("orders", "billing", "dead_count", 4);
        let ch = b.channel_stats("orders", "billing").unwrap();
        assert_eq!(ch["max_attempts"], 3, "{ch}");
        assert_eq!(
            (ch["depth"].as_i64(), ch["in_flight_count"].as_i64()),
            (Some(0), Some(0)),
            "finished in the source channel: {ch}"
        );
        assert_no_frame(&mut s, Duration::from_millis(300));
        // The dead-letter topic is an ordinary topic (possibly on another shard).
        let mut want = bodies.clone();
        want.sort();
        assert_eq!(consume_bodies(&b, "orders.dead", 4), want);
        let (code, metrics) = b.http("GET", "/metrics", b"");
        assert_eq!(code, 200);
        let metrics = String::from_utf8_lossy(&metrics).into_owned();
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with("nsq_channel_dead_lettered_total{")
                    && l.contains("topic=\"orders\"")
                    && l.contains("channel=\"billing\"")
            })
            .unwrap_or_else(|| panic!("no dead-letter sample in /metrics:\n{metrics}"));
        assert!(line.ends_with(" 4"), "{line}");
    });
}

#[test]
fn a_timed_out_message_past_the_channel_maximum_is_dead_lettered() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--msg-timeout=1s"]);
        let mut s = b.subscribe("jobs", "w");
        b.admin("/channel/max-attempts?topic=jobs&channel=w&n=2");
        send(&mut s, b"RDY 5\n");
        b.http_pub("jobs", b"slow job");
        // Never answered: it times out twice, then goes to jobs.dead.
        for want in 1..=2 {
            let (att, _, body) = read_messages(&mut s, 1).remove(0);
            assert_eq!((att, body.as_slice()), (want, &b"slow job"[..]));
        }
        b.wait_channel_field("jobs", "w", "dead_count", 1);
        b.wait_channel_field("jobs", "w", "timeout_count", 2);
        assert_eq!(
            consume_bodies(&b, "jobs.dead", 1),
            vec![b"slow job".to_vec()]
        );
        // The dead-letter topic's own channels never dead-letter (no cascade).
        let dead = b.channel_stats("jobs.dead", "inspect").unwrap();
        assert!(dead.get("dead_count").is_none(), "{dead}");
    });
}

#[test]
fn without_max_attempts_messages_are_redelivered_as_nsqd_and_stats_have_no_extras() {
    let b = Broker::start(1, &[]);
    let mut s = b.subscribe("plain", "c");
    send(&mut s, b"RDY 1\n");
    b.http_pub("plain", b"x");
    for want in 1..=5u16 {
        let (att, id, _) = read_messages(&mut s, 1).remove(0);
        assert_eq!(att, want);
        send(&mut s, &line(&format!("REQ {id} 0")));
    }
    let ch = b.channel_stats("plain", "c").unwrap();
    assert!(
        ch.get("dead_count").is_none() && ch.get("max_attempts").is_none(),
        "{ch}"
    );
    assert!(b.topic_stats("plain.dead").is_none());
}

#[test]
fn max_attempts_endpoint_errors_in_order() {
    let b = Broker::start(1, &[]);
    b.admin("/topic/create?topic=t");
    b.admin("/channel/create?topic=t&channel=c");
    b.admin("/topic/create?topic=t.dead");
    b.admin("/channel/create?topic=t.dead&channel=c");
    let post = |q: &str| b.http_keepalive("POST", &format!("/channel/max-attempts{q}"), b"");
    assert_v1_error(&post(""), BAD_REQ, "MISSING_ARG_TOPIC");
    assert_v1_error(&post("?topic=bad!"), BAD_REQ, "INVALID_ARG_TOPIC");
    assert_v1_error(&post("?topic=t"), BAD_REQ, "MISSING_ARG_CHANNEL");
    assert_v1_error(
        &post("?topic=t&channel=bad!"),
        BAD_REQ,
        "INVALID_ARG_CHANNEL",
    );
    assert_v1_error(&post("?topic=t&channel=c"), BAD_REQ, "MISSING_ARG_N");
    for n in ["", "-1", "x", "65536", "1.5"] {
        assert_v1_error(
            &post(&format!("?topic=t&channel=c&n={n}")),
            BAD_REQ,
            "INVALID_ARG_N",
        );
    }
    for t in ["t.dead", "e#ephemeral", &"x".repeat(60)] {
        assert_v1_error(
            &post(&format!("?topic={t}&channel=c&n=1")),
            BAD_REQ,
            "DEAD_LETTER_UNAVAILABLE",
        );
    }
    assert_v1_error(
        &post("?topic=nope&channel=c&n=1"),
        NOT_FOUND,
        "TOPIC_NOT_FOUND",
    );
    assert_v1_error(
        &post("?topic=t&channel=nope&n=1"),
        NOT_FOUND,
        "CHANNEL_NOT_FOUND",
    );
    assert_v1_empty_ok(&post("?topic=t&channel=c&n=7"));
    assert_eq!(b.channel_stats("t", "c").unwrap()["max_attempts"], 7);
    assert_v1_empty_ok(&post("?topic=t&channel=c&n=0"));
    let ch = b.channel_stats("t", "c").unwrap();
    assert_eq!(
        (ch["max_attempts"].as_i64(), ch["dead_count"].as_i64()),
        (Some(0), Some(0))
    );
    assert_v1_empty_ok(&post("?topic=t&channel=c&n=default"));
    let ch = b.channel_stats("t", "c").unwrap();
    assert!(
        ch.get("max_attempts").is_none(),
        "follows the flag (unset): {ch}"
    );
    let (code, _) = b.http("GET", "/channel/max-attempts?topic=t&channel=c&n=1", b"");
    assert_eq!(code, 405);
}

#[test]
fn the_channel_maximum_survives_a_restart_and_a_kill_9() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let dir = ScratchDir::new("dead-letter-restart");
        let mut b = Broker::start_in(&dir, shards, &["--max-attempts=9"]);
        b.admin("/topic/create?topic=keep");
        b.admin("/channel/create?topic=keep&channel=a");
        b.admin("/channel/create?topic=keep&channel=b");
        b.admin("/channel/max-attempts?topic=keep&channel=a&n=2");
        b.terminate();
        let mut b = Broker::start_in(&dir, shards, &["--max-attempts=9"]);
        let max = |b: &Broker, c: &str| b.channel_stats("keep", c).unwrap()["max_attempts"].clone();
        assert_eq!((max(&b, "a"), max(&b, "b")), (2.into(), 9.into()));
        // Answered once the metadata is on disk: a crash right after keeps it.
        b.admin("/channel/max-attempts?topic=keep&channel=b&n=0");
        b.kill9();
        let b = Broker::start_in(&dir, shards, &["--max-attempts=9"]);
        assert_eq!((max(&b, "a"), max(&b, "b")), (2.into(), 0.into()));
        // And it applies: one failure is all channel a allows.
        let mut s = b.subscribe("keep", "a");
        send(&mut s, b"RDY 1\n");
        b.http_pub("keep", b"k");
        let (_, id, _) = read_messages(&mut s, 1).remove(0);
        send(&mut s, &line(&format!("REQ {id} 0")));
        let (_, id, _) = read_messages(&mut s, 1).remove(0);
        send(&mut s, &line(&format!("REQ {id} 0")));
        b.wait_channel_field("keep", "a", "dead_count", 1);
    });
}

#[test]
fn a_pynsq_handler_that_always_fails_dead_letters_every_message() {
    let Some(py) = crate::common::pynsq_python() else {
        return;
    };
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/clients/pynsq_dead_letter_scenario.py");
    for_each_shards(&[1, 4], |shards| {
        let b = Broker::start(shards, &["--max-attempts=3"]);
        let out = Command::new(&py)
            .arg(&script)
            .arg(b.tcp.to_string())
            .arg(b.http.to_string())
            .output()
            .expect("run the pynsq scenario");
        assert!(
            out.status.success(),
            "pynsq scenario failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

#[test]
fn a_kill_9_while_dead_lettering_loses_nothing() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let dir = ScratchDir::new("dead-letter-kill9");
        // Publishes are on disk when acknowledged (the default policy writes them up to
        // 100 ms later: a kill -9 before would lose the messages themselves).
        let flags = ["--max-attempts=1", "--sync-every=1"];
        let mut b = Broker::start_in(&dir, shards, &flags);
        let mut s = b.subscribe("crash", "c");
        send(&mut s, b"RDY 200\n");
        let bodies: Vec<Vec<u8>> = (0..200)
            .map(|i| format!("crash-{i:03}").into_bytes())
            .collect();
        let mut p = b.connect_v2();
        for chunk in bodies.chunks(50) {
            let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            send(&mut p, &mpub_cmd("crash", &refs));
            expect_ok(&mut p);
        }
        let got = read_messages(&mut s, 200);
        let reqs: Vec<u8> = got
            .iter()
            .flat_map(|(_, id, _)| line(&format!("REQ {id} 0")))
            .collect();
        // Every message fails once (its last attempt); the broker dies while it
        // dead-letters them.
        send(&mut s, &reqs);
        b.kill9();
        let b = Broker::start_in(&dir, shards, &flags);
        // A consumer that fails whatever is delivered to it again.
        let mut s = b.subscribe("crash", "c");
        send(&mut s, b"RDY 200\n");
        let failing = std::thread::spawn(move || {
            while let Ok((ft, data)) = read_frame_skip_hb(&mut s) {
                if ft == 2 {
                    let (_, _, id, _) = parse_message(&data);
                    send(&mut s, &line(&format!("REQ {id} 0")));
                }
            }
        });
        // Every message reaches crash.dead, some possibly twice.
        let mut d = b.subscribe("crash.dead", "audit");
        send(&mut d, b"RDY 500\n");
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < bodies.len() {
            let Ok((ft, data)) = read_frame_skip_hb(&mut d) else {
                panic!(
                    "{} of {} in crash.dead; source: {:?}; dead: {:?}",
                    seen.len(),
                    bodies.len(),
                    b.channel_stats("crash", "c"),
                    b.topic_stats("crash.dead")
                );
            };
            assert_eq!(ft, 2, "{}", show(&data));
            let (_, _, id, body) = parse_message(&data);
            send(&mut d, &line(&format!("FIN {id}")));
            seen.insert(body);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), bodies);
        eventually("the source channel holds nothing", || {
            b.channel_stats("crash", "c").is_some_and(|c| {
                c["depth"] == 0 && c["in_flight_count"] == 0 && c["deferred_count"] == 0
            })
        });
        drop(b);
        let _ = failing.join();
    });
}

#[test]
fn statsd_counts_dead_letters_of_channels_with_a_maximum() {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let b = Broker::start(
        2,
        &[
            &format!("--statsd-address={}", sock.local_addr().unwrap()),
            "--statsd-interval=1s",
            "--statsd-prefix=dl",
        ],
    );
    b.admin("/topic/create?topic=sd");
    b.admin("/channel/create?topic=sd&channel=other");
    let mut s = b.subscribe("sd", "c");
    b.admin("/channel/max-attempts?topic=sd&channel=c&n=1");
    send(&mut s, b"RDY 1\n");
    b.http_pub("sd", b"once");
    let (_, id, _) = read_messages(&mut s, 1).remove(0);
    send(&mut s, &line(&format!("REQ {id} 0")));
    b.wait_channel_field("sd", "c", "dead_count", 1);
    // Counters are deltas: their sum over the pushes is the count.
    let mut lines: Vec<String> = Vec::new();
    let mut buf = [0u8; 65536];
    let sum = |lines: &[String], name: &str| -> i64 {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("dl.{name}:")))
            .filter_map(|v| v.strip_suffix("|c"))
            .map(|v| v.parse::<i64>().unwrap())
            .sum()
    };
    eventually("statsd reports the dead letter", || {
        if let Ok(n) = sock.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            lines.extend(text.lines().map(String::from));
        }
        sum(&lines, "topic.sd.channel.c.dead_count") == 1
            && lines
                .iter()
                .any(|l| l.contains("topic.sd.channel.other.depth:"))
    });
    assert!(
        !lines.iter().any(|l| l.contains("channel.other.dead_count")),
        "a channel without a maximum has nsqd's lines only: {lines:#?}"
    );
}
