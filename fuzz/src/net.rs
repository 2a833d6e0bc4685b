//! Helpers of the network tools (`netfuzz`, `chaos`, `cluster-chaos`; RELIABILITY.md):
//! start the real `nsqd` binary, talk raw V2 and HTTP/1.1 to it, read its RSS, and the
//! command-line options the tools share ([`ToolArgs`]). They talk to the broker with the
//! standard library only, so the tools keep working whatever the broker's crates are
//! called.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A broker child process started by a tool.
pub struct Broker {
    pub child: Child,
    pub tcp: SocketAddr,
    pub http: SocketAddr,
    /// Every stderr line so far (the broker logs there).
    pub log: Arc<Mutex<Vec<String>>>,
    /// Lines that mention a panic or FATAL (kept even when `log` is trimmed).
    pub alarms: Arc<Mutex<Vec<String>>>,
}

/// The `nsqd` binary next to the running tool (`target/<profile>/nsqd`), unless `NSQD_BIN`
/// names another.
pub fn default_nsqd() -> PathBuf {
    if let Some(p) = std::env::var_os("NSQD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().expect("exe dir").join("nsqd")
}

/// A loopback port that was free a moment ago, below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), for a broker
/// that is restarted on the same ports: an ephemeral port can meanwhile become the
/// local end of any outgoing connection (a client's, or a member's link to another),
/// and the restarted broker then cannot bind it.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&h| h > LOW + 1_000)
        .unwrap_or(32_768);
    let span = high - LOW;
    // Tools started one after another begin at different places.
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = (LOW + seed.wrapping_add(n.wrapping_mul(7)) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

impl Broker {
    /// Starts `nsqd --shards N --data-path DIR` on the given loopback addresses (port 0:
    /// chosen by the kernel) plus `extra`; waits up to 60 s for both listening lines.
    // A `String` error: CLI-only, printed once before the fuzzer exits.
    pub fn start(
        nsqd: &Path,
        data: &Path,
        shards: usize,
        tcp: &str,
        http: &str,
        extra: &[String],
    ) -> Result<Broker, String> {
        Broker::start_with_env(nsqd, data, shards, tcp, http, extra, &[])
    }

    /// [`Broker::start`] with extra environment variables for the broker process.
    // A `String` error: CLI-only, printed once before the fuzzer exits.
    pub fn start_with_env(
        nsqd: &Path,
        data: &Path,
        shards: usize,
        tcp: &str,
        http: &str,
        extra: &[String],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Broker, String> {
        let mut child = Command::new(nsqd)
            .envs(env.iter().copied())
            .arg(format!("--tcp-address={tcp}"))
            .arg(format!("--http-address={http}"))
            .arg(format!("--shards={shards}"))
            .arg(format!("--data-path={}", data.display()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", nsqd.display()))?;
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let alarms = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let (log2, alarms2) = (log.clone(), alarms.clone());
        let echo = std::env::var_os("NETFUZZ_LOG").is_some();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if echo {
                    eprintln!("nsqd: {line}");
                }
                // A replicated batch numbered below its topic's log (a cluster's
                // leader that misnumbered it: every replica skips it) is a loss too.
                if line.contains("panicked at")
                    || line.contains("FATAL")
                    || line.contains("skipped although newer than any it holds")
                {
                    alarms2.lock().unwrap().push(line.clone());
                }
                let _ = tx.send(line.clone());
                let mut l = log2.lock().unwrap();
                if l.len() > 20_000 {
                    l.drain(..10_000);
                }
                l.push(line);
            }
        });
        let (mut t, mut h) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while t.is_none() || h.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.split("TCP: listening on ").nth(1) {
                        t = a.trim().parse().ok();
                    }
                    if let Some(a) = line.split("HTTP: listening on ").nth(1) {
                        h = a.trim().parse().ok();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let tail = log.lock().unwrap().join("\n");
                    return Err(format!("nsqd did not start:\n{tail}"));
                }
            }
        }
        Ok(Broker {
            child,
            tcp: t.unwrap(),
            http: h.unwrap(),
            log,
            alarms,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many lines of the broker's log so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// kill -9 and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (via kill(1)), then waits up to `within`; the exit code, or None (then
    /// killed).
    pub fn terminate(&mut self, within: Duration) -> Option<i32> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9();
        None
    }

    pub fn log_tail(&self, n: usize) -> Vec<String> {
        let l = self.log.lock().unwrap();
        l[l.len().saturating_sub(n)..].to_vec()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// VmRSS of a process in kB (0 when it is gone).
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`): status and body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    http_within(addr, method, path, body, Duration::from_secs(20))
}

/// [`http`] with a limit on each read and write (the connect waits at most 5 s): for a
/// broker that may be stopped (SIGSTOP) while it is asked.
pub fn http_within(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    io_timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, io_timeout.min(Duration::from_secs(5)))?;
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: nsqd\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP head"))?;
    let status = std::str::from_utf8(&out[..split])
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let head = String::from_utf8_lossy(&out[..split]).to_ascii_lowercase();
    let body = &out[split + 4..];
    if head.contains("\r\ntransfer-encoding: chunked") {
        // A body over 2 KiB comes chunked (as net/http sends it).
        return Ok((status, dechunk(body)?));
    }
    Ok((status, body.to_vec()))
}

/// Decodes a chunked body (`<hex size>\r\n<data>\r\n` ... `0\r\n\r\n`).
fn dechunk(mut b: &[u8]) -> std::io::Result<Vec<u8>> {
    let bad = || std::io::Error::other("bad chunked body");
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n").ok_or_else(bad)?;
        let size = std::str::from_utf8(&b[..nl])
            .ok()
            .and_then(|h| usize::from_str_radix(h.trim(), 16).ok())
            .ok_or_else(bad)?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = b.get(..size).ok_or_else(bad)?;
        out.extend_from_slice(data);
        b = b.get(size + 2..).ok_or_else(bad)?;
    }
}

/// A V2 frame: (frame type, data). 0 response, 1 error, 2 message.
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<(i32, Vec<u8>)> {
    let mut h = [0u8; 8];
    s.read_exact(&mut h)?;
    let size = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if !(4..=64 << 20).contains(&size) {
        return Err(std::io::Error::other(format!("bad frame size {size}")));
    }
    let ft = i32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let mut data = vec![0u8; size - 4];
    s.read_exact(&mut data)?;
    Ok((ft, data))
}

/// A message frame's (attempts, 16-byte id, body).
pub fn parse_message(d: &[u8]) -> Option<(u16, [u8; 16], &[u8])> {
    if d.len() < 26 {
        return None;
    }
    let attempts = u16::from_be_bytes([d[8], d[9]]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[10..26]);
    Some((attempts, id, &d[26..]))
}

pub fn pub_cmd(topic: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!("PUB {topic}\n").into_bytes();
    v.extend_from_slice(&(body.len() as u32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

pub fn mpub_cmd(topic: &str, bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
    for b in bodies {
        inner.extend_from_slice(&(b.len() as u32).to_be_bytes());
        inner.extend_from_slice(b);
    }
    let mut v = format!("MPUB {topic}\n").into_bytes();
    v.extend_from_slice(&(inner.len() as u32).to_be_bytes());
    v.extend_from_slice(&inner);
    v
}

/// A V2 connection that has sent the magic (TCP_NODELAY, read timeout `rt`).
pub fn v2(addr: SocketAddr, rt: Duration) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(rt))?;
    s.set_write_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(b"  V2")?;
    Ok(s)
}

/// Reads frames until a response or error frame (answering heartbeats with NOP, handing
/// message frames to `on_msg`).
pub fn expect_response(
    s: &mut TcpStream,
    mut on_msg: impl FnMut(&[u8]),
) -> std::io::Result<(i32, Vec<u8>)> {
    loop {
        let (ft, d) = read_frame(s)?;
        match ft {
            0 if d == b"_heartbeat_" => s.write_all(b"NOP\n")?,
            2 => on_msg(&d),
            _ => return Ok((ft, d)),
        }
    }
}

/// A stop flag shared by the worker threads of a tool.
#[derive(Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn set(&self) {
        self.0.store(true, Ordering::SeqCst)
    }
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The options every network tool takes (flattened into each tool's clap parser).
#[derive(clap::Args, Debug, Clone)]
pub struct ToolArgs {
    /// Shard counts to run with, one run each: `1,2,4` or `"1 2 4"`.
    #[arg(long, default_value = "1", value_parser = parse_shards)]
    pub shards: Shards,
    /// Seed of every random choice (default: the current time).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The broker binary (default: `nsqd` beside this tool, or `$NSQD_BIN`).
    #[arg(long)]
    pub nsqd: Option<PathBuf>,
}

/// Shard counts of `--shards`, in the order given.
#[derive(Debug, Clone)]
pub struct Shards(pub Vec<usize>);

fn parse_shards(v: &str) -> Result<Shards, String> {
    let counts = v
        .split([',', ' '])
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("not a number: {s}")))
        .collect::<Result<Vec<usize>, String>>()?;
    if counts.is_empty() {
        return Err("no shard count given".into());
    }
    Ok(Shards(counts))
}

impl ToolArgs {
    /// `--seed`, or the current time in seconds.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        })
    }

    /// `--nsqd`, or [`default_nsqd`].
    pub fn nsqd(&self) -> PathBuf {
        self.nsqd.clone().unwrap_or_else(default_nsqd)
    }
}

/// A fresh temporary data directory for a broker.
pub fn temp_data_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nsq-{tag}-{}-{}", std::process::id(), now_nanos()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create data dir");
    d
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
