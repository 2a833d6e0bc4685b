//! Replay (beyond nsqd): `--retention-time` / `--retention-bytes` keep consumed segments,
//! `/stats` shows the retained range, and `POST /channel/seek` moves a channel's cursor by
//! timestamp or to the oldest / newest message, on 1, 2 and 4 shards, across a restart,
//! and below the memory tail (records read back from disk). Every error answer is
//! checked byte for byte in nsqd's HTTP style.

use crate::common;

use common::*;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

/// Reads `n` messages, FINs each, and returns them in arrival order.
fn consume(s: &mut TcpStream, n: usize) -> Vec<Msg> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let m = read_msg(s);
        send(s, &line(&format!("FIN {}", m.id)));
        out.push(m);
    }
    out
}

fn bodies(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

/// Bodies `<prefix>-<i>-xxx...` (about 110 bytes, so that 4 KiB segments fill quickly).
fn names(prefix: &str, from: usize, to: usize) -> Vec<String> {
    (from..to)
        .map(|i| format!("{prefix}-{i:04}-{}", "x".repeat(100)))
        .collect()
}

/// Publishes `prefix-<from..to>` with MPUB (one publish time for the whole batch).
fn mpub(b: &Broker, topic: &str, prefix: &str, from: usize, to: usize) {
    let body = names(prefix, from, to).join("\n");
    let (code, resp) = b.http("POST", &format!("/mpub?topic={topic}"), body.as_bytes());
    assert_eq!((code, show(&resp)), (200, "OK".to_string()));
}

/// Unix ns as the fractional Unix seconds `/channel/seek?timestamp=` takes.
fn secs(ns: i64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// Seeks once the channel has nothing in flight (a seek leaves in-flight messages alone,
/// so a FIN still on its way would otherwise keep a message from being replayed).
fn seek(b: &Broker, topic: &str, channel: &str, arg: &str) {
    b.wait_channel_field(topic, channel, "in_flight_count", 0);
    assert_v1_empty_ok(&b.http_keepalive(
        "POST",
        &format!("/channel/seek?topic={topic}&channel={channel}&{arg}"),
        b"",
    ));
}

fn segment_files(data: &Path, topic: &str) -> Vec<(String, u64)> {
    let dir = data.join("topics").join(format!("t-{topic}"));
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                .map(|e| {
                    let len = e.metadata().map(|m| m.len()).unwrap_or(0);
                    (e.file_name().to_string_lossy().into_owned(), len)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn seek_errors_are_nsqd_style() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--retention-time=1h"]);
        // Topics on every shard, so that 404s also come back through the mesh.
        let topics = topic_names("seekerr", 4);
        for t in &topics {
            b.admin(&format!("/topic/create?topic={t}"));
        }
        let raw = b.http_keepalive(
            "GET",
            "/channel/seek?topic=t&channel=c&position=oldest",
            b"",
        );
        assert_http_exact(
            &raw,
            "HTTP/1.1 405 Method Not Allowed",
            &[
                "Allow: OPTIONS, POST",
                "Content-Type: application/json; charset=utf-8",
                "X-Nsq-Content-Type: nsq; version=1.0",
                "Content-Length: 32",
            ],
            br#"{"message":"METHOD_NOT_ALLOWED"}"#,
        );
        let t0 = &topics[0];
        let cases: Vec<(String, &str, &str)> = vec![
            ("".into(), "400 Bad Request", "MISSING_ARG_TOPIC"),
            (
                "channel=c&position=oldest".into(),
                "400 Bad Request",
                "MISSING_ARG_TOPIC",
            ),
            ("topic=a%zz".into(), "400 Bad Request", "INVALID_REQUEST"),
            (
                "topic=bad!&channel=c&position=oldest".into(),
                "400 Bad Request",
                "INVALID_ARG_TOPIC",
            ),
            (
                format!("topic={t0}&position=oldest"),
                "400 Bad Request",
                "MISSING_ARG_CHANNEL",
            ),
            (
                format!("topic={t0}&channel=b@d&position=oldest"),
                "400 Bad Request",
                "INVALID_ARG_CHANNEL",
            ),
            (
                format!("topic={t0}&channel=c"),
                "400 Bad Request",
                "MISSING_ARG_TIMESTAMP",
            ),
            (
                format!("topic={t0}&channel=c&timestamp="),
                "400 Bad Request",
                "INVALID_ARG_TIMESTAMP",
            ),
            (
                format!("topic={t0}&channel=c&timestamp=yesterday"),
                "400 Bad Request",
                "INVALID_ARG_TIMESTAMP",
            ),
            (
                format!("topic={t0}&channel=c&timestamp=-5"),
                "400 Bad Request",
                "INVALID_ARG_TIMESTAMP",
            ),
            (
                format!("topic={t0}&channel=c&timestamp=2026-02-30T00:00:00Z"),
                "400 Bad Request",
                "INVALID_ARG_TIMESTAMP",
            ),
            (
                format!("topic={t0}&channel=c&position=middle"),
                "400 Bad Request",
                "INVALID_ARG_POSITION",
            ),
            (
                format!("topic={t0}&channel=c&position="),
                "400 Bad Request",
                "INVALID_ARG_POSITION",
            ),
            (
                format!("topic={t0}&channel=c&position=oldest&timestamp=1"),
                "400 Bad Request",
                "INVALID_ARG_POSITION",
            ),
            (
                "topic=nope&channel=c&position=oldest".into(),
                "404 Not Found",
                "TOPIC_NOT_FOUND",
            ),
            (
                "topic=nope&channel=c&timestamp=1".into(),
                "404 Not Found",
                "TOPIC_NOT_FOUND",
            ),
        ];
        for (q, status, msg) in &cases {
            let raw = b.http_keepalive("POST", &format!("/channel/seek?{q}"), b"");
            assert_v1_error(&raw, &format!("HTTP/1.1 {status}"), msg);
        }
        for t in &topics {
            for arg in ["position=oldest", "position=newest", "timestamp=1"] {
                let raw = b.http_keepalive(
                    "POST",
                    &format!("/channel/seek?topic={t}&channel=c&{arg}"),
                    b"",
                );
                assert_v1_error(&raw, "HTTP/1.1 404 Not Found", "CHANNEL_NOT_FOUND");
            }
            b.admin(&format!("/channel/create?topic={t}&channel=c"));
            for arg in ["position=oldest", "position=newest", "timestamp=1"] {
                seek(&b, t, "c", arg);
            }
        }
        assert!(
            b.topic_stats("nope").is_none(),
            "a refused seek must not create the topic"
        );
    });
}

/// Seek by timestamp, oldest and newest on every shard count, with a memory tail of 10
/// records and 4 KiB segments, so that a seek back lands below the memory tail and in an
/// older segment: the channel reads the records back from disk.
#[test]
fn seek_by_timestamp_oldest_and_newest() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(
            shards,
            &[
                "--retention-time=1h",
                "--mem-queue-size=10",
                "--max-bytes-per-file=4096",
            ],
        );
        for topic in topic_names("seek", 2) {
            b.admin(&format!("/topic/create?topic={topic}"));
            b.admin(&format!("/channel/create?topic={topic}&channel=c"));
            mpub(&b, &topic, "a", 0, 300);
            std::thread::sleep(Duration::from_millis(20));
            mpub(&b, &topic, "b", 300, 600);
            let mut s = b.subscribe(&topic, "c");
            send(&mut s, &line("RDY 1000"));
            let first = consume(&mut s, 600);
            let mut want = names("a", 0, 300);
            want.extend(names("b", 300, 600));
            assert_eq!(bodies(&first), want, "shards={shards} {topic}: first pass");
            let t_b = first[300].ts;
            assert!(first[299].ts < t_b, "two publish times");
            assert_no_frame(&mut s, Duration::from_millis(200));
            b.wait_channel_field(&topic, "c", "in_flight_count", 0);

            // The second half again, from disk (memory keeps 10 records).
            seek(&b, &topic, "c", &format!("timestamp={}", secs(t_b)));
            let again = consume(&mut s, 300);
            assert_eq!(
                bodies(&again),
                names("b", 300, 600),
                "shards={shards} {topic}"
            );
            assert!(again.iter().all(|m| m.attempts == 1), "attempts start at 1");
            assert_eq!(again[0].id, first[300].id, "same message ids");
            assert_no_frame(&mut s, Duration::from_millis(200));

            // One ns later than the first half's time: still the whole second half.
            seek(
                &b,
                &topic,
                "c",
                &format!("timestamp={}", secs(first[0].ts + 1)),
            );
            assert_eq!(bodies(&consume(&mut s, 300)), names("b", 300, 600));

            // Everything, by position and by an old RFC 3339 time.
            seek(&b, &topic, "c", "position=oldest");
            assert_eq!(bodies(&consume(&mut s, 600)), want);
            seek(&b, &topic, "c", "timestamp=2001-09-09T01:46:40Z");
            assert_eq!(bodies(&consume(&mut s, 600)), want);
            assert_no_frame(&mut s, Duration::from_millis(200));

            // A time after the newest message and position=newest: nothing until new
            // messages arrive.
            seek(&b, &topic, "c", &format!("timestamp={}", now_s() + 3600));
            assert_no_frame(&mut s, Duration::from_millis(200));
            b.wait_channel_field(&topic, "c", "depth", 0);
            // Unread backlog skipped by newest (paused, so that nothing is delivered).
            b.admin(&format!("/channel/pause?topic={topic}&channel=c"));
            mpub(&b, &topic, "c", 600, 610);
            b.wait_channel_field(&topic, "c", "depth", 10);
            seek(&b, &topic, "c", "position=newest");
            b.wait_channel_field(&topic, "c", "depth", 0);
            b.admin(&format!("/channel/unpause?topic={topic}&channel=c"));
            assert_no_frame(&mut s, Duration::from_millis(200));
            b.http_pub(&topic, names("d", 610, 611)[0].as_bytes());
            assert_eq!(bodies(&consume(&mut s, 1)), names("d", 610, 611));

            // A seek with no consumer shows in depth; the next one gets it.
            drop(s);
            b.wait_channel_field(&topic, "c", "client_count", 0);
            seek(&b, &topic, "c", "position=oldest");
            b.wait_channel_field(&topic, "c", "depth", 611);
            seek(&b, &topic, "c", &format!("timestamp={}", secs(t_b)));
            b.wait_channel_field(&topic, "c", "depth", 311);
        }
        drop(b);
    });
}

/// In-flight messages are left alone by a seek: still FIN-able, not delivered twice;
/// requeued and deferred ones are dropped (those after the new cursor come again from
/// the log with attempts 1).
#[test]
fn seek_leaves_in_flight_alone_and_drops_requeued() {
    let b = Broker::start(2, &["--retention-time=1h"]);
    let topic = "seekinflight";
    b.admin(&format!("/topic/create?topic={topic}"));
    b.admin(&format!("/channel/create?topic={topic}&channel=c"));
    mpub(&b, topic, "m", 0, 10);
    let mut s = b.subscribe(topic, "c");
    send(&mut s, &line("RDY 3"));
    let held: Vec<Msg> = (0..3).map(|_| read_msg(&mut s)).collect();
    assert_eq!(bodies(&held), names("m", 0, 3));
    // m-0000 goes back with a long delay (deferred), m-0001 requeued at once and then
    // delivered again; m-0002 stays in flight.
    send(&mut s, &line(&format!("REQ {} 60000", held[0].id)));
    let m3 = read_msg(&mut s);
    assert_eq!(bodies(std::slice::from_ref(&m3)), names("m", 3, 4));
    send(&mut s, &line("RDY 0"));
    b.wait_channel_field(topic, "c", "deferred_count", 1);
    send(&mut s, &line(&format!("REQ {} 0", held[1].id)));
    b.wait_channel_field(topic, "c", "in_flight_count", 2);
    // Cursor at 4: in flight m-0002, m-0003; requeued m-0001; deferred m-0000.
    assert_v1_empty_ok(&b.http_keepalive(
        "POST",
        &format!("/channel/seek?topic={topic}&channel=c&position=oldest"),
        b"",
    ));
    b.wait_channel_field(topic, "c", "deferred_count", 0);
    b.wait_channel_field(topic, "c", "in_flight_count", 2);
    // Ready: 0, 1, 4..9 (2 and 3 are in flight: the cursor steps over them).
    b.wait_channel_field(topic, "c", "depth", 8);
    send(&mut s, &line(&format!("FIN {}", held[2].id)));
    send(&mut s, &line(&format!("FIN {}", m3.id)));
    b.wait_channel_field(topic, "c", "in_flight_count", 0);
    send(&mut s, &line("RDY 100"));
    let rest = consume(&mut s, 8);
    let mut want = names("m", 0, 2);
    want.extend(names("m", 4, 10));
    assert_eq!(bodies(&rest), want);
    assert!(rest.iter().all(|m| m.attempts == 1));
    assert_no_frame(&mut s, Duration::from_millis(300));
}

/// A seek is persisted like any cursor: after SIGTERM (exact state) and after kill -9
/// (the last checkpoint, one --sync-timeout later).
#[test]
fn seek_survives_restart() {
    for (shards, kill) in [(1, false), (2, true), (4, false)] {
        let dir =
            std::env::temp_dir().join(format!("nsqd-seek-restart-{}-{shards}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let flags = ["--retention-time=1h", "--sync-timeout=100ms"];
        let topics = topic_names("seekrestart", 3);
        {
            let mut b = Broker::start_in(&dir, shards, &flags);
            for topic in &topics {
                b.admin(&format!("/topic/create?topic={topic}"));
                b.admin(&format!("/channel/create?topic={topic}&channel=c"));
                mpub(&b, topic, "a", 0, 20);
                std::thread::sleep(Duration::from_millis(20));
                mpub(&b, topic, "b", 20, 40);
                let mut s = b.subscribe(topic, "c");
                send(&mut s, &line("RDY 100"));
                let got = consume(&mut s, 40);
                drop(s);
                b.wait_channel_field(topic, "c", "depth", 0);
                b.wait_channel_field(topic, "c", "in_flight_count", 0);
                seek(&b, topic, "c", &format!("timestamp={}", secs(got[20].ts)));
                b.wait_channel_field(topic, "c", "depth", 20);
            }
            if kill {
                // Several checkpoints' time.
                std::thread::sleep(Duration::from_millis(1000));
                b.kill9();
            } else {
                assert!(b.terminate().is_some_and(|s| s.success()));
            }
        }
        let b = Broker::start_in(&dir, shards, &flags);
        for topic in &topics {
            b.wait_channel_field(topic, "c", "depth", 20);
            let mut s = b.subscribe(topic, "c");
            send(&mut s, &line("RDY 100"));
            assert_eq!(
                bodies(&consume(&mut s, 20)),
                names("b", 20, 40),
                "shards={shards} kill={kill} {topic}"
            );
            assert_no_frame(&mut s, Duration::from_millis(200));
        }
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--retention-time` keeps consumed segments (and /stats shows them) until their newest
/// record is older than the window; segments a channel has not consumed stay regardless.
#[test]
fn retention_time_keeps_consumed_segments_until_they_expire() {
    let b = Broker::start(
        2,
        &[
            "--retention-time=10s",
            "--max-bytes-per-file=4096",
            "--sync-timeout=100ms",
        ],
    );
    let (done, lazy) = ("retained", "unconsumed");
    for t in [done, lazy] {
        b.admin(&format!("/topic/create?topic={t}"));
        b.admin(&format!("/channel/create?topic={t}&channel=c"));
        for i in 0..30 {
            mpub(&b, t, "m", i * 10, i * 10 + 10);
        }
    }
    let mut s = b.subscribe(done, "c");
    send(&mut s, &line("RDY 500"));
    let got = consume(&mut s, 300);
    b.wait_channel_field(done, "c", "in_flight_count", 0);
    // Settled: the writer has flushed everything (--sync-timeout), so the segment
    // files stop changing.
    let segment_names = || -> Vec<String> {
        segment_files(&b.data_dir, done)
            .into_iter()
            .map(|f| f.0)
            .collect()
    };
    let mut last = segment_names();
    wait_for("the topic's segment files to settle", || {
        std::thread::sleep(Duration::from_millis(100));
        let now = segment_names();
        let settled = now == last && now.len() >= 5;
        last = now;
        settled
    });
    let before = last;
    assert!(before.len() >= 5, "several segments: {before:?}");
    // Several checkpoints later, every consumed segment is still there.
    std::thread::sleep(Duration::from_millis(500));
    let after: Vec<String> = segment_files(&b.data_dir, done)
        .into_iter()
        .map(|f| f.0)
        .collect();
    assert!(
        before.iter().all(|f| after.contains(f)),
        "{before:?} -> {after:?}"
    );
    let st = b.topic_stats(done).unwrap();
    assert_eq!(st["retained_messages"], 300, "{st}");
    assert_eq!(st["retained_oldest_timestamp"], got[0].ts, "{st}");
    let on_disk: u64 = segment_files(&b.data_dir, done).iter().map(|f| f.1).sum();
    assert_eq!(st["retained_bytes"], on_disk, "{st}");
    // Replay works from the retained segments.
    seek(&b, done, "c", "position=oldest");
    assert_eq!(bodies(&consume(&mut s, 300)), names("m", 0, 300));
    // Once the window has passed, consumed segments go (the one being written stays).
    let gone = wait_until(Duration::from_secs(25), || {
        segment_files(&b.data_dir, done).len() == 1
    });
    assert!(
        gone,
        "expired segments deleted: {:?}",
        segment_files(&b.data_dir, done)
    );
    let ok = wait_until(Duration::from_secs(2), || {
        let st = b.topic_stats(done).unwrap();
        st["retained_messages"].as_u64().is_some_and(|n| n < 300)
            && st["retained_oldest_timestamp"].as_i64() > Some(got[0].ts)
    });
    assert!(ok, "{}", b.topic_stats(done).unwrap());
    // Unconsumed segments are never deleted by retention.
    assert!(segment_files(&b.data_dir, lazy).len() >= 5);
    let mut s = b.subscribe(lazy, "c");
    send(&mut s, &line("RDY 500"));
    assert_eq!(bodies(&consume(&mut s, 300)), names("m", 0, 300));
}

/// `--retention-bytes` deletes the oldest consumed segments while a topic's segment files
/// exceed it; without retention flags, consumed segments go at once and /stats keeps
/// nsqd's schema (no `retained_*` fields).
#[test]
fn retention_bytes_and_default() {
    let limit = 16384u64;
    let b = Broker::start(
        1,
        &[
            "--retention-bytes=16384",
            "--max-bytes-per-file=4096",
            "--sync-timeout=100ms",
        ],
    );
    let t = "bysize";
    b.admin(&format!("/topic/create?topic={t}"));
    b.admin(&format!("/channel/create?topic={t}&channel=c"));
    for i in 0..30 {
        mpub(&b, t, "m", i * 10, i * 10 + 10);
    }
    // Sealed segments only: the one being written is not counted.
    let total = |b: &Broker| -> u64 {
        let files = segment_files(&b.data_dir, t);
        files[..files.len().saturating_sub(1)]
            .iter()
            .map(|f| f.1)
            .sum()
    };
    assert!(wait_until(Duration::from_secs(2), || total(&b) > 2 * limit));
    // Not consumed yet: nothing goes.
    std::thread::sleep(Duration::from_millis(400));
    assert!(total(&b) > 2 * limit);
    let mut s = b.subscribe(t, "c");
    send(&mut s, &line("RDY 500"));
    consume(&mut s, 300);
    let ok = wait_until(Duration::from_secs(5), || total(&b) <= limit);
    assert!(ok, "{:?}", segment_files(&b.data_dir, t));
    assert!(
        segment_files(&b.data_dir, t).len() >= 2,
        "the newest segments kept"
    );
    let mut kept = 0;
    let ok = wait_until(Duration::from_secs(2), || {
        kept = b.topic_stats(t).unwrap()["retained_messages"]
            .as_u64()
            .unwrap_or(0);
        kept > 0 && kept < 300
    });
    assert!(ok, "{}", b.topic_stats(t).unwrap());
    seek(&b, t, "c", "position=oldest");
    let again = consume(&mut s, kept as usize);
    assert_eq!(bodies(&again), names("m", 300 - kept as usize, 300));
    drop(b);

    let b = Broker::start(1, &["--max-bytes-per-file=4096", "--sync-timeout=100ms"]);
    let t = "noretention";
    b.admin(&format!("/topic/create?topic={t}"));
    b.admin(&format!("/channel/create?topic={t}&channel=c"));
    for i in 0..30 {
        mpub(&b, t, "m", i * 10, i * 10 + 10);
    }
    let mut s = b.subscribe(t, "c");
    send(&mut s, &line("RDY 500"));
    consume(&mut s, 300);
    // (At most the segment being written stays; none when its records were consumed
    // before they were written.)
    let ok = wait_until(Duration::from_secs(5), || {
        segment_files(&b.data_dir, t).len() <= 1
    });
    assert!(ok, "{:?}", segment_files(&b.data_dir, t));
    let st = b.topic_stats(t).unwrap();
    assert!(st.get("retained_messages").is_none(), "{st}");
    // A seek reaches only what is left once things settled (memory keeps records
    // until they are written or known finished, which the next checkpoints notice).
    // A seek that came too early brought every message back: the channel is moved
    // past them again (`newest`) and the seek tried once more.
    drop(s);
    b.wait_channel_field(t, "c", "client_count", 0);
    let mut depth = 0;
    let settled = wait_until(Duration::from_secs(10), || {
        seek(&b, t, "c", "position=oldest");
        depth = b.channel_stats(t, "c").unwrap()["depth"].as_u64().unwrap();
        if depth >= 300 {
            seek(&b, t, "c", "position=newest");
        }
        depth < 300
    });
    assert!(settled, "depth {depth}");
}

/// A seek right after the messages were consumed, before the writer flushed them (it
/// buffers until the next sync): memory no longer holds them, so the seek first makes
/// them readable on disk.
#[test]
fn seek_reaches_records_not_yet_flushed() {
    for_each_shards(&[1, 2], |shards| {
        let b = Broker::start(shards, &["--retention-time=1h", "--sync-timeout=30s"]);
        for topic in topic_names("unflushed", 2) {
            b.admin(&format!("/topic/create?topic={topic}"));
            b.admin(&format!("/channel/create?topic={topic}&channel=c"));
            mpub(&b, &topic, "a", 0, 50);
            std::thread::sleep(Duration::from_millis(20));
            mpub(&b, &topic, "b", 50, 100);
            let mut s = b.subscribe(&topic, "c");
            send(&mut s, &line("RDY 200"));
            let first = consume(&mut s, 100);
            seek(
                &b,
                &topic,
                "c",
                &format!("timestamp={}", secs(first[50].ts)),
            );
            assert_eq!(bodies(&consume(&mut s, 50)), names("b", 50, 100), "{topic}");
            seek(&b, &topic, "c", "position=oldest");
            assert_eq!(bodies(&consume(&mut s, 100)), bodies(&first), "{topic}");
            assert_no_frame(&mut s, Duration::from_millis(200));
        }
    });
}
