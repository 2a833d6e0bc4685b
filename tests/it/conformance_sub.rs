//! SUB, RDY, FIN, REQ, TOUCH, CLS, AUTH and the client state machine: exact error texts,
//! fatal errors close the connection, E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED leave it
//! open, RDY as an in-flight window, channel fan-out and consumer distribution, ephemeral
//! channels, max-channel-consumers. NSQ_REFERENCE.md §1.2-§1.4, §1.10, §2, §7.

use crate::common;

use common::*;
use std::collections::HashSet;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

const ZERO_ID: &str = "0000000000000000";

// ----------------------------------------------------------------------------------------
// State machine
// ----------------------------------------------------------------------------------------

#[test]
fn commands_that_need_subscribed_state_are_fatal_in_init() {
    let b = Broker::start(1, &[]);
    let cases = [
        ("RDY 1", "E_INVALID cannot RDY in current state"),
        ("RDY", "E_INVALID cannot RDY in current state"),
        (
            &*format!("FIN {ZERO_ID}"),
            "E_INVALID cannot FIN in current state",
        ),
        ("FIN", "E_INVALID cannot FIN in current state"),
        (
            &*format!("REQ {ZERO_ID} 0"),
            "E_INVALID cannot REQ in current state",
        ),
        (
            &*format!("TOUCH {ZERO_ID}"),
            "E_INVALID cannot TOUCH in current state",
        ),
        ("CLS", "E_INVALID cannot CLS in current state"),
    ];
    for (cmd, err) in cases {
        let mut s = b.connect_v2();
        send(&mut s, &line(cmd));
        expect_fatal(&mut s, err);
    }
    // Also after an IDENTIFY (still init).
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"client_id":"x"}"#));
    expect_ok(&mut s);
    send(&mut s, b"RDY 1\n");
    expect_fatal(&mut s, "E_INVALID cannot RDY in current state");
}

#[test]
fn second_sub_is_fatal() {
    let b = Broker::start(1, &[]);
    let mut s = b.subscribe("twice", "c");
    send(&mut s, b"SUB twice c2\n");
    expect_fatal(&mut s, "E_INVALID cannot SUB in current state");
}

#[test]
fn sub_parameter_errors() {
    let b = Broker::start(1, &[]);
    let cases = [
        ("SUB", "E_INVALID SUB insufficient number of parameters"),
        ("SUB t", "E_INVALID SUB insufficient number of parameters"),
        (
            "SUB bad!t c",
            "E_BAD_TOPIC SUB topic name \"bad!t\" is not valid",
        ),
        (
            "SUB bad!t bad!c",
            "E_BAD_TOPIC SUB topic name \"bad!t\" is not valid",
        ),
        (
            "SUB t bad!c",
            "E_BAD_CHANNEL SUB channel name \"bad!c\" is not valid",
        ),
    ];
    for (cmd, err) in cases {
        let mut s = b.connect_v2();
        send(&mut s, &line(cmd));
        expect_fatal(&mut s, err);
    }
    assert!(b.topic_stats("t").is_none(), "failed SUBs create nothing");
}

#[test]
fn sub_bad_channel_matches_transcript() {
    // Transcript: SUB tcp_t bad!ch -> 00000038 00000001 E_BAD_CHANNEL SUB channel name "bad!ch" is not valid
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"client_id": "ex"}"#));
    expect_ok(&mut s);
    send(&mut s, b"SUB tcp_t bad!ch\n");
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x00, 0x38, 0x00, 0x00, 0x00, 0x01];
    want.extend_from_slice(b"E_BAD_CHANNEL SUB channel name \"bad!ch\" is not valid");
    assert_eq!(show(&raw), show(&want));
    assert_closed(&mut s);
}

#[test]
fn sub_creates_topic_and_channel() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let topics = topic_names("subcreate", 4);
        let _conns: Vec<TcpStream> = topics.iter().map(|t| b.subscribe(t, "chan")).collect();
        for t in &topics {
            let c = b
                .channel_stats(t, "chan")
                .unwrap_or_else(|| panic!("shards={shards}: {t}/chan missing"));
            assert_eq!(c["client_count"], 1);
            let client = &c["clients"][0];
            assert_eq!(client["state"], 3);
            assert_eq!(client["ready_count"], 0, "RDY starts at 0");
        }
    });
}

// ----------------------------------------------------------------------------------------
// RDY
// ----------------------------------------------------------------------------------------

#[test]
fn rdy_errors() {
    let b = Broker::start(1, &["--max-rdy-count=50"]);
    let cases = [
        ("RDY 51", "E_INVALID RDY count 51 out of range 0-50"),
        (
            "RDY 99999999999",
            "E_INVALID RDY count 99999999999 out of range 0-50",
        ),
        ("RDY abc", "E_INVALID RDY could not parse count abc"),
        ("RDY -1", "E_INVALID RDY could not parse count -1"),
        ("RDY +1", "E_INVALID RDY could not parse count +1"),
        ("RDY 1.0", "E_INVALID RDY could not parse count 1.0"),
    ];
    for (cmd, err) in cases {
        let mut s = b.subscribe("rdy_err", "c");
        send(&mut s, &line(cmd));
        expect_fatal(&mut s, err);
    }
    let mut s = b.subscribe("rdy_err", "ok");
    send(&mut s, b"RDY 50\n");
    send(&mut s, b"RDY 0\n");
    assert_no_frame(&mut s, Duration::from_millis(200));
    send(&mut s, &pub_cmd("rdy_err_other", b"x"));
    expect_ok(&mut s);
}

#[test]
fn rdy_without_count_means_one() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("rdy_default", 2) {
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY\n");
            for i in 0..3 {
                b.http_pub(&t, format!("m{i}").as_bytes());
            }
            let m = read_msg(&mut c);
            assert_eq!(show(&m.body), "m0");
            // Only one in flight.
            assert_no_frame(&mut c, Duration::from_millis(500));
            b.wait_channel_field(&t, "c", "in_flight_count", 1);
            let client = b.channel_stats(&t, "c").unwrap()["clients"][0].clone();
            assert_eq!(client["ready_count"], 1, "shards={shards} {client}");
        }
    });
}

#[test]
fn rdy_is_a_window_not_a_counter() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("rdy_window", 3) {
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 2\n");
            let mut p = b.connect_v2();
            let bodies: Vec<Vec<u8>> = (0..5).map(|i| format!("w{i}").into_bytes()).collect();
            let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
            send(&mut p, &mpub_cmd(&t, &refs));
            expect_ok(&mut p);
            let m0 = read_msg(&mut c);
            let m1 = read_msg(&mut c);
            assert_eq!((show(&m0.body), show(&m1.body)), ("w0".into(), "w1".into()));
            assert_no_frame(&mut c, Duration::from_millis(400));
            // FIN frees one slot: the next message flows without a new RDY.
            send(&mut c, &line(&format!("FIN {}", m0.id)));
            let m2 = read_msg(&mut c);
            assert_eq!(show(&m2.body), "w2", "shards={shards}");
            assert_no_frame(&mut c, Duration::from_millis(300));
            // REQ frees a slot too (the requeued one or the next comes).
            send(&mut c, &line(&format!("FIN {}", m1.id)));
            send(&mut c, &line(&format!("FIN {}", m2.id)));
            let m3 = read_msg(&mut c);
            let m4 = read_msg(&mut c);
            assert_eq!((show(&m3.body), show(&m4.body)), ("w3".into(), "w4".into()));
            send(&mut c, &line(&format!("FIN {}", m3.id)));
            send(&mut c, &line(&format!("FIN {}", m4.id)));
            b.wait_channel_field(&t, "c", "in_flight_count", 0);
            let client = b.channel_stats(&t, "c").unwrap()["clients"][0].clone();
            assert_eq!(client["finish_count"], 5);
            assert_eq!(client["message_count"], 5);
            assert_eq!(client["ready_count"], 2, "RDY is never used up");
        }
    });
}

#[test]
fn rdy_zero_stops_delivery() {
    let b = Broker::start(2, &[]);
    let mut c = b.subscribe("rdy_zero", "c");
    send(&mut c, b"RDY 5\n");
    b.http_pub("rdy_zero", b"a");
    let m = read_msg(&mut c);
    send(&mut c, &line(&format!("FIN {}", m.id)));
    send(&mut c, b"RDY 0\n");
    // Make sure RDY 0 was processed before publishing (a round trip through the connection).
    send(&mut c, &pub_cmd("rdy_zero_sync", b"s"));
    expect_ok(&mut c);
    b.http_pub("rdy_zero", b"b");
    assert_no_frame(&mut c, Duration::from_millis(600));
    b.wait_channel_field("rdy_zero", "c", "depth", 1);
    send(&mut c, b"RDY 1\n");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "b");
}

// ----------------------------------------------------------------------------------------
// FIN / REQ / TOUCH
// ----------------------------------------------------------------------------------------

#[test]
fn fin_req_touch_parameter_errors_are_fatal() {
    let b = Broker::start(1, &[]);
    let cases = [
        ("FIN", "E_INVALID FIN insufficient number of params"),
        ("FIN ", "E_INVALID invalid message ID"),
        ("FIN abc", "E_INVALID invalid message ID"),
        ("FIN 00000000000000000", "E_INVALID invalid message ID"),
        ("REQ", "E_INVALID REQ insufficient number of params"),
        (
            &*format!("REQ {ZERO_ID}"),
            "E_INVALID REQ insufficient number of params",
        ),
        ("REQ abc 0", "E_INVALID invalid message ID"),
        (
            &*format!("REQ {ZERO_ID} abc"),
            "E_INVALID REQ could not parse timeout abc",
        ),
        (
            &*format!("REQ {ZERO_ID} -1"),
            "E_INVALID REQ could not parse timeout -1",
        ),
        ("TOUCH", "E_INVALID TOUCH insufficient number of params"),
        ("TOUCH abc", "E_INVALID invalid message ID"),
    ];
    for (cmd, err) in cases {
        let mut s = b.subscribe("fin_err", "c");
        send(&mut s, &line(cmd));
        expect_fatal(&mut s, err);
    }
}

#[test]
fn fin_req_touch_of_unknown_id_are_not_fatal() {
    let b = Broker::start(1, &[]);
    let mut s = b.subscribe("fin_unknown", "c");
    send(&mut s, &line(&format!("FIN {ZERO_ID}")));
    // Transcript: 0000003d 00000001 "E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x00, 0x3d, 0x00, 0x00, 0x00, 0x01];
    want.extend_from_slice(b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight");
    assert_eq!(show(&raw), show(&want));
    assert_open(&mut s);

    send(&mut s, &line(&format!("REQ {ZERO_ID} 0")));
    expect_error(
        &mut s,
        &format!("E_REQ_FAILED REQ {ZERO_ID} failed ID not in flight"),
    );
    send(&mut s, &line(&format!("TOUCH {ZERO_ID}")));
    expect_error(
        &mut s,
        &format!("E_TOUCH_FAILED TOUCH {ZERO_ID} failed ID not in flight"),
    );
    // Any 16 bytes are an ID as far as parsing goes.
    send(&mut s, b"FIN abcdefghijklmnop\n");
    expect_error(
        &mut s,
        "E_FIN_FAILED FIN abcdefghijklmnop failed ID not in flight",
    );

    // Still fully working: a message is delivered and can be finished.
    send(&mut s, b"RDY 1\n");
    b.http_pub("fin_unknown", b"after errors");
    let m = read_msg(&mut s);
    assert_eq!(show(&m.body), "after errors");
    send(&mut s, &line(&format!("FIN {}", m.id)));
    b.wait_channel_field("fin_unknown", "c", "in_flight_count", 0);
    // FIN twice: the second one fails (non-fatal).
    send(&mut s, &line(&format!("FIN {}", m.id)));
    expect_error(
        &mut s,
        &format!("E_FIN_FAILED FIN {} failed ID not in flight", m.id),
    );
}

#[test]
fn fin_of_another_clients_message() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("owner", 2) {
            let mut a = b.subscribe(&t, "c");
            send(&mut a, b"RDY 1\n");
            b.http_pub(&t, b"mine");
            let m = read_msg(&mut a);
            let mut other = b.subscribe(&t, "c");
            send(&mut other, &line(&format!("FIN {}", m.id)));
            expect_error(
                &mut other,
                &format!(
                    "E_FIN_FAILED FIN {} failed client does not own message",
                    m.id
                ),
            );
            send(&mut other, &line(&format!("REQ {} 0", m.id)));
            expect_error(
                &mut other,
                &format!(
                    "E_REQ_FAILED REQ {} failed client does not own message",
                    m.id
                ),
            );
            send(&mut other, &line(&format!("TOUCH {}", m.id)));
            expect_error(
                &mut other,
                &format!(
                    "E_TOUCH_FAILED TOUCH {} failed client does not own message",
                    m.id
                ),
            );
            // The owner can still finish it.
            send(&mut a, &line(&format!("FIN {}", m.id)));
            b.wait_channel_field(&t, "c", "in_flight_count", 0);
            // A message finished on another channel is not in flight on this one.
            let mut other_ch = b.subscribe(&t, "other_channel");
            send(&mut other_ch, &line(&format!("FIN {}", m.id)));
            expect_error(
                &mut other_ch,
                &format!("E_FIN_FAILED FIN {} failed ID not in flight", m.id),
            );
        }
    });
}

#[test]
fn successful_fin_req_touch_rdy_nop_send_nothing() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe("silent", "c");
    send(&mut c, b"RDY 1\n");
    b.http_pub("silent", b"x");
    let m = read_msg(&mut c);
    send(&mut c, &line(&format!("TOUCH {}", m.id)));
    send(&mut c, b"NOP\n");
    send(&mut c, &line(&format!("REQ {} 0", m.id)));
    let again = read_msg(&mut c);
    assert_eq!(again.id, m.id);
    assert_eq!(again.attempts, 2);
    send(&mut c, &line(&format!("FIN {}", m.id)));
    send(&mut c, b"RDY 3\n");
    // The next frame must be this PUB's OK: nothing was answered to TOUCH/NOP/REQ/FIN/RDY.
    send(&mut c, &pub_cmd("silent_other", b"y"));
    expect_ok(&mut c);
}

#[test]
fn req_counters_and_immediate_redelivery() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("req0", 2) {
            let mut c = b.subscribe(&t, "c");
            send(&mut c, b"RDY 1\n");
            b.http_pub(&t, b"again");
            let m = read_msg(&mut c);
            send(&mut c, &line(&format!("REQ {} 0", m.id)));
            let m2 = read_msg(&mut c);
            assert_eq!(m2.id, m.id);
            assert_eq!(m2.ts, m.ts, "timestamp is kept across requeue");
            assert_eq!(m2.attempts, 2);
            assert_eq!(m2.body, m.body);
            send(&mut c, &line(&format!("FIN {}", m.id)));
            b.wait_channel_field(&t, "c", "in_flight_count", 0);
            let ch = b.channel_stats(&t, "c").unwrap();
            assert_eq!(ch["requeue_count"], 1, "shards={shards} {ch}");
            assert_eq!(ch["timeout_count"], 0);
            assert_eq!(
                ch["message_count"], 1,
                "requeues do not add to message_count"
            );
            let client = &ch["clients"][0];
            assert_eq!(client["requeue_count"], 1);
            assert_eq!(client["finish_count"], 1);
            assert_eq!(client["message_count"], 2);
        }
    });
}

// ----------------------------------------------------------------------------------------
// CLS
// ----------------------------------------------------------------------------------------

#[test]
fn cls_flow() {
    let b = Broker::start(2, &[]);
    let mut c = b.subscribe("cls", "c");
    send(&mut c, b"RDY 1\n");
    b.http_pub("cls", b"one");
    let m = read_msg(&mut c);
    send(&mut c, b"CLS\n");
    // Transcript: 0000000e 00000000 "CLOSE_WAIT"
    let raw = read_raw_frame_skip_hb(&mut c).unwrap();
    assert_eq!(
        show(&raw),
        show(b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT")
    );
    // The server does not close the socket.
    assert_open(&mut c);
    // RDY is silently ignored in closing; no new messages are delivered.
    send(&mut c, b"RDY 10\n");
    b.http_pub("cls", b"two");
    assert_no_frame(&mut c, Duration::from_millis(500));
    // In-flight messages can still be finished.
    send(&mut c, &line(&format!("FIN {}", m.id)));
    b.wait_channel_field("cls", "c", "in_flight_count", 0);
    assert_eq!(b.channel_stats("cls", "c").unwrap()["depth"], 1);
    let client = b.channel_stats("cls", "c").unwrap()["clients"][0].clone();
    assert_eq!(client["state"], 4, "closing state: {client}");
    assert_eq!(client["ready_count"], 0, "CLS forces RDY 0: {client}");
    assert_eq!(client["finish_count"], 1);
    // CLS again, SUB again: fatal.
    send(&mut c, b"CLS\n");
    expect_fatal(&mut c, "E_INVALID cannot CLS in current state");

    let mut c = b.subscribe("cls", "c2");
    send(&mut c, b"CLS\n");
    expect_frame(&mut c, 0, b"CLOSE_WAIT");
    send(&mut c, b"SUB cls c3\n");
    expect_fatal(&mut c, "E_INVALID cannot SUB in current state");
}

#[test]
fn req_and_touch_allowed_while_closing() {
    let b = Broker::start(1, &["--msg-timeout=5s"]);
    let mut c = b.subscribe("cls_req", "c");
    send(&mut c, b"RDY 2\n");
    b.http_pub("cls_req", b"a");
    b.http_pub("cls_req", b"b");
    let m1 = read_msg(&mut c);
    let m2 = read_msg(&mut c);
    send(&mut c, b"CLS\n");
    expect_frame(&mut c, 0, b"CLOSE_WAIT");
    send(&mut c, &line(&format!("TOUCH {}", m1.id)));
    send(&mut c, &line(&format!("REQ {} 0", m1.id)));
    send(&mut c, &line(&format!("FIN {}", m2.id)));
    // Nothing is redelivered to a closing client.
    assert_no_frame(&mut c, Duration::from_millis(400));
    b.wait_channel_field("cls_req", "c", "in_flight_count", 0);
    let ch = b.channel_stats("cls_req", "c").unwrap();
    assert_eq!(ch["requeue_count"], 1);
    assert_eq!(ch["depth"], 1);
}

// ----------------------------------------------------------------------------------------
// AUTH without --auth-http-address (tests/it/auth.rs has it with an auth server)
// ----------------------------------------------------------------------------------------

#[test]
fn auth_errors() {
    let b = Broker::start(1, &["--max-body-size=1000"]);
    let mut s = b.connect_v2();
    send(&mut s, b"AUTH\n\x00\x00\x00\x06secret");
    expect_fatal(&mut s, "E_AUTH_DISABLED AUTH disabled");

    let mut s = b.connect_v2();
    send(&mut s, b"AUTH secret\n\x00\x00\x00\x06secret");
    expect_fatal(&mut s, "E_INVALID AUTH invalid number of parameters");

    let mut s = b.connect_v2();
    send(&mut s, b"AUTH\n\x00\x00\x00\x00");
    expect_fatal(&mut s, "E_BAD_BODY AUTH invalid body size 0");

    let mut s = b.connect_v2();
    send(&mut s, b"AUTH\n\x00\x00\x03\xe9");
    expect_fatal(&mut s, "E_BAD_BODY AUTH body too big 1001 > 1000");

    let mut s = b.connect_v2();
    send(&mut s, b"AUTH\n\x00\x00");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_BODY AUTH failed to read body size");

    let mut s = b.connect_v2();
    send(&mut s, b"AUTH\n\x00\x00\x00\x10short");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_BODY AUTH failed to read body");

    let mut s = b.subscribe("auth_state", "c");
    send(&mut s, b"AUTH\n\x00\x00\x00\x06secret");
    expect_fatal(&mut s, "E_INVALID cannot AUTH in current state");

    // Without auth configured, no command needs AUTH first.
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"feature_negotiation":true}"#));
    let (_, data) = read_frame(&mut s).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(v["auth_required"], false);
    send(&mut s, &pub_cmd("auth_free", b"x"));
    expect_ok(&mut s);
}

// ----------------------------------------------------------------------------------------
// Delivery semantics
// ----------------------------------------------------------------------------------------

#[test]
fn every_channel_gets_a_copy() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("fanout", 3) {
            let mut c1 = b.subscribe(&t, "ch1");
            let mut c2 = b.subscribe(&t, "ch2");
            send(&mut c1, b"RDY 5\n");
            send(&mut c2, b"RDY 5\n");
            b.http_pub(&t, b"copy");
            let m1 = read_msg(&mut c1);
            let m2 = read_msg(&mut c2);
            assert_eq!(show(&m1.body), "copy");
            assert_eq!(show(&m2.body), "copy");
            assert_eq!(m1.id, m2.id);
            assert_eq!((m1.attempts, m2.attempts), (1, 1));
            // REQ on one channel does not touch the other channel's copy.
            send(&mut c1, &line(&format!("REQ {} 0", m1.id)));
            let again = read_msg(&mut c1);
            assert_eq!(again.attempts, 2);
            send(&mut c2, &line(&format!("FIN {}", m2.id)));
            send(&mut c1, &line(&format!("FIN {}", again.id)));
            b.wait_channel_field(&t, "ch1", "in_flight_count", 0);
            b.wait_channel_field(&t, "ch2", "in_flight_count", 0);
            assert_eq!(
                b.channel_stats(&t, "ch2").unwrap()["requeue_count"],
                0,
                "shards={shards}"
            );
        }
    });
}

#[test]
fn consumers_of_one_channel_share_the_messages() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let t = format!("share_{shards}");
        let mut cs: Vec<TcpStream> = (0..3).map(|_| b.subscribe(&t, "c")).collect();
        for c in cs.iter_mut() {
            send(c, b"RDY 100\n");
        }
        let bodies: Vec<Vec<u8>> = (0..60).map(|i| format!("s{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
        let mut p = b.connect_v2();
        send(&mut p, &mpub_cmd(&t, &refs));
        expect_ok(&mut p);
        b.wait_channel_field(&t, "c", "in_flight_count", 60);
        let mut seen = HashSet::new();
        for c in cs.iter_mut() {
            c.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            while let Ok(raw) = read_raw_frame_skip_hb(c) {
                assert_eq!(i32::from_be_bytes(raw[4..8].try_into().unwrap()), 2);
                let (_, attempts, id, body) = parse_message(&raw[8..]);
                assert_eq!(attempts, 1);
                assert!(seen.insert(id), "message {} delivered twice", show(&body));
            }
        }
        assert_eq!(seen.len(), 60, "shards={shards}");
    });
}

#[test]
fn first_channel_gets_the_backlog_later_channels_do_not() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("backlog", 2) {
            b.http_pub(&t, b"old1");
            b.http_pub(&t, b"old2");
            b.wait_topic_field(&t, "depth", 2);
            let mut first = b.subscribe(&t, "first");
            send(&mut first, b"RDY 10\n");
            assert_eq!(show(&read_msg(&mut first).body), "old1");
            assert_eq!(show(&read_msg(&mut first).body), "old2");
            b.wait_topic_field(&t, "depth", 0);
            let mut later = b.subscribe(&t, "later");
            send(&mut later, b"RDY 10\n");
            assert_no_frame(&mut later, Duration::from_millis(400));
            b.http_pub(&t, b"new");
            assert_eq!(show(&read_msg(&mut later).body), "new", "shards={shards}");
            assert_eq!(show(&read_msg(&mut first).body), "new");
        }
    });
}

#[test]
fn max_channel_consumers() {
    let b = Broker::start(2, &["--max-channel-consumers=1"]);
    for t in topic_names("maxcons", 2) {
        let _first = b.subscribe(&t, "c");
        let mut second = b.connect_v2();
        send(&mut second, &line(&format!("SUB {t} c")));
        expect_fatal(
            &mut second,
            &format!("E_SUB_FAILED SUB failed consumers for {t}:c exceeds limit of 1"),
        );
        // Another channel is fine.
        let _other = b.subscribe(&t, "c2");
    }
}

#[test]
fn ephemeral_channel_and_topic_go_away_with_the_last_client() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for base in topic_names("eph", 2) {
            let t = format!("{base}#ephemeral");
            let c1 = b.subscribe(&t, "ch#ephemeral");
            let c2 = b.subscribe(&t, "ch#ephemeral");
            assert_eq!(
                b.channel_stats(&t, "ch#ephemeral").unwrap()["client_count"],
                2
            );
            drop(c1);
            assert!(wait_until(Duration::from_secs(3), || {
                b.channel_stats(&t, "ch#ephemeral")
                    .map(|c| c["client_count"] == 1)
                    .unwrap_or(false)
            }));
            assert!(
                b.channel_stats(&t, "ch#ephemeral").is_some(),
                "still one client"
            );
            drop(c2);
            assert!(
                wait_until(Duration::from_secs(5), || b.topic_stats(&t).is_none()),
                "shards={shards}: ephemeral channel then ephemeral topic must be deleted: {:?}",
                b.topic_stats(&t)
            );
        }
        // A normal channel stays after its client leaves.
        let c = b.subscribe("durable_t", "durable_c");
        drop(c);
        // Time for the broker to see the close (an ephemeral channel goes then).
        std::thread::sleep(Duration::from_millis(300));
        let ch = b
            .channel_stats("durable_t", "durable_c")
            .expect("durable channel stays");
        assert_eq!(ch["client_count"], 0);
    });
}

#[test]
fn disconnecting_client_loses_subscription_but_messages_survive() {
    let b = Broker::start(2, &["--msg-timeout=1s"]);
    let mut a = b.subscribe("dc", "c");
    send(&mut a, b"RDY 1\n");
    b.http_pub("dc", b"orphan");
    let m = read_msg(&mut a);
    drop(a);
    assert!(wait_until(Duration::from_secs(3), || {
        b.channel_stats("dc", "c")
            .map(|c| c["client_count"] == 0)
            .unwrap_or(false)
    }));
    let mut bb = b.subscribe("dc", "c");
    send(&mut bb, b"RDY 1\n");
    let again = read_msg(&mut bb);
    assert_eq!(again.id, m.id);
    assert_eq!(again.attempts, 2);
    send(&mut bb, &line(&format!("FIN {}", again.id)));
    b.wait_channel_field("dc", "c", "in_flight_count", 0);
}

#[test]
fn empty_numeric_params_parse_as_zero() {
    // protocol.ByteToBase10("") is 0 with no error: "RDY " is RDY 0 and "REQ <id> " is an
    // immediate requeue.
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe("empty_num", "c");
    send(&mut c, b"RDY 1\n");
    b.http_pub("empty_num", b"x");
    let m = read_msg(&mut c);
    send(&mut c, &line(&format!("REQ {} ", m.id)));
    let again = read_msg(&mut c);
    assert_eq!((again.id.as_str(), again.attempts), (m.id.as_str(), 2));
    send(&mut c, &line(&format!("FIN {}", m.id)));
    send(&mut c, b"RDY \n");
    send(&mut c, &pub_cmd("empty_num_sync", b"s"));
    expect_ok(&mut c);
    b.http_pub("empty_num", b"y");
    assert_no_frame(&mut c, Duration::from_millis(400));
    assert_eq!(
        b.channel_stats("empty_num", "c").unwrap()["clients"][0]["ready_count"],
        0
    );
}

#[test]
fn in_flight_messages_of_a_closed_connection_wait_for_their_timeout() {
    let b = Broker::start(2, &["--msg-timeout=1500ms"]);
    let mut waiting = b.subscribe("wait_to", "c");
    let mut a = b.subscribe("wait_to", "c");
    send(&mut a, b"RDY 1\n");
    send(&mut a, &pub_cmd("wait_to_sync", b"s"));
    expect_ok(&mut a);
    b.http_pub("wait_to", b"held");
    let m = read_msg(&mut a);
    let delivered = std::time::Instant::now();
    drop(a);
    send(&mut waiting, b"RDY 1\n");
    let again = read_msg(&mut waiting);
    let el = delivered.elapsed();
    assert_eq!(again.id, m.id);
    assert_eq!(again.attempts, 2);
    assert!(
        el >= Duration::from_millis(1300),
        "requeued {el:?} after delivery: not immediately on disconnect"
    );
    assert_eq!(b.channel_stats("wait_to", "c").unwrap()["timeout_count"], 1);
}
