//! Clients that never read their sockets (stuck consumers, producers that never read
//! replies): the broker neither blocks other clients nor buffers without bound (see
//! tests/it/common/hostile.rs).

use crate::common;

use common::hostile::*;
use common::{
    for_each_shards, identify_cmd, mpub_cmd, parse_message, proc_status_kb, read_frame_skip_hb,
    Broker, SHARD_COUNTS,
};
use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// clients that never read

/// Consumers subscribe with RDY 2500 and then never read their sockets while a producer
/// publishes 50 MB (5000 x 10 KB, MPUB batches of 100). The producer gets every OK, a
/// consumer on another channel of the same topic gets every message, /stats keeps
/// answering, the stuck channel accounts for every message (depth + in-flight = 5000,
/// in-flight <= 2500 per client), and the broker's RSS does not grow without bound.
#[test]
fn consumer_that_never_reads_does_not_block_others() {
    const MSGS: usize = 5000;
    const SIZE: usize = 10 * 1024;
    const BATCH: usize = 100;
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.pid();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let rss_before = proc_status_kb(pid, "VmRSS:");

        // Three of them on one channel (so that, whatever the shard hashing, some are
        // likely to share a shard with the producer, the other consumer or the topic).
        let stuck: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = v2(broker.tcp);
                s.write_all(b"SUB flood stuck\n").unwrap();
                expect_frame(&mut s, 0, b"OK", &format!("{ctx}: stuck SUB"));
                s.write_all(b"RDY 2500\n").unwrap();
                // ... and never read from it again.
                s
            })
            .collect();

        let mut fast = v2(broker.tcp);
        fast.write_all(b"SUB flood fast\n").unwrap();
        expect_frame(&mut fast, 0, b"OK", &format!("{ctx}: fast SUB"));
        fast.write_all(b"RDY 500\n").unwrap();
        let fast_ctx = ctx.clone();
        let fast_reader = thread::spawn(move || {
            let mut seen = vec![false; MSGS];
            let mut count = 0;
            while count < MSGS {
                let (ft, data) = read_frame_skip_hb(&mut fast).unwrap_or_else(|e| {
                    panic!("{fast_ctx}: fast consumer read failed after {count}: {e}")
                });
                assert_eq!(ft, 2, "{fast_ctx}: fast consumer got {:?}", show(&data));
                let (_, _, id, body) = parse_message(&data);
                assert_eq!(body.len(), SIZE, "{fast_ctx}: body size");
                let n: usize = String::from_utf8_lossy(&body[..8]).trim().parse().unwrap();
                assert!(!seen[n], "{fast_ctx}: message {n} delivered twice");
                seen[n] = true;
                count += 1;
                fast.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
            }
            count
        });

        let mut producer = v2(broker.tcp);
        let t0 = Instant::now();
        let mut max_stats = Duration::ZERO;
        for b in 0..MSGS / BATCH {
            let bodies: Vec<Vec<u8>> = (0..BATCH)
                .map(|k| {
                    let mut body = format!("{:<8}", b * BATCH + k).into_bytes();
                    body.resize(SIZE, b'f');
                    body
                })
                .collect();
            let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
            producer.write_all(&mpub_cmd("flood", &refs)).unwrap();
            expect_frame(&mut producer, 0, b"OK", &format!("{ctx}: MPUB batch {b}"));
            if b % 10 == 0 {
                let t = Instant::now();
                let (code, _) = broker.http("GET", "/stats?format=json", b"");
                assert_eq!(code, 200, "{ctx}: /stats during the flood");
                max_stats = max_stats.max(t.elapsed());
            }
        }
        let publish_time = t0.elapsed();
        let got = fast_reader
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        eprintln!(
            "{ctx}: published 50 MB in {publish_time:?}, fast consumer done after {:?}, \
             slowest /stats {max_stats:?}",
            t0.elapsed()
        );
        assert_eq!(got, MSGS);
        assert!(
            max_stats < Duration::from_secs(3),
            "{ctx}: /stats took {max_stats:?}"
        );

        // The stuck channel: nothing lost, RDY respected.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = broker.stats();
            let ch = stats["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["topic_name"] == "flood")
                .flat_map(|t| t["channels"].as_array().cloned().unwrap_or_default())
                .find(|c| c["channel_name"] == "stuck")
                .unwrap_or_else(|| panic!("{ctx}: channel flood/stuck missing"));
            let in_flight = ch["in_flight_count"].as_u64().unwrap_or(u64::MAX);
            let depth = ch["depth"].as_u64().unwrap_or(u64::MAX);
            assert!(
                in_flight <= 3 * 2500,
                "{ctx}: stuck in_flight {in_flight} > 3 x RDY 2500"
            );
            for c in ch["clients"].as_array().into_iter().flatten() {
                let n = c["in_flight_count"].as_u64().unwrap_or(0);
                assert!(
                    n <= 2500,
                    "{ctx}: a stuck client has {n} in flight > RDY 2500: {c}"
                );
            }
            if in_flight + depth == MSGS as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: stuck channel depth {depth} + in_flight {in_flight} != {MSGS}: {ch}"
            );
            thread::sleep(Duration::from_millis(100));
        }

        let rss_after = proc_status_kb(pid, "VmRSS:");
        eprintln!("{ctx}: RSS {rss_before} kB -> {rss_after} kB");
        // 50 MB of payload, held at most once per channel, plus buffers: 400 MB is
        // generous; unbounded per-client buffering would blow through it.
        assert!(
            rss_after < rss_before + 400 * 1024,
            "{ctx}: RSS grew from {rss_before} kB to {rss_after} kB"
        );

        traffic.finish();
        assert_serves(&mut broker, &ctx);
        drop(stuck);
        // Time for the broker to see the close.
        thread::sleep(Duration::from_millis(200));
        assert_serves(
            &mut broker,
            &format!("{ctx}: after the stuck consumer left"),
        );
    });
}

/// A client that pipelines commands and never reads the replies: 400,000 IDENTIFYs
/// with feature negotiation (each answered by a ~270-byte JSON frame, so up to 108 MB of
/// replies). Once its socket buffers are full the broker may stop reading from it, but it
/// must not buffer the replies without bound, and other clients must not notice.
#[test]
fn client_that_never_reads_replies_does_not_block_others() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.pid();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let rss_before = proc_status_kb(pid, "VmRSS:");

        let flooder = v2(broker.tcp);
        flooder
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut w = flooder.try_clone().unwrap();
        let writer = thread::spawn(move || {
            let one = identify_cmd("{\"feature_negotiation\":true}");
            let chunk: Vec<u8> = (0..1000).flat_map(|_| one.clone()).collect();
            let mut sent = 0usize;
            // Stops when the broker has not read anything for 2 s (write timeout).
            for _ in 0..400 {
                if w.write_all(&chunk).is_err() {
                    break;
                }
                sent += 1000;
            }
            sent
        });
        // While the flood is going on, other clients work.
        thread::sleep(Duration::from_millis(500));
        assert_serves(&mut broker, &format!("{ctx}: during the flood"));
        let sent = writer.join().unwrap();
        let rss_after = proc_status_kb(pid, "VmRSS:");
        eprintln!("{ctx}: pipelined {sent} IDENTIFYs; RSS {rss_before} kB -> {rss_after} kB");
        assert!(
            rss_after < rss_before + 64 * 1024,
            "{ctx}: RSS grew from {rss_before} kB to {rss_after} kB: replies to a client \
             that does not read are buffered without bound"
        );
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        drop(flooder);
        // Time for the broker to see the close.
        thread::sleep(Duration::from_millis(200));
        assert_serves(&mut broker, &format!("{ctx}: after the flooder left"));
    });
}
