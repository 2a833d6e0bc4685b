//! The cost of decoding an MPUB that arrives in small reads (found while fuzzing): plain
//! `decode` re-walks the command from its start on each read, so an MPUB of many tiny
//! messages trickled in costs reads x messages (5 MB of 1-byte messages in 2 KiB reads:
//! about 4 s of CPU, release build); `decode_resume`, which the connection uses, goes on
//! where it stopped. The test asserts the resumable decoder stays linear; timings:
//! `cargo test --release -p nsq-fuzz --test mpub_partial_cost -- --nocapture`.
use nsq_shards::ClientState;
use nsq_wire::v2::{self as protocol, Context, Limits, Resume};
use std::time::Instant;

#[test]
fn mpub_in_small_reads() {
    let limits = Limits::NSQD_DEFAULTS;
    let ctx = Context {
        state: ClientState::Init,
        heartbeats_enabled: true,
        limits,
        eof: false,
    };
    for (count, read) in [
        (100_000usize, 2048usize),
        (1_048_575, 65536),
        (1_048_575, 2048),
    ] {
        let mut cmd = b"MPUB t\n".to_vec();
        cmd.extend_from_slice(&((4 + 5 * count) as u32).to_be_bytes());
        cmd.extend_from_slice(&(count as u32).to_be_bytes());
        for _ in 0..count {
            cmd.extend_from_slice(&1u32.to_be_bytes());
            cmd.push(b'x');
        }
        let t = Instant::now();
        let mut calls = 0;
        let mut end = 0;
        let mut resume = Resume::default();
        let mut walked = 0;
        let got = loop {
            end = (end + read).min(cmd.len());
            calls += 1;
            if let Some((c, _)) = protocol::decode_resume(&cmd[..end], &ctx, &mut resume).unwrap() {
                break c;
            }
            walked += 1;
        };
        let took = t.elapsed();
        println!(
            "MPUB of {count} 1-byte messages ({} bytes) in {read}-byte reads: {calls} decode_resume calls, {took:?}",
            cmd.len(),
        );
        let protocol::Command::Mpub { bodies, .. } = got else {
            panic!("not an MPUB")
        };
        assert_eq!(bodies.len(), count);
        assert_eq!(walked + 1, calls);
        // Linear: ~11 ms release, well under a second debug (plain decode: ~4 s release).
        assert!(took.as_secs_f64() < 5.0, "MPUB decode took {took:?}");
    }
}
