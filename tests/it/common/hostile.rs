//! Helpers of the robustness tests (tests/robustness_*.rs): hostile clients and the
//! checks that the broker stays up for everyone else. Every robustness test runs a
//! background producer/consumer pair ([`Traffic`]) doing PUB -> message -> FIN round trips
//! the whole time, and at the end a fresh PUB/MPUB + SUB round trip and /stats must still
//! work ([`assert_serves`]).
//!
//! Expected error frames are the exact upstream nsqd 1.3.0 texts (nsqd/protocol_v2.go and
//! nsqd/tcp.go); fatal errors are followed by the server closing the connection.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap fails the test"
)]

use super::{mpub_cmd, parse_message, pub_cmd, read_frame_skip_hb, Broker};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A connection that has sent the `"  V2"` magic, from an address (usable in threads).
pub fn v2(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"  V2").unwrap();
    s
}

pub fn show(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    if s.len() > 300 {
        format!("{}...({} bytes)", &s[..300], data.len())
    } else {
        s.to_string()
    }
}

/// Reads one frame (skipping heartbeats) and asserts its type and data exactly.
pub fn expect_frame(s: &mut TcpStream, frame_type: i32, data: &[u8], ctx: &str) {
    match read_frame_skip_hb(s) {
        Ok((ft, d)) => assert!(
            ft == frame_type && d == data,
            "{ctx}: expected frame type {frame_type} {:?}, got type {ft} {:?}",
            show(data),
            show(&d)
        ),
        Err(e) => panic!(
            "{ctx}: expected frame type {frame_type} {:?}, but the read failed: {e}",
            show(data)
        ),
    }
}

/// Reads until the server closes the connection (EOF or reset) and returns every byte
/// that arrived first. Fails if the connection is still open after `within`.
pub fn read_until_closed(s: &mut TcpStream, within: Duration, ctx: &str) -> Vec<u8> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!(
                    "{ctx}: connection still open after {within:?} (received {:?})",
                    show(&out)
                )
            }
            Err(_) => return out,
        }
    }
}

/// The server closes the connection without sending anything (more).
pub fn expect_closed_silently(s: &mut TcpStream, ctx: &str) {
    let rest = read_until_closed(s, Duration::from_secs(10), ctx);
    assert!(
        rest.is_empty(),
        "{ctx}: expected a close with no frame, got {:?}",
        show(&rest)
    );
}

/// A fatal error: exactly this error frame, then the connection is closed.
pub fn expect_fatal(s: &mut TcpStream, msg: &str, ctx: &str) {
    expect_frame(s, 1, msg.as_bytes(), ctx);
    expect_closed_silently(s, ctx);
}

/// Parses a byte stream into frames; `None` if it is not a whole number of valid frames.
pub fn split_frames(mut b: &[u8]) -> Option<Vec<(i32, Vec<u8>)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 8 {
            return None;
        }
        let size = i32::from_be_bytes(b[0..4].try_into().unwrap());
        let ft = i32::from_be_bytes(b[4..8].try_into().unwrap());
        if size < 4 || b.len() < 4 + size as usize {
            return None;
        }
        out.push((ft, b[8..4 + size as usize].to_vec()));
        b = &b[4 + size as usize..];
    }
    Some(out)
}

pub static PROBE: AtomicUsize = AtomicUsize::new(0);

/// The broker process is alive, /stats answers, and a fresh consumer receives what a fresh
/// producer publishes (PUB and MPUB), with FIN accepted.
pub fn assert_serves(broker: &mut Broker, ctx: &str) {
    if let Ok(Some(status)) = broker.daemon.child.try_wait() {
        panic!(
            "{ctx}: the broker exited ({status}); log tail: {:?}",
            log_tail(broker)
        );
    }
    let t0 = Instant::now();
    let (code, _) = broker.http("GET", "/stats?format=json", b"");
    assert_eq!(code, 200, "{ctx}: /stats after the abuse");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "{ctx}: /stats took {:?}",
        t0.elapsed()
    );

    let topic = format!("probe_{}", PROBE.fetch_add(1, Ordering::SeqCst));
    let mut sub = v2(broker.tcp);
    sub.write_all(format!("SUB {topic} ch\n").as_bytes())
        .unwrap();
    expect_frame(&mut sub, 0, b"OK", &format!("{ctx}: probe SUB"));
    sub.write_all(b"RDY 10\n").unwrap();
    let mut producer = v2(broker.tcp);
    producer.write_all(&pub_cmd(&topic, b"probe one")).unwrap();
    expect_frame(&mut producer, 0, b"OK", &format!("{ctx}: probe PUB"));
    producer
        .write_all(&mpub_cmd(&topic, &[b"probe two", b"probe three"]))
        .unwrap();
    expect_frame(&mut producer, 0, b"OK", &format!("{ctx}: probe MPUB"));
    let mut got = Vec::new();
    for _ in 0..3 {
        let (ft, data) = read_frame_skip_hb(&mut sub)
            .unwrap_or_else(|e| panic!("{ctx}: probe consumer read failed: {e}"));
        assert_eq!(
            ft,
            2,
            "{ctx}: probe consumer expected a message, got {:?}",
            show(&data)
        );
        let (_, attempts, id, body) = parse_message(&data);
        assert_eq!(attempts, 1, "{ctx}: probe attempts");
        sub.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
        got.push(body);
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            b"probe one".to_vec(),
            b"probe three".to_vec(),
            b"probe two".to_vec()
        ]
    );
    // A NOP and a bad FIN (non-fatal) prove the consumer connection is still fine.
    sub.write_all(b"NOP\nFIN 0000000000000000\n").unwrap();
    expect_frame(
        &mut sub,
        1,
        b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight",
        &format!("{ctx}: probe FIN of an unknown id"),
    );
}

pub fn log_tail(broker: &Broker) -> Vec<String> {
    let log = broker.log.lock().unwrap();
    log.iter().rev().take(20).rev().cloned().collect()
}

/// Background producer/consumer pairs doing PUB -> receive -> FIN round trips until
/// `finish`. Each pair uses its own topic and a fresh pair of connections.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handles: Vec<thread::JoinHandle<()>>,
    ctx: String,
}

impl Traffic {
    pub fn start(addr: SocketAddr, pairs: usize, ctx: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for p in 0..pairs {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            let ctx = format!("{ctx}: background pair {p}");
            handles.push(thread::spawn(move || {
                traffic_loop(addr, p, stop, rounds, &ctx)
            }));
        }
        let t = Traffic {
            stop,
            rounds,
            handles,
            ctx: ctx.to_string(),
        };
        t.wait_progress(pairs as u64, "before the test");
        t
    }

    pub fn wait_progress(&self, n: u64, when: &str) {
        let start = self.rounds.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.rounds.load(Ordering::SeqCst) < start + n {
            if self.handles.iter().any(|h| h.is_finished()) || Instant::now() > deadline {
                self.stop.store(true, Ordering::SeqCst);
                panic!(
                    "{}: background traffic stalled {when} ({} rounds in total)",
                    self.ctx,
                    self.rounds.load(Ordering::SeqCst)
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Checks the pairs are still making progress, stops them, and propagates a failure.
    pub fn finish(mut self) -> u64 {
        let progressed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.wait_progress(self.handles.len() as u64 * 3, "after the abuse")
        }));
        self.stop.store(true, Ordering::SeqCst);
        for h in std::mem::take(&mut self.handles) {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        if let Err(e) = progressed {
            std::panic::resume_unwind(e);
        }
        self.rounds.load(Ordering::SeqCst)
    }
}

impl Drop for Traffic {
    /// When the test fails elsewhere, stop the pairs before the broker is killed so they
    /// do not add their own (misleading) failures.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in std::mem::take(&mut self.handles) {
            let _ = h.join();
        }
    }
}

pub fn traffic_loop(
    addr: SocketAddr,
    pair: usize,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    ctx: &str,
) {
    let topic = format!("background_{pair}");
    let mut consumer = v2(addr);
    consumer
        .write_all(format!("SUB {topic} ch\n").as_bytes())
        .unwrap();
    expect_frame(&mut consumer, 0, b"OK", &format!("{ctx}: SUB"));
    consumer.write_all(b"RDY 5\n").unwrap();
    let mut producer = v2(addr);
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let body = format!("{topic} round {i}");
        let t0 = Instant::now();
        producer
            .write_all(&pub_cmd(&topic, body.as_bytes()))
            .unwrap();
        expect_frame(&mut producer, 0, b"OK", &format!("{ctx}: PUB round {i}"));
        let (ft, data) = read_frame_skip_hb(&mut consumer)
            .unwrap_or_else(|e| panic!("{ctx}: consumer read in round {i} failed: {e}"));
        assert_eq!(
            ft,
            2,
            "{ctx}: round {i}: expected a message, got {:?}",
            show(&data)
        );
        let (_, attempts, id, got) = parse_message(&data);
        assert_eq!(got, body.as_bytes(), "{ctx}: round {i}: wrong body");
        assert_eq!(attempts, 1, "{ctx}: round {i}: attempts");
        consumer
            .write_all(format!("FIN {id}\n").as_bytes())
            .unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{ctx}: round {i} took {:?} (other clients must not be slowed down)",
            t0.elapsed()
        );
        rounds.fetch_add(1, Ordering::SeqCst);
        i += 1;
        thread::sleep(Duration::from_millis(3));
    }
}

pub fn be32(n: u32) -> [u8; 4] {
    n.to_be_bytes()
}

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Tiny deterministic PRNG (xorshift64*), so failures are reproducible.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// No truncated publish may have queued anything.
pub fn assert_nothing_published(broker: &Broker, topic: &str, ctx: &str) {
    let stats = broker.stats();
    for t in stats["topics"].as_array().into_iter().flatten() {
        if t["topic_name"] == topic {
            assert_eq!(
                t["message_count"], 0,
                "{ctx}: a truncated publish was queued: {t}"
            );
            for ch in t["channels"].as_array().into_iter().flatten() {
                assert_eq!(
                    ch["message_count"], 0,
                    "{ctx}: a truncated publish reached {ch}"
                );
            }
        }
    }
}
