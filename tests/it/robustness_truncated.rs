//! Bad magic and truncated frames from hostile clients: exact errors (or a silent close),
//! nothing published from a cut command, no crash and no leaked connection; commands
//! pipelined after a fatal error are never executed. Other clients are not affected
//! (background traffic and `assert_serves`, see tests/it/common/hostile.rs).

use crate::common;

use common::hostile::*;
use common::{fd_count, for_each_shards, identify_cmd, pub_cmd, sized, Broker, SHARD_COUNTS};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// bad magic

/// A wrong 4-byte magic gets exactly one error frame `E_BAD_PROTOCOL` (nsqd/tcp.go sends
/// only the code, no description) and then the connection is closed. Fewer than 4 bytes
/// then EOF: closed with nothing sent.
#[test]
fn bad_magic_gets_one_e_bad_protocol_frame_then_close() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let magics: [&[u8; 4]; 7] = [
            b"  V1",
            b"  V3",
            b"XXXX",
            b"V2  ",
            b"\0\0\0\0",
            b"  v2",
            b"PUB ",
        ];
        for magic in magics {
            let c = format!("{ctx}: magic {:?}", show(magic));
            let mut s = TcpStream::connect(broker.tcp).unwrap();
            s.write_all(magic).unwrap();
            let rest = read_until_closed(&mut s, Duration::from_secs(10), &c);
            assert_eq!(
                split_frames(&rest),
                Some(vec![(1, b"E_BAD_PROTOCOL".to_vec())]),
                "{c}: expected exactly one error frame E_BAD_PROTOCOL then close, got {:?}",
                show(&rest)
            );
        }
        for partial in [&b""[..], b" ", b"  V"] {
            let c = format!("{ctx}: partial magic {:?} then EOF", show(partial));
            let mut s = TcpStream::connect(broker.tcp).unwrap();
            s.write_all(partial).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            expect_closed_silently(&mut s, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    });
}

// ------------------------------------------------------------------------------------
// truncated frames

/// (bytes after the magic, frames expected before the close). Each is sent, then the
/// client half-closes its side (EOF), so the server's reply can still be read.
/// (name, bytes sent before the half-close, frames expected back).
type TruncatedCase = (&'static str, Vec<u8>, Vec<(i32, &'static str)>);

fn truncated_cases() -> Vec<TruncatedCase> {
    vec![
        ("half a command line", b"PUB trunc".to_vec(), vec![]),
        ("half a command word", b"SU".to_vec(), vec![]),
        (
            "PUB with half a size",
            cat(&[b"PUB trunc\n", &[0, 0]]),
            vec![(1, "E_BAD_MESSAGE PUB failed to read message body size")],
        ),
        (
            "PUB with a cut-off body",
            cat(&[b"PUB trunc\n", &be32(100), &[b'x'; 50]]),
            vec![(1, "E_BAD_MESSAGE PUB failed to read message body")],
        ),
        (
            "DPUB with a cut-off body",
            cat(&[b"DPUB trunc 0\n", &be32(10), b"abc"]),
            vec![(1, "E_BAD_MESSAGE DPUB failed to read message body")],
        ),
        (
            "MPUB with half a size",
            cat(&[b"MPUB trunc\n", &[0, 0, 0]]),
            vec![(1, "E_BAD_BODY MPUB failed to read body size")],
        ),
        (
            "MPUB with half a count",
            cat(&[b"MPUB trunc\n", &be32(100), &[0, 0]]),
            vec![(1, "E_BAD_BODY MPUB failed to read message count")],
        ),
        (
            "MPUB cut in the second message size",
            cat(&[
                b"MPUB trunc\n",
                &be32(100),
                &be32(2),
                &sized(b"hello"),
                &[0],
            ]),
            vec![(1, "E_BAD_MESSAGE MPUB failed to read message(1) body size")],
        ),
        (
            "MPUB cut in a message body",
            cat(&[b"MPUB trunc\n", &be32(100), &be32(2), &be32(5), b"hel"]),
            vec![(1, "E_BAD_MESSAGE MPUB failed to read message body")],
        ),
        (
            "IDENTIFY with half a size",
            cat(&[b"IDENTIFY\n", &[0]]),
            vec![(1, "E_BAD_BODY IDENTIFY failed to read body size")],
        ),
        (
            "IDENTIFY with a cut-off body",
            cat(&[b"IDENTIFY\n", &be32(50), b"{\"client_id\""]),
            vec![(1, "E_BAD_BODY IDENTIFY failed to read body")],
        ),
        (
            "AUTH with a cut-off body",
            cat(&[b"AUTH\n", &be32(20), b"sec"]),
            vec![(1, "E_BAD_BODY AUTH failed to read body")],
        ),
        (
            "a complete PUB then EOF",
            pub_cmd("trunc_complete", b"whole"),
            vec![(0, "OK")],
        ),
        (
            "SUB then half a RDY line",
            b"SUB trunc ch\nRDY 1".to_vec(),
            vec![(0, "OK")],
        ),
        (
            "IDENTIFY then a cut-off PUB",
            cat(&[&identify_cmd("{}"), b"PUB trunc\n", &be32(4), b"ab"]),
            vec![
                (0, "OK"),
                (1, "E_BAD_MESSAGE PUB failed to read message body"),
            ],
        ),
    ]
}

/// Each truncated command followed by EOF (half-close): the server answers with the exact
/// "failed to read" error (or nothing, for a cut command line) and closes.
#[test]
fn truncated_commands_then_eof_get_exact_errors() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        for (name, bytes, frames) in truncated_cases() {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&bytes).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            for (ft, data) in &frames {
                expect_frame(&mut s, *ft, data.as_bytes(), &c);
            }
            expect_closed_silently(&mut s, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "trunc", &ctx);
    });
}

/// The same truncated commands, but the client just closes the socket (several times
/// each, with and without the rest unread): the broker must not crash or leak the
/// connection, and nothing may be published.
#[test]
fn truncated_commands_then_abrupt_close() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.pid();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let fds_before = fd_count(pid);
        for round in 0..20 {
            for (_, bytes, _) in truncated_cases() {
                let mut s = v2(broker.tcp);
                s.write_all(&bytes).unwrap();
                if round % 2 == 1 {
                    thread::sleep(Duration::from_millis(1));
                }
                drop(s);
            }
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "trunc", &ctx);
        // Every aborted connection is cleaned up (no fd leak).
        let deadline = Instant::now() + Duration::from_secs(10);
        while fd_count(pid) > fds_before + 20 {
            assert!(
                Instant::now() < deadline,
                "{ctx}: broker fds {} -> {} after 280 aborted connections",
                fds_before,
                fd_count(pid)
            );
            thread::sleep(Duration::from_millis(100));
        }
    });
}

/// Whatever follows a fatal error on the same connection is never executed: the
/// connection is closed right after the error frame, even when the rejected command's
/// "body" (which the server does not read) contains a well-formed PUB.
#[test]
fn commands_pipelined_after_a_fatal_error_are_not_executed() {
    let smuggled = pub_cmd("smuggled", b"must not be published");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bad topic",
            cat(&[b"PUB bad!topic\n", &smuggled]),
            "E_BAD_TOPIC PUB topic name \"bad!topic\" is not valid",
        ),
        (
            "invalid command",
            cat(&[b"BOGUS\n", &smuggled]),
            "E_INVALID invalid command BOGUS",
        ),
        (
            "too-big PUB whose body is a PUB",
            cat(&[b"PUB smuggled\n", &be32(2_000_000), &smuggled]),
            "E_BAD_MESSAGE PUB message too big 2000000 > 1048576",
        ),
        (
            "too-big MPUB whose body is a PUB",
            cat(&[b"MPUB smuggled\n", &be32(6_000_000), &smuggled]),
            "E_BAD_BODY MPUB body too big 6000000 > 5242880",
        ),
        (
            "too-big IDENTIFY whose body is a PUB",
            cat(&[b"IDENTIFY\n", &be32(6_000_000), &smuggled]),
            "E_BAD_BODY IDENTIFY body too big 6000000 > 5242880",
        ),
        (
            "RDY before SUB",
            cat(&[b"RDY 1\n", &smuggled]),
            "E_INVALID cannot RDY in current state",
        ),
        (
            "empty PUB body",
            cat(&[b"PUB smuggled\n", &be32(0), &smuggled]),
            "E_BAD_MESSAGE PUB invalid message body size 0",
        ),
    ];
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        for (name, bytes, expected) in &cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(bytes).unwrap();
            // The rest of the bytes may be unread at close, so a reset can replace the EOF
            // (read_until_closed accepts both), but the error frame comes first.
            expect_frame(&mut s, 1, expected.as_bytes(), &c);
            let rest = read_until_closed(&mut s, Duration::from_secs(10), &c);
            assert!(
                rest.is_empty(),
                "{c}: frames after the fatal error: {:?}",
                show(&rest)
            );
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "smuggled", &ctx);
    });
}
