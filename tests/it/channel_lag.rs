//! `--channel-lag-stats` (beyond nsqd): each channel's lag in time in `/stats`
//! (`oldest_unfinished_age_ms`, `fin_latency` {count, p50, p99, p999} in ns) and
//! `/metrics`; without the flag `/stats` has nsqd's keys only.

use crate::common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::time::{Duration, Instant};

/// The channel `c` of `topic` in a `/stats?format=json` answer.
fn channel(b: &Broker, topic: &str, c: &str) -> Value {
    let st = b.stats();
    let t = st["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic_name"] == topic))
        .unwrap_or_else(|| panic!("no topic {topic}: {st}"));
    t["channels"]
        .as_array()
        .and_then(|cs| cs.iter().find(|x| x["channel_name"] == c))
        .unwrap_or_else(|| panic!("no channel {c}: {st}"))
        .clone()
}

/// Polls the channel's stats until `cond` holds (30 s at most); returns them.
fn wait_for(b: &Broker, topic: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = channel(b, topic, "c");
        if cond(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "{topic}: {what}: {c}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn age(c: &Value) -> u64 {
    c["oldest_unfinished_age_ms"].as_u64().expect("age")
}

/// The age grows while a message waits and while it is in flight, goes to 0 after its
/// FIN, and the FIN latency percentiles reflect how long the consumer held it.
#[test]
fn age_grows_while_waiting_and_fin_latency_reflects_the_hold() {
    const HOLD: Duration = Duration::from_millis(300);
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--channel-lag-stats"]);
        // Topics on every shard, so some are owned by another shard than the one the
        // HTTP request lands on.
        for topic in &topic_names("lag", shards) {
            let path = format!("/topic/create?topic={topic}");
            assert_eq!(b.http("POST", &path, b"").0, 200);
            let path = format!("/channel/create?topic={topic}&channel=c");
            assert_eq!(b.http("POST", &path, b"").0, 200);
            let c = channel(&b, topic, "c");
            assert_eq!(age(&c), 0, "nothing unfinished: {c}");
            assert_eq!(c["fin_latency"]["count"], 0, "{c}");
            let path = format!("/pub?topic={topic}");
            assert_eq!(b.http("POST", &path, b"hello").0, 200);
            // Waiting: the age passes the hold (it counts from the publish).
            wait_for(&b, topic, "age grows while waiting", |c| {
                age(c) >= HOLD.as_millis() as u64
            });

            let mut s = b.connect_v2();
            s.write_all(format!("SUB {topic} c\nRDY 1\n").as_bytes())
                .unwrap();
            assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
            let (ft, data) = read_frame_skip_hb(&mut s).unwrap();
            assert_eq!(ft, 2, "a message");
            let id = std::str::from_utf8(&data[10..26]).unwrap().to_string();
            // In flight: still unfinished, older than the hold.
            let c = channel(&b, topic, "c");
            assert!(age(&c) >= HOLD.as_millis() as u64, "{c}");
            std::thread::sleep(HOLD);
            s.write_all(format!("FIN {id}\n").as_bytes()).unwrap();

            let c = wait_for(&b, topic, "FIN counted", |c| c["fin_latency"]["count"] == 1);
            assert_eq!(age(&c), 0, "finished: {c}");
            let hold = HOLD.as_nanos() as u64;
            for q in ["p50", "p99", "p999"] {
                let v = c["fin_latency"][q].as_u64().expect("ns");
                // At least the hold (less the histogram's 1%), at most three holds.
                assert!(v >= hold * 99 / 100 && v <= 3 * hold, "{q} = {v} ns: {c}");
            }

            let (code, metrics) = b.http("GET", "/metrics", b"");
            assert_eq!(code, 200);
            let metrics = String::from_utf8_lossy(&metrics);
            let line = metrics
                .lines()
                .find(|l| {
                    l.starts_with("nsq_channel_fin_latency_p50_seconds{")
                        && l.contains(&format!("topic=\"{topic}\""))
                })
                .unwrap_or_else(|| panic!("{metrics}"));
            let secs: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!((0.29..=0.9).contains(&secs), "{line}");
            assert!(metrics.contains("# TYPE nsq_channel_oldest_unfinished_age_seconds gauge"));
        }
    });
}

/// Without the flag a channel has nsqd's keys only, and /metrics no lag families.
#[test]
fn without_the_flag_stats_have_nsqds_keys_only() {
    let b = Broker::start(1, &[]);
    assert_eq!(b.http("POST", "/topic/create?topic=t", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=t&channel=c", b"").0,
        200
    );
    assert_eq!(b.http("POST", "/pub?topic=t", b"x").0, 200);
    let c = channel(&b, "t", "c");
    assert!(c.get("oldest_unfinished_age_ms").is_none(), "{c}");
    assert!(c.get("fin_latency").is_none(), "{c}");
    let (_, metrics) = b.http("GET", "/metrics", b"");
    assert!(!String::from_utf8_lossy(&metrics).contains("fin_latency"));
}

/// A channel lagging on disk (no consumer, a backlog beyond `--mem-queue-size`) shows
/// the age of its oldest record on disk, not of the newest ones in memory.
#[test]
fn age_of_a_backlog_on_disk_is_its_oldest_records() {
    const GAP: Duration = Duration::from_millis(500);
    let b = Broker::start(
        2,
        &[
            "--channel-lag-stats",
            "--mem-queue-size=10",
            "--sync-timeout=50ms",
        ],
    );
    assert_eq!(b.http("POST", "/topic/create?topic=dl", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=dl&channel=c", b"").0,
        200
    );
    let batch = |p: &str| {
        (0..100)
            .map(|i| format!("{p}{i}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        b.http("POST", "/mpub?topic=dl", batch("a").as_bytes()).0,
        200
    );
    let (_, peek) = b.http("GET", "/messages?topic=dl&channel=c&count=1", b"");
    let peek: Value = serde_json::from_slice(&peek).expect("json");
    let first_ns = peek["messages"][0]["timestamp"].as_i64().expect("ns");
    // A second batch published GAP later fills memory; the first is on disk only.
    std::thread::sleep(GAP);
    assert_eq!(
        b.http("POST", "/mpub?topic=dl", batch("b").as_bytes()).0,
        200
    );
    wait_for(&b, "dl", "backlog on disk", |c| c["backend_depth"] == 190);
    // Within a few /stats calls the age is that of the first batch (a read from disk),
    // well past what the newest records in memory would give.
    wait_for(&b, "dl", "age of the oldest record on disk", |c| {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as i64;
        let true_age_ms = ((now_ns - first_ns) / 1_000_000) as u64;
        age(c) + (GAP.as_millis() as u64) / 5 >= true_age_ms
    });
}
