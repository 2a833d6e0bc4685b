//! Many connections dropped in every kind of half-finished state: the broker cleans
//! every one up and keeps serving the others (see tests/it/common/hostile.rs).

use crate::common;

use common::hostile::*;
use common::{fd_count, for_each_shards, identify_cmd, sized, Broker, SHARD_COUNTS};
use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// many aborted connections

/// 10,000 connections opened and dropped in every kind of half-finished state, from 8
/// threads, 25 open at a time per thread. Then the broker still serves, every connection
/// has been cleaned up (fd count back near the start, no subscribed ghosts), and the
/// background pairs never stalled.
#[test]
fn ten_thousand_connections_dropped_mid_command() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 1250;
    const BATCH: usize = 25;
    for_each_shards(&SHARD_COUNTS, |shards| {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.pid();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let fds_before = fd_count(pid);
        let addr = broker.tcp;
        let t0 = Instant::now();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                thread::spawn(move || {
                    let mut open = Vec::with_capacity(BATCH);
                    for i in 0..PER_THREAD {
                        let mut s = match TcpStream::connect(addr) {
                            Ok(s) => s,
                            Err(e) => panic!("thread {t}: connect #{i} failed: {e}"),
                        };
                        let bytes: Vec<u8> = match (i + t) % 9 {
                            0 => vec![],
                            1 => b"  V".to_vec(),
                            2 => b"  V2".to_vec(),
                            3 => b"  V2PUB abort".to_vec(),
                            4 => cat(&[b"  V2PUB abort\n", &be32(100), &[b'x'; 10]]),
                            5 => cat(&[b"  V2IDENTIFY\n", &be32(60), b"{\"client_id\":\"x\""]),
                            6 => b"  V2SUB abort ch\nRDY 10\n".to_vec(),
                            7 => cat(&[b"  V2MPUB abort\n", &be32(100), &be32(3), &sized(b"a")]),
                            _ => cat(&[b"  V2", &identify_cmd("{\"feature_negotiation\":true}")]),
                        };
                        // The server may already have closed (e.g. bad magic): ignore.
                        let _ = s.write_all(&bytes);
                        open.push(s);
                        if open.len() == BATCH {
                            open.clear();
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        eprintln!("{ctx}: 10000 aborted connections in {:?}", t0.elapsed());
        traffic.finish();
        assert_serves(&mut broker, &ctx);

        // All of them are cleaned up.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let fds = fd_count(pid);
            let stats = broker.stats();
            let ghosts: u64 = stats["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["topic_name"] == "abort")
                .flat_map(|t| t["channels"].as_array().cloned().unwrap_or_default())
                .map(|c| c["client_count"].as_u64().unwrap_or(0))
                .sum();
            if fds <= fds_before + 50 && ghosts == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: 15 s after the storm the broker still has {fds} fds (started with \
                 {fds_before}) and {ghosts} clients subscribed to abort/ch"
            );
            thread::sleep(Duration::from_millis(200));
        }
        assert_nothing_published(&broker, "abort", &ctx);
    });
}
