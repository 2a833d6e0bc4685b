//! Test harness: starts the real `nsqd` binary of this crate as a child process on
//! loopback ports chosen by the kernel, and gives raw-TCP and HTTP helpers.
//!
//! The broker prints `TCP: listening on <addr>` and `HTTP: listening on <addr>` to stderr
//! once every shard is accepting; `Broker::start` waits for both lines.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shard counts every sharding-sensitive test runs with (4 is more than the CI's 2 cores).
pub const SHARD_COUNTS: [usize; 3] = [1, 2, 4];

pub struct Broker {
    pub child: Child,
    pub tcp: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: std::path::PathBuf,
    /// Every stderr line the broker printed so far.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Broker {
    /// Starts `nsqd --shards <shards> <extra...>` on 127.0.0.1:0 for TCP and HTTP with a
    /// fresh data path. Panics (test failure) if it does not come up within 20 s.
    pub fn start(shards: usize, extra: &[&str]) -> Broker {
        let data_dir = std::env::temp_dir().join(format!(
            "nsqd-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&data_dir);
        std::fs::create_dir_all(&data_dir).expect("create data dir");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nsqd"));
        cmd.arg("--tcp-address=127.0.0.1:0")
            .arg("--http-address=127.0.0.1:0")
            .arg(format!("--shards={shards}"))
            .arg(format!("--data-path={}", data_dir.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn nsqd");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if std::env::var_os("NSQD_TEST_LOG").is_some() {
                    eprintln!("{line}");
                }
                let _ = tx.send(line.clone());
                log2.lock().unwrap().push(line);
            }
        });
        let (mut tcp, mut http) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while tcp.is_none() || http.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("nsqd did not start: {:?}", log.lock().unwrap()));
            if let Some(a) = line.split("TCP: listening on ").nth(1) {
                tcp = Some(a.trim().parse().expect("tcp addr"));
            }
            if let Some(a) = line.split("HTTP: listening on ").nth(1) {
                http = Some(a.trim().parse().expect("http addr"));
            }
        }
        Broker { child, tcp: tcp.unwrap(), http: http.unwrap(), data_dir, log }
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
        unsafe_kill(self.child.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        None
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

fn unsafe_kill(pid: u32, sig: i32) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status();
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data_dir);
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

/// Splits a raw HTTP response into (status, body).
pub fn split_http(raw: &[u8]) -> (u16, Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let pos = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4).unwrap_or(raw.len());
    (code, raw[pos..].to_vec())
}

/// The response headers of a raw HTTP response, without the Date header (which changes).
pub fn headers_without_date(raw: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(raw);
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.split("\r\n").filter(|l| !l.to_ascii_lowercase().starts_with("date:")).map(String::from).collect()
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
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
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
