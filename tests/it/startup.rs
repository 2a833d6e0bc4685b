//! Start-up after a crash, as a supervisor and an impatient client see it:
//! - nothing is served before every shard has recovered its topics (nsqd loads its
//!   metadata before it serves): a SUB, a `/stats` and a `/pub` sent the moment the ports
//!   answer, while a large backlog is still being read back, must see the whole backlog,
//!   and the early subscriber must not be orphaned;
//! - an immediate restart after `kill -9` on the same ports works (the dead process's
//!   sockets can stay bound for a few milliseconds while the kernel tears down its
//!   io_uring instances).
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use crate::common;

use common::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Messages in the backlog: about 150 MB of records in one unsealed segment, which the
/// debug build reads back in over a second when the whole segment must be scanned: the
/// test removes the segment's partial index (`.pidx`) after the kill -9, as if the crash
/// came before the first one was written.
const BACKLOG: u64 = 600_000;
const BODY: usize = 200;

fn data_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nsqd-startup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One `GET /ping`: the status and body, or `None` if the exchange failed.
fn try_ping(addr: std::net::SocketAddr) -> Option<(u16, Vec<u8>)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(
        format!("GET /ping HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let (code, body) = split_http(&out);
    (code != 0).then_some((code, body))
}

/// Polls `/ping` until it answers 200 OK.
fn wait_ping(b: &mut Broker, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = b.exited() {
            panic!("nsqd exited with {st}: {}", b.log_text());
        }
        // A connect can still reach the killed process's listener for a few ms (the
        // kernel tears its io_uring down after the exit) and then be refused or reset:
        // any failed exchange is retried, as a health check would.
        if let Some((code, body)) = try_ping(b.http) {
            if code == 200 {
                assert_eq!(body, b"OK");
                return;
            }
        }
        assert!(Instant::now() < deadline, "no /ping: {}", b.log_text());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Publishes `n` messages of `BODY` bytes to `topic` with MPUB, 1,000 at a time,
/// pipelined.
fn fill(b: &Broker, topic: &str, n: u64) {
    let mut s = b.connect_v2();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = vec![b'x'; BODY];
    let bodies: Vec<&[u8]> = (0..1000).map(|_| body.as_slice()).collect();
    let cmd = mpub_cmd(topic, &bodies);
    let batches = n / 1000;
    let mut sent = 0;
    let mut acked = 0;
    while acked < batches {
        while sent < batches && sent - acked < 8 {
            s.write_all(&cmd).unwrap();
            sent += 1;
        }
        let (ft, d) = read_frame_skip_hb(&mut s).unwrap();
        assert_eq!((ft, d.as_slice()), (0, &b"OK"[..]));
        acked += 1;
    }
}

/// Reads one whole HTTP/1.1 response (Connection: close) from `s`.
fn read_response(mut s: std::net::TcpStream) -> (u16, Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    split_http(&out)
}

/// Connects (waiting for the port to answer) and writes the request; an error when the
/// connection is reset under the write (a killed process's listener taking it for a
/// moment).
fn send_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<std::net::TcpStream> {
    let mut s = wait_port_answers(addr, Duration::from_secs(60));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    Ok(s)
}

/// `depth + in_flight_count` of channel `big`/`c` and its client count, from /stats JSON.
fn channel_backlog(stats: &serde_json::Value) -> Option<(u64, u64)> {
    let topics = stats["topics"].as_array()?;
    let t = topics.iter().find(|t| t["topic_name"] == "big")?;
    let c = t["channels"]
        .as_array()?
        .iter()
        .find(|c| c["channel_name"] == "c")?;
    let backlog = c["depth"].as_u64()? + c["in_flight_count"].as_u64()?;
    let clients = c["clients"].as_array().map(|a| a.len() as u64).unwrap_or(0);
    Some((backlog, clients))
}

fn serves_nothing_before_recovery(shards: usize) {
    let dir = data_dir(&format!("window-{shards}"));
    let (tcp, http) = (free_port(), free_port());
    // --sync-timeout=1h: no periodic checkpoint, so the kill -9 below leaves the whole
    // backlog to be scanned at the next start.
    let flags = ["--sync-timeout=1h", "--max-bytes-per-file=1073741824"];
    // 1. The channel exists in the metadata (a clean shutdown writes it).
    let mut b = Broker::spawn_on(&dir, shards, tcp, http, &flags);
    wait_ping(&mut b, Duration::from_secs(60));
    b.admin("/topic/create?topic=big");
    b.admin("/channel/create?topic=big&channel=c");
    assert_eq!(b.terminate().map(|s| s.success()), Some(true));
    // 2. A large backlog (every MPUB synced before its OK), then a crash.
    let mut b = Broker::spawn_on(
        &dir,
        shards,
        tcp,
        http,
        &[flags[0], flags[1], "--sync-every=1"],
    );
    wait_ping(&mut b, Duration::from_secs(60));
    fill(&b, "big", BACKLOG);
    b.kill9();
    // Without its partial index the open segment is scanned whole: a long window.
    for e in std::fs::read_dir(dir.join("topics/t-big"))
        .unwrap()
        .flatten()
    {
        if e.file_name().to_string_lossy().ends_with(".pidx") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    // 3. Restart at once; the moment the ports answer, subscribe, and send /stats and
    //    /pub: all of them land while the backlog is being read back. (The killed
    //    process's listener can still take a connection for a few milliseconds and then
    //    reset it; like a real client, each of them then connects again.)
    let mut b = Broker::spawn_on(&dir, shards, tcp, http, &flags);
    let t0 = Instant::now();
    let (tcp_addr, http_addr) = (b.tcp, b.http);
    let sub_thread = std::thread::spawn(move || loop {
        let mut s = wait_port_answers(tcp_addr, Duration::from_secs(60));
        let connected = t0.elapsed();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        if s.write_all(b"  V2SUB big c\nRDY 100\n").is_err() {
            continue;
        }
        match read_frame_skip_hb(&mut s) {
            Ok((ft, d)) => {
                assert_eq!((ft, d.as_slice()), (0, &b"OK"[..]), "SUB answer");
                return (s, connected, t0.elapsed());
            }
            Err(_) => continue,
        }
    });
    let request = move |method: &'static str, path: &'static str, body: &'static [u8]| {
        std::thread::spawn(move || loop {
            let Ok(s) = send_request(http_addr, method, path, body) else {
                continue;
            };
            let connected = t0.elapsed();
            let (code, body) = read_response(s);
            if code != 0 {
                return (code, body, connected);
            }
        })
    };
    let stats_thread = request("GET", "/stats?format=json&include_clients=true", b"");
    let pub_thread = request("POST", "/pub?topic=big", b"late");
    let (mut sub, sub_connected, sub_answered) = sub_thread.join().unwrap();
    let (code, body, stats_connected) = stats_thread.join().unwrap();
    assert_eq!(code, 200, "/stats: {}", String::from_utf8_lossy(&body));
    let stats: serde_json::Value = serde_json::from_slice(&body).expect("stats json");
    let (backlog, _) = channel_backlog(&stats)
        .unwrap_or_else(|| panic!("/stats in the window lacks big/c: {stats}"));
    assert!(
        backlog == BACKLOG || backlog == BACKLOG + 1,
        "/stats sent while recovering showed {backlog} of {BACKLOG} messages"
    );
    let (code, body, pub_connected) = pub_thread.join().unwrap();
    assert_eq!(
        (code, body.as_slice()),
        (200, &b"OK"[..]),
        "/pub in the window"
    );
    // The early subscriber is served from the recovered backlog.
    for _ in 0..100 {
        let m = read_msg(&mut sub);
        assert_eq!(m.body.len(), BODY);
    }
    let (backlog, clients) = channel_backlog(&b.stats()).expect("big/c after recovery");
    assert_eq!(
        backlog,
        BACKLOG + 1,
        "backlog plus the /pub sent in the window"
    );
    assert_eq!(
        clients, 1,
        "the subscriber that came in the window is a client"
    );
    eprintln!(
        "shards {shards}: connected SUB {sub_connected:?}, /stats {stats_connected:?}, \
         /pub {pub_connected:?} after exec; SUB answered {sub_answered:?}; {}",
        b.log_text()
            .lines()
            .find(|l| l.contains("TOPIC(big): recovered"))
            .unwrap_or("")
    );
    b.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serves_nothing_before_recovery_1_shard() {
    serves_nothing_before_recovery(1);
}

#[test]
fn serves_nothing_before_recovery_2_shards() {
    serves_nothing_before_recovery(2);
}

#[test]
fn serves_nothing_before_recovery_4_shards() {
    serves_nothing_before_recovery(4);
}

/// A supervisor restarts the broker the instant it died (kill -9), on the same ports
/// and data path, five times in a row, with clients connected and messages in flight.
#[test]
fn immediate_restart_after_kill9() {
    let dir = data_dir("restart");
    let (tcp, http) = (free_port(), free_port());
    let mut b = Broker::spawn_on(&dir, 2, tcp, http, &["--sync-every=1"]);
    wait_ping(&mut b, Duration::from_secs(60));
    let mut published = 0u64;
    for round in 0..5 {
        // Connections in every state: a subscriber with messages in flight, a producer,
        // an idle HTTP keep-alive client.
        let mut sub = b.subscribe("restart", "c");
        sub.write_all(b"RDY 10\n").unwrap();
        let mut p = b.connect_v2();
        for _ in 0..20 {
            p.write_all(&pub_cmd("restart", b"m")).unwrap();
            expect_ok(&mut p);
            published += 1;
        }
        let _ = read_msg(&mut sub);
        let idle = std::net::TcpStream::connect(b.http).unwrap();
        // As a supervisor does: SIGKILL, then start the new process at once, before the
        // old one has finished exiting (its data-path lock and sockets are still held).
        let _ = std::process::Command::new("kill")
            .args(["-9", &b.pid().to_string()])
            .status();
        let mut old = b;
        b = Broker::spawn_on(&dir, 2, tcp, http, &["--sync-every=1"]);
        let _ = old.daemon.child.wait();
        drop((sub, p, idle, old));
        wait_ping(&mut b, Duration::from_secs(60));
        assert!(
            b.exited().is_none(),
            "round {round}: restart failed: {}",
            b.log_text()
        );
    }
    // Every acknowledged message is still there: in channel c, or in the topic when the
    // crash came before a checkpoint recorded the channel.
    let st = b.topic_stats("restart").expect("topic restart");
    let in_channels: u64 = st["channels"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["depth"].as_u64()).sum())
        .unwrap_or(0);
    assert!(
        st["depth"].as_u64().unwrap_or(0) + in_channels >= published,
        "{published} published, left: {st}"
    );
    b.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}

/// nsqd persists its metadata whenever a topic or channel is created: one that was
/// created a moment before a kill -9 is still there after the restart, with messages
/// published to it after its creation in the channel, not left in the topic.
#[test]
fn channel_created_just_before_kill9_survives() {
    for_each_shards(&SHARD_COUNTS, |shards| {
        let dir = data_dir(&format!("meta-{shards}"));
        let (tcp, http) = (free_port(), free_port());
        let flags = ["--sync-every=1", "--sync-timeout=1h"];
        let mut b = Broker::spawn_on(&dir, shards, tcp, http, &flags);
        wait_ping(&mut b, Duration::from_secs(60));
        b.admin("/topic/create?topic=fresh");
        b.admin("/channel/create?topic=fresh&channel=c1");
        let _sub = b.subscribe("fresh", "c2");
        // Time for the metadata write each creation starts; no checkpoint comes (1 h).
        std::thread::sleep(Duration::from_millis(300));
        b.tcp_pub("fresh", b"after");
        b.kill9();
        let mut b = Broker::spawn_on(&dir, shards, tcp, http, &flags);
        wait_ping(&mut b, Duration::from_secs(60));
        for ch in ["c1", "c2"] {
            let c = b
                .channel_stats("fresh", ch)
                .unwrap_or_else(|| panic!("shards {shards}: channel {ch} lost: {}", b.log_text()));
            assert_eq!(c["depth"], 1, "shards {shards}: {ch}: {c}");
        }
        b.kill9();
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A start that fails on a taken address never accepted a connection on another one:
/// the broker binds every address (retrying a taken one for 2 s, for a previous instance
/// still releasing it) before it listens on any. Before, its TCP port accepted during the
/// HTTP port's retry, and its exit then reset the queued connection: a client's SUB got
/// "connection reset by peer" 2 s later. Now the client is refused meanwhile (and
/// retries), and the broker exits with nsqd's message.
#[test]
fn a_start_that_fails_on_a_taken_address_never_accepts() {
    let dir = data_dir("taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http = taken.local_addr().unwrap();
    let tcp = loopback(free_port());
    let mut b = Broker::spawn_on(&dir, 2, tcp.port(), http.port(), &[]);
    let started = Instant::now();
    let mut tries = 0;
    while b.exited().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "still running");
        tries += 1;
        if let Ok(mut s) = std::net::TcpStream::connect(tcp) {
            // Accepted: the exit must not reset what it was sent.
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"  V2SUB t c\nRDY 1\n").unwrap();
            let mut buf = [0u8; 64];
            let r = s.read(&mut buf);
            panic!("the TCP port accepted while the HTTP port was taken: read {r:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = b.exited().unwrap();
    // The exit can be seen before the last stderr lines reached the test's reader.
    let log = b.final_log();
    assert_eq!(st.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!(
            "listen ({http}) failed - listen tcp {http}: bind: address already in use"
        )),
        "{log}"
    );
    assert!(tries > 10, "the bind was retried: {tries} connects refused");
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM before every shard serves ends the process at once with status 0, as a
/// supervisor's stop expects. The start is made long with many more shards than cores
/// (64 on a 2-core host: about a second, once minutes to join their mesh); the signal
/// was ignored until every shard served.
#[test]
fn sigterm_during_start_up_exits() {
    let dir = data_dir("term-at-start");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.args([
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--shards=64",
        &format!("--data-path={}", dir.display()),
    ]);
    let mut d = common::daemon::Daemon::spawn_cmd(cmd);
    // Into its start-up (64 shards on 2 cores take about a second), not after it.
    std::thread::sleep(Duration::from_millis(100));
    let sent = Instant::now();
    d.signal(15);
    let status = d.wait_exit(Duration::from_secs(30));
    if status.is_none() {
        d.kill9();
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{:?} after SIGTERM\n{}",
        sent.elapsed(),
        d.stderr_text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Far more shards than cores (64 on a 2-core host) start and serve: the shards' mesh
/// was joined one pair after another, each step waiting for a thread to be scheduled,
/// and glommio spun every executor with a connect pending: 64 shards did not serve
/// within two minutes. Every shard then owns topics and hands connections over.
#[test]
fn far_more_shards_than_cores_start_and_serve() {
    let b = Broker::start(64, &[]);
    let topics = topic_names("many_shards", 16);
    // 64 shard threads on 2 cores that other tests keep busy: an answer can take far
    // longer than the usual 10 s read timeout and still be far below the minutes this
    // guards against.
    let connect = || {
        let s = b.connect_v2();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    };
    for t in &topics {
        let mut p = connect();
        send(&mut p, &pub_cmd(t, t.as_bytes()));
        expect_ok(&mut p);
    }
    for t in &topics {
        let mut c = connect();
        send(&mut c, format!("SUB {t} c\n").as_bytes());
        expect_ok(&mut c);
        send(&mut c, b"RDY 1\n");
        assert_eq!(read_msg(&mut c).body, t.as_bytes());
    }
    let stats = b.stats();
    assert_eq!(
        stats["topics"].as_array().map(|a| a.len()),
        Some(16),
        "{stats}"
    );
}
