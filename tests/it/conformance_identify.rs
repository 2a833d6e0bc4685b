//! IDENTIFY: body errors, JSON decoding, settings validation (order and error texts),
//! the negotiation reply (byte-exact against the nsqd 1.3.0 transcript), state rules and
//! what /stats shows about the client. NSQ_REFERENCE.md §1.4, §1.5, §7.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::net::Shutdown;
use std::time::Duration;

/// The IDENTIFY reply of nsqd 1.3.0 with default flags (transcript, 268-byte frame).
const DEFAULT_IDENTIFY_REPLY: &str = r#"{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250}"#;

fn reply(
    max_rdy: i64,
    max_msg_timeout: i64,
    msg_timeout: i64,
    sample_rate: i64,
    obs: i64,
    obt: i64,
) -> String {
    format!(
        r#"{{"max_rdy_count":{max_rdy},"version":"1.3.0","max_msg_timeout":{max_msg_timeout},"msg_timeout":{msg_timeout},"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,"sample_rate":{sample_rate},"auth_required":false,"output_buffer_size":{obs},"output_buffer_timeout":{obt}}}"#
    )
}

/// Sends IDENTIFY with `json` and expects the exact JSON reply frame.
fn identify_expect(b: &Broker, json: &str, want: &str) -> std::net::TcpStream {
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(json));
    expect_frame(&mut s, 0, want.as_bytes());
    s
}

/// Sends IDENTIFY with `json` on a new connection and expects the fatal error `err`.
fn identify_fatal(b: &Broker, json: &str, err: &str) {
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(json));
    expect_fatal(&mut s, err);
}

#[test]
fn negotiation_reply_is_byte_exact() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    let json = r#"{"client_id": "ex", "hostname": "ex", "user_agent": "tcp_examples/1.0", "feature_negotiation": true, "heartbeat_interval": 30000}"#;
    send(&mut s, &identify_cmd(json));
    let raw = read_raw_frame(&mut s).unwrap();
    let mut want = vec![0x00, 0x00, 0x01, 0x0c, 0x00, 0x00, 0x00, 0x00];
    want.extend_from_slice(DEFAULT_IDENTIFY_REPLY.as_bytes());
    assert_eq!(raw.len(), 4 + 268);
    assert_eq!(show(&raw), show(&want));
    // The connection is still usable: the transcript then publishes.
    send(&mut s, &pub_cmd("tcp_t", b"hello"));
    expect_frame(&mut s, 0, b"OK");
}

#[test]
fn plain_identify_answers_ok() {
    // Transcript: IDENTIFY {"client_id": "ex"} -> 00000006 00000000 "OK".
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"client_id": "ex"}"#));
    let raw = read_raw_frame(&mut s).unwrap();
    assert_eq!(show(&raw), show(b"\x00\x00\x00\x06\x00\x00\x00\x00OK"));
    // feature_negotiation false is the same as absent.
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(r#"{"feature_negotiation": false, "msg_timeout": 5000}"#),
    );
    expect_ok(&mut s);
}

#[test]
fn reply_reflects_flags_and_client_settings() {
    let b = Broker::start(
        1,
        &[
            "--max-rdy-count=50",
            "--msg-timeout=5s",
            "--max-msg-timeout=10s",
            "--output-buffer-timeout=100ms",
        ],
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true}"#,
        &reply(50, 10000, 5000, 0, 16384, 100),
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"msg_timeout":2000,"sample_rate":42,"output_buffer_size":1024,"output_buffer_timeout":500}"#,
        &reply(50, 10000, 2000, 42, 1024, 500),
    );
    // output_buffer_size -1: 1-byte buffer and timeout 0; timeout -1 means 0.
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"output_buffer_size":-1,"output_buffer_timeout":-1}"#,
        &reply(50, 10000, 5000, 0, 1, 0),
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"output_buffer_timeout":-1}"#,
        &reply(50, 10000, 5000, 0, 16384, 0),
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"output_buffer_size":-1}"#,
        &reply(50, 10000, 5000, 0, 1, 0),
    );
    // Boundaries are accepted: msg_timeout == max-msg-timeout, 1000 minimum.
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"msg_timeout":10000}"#,
        &reply(50, 10000, 10000, 0, 16384, 100),
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"msg_timeout":1000}"#,
        &reply(50, 10000, 1000, 0, 16384, 100),
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"sample_rate":99}"#,
        &reply(50, 10000, 5000, 99, 16384, 100),
    );
}

#[test]
fn tls_is_refused_without_a_certificate_and_connection_stays_plain() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(r#"{"feature_negotiation":true,"tls_v1":true}"#),
    );
    expect_frame(&mut s, 0, DEFAULT_IDENTIFY_REPLY.as_bytes());
    // No upgrade and no extra OK frame: the next frame is the PUB reply in clear text.
    send(&mut s, &pub_cmd("plain_after_identify", b"x"));
    expect_ok(&mut s);
}

#[test]
fn unknown_keys_are_ignored() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(
            r#"{"short_id":"s","long_id":"l","client_id":"c","foo":{"bar":[1,2.5,null]},"feature_negotiation":false}"#,
        ),
    );
    expect_ok(&mut s);
}

#[test]
fn identify_may_be_repeated_while_in_init() {
    let b = Broker::start(
        1,
        &[
            "--max-output-buffer-size=524288",
            "--max-output-buffer-timeout=1s",
        ],
    );
    let mut s = b.connect_v2();
    for json in [
        r#"{"feature_negotiation":true,"output_buffer_size":524288,"output_buffer_timeout":1000}"#,
        r#"{"feature_negotiation":true,"output_buffer_size":-1,"output_buffer_timeout":-1}"#,
        r#"{"feature_negotiation":true,"output_buffer_size":0,"output_buffer_timeout":0}"#,
    ] {
        send(&mut s, &identify_cmd(json));
        let (ft, data) = read_frame_skip_hb(&mut s).unwrap();
        assert_eq!(ft, 0, "{}", show(&data));
        let v: serde_json::Value = serde_json::from_slice(&data).expect("json reply");
        assert_eq!(v["version"], "1.3.0");
    }
    send(&mut s, b"IDENTIFY\n");
    send(&mut s, &sized(br#"{"client_id":"x"}"#));
    expect_ok(&mut s);
    // First reply of a fresh connection echoes the accepted maxima.
    let mut s2 = b.connect_v2();
    send(
        &mut s2,
        &identify_cmd(
            r#"{"feature_negotiation":true,"output_buffer_size":524288,"output_buffer_timeout":1000}"#,
        ),
    );
    let (_, data) = read_frame(&mut s2).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
    assert_eq!(v["output_buffer_size"], 524288);
    assert_eq!(v["output_buffer_timeout"], 1000);
}

#[test]
fn identify_after_sub_is_fatal() {
    let b = Broker::start(1, &[]);
    let mut s = b.subscribe("ident_sub", "c");
    send(&mut s, &identify_cmd(r#"{"client_id":"x"}"#));
    expect_fatal(&mut s, "E_INVALID cannot IDENTIFY in current state");
}

#[test]
fn body_size_errors() {
    let b = Broker::start(1, &["--max-body-size=1000"]);
    // Too big (checked before the body is read; nothing more is sent).
    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n\x00\x00\x03\xe9");
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY body too big 1001 > 1000");
    // Exactly max is accepted (JSON padded with spaces to 1000 bytes).
    let mut json = br#"{"client_id":"pad"}"#.to_vec();
    json.resize(1000, b' ');
    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n");
    send(&mut s, &sized(&json));
    expect_ok(&mut s);
    // Zero and negative sizes.
    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n\x00\x00\x00\x00");
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY invalid body size 0");
    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n\xff\xff\xff\xff");
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY invalid body size -1");
}

#[test]
fn truncated_size_and_body() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n\x00\x00");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY failed to read body size");

    let mut s = b.connect_v2();
    send(&mut s, b"IDENTIFY\n\x00\x00\x00\x64{\"client");
    s.shutdown(Shutdown::Write).unwrap();
    expect_fatal(&mut s, "E_BAD_BODY IDENTIFY failed to read body");
}

#[test]
fn bad_json_and_wrong_types() {
    let b = Broker::start(1, &[]);
    for json in [
        "{bad",
        "not json",
        r#"{"heartbeat_interval": 1.5}"#,
        r#"{"heartbeat_interval": "1000"}"#,
        r#"{"msg_timeout": true}"#,
        r#"{"feature_negotiation": "yes"}"#,
        r#"{"client_id": 5}"#,
        r#"[1,2]"#,
        // Go's json.Unmarshal takes no array (serde would, field by field), number,
        // string or bool for a struct.
        "[]",
        "7",
        r#""x""#,
        "true",
    ] {
        identify_fatal(&b, json, "E_BAD_BODY IDENTIFY failed to decode JSON body");
    }
    // ... and `null` leaves the struct as it is: a plain OK.
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd("null"));
    expect_ok(&mut s);
    send(&mut s, b"NOP\n");
    assert_open(&mut s);
}

#[test]
fn heartbeat_interval_validation() {
    let b = Broker::start(1, &["--max-heartbeat-interval=300s"]);
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"heartbeat_interval":300000}"#,
        DEFAULT_IDENTIFY_REPLY,
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"heartbeat_interval":1000}"#,
        DEFAULT_IDENTIFY_REPLY,
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"heartbeat_interval":-1}"#,
        DEFAULT_IDENTIFY_REPLY,
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"heartbeat_interval":0}"#,
        DEFAULT_IDENTIFY_REPLY,
    );
    identify_fatal(
        &b,
        r#"{"heartbeat_interval":300001}"#,
        "E_BAD_BODY IDENTIFY heartbeat interval (300001) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"heartbeat_interval":999}"#,
        "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"heartbeat_interval":-2}"#,
        "E_BAD_BODY IDENTIFY heartbeat interval (-2) is invalid",
    );

    let b = Broker::start(1, &["--max-heartbeat-interval=1s"]);
    identify_fatal(
        &b,
        r#"{"heartbeat_interval":2000}"#,
        "E_BAD_BODY IDENTIFY heartbeat interval (2000) is invalid",
    );
}

#[test]
fn output_buffer_validation() {
    let b = Broker::start(
        1,
        &[
            "--max-output-buffer-size=524288",
            "--max-output-buffer-timeout=1s",
        ],
    );
    identify_fatal(
        &b,
        r#"{"output_buffer_size":524289}"#,
        "E_BAD_BODY IDENTIFY output buffer size (524289) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"output_buffer_size":63}"#,
        "E_BAD_BODY IDENTIFY output buffer size (63) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"output_buffer_size":-2}"#,
        "E_BAD_BODY IDENTIFY output buffer size (-2) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"output_buffer_timeout":1001}"#,
        "E_BAD_BODY IDENTIFY output buffer timeout (1001) is invalid",
    );
    // --min-output-buffer-timeout defaults to 25ms.
    identify_fatal(
        &b,
        r#"{"output_buffer_timeout":24}"#,
        "E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"output_buffer_timeout":-5}"#,
        "E_BAD_BODY IDENTIFY output buffer timeout (-5) is invalid",
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"output_buffer_size":64,"output_buffer_timeout":25}"#,
        &reply(2500, 900000, 60000, 0, 64, 25),
    );

    let b = Broker::start(1, &["--min-output-buffer-timeout=100ms"]);
    identify_fatal(
        &b,
        r#"{"output_buffer_timeout":99}"#,
        "E_BAD_BODY IDENTIFY output buffer timeout (99) is invalid",
    );
    identify_expect(
        &b,
        r#"{"feature_negotiation":true,"output_buffer_timeout":100}"#,
        &reply(2500, 900000, 60000, 0, 16384, 100),
    );
}

#[test]
fn sample_rate_and_msg_timeout_validation() {
    let b = Broker::start(1, &["--max-msg-timeout=10s"]);
    identify_fatal(
        &b,
        r#"{"sample_rate":100}"#,
        "E_BAD_BODY IDENTIFY sample rate (100) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"sample_rate":-1}"#,
        "E_BAD_BODY IDENTIFY sample rate (-1) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"msg_timeout":999}"#,
        "E_BAD_BODY IDENTIFY msg timeout (999) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"msg_timeout":10001}"#,
        "E_BAD_BODY IDENTIFY msg timeout (10001) is invalid",
    );
    identify_fatal(
        &b,
        r#"{"msg_timeout":-1}"#,
        "E_BAD_BODY IDENTIFY msg timeout (-1) is invalid",
    );
}

#[test]
fn validation_order() {
    let b = Broker::start(1, &[]);
    // heartbeat before output buffer
    identify_fatal(
        &b,
        r#"{"msg_timeout":1,"sample_rate":500,"output_buffer_size":5,"output_buffer_timeout":5,"heartbeat_interval":5}"#,
        "E_BAD_BODY IDENTIFY heartbeat interval (5) is invalid",
    );
    // output buffer timeout before size
    identify_fatal(
        &b,
        r#"{"msg_timeout":1,"sample_rate":500,"output_buffer_size":5,"output_buffer_timeout":5}"#,
        "E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid",
    );
    // size before sample rate
    identify_fatal(
        &b,
        r#"{"msg_timeout":1,"sample_rate":500,"output_buffer_size":5}"#,
        "E_BAD_BODY IDENTIFY output buffer size (5) is invalid",
    );
    // sample rate before msg timeout
    identify_fatal(
        &b,
        r#"{"msg_timeout":1,"sample_rate":500}"#,
        "E_BAD_BODY IDENTIFY sample rate (500) is invalid",
    );
}

#[test]
fn sub_with_heartbeats_disabled_is_fatal() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"heartbeat_interval":-1}"#));
    expect_ok(&mut s);
    send(&mut s, b"SUB hb_off c\n");
    expect_fatal(&mut s, "E_INVALID cannot SUB with heartbeats disabled");
}

#[test]
fn heartbeats_disabled_connection_is_not_dropped_when_idle() {
    // With -1 there are no read deadlines and no heartbeats. Compared with interval 1000
    // (idle close after about 2 s), a 2.5 s pause must leave the connection open.
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"heartbeat_interval":-1}"#));
    expect_ok(&mut s);
    // Idle with heartbeats off: no heartbeat comes, and the connection stays.
    std::thread::sleep(Duration::from_millis(2500));
    assert_open(&mut s);
    let mut nothing = [0u8; 1];
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(
        s.peek(&mut nothing).is_err(),
        "no heartbeat may be sent when disabled"
    );
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    send(&mut s, b"NOP\n");
    send(&mut s, &pub_cmd("hb_off_pub", b"x"));
    expect_ok(&mut s);
}

#[test]
fn client_identity_shows_in_stats() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let topics = topic_names("ident_stats", 3);
        let mut conns = Vec::new();
        for t in &topics {
            let mut s = b.connect_v2();
            send(
                &mut s,
                &identify_cmd(
                    r#"{"client_id":"my-client","hostname":"my.host","user_agent":"conformance/1.0","sample_rate":7}"#,
                ),
            );
            expect_ok(&mut s);
            send(&mut s, &line(&format!("SUB {t} ch")));
            expect_ok(&mut s);
            send(&mut s, b"RDY 3\n");
            let local = s.local_addr().unwrap().to_string();
            conns.push((s, local));
        }
        let mut s_anon = b.subscribe(&topics[0], "anon");
        send(&mut s_anon, b"RDY 1\n");
        let anon_local = s_anon.local_addr().unwrap().to_string();
        for (t, (_, local)) in topics.iter().zip(conns.iter()) {
            let mut client = serde_json::Value::Null;
            let ok = wait_until(Duration::from_secs(5), || {
                client = b
                    .channel_stats(t, "ch")
                    .map(|c| c["clients"][0].clone())
                    .unwrap_or_default();
                client["ready_count"] == 3
            });
            assert!(ok, "shards={shards} topic={t}: {client}");
            assert_eq!(client["client_id"], "my-client");
            assert_eq!(client["hostname"], "my.host");
            assert_eq!(client["user_agent"], "conformance/1.0");
            assert_eq!(client["version"], "V2");
            assert_eq!(client["remote_address"], local.as_str());
            assert_eq!(client["state"], 3);
            assert_eq!(client["sample_rate"], 7);
            assert_eq!(client["deflate"], false);
            assert_eq!(client["snappy"], false);
            assert_eq!(client["tls"], false);
            let cts = client["connect_ts"].as_i64().unwrap();
            assert!((cts - now_s()).abs() <= 5, "connect_ts {cts}");
        }
        // Without IDENTIFY, client_id and hostname default to the peer IP.
        let mut client = serde_json::Value::Null;
        let ok = wait_until(Duration::from_secs(5), || {
            client = b
                .channel_stats(&topics[0], "anon")
                .map(|c| c["clients"][0].clone())
                .unwrap_or_default();
            client["ready_count"] == 1
        });
        assert!(ok, "{client}");
        assert_eq!(client["client_id"], "127.0.0.1");
        assert_eq!(client["hostname"], "127.0.0.1");
        assert_eq!(client["user_agent"], "");
        assert_eq!(client["remote_address"], anon_local.as_str());
    });
}

/// IDENTIFY with snappy: the JSON reply (snappy true) comes in clear text, then the
/// stream switches to the snappy framing format in both directions: a stream identifier
/// chunk and an `OK` frame, then commands and answers framed (nsqd: IDENTIFY upgrade).
#[test]
fn snappy_negotiation_switches_both_directions() {
    use std::io::{Read, Write};
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let mut s = b.connect_v2();
        s.write_all(&identify_cmd(
            r#"{"feature_negotiation":true,"snappy":true}"#,
        ))
        .unwrap();
        let (ft, json) = read_frame(&mut s).unwrap();
        assert_eq!(ft, 0);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["snappy"], true, "shards={shards}");
        assert_eq!(v["deflate"], false);
        // The stream identifier chunk, byte for byte.
        let mut id = [0u8; 10];
        s.read_exact(&mut id).unwrap();
        assert_eq!(&id, b"\xff\x06\x00\x00sNaPpY");
        // Everything after it decodes with a reference snappy frame decoder.
        let mut dec =
            snap::read::FrameDecoder::new(SnapStream(s.try_clone().unwrap(), Some(id.to_vec())));
        let mut ok = [0u8; 10];
        dec.read_exact(&mut ok).unwrap();
        assert_eq!(ok.to_vec(), frame(0, b"OK"));
        // Framed PUBs to a topic on every shard (picked by the broker's hash), so with
        // more than one shard the producer is certainly handed off, then a SUB.
        let topics = topic_names(&format!("snap_{shards}"), shards);
        let mut enc = snap::write::FrameEncoder::new(s.try_clone().unwrap());
        for t in &topics {
            enc.write_all(&pub_cmd(t, b"compressed hello")).unwrap();
            enc.flush().unwrap();
            let mut resp = [0u8; 10];
            dec.read_exact(&mut resp).unwrap();
            assert_eq!(resp.to_vec(), frame(0, b"OK"), "shards={shards} {t}");
        }
        let mut c = b.connect_v2();
        c.write_all(&identify_cmd(
            r#"{"feature_negotiation":true,"snappy":true}"#,
        ))
        .unwrap();
        read_frame(&mut c).unwrap();
        let mut cid = [0u8; 10];
        c.read_exact(&mut cid).unwrap();
        let mut cdec =
            snap::read::FrameDecoder::new(SnapStream(c.try_clone().unwrap(), Some(cid.to_vec())));
        let mut cok = [0u8; 10];
        cdec.read_exact(&mut cok).unwrap();
        let mut cenc = snap::write::FrameEncoder::new(c.try_clone().unwrap());
        cenc.write_all(format!("SUB {} ch\nRDY 1\n", topics[0]).as_bytes())
            .unwrap();
        cenc.flush().unwrap();
        let mut sub_ok = [0u8; 10];
        cdec.read_exact(&mut sub_ok).unwrap();
        assert_eq!(sub_ok.to_vec(), frame(0, b"OK"));
        let mut hdr = [0u8; 8];
        cdec.read_exact(&mut hdr).unwrap();
        let size = i32::from_be_bytes(hdr[0..4].try_into().unwrap()) as usize;
        let mut data = vec![0u8; size - 4];
        cdec.read_exact(&mut data).unwrap();
        assert_eq!(i32::from_be_bytes(hdr[4..8].try_into().unwrap()), 2);
        assert_eq!(
            parse_message(&data).3,
            b"compressed hello",
            "shards={shards}"
        );
    });
    // --snappy=false: not granted, and the connection stays plain.
    let b = Broker::start(1, &["--snappy=false"]);
    let mut s = b.connect_v2();
    s.write_all(&identify_cmd(
        r#"{"feature_negotiation":true,"snappy":true}"#,
    ))
    .unwrap();
    let (_, json) = read_frame(&mut s).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["snappy"], false);
    s.write_all(&pub_cmd("plain", b"x")).unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), (0, b"OK".to_vec()));
}

/// Replays already-read bytes, then reads the socket (for snap's frame decoder).
struct SnapStream(std::net::TcpStream, Option<Vec<u8>>);

impl std::io::Read for SnapStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(p) = self.1.take() {
            let n = p.len().min(buf.len());
            buf[..n].copy_from_slice(&p[..n]);
            if n < p.len() {
                self.1 = Some(p[n..].to_vec());
            }
            return Ok(n);
        }
        self.0.read(buf)
    }
}

/// Reads whatever arrives within `wait` and inflates it (raw DEFLATE, sync-flushed).
fn read_inflated(
    s: &mut std::net::TcpStream,
    inf: &mut flate2::Decompress,
    want: usize,
) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while out.len() < want && std::time::Instant::now() < deadline {
        let mut buf = [0u8; 65536];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed");
        let mut chunk = Vec::with_capacity(n * 8 + 4096);
        inf.decompress_vec(&buf[..n], &mut chunk, flate2::FlushDecompress::Sync)
            .unwrap();
        out.extend(chunk);
    }
    out
}

fn deflated(c: &mut flate2::Compress, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1024);
    c.compress_vec(data, &mut out, flate2::FlushCompress::Sync)
        .unwrap();
    out
}

/// IDENTIFY with deflate: reply in clear text with the negotiated level, then raw
/// DEFLATE both ways (an OK first), also after the connection moves to the topic's shard;
/// asking for both snappy and deflate is nsqd's E_IDENTIFY_FAILED.
#[test]
fn deflate_negotiation_switches_both_directions() {
    use std::io::Write;
    for_each_shards(&SHARD_COUNTS, |shards| {
        let b = Broker::start(shards, &[]);
        let mut s = b.connect_v2();
        s.write_all(&identify_cmd(
            r#"{"feature_negotiation":true,"deflate":true,"deflate_level":3}"#,
        ))
        .unwrap();
        let (_, json) = read_frame(&mut s).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["deflate"], true, "shards={shards}");
        assert_eq!(v["deflate_level"], 3);
        assert_eq!(v["snappy"], false);
        let mut inf = flate2::Decompress::new(false);
        let mut def = flate2::Compress::new(flate2::Compression::new(6), false);
        assert_eq!(read_inflated(&mut s, &mut inf, 10), frame(0, b"OK"));
        let topic = format!("defl_{shards}");
        s.write_all(&deflated(&mut def, &pub_cmd(&topic, b"deflated hello")))
            .unwrap();
        assert_eq!(read_inflated(&mut s, &mut inf, 10), frame(0, b"OK"));
        // A consumer that negotiates deflate, then SUBs (handed to the owner shard).
        let mut c = b.connect_v2();
        c.write_all(&identify_cmd(
            r#"{"feature_negotiation":true,"deflate":true}"#,
        ))
        .unwrap();
        read_frame(&mut c).unwrap();
        let mut cinf = flate2::Decompress::new(false);
        let mut cdef = flate2::Compress::new(flate2::Compression::new(6), false);
        assert_eq!(read_inflated(&mut c, &mut cinf, 10), frame(0, b"OK"));
        c.write_all(&deflated(&mut cdef, format!("SUB {topic} ch\n").as_bytes()))
            .unwrap();
        assert_eq!(read_inflated(&mut c, &mut cinf, 10), frame(0, b"OK"));
        c.write_all(&deflated(&mut cdef, b"RDY 1\n")).unwrap();
        let got = read_inflated(&mut c, &mut cinf, 8 + 26 + 14);
        assert_eq!(i32::from_be_bytes(got[4..8].try_into().unwrap()), 2);
        assert_eq!(
            parse_message(&got[8..]).3,
            b"deflated hello",
            "shards={shards}"
        );
    });
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    s.write_all(&identify_cmd(
        r#"{"feature_negotiation":true,"deflate":true,"snappy":true}"#,
    ))
    .unwrap();
    assert_eq!(
        read_frame(&mut s).unwrap(),
        (
            1,
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression".to_vec()
        )
    );
    assert_closed(&mut s);
}

/// IDENTIFY decoded as Go's encoding/json decodes it into nsqd's identifyDataV2 (each
/// case measured on nsqd 1.3.0): keys match case-insensitively (Unicode folding: `ſ` is
/// `s`), the last of repeated keys wins, a `null` leaves the field, `-0` is 0, an
/// unpaired surrogate is U+FFFD, nesting up to 10,000 levels and any number literal are
/// fine in an unknown key; an int32 field out of range, `1.0` for an int, nesting past
/// 10,000 levels fail the decode.
#[test]
fn json_decoded_as_go_s_encoding_json() {
    let b = Broker::start(1, &[]);
    let deep = |n: usize| {
        format!(
            r#"{{"feature_negotiation":true,"x":{}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let ok = [
        (
            r#"{"feature_negotiation":true,"FEATURE_NEGOTIATION":false}"#,
            None,
        ),
        (
            r#"{"feature_negotiation":true,"sample_rate":50,"SAMPLE_RATE":null}"#,
            Some(50),
        ),
        (
            r#"{"feature_negotiation":true,"Sample_Rate":7,"sample_rate":9}"#,
            Some(9),
        ),
        (r#"{"feature_negotiation":true,"ſample_rate":12}"#, Some(12)),
        (
            r#"{"feature_negotiation":true,"heartbeat_interval":-0}"#,
            Some(0),
        ),
        (
            r#"{"feature_negotiation":true,"client_id":"\ud800","x":1e999999}"#,
            Some(0),
        ),
        (&deep(9_998), Some(0)),
    ];
    for (json, sample_rate) in ok {
        let mut s = b.connect_v2();
        send(&mut s, &identify_cmd(json));
        match sample_rate {
            // FEATURE_NEGOTIATION false came last: a plain OK.
            None => expect_ok(&mut s),
            Some(rate) => expect_frame(
                &mut s,
                0,
                reply(2500, 900000, 60000, rate, 16384, 250).as_bytes(),
            ),
        }
    }
    for json in [
        r#"{"sample_rate":3000000000}"#.to_string(),
        r#"{"heartbeat_interval":1.0}"#.to_string(),
        r#"{"deflate":"true"}"#.to_string(),
        deep(10_000),
    ] {
        identify_fatal(&b, &json, "E_BAD_BODY IDENTIFY failed to decode JSON body");
    }
}

/// A second IDENTIFY keeps what the first set where it says 0 or nothing (nsqd's
/// SetHeartbeatInterval, SetOutputBuffer and SetMsgTimeout: 0 is "do nothing"), measured
/// on nsqd 1.3.0: msg_timeout and the output buffer stay, disabled heartbeats stay
/// disabled (so SUB is refused).
#[test]
fn a_second_identify_keeps_what_the_first_set() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(
        &mut s,
        &identify_cmd(
            r#"{"msg_timeout":5000,"output_buffer_size":100,"output_buffer_timeout":100}"#,
        ),
    );
    expect_ok(&mut s);
    send(&mut s, &identify_cmd(r#"{"feature_negotiation":true}"#));
    expect_frame(&mut s, 0, reply(2500, 900000, 5000, 0, 100, 100).as_bytes());
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"heartbeat_interval":-1}"#));
    expect_ok(&mut s);
    send(&mut s, &identify_cmd("{}"));
    expect_ok(&mut s);
    send(&mut s, b"SUB t c\n");
    expect_fatal(&mut s, "E_INVALID cannot SUB with heartbeats disabled");
}

/// nsqd's messagePump takes only the first IDENTIFY: heartbeats go on at the first one's
/// interval after a second IDENTIFY disables them (measured on nsqd 1.3.0: a heartbeat
/// every second, and the connection stays, as the read deadline went with heartbeats).
#[test]
fn heartbeats_keep_the_first_identify_s_interval() {
    let b = Broker::start(1, &[]);
    let mut s = b.connect_v2();
    send(&mut s, &identify_cmd(r#"{"heartbeat_interval":1000}"#));
    expect_ok(&mut s);
    send(&mut s, &identify_cmd(r#"{"heartbeat_interval":-1}"#));
    expect_ok(&mut s);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    for _ in 0..2 {
        let (ft, data) = read_frame(&mut s).expect("a heartbeat");
        assert_eq!((ft, data.as_slice()), (0, &b"_heartbeat_"[..]));
    }
}

/// A snappy stream is checked as Go's snappy Reader (nsqd's) checks it, from each
/// chunk's 4-byte header: no identifier first, a chunk longer than 76,494 bytes (16 MiB
/// of padding announced), a reserved type: the connection ends at once, with a reset
/// when bytes follow the header (nsqd reads only the header), with a FIN when none do.
/// Measured on nsqd 1.3.0. (A broker that buffered the announced 16 MiB per connection
/// before checking was a memory exhaustion.)
#[test]
fn bad_snappy_chunks_end_the_connection_from_their_header() {
    use std::io::Read;
    let b = Broker::start(1, &[]);
    let id: &[u8] = b"\xff\x06\x00\x00sNaPpY";
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "no identifier",
            b"\x01\x0e\x00\x00\x00\x00\x00\x00\x00\x00".to_vec(),
            "reset",
        ),
        ("no identifier, 4 bytes", b"NOP\n".to_vec(), "FIN"),
        (
            "16 MiB padding",
            [id, b"\xfe\xff\xff\xff", &[b'x'; 100]].concat(),
            "reset",
        ),
        (
            "16 MiB compressed",
            [id, b"\x00\xff\xff\xff", &[b'x'; 100]].concat(),
            "reset",
        ),
        (
            "reserved type",
            [id, b"\x02\x01\x00\x00\x78"].concat(),
            "reset",
        ),
    ];
    for (name, after, want) in cases {
        let mut s = b.connect_v2();
        send(
            &mut s,
            &identify_cmd(r#"{"feature_negotiation":true,"snappy":true}"#),
        );
        let (ft, _) = read_frame(&mut s).unwrap();
        assert_eq!(ft, 0);
        // The stream identifier and the framed OK: read all of it.
        std::thread::sleep(Duration::from_millis(200));
        s.set_nonblocking(true).unwrap();
        let mut drain = [0u8; 256];
        while s.read(&mut drain).is_ok_and(|n| n > 0) {}
        s.set_nonblocking(false).unwrap();
        send(&mut s, &after);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (got, end) = read_until_closed(&mut s, name);
        assert!(got.is_empty(), "{name}: {got:?}");
        assert_eq!(end, want, "{name}");
    }
}

/// Commands decoded before a compressed stream ends or breaks, in the same read, run
/// before the connection closes: Go's flate and snappy readers hand over what they
/// decoded, then report the end or the error, so nsqd answers and publishes first (the
/// PUB must not be dropped: an `OK`, and the topic exists).
#[test]
fn commands_before_a_compressed_stream_ends_or_breaks_still_run() {
    use std::io::{Read, Write};
    let b = Broker::start(2, &[]);
    // Deflate: a PUB and the stream's end (Z_FINISH) in one write; then a PUB, a sync
    // flush and garbage in one write.
    for (topic, garbage) in [("defl_end", false), ("defl_garbage", true)] {
        let mut s = b.connect_v2();
        s.write_all(&identify_cmd(
            r#"{"feature_negotiation":true,"deflate":true}"#,
        ))
        .unwrap();
        read_frame(&mut s).unwrap();
        let mut inf = flate2::Decompress::new(false);
        assert_eq!(read_inflated(&mut s, &mut inf, 10), frame(0, b"OK"));
        let mut def = flate2::Compress::new(flate2::Compression::new(6), false);
        let mut out = Vec::with_capacity(4096);
        let flush = if garbage {
            flate2::FlushCompress::Sync
        } else {
            flate2::FlushCompress::Finish
        };
        def.compress_vec(&pub_cmd(topic, b"last words"), &mut out, flush)
            .unwrap();
        if garbage {
            out.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa]);
        }
        s.write_all(&out).unwrap();
        assert_eq!(
            read_inflated(&mut s, &mut inf, 10),
            frame(0, b"OK"),
            "{topic}"
        );
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let st = b.stats();
        assert!(
            st["topics"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["topic_name"] == topic && t["message_count"] == 1),
            "{topic}: {st}"
        );
    }
    // Snappy: a chunk with a PUB, then a chunk whose CRC is wrong, in one write.
    let mut s = b.connect_v2();
    s.write_all(&identify_cmd(
        r#"{"feature_negotiation":true,"snappy":true}"#,
    ))
    .unwrap();
    read_frame(&mut s).unwrap();
    let mut id = [0u8; 10];
    s.read_exact(&mut id).unwrap();
    let mut framed = Vec::new();
    {
        let mut enc = snap::write::FrameEncoder::new(&mut framed);
        enc.write_all(&pub_cmd("snap_crc", b"last words")).unwrap();
        enc.flush().unwrap();
    }
    let mut bad = framed[10..].to_vec(); // the data chunk, after the stream identifier
    bad[4] ^= 0xff; // its CRC
    let mut both = framed.clone();
    both.extend_from_slice(&bad);
    s.write_all(&both).unwrap();
    let mut dec =
        snap::read::FrameDecoder::new(SnapStream(s.try_clone().unwrap(), Some(id.to_vec())));
    let mut ok = [0u8; 20];
    dec.read_exact(&mut ok).unwrap();
    assert_eq!(ok[10..].to_vec(), frame(0, b"OK"));
    let st = b.stats();
    assert!(
        st["topics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["topic_name"] == "snap_crc" && t["message_count"] == 1),
        "{st}"
    );
}
