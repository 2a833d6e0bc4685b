//! Moving from nsqd (src/import_nsqd.rs): the broker starts on a `--data-path` an
//! upstream nsqd left behind and serves what nsqd had queued there, exactly once. The
//! nsqd files are written here byte for byte (nsqd.dat; go-diskqueue data files and
//! meta.dat; nsqd's message layout `[ts i64][attempts u16][id 16 hex][body]`), never by a
//! Go toolchain.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One message as nsqd stores it in a diskqueue.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct M {
    ts: i64,
    attempts: u16,
    id: String,
    body: Vec<u8>,
}

fn m(i: u64, attempts: u16, body: &str) -> M {
    M {
        ts: 1_764_000_000_000_000_000 + i as i64 * 1_000_003,
        attempts,
        // nsqd's guid layout rendered as 16 lowercase hex characters.
        id: format!("{:016x}", 0x1ad5_e4a1_c8c0_0000u64 + i),
        body: body.as_bytes().to_vec(),
    }
}

/// A diskqueue record: `[int32 size][ts][attempts][id][body]`.
fn record(m: &M) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&((26 + m.body.len()) as i32).to_be_bytes());
    r.extend_from_slice(&m.ts.to_be_bytes());
    r.extend_from_slice(&m.attempts.to_be_bytes());
    r.extend_from_slice(m.id.as_bytes());
    r.extend_from_slice(&m.body);
    r
}

fn records(ms: &[M]) -> Vec<u8> {
    ms.iter().flat_map(record).collect()
}

fn write(dp: &Path, name: &str, data: &[u8]) {
    std::fs::write(dp.join(name), data).unwrap();
}

/// go-diskqueue's meta.dat: `depth\nreadFileNum,readPos\nwriteFileNum,writePos\n`.
fn write_meta(dp: &Path, queue: &str, depth: i64, read: (u64, u64), wr: (u64, u64)) {
    let text = format!("{depth}\n{},{}\n{},{}\n", read.0, read.1, wr.0, wr.1);
    write(dp, &format!("{queue}.diskqueue.meta.dat"), text.as_bytes());
}

fn qfile(queue: &str, n: u64) -> String {
    format!("{queue}.diskqueue.{n:06}.dat")
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nsqd-import-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What each channel must receive.
struct Expect {
    /// orders' topic backlog: every channel of orders gets these.
    topic: Vec<M>,
    /// orders/c1's own backlog.
    c1_own: Vec<M>,
    /// frozen's topic backlog (topic paused).
    frozen: Vec<M>,
}

/// nsqd's data path: topic `orders` (channels c1 and paused c2) with a topic backlog over
/// two files, two already consumed (readPos > 0); c1 with its own backlog (attempts > 1)
/// in file 3 after one consumed record (readFileNum > 0, readPos > 0); paused topic
/// `frozen` with a backlog and channel `audit`.
fn write_nsqd_data(dp: &Path) -> Expect {
    write(
        dp,
        "nsqd.dat",
        br#"{"topics":[{"channels":[{"name":"c1","paused":false},{"name":"c2","paused":true}],"name":"orders","paused":false},{"channels":[{"name":"audit","paused":false}],"name":"frozen","paused":true}],"version":"1.3.0"}"#,
    );
    let all: Vec<M> = (0..8).map(|i| m(i, 0, &format!("order-{i}"))).collect();
    let (f0, f1) = all.split_at(5);
    write(dp, &qfile("orders", 0), &records(f0));
    write(dp, &qfile("orders", 1), &records(f1));
    let consumed = records(&all[..2]).len() as u64;
    write_meta(
        dp,
        "orders",
        6,
        (0, consumed),
        (1, records(f1).len() as u64),
    );

    let c1_done = m(100, 1, "c1-finished-long-ago");
    let c1_own = vec![m(101, 1, "c1-own-a"), m(102, 3, "c1-own-b")];
    let mut f3 = record(&c1_done);
    f3.extend(records(&c1_own));
    write(dp, &qfile("orders:c1", 3), &f3);
    let skip = record(&c1_done).len() as u64;
    write_meta(dp, "orders:c1", 2, (3, skip), (3, f3.len() as u64));
    // c2 has an empty channel queue (all read).
    write(dp, &qfile("orders:c2", 0), b"");
    write_meta(dp, "orders:c2", 0, (0, 0), (0, 0));

    let frozen: Vec<M> = (200..202)
        .map(|i| m(i, 0, &format!("frozen-{i}")))
        .collect();
    write(dp, &qfile("frozen", 0), &records(&frozen));
    write_meta(dp, "frozen", 2, (0, 0), (0, records(&frozen).len() as u64));
    Expect {
        topic: all[2..].to_vec(),
        c1_own,
        frozen,
    }
}

/// Receives exactly `n` messages (RDY n, each FINished), then checks nothing more comes.
fn receive(s: &mut TcpStream, n: usize) -> Vec<M> {
    send(s, &line(&format!("RDY {}", n + 5)));
    let mut out = Vec::new();
    for _ in 0..n {
        let msg = read_msg(s);
        send(s, &line(&format!("FIN {}", msg.id)));
        out.push(M {
            ts: msg.ts,
            attempts: msg.attempts,
            id: msg.id,
            body: msg.body,
        });
    }
    assert_no_frame(s, Duration::from_millis(300));
    out.sort();
    out
}

/// What a channel sees: each message delivered once more than nsqd had delivered it.
fn delivered(ms: &[M]) -> Vec<M> {
    let mut v: Vec<M> = ms
        .iter()
        .map(|m| M {
            attempts: m.attempts + 1,
            ..m.clone()
        })
        .collect();
    v.sort();
    v
}

fn import_and_serve(shards: usize) {
    let dp = fresh_dir(&format!("serve-{shards}"));
    let want = write_nsqd_data(&dp);
    let mut b = Broker::start_in(&dp, shards, &[]);

    // Paused flags from nsqd.dat.
    let t = b.topic_stats("frozen").expect("frozen imported");
    assert_eq!(t["paused"], true, "{t}");
    assert_eq!(b.topic_stats("orders").unwrap()["paused"], false);
    assert_eq!(b.channel_stats("orders", "c2").unwrap()["paused"], true);
    assert_eq!(b.channel_stats("orders", "c1").unwrap()["paused"], false);
    assert_eq!(t["depth"], 2, "{t}");

    let mut c1 = b.subscribe("orders", "c1");
    let mut c1_want = want.topic.clone();
    c1_want.extend(want.c1_own.clone());
    assert_eq!(receive(&mut c1, 8), delivered(&c1_want), "orders/c1");

    // c2 is paused: nothing until it is unpaused; then only the topic backlog.
    let mut c2 = b.subscribe("orders", "c2");
    send(&mut c2, &line("RDY 20"));
    assert_no_frame(&mut c2, Duration::from_millis(300));
    b.admin("/channel/unpause?topic=orders&channel=c2");
    assert_eq!(receive(&mut c2, 6), delivered(&want.topic), "orders/c2");

    // frozen is paused: its backlog waits in the topic until it is unpaused.
    let mut audit = b.subscribe("frozen", "audit");
    send(&mut audit, &line("RDY 20"));
    assert_no_frame(&mut audit, Duration::from_millis(300));
    b.admin("/topic/unpause?topic=frozen");
    assert_eq!(
        receive(&mut audit, 2),
        delivered(&want.frozen),
        "frozen/audit"
    );
    drop((c1, c2, audit));
    b.terminate();

    // The old files were renamed, and a marker written.
    assert!(dp.join(".nsqd-import-done").exists());
    assert!(dp.join("nsqd.dat.imported").exists());
    assert!(!dp.join("nsqd.dat").exists());
    for f in [
        qfile("orders", 0),
        qfile("orders", 1),
        "orders.diskqueue.meta.dat".into(),
        qfile("orders:c1", 3),
        qfile("frozen", 0),
    ] {
        assert!(dp.join(format!("{f}.imported")).exists(), "{f}.imported");
        assert!(!dp.join(&f).exists(), "{f} renamed");
    }
    let _ = std::fs::remove_dir_all(&dp);
}

#[test]
fn imports_and_serves_on_1_shard() {
    import_and_serve(1);
}

#[test]
fn imports_and_serves_on_2_shards() {
    import_and_serve(2);
}

#[test]
fn imports_and_serves_on_4_shards() {
    import_and_serve(4);
}

/// A second start imports nothing again, even when nsqd's files come back (an operator
/// restoring them): the marker decides.
#[test]
fn second_start_imports_nothing() {
    let dp = fresh_dir("twice");
    let want = write_nsqd_data(&dp);
    let mut b = Broker::start_in(&dp, 2, &[]);
    b.wait_topic_field("frozen", "depth", 2);
    let mut c1 = b.subscribe("orders", "c1");
    assert_eq!(receive(&mut c1, 8).len(), 8);
    drop(c1);
    b.terminate();
    // Put every nsqd file back as it was.
    for e in std::fs::read_dir(&dp).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if let Some(orig) = name.strip_suffix(".imported") {
            std::fs::copy(&p, dp.join(orig)).unwrap();
        }
    }
    let mut b = Broker::start_in(&dp, 2, &[]);
    // frozen still has its two messages, not four; c1 has nothing more.
    b.wait_topic_field("frozen", "depth", 2);
    let mut c1 = b.subscribe("orders", "c1");
    send(&mut c1, &line("RDY 20"));
    assert_no_frame(&mut c1, Duration::from_millis(500));
    b.admin("/topic/unpause?topic=frozen");
    let mut audit = b.subscribe("frozen", "audit");
    assert_eq!(receive(&mut audit, 2), delivered(&want.frozen));
    b.wait_log_line("not imported again", Duration::from_secs(10));
    let log = b.log.lock().unwrap().join("\n");
    assert!(
        log.contains("not imported again"),
        "the restored nsqd.dat is reported: {log}"
    );
    b.terminate();
    let _ = std::fs::remove_dir_all(&dp);
}

/// Damage in a diskqueue file (nsqd: diskqueue readOne): a length outside
/// 26..=max-msg-size+26 ends that file, a record cut short too; reading goes on with the
/// next file, and everything is logged.
#[test]
fn corrupt_records_skip_to_the_next_file() {
    let dp = fresh_dir("corrupt");
    write(
        &dp,
        "nsqd.dat",
        br#"{"topics":[{"channels":[{"name":"c","paused":false}],"name":"broken","paused":false}],"version":"1.3.0"}"#,
    );
    let good: Vec<M> = (0..4)
        .map(|i| m(300 + i, 0, &format!("good-{i}")))
        .collect();
    let mut f0 = record(&good[0]);
    f0.extend_from_slice(&5i32.to_be_bytes()); // too short to be a message
    f0.extend(record(&m(390, 0, "lost-after-bad-length")));
    let mut f1 = record(&good[1]);
    f1.extend_from_slice(&(1i32 << 30).to_be_bytes()); // above --max-msg-size + 26
    f1.extend(record(&m(391, 0, "lost-after-huge-length")));
    let mut f2 = record(&good[2]);
    let cut = record(&m(392, 0, "cut-short"));
    f2.extend_from_slice(&cut[..cut.len() - 3]);
    let f3 = record(&good[3]);
    for (i, f) in [&f0, &f1, &f2, &f3].into_iter().enumerate() {
        write(&dp, &qfile("broken", i as u64), f);
    }
    write_meta(&dp, "broken", 7, (0, 0), (3, f3.len() as u64));
    let mut b = Broker::start_in(&dp, 2, &[]);
    let mut c = b.subscribe("broken", "c");
    assert_eq!(receive(&mut c, 4), delivered(&good));
    let log = b.log.lock().unwrap().join("\n");
    assert!(log.contains("invalid message read size (5)"), "{log}");
    assert!(
        log.contains("invalid message read size (1073741824)"),
        "{log}"
    );
    assert!(log.contains("truncated record"), "{log}");
    b.terminate();
    let _ = std::fs::remove_dir_all(&dp);
}
