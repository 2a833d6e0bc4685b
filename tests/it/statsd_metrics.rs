//! What monitoring reads from the broker:
//!
//! * statsd: a UDP listener receives nsqd's metric names (`<prefix>topic.<t>...`,
//!   counters as deltas, gauges, `mem.*`) every `--statsd-interval`, in packets of at most
//!   `--statsd-udp-packet-size` bytes, with nsqd's prefix rules and the
//!   `--statsd-mem-stats` / `--statsd-exclude-ephemeral` switches;
//! * GET /metrics parses as Prometheus text (the `prometheus-parse` crate, plus a strict
//!   line check, since that parser skips lines it does not understand);
//! * GET /stats?format=json has every key nsqadmin reads (nsqadmin: clusterinfo/types.go).
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::{expect_ok, pub_cmd, send, Broker};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Receives statsd packets until `done` says so (or 10 s pass); checks each packet's
/// size and framing and returns every line.
fn collect(
    sock: &UdpSocket,
    max_packet: usize,
    mut done: impl FnMut(&[String]) -> bool,
) -> Vec<String> {
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 65536];
    while !done(&lines) {
        assert!(
            Instant::now() < deadline,
            "statsd: timed out; got {lines:#?}"
        );
        let Ok(n) = sock.recv(&mut buf) else { continue };
        let p = &buf[..n];
        assert!(n <= max_packet, "packet of {n} bytes > {max_packet}");
        assert!(p.ends_with(b"\n"), "packet not ending in a newline: {p:?}");
        for l in std::str::from_utf8(p).unwrap().lines() {
            lines.push(l.to_string());
        }
    }
    lines
}

/// `<prefix><name>:<int>|c` or `|g` → (name, value, kind).
fn parse_line<'a>(l: &'a str, prefix: &str) -> (&'a str, i64, &'a str) {
    let rest = l
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{l:?} does not start with {prefix:?}"));
    let (name, v) = rest.rsplit_once(':').unwrap();
    let (v, kind) = v.split_once('|').unwrap();
    assert!(kind == "c" || kind == "g", "{l}");
    (name, v.parse().unwrap_or_else(|_| panic!("{l}")), kind)
}

fn sum_counter(lines: &[String], prefix: &str, name: &str) -> i64 {
    lines
        .iter()
        .map(|l| parse_line(l, prefix))
        .filter(|(n, _, k)| *n == name && *k == "c")
        .map(|(_, v, _)| v)
        .sum()
}

/// A UDP socket standing in for statsd (reads time out after 200 ms) and a broker with
/// `shards` shards pushing to it every second, with `extra` flags.
fn statsd_broker(shards: usize, extra: &[&str]) -> (UdpSocket, Broker) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let address = format!("--statsd-address={}", sock.local_addr().unwrap());
    let mut args = vec![address.as_str(), "--statsd-interval=1s"];
    args.extend_from_slice(extra);
    let b = Broker::start(shards, &args);
    (sock, b)
}

#[test]
fn statsd_pushes_nsqd_metric_names() {
    let (sock, b) = statsd_broker(2, &["--broadcast-address=stats.host"]);
    let prefix = format!("nsq.stats_host_{}.", b.http.port());
    let (code, body) = b.http("GET", "/config/statsd_prefix", b"");
    assert_eq!(
        (code, String::from_utf8_lossy(&body).to_string()),
        (200, prefix.clone())
    );
    b.post_ok("/topic/create?topic=st");
    b.post_ok("/channel/create?topic=st&channel=ch");
    b.post_ok("/channel/create?topic=st&channel=e%23ephemeral");
    for _ in 0..3 {
        let (code, _) = b.http("POST", "/pub?topic=st", b"abc");
        assert_eq!(code, 200);
    }
    // A push ends with mem.gc_runs.
    let lines = collect(&sock, 508, |ls| {
        sum_counter(ls, &prefix, "topic.st.message_count") == 3
            && sum_counter(ls, &prefix, "topic.st.channel.ch.message_count") == 3
            && ls.last().is_some_and(|l| l.contains("mem.gc_runs:"))
    });
    let names: BTreeSet<&str> = lines.iter().map(|l| parse_line(l, &prefix).0).collect();
    for n in [
        "topic.st.message_count",
        "topic.st.message_bytes",
        "topic.st.depth",
        "topic.st.backend_depth",
        "topic.st.channel.ch.message_count",
        "topic.st.channel.ch.depth",
        "topic.st.channel.ch.backend_depth",
        "topic.st.channel.ch.in_flight_count",
        "topic.st.channel.ch.deferred_count",
        "topic.st.channel.ch.requeue_count",
        "topic.st.channel.ch.timeout_count",
        "topic.st.channel.ch.clients",
        "topic.st.channel.e#ephemeral.depth",
        "mem.heap_objects",
        "mem.heap_idle_bytes",
        "mem.heap_in_use_bytes",
        "mem.heap_released_bytes",
        "mem.gc_pause_usec_100",
        "mem.gc_pause_usec_99",
        "mem.gc_pause_usec_95",
        "mem.next_gc_bytes",
        "mem.gc_runs",
    ] {
        assert!(names.contains(n), "no {n} in {lines:#?}");
    }
    assert!(
        !names
            .iter()
            .any(|n| n.contains("fin_latency") || n.contains("oldest_unfinished")),
        "lag gauges only with --channel-lag-stats"
    );
    assert_eq!(sum_counter(&lines, &prefix, "topic.st.message_bytes"), 9);
    // Gauges are values, not deltas; the kinds are nsqd's.
    let last: BTreeMap<&str, (i64, &str)> = lines
        .iter()
        .map(|l| parse_line(l, &prefix))
        .map(|(n, v, k)| (n, (v, k)))
        .collect();
    assert_eq!(last["topic.st.channel.ch.depth"], (3, "g"));
    assert_eq!(last["topic.st.channel.ch.clients"], (0, "g"));
    assert_eq!(last["topic.st.depth"].1, "g");
    assert_eq!(last["mem.gc_runs"].1, "c");
    assert!(last["mem.heap_in_use_bytes"].0 > 0);
    // Counters are deltas: the next pushes report 0 new messages.
    let more = collect(&sock, 508, |ls| {
        ls.iter()
            .filter(|l| l.contains("topic.st.message_count:"))
            .count()
            >= 2
    });
    for l in more.iter().filter(|l| l.contains(".message_count:")) {
        assert!(l.ends_with(":0|c"), "{l}");
    }
}

#[test]
fn statsd_prefix_exclusions_and_packet_size() {
    let (sock, b) = statsd_broker(
        1,
        &[
            "--broadcast-address=10.0.0.1",
            "--statsd-prefix=custom.%s.x",
            "--statsd-mem-stats=false",
            "--statsd-exclude-ephemeral",
            "--statsd-udp-packet-size=100",
        ],
    );
    // `.` and `:` of "<address>:<port>" become `_`, and a trailing `.` is added.
    let prefix = format!("custom.10_0_0_1_{}.x.", b.http.port());
    b.post_ok("/topic/create?topic=a%23ephemeral");
    b.post_ok("/channel/create?topic=a%23ephemeral&channel=c");
    b.post_ok("/topic/create?topic=b");
    b.post_ok("/channel/create?topic=b&channel=c%23ephemeral");
    b.post_ok("/channel/create?topic=b&channel=d");
    let lines = collect(&sock, 100, |ls| {
        ls.iter().any(|l| l.contains("topic.b.channel.d.clients"))
    });
    for l in &lines {
        parse_line(l, &prefix);
        assert!(!l.contains("ephemeral"), "{l}");
        assert!(!l.contains("mem."), "{l}");
    }
}

// ---------------------------------------------------------------------------------------
// /metrics and /stats
// ---------------------------------------------------------------------------------------

/// A consumer of topic/channel (SUB + RDY) and a producer that published `n` messages.
fn traffic(
    b: &Broker,
    topic: &str,
    channel: &str,
    n: usize,
) -> (std::net::TcpStream, std::net::TcpStream) {
    let mut c = b.connect_v2();
    send(&mut c, format!("SUB {topic} {channel}\n").as_bytes());
    expect_ok(&mut c);
    send(&mut c, b"RDY 1\n");
    let mut p = b.connect_v2();
    for i in 0..n {
        send(&mut p, &pub_cmd(topic, format!("m{i}").as_bytes()));
        expect_ok(&mut p);
    }
    (c, p)
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let b = Broker::start(2, &[]);
    b.post_ok("/topic/create?topic=idle");
    let _conns = traffic(&b, "prom", "ch", 5);
    // wait until the consumer has one message in flight
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = b.stats();
        let ch = s["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic_name"] == "prom")
            .map(|t| t["channels"][0]["in_flight_count"].clone());
        if ch == Some(serde_json::json!(1)) {
            break;
        }
        assert!(Instant::now() < deadline, "no message in flight: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let raw = b.http_raw("GET", "/metrics", b"");
    let head = String::from_utf8_lossy(&raw).to_string();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    let (_, body) = common::split_http(&raw);
    let text = String::from_utf8(body).expect("utf-8");

    // Strict line grammar: comments are HELP or TYPE, every other line is
    // `name{labels} value`, and each family has its TYPE before its samples.
    let mut typed = BTreeMap::new();
    let mut sample_lines = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut it = rest.splitn(3, ' ');
            match (it.next(), it.next(), it.next()) {
                (Some("HELP"), Some(_), Some(_)) => {}
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(
                        ["counter", "gauge", "untyped", "histogram", "summary"].contains(&kind),
                        "{line}"
                    );
                    assert!(
                        typed.insert(name.to_string(), kind.to_string()).is_none(),
                        "TYPE twice: {line}"
                    );
                }
                _ => panic!("bad comment line {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "empty line in /metrics");
        let name_end = line.find(['{', ' ']).expect(line);
        let name = &line[..name_end];
        assert!(
            name.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphabetic()
                    || c == '_'
                    || c == ':'
                    || (i > 0 && c.is_ascii_digit())),
            "bad metric name {name:?}"
        );
        assert!(typed.contains_key(name), "sample before its TYPE: {line}");
        let value = line.rsplit_once(' ').unwrap().1;
        assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
        sample_lines += 1;
    }

    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("prometheus-parse");
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "lines the parser skipped"
    );
    let find = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref v => panic!("{metric}: {v:?}"),
        }
    };
    assert_eq!(find("nsq_topic_messages_total", &[("topic", "prom")]), 5.0);
    assert_eq!(find("nsq_topic_depth", &[("topic", "idle")]), 0.0);
    let ch = [("topic", "prom"), ("channel", "ch")];
    assert_eq!(find("nsq_channel_in_flight", &ch), 1.0);
    assert_eq!(find("nsq_channel_depth", &ch), 4.0);
    assert_eq!(find("nsq_channel_clients", &ch), 1.0);
    assert!(matches!(
        scrape
            .samples
            .iter()
            .find(|s| s.metric == "nsq_topic_messages_total")
            .unwrap()
            .value,
        prometheus_parse::Value::Counter(_)
    ));
    // one series per shard
    let shards: BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "nsq_shard_topics")
        .filter_map(|s| s.labels.get("shard"))
        .collect();
    assert_eq!(shards, ["0", "1"].into());
    assert!(find("process_resident_memory_bytes", &[]) > 0.0);
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn assert_has(v: &serde_json::Value, want: &[&str], what: &str) {
    let k = keys(v);
    for w in want {
        assert!(k.contains(*w), "{what} has no {w:?}: {v}");
    }
}

/// Every key nsqadmin reads from /stats?format=json (and /info), with the right types.
#[test]
fn stats_json_has_what_nsqadmin_reads() {
    let b = Broker::start(2, &[]);
    let _conns = traffic(&b, "adm", "ch", 2);
    // Some of that traffic counted before the stats are read.
    std::thread::sleep(Duration::from_millis(200));
    let s = b.stats();
    assert_has(
        &s,
        &[
            "version",
            "health",
            "start_time",
            "topics",
            "memory",
            "producers",
        ],
        "stats",
    );
    assert_eq!(s["version"], "1.3.0");
    assert_eq!(s["health"], "OK");
    let t = s["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["topic_name"] == "adm")
        .expect("topic adm");
    assert_has(
        t,
        &[
            "topic_name",
            "channels",
            "depth",
            "backend_depth",
            "message_count",
            "message_bytes",
            "paused",
            "e2e_processing_latency",
        ],
        "topic",
    );
    assert_eq!(t["message_count"], 2);
    assert_has(
        &t["e2e_processing_latency"],
        &["count", "percentiles"],
        "e2e",
    );
    let c = &t["channels"][0];
    assert_has(
        c,
        &[
            "channel_name",
            "depth",
            "backend_depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "message_count",
            "client_count",
            "clients",
            "paused",
            "e2e_processing_latency",
        ],
        "channel",
    );
    assert_eq!(c["client_count"], 1);
    let cl = &c["clients"][0];
    let client_keys = [
        "client_id",
        "hostname",
        "version",
        "remote_address",
        "state",
        "ready_count",
        "in_flight_count",
        "message_count",
        "finish_count",
        "requeue_count",
        "connect_ts",
        "sample_rate",
        "deflate",
        "snappy",
        "user_agent",
        "tls",
        "tls_cipher_suite",
        "tls_version",
        "tls_negotiated_protocol",
        "tls_negotiated_protocol_is_mutual",
    ];
    assert_has(cl, &client_keys, "client");
    assert_eq!(cl["version"], "V2");
    assert!(cl["connect_ts"].as_i64().unwrap() > 0);
    let p = &s["producers"][0];
    assert_has(p, &client_keys, "producer");
    assert_has(
        &s["memory"],
        &[
            "heap_objects",
            "heap_idle_bytes",
            "heap_in_use_bytes",
            "heap_released_bytes",
            "gc_pause_usec_100",
            "gc_pause_usec_99",
            "gc_pause_usec_95",
            "next_gc_bytes",
            "gc_total_runs",
        ],
        "memory",
    );
    // nsqadmin's queries: include_clients=false, a topic filter, a topic+channel filter.
    let (code, body) = b.http("GET", "/stats?format=json&include_clients=false", b"");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let t = v["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["topic_name"] == "adm")
        .unwrap();
    assert!(t["channels"][0]["clients"].is_null());
    let (_, body) = b.http(
        "GET",
        "/stats?format=json&topic=adm&channel=ch&include_clients=false",
        b"",
    );
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["topics"].as_array().unwrap().len(), 1);
    assert_eq!(v["topics"][0]["channels"][0]["channel_name"], "ch");
    // /info: nsqadmin parses version as semver and reads the addresses and ports.
    let (_, body) = b.http("GET", "/info", b"");
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_has(
        &info,
        &[
            "version",
            "broadcast_address",
            "hostname",
            "http_port",
            "tcp_port",
        ],
        "info",
    );
    assert_eq!(info["http_port"], b.http.port());
    assert_eq!(info["tcp_port"], b.tcp.port());
    let _ = std::io::stdout().flush();
}

/// With `--channel-lag-stats` each channel also has its lag gauges (beyond nsqd): the
/// age of its oldest unfinished message grows while a message waits.
#[test]
fn statsd_pushes_channel_lag_with_the_flag() {
    let (sock, b) = statsd_broker(1, &["--broadcast-address=lag.host", "--channel-lag-stats"]);
    let prefix = format!("nsq.lag_host_{}.", b.http.port());
    b.post_ok("/topic/create?topic=lg");
    b.post_ok("/channel/create?topic=lg&channel=ch");
    assert_eq!(b.http("POST", "/pub?topic=lg", b"abc").0, 200);
    let age = |ls: &[String]| {
        ls.iter()
            .map(|l| parse_line(l, &prefix))
            .filter(|(n, _, k)| *n == "topic.lg.channel.ch.oldest_unfinished_age_ms" && *k == "g")
            .map(|(_, v, _)| v)
            .max()
    };
    // A push after the message has waited over a second.
    let lines = collect(&sock, 508, |ls| age(ls).is_some_and(|a| a >= 1000));
    let names: BTreeSet<&str> = lines.iter().map(|l| parse_line(l, &prefix).0).collect();
    for q in ["p50", "p99", "p999"] {
        let n = format!("topic.lg.channel.ch.fin_latency_{q}_ms");
        assert!(names.contains(n.as_str()), "no {n} in {lines:#?}");
    }
}
