//! `GET /message` (a message by ID, with its state on every channel) and `GET
//! /messages` (what a channel delivers next), beyond nsqd: over real HTTP, with topics
//! owned by every shard, from memory and from disk; reading changes nothing.

use crate::common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::time::{Duration, Instant};

fn get_json(b: &Broker, path: &str) -> (u16, Value) {
    let (code, body) = b.http("GET", path, b"");
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("{path}: not JSON: {}", String::from_utf8_lossy(&body)));
    (code, v)
}

fn peek(b: &Broker, topic: &str, channel: &str, extra: &str) -> Vec<Value> {
    let (code, v) = get_json(
        b,
        &format!("/messages?topic={topic}&channel={channel}{extra}"),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        v["count"].as_u64(),
        Some(v["messages"].as_array().expect("array").len() as u64)
    );
    v["messages"].as_array().expect("array").clone()
}

fn texts(ms: &[Value]) -> Vec<&str> {
    ms.iter()
        .map(|m| m["body_text"].as_str().expect("string"))
        .collect()
}

/// (state, attempts) of the message on each channel, by channel name.
fn states(v: &Value) -> Vec<(String, String, u64)> {
    v["channels"]
        .as_array()
        .expect("channels")
        .iter()
        .map(|c| {
            (
                c["channel_name"].as_str().expect("string").to_string(),
                c["state"].as_str().expect("string").to_string(),
                c["attempts"].as_u64().expect("number"),
            )
        })
        .collect()
}

fn st(ch: &str, state: &str, attempts: u64) -> (String, String, u64) {
    (ch.to_string(), state.to_string(), attempts)
}

/// Polls `/message` until the state list is `want` (30 s at most).
fn wait_states(b: &Broker, topic: &str, id: &str, want: &[(String, String, u64)]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, v) = get_json(b, &format!("/message?topic={topic}&id={id}"));
        if code == 200 && states(&v) == want {
            return v;
        }
        assert!(Instant::now() < deadline, "{topic} {id}: {code} {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn message_states_follow_delivery_and_peeking_changes_nothing() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for topic in &topic_names("insp", shards) {
            assert_eq!(
                b.http("POST", &format!("/topic/create?topic={topic}"), b"")
                    .0,
                200
            );
            for ch in ["a", "b"] {
                let path = format!("/channel/create?topic={topic}&channel={ch}");
                assert_eq!(b.http("POST", &path, b"").0, 200);
            }
            for body in ["m0", "m1", "m2"] {
                let path = format!("/pub?topic={topic}");
                assert_eq!(b.http("POST", &path, body.as_bytes()).0, 200);
            }
            let first = peek(&b, topic, "a", "&count=10");
            assert_eq!(texts(&first), ["m0", "m1", "m2"]);
            assert_eq!(first[0]["body"], "bTA=", "base64");
            assert_eq!(first[0]["attempts"], 0);
            // Peeking again sees the same: nothing moved.
            assert_eq!(peek(&b, topic, "a", "&count=10"), first);
            assert_eq!(texts(&peek(&b, topic, "a", "&count=2")), ["m0", "m1"]);
            let ids: Vec<String> = first
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect();
            let (code, v) = get_json(&b, &format!("/message?topic={topic}&id={}", ids[0]));
            assert_eq!(code, 200, "{v}");
            assert_eq!(v["body_text"], "m0");
            assert_eq!(v["timestamp"], first[0]["timestamp"]);
            assert_eq!(states(&v), [st("a", "waiting", 0), st("b", "waiting", 0)]);
            // `from` leaves out what was published before it.
            let from = first[2]["timestamp"].as_i64().unwrap();
            assert_eq!(
                texts(&peek(&b, topic, "a", &format!("&from={from}"))),
                ["m2"]
            );

            // A consumer gets exactly what the peek showed first.
            let mut s = b.connect_v2();
            s.write_all(format!("SUB {topic} a\nRDY 1\n").as_bytes())
                .unwrap();
            assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
            let (ft, data) = read_frame_skip_hb(&mut s).unwrap();
            assert_eq!(ft, 2);
            assert_eq!(std::str::from_utf8(&data[10..26]).unwrap(), ids[0]);
            assert_eq!(&data[26..], b"m0");
            let want = [st("a", "in_flight", 1), st("b", "waiting", 0)];
            wait_states(&b, topic, &ids[0], &want);
            assert_eq!(texts(&peek(&b, topic, "a", "")), ["m1", "m2"]);
            // REQ with a delay: deferred, then m1 comes; its FIN finishes it.
            s.write_all(format!("REQ {} 60000\n", ids[0]).as_bytes())
                .unwrap();
            let (_, data) = read_frame_skip_hb(&mut s).unwrap();
            assert_eq!(&data[26..], b"m1");
            s.write_all(format!("FIN {}\n", ids[1]).as_bytes()).unwrap();
            let want = [st("a", "deferred", 1), st("b", "waiting", 0)];
            wait_states(&b, topic, &ids[0], &want);
            let want = [st("a", "finished", 0), st("b", "waiting", 0)];
            wait_states(&b, topic, &ids[1], &want);
            let (_, data) = read_frame_skip_hb(&mut s).unwrap();
            assert_eq!(&data[26..], b"m2", "peeking did not take m2 away");
            // The peek never touched channel b.
            assert_eq!(texts(&peek(&b, topic, "b", "")), ["m0", "m1", "m2"]);
        }
    });
}

/// A message requeued by its only channel is found by ID at once: the channel holds its
/// body while the log has dropped its record and the store may not have written it yet.
#[test]
fn a_requeued_message_is_found_while_the_store_has_not_written_it() {
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &[]);
        let topic = "insp_req";
        let path = format!("/channel/create?topic={topic}&channel=c");
        assert_eq!(
            b.http("POST", &format!("/topic/create?topic={topic}"), b"")
                .0,
            200
        );
        assert_eq!(b.http("POST", &path, b"").0, 200);
        let mut s = b.connect_v2();
        s.write_all(&mpub_cmd(topic, &[b"a", b"b", b"c"])).unwrap();
        assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
        let mut c = b.connect_v2();
        c.write_all(format!("SUB {topic} c\nRDY 2\n").as_bytes())
            .unwrap();
        assert_eq!(read_frame(&mut c).unwrap(), (0, b"OK".to_vec()));
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (ft, data) = read_frame_skip_hb(&mut c).unwrap();
            assert_eq!(ft, 2);
            ids.push(String::from_utf8(data[10..26].to_vec()).unwrap());
        }
        c.write_all(format!("RDY 0\nREQ {} 0\n", ids[1]).as_bytes())
            .unwrap();
        // Once the peek shows it ready again, the lookup must find it too.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !peek(&b, topic, "c", "")
            .iter()
            .any(|m| m["id"] == ids[1].as_str())
        {
            assert!(Instant::now() < deadline, "REQ not applied");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (code, v) = get_json(&b, &format!("/message?topic={topic}&id={}", ids[1]));
        assert_eq!(code, 200, "shards={shards}: {v}");
        assert_eq!(v["body_text"], "b");
        assert_eq!(states(&v), [st("c", "waiting", 1)]);
    });
}

/// `/messages` stops at 16 MiB of bodies (after the message that reaches it), whatever
/// `count` asks for, so a peek at large messages cannot take the broker's memory.
#[test]
fn a_peek_stops_at_sixteen_mib_of_bodies() {
    let b = Broker::start(1, &[]);
    assert_eq!(b.http("POST", "/topic/create?topic=big", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=big&channel=c", b"").0,
        200
    );
    let body = vec![b'x'; 1 << 20];
    for _ in 0..20 {
        assert_eq!(b.http("POST", "/pub?topic=big", &body).0, 200);
    }
    let (code, v) = get_json(&b, "/messages?topic=big&channel=c&count=100");
    assert_eq!(code, 200);
    assert_eq!(v["count"], 16, "16 x 1 MiB reach the cap");
    let (_, v) = get_json(&b, "/messages?topic=big&channel=c&count=3");
    assert_eq!(v["count"], 3, "under the cap, count holds");
}

#[test]
fn bad_requests_get_nsqd_style_errors() {
    let b = Broker::start(2, &[]);
    assert_eq!(b.http("POST", "/topic/create?topic=t", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=t&channel=c", b"").0,
        200
    );
    for (path, code, msg) in [
        ("/message?id=0000000000000001", 400, "MISSING_ARG_TOPIC"),
        ("/message?topic=t", 400, "MISSING_ARG_ID"),
        ("/message?topic=t&id=zz", 400, "INVALID_ARG_ID"),
        (
            "/message?topic=t&id=000000000000000G",
            400,
            "INVALID_ARG_ID",
        ),
        (
            "/message?topic=bad!&id=0000000000000001",
            400,
            "INVALID_ARG_TOPIC",
        ),
        (
            "/message?topic=nope&id=0000000000000001",
            404,
            "TOPIC_NOT_FOUND",
        ),
        (
            "/message?topic=t&id=0000000000000001",
            404,
            "MESSAGE_NOT_FOUND",
        ),
        ("/messages?topic=t", 400, "MISSING_ARG_CHANNEL"),
        (
            "/messages?topic=t&channel=c&count=0",
            400,
            "INVALID_ARG_COUNT",
        ),
        (
            "/messages?topic=t&channel=c&count=x",
            400,
            "INVALID_ARG_COUNT",
        ),
        (
            "/messages?topic=t&channel=c&from=x",
            400,
            "INVALID_ARG_FROM",
        ),
        ("/messages?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("/messages?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
    ] {
        let (got, v) = get_json(&b, path);
        assert_eq!((got, v["message"].as_str()), (code, Some(msg)), "{path}");
    }
    let (code, _) = b.http("POST", "/message?topic=t&id=0000000000000001", b"");
    assert_eq!(code, 405);
    // The broker still serves.
    assert_eq!(peek(&b, "t", "c", "&count=5000").len(), 0);
}

/// A backlog beyond `--mem-queue-size` is read from the segment store: `/message` finds
/// its oldest message by ID and `/messages` lists it in order.
#[test]
fn messages_on_disk_are_found_and_listed() {
    let b = Broker::start(2, &["--mem-queue-size=10", "--sync-timeout=50ms"]);
    assert_eq!(b.http("POST", "/topic/create?topic=disk", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=disk&channel=c", b"")
            .0,
        200
    );
    let n = 300;
    let body: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    // Three MPUBs: three publish times.
    for part in body.chunks(n / 3) {
        let (code, _) = b.http("POST", "/mpub?topic=disk", part.join("\n").as_bytes());
        assert_eq!(code, 200);
    }
    // Memory lets go of all but the newest 10 once the store has them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = b.stats();
        let on_disk = stats["topics"][0]["channels"][0]["backend_depth"].as_u64();
        if on_disk == Some((n - 10) as u64) {
            break;
        }
        assert!(Instant::now() < deadline, "not on disk: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = peek(&b, "disk", "c", "&count=1000");
    let want: Vec<&str> = body.iter().map(String::as_str).collect();
    assert_eq!(texts(&all), want);
    for i in [0usize, 1, 150, n - 11, n - 1] {
        let id = all[i]["id"].as_str().unwrap();
        let (code, v) = get_json(&b, &format!("/message?topic=disk&id={id}"));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["body_text"].as_str(), Some(want[i]));
        assert_eq!(states(&v), [st("c", "waiting", 0)]);
    }
    // `from` finds the second MPUB's first record on disk.
    let from = all[n / 3]["timestamp"].as_i64().expect("ns");
    assert!(from > all[0]["timestamp"].as_i64().expect("ns"));
    let later = peek(&b, "disk", "c", &format!("&count=1000&from={from}"));
    assert_eq!(texts(&later), want[n / 3..]);
    let stats = b.stats();
    assert_eq!(
        stats["topics"][0]["channels"][0]["depth"], n as u64,
        "{stats}"
    );
}

/// IDs keep growing across a restart, so messages published before and after it are
/// all found by ID (from disk and memory) and listed in order.
#[test]
fn messages_are_found_by_id_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("nsqd-inspect-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("data dir");
    let args = ["--mem-queue-size=10", "--sync-timeout=50ms"];
    let mut b = Broker::start_in(&dir, 2, &args);
    assert_eq!(b.http("POST", "/topic/create?topic=rs", b"").0, 200);
    assert_eq!(
        b.http("POST", "/channel/create?topic=rs&channel=c", b"").0,
        200
    );
    let before: Vec<String> = (0..50).map(|i| format!("a{i}")).collect();
    assert_eq!(
        b.http("POST", "/mpub?topic=rs", before.join("\n").as_bytes())
            .0,
        200
    );
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));

    let b = Broker::start_in(&dir, 2, &args);
    let after: Vec<String> = (0..50).map(|i| format!("b{i}")).collect();
    assert_eq!(
        b.http("POST", "/mpub?topic=rs", after.join("\n").as_bytes())
            .0,
        200
    );
    let all = peek(&b, "rs", "c", "&count=1000");
    let want: Vec<&str> = before.iter().chain(&after).map(String::as_str).collect();
    assert_eq!(texts(&all), want);
    let ids: Vec<&str> = all.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "IDs grow: {ids:?}");
    for (i, id) in ids.iter().enumerate() {
        let (code, v) = get_json(&b, &format!("/message?topic=rs&id={id}"));
        assert_eq!(code, 200, "{i}: {v}");
        assert_eq!(v["body_text"].as_str(), Some(want[i]));
    }
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
