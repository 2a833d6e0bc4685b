//! Connections to the brokers: TCP with a 5 s connect timeout and TCP_NODELAY, and, with
//! --tls-ca, the IDENTIFY tls_v1 upgrade; plus the state every thread shares.

use crate::args::Args;
use crate::tls;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connects to `addr` (the first resolved address that answers).
pub fn connect(addr: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    for sa in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&sa, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects to `addr`; with --tls-ca also sends the magic and IDENTIFY (`identify`: a
/// JSON object without its closing brace) with tls_v1 and upgrades the connection.
pub fn connect_stream(shared: &Shared, addr: &str, identify: &str) -> io::Result<tls::Stream> {
    let s = connect(addr)?;
    match &shared.tls {
        None => Ok(tls::Stream::Plain(s)),
        Some(cfg) => {
            let host = shared.args.tls_name.clone().unwrap_or_else(|| {
                addr.rsplit_once(':')
                    .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                    .unwrap_or(addr)
                    .to_string()
            });
            tls::upgrade(s, cfg, &host, identify)
        }
    }
}

/// State shared by every thread.
pub struct Shared {
    pub args: Args,
    pub run_id: u32,
    pub topics: Vec<String>,
    pub channels: Vec<String>,
    /// pubsub: bodies are checked for this run's id and sequence numbers tracked.
    pub check_seq: bool,
    pub stop_consumers: AtomicBool,
    /// Stop publishing now (a fatal problem elsewhere).
    pub abort: AtomicBool,
    /// Unix ns from which latencies are recorded (0 = not yet known).
    pub measure_from_ns: AtomicU64,
    /// Unix ns at which the backlog of a --rate-schedule run drained (0 = not yet):
    /// consumers also record the latency of messages published after it.
    pub drained_ns: AtomicU64,
    pub error_count: AtomicU64,
    pub errors: Mutex<Vec<String>>,
    /// --tls-ca: the TLS client configuration.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Shared {
    pub fn error(&self, msg: String) {
        let n = self.error_count.fetch_add(1, Ordering::SeqCst);
        if n < 20 {
            eprintln!("nsq-bench: error: {msg}");
        }
        let mut e = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if e.len() < 100 {
            e.push(msg);
        }
    }
}
