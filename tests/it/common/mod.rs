//! Test harness: starts the real `nsqd` binary of this crate (and `nsqlookupd` of
//! lookupd/) as child processes through the one spawner in [`daemon`], and gives raw-TCP
//! and HTTP helpers.
//!
//! Every daemon is started on two loopback ports picked just before (a port bound to 0 and
//! released), and a test waits the way users do: until both ports answer a TCP connect,
//! never for a log line.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

pub mod daemon;
pub mod hostile;

#[allow(unused_imports)]
pub use daemon::{free_port, loopback, read_until_closed, reserved_port, wait_for_port, Daemon};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shard counts every sharding-sensitive test runs with (4 is more than the CI's 2 cores).
pub const SHARD_COUNTS: [usize; 3] = [1, 2, 4];

/// Runs `body` once per shard count in `counts` (normally [`SHARD_COUNTS`]), in order; a
/// failure names the shard count it happened with.
pub fn for_each_shards(counts: &[usize], mut body: impl FnMut(usize)) {
    for &shards in counts {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(shards)));
        if let Err(e) = r {
            eprintln!("failed with --shards={shards}");
            std::panic::resume_unwind(e);
        }
    }
}

pub struct Broker {
    pub daemon: Daemon,
    pub tcp: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: std::path::PathBuf,
    /// Every stderr line the broker printed so far (the daemon's log).
    pub log: Arc<Mutex<Vec<String>>>,
    /// Remove `data_dir` when dropped (false for brokers restarted on kept data).
    pub remove_data: bool,
}

/// The `nsqd` command line the harness runs: the given loopback ports, shard count and
/// data path, then `extra` (which may override any of them).
fn nsqd_cmd(
    data_dir: &std::path::Path,
    shards: usize,
    tcp: SocketAddr,
    http: SocketAddr,
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.arg(format!("--tcp-address={tcp}"))
        .arg(format!("--http-address={http}"))
        .arg(format!("--shards={shards}"))
        .arg(format!("--data-path={}", data_dir.display()))
        .args(extra);
    cmd
}

impl Broker {
    /// Starts `nsqd --shards <shards> <extra...>` on free loopback ports with a fresh data
    /// path. Panics (test failure) if its ports do not answer within 60 s.
    pub fn start(shards: usize, extra: &[&str]) -> Broker {
        let data_dir = std::env::temp_dir().join(format!(
            "nsqd-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir).expect("create data dir");
        let mut b = Broker::start_in(&data_dir, shards, extra);
        b.remove_data = true;
        b
    }

    /// Starts a broker on an existing data path (a restart), which is kept when the
    /// broker is dropped; returns once both its ports answer (see
    /// [`Daemon::start_listening_with`]).
    pub fn start_in(data_dir: &std::path::Path, shards: usize, extra: &[&str]) -> Broker {
        Broker::start_in_env(data_dir, shards, extra, &[])
    }

    /// [`Broker::start_in`] with extra environment variables for the broker process
    /// (e.g. `NSQD_STORAGE_FAULTS`).
    pub fn start_in_env(
        data_dir: &std::path::Path,
        shards: usize,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Broker {
        Broker::start_in_cmd(data_dir, shards, extra, |cmd| {
            cmd.envs(env.iter().copied());
        })
    }

    /// [`Broker::start_in`] with the command adjusted by `adjust` before each spawn (e.g.
    /// a resource limit set in `pre_exec`).
    pub fn start_in_cmd(
        data_dir: &std::path::Path,
        shards: usize,
        extra: &[&str],
        mut adjust: impl FnMut(&mut std::process::Command),
    ) -> Broker {
        let (daemon, tcp, http) = Daemon::start_listening_with(|tcp, http| {
            let mut cmd = nsqd_cmd(data_dir, shards, tcp, http, extra);
            adjust(&mut cmd);
            cmd
        });
        Broker {
            log: daemon.log.clone(),
            daemon,
            tcp,
            http,
            data_dir: data_dir.to_path_buf(),
            remove_data: false,
        }
    }

    /// A raw TCP connection to the broker that has already sent the `"  V2"` magic.
    pub fn connect_v2(&self) -> TcpStream {
        let mut s = TcpStream::connect(self.tcp).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(b"  V2").unwrap();
        s
    }

    /// Sends SIGTERM and waits for the exit status (up to 10 s, then SIGKILL).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.daemon.terminate(Duration::from_secs(10))
    }

    /// `kill -9` and reap (a crash: nothing is flushed).
    pub fn kill9(&mut self) {
        self.daemon.kill9();
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// Sends signal `sig` to the broker (19 SIGSTOP, 18 SIGCONT: a stand-in for a host
    /// cut off and back).
    pub fn signal(&self, sig: i32) {
        self.daemon.signal(sig);
    }

    /// Performs one HTTP/1.1 request (Connection: close) and returns the raw response
    /// bytes: status line, headers and body exactly as sent.
    pub fn http_raw(&self, method: &str, path_and_query: &str, body: &[u8]) -> Vec<u8> {
        http_raw(self.http, method, path_and_query, body)
    }

    /// (status code, body) of one HTTP request.
    pub fn http(&self, method: &str, path_and_query: &str, body: &[u8]) -> (u16, Vec<u8>) {
        split_http(&self.http_raw(method, path_and_query, body))
    }

    /// GET /stats?format=json parsed.
    pub fn stats(&self) -> serde_json::Value {
        let (code, body) = self.http("GET", "/stats?format=json", b"");
        assert_eq!(code, 200);
        serde_json::from_slice(&body).expect("stats json")
    }
}

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Drop for Broker {
    fn drop(&mut self) {
        self.daemon.kill9();
        if self.remove_data {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

pub fn http_raw(addr: SocketAddr, method: &str, path_and_query: &str, body: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("http connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Splits a raw HTTP response into (status, body); a chunked body (net/http chunks
/// bodies over 2 KiB) is decoded.
pub fn split_http(raw: &[u8]) -> (u16, Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let pos = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .unwrap_or(raw.len());
    let chunked = String::from_utf8_lossy(&raw[..pos])
        .to_ascii_lowercase()
        .contains("\r\ntransfer-encoding: chunked\r\n");
    if chunked {
        return (code, dechunk(&raw[pos..]));
    }
    (code, raw[pos..].to_vec())
}

/// Decodes a chunked body (`<hex size>\r\n<data>\r\n` ... `0\r\n\r\n`); panics on
/// bad framing.
pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&b[..nl]).unwrap().trim(), 16)
            .expect("hex chunk size");
        b = &b[nl + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        assert_eq!(&b[size..size + 2], b"\r\n", "chunk end");
        b = &b[size + 2..];
    }
}

/// The response headers of a raw HTTP response, without the Date header (which changes).
pub fn headers_without_date(raw: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(raw);
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
        .map(String::from)
        .collect()
}

/// One server frame: (frame_type, data).
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<(i32, Vec<u8>)> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    let size = i32::from_be_bytes(hdr[0..4].try_into().unwrap());
    let ft = i32::from_be_bytes(hdr[4..8].try_into().unwrap());
    let mut data = vec![0u8; (size - 4) as usize];
    s.read_exact(&mut data)?;
    Ok((ft, data))
}

/// Reads the next frame that is not a `_heartbeat_` response.
pub fn read_frame_skip_hb(s: &mut TcpStream) -> std::io::Result<(i32, Vec<u8>)> {
    loop {
        let f = read_frame(s)?;
        if !(f.0 == 0 && f.1 == b"_heartbeat_") {
            return Ok(f);
        }
    }
}

/// The exact bytes of a frame the server would send.
pub fn frame(frame_type: i32, data: &[u8]) -> Vec<u8> {
    let mut v = ((data.len() + 4) as i32).to_be_bytes().to_vec();
    v.extend_from_slice(&frame_type.to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// `[4-byte big-endian len][body]`.
pub fn sized(body: &[u8]) -> Vec<u8> {
    let mut v = (body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// A PUB command.
pub fn pub_cmd(topic: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!("PUB {topic}\n").into_bytes();
    v.extend(sized(body));
    v
}

/// An MPUB command.
pub fn mpub_cmd(topic: &str, bodies: &[&[u8]]) -> Vec<u8> {
    let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
    for b in bodies {
        inner.extend(sized(b));
    }
    let mut v = format!("MPUB {topic}\n").into_bytes();
    v.extend(sized(&inner));
    v
}

/// An IDENTIFY command with a JSON body.
pub fn identify_cmd(json: &str) -> Vec<u8> {
    let mut v = b"IDENTIFY\n".to_vec();
    v.extend(sized(json.as_bytes()));
    v
}

/// Asserts the connection is closed by the server (EOF or reset) within the read timeout.
pub fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("connection was not closed")
            }
            Err(_) => return,
        }
    }
}

/// A parsed message frame body: (timestamp_ns, attempts, id, body).
pub fn parse_message(data: &[u8]) -> (i64, u16, String, Vec<u8>) {
    let ts = i64::from_be_bytes(data[0..8].try_into().unwrap());
    let attempts = u16::from_be_bytes(data[8..10].try_into().unwrap());
    let id = String::from_utf8_lossy(&data[10..26]).to_string();
    (ts, attempts, id, data[26..].to_vec())
}

// ---------------------------------------------------------------------------------------
// Helpers added for the conformance tests (tests/it/conformance_*.rs, tests/it/http_admin.rs).
// ---------------------------------------------------------------------------------------

/// Writes raw bytes to the connection.
pub fn send(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(bytes).expect("write to broker");
}

/// Renders bytes for assertion messages: printable ASCII as is, the rest as `\xNN`.
pub fn show(bytes: &[u8]) -> String {
    let mut out = String::new();
    for &b in bytes {
        if (0x20..0x7f).contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reads one whole frame and returns its raw bytes (size, type and data).
pub fn read_raw_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut hdr = [0u8; 8];
    s.read_exact(&mut hdr)?;
    let size = i32::from_be_bytes(hdr[0..4].try_into().unwrap());
    assert!(size >= 4, "frame size {size} < 4 (header {})", show(&hdr));
    let mut out = hdr.to_vec();
    let mut data = vec![0u8; (size - 4) as usize];
    s.read_exact(&mut data)?;
    out.extend(data);
    Ok(out)
}

/// Reads the next frame, skipping `_heartbeat_` responses, and returns its raw bytes.
pub fn read_raw_frame_skip_hb(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let hb = frame(0, b"_heartbeat_");
    loop {
        let f = read_raw_frame(s)?;
        if f != hb {
            return Ok(f);
        }
    }
}

/// Asserts that the next frame (heartbeats skipped) is exactly `frame(frame_type, data)`.
pub fn expect_frame(s: &mut TcpStream, frame_type: i32, data: &[u8]) {
    let want = frame(frame_type, data);
    let got = read_raw_frame_skip_hb(s)
        .unwrap_or_else(|e| panic!("expected frame {:?}, read failed: {e}", show(&want)));
    assert_eq!(show(&got), show(&want), "frame bytes differ");
}

/// Asserts the next frame is the response `OK`.
pub fn expect_ok(s: &mut TcpStream) {
    expect_frame(s, 0, b"OK");
}

/// Asserts the next frame is exactly the error frame `msg` and that the connection then
/// stays open (non-fatal errors: E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED).
pub fn expect_error(s: &mut TcpStream, msg: &str) {
    expect_frame(s, 1, msg.as_bytes());
    assert_open(s);
}

/// Asserts the next frame is exactly the error frame `msg` and that the server then
/// closes the connection (fatal errors).
pub fn expect_fatal(s: &mut TcpStream, msg: &str) {
    expect_frame(s, 1, msg.as_bytes());
    assert_closed(s);
}

/// Asserts the server closes the connection without sending anything but heartbeats.
pub fn assert_closed_silently(s: &mut TcpStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!(
                    "connection was not closed (received so far: {})",
                    show(&got)
                )
            }
            Err(_) => break,
        }
    }
    let hb = frame(0, b"_heartbeat_");
    let mut rest = &got[..];
    while rest.starts_with(&hb) {
        rest = &rest[hb.len()..];
    }
    assert!(
        rest.is_empty(),
        "expected a silent close, got bytes: {}",
        show(&got)
    );
}

/// Asserts the connection is still open: within 300 ms the server neither closed it nor
/// reset it (pending data is fine and is left unread).
pub fn assert_open(s: &mut TcpStream) {
    let old = s.read_timeout().unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    s.set_read_timeout(old).unwrap();
    match r {
        Ok(0) => panic!("connection was closed by the server"),
        Ok(_) => {}
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        Err(e) => panic!("connection failed: {e}"),
    }
}

/// Asserts that no frame other than heartbeats arrives within `dur`, and the connection
/// stays open.
pub fn assert_no_frame(s: &mut TcpStream, dur: Duration) {
    let old = s.read_timeout().unwrap();
    let deadline = Instant::now() + dur;
    let hb = frame(0, b"_heartbeat_");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(1) {
            break;
        }
        s.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8; 1];
        match s.peek(&mut b) {
            Ok(0) => panic!("connection closed while waiting for silence"),
            Ok(_) => {
                s.set_read_timeout(old).unwrap();
                let f = read_raw_frame(s).expect("read frame");
                assert_eq!(show(&f), show(&hb), "expected no frame, got one");
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break
            }
            Err(e) => panic!("connection failed: {e}"),
        }
    }
    s.set_read_timeout(old).unwrap();
}

/// A message frame read from a consumer connection.
#[derive(Debug, Clone)]
pub struct Msg {
    pub ts: i64,
    pub attempts: u16,
    pub id: String,
    pub body: Vec<u8>,
}

/// Reads the next non-heartbeat frame and asserts it is a message frame whose size field
/// is 30 + len(body).
pub fn read_msg(s: &mut TcpStream) -> Msg {
    let raw = read_raw_frame_skip_hb(s).expect("read message frame");
    let size = i32::from_be_bytes(raw[0..4].try_into().unwrap());
    let ft = i32::from_be_bytes(raw[4..8].try_into().unwrap());
    assert_eq!(ft, 2, "expected a message frame, got {}", show(&raw));
    assert!(raw.len() >= 34, "message frame too short: {}", show(&raw));
    let (ts, attempts, id, body) = parse_message(&raw[8..]);
    assert_eq!(size as usize, 30 + body.len(), "message frame size field");
    Msg {
        ts,
        attempts,
        id,
        body,
    }
}

/// Builds an NSQ command line (`\n` appended).
pub fn line(cmd: &str) -> Vec<u8> {
    format!("{cmd}\n").into_bytes()
}

/// A DPUB command.
pub fn dpub_cmd(topic: &str, defer_ms: u64, body: &[u8]) -> Vec<u8> {
    let mut v = format!("DPUB {topic} {defer_ms}\n").into_bytes();
    v.extend(sized(body));
    v
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Unix seconds.
pub fn now_s() -> i64 {
    now_ns() / 1_000_000_000
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after 30 s.
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(Duration::from_secs(30), cond),
        "timed out waiting for {what}"
    );
}

/// Polls `f` every 20 ms until it returns true or `within` has passed.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `f` every 50 ms until it returns true; fails the test naming `what` after 10 s.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Test topic names spread over shards by the broker's own hash
/// ([`nsq_shards::owner_of`]): name `i` is owned by shard `i % s` for every shard count
/// `s` in [`SHARD_COUNTS`] (1, 2 and 4), so `n >= s` names cover every shard and some
/// topic is certainly owned by a shard other than the one a connection landed on.
pub fn topic_names(prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            (0..)
                .map(|k| format!("{prefix}_{i}_{k}"))
                .find(|name| nsq_shards::owner_of(name, 4) == i % 4)
                .expect("some suffix hashes to each shard")
        })
        .collect()
}

impl Broker {
    /// A V2 connection that has subscribed to `topic`/`channel` (reply `OK` checked).
    pub fn subscribe(&self, topic: &str, channel: &str) -> TcpStream {
        let mut s = self.connect_v2();
        send(&mut s, &line(&format!("SUB {topic} {channel}")));
        expect_ok(&mut s);
        s
    }

    /// A V2 connection that has sent IDENTIFY `json` (feature_negotiation off: reply `OK`),
    /// then subscribed.
    pub fn subscribe_identified(&self, json: &str, topic: &str, channel: &str) -> TcpStream {
        let mut s = self.connect_v2();
        send(&mut s, &identify_cmd(json));
        expect_ok(&mut s);
        send(&mut s, &line(&format!("SUB {topic} {channel}")));
        expect_ok(&mut s);
        s
    }

    /// Publishes one message over HTTP and asserts 200 `OK`.
    pub fn http_pub(&self, topic: &str, body: &[u8]) {
        let (code, resp) = self.http("POST", &format!("/pub?topic={topic}"), body);
        assert_eq!(
            (code, show(&resp)),
            (200, "OK".to_string()),
            "POST /pub?topic={topic}"
        );
    }

    /// Publishes one message over a fresh TCP connection and asserts `OK`.
    pub fn tcp_pub(&self, topic: &str, body: &[u8]) {
        let mut s = self.connect_v2();
        send(&mut s, &pub_cmd(topic, body));
        expect_ok(&mut s);
    }

    /// POSTs `path` (no body) and asserts status 200 (the body is shown on failure).
    pub fn post_ok(&self, path: &str) {
        let (code, body) = self.http("POST", path, b"");
        assert_eq!(code, 200, "POST {path}: {}", String::from_utf8_lossy(&body));
    }

    /// POSTs an admin endpoint and asserts 200 with an empty body.
    pub fn admin(&self, path_and_query: &str) {
        let (code, body) = self.http("POST", path_and_query, b"");
        assert_eq!(
            (code, show(&body)),
            (200, String::new()),
            "POST {path_and_query}"
        );
    }

    /// The /stats JSON object of one topic, if it exists.
    pub fn topic_stats(&self, topic: &str) -> Option<serde_json::Value> {
        let st = self.stats();
        st["topics"]
            .as_array()?
            .iter()
            .find(|t| t["topic_name"] == topic)
            .cloned()
    }

    /// The /stats JSON object of one channel, if it exists.
    pub fn channel_stats(&self, topic: &str, channel: &str) -> Option<serde_json::Value> {
        let t = self.topic_stats(topic)?;
        t["channels"]
            .as_array()?
            .iter()
            .find(|c| c["channel_name"] == channel)
            .cloned()
    }

    /// Waits (up to 5 s) until `field` of the topic's stats equals `want`; panics otherwise.
    pub fn wait_topic_field(&self, topic: &str, field: &str, want: i64) {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(5), || {
            last = self.topic_stats(topic).map(|t| t[field].clone());
            last.as_ref().and_then(|v| v.as_i64()) == Some(want)
        });
        assert!(ok, "topic {topic} {field}: want {want}, last seen {last:?}");
    }

    /// Waits (up to 5 s) until `field` of the channel's stats equals `want`; panics otherwise.
    pub fn wait_channel_field(&self, topic: &str, channel: &str, field: &str, want: i64) {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(5), || {
            last = self.channel_stats(topic, channel).map(|c| c[field].clone());
            last.as_ref().and_then(|v| v.as_i64()) == Some(want)
        });
        assert!(
            ok,
            "channel {topic}/{channel} {field}: want {want}, last seen {last:?}"
        );
    }

    /// One HTTP/1.1 request without `Connection: close` (keep-alive, as the clients that
    /// made the captures sent it). Reads exactly one response (Content-Length framed) and
    /// returns its raw bytes.
    pub fn http_keepalive(&self, method: &str, path_and_query: &str, body: &[u8]) -> Vec<u8> {
        http_keepalive(self.http, method, path_and_query, body)
    }
}

/// See [`Broker::http_keepalive`]. The request body is written from a second thread so
/// that a server which answers before reading a large body cannot dead-lock the test.
pub fn http_keepalive(
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    body: &[u8],
) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("http connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "{method} {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: conformance-test\r\nAccept: */*\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut w = s.try_clone().unwrap();
    let mut req = head.into_bytes();
    req.extend_from_slice(body);
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&req);
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let mut need: Option<usize> = None;
    loop {
        if let Some(n) = need {
            if out.len() >= n {
                break;
            }
        } else if let Some(p) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&out[..p]).to_ascii_lowercase();
            let len = head.split("\r\n").find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            });
            match len {
                Some(l) => {
                    need = Some(p + 4 + l);
                    continue;
                }
                None => {
                    // No length: read until the server closes.
                    need = Some(usize::MAX);
                }
            }
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    drop(s);
    let _ = writer.join();
    out
}

/// Asserts a raw HTTP response equals the expected status line, header lines (in order,
/// the Date header excluded) and body. Body and status are compared first, then the set of
/// headers case-insensitively, then their exact spelling and order, so that the first
/// failure names the most important difference.
pub fn assert_http_exact(raw: &[u8], status_line: &str, headers: &[&str], body: &[u8]) {
    let (_, got_body) = split_http(raw);
    let got_head = headers_without_date(raw);
    let ctx = format!("full response:\n{}", show(raw));
    assert_eq!(
        got_head.first().map(String::as_str),
        Some(status_line),
        "status line; {ctx}"
    );
    assert_eq!(show(&got_body), show(body), "body; {ctx}");
    let mut want_set: Vec<String> = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
    let mut got_set: Vec<String> = got_head[1..]
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    want_set.sort();
    got_set.sort();
    assert_eq!(got_set, want_set, "header set (case-insensitive); {ctx}");
    let want: Vec<&str> = headers.to_vec();
    let got: Vec<&str> = got_head[1..].iter().map(String::as_str).collect();
    assert_eq!(
        got, want,
        "header spelling and order (Go's net/http order); {ctx}"
    );
    let has_date = String::from_utf8_lossy(raw)
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase()
        .contains("\r\ndate: ");
    assert!(has_date, "Date header missing; {ctx}");
}

/// The header lines Go's net/http sends for a V1 JSON response of `len` bytes.
pub fn v1_json_headers(len: usize) -> Vec<String> {
    vec![
        "Content-Type: application/json; charset=utf-8".to_string(),
        "X-Nsq-Content-Type: nsq; version=1.0".to_string(),
        format!("Content-Length: {len}"),
    ]
}

/// Asserts a V1 error response `{"message":"<msg>"}` with the exact status line and headers.
pub fn assert_v1_error(raw: &[u8], status_line: &str, msg: &str) {
    let body = format!("{{\"message\":\"{msg}\"}}");
    let h = v1_json_headers(body.len());
    let hs: Vec<&str> = h.iter().map(String::as_str).collect();
    assert_http_exact(raw, status_line, &hs, body.as_bytes());
}

/// Asserts the V1 empty 200 response of the admin endpoints (as in the capture
/// nsqd_create_channel.http).
pub fn assert_v1_empty_ok(raw: &[u8]) {
    assert_http_exact(
        raw,
        "HTTP/1.1 200 OK",
        &["X-Nsq-Content-Type: nsq; version=1.0", "Content-Length: 0"],
        b"",
    );
}

/// Asserts the V1 `OK` text response of /pub and /mpub (as in the capture
/// nsqd_pub_hello.http).
pub fn assert_v1_text_ok(raw: &[u8]) {
    assert_http_exact(
        raw,
        "HTTP/1.1 200 OK",
        &[
            "X-Nsq-Content-Type: nsq; version=1.0",
            "Content-Length: 2",
            "Content-Type: text/plain; charset=utf-8",
        ],
        b"OK",
    );
}

impl Broker {
    /// Starts `nsqd` on the given loopback ports and data path (kept when dropped) and
    /// returns at once, without waiting for it: callers wait the way users and
    /// supervisors do, by polling the port (see [`wait_for_port`]). For restarts on the
    /// same ports.
    pub fn spawn_on(
        data_dir: &std::path::Path,
        shards: usize,
        tcp_port: u16,
        http_port: u16,
        extra: &[&str],
    ) -> Broker {
        let (tcp, http) = (loopback(tcp_port), loopback(http_port));
        let daemon = Daemon::spawn_cmd(nsqd_cmd(data_dir, shards, tcp, http, extra));
        Broker {
            log: daemon.log.clone(),
            daemon,
            tcp,
            http,
            data_dir: data_dir.to_path_buf(),
            remove_data: false,
        }
    }

    /// Restarts at once on the given ports and data path and returns when both ports
    /// answer (a failure names the log).
    pub fn restart_on(
        data_dir: &std::path::Path,
        shards: usize,
        tcp_port: u16,
        http_port: u16,
        extra: &[&str],
    ) -> Broker {
        let mut b = Broker::spawn_on(data_dir, shards, tcp_port, http_port, extra);
        if let Err(e) = b
            .daemon
            .wait_for_ports(&[b.tcp, b.http], daemon::START_TIMEOUT)
        {
            panic!("nsqd did not restart: {e}");
        }
        b
    }

    /// Whether the process has exited (and with what status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.daemon.exited()
    }

    /// Every log line so far, joined.
    pub fn log_text(&self) -> String {
        self.daemon.log_text()
    }

    /// Every log line of an exited broker, joined: waits (up to 2 s) for the stderr
    /// reader to drain what the process wrote before it exited, which [`Broker::log_text`]
    /// may not have seen yet.
    #[allow(dead_code)]
    pub fn final_log(&mut self) -> String {
        self.daemon.final_log()
    }

    /// The first log line containing `needle`, waiting up to `within` for it: the ports
    /// answer before the broker's stderr has necessarily reached the test, so a start-up
    /// line is waited for, not expected at once.
    pub fn wait_log_line(&self, needle: &str, within: Duration) -> Option<String> {
        let mut found = None;
        wait_until(within, || {
            found = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
                .cloned();
            found.is_some()
        });
        found
    }
}

/// Polls `addr` until a TCP connect succeeds; see [`wait_for_port`].
pub fn wait_port_answers(addr: SocketAddr, within: Duration) -> TcpStream {
    wait_for_port(addr, within)
}

/// Runs `nsqd` (1 shard, loopback ports chosen by the kernel, a data path under the temp
/// directory) with `args`, expects it to exit with status 1 at start-up within 30 s, and
/// returns its stderr.
pub fn nsqd_startup_failure(args: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!(
        "nsqd-startup-fail-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
    cmd.args([
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--shards=1",
        &format!("--data-path={}", dir.display()),
    ])
    .args(args);
    let mut d = Daemon::spawn_cmd(cmd);
    let Some(status) = d.wait_exit(Duration::from_secs(30)) else {
        d.kill9();
        panic!("nsqd {args:?} kept running");
    };
    let err = d.stderr_text();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(1), "{args:?}: {err}");
    err
}

/// The real `nsqlookupd` (see [`nsqlookupd_bin`]), killed when dropped.
pub struct Lookupd {
    pub daemon: Daemon,
    pub tcp: SocketAddr,
    pub http: SocketAddr,
}

impl Lookupd {
    /// Starts `nsqlookupd <extra...>` on free loopback ports; returns when both answer.
    pub fn start(extra: &[&str]) -> Lookupd {
        let (daemon, tcp, http) = Daemon::start_listening(nsqlookupd_bin(), extra);
        Lookupd { daemon, tcp, http }
    }

    /// Starts `nsqlookupd <extra...>` at once on the given addresses (a restart on the
    /// same ports); returns when both answer.
    pub fn start_on(tcp: SocketAddr, http: SocketAddr, extra: &[&str]) -> Lookupd {
        let mut args = vec![
            format!("--tcp-address={tcp}"),
            format!("--http-address={http}"),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut daemon = Daemon::spawn(nsqlookupd_bin(), &args);
        if let Err(e) = daemon.wait_for_ports(&[tcp, http], daemon::START_TIMEOUT) {
            panic!("nsqlookupd did not start: {e}");
        }
        Lookupd { daemon, tcp, http }
    }

    /// (status, JSON body or Null) of one HTTP request.
    pub fn request(&self, method: &str, path: &str) -> (u16, serde_json::Value) {
        let (code, body) = split_http(&http_raw(self.http, method, path, b""));
        (
            code,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// (status, JSON body or Null) of `GET path`.
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.request("GET", path)
    }

    /// `kill -9` and reap.
    pub fn kill(&mut self) {
        self.daemon.kill9();
    }
}

/// The segment files of a topic directory, in order.
pub fn segments(topic_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<std::path::PathBuf> = std::fs::read_dir(topic_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Offsets of the records of a segment file (format v1: 32-byte header, then
/// `[u32 len][u32 crc][len bytes]`; a zero length ends the data).
pub fn record_offsets(data: &[u8]) -> Vec<usize> {
    let mut off = 32;
    let mut v = Vec::new();
    while off + 8 <= data.len() {
        let len = u32::from_be_bytes(data[off..off + 4].try_into().unwrap()) as usize;
        if len == 0 || off + 8 + len > data.len() {
            break;
        }
        v.push(off);
        off += 8 + len;
    }
    v
}

/// The `nsqlookupd` binary, for tests that need both daemons: `nsqlookupd` beside this
/// test's `nsqd` (`<target>/<profile>/nsqlookupd`). It belongs to the `nsqlookupd`
/// package (lookupd/), and cargo sets `CARGO_BIN_EXE_<name>` only for the binaries of the
/// test's own package, so a test cannot name it; it is built by the same `cargo test` when
/// that covers the lookupd/ package too (`cargo test` or `cargo test --workspace` at the
/// root: lookupd/'s own integration tests need its binary), and otherwise by `cargo build
/// -p nsqlookupd` (scripts/test.sh and scripts/flake-hunt.sh run it first). No test runs
/// cargo. Panics, saying which command builds it, when it is missing or older than the
/// sources it is built from.
pub fn nsqlookupd_bin() -> std::path::PathBuf {
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let profile_dir = Path::new(env!("CARGO_BIN_EXE_nsqd"))
            .parent()
            .expect("nsqd binary has a directory");
        let bin = profile_dir.join("nsqlookupd");
        let release = if profile_dir.file_name().is_some_and(|n| n == "release") {
            " --release"
        } else {
            ""
        };
        let build = format!(
            "`cargo build{release} -p nsqlookupd` (or run the tests with `cargo test{release} --workspace`)"
        );
        let Ok(built) = std::fs::metadata(&bin).and_then(|m| m.modified()) else {
            panic!("{} is missing: build it with {build}", bin.display());
        };
        // A stale binary would test old code: every source of lookupd/ and wire/ (the
        // crates of this repository it is built from) must be older than it.
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut newest = None;
        for dir in ["lookupd/src", "wire/src"] {
            newest_mtime(&root.join(dir), &mut newest);
        }
        if let Some((t, path)) = newest {
            assert!(
                t <= built,
                "{} is older than {}: rebuild it with {build}",
                bin.display(),
                path.display()
            );
        }
        bin
    })
    .clone()
}

/// The newest modification time (and its file) under `dir`, recursively, into `newest`.
fn newest_mtime(
    dir: &std::path::Path,
    newest: &mut Option<(std::time::SystemTime, std::path::PathBuf)>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            newest_mtime(&path, newest);
        } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
            if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                *newest = Some((t, path));
            }
        }
    }
}

/// Says that the calling test passes without checking what it is for, because a
/// prerequisite is missing: prints `SKIP: <test>: <reason>` to this process's stderr,
/// uncaptured (the test harness captures only `eprintln!` and `println!`), so that the
/// skip of a passing test still shows in `cargo test`'s output, where scripts/test.sh
/// counts the `SKIP:` lines. The caller returns right after. `<test>` is the test's name
/// as the harness gives it (its thread's name, e.g. `slow_disk::a_slow_mkdir_...`).
/// `$NSQD_TEST_PYTHON`, else the repository's `.venv/bin/python` (scripts/setup-clients.sh),
/// else `python3`.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("NSQD_TEST_PYTHON") {
        return p.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// [`python`] when it can import pynsq; otherwise `None`, after printing SKIP for the
/// calling test.
pub fn pynsq_python() -> Option<std::path::PathBuf> {
    python_with("nsq")
}

/// [`python`] when it can import `module`; otherwise `None`, after printing SKIP for
/// the calling test.
pub fn python_with(module: &str) -> Option<std::path::PathBuf> {
    let py = python();
    let importable = Command::new(&py)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if importable {
        Some(py)
    } else {
        skip(&format!(
            "{} cannot import {module} (scripts/setup-clients.sh)",
            py.display()
        ));
        None
    }
}

pub fn skip(reason: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(n) if n != "main" => n.to_string(),
        _ => std::env::var(OWN_PROCESS_VAR).unwrap_or_else(|_| "?".into()),
    };
    let _ = writeln!(std::io::stderr().lock(), "SKIP: {test}: {reason}");
}

/// Set in the child process of [`in_own_process`] to the name of the test it runs.
const OWN_PROCESS_VAR: &str = "NSQD_TEST_OWN_PROCESS";

/// For a test that must change state the whole test process shares (a resource limit,
/// nearly every file descriptor of the process): runs the test again in a child process
/// of its own (this test binary, `<module>::<name> --exact`) and returns `false` once that
/// passed (panics, with its output, if it failed); in that child it returns `true`, and
/// the caller runs its body. `module` is the caller's `module_path!()`, `name` the test
/// function's name. The child's output shows when it fails; its `SKIP:` lines always.
pub fn in_own_process(module: &str, name: &str) -> bool {
    use std::io::Write;
    // module_path!() starts with the crate's name (`it::exhaustion`); the harness's test
    // names do not.
    let test = match module.split_once("::") {
        Some((_, m)) => format!("{m}::{name}"),
        None => name.to_string(),
    };
    if std::env::var(OWN_PROCESS_VAR).is_ok_and(|v| v == test) {
        return true;
    }
    let exe = std::env::current_exe().expect("path of this test binary");
    let out = Command::new(exe)
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS_VAR, &test)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run this test binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for l in stderr.lines().filter(|l| l.starts_with("SKIP: ")) {
        let _ = writeln!(std::io::stderr().lock(), "{l}");
    }
    eprintln!("---- {test} in a process of its own ----\n{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "{test} failed in its own process ({})",
        out.status
    );
    // The filter matched it: not a run of zero tests.
    assert!(
        stdout.contains("1 passed"),
        "{test}: the child ran no test:\n{stdout}"
    );
    false
}

/// A fresh directory `nsqd-<name>-<pid>` under the temp directory (emptied first),
/// removed with everything in it when dropped, so a test leaves nothing in `$TMPDIR`
/// whether it passes or fails. Declare it before the broker that uses it: locals drop
/// in reverse order, the broker first.
pub struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    pub fn new(name: &str) -> ScratchDir {
        let d = std::env::temp_dir().join(format!("nsqd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create scratch dir");
        ScratchDir(d)
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for ScratchDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A field of `/proc/<pid>/status` in kB (e.g. `"VmRSS:"`), 0 when unreadable.
pub fn proc_status_kb(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How many file descriptors the process has open (0 when unreadable).
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// This machine's hostname, as nsqd reports it in /info and /stats.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string()
}

/// The body of a raw HTTP response as UTF-8.
pub fn body_str(raw: &[u8]) -> String {
    String::from_utf8(split_http(raw).1).expect("utf-8 body")
}
