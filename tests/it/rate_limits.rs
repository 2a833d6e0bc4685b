//! Per-channel rate limits (beyond nsqd; docs/dead-letters-and-rate-limits.md) over
//! real TCP and HTTP: the delivered rate within a fraction of the limit, full speed
//! again once it is removed, `rate_limit` in /stats, the endpoint's errors and the limit
//! across a restart and a kill -9.

use crate::common;

use common::*;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const BAD_REQ: &str = "HTTP/1.1 400 Bad Request";
const NOT_FOUND: &str = "HTTP/1.1 404 Not Found";

/// Reads `n` messages from `s`, FINs each, and returns when each came.
fn receive(s: &mut TcpStream, n: usize) -> Vec<Instant> {
    (0..n)
        .map(|_| {
            let (ft, data) = read_frame_skip_hb(s).expect("a message");
            assert_eq!(ft, 2, "a message frame: {}", show(&data));
            let at = Instant::now();
            let (_, _, id, _) = parse_message(&data);
            send(s, &line(&format!("FIN {id}")));
            at
        })
        .collect()
}

/// Publishes `n` small messages to `topic` in MPUBs of 100.
fn publish(b: &Broker, topic: &str, n: usize) {
    let mut p = b.connect_v2();
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("m{i}").into_bytes()).collect();
    for chunk in bodies.chunks(100) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        send(&mut p, &mpub_cmd(topic, &refs));
        expect_ok(&mut p);
    }
}

#[test]
fn delivery_is_paced_to_the_limit_and_full_speed_once_removed() {
    const R: f64 = 200.0;
    for_each_shards(&[1, 4], |shards| {
        let b = Broker::start(shards, &[]);
        let mut s = b.subscribe("paced", "c");
        b.admin("/channel/rate-limit?topic=paced&channel=c&msgs_per_sec=200");
        assert_eq!(b.channel_stats("paced", "c").unwrap()["rate_limit"], 200);
        send(&mut s, b"RDY 100\n");
        publish(&b, "paced", 1500);
        // About three seconds' worth at the limit.
        let got = receive(&mut s, 601);
        let secs = got[600].duration_since(got[0]).as_secs_f64();
        let rate = 600.0 / secs;
        assert!(
            (0.7 * R..=1.3 * R).contains(&rate),
            "{rate:.0} msgs/s with a limit of {R} ({secs:.2} s for 600)"
        );
        let depth = b.channel_stats("paced", "c").unwrap()["depth"]
            .as_u64()
            .unwrap();
        assert!(depth > 0, "the rest waits in the channel");
        // Removed: the other 899 come far faster than the limit allowed.
        b.admin("/channel/rate-limit?topic=paced&channel=c&msgs_per_sec=0");
        let t0 = Instant::now();
        let rest = receive(&mut s, 899);
        let secs = rest[898].duration_since(t0).as_secs_f64();
        assert!(
            899.0 / secs > 3.0 * R,
            "after removal: {:.0} msgs/s, not above 3x the old limit",
            899.0 / secs
        );
        let ch = b.channel_stats("paced", "c").unwrap();
        assert!(ch.get("rate_limit").is_none(), "{ch}");
        assert_no_frame(&mut s, Duration::from_millis(200));
    });
}

#[test]
fn rate_limit_endpoint_errors_and_persistence() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let dir = ScratchDir::new("rate-limit-restart");
        let mut b = Broker::start_in(&dir, shards, &[]);
        b.admin("/topic/create?topic=r");
        b.admin("/channel/create?topic=r&channel=c");
        b.admin("/channel/create?topic=r&channel=d");
        let post =
            |b: &Broker, q: &str| b.http_keepalive("POST", &format!("/channel/rate-limit{q}"), b"");
        assert_v1_error(&post(&b, ""), BAD_REQ, "MISSING_ARG_TOPIC");
        assert_v1_error(&post(&b, "?topic=r"), BAD_REQ, "MISSING_ARG_CHANNEL");
        assert_v1_error(
            &post(&b, "?topic=r&channel=c"),
            BAD_REQ,
            "MISSING_ARG_MSGS_PER_SEC",
        );
        for r in ["", "-1", "x", "4294967296", "2.5"] {
            assert_v1_error(
                &post(&b, &format!("?topic=r&channel=c&msgs_per_sec={r}")),
                BAD_REQ,
                "INVALID_ARG_MSGS_PER_SEC",
            );
        }
        assert_v1_error(
            &post(&b, "?topic=no&channel=c&msgs_per_sec=1"),
            NOT_FOUND,
            "TOPIC_NOT_FOUND",
        );
        assert_v1_error(
            &post(&b, "?topic=r&channel=no&msgs_per_sec=1"),
            NOT_FOUND,
            "CHANNEL_NOT_FOUND",
        );
        assert_v1_empty_ok(&post(&b, "?topic=r&channel=c&msgs_per_sec=50"));
        b.terminate();
        let mut b = Broker::start_in(&dir, shards, &[]);
        let rate =
            |b: &Broker, c: &str| b.channel_stats("r", c).unwrap().get("rate_limit").cloned();
        assert_eq!((rate(&b, "c"), rate(&b, "d")), (Some(50.into()), None));
        // Answered once the metadata is on disk: a kill -9 right after keeps it.
        assert_v1_empty_ok(&post(&b, "?topic=r&channel=d&msgs_per_sec=7"));
        assert_v1_empty_ok(&post(&b, "?topic=r&channel=c&msgs_per_sec=0"));
        b.kill9();
        let b = Broker::start_in(&dir, shards, &[]);
        assert_eq!((rate(&b, "c"), rate(&b, "d")), (None, Some(7.into())));
    });
}
