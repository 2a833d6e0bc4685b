//! What the broker has answered stays true after a crash: a channel created (over HTTP or by SUB), deleted or
//! paused is answered only once the metadata on disk says so, so that kill -9 right
//! after the answer neither loses a message acknowledged to the new channel nor brings
//! a deleted channel back; a topic whose store cannot be created refuses publishes with
//! nsqd's errors (`E_PUB_FAILED`, HTTP 503) and reports it on `/ping` until the disk lets
//! it create one (never OK with the messages in memory only); a failed
//! metadata write is reported on `/ping` until one succeeds.
//!
//! `--sync-timeout=60s`: no periodic checkpoint runs between the answer and the kill.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::time::Duration;

const ARGS: [&str; 2] = ["--sync-every=1", "--sync-timeout=60s"];

fn fresh_dir(name: &str, shards: usize) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "nsqd-durable-changes-{name}-{shards}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn channel_changes_answered_before_kill_9_survive_it() {
    for_each_shards(&[1, 2], |shards| {
        let dir = fresh_dir("channels", shards);
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        b.admin("/topic/create?topic=t");
        // Created over HTTP, then a message acknowledged: both survive.
        b.admin("/channel/create?topic=t&channel=http");
        b.tcp_pub("t", b"one");
        b.kill9();
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        let ch = b.channel_stats("t", "http").expect("created channel kept");
        assert_eq!(ch["depth"], 1, "shards={shards}: {ch}");

        // Created by SUB (its OK), then a message acknowledged on another connection.
        let sub = b.subscribe("t", "sub");
        b.tcp_pub("t", b"two");
        b.kill9();
        drop(sub);
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        let ch = b
            .channel_stats("t", "sub")
            .expect("channel made by SUB kept");
        assert_eq!(ch["depth"], 1, "shards={shards}: {ch}");

        // Deleted: it does not come back with its backlog.
        b.admin("/channel/delete?topic=t&channel=http");
        b.kill9();
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        assert!(
            b.channel_stats("t", "http").is_none(),
            "shards={shards}: deleted channel came back"
        );

        // Paused channel and topic stay paused.
        b.admin("/channel/pause?topic=t&channel=sub");
        b.admin("/topic/pause?topic=t");
        b.kill9();
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        let t = b.topic_stats("t").expect("topic");
        assert_eq!(t["paused"], true, "shards={shards}: {t}");
        let ch = b.channel_stats("t", "sub").expect("channel");
        assert_eq!(ch["paused"], true, "shards={shards}: {ch}");
        b.terminate();
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A file where the `topics` directory should be makes every new topic's store fail.
fn block_topics_dir(data: &std::path::Path) {
    let topics = data.join("topics");
    let _ = std::fs::remove_dir_all(&topics);
    std::fs::write(&topics, b"not a directory").unwrap();
}

fn unblock_topics_dir(data: &std::path::Path) {
    let topics = data.join("topics");
    std::fs::remove_file(&topics).unwrap();
    std::fs::create_dir_all(&topics).unwrap();
}

#[test]
fn a_topic_without_a_store_refuses_publishes_until_it_has_one() {
    for_each_shards(&[1, 2], |shards| {
        let dir = fresh_dir("nostore", shards);
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        assert_eq!(b.http("GET", "/ping", b""), (200, b"OK".to_vec()));
        block_topics_dir(&dir);
        // TCP PUB: nsqd's E_PUB_FAILED (a fatal error: the connection closes).
        let mut s = b.connect_v2();
        send(&mut s, &pub_cmd("lost", b"x"));
        let (ft, d) = read_frame_skip_hb(&mut s).unwrap();
        let text = String::from_utf8_lossy(&d).to_string();
        assert_eq!(ft, 1, "shards={shards}: {text}");
        assert!(text.starts_with("E_PUB_FAILED PUB failed "), "{text}");
        let (rest, _) = read_until_closed(&mut s, "after E_PUB_FAILED");
        assert!(rest.is_empty(), "{rest:?}");
        // HTTP /pub: 503 EXITING, as nsqd answers a failed put.
        let (code, body) = b.http("POST", "/pub?topic=lost", b"y");
        assert_eq!(
            (code, show(&body)),
            (503, r#"{"message":"EXITING"}"#.to_string())
        );
        let (code, body) = b.http("GET", "/ping", b"");
        assert_eq!(code, 500, "shards={shards}: {}", show(&body));
        assert!(show(&body).starts_with("NOK - "), "{}", show(&body));

        // The disk lets it create the store: the checkpoint task retries it every
        // --sync-timeout, so /ping heals without a publish; publishes are stored from then on.
        unblock_topics_dir(&dir);
        assert!(
            wait_until(Duration::from_secs(10), || b.http("GET", "/ping", b"").0
                == 200),
            "shards={shards}: /ping still {}",
            show(&b.http("GET", "/ping", b"").1)
        );
        let mut s = b.connect_v2();
        send(&mut s, &pub_cmd("lost", b"kept"));
        expect_ok(&mut s);
        assert_eq!(b.http("GET", "/ping", b""), (200, b"OK".to_vec()));
        b.admin("/channel/create?topic=lost&channel=c");
        b.kill9();
        drop(s);
        let mut b = Broker::start_in(&dir, shards, &ARGS);
        let ch = b
            .channel_stats("lost", "c")
            .expect("topic and channel kept");
        assert_eq!(ch["depth"], 1, "shards={shards}: {ch}");
        let mut c = b.subscribe("lost", "c");
        send(&mut c, &line("RDY 5"));
        assert_eq!(read_msg(&mut c).body, b"kept");
        b.terminate();
        let _ = std::fs::remove_dir_all(&dir);
    });
}

// Needs the `fault-injection` feature (scripts/test.sh enables it).
#[cfg(feature = "fault-injection")]
#[test]
fn a_failed_metadata_write_is_reported_until_one_succeeds() {
    let dir = fresh_dir("metafail", 1);
    // Every metadata write fails, up to 3 of them.
    let env = [("NSQD_STORAGE_FAULTS", "seed=3,meta=eio@count:3")];
    let mut b = Broker::start_in_env(&dir, 1, &["--sync-timeout=200ms"], &env);
    b.admin("/topic/create?topic=m");
    b.admin("/channel/create?topic=m&channel=c");
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!(code, 500, "{}", show(&body));
    assert!(show(&body).contains("metadata write"), "{}", show(&body));
    // The faults run out: a later checkpoint writes it and the node is healthy again.
    assert!(
        wait_until(Duration::from_secs(10), || b.http("GET", "/ping", b"").0
            == 200),
        "still unhealthy: {}",
        show(&b.http("GET", "/ping", b"").1)
    );
    b.kill9();
    let mut b = Broker::start_in(&dir, 1, &[]);
    assert!(
        b.channel_stats("m", "c").is_some(),
        "channel in the metadata"
    );
    b.terminate();
    let _ = std::fs::remove_dir_all(&dir);
}
