//! Disk faults injected by the storage layer (`NSQD_STORAGE_FAULTS`, see
//! `nsq_storage::faults`): I/O errors on segment writes, short writes, slow writes and
//! syncs, and failed fsyncs, on the real broker with `--shards 2`. In every case a
//! publish is either refused with nsqd's errors (`E_PUB_FAILED PUB failed ...`, HTTP
//! 500) or acknowledged, and every acknowledged body is delivered: after the faults
//! stop, and (where the test restarts) after a restart.
//!
//! Needs the `fault-injection` feature (`cargo test --features fault-injection`, as
//! scripts/test.sh runs it): without it the broker cannot inject faults.
#![cfg(feature = "fault-injection")]
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn body(i: u64) -> Vec<u8> {
    format!("fault-{i:06}-{}", "z".repeat((i % 50) as usize)).into_bytes()
}

fn parse_body(b: &[u8]) -> u64 {
    let s = std::str::from_utf8(b).expect("utf-8 body");
    let i: u64 = s[6..12].parse().expect("body index");
    assert_eq!(body(i), b, "corrupt body");
    i
}

/// The data path of one test: kept across the broker's restarts, removed when the
/// test ends.
fn keep_dir(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("faults-{name}"))
}

/// One publisher that reconnects after nsqd's fatal `E_PUB_FAILED`.
struct Publisher<'a> {
    b: &'a Broker,
    conn: Option<TcpStream>,
}

impl<'a> Publisher<'a> {
    fn new(b: &'a Broker) -> Self {
        Publisher { b, conn: None }
    }

    /// PUB over TCP: `Ok` on `OK`, `Err(text)` on an error frame (the connection closes).
    fn publish(&mut self, topic: &str, body: &[u8]) -> Result<(), String> {
        let s = self.conn.get_or_insert_with(|| self.b.connect_v2());
        s.write_all(&pub_cmd(topic, body)).unwrap();
        match read_frame_skip_hb(s) {
            Ok((0, d)) if d == b"OK" => Ok(()),
            Ok((1, e)) => {
                let mut s = self.conn.take().unwrap();
                assert_closed(&mut s);
                Err(String::from_utf8_lossy(&e).into_owned())
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }
}

/// Subscribes and reads (FINishing) until nothing arrives for `quiet`.
fn drain(b: &Broker, topic: &str, quiet: Duration) -> Vec<u64> {
    let mut s = b.connect_v2();
    s.write_all(format!("SUB {topic} c\nRDY 1000\n").as_bytes())
        .unwrap();
    assert_eq!(read_frame_skip_hb(&mut s).unwrap(), (0, b"OK".to_vec()));
    read_messages(&mut s, quiet)
}

fn read_messages(s: &mut TcpStream, quiet: Duration) -> Vec<u64> {
    s.set_read_timeout(Some(quiet)).unwrap();
    let mut got = Vec::new();
    while let Ok((ft, d)) = read_frame_skip_hb(s) {
        assert_eq!(ft, 2, "{}", String::from_utf8_lossy(&d));
        let (_, _, id, msg) = parse_message(&d);
        got.push(parse_body(&msg));
        s.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
    }
    got
}

fn assert_all_delivered(acked: &[u64], got: &[u64]) {
    let got: BTreeSet<u64> = got.iter().copied().collect();
    let lost: Vec<u64> = acked.iter().filter(|i| !got.contains(i)).copied().collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
}

fn ping(b: &Broker) -> (u16, String) {
    let (code, body) = b.http("GET", "/ping", b"");
    (code, String::from_utf8_lossy(&body).into_owned())
}

fn faults(spec: &str) -> [(&str, &str); 1] {
    [("NSQD_STORAGE_FAULTS", spec)]
}

#[test]
fn eio_on_segment_writes_refuses_publishes_then_heals() {
    let dir = keep_dir("eio");
    // Writes 21..=50 of segment data fail (one write per publish with --sync-every=1).
    let env = faults("seed=1,write=eio@after:20,count:30");
    let b = Broker::start_in_env(&dir, 2, &["--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    let mut acked = Vec::new();
    for i in 0..20 {
        p.publish("t", &body(i)).expect("before the faults");
        acked.push(i);
    }
    let e = p.publish("t", &body(20)).expect_err("the 21st write fails");
    assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
    assert!(e.contains("Input/output error"), "{e}");
    let (code, text) = ping(&b);
    assert_eq!(code, 500);
    assert!(text.starts_with("NOK - "), "{text}");
    assert!(text.contains("Input/output error"), "{text}");
    // HTTP publishes are refused as nsqd refuses any failed put: 503 EXITING.
    let (code, text) = b.http("POST", "/pub?topic=t", &body(21));
    assert_eq!(
        (code, text.as_slice()),
        (503, &br#"{"message":"EXITING"}"#[..])
    );
    // Consumers are served what was stored before the faults.
    let mut cons = b.connect_v2();
    cons.write_all(b"SUB t c\nRDY 1000\n").unwrap();
    assert_eq!(read_frame_skip_hb(&mut cons).unwrap(), (0, b"OK".to_vec()));
    let mut got = read_messages(&mut cons, Duration::from_millis(800));
    assert!(got.len() >= 20, "{got:?}");
    // Publish until the faults run out: every publish is answered, OK or E_PUB_FAILED.
    let mut failed = 2;
    for i in 22..200 {
        match p.publish("t", &body(i)) {
            Ok(()) => acked.push(i),
            Err(e) => {
                assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
                failed += 1;
            }
        }
    }
    // At most one refusal per fault (a batch retried after a failure may take one too).
    assert!((2..=30).contains(&failed), "{failed}");
    assert_eq!(ping(&b), (200, "OK".to_string()));
    assert!(b.stats()["health"] == "OK");
    got.extend(read_messages(&mut cons, Duration::from_millis(1500)));
    assert_all_delivered(&acked, &got);
}

#[test]
fn short_writes_lose_no_acknowledged_message_across_a_restart() {
    let dir = keep_dir("short");
    // Every 3rd write from the 10th on writes half its bytes, then fails; 12 of them.
    let env = faults("seed=2,write=short@after:9,every:3,count:12");
    let mut b = Broker::start_in_env(&dir, 2, &["--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    let (mut acked, mut failed) = (Vec::new(), 0);
    for i in 0..120 {
        match p.publish("s", &body(i)) {
            Ok(()) => acked.push(i),
            Err(e) => {
                assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
                failed += 1;
            }
        }
    }
    assert!((1..=12).contains(&failed), "{failed}");
    assert_eq!(ping(&b), (200, "OK".to_string()));
    drop(p);
    // A crash now: on restart (no faults) the torn records are skipped and every
    // acknowledged body is read back intact.
    b.kill9();
    drop(b);
    let b = Broker::start_in(&dir, 2, &[]);
    let got = drain(&b, "s", Duration::from_millis(1500));
    assert_all_delivered(&acked, &got);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real short write, from the kernel: under a file size limit (RLIMIT_FSIZE,
/// `ulimit -f`) a write that crosses it writes what fits and returns that count, and the
/// next fails with EFBIG. glommio's stream writer counts the short write as complete, so
/// without a check of the file's length, records past the limit were reported flushed,
/// synced and acknowledged. Also, SIGXFSZ (sent with EFBIG) killed the broker, where
/// nsqd ignores it and fails the publish ("file too large"). Now: the broker lives, the
/// publishes it could not store get `E_MPUB_FAILED`, it goes on in a new segment (the
/// limit is per file), and after a restart without the limit every acknowledged body is
/// there.
#[test]
fn file_size_limit_short_writes_refuse_publishes_and_lose_nothing_acknowledged() {
    // 1 MiB + 100 KiB: not a multiple of the stream writer's buffers, so one write
    // crosses it (a multiple of 4 KiB, as direct I/O writes are).
    const LIMIT: u64 = (1024 + 100) * 1024;
    for shards in [1, 2] {
        let dir = keep_dir(&format!("fsize-{shards}"));
        let mut b = Broker::start_in_cmd(&dir, shards, &["--sync-every=1"], |cmd| {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
            unsafe {
                cmd.pre_exec(|| {
                    let lim = libc::rlimit {
                        rlim_cur: LIMIT,
                        rlim_max: LIMIT,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        });
        b.admin("/topic/create?topic=fsize");
        b.admin("/channel/create?topic=fsize&channel=c");
        let (mut acked, mut refused) = (Vec::new(), Vec::new());
        let mut conn: Option<TcpStream> = None;
        // 400 MPUBs of 100 bodies (about 10 KB each): about 4 MB, 3 limits crossed.
        for batch in 0..400u64 {
            let ids: Vec<u64> = (batch * 100..batch * 100 + 100).collect();
            let bodies: Vec<Vec<u8>> = ids.iter().map(|&i| body(i)).collect();
            let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
            let s = conn.get_or_insert_with(|| b.connect_v2());
            s.write_all(&mpub_cmd("fsize", &refs)).unwrap();
            match read_frame_skip_hb(s) {
                Ok((0, d)) if d == b"OK" => acked.extend(ids),
                Ok((1, e)) => {
                    let e = String::from_utf8_lossy(&e).into_owned();
                    assert!(e.starts_with("E_MPUB_FAILED MPUB failed "), "{e}");
                    // The system's text only (nsqd: "write <path>: file too large"), not
                    // glommio's ", op: Writing path: Some(..) with fd: Some(..)".
                    assert!(
                        !e.contains(", op: ") && !e.contains("IO error occurred"),
                        "{e}"
                    );
                    refused.push(e);
                    let mut s = conn.take().unwrap();
                    assert_closed(&mut s);
                }
                other => panic!("shards {shards}: unexpected reply {other:?}"),
            }
        }
        assert!(b.exited().is_none(), "shards {shards}: the broker died");
        assert!(
            !refused.is_empty()
                && refused
                    .iter()
                    .all(|e| e.contains("File too large") || e.contains("short write")),
            "shards {shards}: {refused:?}"
        );
        assert!(
            acked.len() > 30_000,
            "shards {shards}: it goes on in a new segment: {} acknowledged",
            acked.len()
        );
        eprintln!(
            "shards {shards}: {} acknowledged, {} MPUBs refused, e.g. {:?}",
            acked.len(),
            refused.len(),
            refused.first()
        );
        b.kill9();
        drop(b);
        let b = Broker::start_in(&dir, shards, &[]);
        let got = drain(&b, "fsize", Duration::from_millis(1500));
        assert_all_delivered(&acked, &got);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn slow_writes_and_syncs_slow_publishes_without_errors() {
    let dir = keep_dir("slow");
    let env = faults("seed=3,write=delay:300ms@every:5,sync=delay:200ms@every:4");
    let b = Broker::start_in_env(&dir, 2, &["--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    for i in 0..10 {
        p.publish("slow", &body(i)).unwrap();
    }
    // A consumer of stored messages keeps receiving while publishes are slow.
    let mut cons = b.connect_v2();
    cons.write_all(b"SUB slow c\nRDY 1000\n").unwrap();
    assert_eq!(read_frame_skip_hb(&mut cons).unwrap(), (0, b"OK".to_vec()));
    let mut got = read_messages(&mut cons, Duration::from_millis(500));
    assert_eq!(got.len(), 10);
    let start = Instant::now();
    let mut acked: Vec<u64> = (0..10).collect();
    for i in 10..40 {
        p.publish(if i % 2 == 0 { "slow" } else { "slow2" }, &body(i))
            .unwrap();
        acked.push(i);
    }
    // 30 publishes, about 6 slow writes and 7 slow syncs over the two topics.
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(ping(&b), (200, "OK".to_string()));
    got.extend(read_messages(&mut cons, Duration::from_millis(1500)));
    got.extend(drain(&b, "slow2", Duration::from_millis(1500)));
    assert_all_delivered(&acked, &got);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fsync_eio_acknowledges_only_synced_messages() {
    let dir = keep_dir("fsync");
    let env = faults("seed=4,sync=eio@after:10,count:5");
    let mut b = Broker::start_in_env(&dir, 2, &["--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    for i in 0..60 {
        match p.publish("f", &body(i)) {
            Ok(()) => acked.push(i),
            Err(e) => {
                assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
                assert!(e.contains("Input/output error"), "{e}");
                if failed.is_empty() {
                    let (code, text) = ping(&b);
                    assert_eq!(code, 500);
                    assert!(text.starts_with("NOK - sync "), "{text}");
                }
                failed.push(i);
            }
        }
    }
    // Five syncs fail; most are the publishes' own, but a sync the store makes besides
    // them (its health probe after a second with nothing to write, a checkpoint's) may
    // take one, so 1 to 5 publishes fail, one after another.
    assert!((1..=5).contains(&failed.len()), "{failed:?}");
    assert!(
        failed.windows(2).all(|w| w[1] == w[0] + 1),
        "failures are consecutive: {failed:?}"
    );
    assert_eq!(ping(&b), (200, "OK".to_string()));
    drop(p);
    // Nothing acknowledged may be lost, even by a crash right now.
    b.kill9();
    drop(b);
    let b = Broker::start_in(&dir, 2, &[]);
    let got = drain(&b, "f", Duration::from_millis(1500));
    assert_all_delivered(&acked, &got);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_fault_spec_stops_the_start() {
    let dir = keep_dir("badspec");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nsqd"))
        .arg(format!("--data-path={}", dir.display()))
        .arg("--tcp-address=127.0.0.1:0")
        .arg("--http-address=127.0.0.1:0")
        .env("NSQD_STORAGE_FAULTS", "write=explode")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NSQD_STORAGE_FAULTS: unknown action"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eio_with_default_sync_policy_loses_no_acknowledged_message() {
    let dir = keep_dir("eio-default");
    // Small memory queue: most records go to the store, whose writes 4..=8 fail.
    let env = faults("seed=5,write=eio@after:3,count:5");
    let b = Broker::start_in_env(
        &dir,
        2,
        &["--mem-queue-size=5", "--sync-timeout=50ms"],
        &env,
    );
    let mut p = Publisher::new(&b);
    let mut acked = Vec::new();
    for i in 0..300 {
        if p.publish("d", &body(i)).is_ok() {
            acked.push(i);
        }
        if i % 20 == 0 {
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    // The last writes, and their retries through the faults, reach the disk.
    std::thread::sleep(Duration::from_millis(500));
    let got = drain(&b, "d", Duration::from_millis(1500));
    assert_all_delivered(&acked, &got);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failed_sync_at_segment_rotation_is_not_acknowledged() {
    let dir = keep_dir("rotate");
    // The first sync of the store is the one that closes the first segment, in the middle
    // of this MPUB's batch (about 16 KB into 4 KB segments).
    let env = faults("seed=6,sync=eio@nth:1");
    let b = Broker::start_in_env(
        &dir,
        2,
        &["--sync-every=1", "--max-bytes-per-file=4096"],
        &env,
    );
    let bodies: Vec<Vec<u8>> = (0..160).map(|i| body(1000 + i)).collect();
    let refs: Vec<&[u8]> = bodies.iter().map(|b| b.as_slice()).collect();
    let mut s = b.connect_v2();
    s.write_all(&mpub_cmd("r", &refs)).unwrap();
    let (ft, d) = read_frame_skip_hb(&mut s).unwrap();
    let text = String::from_utf8_lossy(&d).into_owned();
    assert_eq!(ft, 1, "acknowledged although a sync failed: {text}");
    assert!(
        text.starts_with("E_MPUB_FAILED MPUB failed sync "),
        "{text}"
    );
    // Healthy again after the next sync; publishes are accepted.
    let mut p = Publisher::new(&b);
    p.publish("r", &body(1)).unwrap();
    assert_eq!(ping(&b), (200, "OK".to_string()));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failed_opens_reads_and_metadata_writes_lose_nothing_acknowledged() {
    let dir = keep_dir("open-read");
    // Segment opens 3 and 6 fail (creates at rotation, or a channel's reader), the first
    // 3 segment reads fail, and every 2nd metadata, index or checkpoint write fails.
    let env = faults("seed=8,open=eio@nth:3,open=enospc@nth:6,read=eio@count:3,meta=eio@every:2");
    let b = Broker::start_in_env(
        &dir,
        2,
        &[
            "--mem-queue-size=5",
            "--max-bytes-per-file=4096",
            "--sync-timeout=50ms",
        ],
        &env,
    );
    let mut p = Publisher::new(&b);
    let mut acked = Vec::new();
    for i in 0..300 {
        match p.publish("o", &body(i)) {
            Ok(()) => acked.push(i),
            Err(e) => assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}"),
        }
        if i % 25 == 0 {
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    assert!(acked.len() >= 290, "{}", acked.len());
    // The last writes, and their retries through the faults, reach the disk.
    std::thread::sleep(Duration::from_millis(300));
    // A channel created now reads everything back from disk (through the read faults).
    let got = drain(&b, "o", Duration::from_millis(2000));
    assert_all_delivered(&acked, &got);
    assert_eq!(ping(&b), (200, "OK".to_string()));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A disk whose reads keep failing: the channel's read-back is retried after a pause
/// that doubles (100 ms, 200 ms, ... 5 s), not at once in a loop (which would log tens
/// of thousands of error lines in seconds); `/ping` reports it meanwhile (not `OK`);
/// once reads work the backlog arrives and `/ping` is OK.
#[test]
fn failing_disk_reads_back_off_and_recover() {
    let dir = keep_dir("read-backoff");
    // 6 failed reads: retried after 100, 200, 400, 800, 1600 and 3200 ms, so 5 of them
    // fail within the first 3 s and the backlog arrives after about 6.3 s; in a loop
    // all 6 failed within milliseconds.
    let env = faults("seed=9,read=eio@count:6");
    let b = Broker::start_in_env(&dir, 1, &["--mem-queue-size=5", "--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    let acked: Vec<u64> = (0..100)
        .filter(|&i| p.publish("rb", &body(i)).is_ok())
        .collect();
    assert_eq!(acked.len(), 100);
    // The channel starts at the oldest message: all but the newest 5 are on disk only.
    let mut s = b.connect_v2();
    s.write_all(b"SUB rb c\nRDY 200\n").unwrap();
    // Several read retries (and their backoff) under the failing reads.
    std::thread::sleep(Duration::from_secs(3));
    let failed = |b: &Broker| {
        b.log_text()
            .lines()
            .filter(|l| l.contains("disk read failed"))
            .count()
    };
    let in_3s = failed(&b);
    assert!(
        (1..=5).contains(&in_3s),
        "{in_3s} failed reads logged in 3 s (the pauses allow 5)"
    );
    // A backlog that cannot be read back is a fault /ping reports while it lasts.
    let (code, text) = ping(&b);
    assert_eq!(code, 500, "{text}");
    assert!(
        text.starts_with("NOK - TOPIC(rb) CHANNEL(c): disk read failed - "),
        "{text}"
    );
    drop(s);
    let got = drain(&b, "rb", Duration::from_secs(20));
    assert_all_delivered(&acked, &got);
    assert_eq!(ping(&b), (200, "OK".to_string()));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A disk that keeps failing is logged at once and then at most about once a second
/// with a count (not thousands of identical sync errors a second on a full disk);
/// `/ping` reports it throughout.
#[test]
fn a_repeating_disk_error_is_logged_about_once_a_second() {
    let dir = keep_dir("lograte");
    let env = faults("seed=4,sync=enospc@after:1");
    let b = Broker::start_in_env(&dir, 1, &["--sync-every=1"], &env);
    let mut p = Publisher::new(&b);
    p.publish("t", &body(0)).expect("the first sync succeeds");
    let started = std::time::Instant::now();
    let mut refused = 0;
    for i in 1..=300 {
        if p.publish("t", &body(i)).is_err() {
            refused += 1;
        }
    }
    let secs = started.elapsed().as_secs();
    assert!(refused >= 290, "refused {refused} of 300");
    assert_eq!(ping(&b).0, 500);
    let logged = b
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("ERROR: STORE:") && l.contains("No space left on device"))
        .count();
    assert!(
        logged as u64 <= 2 + 2 * secs,
        "{logged} error lines for {refused} failed syncs in {secs} s"
    );
    assert!(logged >= 1, "the error is logged");
}

/// A shutdown while every write fails says how many messages it could not write (the
/// default policy acknowledged them before their write, so their loss must not go
/// without a word).
#[test]
fn a_shutdown_that_cannot_write_says_what_is_lost() {
    let dir = keep_dir("unwritten");
    let env = faults("seed=5,write=eio");
    let mut b = Broker::start_in_env(&dir, 1, &[], &env);
    b.tcp_pub("t", &body(1));
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));
    let lost: Vec<String> = b
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("were never written"))
        .cloned()
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(
        lost[0].contains(": 1 messages were never written"),
        "{lost:?}"
    );
}

/// A shard that panics (here an injected panic at its first segment write, standing for
/// a bug) ends the process with a failure status and a FATAL line, so that a supervisor
/// restarts it; what was acknowledged is on disk for the restart. Going on without that
/// shard would leave its clients hanging and `/ping` unanswered, and exiting 0 once
/// every shard had panicked is not restarted by `Restart=on-failure`.
#[test]
fn a_shard_panic_ends_the_process_with_a_failure_status() {
    for shards in [1, 2] {
        let dir = keep_dir(&format!("panic-{shards}"));
        let env = faults("write=panic@nth:1");
        let mut b = Broker::start_in_env(&dir, shards, &["--sync-every=1"], &env);
        let mut s = b.connect_v2();
        s.write_all(&pub_cmd("p", b"x")).unwrap();
        // Generous: the default panic hook symbolizes a backtrace first when
        // RUST_BACKTRACE is set, which takes long on a loaded machine.
        let status = b.daemon.wait_exit(Duration::from_secs(90));
        let log = b.final_log();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "{shards} shards: {status:?}\n{log}"
        );
        assert!(
            log.contains("FATAL: panic at ") && log.contains("injected Write panic; exiting"),
            "{log}"
        );
        drop(b);
        // The restart serves (the panic came before anything was acknowledged).
        let b = Broker::start_in(&dir, shards, &["--sync-every=1"]);
        let mut p = Publisher::new(&b);
        p.publish("p", &body(1)).unwrap();
        let got = drain(&b, "p", Duration::from_millis(500));
        assert_eq!(got, vec![1]);
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
