//! PUB, MPUB and DPUB over TCP: replies, every size and limit error (exact texts, fatal
//! close), the MPUB doubled E_BAD_TOPIC quirk, MPUB's topic creation before the body is
//! read, all-or-nothing batches, deferred publishing, and delivery of what was published
//! (cross-shard). NSQ_REFERENCE.md §1.4, §1.7, §2, §7 "Size limits".

use crate::common;

use common::*;
use std::net::Shutdown;
use std::time::{Duration, Instant};

const LIMITS: [&str; 2] = ["--max-msg-size=100", "--max-body-size=1000"];

#[test]
fn pub_reply_is_byte_exact() {
    // Transcript: PUB tcp_t hello -> 00000006 00000000 4f4b
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, b"PUB tcp_t\n\x00\x00\x00\x05hello");
    let raw = read_raw_frame(&mut s).unwrap();
    assert_eq!(show(&raw), show(b"\x00\x00\x00\x06\x00\x00\x00\x00OK"));
    // Transcript: MPUB tcp_t [a,bb] and DPUB tcp_t 1000 def -> OK each; NOP -> nothing.
    send(
        &mut s,
        b"MPUB tcp_t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bb",
    );
    expect_frame(&mut s, 0, b"OK");
    send(&mut s, b"DPUB tcp_t 1000\n\x00\x00\x00\x03def");
    expect_frame(&mut s, 0, b"OK");
    send(&mut s, b"NOP\n");
    send(&mut s, b"PUB bad!topic\n\x00\x00\x00\x01x");
    // Transcript: 00000037 00000001 "E_BAD_TOPIC PUB topic name \"bad!topic\" is not valid"
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x00, 0x37, 0x00, 0x00, 0x00, 0x01];
    want.extend_from_slice(b"E_BAD_TOPIC PUB topic name \"bad!topic\" is not valid");
    assert_eq!(show(&raw), show(&want));
    assert_closed(&mut s);
    let t = b.topic_stats("tcp_t").expect("topic tcp_t");
    assert_eq!(t["message_count"], 4);
    assert_eq!(t["message_bytes"], 5 + 1 + 2 + 3);
}

#[test]
fn pub_size_limits() {
    let b = Broker::start(1, &LIMITS);
    let mut s = b.connect_v2();
    send(&mut s, &pub_cmd("limits", &[b'x'; 95]));
    expect_ok(&mut s);
    send(&mut s, &pub_cmd("limits", &[b'x'; 100]));
    expect_ok(&mut s);
    send(&mut s, &pub_cmd("limits", &[b'x'; 105]));
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB message too big 105 > 100");

    let mut s = b.connect_v2();
    send(&mut s, &pub_cmd("limits", b""));
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB invalid message body size 0");

    let mut s = b.connect_v2();
    send(&mut s, b"PUB limits\n\xff\xff\xff\xfe");
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB invalid message body size -2");

    let t = b.topic_stats("limits").unwrap();
    assert_eq!(
        t["message_count"], 2,
        "only the two accepted messages count"
    );
    assert_eq!(t["message_bytes"], 195);
}

#[test]
fn pub_too_big_with_default_limit_matches_transcript() {
    // Transcript: size field 1048577, body not sent ->
    // "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"client_id": "ex"}"#));
    expect_ok(&mut s);
    send(&mut s, b"PUB tcp_t\n\x00\x10\x00\x01");
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x00, 0x37, 0x00, 0x00, 0x00, 0x01];
    want.extend_from_slice(b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576");
    assert_eq!(show(&raw), show(&want));
    assert_closed(&mut s);

    // Transcript: empty body -> 00000031 00000001 "E_BAD_MESSAGE PUB invalid message body size 0"
    let mut s = b.connect_v2();
    send(&mut s, b"PUB tcp_t\n\x00\x00\x00\x00");
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x00, 0x31, 0x00, 0x00, 0x00, 0x01];
    want.extend_from_slice(b"E_BAD_MESSAGE PUB invalid message body size 0");
    assert_eq!(show(&raw), show(&want));
    assert_closed(&mut s);

    // Exactly the maximum is accepted.
    let mut s = b.connect_v2();
    send(&mut s, &pub_cmd("exact_max", &vec![b'm'; 1048576]));
    expect_ok(&mut s);
}

#[test]
fn pub_parameter_and_read_errors() {
    let b = Broker::start(1, &LIMITS);
    let mut s = b.connect_v2();
    send(&mut s, b"PUB\n");
    expect_fatal(&mut s, "E_INVALID PUB insufficient number of parameters");

    // The topic is checked before the body size.
    let mut s = b.connect_v2();
    send(&mut s, b"PUB bad!t\n\x00\x00\x00\x00");
    expect_fatal(&mut s, "E_BAD_TOPIC PUB topic name \"bad!t\" is not valid");

    let mut s = b.connect_v2();
    send(&mut s, b"PUB t\n\x00\x00");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB failed to read message body size");

    let mut s = b.connect_v2();
    send(&mut s, b"PUB t\n\x00\x00\x00\x0aabc");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB failed to read message body");
}

#[test]
fn failed_pub_does_not_create_the_topic() {
    let b = Broker::start(1, &LIMITS);
    let mut s = b.connect_v2();
    send(&mut s, &pub_cmd("not_created", &[b'x'; 101]));
    expect_fatal(&mut s, "E_BAD_MESSAGE PUB message too big 101 > 100");
    assert!(b.topic_stats("not_created").is_none());
}

fn mpub_raw(topic: &str, bodies: &[Vec<u8>]) -> Vec<u8> {
    let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_slice()).collect();
    mpub_cmd(topic, &refs)
}

#[test]
fn mpub_size_limits() {
    let b = Broker::start(1, &LIMITS);
    let mut s = b.connect_v2();
    send(&mut s, &mpub_raw("mp", &vec![vec![b'x'; 100]; 5]));
    expect_ok(&mut s);
    b.wait_topic_field("mp", "message_count", 5);
    b.wait_topic_field("mp", "depth", 5);

    // 4 + 11 * (4 + 100) = 1148
    let mut s = b.connect_v2();
    send(&mut s, &mpub_raw("mp", &vec![vec![b'x'; 100]; 11]));
    expect_fatal(&mut s, "E_BAD_BODY MPUB body too big 1148 > 1000");

    let mut s = b.connect_v2();
    let mut bodies = vec![vec![b'x'; 100]; 5];
    bodies.push(vec![]);
    send(&mut s, &mpub_raw("mp", &bodies));
    expect_fatal(&mut s, "E_BAD_MESSAGE MPUB invalid message(5) body size 0");

    let mut s = b.connect_v2();
    send(&mut s, &mpub_raw("mp", &vec![vec![b'x'; 101]; 5]));
    expect_fatal(&mut s, "E_BAD_MESSAGE MPUB message too big 101 > 100");

    // The batch is all or nothing.
    assert_eq!(b.topic_stats("mp").unwrap()["message_count"], 5);
}

#[test]
fn mpub_body_and_count_errors() {
    let b = Broker::start(1, &LIMITS);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"MPUB\n".to_vec(),
            "E_INVALID MPUB insufficient number of parameters",
        ),
        (
            b"MPUB bad!t\n\x00\x00\x00\x08".to_vec(),
            "E_BAD_TOPIC E_BAD_TOPIC MPUB topic name \"bad!t\" is not valid",
        ),
        (
            b"MPUB m2\n\x00\x00\x00\x00".to_vec(),
            "E_BAD_BODY MPUB invalid body size 0",
        ),
        (
            b"MPUB m2\n\xff\xff\xff\xff".to_vec(),
            "E_BAD_BODY MPUB invalid body size -1",
        ),
        (
            b"MPUB m2\n\x00\x00\x03\xe9".to_vec(),
            "E_BAD_BODY MPUB body too big 1001 > 1000",
        ),
        (
            b"MPUB m2\n\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00\x01x".to_vec(),
            "E_BAD_BODY MPUB invalid message count 0",
        ),
        (
            b"MPUB m2\n\x00\x00\x00\x09\xff\xff\xff\xff\x00\x00\x00\x01x".to_vec(),
            "E_BAD_BODY MPUB invalid message count -1",
        ),
        // (max-body-size - 4) / 5 = 199 messages at most.
        (
            b"MPUB m2\n\x00\x00\x03\xe8\x00\x00\x00\xc8".to_vec(),
            "E_BAD_BODY MPUB invalid message count 200",
        ),
        (
            b"MPUB m2\n\x00\x00\x00\x09\x00\x00\x00\x02\xff\xff\xff\xff".to_vec(),
            "E_BAD_MESSAGE MPUB invalid message(0) body size -1",
        ),
        (
            b"MPUB m2\n\x00\x00\x00\x0e\x00\x00\x00\x02\x00\x00\x00\x01x\x00\x00\x00\x00".to_vec(),
            "E_BAD_MESSAGE MPUB invalid message(1) body size 0",
        ),
    ];
    for (cmd, err) in cases {
        let mut s = b.connect_v2();
        send(&mut s, &cmd);
        expect_fatal(&mut s, err);
    }
    // 199 messages of 1 byte: 4 + 199 * 5 = 999 <= 1000 is accepted.
    let mut s = b.connect_v2();
    send(&mut s, &mpub_raw("m199", &vec![vec![b'z']; 199]));
    expect_ok(&mut s);
    b.wait_topic_field("m199", "message_count", 199);
}

#[test]
fn mpub_truncated_stream_errors() {
    let b = Broker::start(1, &LIMITS);
    let cases: Vec<(&[u8], &str)> = vec![
        (
            b"MPUB m3\n\x00\x00",
            "E_BAD_BODY MPUB failed to read body size",
        ),
        (
            b"MPUB m3\n\x00\x00\x00\x04\x00\x00",
            "E_BAD_BODY MPUB failed to read message count",
        ),
        (
            b"MPUB m3\n\x00\x00\x00\x09\x00\x00\x00\x01\x00",
            "E_BAD_MESSAGE MPUB failed to read message(0) body size",
        ),
        (
            b"MPUB m3\n\x00\x00\x00\x0e\x00\x00\x00\x02\x00\x00\x00\x01x\x00",
            "E_BAD_MESSAGE MPUB failed to read message(1) body size",
        ),
        (
            b"MPUB m3\n\x00\x00\x00\x0f\x00\x00\x00\x01\x00\x00\x00\x07abc",
            "E_BAD_MESSAGE MPUB failed to read message body",
        ),
    ];
    for (cmd, err) in cases {
        let mut s = b.connect_v2();
        send(&mut s, cmd);
        s.shutdown(Shutdown::Write).unwrap();
        expect_fatal(&mut s, err);
    }
}

#[test]
fn mpub_creates_topic_before_reading_the_body() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &LIMITS);
        for t in topic_names("mpub_early", 3) {
            let mut s = b.connect_v2();
            send(&mut s, format!("MPUB {t}\n\x00\x00\x00\x00").as_bytes());
            expect_fatal(&mut s, "E_BAD_BODY MPUB invalid body size 0");
            let ts = b.topic_stats(&t);
            assert!(
                ts.is_some(),
                "shards={shards}: MPUB creates {t} before reading the body"
            );
            assert_eq!(ts.unwrap()["message_count"], 0);
            // PUB on the other hand validates the body first.
            let other = format!("{t}_pub");
            let mut s = b.connect_v2();
            send(&mut s, format!("PUB {other}\n\x00\x00\x00\x00").as_bytes());
            expect_fatal(&mut s, "E_BAD_MESSAGE PUB invalid message body size 0");
            assert!(b.topic_stats(&other).is_none());
        }
    });
}

#[test]
fn mpub_delivers_every_message_in_order() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("mpub_dlv", 3) {
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 100\n");
            let bodies: Vec<Vec<u8>> = (0..20).map(|i| format!("m{i}-{t}").into_bytes()).collect();
            let mut p = b.connect_v2();
            send(&mut p, &mpub_raw(&t, &bodies));
            expect_ok(&mut p);
            let mut ids = std::collections::HashSet::new();
            for want in &bodies {
                let m = read_msg(&mut c);
                assert_eq!(show(&m.body), show(want), "shards={shards}");
                assert_eq!(m.attempts, 1);
                assert!(ids.insert(m.id.clone()), "duplicate id {}", m.id);
            }
        }
    });
}

#[test]
fn dpub_errors() {
    let b = Broker::start(1, &["--max-msg-size=100", "--max-req-timeout=10s"]);
    let cases: Vec<(&[u8], &str)> = vec![
        (
            b"DPUB\n",
            "E_INVALID DPUB insufficient number of parameters",
        ),
        (
            b"DPUB dp\n",
            "E_INVALID DPUB insufficient number of parameters",
        ),
        (
            b"DPUB bad!t 10\n",
            "E_BAD_TOPIC DPUB topic name \"bad!t\" is not valid",
        ),
        (
            b"DPUB dp abc\n",
            "E_INVALID DPUB could not parse timeout abc",
        ),
        (b"DPUB dp -1\n", "E_INVALID DPUB could not parse timeout -1"),
        (
            b"DPUB dp 1.5\n",
            "E_INVALID DPUB could not parse timeout 1.5",
        ),
        (
            b"DPUB dp 10001\n",
            "E_INVALID DPUB timeout 10001 out of range 0-10000",
        ),
        (
            b"DPUB dp 10\n\x00\x00\x00\x00",
            "E_BAD_MESSAGE DPUB invalid message body size 0",
        ),
        (
            b"DPUB dp 10\n\x00\x00\x00\x65",
            "E_BAD_MESSAGE DPUB message too big 101 > 100",
        ),
    ];
    for (cmd, err) in cases {
        let mut s = b.connect_v2();
        send(&mut s, cmd);
        expect_fatal(&mut s, err);
    }
    let mut s = b.connect_v2();
    send(&mut s, b"DPUB dp 10\n\x00\x00");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(
        &mut s,
        "E_BAD_MESSAGE DPUB failed to read message body size",
    );
    let mut s = b.connect_v2();
    send(&mut s, b"DPUB dp 10\n\x00\x00\x00\x05ab");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_MESSAGE DPUB failed to read message body");
    // Boundaries accepted: 0 and exactly max-req-timeout; exactly max-msg-size.
    let mut s = b.connect_v2();
    send(&mut s, &dpub_cmd("dp", 0, b"now"));
    expect_ok(&mut s);
    send(&mut s, &dpub_cmd("dp", 10000, &[b'x'; 100]));
    expect_ok(&mut s);
}

#[test]
fn dpub_out_of_range_with_default_max() {
    // §7: DPUB of max+100 ms -> E_INVALID DPUB timeout 3600100 out of range 0-3600000
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &dpub_cmd("dp_default", 3600100, b"x"));
    expect_fatal(
        &mut s,
        "E_INVALID DPUB timeout 3600100 out of range 0-3600000",
    );
}

#[test]
fn dpub_goes_to_the_deferred_queue() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("dpub_def", 3) {
            b.admin(&format!("/topic/create?topic={t}"));
            b.admin(&format!("/channel/create?topic={t}&channel=ch"));
            let mut s = b.connect_v2();
            send(&mut s, &dpub_cmd(&t, 1000 * 60, b"later"));
            expect_ok(&mut s);
            b.wait_channel_field(&t, "ch", "deferred_count", 1);
            let c = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(c["message_count"], 1, "shards={shards} {c}");
            assert_eq!(c["depth"], 0, "deferred messages are not in depth: {c}");
            let ts = b.topic_stats(&t).unwrap();
            assert_eq!(ts["message_count"], 1);
        }
    });
}

#[test]
fn dpub_delivers_after_the_delay() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("dpub_dlv", 2) {
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 5\n");
            let mut p = b.connect_v2();
            let start = Instant::now();
            send(&mut p, &dpub_cmd(&t, 700, b"deferred"));
            expect_ok(&mut p);
            send(&mut p, &dpub_cmd(&t, 0, b"immediate"));
            expect_ok(&mut p);
            let m = read_msg(&mut c);
            assert_eq!(show(&m.body), "immediate", "DPUB 0 is an ordinary publish");
            // Before the deferred one (which is due after 700 ms); the bound is loose
            // because the default 250 ms output-buffer flush and a loaded CI add latency.
            assert!(
                start.elapsed() < Duration::from_millis(1500),
                "immediate took {:?}",
                start.elapsed()
            );
            let m = read_msg(&mut c);
            let el = start.elapsed();
            assert_eq!(show(&m.body), "deferred");
            assert_eq!(m.attempts, 1);
            assert!(
                el >= Duration::from_millis(650),
                "deferred message arrived after {el:?}"
            );
            assert!(
                el < Duration::from_millis(3000),
                "deferred message arrived after {el:?}"
            );
        }
    });
}

#[test]
fn published_message_fields() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("fields", 3) {
            let before = now_ns();
            // Published before any SUB: delivered after SUB + RDY 1.
            b.tcp_pub(&t, b"payload \x00\x01\xff binary");
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 1\n");
            let m = read_msg(&mut c);
            let after = now_ns();
            assert_eq!(m.body, b"payload \x00\x01\xff binary".to_vec());
            assert_eq!(m.attempts, 1);
            assert_eq!(m.id.len(), 16);
            assert!(
                m.id.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
                "id must be 16 lowercase hex characters: {:?}",
                m.id
            );
            assert!(
                m.ts >= before - 1_000_000_000 && m.ts <= after,
                "timestamp {} not in [{before}, {after}]",
                m.ts
            );
        }
    });
}

#[test]
fn pub_allowed_while_subscribed() {
    let b = Broker::start(2, &[]);
    let mut s = b.subscribe("pub_sub_state", "c");
    send(&mut s, &pub_cmd("pub_sub_other", b"x"));
    expect_ok(&mut s);
    send(&mut s, &mpub_cmd("pub_sub_other", &[b"y", b"z"]));
    expect_ok(&mut s);
    send(&mut s, &dpub_cmd("pub_sub_other", 10, b"w"));
    expect_ok(&mut s);
    b.wait_topic_field("pub_sub_other", "message_count", 4);
}

#[test]
fn message_ids_are_unique_per_topic() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe("ids", "c");
    send(&mut c, b"RDY 500\n");
    let mut p = b.connect_v2();
    let bodies: Vec<Vec<u8>> = (0..150).map(|i| format!("{i}").into_bytes()).collect();
    for chunk in bodies.chunks(50) {
        send(&mut p, &mpub_raw("ids", chunk));
        expect_ok(&mut p);
    }
    let mut ids = std::collections::HashSet::new();
    for _ in 0..150 {
        let m = read_msg(&mut c);
        assert!(ids.insert(m.id.clone()), "duplicate id {}", m.id);
    }
}

#[test]
fn mpub_reads_messages_from_the_stream_not_the_outer_length() {
    // §1.4 MPUB item 6: the server reads the messages one after another and does not check
    // that the bytes consumed equal the outer length.
    let b = Broker::start(1, &[]);
    // Outer length 4 bytes larger than the messages: the next command line follows
    // directly after the messages and is executed.
    let mut s = b.connect_v2();
    let mut cmd = b"MPUB ol\n".to_vec();
    let inner = b"\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bb"; // 15 bytes
    cmd.extend_from_slice(&((inner.len() + 6) as u32).to_be_bytes());
    cmd.extend_from_slice(inner);
    cmd.extend_from_slice(b"BOGUS\n");
    send(&mut s, &cmd);
    expect_ok(&mut s);
    expect_fatal(&mut s, "E_INVALID invalid command BOGUS");
    // Outer length smaller than the messages: still accepted.
    let mut s = b.connect_v2();
    let mut cmd = b"MPUB ol\n".to_vec();
    cmd.extend_from_slice(&8u32.to_be_bytes());
    cmd.extend_from_slice(inner);
    send(&mut s, &cmd);
    expect_ok(&mut s);
    send(&mut s, &pub_cmd("ol", b"c"));
    expect_ok(&mut s);
    b.wait_topic_field("ol", "message_count", 5);
}

#[test]
fn invalid_command_with_params_names_only_the_command() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, b"BOGUS a b\n");
    expect_fatal(&mut s, "E_INVALID invalid command BOGUS");
}
