//! Time-driven behaviour: in-flight timeouts (requeue with attempts+1), TOUCH and its
//! max-msg-timeout cap, REQ deferral and clamping, heartbeats, idle close without an error
//! frame, output buffering, sampling. NSQ_REFERENCE.md §1.4 (REQ/TOUCH), §1.6, §1.10, §7
//! "Heartbeats and timeouts" and "Flow control".

use crate::common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn msg_timeout_from_identify_then_fin_fails() {
    // Upstream TestClientMsgTimeout: msg_timeout 1000 via IDENTIFY, RDY 0, wait 1.15 s,
    // FIN -> E_FIN_FAILED (non-fatal); timeout_count 1, requeue_count 0.
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("msgto", 2) {
            let mut c = b.subscribe_identified(r#"{"msg_timeout":1000}"#, &t, "ch");
            send(&mut c, b"RDY 1\n");
            b.http_pub(&t, b"slow");
            let m = read_msg(&mut c);
            assert_eq!(m.attempts, 1);
            send(&mut c, b"RDY 0\n");
            b.wait_channel_field(&t, "ch", "timeout_count", 1);
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["requeue_count"], 0);
            assert_eq!(ch["in_flight_count"], 0);
            assert_eq!(
                ch["depth"], 1,
                "the timed-out message is back on the queue: {ch}"
            );
            assert_eq!(
                ch["clients"][0]["in_flight_count"], 0,
                "client in_flight decremented: {ch}"
            );
            send(&mut c, &line(&format!("FIN {}", m.id)));
            expect_error(
                &mut c,
                &format!("E_FIN_FAILED FIN {} failed ID not in flight", m.id),
            );
            // Redelivered with attempts 2, the same id and the same timestamp.
            send(&mut c, b"RDY 1\n");
            let again = read_msg(&mut c);
            assert_eq!(again.id, m.id);
            assert_eq!(again.ts, m.ts);
            assert_eq!(again.attempts, 2, "shards={shards}");
            assert_eq!(again.body, m.body);
            send(&mut c, &line(&format!("FIN {}", again.id)));
            b.wait_channel_field(&t, "ch", "in_flight_count", 0);
            assert_eq!(
                b.channel_stats(&t, "ch").unwrap()["clients"][0]["finish_count"],
                1
            );
        }
    });
}

/// `--msg-timeout=0`: every delivery times out at once and is delivered again at each
/// timer pass (nsqd: each queue scan, every 100 ms), not in a loop (a timer due at once
/// must not bypass the 10 ms spacing of the passes, or one message is delivered
/// hundreds of thousands of times a second).
#[test]
fn a_zero_msg_timeout_redelivers_once_a_timer_pass() {
    let b = Broker::start(1, &["--msg-timeout=0"]);
    let mut c = b.subscribe("zero_to", "ch");
    send(&mut c, b"RDY 1\n");
    b.http_pub("zero_to", b"x");
    let first = read_msg(&mut c);
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_secs(1) {
        let m = read_msg(&mut c);
        assert_eq!(m.id, first.id);
        n += 1;
    }
    // 10 ms passes allow about 100 in the second; the loop delivered 10^5-10^6.
    assert!((2..=300).contains(&n), "{n} deliveries in 1 s");
}

#[test]
fn msg_timeout_flag_requeues_after_about_one_second() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--msg-timeout=1s"]);
        for t in topic_names("msgto_flag", 2) {
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 1\n");
            b.http_pub(&t, b"x");
            let m = read_msg(&mut c);
            let delivered = Instant::now();
            let again = read_msg(&mut c);
            let el = delivered.elapsed();
            assert_eq!(again.id, m.id);
            assert_eq!(again.attempts, 2);
            assert!(
                el >= Duration::from_millis(900),
                "redelivered after {el:?}, before msg-timeout"
            );
            // Upper bound widened from 3 s: the timeout's precision is checked with an
            // injected clock in shards/src/channel/tests.rs (msg timeout group).
            assert!(el < Duration::from_secs(10), "redelivered after {el:?}");
            let third = read_msg(&mut c);
            assert_eq!(third.attempts, 3, "attempts keep counting");
            send(&mut c, &line(&format!("FIN {}", third.id)));
            b.wait_channel_field(&t, "ch", "in_flight_count", 0);
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["timeout_count"], 2);
            assert_eq!(ch["message_count"], 1);
        }
    });
}

#[test]
fn many_in_flight_messages_all_time_out() {
    let b = Broker::start(2, &["--msg-timeout=1s"]);
    let mut c = b.subscribe("many_to", "ch");
    send(&mut c, b"RDY 100\n");
    let bodies: Vec<Vec<u8>> = (0..100).map(|i| format!("{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
    let mut p = b.connect_v2();
    send(&mut p, &mpub_cmd("many_to", &refs));
    expect_ok(&mut p);
    b.wait_channel_field("many_to", "ch", "in_flight_count", 100);
    send(&mut c, b"RDY 0\n");
    let start = Instant::now();
    b.wait_channel_field("many_to", "ch", "timeout_count", 100);
    // Upper bound widened from 2.5 s: timeout precision is unit-tested with an injected
    // clock (shards/src/channel/tests.rs); this checks that all of them time out.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let ch = b.channel_stats("many_to", "ch").unwrap();
    assert_eq!(ch["in_flight_count"], 0);
    assert_eq!(ch["depth"], 100);
}

#[test]
fn touch_extends_the_deadline() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &["--msg-timeout=1s"]);
        let t = format!("touch_{shards}");
        let mut c = b.subscribe(&t, "ch");
        send(&mut c, b"RDY 1\n");
        b.http_pub(&t, b"keep");
        let m = read_msg(&mut c);
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(600));
            send(&mut c, &line(&format!("TOUCH {}", m.id)));
        }
        // 1.8 s after delivery: without the TOUCHes it would have timed out.
        send(&mut c, &line(&format!("FIN {}", m.id)));
        // The FIN succeeded: the next frame is the OK of this PUB, not E_FIN_FAILED nor a
        // redelivery.
        send(&mut c, &pub_cmd("touch_other", b"x"));
        expect_ok(&mut c);
        let ch = b.channel_stats(&t, "ch").unwrap();
        assert_eq!(ch["timeout_count"], 0, "shards={shards} {ch}");
        assert_eq!(ch["in_flight_count"], 0);
        assert_eq!(ch["clients"][0]["finish_count"], 1);
    });
}

#[test]
fn touch_uses_the_clients_msg_timeout() {
    // Broker default 60 s, the client asks for 1 s: TOUCH extends by 1 s only.
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(r#"{"msg_timeout":1000}"#, "touch_client", "ch");
    send(&mut c, b"RDY 1\n");
    b.http_pub("touch_client", b"x");
    let m = read_msg(&mut c);
    let delivered = Instant::now();
    // Half of the client's msg_timeout, then TOUCH: the full timeout starts again.
    std::thread::sleep(Duration::from_millis(500));
    send(&mut c, &line(&format!("TOUCH {}", m.id)));
    let again = read_msg(&mut c);
    let el = delivered.elapsed();
    assert_eq!(again.attempts, 2);
    assert!(
        el >= Duration::from_millis(1350),
        "timed out {el:?} after delivery despite TOUCH at 500 ms"
    );
    // Upper bound widened from 3.5 s (TOUCH's new deadline is unit-tested with an
    // injected clock in shards/src/channel/tests.rs); the broker's 60 s would exceed it.
    assert!(el < Duration::from_secs(10), "{el:?}");
}

#[test]
fn touch_cannot_extend_past_max_msg_timeout() {
    // max-msg-timeout == msg-timeout: a TOUCH can never move the deadline past
    // delivery + 3 s. Without the cap the TOUCH at 2 s would move it to about 5 s. The
    // timer is long enough that a loaded machine's delays (the TOUCHes sent late, the
    // redelivery seen late) stay well inside the 2 s between the two outcomes.
    let b = Broker::start(1, &["--msg-timeout=3s", "--max-msg-timeout=3s"]);
    let mut c = b.subscribe("touch_cap", "ch");
    send(&mut c, b"RDY 1\n");
    b.http_pub("touch_cap", b"x");
    let m = read_msg(&mut c);
    let delivered = Instant::now();
    for at in [1000, 2000] {
        std::thread::sleep(Duration::from_millis(at).saturating_sub(delivered.elapsed()));
        send(&mut c, &line(&format!("TOUCH {}", m.id)));
    }
    let again = read_msg(&mut c);
    let el = delivered.elapsed();
    assert_eq!(again.id, m.id);
    assert_eq!(again.attempts, 2);
    assert!(el >= Duration::from_millis(2900), "{el:?}");
    // The bound is the rule itself: redelivered at the 3 s cap, not near 5 s. This is
    // the only end-to-end check that --max-msg-timeout reaches the channel; the cap's
    // arithmetic is unit-tested in shards/src/channel/tests.rs.
    assert!(
        el < Duration::from_millis(4000),
        "TOUCH extended past max-msg-timeout: redelivered after {el:?}"
    );
    assert_eq!(
        b.channel_stats("touch_cap", "ch").unwrap()["timeout_count"],
        1
    );
}

#[test]
fn req_with_delay_defers_the_message() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        for t in topic_names("req_delay", 2) {
            let mut c = b.subscribe(&t, "ch");
            send(&mut c, b"RDY 1\n");
            b.http_pub(&t, b"later");
            let m = read_msg(&mut c);
            let start = Instant::now();
            send(&mut c, &line(&format!("REQ {} 700", m.id)));
            b.wait_channel_field(&t, "ch", "deferred_count", 1);
            let ch = b.channel_stats(&t, "ch").unwrap();
            assert_eq!(ch["requeue_count"], 1, "delayed requeues count too: {ch}");
            assert_eq!(ch["in_flight_count"], 0);
            assert_eq!(ch["depth"], 0);
            let again = read_msg(&mut c);
            let el = start.elapsed();
            assert_eq!(again.id, m.id);
            assert_eq!(again.attempts, 2);
            assert!(
                el >= Duration::from_millis(650),
                "shards={shards}: redelivered after {el:?}"
            );
            // Upper bound widened from 3 s: deferred delivery at the due time (and not
            // before) is unit-tested with an injected clock (shards/src/channel/tests.rs).
            assert!(el < Duration::from_secs(10), "{el:?}");
        }
    });
}

#[test]
fn req_frees_the_rdy_slot_while_deferred() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe("req_slot", "ch");
    send(&mut c, b"RDY 1\n");
    b.http_pub("req_slot", b"first");
    b.http_pub("req_slot", b"second");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "first");
    send(&mut c, &line(&format!("REQ {} 60000", m.id)));
    let n = read_msg(&mut c);
    assert_eq!(show(&n.body), "second");
    assert_eq!(n.attempts, 1);
}

#[test]
fn req_timeout_is_clamped_to_max_req_timeout() {
    let b = Broker::start(1, &["--max-req-timeout=1s"]);
    let mut c = b.subscribe("req_clamp", "ch");
    send(&mut c, b"RDY 1\n");
    b.http_pub("req_clamp", b"x");
    let m = read_msg(&mut c);
    let start = Instant::now();
    // 1 hour: out of range, clamped to 1 s with no error.
    send(&mut c, &line(&format!("REQ {} 3600000", m.id)));
    let again = read_msg(&mut c);
    let el = start.elapsed();
    assert_eq!(again.id, m.id);
    assert_eq!(again.attempts, 2);
    assert!(el >= Duration::from_millis(900), "{el:?}");
    // Upper bound widened from 3 s: unclamped, the delay would be 1 hour; the clamp and
    // deferred timing are unit-tested (shards/src/channel/tests.rs).
    assert!(
        el < Duration::from_secs(10),
        "REQ delay was not clamped: {el:?}"
    );
    assert_eq!(
        b.channel_stats("req_clamp", "ch").unwrap()["requeue_count"],
        1
    );
}

#[test]
fn heartbeat_is_the_first_frame_when_idle() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let t = format!("hb_{shards}");
        let mut c = b.subscribe_identified(r#"{"heartbeat_interval":1000}"#, &t, "ch");
        send(&mut c, b"RDY 1\n");
        let start = Instant::now();
        let raw = read_raw_frame(&mut c).unwrap();
        let el = start.elapsed();
        assert_eq!(show(&raw), show(&frame(0, b"_heartbeat_")));
        assert!(
            el >= Duration::from_millis(600) && el < Duration::from_millis(2000),
            "heartbeat after {el:?}"
        );
        // Answer with NOP; the connection stays up beyond 2 intervals.
        for _ in 0..3 {
            send(&mut c, b"NOP\n");
            let raw = read_raw_frame(&mut c).unwrap();
            assert_eq!(show(&raw), show(&frame(0, b"_heartbeat_")));
        }
        send(&mut c, b"NOP\n");
        assert_open(&mut c);
    });
}

#[test]
fn producer_gets_heartbeats_too() {
    let b = Broker::start(1, &[]);
    let mut p = b.connect_v2();
    send(&mut p, &identify_cmd(r#"{"heartbeat_interval":1000}"#));
    expect_ok(&mut p);
    let start = Instant::now();
    let raw = read_raw_frame(&mut p).unwrap();
    assert_eq!(show(&raw), show(&frame(0, b"_heartbeat_")));
    assert!(start.elapsed() < Duration::from_millis(2000));
}

#[test]
fn idle_connection_is_closed_without_error_frame() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(r#"{"heartbeat_interval":1000}"#, "idle", "ch");
    let start = Instant::now();
    // Only heartbeats may arrive, then EOF, after about 2 intervals.
    assert_closed_silently(&mut c);
    let el = start.elapsed();
    assert!(
        el >= Duration::from_millis(1500),
        "closed too early: {el:?}"
    );
    assert!(el < Duration::from_millis(4500), "closed too late: {el:?}");
    // The client is gone from the channel.
    b.wait_channel_field("idle", "ch", "client_count", 0);
}

#[test]
fn any_command_resets_the_read_deadline() {
    let b = Broker::start(1, &[]);
    let mut p = b.connect_v2();
    send(&mut p, &identify_cmd(r#"{"heartbeat_interval":1000}"#));
    expect_ok(&mut p);
    // Keep talking with PUBs (not NOP) every 700 ms for 3.5 s.
    for i in 0..5 {
        std::thread::sleep(Duration::from_millis(700));
        send(
            &mut p,
            &pub_cmd("deadline_reset", format!("{i}").as_bytes()),
        );
        expect_ok(&mut p);
    }
    assert_open(&mut p);
    // Then silence: closed with no error frame.
    assert_closed_silently(&mut p);
}

#[test]
fn idle_close_of_a_producer_before_identify_uses_default_interval() {
    // Default heartbeat interval is 30 s: a 2.5 s idle producer stays connected.
    let b = Broker::start(1, &[]);
    let mut p = b.connect_v2();
    // Idle, never identified: no close before the 30 s default interval.
    std::thread::sleep(Duration::from_millis(2500));
    assert_open(&mut p);
    send(&mut p, &pub_cmd("idle_default", b"x"));
    expect_ok(&mut p);
}

#[test]
fn output_buffer_timeout_delays_small_messages() {
    // Upstream TestOutputBuffering: with a long output_buffer_timeout a buffered message
    // arrives no sooner than the timeout after IDENTIFY (RDY > in-flight keeps the client
    // ready, so nothing forces a flush).
    let b = Broker::start(1, &[]);
    let mut c = b.connect_v2();
    let start = Instant::now();
    send(
        &mut c,
        &identify_cmd(r#"{"output_buffer_size":16384,"output_buffer_timeout":1000}"#),
    );
    expect_ok(&mut c);
    send(&mut c, b"SUB obuf ch\n");
    expect_ok(&mut c);
    send(&mut c, b"RDY 10\n");
    b.http_pub("obuf", b"buffered");
    let m = read_msg(&mut c);
    let el = start.elapsed();
    assert_eq!(show(&m.body), "buffered");
    assert!(
        el >= Duration::from_millis(900),
        "message was not held in the output buffer: {el:?}"
    );
    assert!(el < Duration::from_millis(3000), "{el:?}");
}

#[test]
fn output_buffer_ticker_holds_one_tick_for_an_idle_consumer() {
    // nsqd's messagePump flushes buffered messages at ticks of its output-buffer ticker,
    // made at IDENTIFY; Go's ticker channel holds one tick nobody took, so after a
    // consumer was idle for longer than a period its next message goes out at once,
    // and the one right after it waits for the next regular tick.
    let b = Broker::start(1, &[]);
    let mut c = b.connect_v2();
    send(
        &mut c,
        &identify_cmd(r#"{"output_buffer_size":16384,"output_buffer_timeout":1000}"#),
    );
    let identified = Instant::now();
    expect_ok(&mut c);
    send(&mut c, b"SUB obuf_idle ch\n");
    expect_ok(&mut c);
    send(&mut c, b"RDY 10\n");
    // Idle for more than one output-buffer tick before the first message.
    std::thread::sleep(Duration::from_millis(1300));
    let start = Instant::now();
    b.http_pub("obuf_idle", b"first");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "first");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "an idle consumer's message waited for a tick: {:?}",
        start.elapsed()
    );
    b.http_pub("obuf_idle", b"second");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "second");
    let at = identified.elapsed();
    assert!(
        at >= Duration::from_millis(1900) && at < Duration::from_millis(3500),
        "the second message goes out at the tick 2 s after IDENTIFY, came at {at:?}"
    );
}

#[test]
fn output_buffer_timeout_off_flushes_every_delivery() {
    // output_buffer_timeout -1 (0): no ticker; this broker flushes each delivery round
    // (nsqd would hold a partial buffer until it fills), message after message.
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(r#"{"output_buffer_timeout":-1}"#, "obuf_off", "ch");
    send(&mut c, b"RDY 10\n");
    send(&mut c, &pub_cmd("obuf_off_sync", b"s"));
    expect_ok(&mut c);
    for body in ["one", "two", "three"] {
        let start = Instant::now();
        b.http_pub("obuf_off", body.as_bytes());
        let m = read_msg(&mut c);
        assert_eq!(show(&m.body), body);
        assert!(
            start.elapsed() < Duration::from_millis(200),
            "{body}: {:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn unbuffered_client_gets_messages_at_once() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe_identified(r#"{"output_buffer_size":-1}"#, "unbuf", "ch");
    send(&mut c, b"RDY 10\n");
    // Sync: the PUB reply proves RDY was processed.
    send(&mut c, &pub_cmd("unbuf_sync", b"s"));
    expect_ok(&mut c);
    let start = Instant::now();
    b.http_pub("unbuf", b"now");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "now");
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn default_output_buffer_flushes_within_its_timeout() {
    let b = Broker::start(1, &[]);
    let mut c = b.subscribe("obuf_default", "ch");
    send(&mut c, b"RDY 10\n");
    send(&mut c, &pub_cmd("obuf_default_sync", b"s"));
    expect_ok(&mut c);
    let start = Instant::now();
    b.http_pub("obuf_default", b"soon");
    let m = read_msg(&mut c);
    assert_eq!(show(&m.body), "soon");
    assert!(
        start.elapsed() < Duration::from_millis(800),
        "default 250 ms flush: {:?}",
        start.elapsed()
    );
}

#[test]
fn sample_rate_discards_a_proportion() {
    // Sampling S: a message is delivered when rand(0..100) <= S, i.e. with probability
    // (S+1)/100; the others are discarded for the channel (never in flight).
    let b = Broker::start(1, &[]);
    let n = 2000usize;
    let mut c = b.subscribe_identified(r#"{"sample_rate":42}"#, "sampled", "ch");
    send(&mut c, b"RDY 2500\n");
    let mut body = Vec::new();
    for i in 0..n {
        body.extend_from_slice(format!("m{i}\n").as_bytes());
    }
    let (code, resp) = b.http("POST", "/mpub?topic=sampled", &body);
    assert_eq!((code, show(&resp)), (200, "OK".to_string()));
    // Read what arrives until the channel is drained.
    let mut got = 0usize;
    c.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    while let Ok(raw) = read_raw_frame_skip_hb(&mut c) {
        assert_eq!(i32::from_be_bytes(raw[4..8].try_into().unwrap()), 2);
        got += 1;
    }
    b.wait_channel_field("sampled", "ch", "depth", 0);
    let ch = b.channel_stats("sampled", "ch").unwrap();
    let in_flight = ch["in_flight_count"].as_u64().unwrap() as usize;
    assert_eq!(in_flight, got, "every delivered message is in flight: {ch}");
    let lo = n * 37 / 100;
    let hi = n * 49 / 100;
    assert!(
        (lo..=hi).contains(&got),
        "sampled {got} of {n}, want about 43%"
    );
    assert_eq!(ch["clients"][0]["sample_rate"], 42);
}
