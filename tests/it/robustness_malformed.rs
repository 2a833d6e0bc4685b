//! Command lines longer than the read buffer, garbage after the magic, empty lines and
//! absurd JSON: exact errors where upstream has one, a close in every case, no crash, and
//! other clients not affected (see tests/it/common/hostile.rs).

use crate::common;

use common::hostile::*;
use common::{for_each_shards, identify_cmd, read_frame_skip_hb, Broker, SHARD_COUNTS};
use std::io::Write;
use std::net::Shutdown;
use std::thread;
use std::time::Duration;

// ------------------------------------------------------------------------------------
// long command lines

/// A command line longer than the 16 KiB read buffer: the connection is closed (upstream
/// sends no error frame; if one is sent it must at least be an error frame). A line that
/// fits exactly (16384 bytes with the newline) is processed normally.
#[test]
fn command_line_longer_than_read_buffer() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        // Fits: "PUB " + 16379 + "\n" = 16384 bytes. The name is too long, so E_BAD_TOPIC.
        let name = "a".repeat(16379);
        let mut s = v2(broker.tcp);
        s.write_all(format!("PUB {name}\n").as_bytes()).unwrap();
        expect_fatal(
            &mut s,
            &format!("E_BAD_TOPIC PUB topic name \"{name}\" is not valid"),
            &format!("{ctx}: a 16384-byte line"),
        );

        // A 10000-byte line after a normal command on the same connection.
        let mut s = v2(broker.tcp);
        s.write_all(b"NOP\n").unwrap();
        let name = "b".repeat(10000);
        s.write_all(format!("SUB {name} ch\n").as_bytes()).unwrap();
        expect_fatal(
            &mut s,
            &format!("E_BAD_TOPIC SUB topic name \"{name}\" is not valid"),
            &format!("{ctx}: a 10000-byte SUB line"),
        );

        let too_long: Vec<(&str, Vec<u8>)> = vec![
            (
                "20000-byte PUB line",
                format!("PUB {}\n", "a".repeat(20000)).into_bytes(),
            ),
            (
                "16385-byte line",
                format!("PUB {}\n", "a".repeat(16380)).into_bytes(),
            ),
            ("64 KiB without a newline", vec![b'N'; 65536]),
            ("1 MiB without a newline", vec![b'x'; 1 << 20]),
            (
                "long line after a good command",
                format!("NOP\nPUB {}\n", "z".repeat(40000)).into_bytes(),
            ),
        ];
        for (name, bytes) in too_long {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            let mut w = s.try_clone().unwrap();
            let writer = thread::spawn(move || {
                let _ = w.write_all(&bytes);
            });
            let got = read_until_closed(&mut s, Duration::from_secs(10), &c);
            match split_frames(&got) {
                Some(frames) => assert!(
                    frames.iter().all(|(ft, _)| *ft == 1),
                    "{c}: only an error frame may precede the close, got {:?}",
                    show(&got)
                ),
                None => panic!("{c}: garbage before the close: {:?}", show(&got)),
            }
            writer.join().unwrap();
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    });
}

// ------------------------------------------------------------------------------------
// malformed content

/// Garbage after the magic, an empty command line, absurd JSON: exact errors where
/// upstream has one, a close in every case, and no crash (e.g. no stack overflow on
/// deeply nested JSON).
#[test]
fn garbage_and_malformed_commands() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        let mut s = v2(broker.tcp);
        s.write_all(b"\n\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command ",
            &format!("{ctx}: empty line"),
        );

        let mut s = v2(broker.tcp);
        s.write_all(b"ASDF\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command ASDF",
            &format!("{ctx}: ASDF"),
        );

        let mut s = v2(broker.tcp);
        s.write_all(b"pub lower\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command pub",
            &format!("{ctx}: lowercase"),
        );

        // Deep nesting under an unknown key. Upstream (Go encoding/json, max depth 10000)
        // rejects it; the spec only says unknown keys are ignored, so accept either the
        // decode error or OK, as long as the broker neither crashes nor hangs.
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let mut s = v2(broker.tcp);
        s.write_all(&identify_cmd(&deep)).unwrap();
        let (ft, data) = read_frame_skip_hb(&mut s)
            .unwrap_or_else(|e| panic!("{ctx}: IDENTIFY with 100000-deep JSON: {e}"));
        assert!(
            (ft, data.as_slice()) == (0, b"OK")
                || (ft, data.as_slice()) == (1, b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
            "{ctx}: IDENTIFY with 100000-deep JSON under an unknown key: {:?}",
            show(&data)
        );
        drop(s);

        let bad_json: Vec<(&str, String)> = vec![
            (
                "a 100000-deep top-level array",
                format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            ("an unterminated deep array", "[".repeat(500_000)),
            ("a JSON array", "[1,2,3]".to_string()),
            ("not JSON", "hello".to_string()),
            (
                "a float for an int field",
                "{\"heartbeat_interval\":1.5}".to_string(),
            ),
            (
                "a string for a bool field",
                "{\"feature_negotiation\":\"yes\"}".to_string(),
            ),
            (
                "a huge number",
                format!("{{\"msg_timeout\":{}}}", "9".repeat(5000)),
            ),
        ];
        for (name, body) in bad_json {
            let c = format!("{ctx}: IDENTIFY with {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&identify_cmd(&body)).unwrap();
            expect_fatal(&mut s, "E_BAD_BODY IDENTIFY failed to decode JSON body", &c);
        }

        // Random bytes after the magic: every connection must be closed by the server.
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ shards as u64);
        for i in 0..200 {
            let len = 1 + (rng.next() % 8192) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let c = format!("{ctx}: random garbage #{i} ({len} bytes)");
            let mut s = v2(broker.tcp);
            let _ = s.write_all(&bytes);
            // Most garbage has no newline for a while; EOF ends any pending read.
            let _ = s.shutdown(Shutdown::Write);
            let got = read_until_closed(&mut s, Duration::from_secs(10), &c);
            if let Some(frames) = split_frames(&got) {
                assert!(
                    frames.len() <= 1,
                    "{c}: more than one frame: {:?}",
                    show(&got)
                );
            }
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    });
}
