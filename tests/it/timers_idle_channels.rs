//! Timers with many idle channels: the shard's timer queue visits only channels with
//! something due (nsqd's queueScanLoop samples every channel instead), so an in-flight
//! timeout, a REQ delay and a deferred publish must still fire on time when thousands of
//! channels without timers sit beside them.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::time::{Duration, Instant};

/// Idle topics x channels created before the timed checks.
const IDLE_TOPICS: usize = 30;
const IDLE_CHANNELS: usize = 100;

/// How late a timer may fire here: the timer pass runs at most every 10 ms, and the test
/// machine is shared (nsqd itself scans every 100 ms).
const SLACK: Duration = Duration::from_millis(400);

fn with_idle_channels(shards: usize) -> Broker {
    let b = Broker::start(shards, &[]);
    for t in 0..IDLE_TOPICS {
        let topic = format!("idle_{t}");
        b.admin(&format!("/topic/create?topic={topic}"));
        for c in 0..IDLE_CHANNELS {
            b.admin(&format!("/channel/create?topic={topic}&channel=c{c}"));
        }
    }
    let st = b.stats();
    let channels: usize = st["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["channels"].as_array().unwrap().len())
        .sum();
    assert_eq!(channels, IDLE_TOPICS * IDLE_CHANNELS);
    b
}

#[test]
fn timeouts_and_deferred_messages_fire_on_time_beside_idle_channels() {
    for_each_shards(&[1, 2], |shards| {
        let b = with_idle_channels(shards);
        for t in topic_names("timed", 2) {
            // In-flight timeout: msg_timeout 1 s, never finished, redelivered after it.
            let mut c = b.subscribe_identified(r#"{"msg_timeout":1000}"#, &t, "ch");
            send(&mut c, b"RDY 1\n");
            b.http_pub(&t, b"slow");
            let m = read_msg(&mut c);
            let delivered = Instant::now();
            let again = read_msg(&mut c);
            let took = delivered.elapsed();
            assert_eq!((&again.id, again.attempts), (&m.id, 2), "shards={shards}");
            assert!(
                took >= Duration::from_millis(900) && took < Duration::from_secs(1) + SLACK,
                "in-flight timeout of 1 s fired after {took:?} (shards={shards})"
            );
            assert_eq!(b.channel_stats(&t, "ch").unwrap()["timeout_count"], 1);

            // REQ with a 300 ms delay.
            send(&mut c, &line(&format!("REQ {} 300", again.id)));
            let req_at = Instant::now();
            let third = read_msg(&mut c);
            let took = req_at.elapsed();
            assert_eq!((&third.id, third.attempts), (&m.id, 3));
            assert!(
                took >= Duration::from_millis(250) && took < Duration::from_millis(300) + SLACK,
                "REQ 300 ms came back after {took:?} (shards={shards})"
            );
            send(&mut c, &line(&format!("FIN {}", third.id)));

            // Deferred publish: DPUB 500 ms.
            let mut p = b.connect_v2();
            send(&mut p, &dpub_cmd(&t, 500, b"later"));
            let sent = Instant::now();
            expect_ok(&mut p);
            let d = read_msg(&mut c);
            let took = sent.elapsed();
            assert_eq!(d.body, b"later");
            assert!(
                took >= Duration::from_millis(450) && took < Duration::from_millis(500) + SLACK,
                "DPUB 500 ms delivered after {took:?} (shards={shards})"
            );
            send(&mut c, &line(&format!("FIN {}", d.id)));
            b.wait_channel_field(&t, "ch", "in_flight_count", 0);
        }
    });
}
