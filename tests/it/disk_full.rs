//! Disk errors: with the data path on a tiny ext4 filesystem (a loop-mounted image),
//! filling the disk makes publishes fail with nsqd's `E_PUB_FAILED` and /ping report
//! `NOK - <error>`; consumers keep working; freeing space heals both. Needs root and
//! loop devices (as on the CI machine); elsewhere it says so and passes without checking.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

struct Mount(PathBuf, PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

fn small_fs(name: &str) -> Option<Mount> {
    sized_fs(name, 8 << 20)
}

/// An ext4 filesystem of `bytes` on a loop-mounted image, or `None` where mounting is
/// not possible.
fn sized_fs(name: &str, bytes: u64) -> Option<Mount> {
    let base = std::env::temp_dir().join(format!("nsqd-diskfull-{name}-{}", std::process::id()));
    let img = base.with_extension("img");
    std::fs::create_dir_all(&base).ok()?;
    let f = std::fs::File::create(&img).ok()?;
    f.set_len(bytes).ok()?;
    let ok = Command::new("mkfs.ext4")
        .arg("-q")
        .arg(&img)
        .status()
        .ok()?
        .success()
        && Command::new("mount")
            .arg("-o")
            .arg("loop")
            .arg(&img)
            .arg(&base)
            .status()
            .ok()?
            .success();
    if !ok {
        let _ = std::fs::remove_file(&img);
        return None;
    }
    Some(Mount(base, img))
}

/// Fills the mounted filesystem with one file (returned) until a write fails.
fn fill(m: &Mount) -> PathBuf {
    let filler = m.0.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    filler
}

#[test]
fn full_disk_fails_publishes_marks_unhealthy_and_recovers() {
    let Some(m) = small_fs("pub") else {
        common::skip("cannot mount a loop filesystem here (needs root and loop devices)");
        return;
    };
    let data = m.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let b = Broker::start_in(&data, 1, &[]);
    b.http("POST", "/topic/create?topic=full", b"");
    b.http("POST", "/channel/create?topic=full&channel=c", b"");
    // A consumer subscribed before the disk fills keeps being served.
    let mut cons = b.connect_v2();
    cons.write_all(b"SUB full c\nRDY 10\n").unwrap();
    assert_eq!(read_frame_skip_hb(&mut cons).unwrap(), (0, b"OK".to_vec()));
    let mut p = b.connect_v2();
    p.write_all(&pub_cmd("full", b"before")).unwrap();
    assert_eq!(read_frame_skip_hb(&mut p).unwrap(), (0, b"OK".to_vec()));
    let (_, d) = read_frame_skip_hb(&mut cons).unwrap();
    assert_eq!(parse_message(&d).3, b"before");
    // Fill the filesystem.
    let filler = fill(&m);
    let mut failed = None;
    // (How many are taken first depends on what the filesystem still had: ext4 lets root
    // use its reserved blocks, and the filler's delayed allocation gives some back.)
    for _ in 0..2000 {
        let mut p = b.connect_v2();
        p.write_all(&pub_cmd("full", &vec![b'x'; 4000])).unwrap();
        match read_frame_skip_hb(&mut p) {
            Ok((1, e)) => {
                failed = Some(String::from_utf8_lossy(&e).to_string());
                assert_closed(&mut p);
                break;
            }
            Ok((0, ok)) => assert_eq!(ok, b"OK"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let e = failed.expect("a publish failed once the disk was full");
    assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!(code, 500);
    assert!(
        body.starts_with(b"NOK - "),
        "{}",
        String::from_utf8_lossy(&body)
    );
    // /stats gives the same health, unless the store's retry of the failed write got
    // through in between (ext4 can give the filler's delayed-allocation blocks back):
    // then both say OK.
    let health = b.stats()["health"].as_str().unwrap().to_string();
    if !health.starts_with("NOK - ") {
        assert_eq!(health, "OK");
        assert_eq!(
            b.http("GET", "/ping", b"").0,
            200,
            "/stats said OK, /ping not"
        );
    }
    // Consumers are still served (messages accepted before the disk filled).
    cons.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (ft, _) = read_frame_skip_hb(&mut cons).unwrap();
    assert_eq!(ft, 2);
    // Free space: publishing and health recover. ext4 hands the filler's blocks out
    // again only once the journal transaction that freed them commits (sync forces it;
    // otherwise within its 5 s commit interval), so a publisher retries a refused PUB
    // for a while, as clients do.
    std::fs::remove_file(&filler).unwrap();
    let _ = Command::new("sync").arg("-f").arg(&m.0).status();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let mut p = b.connect_v2();
        p.write_all(&pub_cmd("full", b"after")).unwrap();
        match read_frame_skip_hb(&mut p) {
            Ok((0, ok)) if ok == b"OK" => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "publishing did not recover after the space was freed: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = b.http("GET", "/ping", b"");
    assert_eq!((code, body.as_slice()), (200, &b"OK"[..]));
    drop(b);
}

/// With the default sync policy a publish is acknowledged before it is written: when the
/// disk fills under it, the store must keep those records and write them once there is
/// space (regression: a never-synced segment was deleted with its records, and the
/// stream writer's unflushed buffer was dropped, after the first ENOSPC).
#[test]
fn full_disk_with_default_sync_policy_loses_no_acknowledged_message() {
    let Some(m) = small_fs("default") else {
        common::skip("cannot mount a loop filesystem here (needs root and loop devices)");
        return;
    };
    let data = m.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let b = Broker::start_in(&data, 2, &["--mem-queue-size=5", "--sync-timeout=50ms"]);
    b.http("POST", "/topic/create?topic=full", b"");
    b.http("POST", "/channel/create?topic=full&channel=c", b"");
    // Leave about 1.5 MB free.
    let filler = m.0.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut n = 0;
        while n < 5_500_000 && f.write_all(&chunk).is_ok() {
            n += chunk.len();
        }
        let _ = f.sync_all();
    }
    let body = |i: u64| format!("full-{i:06}-{}", "z".repeat(3000)).into_bytes();
    let (mut acked, mut failed) = (Vec::new(), 0);
    let mut s = b.connect_v2();
    // 3,000 bodies of 3 KB: far more than the space left. Its writes (and so the first
    // ENOSPC) may trail the publishes, as on the blocking-thread segment I/O of a loaded
    // machine: then publishing goes on, paced, until the broker has noticed and refuses
    // one (30 s at most).
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0u64.. {
        if i >= 3000 {
            if failed > 0 || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        s.write_all(&pub_cmd("full", &body(i))).unwrap();
        match read_frame_skip_hb(&mut s) {
            Ok((0, ok)) if ok == b"OK" => acked.push(i),
            Ok((1, e)) => {
                let e = String::from_utf8_lossy(&e).into_owned();
                assert!(e.starts_with("E_PUB_FAILED PUB failed "), "{e}");
                failed += 1;
                s = b.connect_v2();
            }
            other => panic!("unexpected {other:?}"),
        }
        if failed > 20 {
            break;
        }
    }
    assert!(failed > 0, "the disk never filled");
    std::fs::remove_file(&filler).unwrap();
    // The held batches are written again once the space is back.
    std::thread::sleep(Duration::from_millis(500));
    let mut c = b.connect_v2();
    c.write_all(b"SUB full c\nRDY 1000\n").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut got = std::collections::BTreeSet::new();
    while let Ok((ft, d)) = read_frame_skip_hb(&mut c) {
        if ft != 2 {
            continue;
        }
        let (_, _, id, msg) = parse_message(&d);
        let i: u64 = std::str::from_utf8(&msg[5..11]).unwrap().parse().unwrap();
        assert_eq!(msg, body(i), "corrupt body");
        got.insert(i);
        c.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
    }
    let lost: Vec<_> = acked.iter().filter(|i| !got.contains(i)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged, lost {lost:?}",
        acked.len()
    );
    // Healthy again once a write succeeds (its store retries every --sync-timeout), as a
    // monitor polling /ping sees; on a loaded machine that can take a while.
    assert!(
        wait_until(Duration::from_secs(10), || b.http("GET", "/ping", b"").0
            == 200),
        "/ping after space was freed: {}",
        show(&b.http("GET", "/ping", b"").1)
    );
    drop(b);
}

/// A broker (re)started on a full disk starts and serves the backlog that filled it
/// (consumers are what frees the space), rather than refusing to start ("--data-path
/// ... is not writable: ... No space left on device"), which would leave a supervisor
/// only a crash loop.
#[test]
fn a_broker_started_on_a_full_disk_serves_its_backlog() {
    let Some(m) = small_fs("restart") else {
        common::skip("cannot mount a loop filesystem here (needs root and loop devices)");
        return;
    };
    let data = m.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut b = Broker::start_in(&data, 1, &["--sync-every=1"]);
    b.http("POST", "/topic/create?topic=full", b"");
    b.http("POST", "/channel/create?topic=full&channel=c", b"");
    b.tcp_pub("full", b"backlog");
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));
    // Fill the filesystem while the broker is down.
    fill(&m);
    // Top up with small files until not even a few bytes fit (ext4 delayed allocation).
    for i in 0..10_000 {
        if std::fs::write(m.0.join(format!("f{i}")), [1u8; 512]).is_err() {
            break;
        }
    }
    let probe = std::fs::write(m.0.join("probe"), b"nsqd preflight\n");
    assert!(probe.is_err(), "the filesystem is not full yet");
    let b = Broker::start_in(&data, 1, &["--sync-every=1"]);
    let mut c = b.subscribe("full", "c");
    send(&mut c, &line("RDY 1"));
    assert_eq!(read_msg(&mut c).body, b"backlog");
    drop(b);
}

/// A producer that retries every refused MPUB (as go-nsq and pynsq applications do)
/// against a disk that stays full: the broker keeps in memory every message it
/// acknowledged and could not write, and once that buffer (64 MiB) is full it refuses
/// new publishes with `E_MPUB_FAILED` instead of making room by dropping acknowledged
/// ones, however long the producer retries. After space is freed every acknowledged
/// message is delivered.
fn retrying_producer_loses_nothing_acknowledged(name: &str, shards: usize, policy: &[&str]) {
    let Some(m) = sized_fs(name, 256 << 20) else {
        common::skip("cannot mount a loop filesystem here (needs root and loop devices)");
        return;
    };
    let data = m.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut args = vec!["--mem-queue-size=5", "--sync-timeout=50ms"];
    args.extend_from_slice(policy);
    let b = Broker::start_in(&data, shards, &args);
    b.http("POST", "/topic/create?topic=retry", b"");
    b.http("POST", "/channel/create?topic=retry&channel=c", b"");
    // Fill the filesystem, then give back about 2 MB.
    let filler = fill(&m);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(2 << 20)).unwrap();
        f.sync_all().unwrap();
    }
    // Batches of 64 x 16 KiB; a refused batch is sent again until it is taken.
    let body = |k: u32, j: u32| {
        let mut v = format!("b{k:05}-{j:02}-").into_bytes();
        v.resize(16 * 1024, b'p');
        v
    };
    let mpub = |k: u32| {
        let bodies: Vec<Vec<u8>> = (0..64).map(|j| body(k, j)).collect();
        let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
        mpub_cmd("retry", &refs)
    };
    let (mut acked, mut refused, mut k) = (Vec::new(), 0u32, 0u32);
    let mut p = b.connect_v2();
    // 120 refusals: more than the 64 MiB the broker may hold back (1 MiB each).
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while refused < 120 {
        assert!(
            std::time::Instant::now() < deadline,
            "the disk never filled ({} acknowledged, {refused} refused)",
            acked.len()
        );
        p.write_all(&mpub(k)).unwrap();
        match read_frame_skip_hb(&mut p) {
            Ok((0, ok)) if ok == b"OK" => {
                acked.push(k);
                k += 1;
            }
            Ok((1, e)) => {
                let e = String::from_utf8_lossy(&e).into_owned();
                assert!(e.starts_with("E_MPUB_FAILED MPUB failed "), "{e}");
                refused += 1;
                p = b.connect_v2();
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    eprintln!(
        "{name}: {} batches of 64 acknowledged, {refused} refusals",
        acked.len()
    );
    assert!(
        !acked.is_empty(),
        "nothing was acknowledged before the disk filled"
    );
    let (code, _) = b.http("GET", "/ping", b"");
    assert_eq!(code, 500, "/ping while the disk is full");
    // Free the space; the held-back records are written and publishing heals.
    std::fs::remove_file(&filler).unwrap();
    let _ = Command::new("sync").arg("-f").arg(&m.0).status();
    let mut c = b.connect_v2();
    c.write_all(b"SUB retry c\nRDY 200\n").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let want: std::collections::BTreeSet<(u32, u32)> = acked
        .iter()
        .flat_map(|&k| (0..64).map(move |j| (k, j)))
        .collect();
    let mut got = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !want.is_subset(&got) && std::time::Instant::now() < deadline {
        let Ok((ft, d)) = read_frame_skip_hb(&mut c) else {
            break;
        };
        if ft != 2 {
            continue;
        }
        let (_, _, id, msg) = parse_message(&d);
        let k: u32 = std::str::from_utf8(&msg[1..6]).unwrap().parse().unwrap();
        let j: u32 = std::str::from_utf8(&msg[7..9]).unwrap().parse().unwrap();
        assert_eq!(msg, body(k, j), "corrupt body");
        got.insert((k, j));
        c.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
    }
    let lost: Vec<_> = want.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged messages, {} lost, first {:?}",
        want.len(),
        lost.len(),
        lost.first()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.http("GET", "/ping", b"").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "/ping never healed");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(b);
}

#[test]
fn a_retrying_producer_on_a_full_disk_loses_nothing_acknowledged() {
    retrying_producer_loses_nothing_acknowledged("retry-default", 2, &[]);
}

#[test]
fn a_retrying_producer_on_a_full_disk_loses_nothing_acknowledged_with_sync_every_1() {
    retrying_producer_loses_nothing_acknowledged("retry-sync", 1, &["--sync-every=1"]);
}
