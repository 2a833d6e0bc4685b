//! File descriptors: a cost per active topic, never per topic. The broker raises its
//! soft `RLIMIT_NOFILE` to the hard limit at start (as Go's runtime does for nsqd), an
//! idle topic holds no descriptor (so far more durable topics than descriptors are
//! served, and all of them load again after a restart), and a listener out of
//! descriptors closes the connections it cannot serve instead of leaving them hanging,
//! logging the repeating error with a count rather than a line per try.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// The first five ERROR or FATAL lines of the broker's log, for failure messages.
fn error_lines(b: &Broker) -> Vec<String> {
    b.log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("ERROR") || l.contains("FATAL"))
        .take(5)
        .cloned()
        .collect()
}

/// The tests of this file run one at a time: each holds its broker near its descriptor
/// limit, and timing matters to the last one.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the broker with `RLIMIT_NOFILE` set to (`soft`, `hard`) before it runs (each
/// start, restarts included).
fn start_limited(
    data_dir: &std::path::Path,
    shards: usize,
    soft: u64,
    hard: u64,
    extra: &[&str],
) -> Broker {
    Broker::start_in_cmd(data_dir, shards, extra, |cmd| {
        // The io_uring segment path, whatever the caller's NSQD_SEGMENT_IO: on the
        // blocking-thread path (FUSE and network filesystems) a store keeps its
        // descriptors for as long as it exists, by design (storage/src/store/
        // descriptors.rs), so a budget below one descriptor per topic cannot hold there.
        cmd.env_remove("NSQD_SEGMENT_IO");
        // SAFETY: setrlimit(2) only, between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                let rl = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    })
}

/// A fresh, empty data directory, removed when the test ends (passed or failed).
fn data_dir(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("fd-{name}"))
}

/// The soft `RLIMIT_NOFILE` of a running process, from /proc/PID/limits.
fn soft_nofile(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn count_lines(b: &Broker, what: &str) -> usize {
    b.log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(what))
        .count()
}

#[test]
fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
    let _serial = serial();
    let dir = data_dir("raise");
    let mut b = start_limited(&dir, 1, 256, 4096, &[]);
    b.remove_data = true;
    assert_eq!(soft_nofile(b.pid()), Some(4096), "the broker's soft limit");
    let raised = wait_until(Duration::from_secs(5), || {
        count_lines(&b, "RLIMIT_NOFILE) raised: 256 -> 4096") == 1
    });
    assert!(
        raised,
        "one log line for the raise: {:?}",
        b.log.lock().unwrap()
    );
}

/// 600 durable topics with a message each under a limit of 256 descriptors (soft and
/// hard: nothing to raise): every publish answers 200, `/ping` OK, and after a restart
/// at once (SIGTERM, then a new process as soon as the old one is gone, as supervisors
/// do) every topic is back with its message and `/ping` is OK.
#[test]
fn far_more_durable_topics_than_descriptors() {
    let _serial = serial();
    const TOPICS: usize = 600;
    const LIMIT: u64 = 256;
    for_each_shards(&[1, 2], |shards| {
        let ctx = format!("shards={shards}");
        let dir = data_dir(&format!("topics{shards}"));
        let mut b = start_limited(&dir, shards, LIMIT, LIMIT, &[]);
        for i in 0..TOPICS {
            let (code, body) = b.http("POST", &format!("/pub?topic=fd{i}"), b"m");
            // (At the first failure: after it, each request may wait for its timeout.)
            assert_eq!(
                (code, show(&body)),
                (200, "OK".into()),
                "{ctx}: publish to topic {i} of {TOPICS}; log: {:?}",
                error_lines(&b)
            );
        }
        let (code, body) = b.http("GET", "/ping", b"");
        assert_eq!((code, show(&body)), (200, "OK".into()), "{ctx}: /ping");
        let fds = fd_count(b.pid());
        eprintln!("{ctx}: {TOPICS} topics published, {fds} descriptors open");
        assert_eq!(
            b.terminate().and_then(|s| s.code()),
            Some(0),
            "{ctx}: SIGTERM exit status"
        );
        let mut b = start_limited(&dir, shards, LIMIT, LIMIT, &[]);
        b.remove_data = true;
        let st = b.stats();
        let topics = st["topics"].as_array().cloned().unwrap_or_default();
        let with_message = topics
            .iter()
            .filter(|t| t["depth"].as_i64() == Some(1))
            .count();
        assert_eq!(
            (topics.len(), with_message),
            (TOPICS, TOPICS),
            "{ctx}: topics and topics with their message after the restart; log: {:?}",
            error_lines(&b)
        );
        let (code, body) = b.http("GET", "/ping", b"");
        assert_eq!(
            (code, show(&body)),
            (200, "OK".into()),
            "{ctx}: /ping after the restart"
        );
        assert_eq!(count_lines(&b, "accept error"), 0, "{ctx}: accept errors");
    });
}

/// Out of descriptors, a new connection is closed at once (its client reads EOF) instead
/// of waiting unserved in the backlog, the accept error is logged at most about once a
/// second (with a count), and once descriptors are free again new connections are
/// served.
#[test]
fn a_listener_out_of_descriptors_closes_new_connections() {
    let _serial = serial();
    let dir = data_dir("accept");
    let mut b = start_limited(&dir, 1, 128, 128, &[]);
    b.remove_data = true;
    // V2 connections until one is closed by the broker (not served, not left hanging).
    // (Quickly: an idle client is dropped after a while, which frees its descriptor.)
    let mut conns = Vec::new();
    let started = Instant::now();
    let closed = loop {
        let mut s = TcpStream::connect(b.tcp).expect("connect (kernel backlog)");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = s.write_all(b"  V2");
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            // Served (waiting for a command): keep it, holding a descriptor.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                conns.push(s)
            }
            Ok(0) => break true,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            r => panic!("unexpected read on a new connection: {r:?}"),
        }
        if conns.len() > 150 {
            break false;
        }
    };
    assert!(
        closed,
        "no connection was closed out of descriptors ({} open, {:?})",
        conns.len(),
        started.elapsed()
    );
    // More tries for 2 s: each is closed, and the log does not grow by a line per try.
    let before = count_lines(&b, "accept error");
    let t0 = Instant::now();
    let mut tries = 0;
    while t0.elapsed() < Duration::from_secs(2) {
        let mut s = TcpStream::connect(b.tcp).expect("connect (kernel backlog)");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        let r = s.read(&mut buf);
        assert!(
            matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() == ErrorKind::ConnectionReset),
            "try {tries} out of descriptors: {r:?}"
        );
        tries += 1;
    }
    // Let the once-a-second line with the count come out.
    std::thread::sleep(Duration::from_millis(1100));
    let mut s = TcpStream::connect(b.tcp).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.read(&mut [0u8; 16]);
    let lines = count_lines(&b, "accept error") - before;
    eprintln!("{tries} connections closed out of descriptors in 2 s, {lines} log lines");
    assert!(tries > 10, "only {tries} tries in 2 s");
    assert!(
        lines <= 5,
        "{lines} accept-error lines for {tries} tries in about 3 s"
    );
    assert!(
        count_lines(&b, "times more in the last second") >= 1,
        "no line with the count of repeats: {:?}",
        common::hostile::log_tail(&b)
    );
    // Descriptors free again (once the broker has seen the clients go): new connections
    // are served.
    conns.truncate(conns.len() / 2);
    let served = wait_until(Duration::from_secs(5), || {
        let Ok(mut s) = TcpStream::connect(b.tcp) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut req = b"  V2".to_vec();
        req.extend(pub_cmd("after", b"x"));
        s.write_all(&req).is_ok() && matches!(read_frame_skip_hb(&mut s), Ok((0, d)) if d == b"OK")
    });
    assert!(served, "no PUB OK once descriptors were free");
    assert_eq!(b.terminate().and_then(|s| s.code()), Some(0));
}
