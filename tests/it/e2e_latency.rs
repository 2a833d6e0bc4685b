//! `--e2e-processing-latency-percentile` and `-window-time`: every FIN records the time
//! since the message was published, and `/stats` shows the percentiles per channel and,
//! merged, per topic (nsqd: channel.go FinishMessage, topic.go
//! AggregateChannelE2eProcessingLatency, internal/quantile). JSON:
//! `{"count":N,"percentiles":[{"quantile":1,"value":<ns>},...]}`; text: `e2e%: 1.2ms, ...`.

use crate::common;

use common::*;
use serde_json::Value;
use std::io::Write;

fn e2e<'a>(v: &'a Value, topic: &str, channel: Option<&str>) -> &'a Value {
    let t = v["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic_name"] == topic))
        .expect("topic");
    match channel {
        None => &t["e2e_processing_latency"],
        Some(c) => {
            let ch = t["channels"]
                .as_array()
                .and_then(|cs| cs.iter().find(|x| x["channel_name"] == c))
                .expect("channel");
            &ch["e2e_processing_latency"]
        }
    }
}

#[test]
fn fin_latencies_fill_stats() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(
            shards,
            &[
                "--e2e-processing-latency-percentile=0.5,1.0",
                "--e2e-processing-latency-window-time=10m",
            ],
        );
        // Topics on every shard (picked by the broker's hash), so some are owned by
        // another shard than the connection's.
        for topic in &topic_names("t", 4) {
            let mut s = b.connect_v2();
            s.write_all(format!("SUB {topic} c\nRDY 10\n").as_bytes())
                .unwrap();
            assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
            assert_eq!(
                b.http(
                    "POST",
                    &format!("/channel/create?topic={topic}&channel=idle"),
                    b""
                )
                .0,
                200
            );
            for i in 0..5 {
                let body = format!("m{i}");
                assert_eq!(
                    b.http("POST", &format!("/pub?topic={topic}"), body.as_bytes())
                        .0,
                    200
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            for _ in 0..5 {
                let (ft, data) = read_frame_skip_hb(&mut s).unwrap();
                assert_eq!(ft, 2, "a message");
                let id = std::str::from_utf8(&data[10..26]).unwrap().to_string();
                s.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
            }
            // A NOP round trip: every FIN before it has been handled.
            s.write_all(b"NOP\n").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));

            let st = b.stats();
            let c = e2e(&st, topic, Some("c"));
            assert_eq!(c["count"], 5, "shards={shards} {topic}: {c}");
            let ps = c["percentiles"].as_array().expect("percentiles");
            // Largest first, as nsqd sorts the flag's values; JSON `1`, not `1.0`.
            assert_eq!(ps.len(), 2);
            assert_eq!(ps[0]["quantile"].to_string(), "1");
            assert_eq!(ps[1]["quantile"].to_string(), "0.5");
            let max = ps[0]["value"].as_i64().expect("ns");
            let median = ps[1]["value"].as_i64().expect("ns");
            assert!(
                (20_000_000..60_000_000_000).contains(&max) && median > 0,
                "{c}"
            );
            // A channel with no FIN yet: zeros. The topic merges its channels.
            let idle = e2e(&st, topic, Some("idle"));
            assert_eq!(
                idle.to_string(),
                r#"{"count":0,"percentiles":[{"quantile":1,"value":0},{"quantile":0.5,"value":0}]}"#
            );
            let t = e2e(&st, topic, None);
            assert_eq!(t["count"], 5, "{t}");
            assert_eq!(t["percentiles"][0]["value"], max);

            let (_, text) = b.http("GET", &format!("/stats?topic={topic}"), b"");
            let text = String::from_utf8_lossy(&text);
            let line = text
                .lines()
                .find(|l| l.contains("[c ") && l.contains("e2e%: "))
                .unwrap_or_else(|| panic!("{text}"));
            let values = line.split("e2e%: ").nth(1).unwrap_or("");
            assert_eq!(values.split(", ").count(), 2, "{line}");
            assert!(values.ends_with("ms") || values.ends_with("us"), "{line}");
        }
        // A topic without channels has no stream.
        assert_eq!(b.http("POST", "/topic/create?topic=empty", b"").0, 200);
        let st = b.stats();
        assert_eq!(
            e2e(&st, "empty", None).to_string(),
            r#"{"count":0,"percentiles":null}"#
        );
    });
}

/// The statsd push carries the percentiles as gauges (nsqd: statsd.go
/// `topic.<t>.e2e_processing_latency_<q*100>` and `topic.<t>.channel.<c>...`).
#[test]
fn statsd_gauges() {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let b = Broker::start(
        2,
        &[
            "--e2e-processing-latency-percentile=0.99",
            &format!("--statsd-address={}", sock.local_addr().unwrap()),
            "--statsd-interval=1s",
            "--statsd-prefix=",
        ],
    );
    let mut s = b.connect_v2();
    s.write_all(b"SUB st c\nRDY 1\n").unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
    assert_eq!(b.http("POST", "/pub?topic=st", b"x").0, 200);
    let (ft, data) = read_frame_skip_hb(&mut s).unwrap();
    assert_eq!(ft, 2);
    let id = std::str::from_utf8(&data[10..26]).unwrap().to_string();
    s.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
    let want = [
        "topic.st.e2e_processing_latency_99:",
        "topic.st.channel.c.e2e_processing_latency_99:",
    ];
    let mut seen = [false; 2];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut buf = [0u8; 2048];
    while seen.contains(&false) && std::time::Instant::now() < deadline {
        let Ok(n) = sock.recv(&mut buf) else { break };
        for line in String::from_utf8_lossy(&buf[..n]).lines() {
            for (i, w) in want.iter().enumerate() {
                if let Some(v) = line.strip_prefix(w) {
                    let ns: i64 = v.trim_end_matches("|g").parse().unwrap_or(0);
                    seen[i] |= ns > 0;
                }
            }
        }
    }
    assert_eq!(seen, [true, true]);
}
