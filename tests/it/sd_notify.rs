//! systemd's notify protocol (`Type=notify`, sd_notify(3)), as systemd sees it through
//! `NOTIFY_SOCKET`: nothing is sent while the shards recover a backlog; `READY=1` once
//! every shard has recovered and the listeners serve (so `systemctl start` returns when
//! the broker is really up: `/ping` answers at once and `/stats` shows the whole
//! backlog); `STOPPING=1` when SIGTERM starts the shutdown; nothing else. nsqlookupd's
//! READY=1 / STOPPING=1 are checked in lookupd/tests/sd_notify.rs.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// 100,000 messages of 200 bytes: about 25 MB of records, enough for recovery to take a
/// while in the debug build.
const BACKLOG: u64 = 100_000;

fn now_stamp() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    nsqd::timefmt::log_stamp(nanos)
}

/// The `YYYY/MM/DD HH:MM:SS.ffffff` stamp of a log line (fixed width, so its string
/// order is time order).
fn stamp_of(line: &str) -> &str {
    let rest = line.strip_prefix("[nsqd] ").unwrap_or(line);
    rest.get(..26).unwrap_or(rest)
}

fn fill(b: &Broker, topic: &str, n: u64) {
    let mut s = b.connect_v2();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = vec![b'x'; 200];
    let bodies: Vec<&[u8]> = (0..1000).map(|_| body.as_slice()).collect();
    let cmd = mpub_cmd(topic, &bodies);
    for _ in 0..n / 1000 {
        s.write_all(&cmd).unwrap();
        let (ft, d) = read_frame_skip_hb(&mut s).unwrap();
        assert_eq!((ft, d.as_slice()), (0, &b"OK"[..]));
    }
}

fn depth(http: SocketAddr, topic: &str) -> u64 {
    let (code, body) = split_http(&http_raw(http, "GET", "/stats?format=json", b""));
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["topics"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["topic_name"] == topic))
        .and_then(|t| t["depth"].as_u64())
        .unwrap_or(0)
}

#[test]
fn ready_after_recovery_and_stopping_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("nsqd-sd-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    {
        let mut b = Broker::start_in(&dir, 2, &[]);
        fill(&b, "backlog", BACKLOG);
        assert!(b.terminate().is_some_and(|st| st.success()));
    }

    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    // Ports picked before the start, as a unit file names them.
    let http = loopback(free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.arg(format!("--tcp-address={}", loopback(free_port())))
        .arg(format!("--http-address={http}"))
        .arg("--shards=2")
        .arg("--log-level=debug")
        .arg(format!("--data-path={}", dir.display()))
        .env("NOTIFY_SOCKET", &sock_path);
    let mut daemon = Daemon::spawn_cmd(cmd);
    let log = daemon.log.clone();
    let log_text = |log: &Arc<Mutex<Vec<String>>>| log.lock().unwrap().join("\n");

    // The first datagram, whenever it comes, must be READY=1.
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("a datagram within 60 s");
    let ready_at = now_stamp();
    let received = Instant::now();
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]).trim(),
        "READY=1",
        "{}",
        log_text(&log)
    );

    // Serving at once: the ports answer /ping and /stats shows the whole backlog.
    let lines_with = |needle: &str| -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<String> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect();
            if !found.is_empty() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let http_line = lines_with("HTTP: listening on ");
    let logged: SocketAddr = http_line[0]
        .split("HTTP: listening on ")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(logged, http);
    let (code, body) = split_http(&http_raw(http, "GET", "/ping", b""));
    assert_eq!((code, body.as_slice()), (200, &b"OK"[..]));
    assert!(
        received.elapsed() < Duration::from_secs(2),
        "/ping after READY=1 took {:?}",
        received.elapsed()
    );
    assert_eq!(depth(http, "backlog"), BACKLOG);

    // Sent after, not before, every shard recovered (log stamps and this clock are the
    // same wall clock; the log line is written before the datagram is sent).
    for shard in 0..2 {
        let rec = lines_with(&format!("shard {shard}: recovered"));
        assert!(!rec.is_empty(), "no recovery line: {}", log_text(&log));
        assert!(
            stamp_of(&rec[0]) <= ready_at.as_str(),
            "READY=1 (received {ready_at}) before {}",
            rec[0]
        );
    }
    let topic = lines_with("TOPIC(backlog): recovered");
    assert!(
        !topic.is_empty() && stamp_of(&topic[0]) <= ready_at.as_str(),
        "READY=1 at {ready_at} vs {topic:?}"
    );

    // SIGTERM: STOPPING=1, then a clean exit, and nothing more.
    daemon.signal(15);
    let n = sock.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STOPPING=1");
    let status = daemon
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no exit: {}", log_text(&log)));
    assert!(status.success(), "{status}: {}", log_text(&log));
    sock.set_nonblocking(true).unwrap();
    assert!(
        sock.recv(&mut buf).is_err(),
        "unexpected datagram {:?}",
        String::from_utf8_lossy(&buf)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
