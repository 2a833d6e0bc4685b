//! Absurd size fields and bodies over the configured limits: rejected from the size
//! field alone with the exact nsqd 1.3.0 errors, nothing allocated for the body, and other
//! clients not affected (see tests/it/common/hostile.rs).

use crate::common;

use common::hostile::*;
use common::{
    for_each_shards, identify_cmd, mpub_cmd, proc_status_kb, pub_cmd, sized, Broker, SHARD_COUNTS,
};
use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// huge and bad size fields

/// Size fields of 1 GiB (and other absurd values) must be rejected from the 4 header
/// bytes alone: exact error, connection closed, nothing allocated for the body.
#[test]
fn huge_size_fields_are_rejected_without_allocating() {
    const GIB: u32 = 1 << 30;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "PUB 1 GiB",
            cat(&[b"PUB huge\n", &be32(GIB)]),
            "E_BAD_MESSAGE PUB message too big 1073741824 > 1048576",
        ),
        (
            "PUB i32::MAX",
            cat(&[b"PUB huge\n", &be32(i32::MAX as u32)]),
            "E_BAD_MESSAGE PUB message too big 2147483647 > 1048576",
        ),
        (
            "PUB size -1",
            cat(&[b"PUB huge\n", &be32(u32::MAX)]),
            "E_BAD_MESSAGE PUB invalid message body size -1",
        ),
        (
            "PUB size i32::MIN",
            cat(&[b"PUB huge\n", &be32(0x8000_0000)]),
            "E_BAD_MESSAGE PUB invalid message body size -2147483648",
        ),
        (
            "DPUB 1 GiB",
            cat(&[b"DPUB huge 10\n", &be32(GIB)]),
            "E_BAD_MESSAGE DPUB message too big 1073741824 > 1048576",
        ),
        (
            "MPUB 1 GiB",
            cat(&[b"MPUB huge\n", &be32(GIB)]),
            "E_BAD_BODY MPUB body too big 1073741824 > 5242880",
        ),
        (
            "MPUB size -1",
            cat(&[b"MPUB huge\n", &be32(u32::MAX)]),
            "E_BAD_BODY MPUB invalid body size -1",
        ),
        (
            "MPUB count 1 Gi",
            cat(&[b"MPUB huge\n", &be32(100), &be32(GIB)]),
            "E_BAD_BODY MPUB invalid message count 1073741824",
        ),
        (
            "MPUB count -1",
            cat(&[b"MPUB huge\n", &be32(100), &be32(u32::MAX)]),
            "E_BAD_BODY MPUB invalid message count -1",
        ),
        (
            "MPUB element 1 GiB",
            cat(&[
                b"MPUB huge\n",
                &be32(100),
                &be32(2),
                &sized(b"ok"),
                &be32(GIB),
            ]),
            "E_BAD_MESSAGE MPUB message too big 1073741824 > 1048576",
        ),
        (
            "IDENTIFY 1 GiB",
            cat(&[b"IDENTIFY\n", &be32(GIB)]),
            "E_BAD_BODY IDENTIFY body too big 1073741824 > 5242880",
        ),
        (
            "IDENTIFY size -1",
            cat(&[b"IDENTIFY\n", &be32(u32::MAX)]),
            "E_BAD_BODY IDENTIFY invalid body size -1",
        ),
        (
            "AUTH 1 GiB",
            cat(&[b"AUTH\n", &be32(GIB)]),
            "E_BAD_BODY AUTH body too big 1073741824 > 5242880",
        ),
    ];
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.pid();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let vm_peak_before = proc_status_kb(pid, "VmPeak:");
        let hwm_before = proc_status_kb(pid, "VmHWM:");
        for (name, bytes, expected) in &cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(bytes).unwrap();
            let t0 = Instant::now();
            expect_fatal(&mut s, expected, &c);
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "{c}: took {:?}",
                t0.elapsed()
            );
        }
        // 16 at once, each left open: an implementation that allocates before checking
        // would map 16 GiB here.
        let mut conns: Vec<TcpStream> = (0..16)
            .map(|_| {
                let mut s = v2(broker.tcp);
                s.write_all(&cat(&[b"PUB huge\n", &be32(GIB)])).unwrap();
                s
            })
            .collect();
        for s in &mut conns {
            expect_fatal(
                s,
                "E_BAD_MESSAGE PUB message too big 1073741824 > 1048576",
                &format!("{ctx}: concurrent PUB 1 GiB"),
            );
        }
        let vm_peak_after = proc_status_kb(pid, "VmPeak:");
        let hwm_after = proc_status_kb(pid, "VmHWM:");
        eprintln!(
            "{ctx}: VmPeak {vm_peak_before} -> {vm_peak_after} kB, VmHWM {hwm_before} -> \
             {hwm_after} kB"
        );
        assert!(
            vm_peak_after < vm_peak_before + 1_000_000,
            "{ctx}: VmPeak grew by {} kB: a body buffer was allocated from the size field",
            vm_peak_after - vm_peak_before
        );
        assert!(
            hwm_after < hwm_before + 256 * 1024,
            "{ctx}: peak RSS grew by {} kB",
            hwm_after - hwm_before
        );
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "huge", &ctx);
    });
}

// ------------------------------------------------------------------------------------
// bodies over the configured limits

/// With --max-msg-size=100 --max-body-size=1000 (the upstream test values), bodies over
/// the limit (sent in full) are rejected with the exact errors; exactly the limit works.
#[test]
fn bodies_over_the_configured_limits() {
    let m100 = [b'm'; 100];
    let m101 = [b'm'; 101];
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &["--max-msg-size=100", "--max-body-size=1000"]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        let mut s = v2(broker.tcp);
        s.write_all(&pub_cmd("limits", &m100)).unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: PUB of exactly max-msg-size"),
        );
        s.write_all(&mpub_cmd("limits", &[&m100[..]; 5])).unwrap();
        expect_frame(&mut s, 0, b"OK", &format!("{ctx}: MPUB 5x100"));
        // 4 + 9 * 104 + 60 = 1000 bytes: exactly max-body-size.
        let mut nine: Vec<&[u8]> = vec![&m100; 9];
        let last = [b'l'; 56];
        nine.push(&last);
        s.write_all(&mpub_cmd("limits", &nine)).unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: MPUB of exactly max-body-size"),
        );

        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "PUB 101 > 100",
                pub_cmd("limits", &m101),
                "E_BAD_MESSAGE PUB message too big 101 > 100",
            ),
            (
                "DPUB 101 > 100",
                cat(&[b"DPUB limits 100\n", &sized(&m101)]),
                "E_BAD_MESSAGE DPUB message too big 101 > 100",
            ),
            (
                "MPUB 11x100",
                mpub_cmd("limits", &[&m100[..]; 11]),
                "E_BAD_BODY MPUB body too big 1148 > 1000",
            ),
            (
                "MPUB 5x101",
                mpub_cmd("limits", &[&m101[..]; 5]),
                "E_BAD_MESSAGE MPUB message too big 101 > 100",
            ),
            (
                "MPUB 5x100 + empty",
                mpub_cmd("limits", &[&m100, &m100, &m100, &m100, &m100, b""]),
                "E_BAD_MESSAGE MPUB invalid message(5) body size 0",
            ),
            (
                "IDENTIFY 1001 > 1000",
                identify_cmd(&format!("{{\"client_id\":\"{}\"}}", "c".repeat(1001 - 16))),
                "E_BAD_BODY IDENTIFY body too big 1001 > 1000",
            ),
            (
                "PUB empty",
                pub_cmd("limits", b""),
                "E_BAD_MESSAGE PUB invalid message body size 0",
            ),
        ];
        for (name, bytes, expected) in cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&bytes).unwrap();
            expect_fatal(&mut s, expected, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        // Only the accepted publishes count: 1 + 5 + 10 = 16 (the MPUB 5x101 and the
        // 5x100 + empty batch are all-or-nothing).
        let stats = broker.stats();
        let t = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic_name"] == "limits")
            .cloned()
            .unwrap_or_default();
        assert_eq!(t["message_count"], 16, "{ctx}: topic limits: {t}");
    });
}

/// With the default --max-msg-size (1 MiB): the full body of a too-big PUB is actually
/// sent. The server rejects it from the size field, closes, and is not disturbed by the
/// rest of the body still arriving.
#[test]
fn body_longer_than_default_max_msg_size() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        // Exactly the max is accepted.
        let mut s = v2(broker.tcp);
        s.write_all(&pub_cmd("big", &vec![b'b'; 1_048_576]))
            .unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: PUB of exactly 1048576 bytes"),
        );

        for _ in 0..3 {
            let mut s = v2(broker.tcp);
            let mut w = s.try_clone().unwrap();
            let writer = thread::spawn(move || {
                // The server may close before the body is in: ignore write errors.
                let _ = w.write_all(&pub_cmd("big", &vec![b'b'; 1_048_577 + 3_000_000]));
            });
            let got = read_until_closed(&mut s, Duration::from_secs(10), &ctx);
            // The error frame may be lost to a reset (unread body data at close); if it
            // arrived, it must be the exact one.
            if !got.is_empty() {
                assert_eq!(
                    split_frames(&got),
                    Some(vec![(
                        1,
                        b"E_BAD_MESSAGE PUB message too big 4048577 > 1048576".to_vec()
                    )]),
                    "{ctx}: reply to a 4 MB PUB: {:?}",
                    show(&got)
                );
            }
            writer.join().unwrap();
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        let stats = broker.stats();
        let t = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic_name"] == "big")
            .cloned()
            .unwrap_or_default();
        assert_eq!(t["message_count"], 1, "{ctx}: topic big: {t}");
    });
}
