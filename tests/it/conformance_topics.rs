//! Topic and channel queue semantics: --mem-queue-size overflow (ephemeral drops, durable
//! spills), counters, backlog. NSQ_REFERENCE.md §2 "Queues", "Ephemeral", "Backlog rule".
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::collections::HashSet;
use std::time::Duration;

fn mpub_http(b: &Broker, topic: &str, n: usize) {
    let body: String = (0..n).map(|i| format!("m{i}\n")).collect();
    let (code, resp) = b.http("POST", &format!("/mpub?topic={topic}"), body.as_bytes());
    assert_eq!((code, show(&resp)), (200, "OK".to_string()));
}

fn drain(c: &mut std::net::TcpStream) -> Vec<String> {
    let mut out = Vec::new();
    c.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    while let Ok(raw) = read_raw_frame_skip_hb(c) {
        assert_eq!(
            i32::from_be_bytes(raw[4..8].try_into().unwrap()),
            2,
            "{}",
            show(&raw)
        );
        let (_, _, _, body) = parse_message(&raw[8..]);
        out.push(String::from_utf8(body).unwrap());
    }
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    out
}

#[test]
fn ephemeral_topic_drops_beyond_mem_queue_size() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--mem-queue-size=5"]);
        for base in topic_names("eph_over", 2) {
            let t = format!("{base}#ephemeral");
            let tq = format!("{base}%23ephemeral");
            mpub_http(&b, &tq, 10);
            b.wait_topic_field(&t, "depth", 5);
            let ts = b.topic_stats(&t).unwrap();
            assert_eq!(
                ts["message_count"], 10,
                "published messages are counted: {ts}"
            );
            assert_eq!(ts["backend_depth"], 0, "no disk for ephemeral topics: {ts}");
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 100\n");
            let got = drain(&mut c);
            assert_eq!(
                got,
                ["m0", "m1", "m2", "m3", "m4"],
                "shards={shards}: the first 5 are kept"
            );
        }
    });
}

#[test]
fn ephemeral_channel_drops_beyond_mem_queue_size() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--mem-queue-size=5"]);
        for t in topic_names("ephch_over", 2) {
            let mut c = b.subscribe(&t, "c#ephemeral");
            mpub_http(&b, &t, 10);
            b.wait_channel_field(&t, "c#ephemeral", "depth", 5);
            b.wait_topic_field(&t, "depth", 0);
            std::thread::sleep(Duration::from_millis(200));
            let ch = b.channel_stats(&t, "c#ephemeral").unwrap();
            assert_eq!(ch["depth"], 5, "{ch}");
            assert_eq!(ch["backend_depth"], 0, "{ch}");
            send(&mut c, b"RDY 100\n");
            let got = drain(&mut c);
            assert_eq!(
                got,
                ["m0", "m1", "m2", "m3", "m4"],
                "shards={shards}: the first 5 are kept, as nsqd's channel.put drops a \
                 message that finds an ephemeral channel full"
            );
        }
    });
}

#[test]
fn durable_topic_spills_beyond_mem_queue_size_and_loses_nothing() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--mem-queue-size=5"]);
        for t in topic_names("spill", 2) {
            mpub_http(&b, &t, 12);
            b.wait_topic_field(&t, "depth", 12);
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 100\n");
            let got: HashSet<String> = drain(&mut c).into_iter().collect();
            let want: HashSet<String> = (0..12).map(|i| format!("m{i}")).collect();
            assert_eq!(got, want, "shards={shards}");
            b.wait_channel_field(&t, "c", "in_flight_count", 12);
            assert_eq!(b.channel_stats(&t, "c").unwrap()["message_count"], 12);
        }
    });
}

#[test]
fn mem_queue_size_zero_still_delivers_everything() {
    let b = Broker::start(2, &["--mem-queue-size=0"]);
    let mut c = b.subscribe("mq0", "c");
    send(&mut c, b"RDY 100\n");
    mpub_http(&b, "mq0", 7);
    let got: HashSet<String> = drain(&mut c).into_iter().collect();
    let want: HashSet<String> = (0..7).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
}

#[test]
fn durable_channel_spills_beyond_mem_queue_size() {
    let b = Broker::start(2, &["--mem-queue-size=5"]);
    let mut c = b.subscribe("chspill", "c");
    mpub_http(&b, "chspill", 12);
    b.wait_channel_field("chspill", "c", "depth", 12);
    send(&mut c, b"RDY 100\n");
    let got: HashSet<String> = drain(&mut c).into_iter().collect();
    assert_eq!(got.len(), 12);
}

#[test]
fn counters_follow_nsqd_definitions() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("counters", 2) {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=a"));
            b.admin(&format!("/channel/create?topic={t}&channel=b"));
            b.http_pub(&t, b"12345");
            let (code, _) = b.http("POST", &format!("/pub?topic={t}&defer=600000"), b"123");
            assert_eq!(code, 200);
            b.wait_channel_field(&t, "a", "deferred_count", 1);
            b.wait_channel_field(&t, "b", "deferred_count", 1);
            let ts = b.topic_stats(&t).unwrap();
            assert_eq!(ts["message_count"], 2);
            assert_eq!(ts["message_bytes"], 8);
            assert_eq!(ts["depth"], 0);
            for ch in ["a", "b"] {
                let c = b.channel_stats(&t, ch).unwrap();
                assert_eq!(
                    c["message_count"], 2,
                    "shards={shards}: deferred included: {c}"
                );
                assert_eq!(c["depth"], 1, "{c}");
                assert_eq!(c["deferred_count"], 1, "{c}");
                assert_eq!(c["in_flight_count"], 0, "{c}");
            }
        }
    });
}
