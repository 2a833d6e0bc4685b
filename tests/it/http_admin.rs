//! The admin endpoints /topic/{create,delete,empty,pause,unpause} and
//! /channel/{create,delete,empty,pause,unpause}: argument errors in their order, exact
//! responses (capture nsqd_create_channel.http and err_channel_create_bad_channel.http),
//! and their effect on topics, channels and connected consumers.
//! NSQ_REFERENCE.md §2 (pause, empty, delete), §3, §7.

use crate::common;

use common::*;
use std::time::Duration;

const BAD_REQ: &str = "HTTP/1.1 400 Bad Request";
const NOT_FOUND: &str = "HTTP/1.1 404 Not Found";

fn post(b: &Broker, pq: &str) -> Vec<u8> {
    b.http_keepalive("POST", pq, b"")
}

// ----------------------------------------------------------------------------------------
// Argument errors and response bytes
// ----------------------------------------------------------------------------------------

#[test]
fn topic_endpoint_argument_errors() {
    let b = Broker::start(1, &[]);
    for ep in ["create", "delete", "empty", "pause", "unpause"] {
        assert_v1_error(
            &post(&b, &format!("/topic/{ep}")),
            BAD_REQ,
            "MISSING_ARG_TOPIC",
        );
        assert_v1_error(
            &post(&b, &format!("/topic/{ep}?channel=x")),
            BAD_REQ,
            "MISSING_ARG_TOPIC",
        );
    }
    assert_v1_error(
        &post(&b, "/topic/create?topic=bad!t"),
        BAD_REQ,
        "INVALID_TOPIC",
    );
    assert_v1_error(
        &post(&b, &format!("/topic/create?topic={}", "x".repeat(65))),
        BAD_REQ,
        "INVALID_TOPIC",
    );
    assert_v1_error(&post(&b, "/topic/empty?topic=x$"), BAD_REQ, "INVALID_TOPIC");
    // Unknown topics.
    for ep in ["delete", "empty", "pause", "unpause"] {
        assert_v1_error(
            &post(&b, &format!("/topic/{ep}?topic=unknown")),
            NOT_FOUND,
            "TOPIC_NOT_FOUND",
        );
    }
    // delete and pause do not validate the name: an invalid name is simply not found.
    assert_v1_error(
        &post(&b, "/topic/delete?topic=bad!t"),
        NOT_FOUND,
        "TOPIC_NOT_FOUND",
    );
    assert_v1_error(
        &post(&b, "/topic/pause?topic=bad!t"),
        NOT_FOUND,
        "TOPIC_NOT_FOUND",
    );
    assert!(
        b.stats()["topics"].as_array().unwrap().is_empty(),
        "no errors create anything"
    );
}

#[test]
fn channel_endpoint_argument_errors_in_order() {
    let b = Broker::start(1, &[]);
    b.admin("/topic/create?topic=t");
    for ep in ["create", "delete", "empty", "pause", "unpause"] {
        let e = |q: &str, status: &str, msg: &str| {
            assert_v1_error(&post(&b, &format!("/channel/{ep}{q}")), status, msg);
        };
        e("", BAD_REQ, "MISSING_ARG_TOPIC");
        e("?channel=c", BAD_REQ, "MISSING_ARG_TOPIC");
        e("?topic=bad!t", BAD_REQ, "INVALID_ARG_TOPIC");
        e("?topic=bad!t&channel=bad!c", BAD_REQ, "INVALID_ARG_TOPIC");
        e("?topic=t", BAD_REQ, "MISSING_ARG_CHANNEL");
        e("?topic=unknown", BAD_REQ, "MISSING_ARG_CHANNEL");
        // err_channel_create_bad_channel.http
        e("?topic=t&channel=bad!ch", BAD_REQ, "INVALID_ARG_CHANNEL");
        e(
            "?topic=unknown&channel=bad!ch",
            BAD_REQ,
            "INVALID_ARG_CHANNEL",
        );
        e("?topic=unknown&channel=c", NOT_FOUND, "TOPIC_NOT_FOUND");
        if ep != "create" {
            e("?topic=t&channel=nochan", NOT_FOUND, "CHANNEL_NOT_FOUND");
        }
    }
    assert!(
        b.topic_stats("unknown").is_none(),
        "channel/create needs an existing topic"
    );
    assert_eq!(
        b.topic_stats("t").unwrap()["channels"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn successful_admin_calls_are_empty_200() {
    let b = Broker::start(1, &[]);
    // Body of admin POSTs is read and ignored.
    assert_v1_empty_ok(&b.http_keepalive("POST", "/topic/create?topic=ok_t", b"ignored body"));
    // nsqd_create_channel.http
    assert_v1_empty_ok(&post(&b, "/channel/create?topic=ok_t&channel=c"));
    for pq in [
        "/topic/create?topic=ok_t",
        "/channel/create?topic=ok_t&channel=c",
        "/channel/pause?topic=ok_t&channel=c",
        "/channel/unpause?topic=ok_t&channel=c",
        "/channel/empty?topic=ok_t&channel=c",
        "/topic/pause?topic=ok_t",
        "/topic/unpause?topic=ok_t",
        "/topic/empty?topic=ok_t",
        "/channel/delete?topic=ok_t&channel=c",
        "/topic/delete?topic=ok_t",
    ] {
        assert_v1_empty_ok(&post(&b, pq));
    }
    assert!(b.topic_stats("ok_t").is_none());
}

// ----------------------------------------------------------------------------------------
// Create and delete
// ----------------------------------------------------------------------------------------

#[test]
fn create_is_idempotent_and_visible() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("create", 4) {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=c1"));
            b.admin(&format!("/channel/create?topic={t}&channel=c1"));
            b.admin(&format!("/channel/create?topic={t}&channel=c2#ephemeral"));
            let ts = b
                .topic_stats(&t)
                .unwrap_or_else(|| panic!("shards={shards}: {t}"));
            let chans: Vec<&str> = ts["channels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["channel_name"].as_str().unwrap())
                .collect();
            assert_eq!(chans, ["c1", "c2#ephemeral"]);
            assert_eq!(ts["paused"], false);
            assert_eq!(ts["message_count"], 0);
        }
        let n = b.stats()["topics"].as_array().unwrap().len();
        assert_eq!(n, 4);
    });
}

#[test]
fn topic_delete_removes_topic_and_closes_consumers() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("tdel", 3) {
            let mut c1 = b.subscribe(&t, "a");
            let mut c2 = b.subscribe(&t, "b");
            b.http_pub(&t, b"x");
            b.admin(&format!("/topic/delete?topic={t}"));
            assert!(b.topic_stats(&t).is_none(), "shards={shards}");
            assert_closed(&mut c1);
            assert_closed(&mut c2);
            assert_v1_error(
                &post(&b, &format!("/topic/delete?topic={t}")),
                NOT_FOUND,
                "TOPIC_NOT_FOUND",
            );
            // Re-creating starts from scratch.
            b.http_pub(&t, b"fresh");
            let ts = b.topic_stats(&t).unwrap();
            assert_eq!(ts["message_count"], 1);
            assert_eq!(ts["channels"].as_array().unwrap().len(), 0);
        }
    });
}

#[test]
fn channel_delete_closes_its_consumers_only() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("cdel", 2) {
            let mut gone = b.subscribe(&t, "gone");
            let mut stays = b.subscribe(&t, "stays");
            send(&mut stays, b"RDY 5\n");
            b.admin(&format!("/channel/delete?topic={t}&channel=gone"));
            assert_closed(&mut gone);
            assert!(b.channel_stats(&t, "gone").is_none());
            b.http_pub(&t, b"after");
            assert_eq!(show(&read_msg(&mut stays).body), "after", "shards={shards}");
            assert_v1_error(
                &post(&b, &format!("/channel/delete?topic={t}&channel=gone")),
                NOT_FOUND,
                "CHANNEL_NOT_FOUND",
            );
        }
    });
}

#[test]
fn deleting_the_last_channel_makes_messages_pile_up_in_the_topic() {
    let b = Broker::start(2, &[]);
    b.admin("/topic/create?topic=lastch");
    b.admin("/channel/create?topic=lastch&channel=c");
    b.http_pub("lastch", b"1");
    b.wait_channel_field("lastch", "c", "depth", 1);
    b.wait_topic_field("lastch", "depth", 0);
    b.admin("/channel/delete?topic=lastch&channel=c");
    b.http_pub("lastch", b"2");
    b.wait_topic_field("lastch", "depth", 1);
    // Nothing may take the message from the topic meanwhile.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(b.topic_stats("lastch").unwrap()["depth"], 1);
}

#[test]
fn deleting_an_ephemeral_topics_last_channel_deletes_the_topic() {
    let b = Broker::start(2, &[]);
    b.admin("/topic/create?topic=ephdel%23ephemeral");
    b.admin("/channel/create?topic=ephdel%23ephemeral&channel=c");
    assert!(b.topic_stats("ephdel#ephemeral").is_some());
    b.admin("/channel/delete?topic=ephdel%23ephemeral&channel=c");
    assert!(
        wait_until(Duration::from_secs(3), || b
            .topic_stats("ephdel#ephemeral")
            .is_none()),
        "an ephemeral topic is deleted when its last channel is deleted"
    );
}

// ----------------------------------------------------------------------------------------
// Empty
// ----------------------------------------------------------------------------------------

#[test]
fn topic_empty_drains_the_topic_only() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("tempty", 2) {
            for i in 0..3 {
                b.http_pub(&t, format!("{i}").as_bytes());
            }
            b.wait_topic_field(&t, "depth", 3);
            b.admin(&format!("/topic/empty?topic={t}"));
            b.wait_topic_field(&t, "depth", 0);
            assert_eq!(
                b.topic_stats(&t).unwrap()["message_count"],
                3,
                "counters are kept"
            );
            // Channels are untouched.
            b.admin(&format!("/channel/create?topic={t}&channel=c"));
            b.http_pub(&t, b"a");
            b.http_pub(&t, b"b");
            b.wait_channel_field(&t, "c", "depth", 2);
            b.admin(&format!("/topic/empty?topic={t}"));
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(
                b.channel_stats(&t, "c").unwrap()["depth"],
                2,
                "shards={shards}"
            );
            // The emptied messages are gone: the first delivery is "a".
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 5\n");
            assert_eq!(show(&read_msg(&mut c).body), "a");
        }
    });
}

#[test]
fn channel_empty_clears_in_flight_deferred_and_depth() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("cempty", 2) {
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 2\n");
            for i in 0..5 {
                b.http_pub(&t, format!("m{i}").as_bytes());
            }
            let (code, _) = b.http("POST", &format!("/pub?topic={t}&defer=600000"), b"deferred");
            assert_eq!(code, 200);
            let m0 = read_msg(&mut c);
            let _m1 = read_msg(&mut c);
            b.wait_channel_field(&t, "ch", "in_flight_count", 2);
            b.wait_channel_field(&t, "ch", "deferred_count", 1);
            b.wait_channel_field(&t, "ch", "depth", 3);
            // Stop deliveries while emptying so the counts below are stable.
            send(&mut c, b"RDY 0\n");
            send(&mut c, &pub_cmd("cempty_sync", b"s"));
            expect_ok(&mut c);
            b.admin(&format!("/channel/empty?topic={t}&channel=ch"));
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["in_flight_count"], 0, "shards={shards} {ch}");
            assert_eq!(ch["deferred_count"], 0, "{ch}");
            assert_eq!(ch["depth"], 0, "{ch}");
            assert_eq!(
                ch["clients"][0]["in_flight_count"], 0,
                "client in_flight reset: {ch}"
            );
            // A later FIN of an emptied message fails, non-fatally.
            send(&mut c, &line(&format!("FIN {}", m0.id)));
            expect_error(
                &mut c,
                &format!("E_FIN_FAILED FIN {} failed ID not in flight", m0.id),
            );
            // The consumer keeps working with new messages.
            send(&mut c, b"RDY 2\n");
            b.http_pub(&t, b"new");
            assert_eq!(show(&read_msg(&mut c).body), "new");
        }
    });
}

// ----------------------------------------------------------------------------------------
// Pause
// ----------------------------------------------------------------------------------------

#[test]
fn paused_channel_stops_delivery() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("cpause", 2) {
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 5\n");
            b.http_pub(&t, b"before");
            let inflight = read_msg(&mut c);
            b.admin(&format!("/channel/pause?topic={t}&channel=ch"));
            assert_eq!(b.channel_stats(&t, "ch").unwrap()["paused"], true);
            b.http_pub(&t, b"while paused");
            assert_no_frame(&mut c, Duration::from_millis(500));
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["depth"], 1, "the message waits in the channel: {ch}");
            // In-flight messages are unaffected: FIN still works.
            send(&mut c, &line(&format!("FIN {}", inflight.id)));
            b.wait_channel_field(&t, "ch", "in_flight_count", 0);
            // Other channels keep flowing.
            let mut other = b.subscribe(&t, "other");
            send(&mut other, b"RDY 5\n");
            b.http_pub(&t, b"to both");
            assert_eq!(show(&read_msg(&mut other).body), "to both");
            b.admin(&format!("/channel/unpause?topic={t}&channel=ch"));
            assert_eq!(b.channel_stats(&t, "ch").unwrap()["paused"], false);
            assert_eq!(
                show(&read_msg(&mut c).body),
                "while paused",
                "shards={shards}"
            );
            assert_eq!(show(&read_msg(&mut c).body), "to both");
        }
    });
}

#[test]
fn paused_topic_keeps_messages_in_the_topic() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("tpause", 2) {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=ch"));
            b.admin(&format!("/topic/pause?topic={t}"));
            assert_eq!(b.topic_stats(&t).unwrap()["paused"], true);
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 5\n");
            b.http_pub(&t, b"held");
            b.wait_topic_field(&t, "depth", 1);
            assert_no_frame(&mut c, Duration::from_millis(400));
            assert_eq!(b.channel_stats(&t, "ch").unwrap()["depth"], 0);
            b.admin(&format!("/topic/unpause?topic={t}"));
            assert_eq!(b.topic_stats(&t).unwrap()["paused"], false);
            assert_eq!(show(&read_msg(&mut c).body), "held", "shards={shards}");
            b.wait_topic_field(&t, "depth", 0);
        }
    });
}

#[test]
fn pause_and_unpause_are_idempotent() {
    let b = Broker::start(1, &[]);
    b.admin("/topic/create?topic=pp");
    b.admin("/channel/create?topic=pp&channel=c");
    b.admin("/topic/pause?topic=pp");
    b.admin("/topic/pause?topic=pp");
    b.admin("/channel/pause?topic=pp&channel=c");
    b.admin("/channel/pause?topic=pp&channel=c");
    assert_eq!(b.topic_stats("pp").unwrap()["paused"], true);
    assert_eq!(b.channel_stats("pp", "c").unwrap()["paused"], true);
    b.admin("/topic/unpause?topic=pp");
    b.admin("/topic/unpause?topic=pp");
    b.admin("/channel/unpause?topic=pp&channel=c");
    b.admin("/channel/unpause?topic=pp&channel=c");
    assert_eq!(b.topic_stats("pp").unwrap()["paused"], false);
    assert_eq!(b.channel_stats("pp", "c").unwrap()["paused"], false);
}
