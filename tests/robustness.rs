//! Bad input and hostile clients. Every test checks that the broker stays up and that
//! other clients are not affected: a background producer/consumer pair (`Traffic`) keeps
//! doing PUB -> message -> FIN round trips the whole time, and at the end a fresh
//! PUB/MPUB + SUB round trip and /stats must still work (`assert_serves`).
//!
//! Expected error frames are the exact upstream nsqd 1.3.0 texts (nsqd/protocol_v2.go and
//! nsqd/tcp.go); fatal errors are followed by the server closing the connection.

mod common;

use common::{
    identify_cmd, mpub_cmd, parse_message, pub_cmd, read_frame_skip_hb, sized, Broker, SHARD_COUNTS,
};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// helpers

/// A connection that has sent the `"  V2"` magic, from an address (usable in threads).
fn v2(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"  V2").unwrap();
    s
}

fn show(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    if s.len() > 300 {
        format!("{}...({} bytes)", &s[..300], data.len())
    } else {
        s.to_string()
    }
}

/// Reads one frame (skipping heartbeats) and asserts its type and data exactly.
fn expect_frame(s: &mut TcpStream, frame_type: i32, data: &[u8], ctx: &str) {
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
fn read_until_closed(s: &mut TcpStream, within: Duration, ctx: &str) -> Vec<u8> {
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
fn expect_closed_silently(s: &mut TcpStream, ctx: &str) {
    let rest = read_until_closed(s, Duration::from_secs(10), ctx);
    assert!(
        rest.is_empty(),
        "{ctx}: expected a close with no frame, got {:?}",
        show(&rest)
    );
}

/// A fatal error: exactly this error frame, then the connection is closed.
fn expect_fatal(s: &mut TcpStream, msg: &str, ctx: &str) {
    expect_frame(s, 1, msg.as_bytes(), ctx);
    expect_closed_silently(s, ctx);
}

/// Parses a byte stream into frames; `None` if it is not a whole number of valid frames.
fn split_frames(mut b: &[u8]) -> Option<Vec<(i32, Vec<u8>)>> {
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

fn proc_status_kb(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

static PROBE: AtomicUsize = AtomicUsize::new(0);

/// The broker process is alive, /stats answers, and a fresh consumer receives what a fresh
/// producer publishes (PUB and MPUB), with FIN accepted.
fn assert_serves(broker: &mut Broker, ctx: &str) {
    if let Ok(Some(status)) = broker.child.try_wait() {
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

fn log_tail(broker: &Broker) -> Vec<String> {
    let log = broker.log.lock().unwrap();
    log.iter().rev().take(20).rev().cloned().collect()
}

/// Background producer/consumer pairs doing PUB -> receive -> FIN round trips until
/// `finish`. Each pair uses its own topic and a fresh pair of connections.
struct Traffic {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    handles: Vec<thread::JoinHandle<()>>,
    ctx: String,
}

impl Traffic {
    fn start(addr: SocketAddr, pairs: usize, ctx: &str) -> Traffic {
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

    fn wait_progress(&self, n: u64, when: &str) {
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
    fn finish(mut self) -> u64 {
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

fn traffic_loop(
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

fn be32(n: u32) -> [u8; 4] {
    n.to_be_bytes()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Tiny deterministic PRNG (xorshift64*), so failures are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

// ------------------------------------------------------------------------------------
// bad magic

/// A wrong 4-byte magic gets exactly one error frame `E_BAD_PROTOCOL` (nsqd/tcp.go sends
/// only the code, no description) and then the connection is closed. Fewer than 4 bytes
/// then EOF: closed with nothing sent.
#[test]
fn bad_magic_gets_one_e_bad_protocol_frame_then_close() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let magics: [&[u8; 4]; 7] = [
            b"  V1",
            b"  V3",
            b"XXXX",
            b"V2  ",
            b"\0\0\0\0",
            b"  v2",
            b"PUB ",
        ];
        for magic in magics {
            let c = format!("{ctx}: magic {:?}", show(magic));
            let mut s = TcpStream::connect(broker.tcp).unwrap();
            s.write_all(magic).unwrap();
            let rest = read_until_closed(&mut s, Duration::from_secs(10), &c);
            assert_eq!(
                split_frames(&rest),
                Some(vec![(1, b"E_BAD_PROTOCOL".to_vec())]),
                "{c}: expected exactly one error frame E_BAD_PROTOCOL then close, got {:?}",
                show(&rest)
            );
        }
        for partial in [&b""[..], b" ", b"  V"] {
            let c = format!("{ctx}: partial magic {:?} then EOF", show(partial));
            let mut s = TcpStream::connect(broker.tcp).unwrap();
            s.write_all(partial).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            expect_closed_silently(&mut s, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    }
}

// ------------------------------------------------------------------------------------
// truncated frames

/// (bytes after the magic, frames expected before the close). Each is sent, then the
/// client half-closes its side (EOF), so the server's reply can still be read.
/// (name, bytes sent before the half-close, frames expected back).
type TruncatedCase = (&'static str, Vec<u8>, Vec<(i32, &'static str)>);

fn truncated_cases() -> Vec<TruncatedCase> {
    vec![
        ("half a command line", b"PUB trunc".to_vec(), vec![]),
        ("half a command word", b"SU".to_vec(), vec![]),
        (
            "PUB with half a size",
            cat(&[b"PUB trunc\n", &[0, 0]]),
            vec![(1, "E_BAD_MESSAGE PUB failed to read message body size")],
        ),
        (
            "PUB with a cut-off body",
            cat(&[b"PUB trunc\n", &be32(100), &[b'x'; 50]]),
            vec![(1, "E_BAD_MESSAGE PUB failed to read message body")],
        ),
        (
            "DPUB with a cut-off body",
            cat(&[b"DPUB trunc 0\n", &be32(10), b"abc"]),
            vec![(1, "E_BAD_MESSAGE DPUB failed to read message body")],
        ),
        (
            "MPUB with half a size",
            cat(&[b"MPUB trunc\n", &[0, 0, 0]]),
            vec![(1, "E_BAD_BODY MPUB failed to read body size")],
        ),
        (
            "MPUB with half a count",
            cat(&[b"MPUB trunc\n", &be32(100), &[0, 0]]),
            vec![(1, "E_BAD_BODY MPUB failed to read message count")],
        ),
        (
            "MPUB cut in the second message size",
            cat(&[
                b"MPUB trunc\n",
                &be32(100),
                &be32(2),
                &sized(b"hello"),
                &[0],
            ]),
            vec![(1, "E_BAD_MESSAGE MPUB failed to read message(1) body size")],
        ),
        (
            "MPUB cut in a message body",
            cat(&[b"MPUB trunc\n", &be32(100), &be32(2), &be32(5), b"hel"]),
            vec![(1, "E_BAD_MESSAGE MPUB failed to read message body")],
        ),
        (
            "IDENTIFY with half a size",
            cat(&[b"IDENTIFY\n", &[0]]),
            vec![(1, "E_BAD_BODY IDENTIFY failed to read body size")],
        ),
        (
            "IDENTIFY with a cut-off body",
            cat(&[b"IDENTIFY\n", &be32(50), b"{\"client_id\""]),
            vec![(1, "E_BAD_BODY IDENTIFY failed to read body")],
        ),
        (
            "AUTH with a cut-off body",
            cat(&[b"AUTH\n", &be32(20), b"sec"]),
            vec![(1, "E_BAD_BODY AUTH failed to read body")],
        ),
        (
            "a complete PUB then EOF",
            pub_cmd("trunc_complete", b"whole"),
            vec![(0, "OK")],
        ),
        (
            "SUB then half a RDY line",
            b"SUB trunc ch\nRDY 1".to_vec(),
            vec![(0, "OK")],
        ),
        (
            "IDENTIFY then a cut-off PUB",
            cat(&[&identify_cmd("{}"), b"PUB trunc\n", &be32(4), b"ab"]),
            vec![
                (0, "OK"),
                (1, "E_BAD_MESSAGE PUB failed to read message body"),
            ],
        ),
    ]
}

/// No truncated publish may have queued anything.
fn assert_nothing_published(broker: &Broker, topic: &str, ctx: &str) {
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

/// Each truncated command followed by EOF (half-close): the server answers with the exact
/// "failed to read" error (or nothing, for a cut command line) and closes.
#[test]
fn truncated_commands_then_eof_get_exact_errors() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        for (name, bytes, frames) in truncated_cases() {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&bytes).unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            for (ft, data) in &frames {
                expect_frame(&mut s, *ft, data.as_bytes(), &c);
            }
            expect_closed_silently(&mut s, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "trunc", &ctx);
    }
}

/// The same truncated commands, but the client just closes the socket (several times
/// each, with and without the rest unread): the broker must not crash or leak the
/// connection, and nothing may be published.
#[test]
fn truncated_commands_then_abrupt_close() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.child.id();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let fds_before = fd_count(pid);
        for round in 0..20 {
            for (_, bytes, _) in truncated_cases() {
                let mut s = v2(broker.tcp);
                s.write_all(&bytes).unwrap();
                if round % 2 == 1 {
                    thread::sleep(Duration::from_millis(1));
                }
                drop(s);
            }
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "trunc", &ctx);
        // Every aborted connection is cleaned up (no fd leak).
        let deadline = Instant::now() + Duration::from_secs(10);
        while fd_count(pid) > fds_before + 20 {
            assert!(
                Instant::now() < deadline,
                "{ctx}: broker fds {} -> {} after 280 aborted connections",
                fds_before,
                fd_count(pid)
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Whatever follows a fatal error on the same connection is never executed: the
/// connection is closed right after the error frame, even when the rejected command's
/// "body" (which the server does not read) contains a well-formed PUB.
#[test]
fn commands_pipelined_after_a_fatal_error_are_not_executed() {
    let smuggled = pub_cmd("smuggled", b"must not be published");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bad topic",
            cat(&[b"PUB bad!topic\n", &smuggled]),
            "E_BAD_TOPIC PUB topic name \"bad!topic\" is not valid",
        ),
        (
            "invalid command",
            cat(&[b"BOGUS\n", &smuggled]),
            "E_INVALID invalid command BOGUS",
        ),
        (
            "too-big PUB whose body is a PUB",
            cat(&[b"PUB smuggled\n", &be32(2_000_000), &smuggled]),
            "E_BAD_MESSAGE PUB message too big 2000000 > 1048576",
        ),
        (
            "too-big MPUB whose body is a PUB",
            cat(&[b"MPUB smuggled\n", &be32(6_000_000), &smuggled]),
            "E_BAD_BODY MPUB body too big 6000000 > 5242880",
        ),
        (
            "too-big IDENTIFY whose body is a PUB",
            cat(&[b"IDENTIFY\n", &be32(6_000_000), &smuggled]),
            "E_BAD_BODY IDENTIFY body too big 6000000 > 5242880",
        ),
        (
            "RDY before SUB",
            cat(&[b"RDY 1\n", &smuggled]),
            "E_INVALID cannot RDY in current state",
        ),
        (
            "empty PUB body",
            cat(&[b"PUB smuggled\n", &be32(0), &smuggled]),
            "E_BAD_MESSAGE PUB invalid message body size 0",
        ),
    ];
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        for (name, bytes, expected) in &cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(bytes).unwrap();
            // The rest of the bytes may be unread at close, so a reset can replace the EOF
            // (read_until_closed accepts both), but the error frame comes first.
            expect_frame(&mut s, 1, expected.as_bytes(), &c);
            let rest = read_until_closed(&mut s, Duration::from_secs(10), &c);
            assert!(
                rest.is_empty(),
                "{c}: frames after the fatal error: {:?}",
                show(&rest)
            );
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "smuggled", &ctx);
    }
}

// ------------------------------------------------------------------------------------
// huge and bad size fields

/// Size fields of 1 GiB (and other absurd values) must be rejected from the 4 header
/// bytes alone: exact error, connection closed, nothing allocated for the body.
#[test]
fn huge_size_fields_are_rejected_without_allocating() {
    const GIB: u32 = 1 << 30;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "PUB 1 GiB",
            cat(&[b"PUB huge\n", &be32(GIB)]),
            "E_BAD_MESSAGE PUB message too big 1073741824 > 1048576",
        ),
        (
            "PUB i32::MAX",
            cat(&[b"PUB huge\n", &be32(i32::MAX as u32)]),
            "E_BAD_MESSAGE PUB message too big 2147483647 > 1048576",
        ),
        (
            "PUB size -1",
            cat(&[b"PUB huge\n", &be32(u32::MAX)]),
            "E_BAD_MESSAGE PUB invalid message body size -1",
        ),
        (
            "PUB size i32::MIN",
            cat(&[b"PUB huge\n", &be32(0x8000_0000)]),
            "E_BAD_MESSAGE PUB invalid message body size -2147483648",
        ),
        (
            "DPUB 1 GiB",
            cat(&[b"DPUB huge 10\n", &be32(GIB)]),
            "E_BAD_MESSAGE DPUB message too big 1073741824 > 1048576",
        ),
        (
            "MPUB 1 GiB",
            cat(&[b"MPUB huge\n", &be32(GIB)]),
            "E_BAD_BODY MPUB body too big 1073741824 > 5242880",
        ),
        (
            "MPUB size -1",
            cat(&[b"MPUB huge\n", &be32(u32::MAX)]),
            "E_BAD_BODY MPUB invalid body size -1",
        ),
        (
            "MPUB count 1 Gi",
            cat(&[b"MPUB huge\n", &be32(100), &be32(GIB)]),
            "E_BAD_BODY MPUB invalid message count 1073741824",
        ),
        (
            "MPUB count -1",
            cat(&[b"MPUB huge\n", &be32(100), &be32(u32::MAX)]),
            "E_BAD_BODY MPUB invalid message count -1",
        ),
        (
            "MPUB element 1 GiB",
            cat(&[
                b"MPUB huge\n",
                &be32(100),
                &be32(2),
                &sized(b"ok"),
                &be32(GIB),
            ]),
            "E_BAD_MESSAGE MPUB message too big 1073741824 > 1048576",
        ),
        (
            "IDENTIFY 1 GiB",
            cat(&[b"IDENTIFY\n", &be32(GIB)]),
            "E_BAD_BODY IDENTIFY body too big 1073741824 > 5242880",
        ),
        (
            "IDENTIFY size -1",
            cat(&[b"IDENTIFY\n", &be32(u32::MAX)]),
            "E_BAD_BODY IDENTIFY invalid body size -1",
        ),
        (
            "AUTH 1 GiB",
            cat(&[b"AUTH\n", &be32(GIB)]),
            "E_BAD_BODY AUTH body too big 1073741824 > 5242880",
        ),
    ];
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.child.id();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let vm_peak_before = proc_status_kb(pid, "VmPeak:");
        let hwm_before = proc_status_kb(pid, "VmHWM:");
        for (name, bytes, expected) in &cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(bytes).unwrap();
            let t0 = Instant::now();
            expect_fatal(&mut s, expected, &c);
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "{c}: took {:?}",
                t0.elapsed()
            );
        }
        // 16 at once, each left open: an implementation that allocates before checking
        // would map 16 GiB here.
        let mut conns: Vec<TcpStream> = (0..16)
            .map(|_| {
                let mut s = v2(broker.tcp);
                s.write_all(&cat(&[b"PUB huge\n", &be32(GIB)])).unwrap();
                s
            })
            .collect();
        for s in &mut conns {
            expect_fatal(
                s,
                "E_BAD_MESSAGE PUB message too big 1073741824 > 1048576",
                &format!("{ctx}: concurrent PUB 1 GiB"),
            );
        }
        let vm_peak_after = proc_status_kb(pid, "VmPeak:");
        let hwm_after = proc_status_kb(pid, "VmHWM:");
        eprintln!(
            "{ctx}: VmPeak {vm_peak_before} -> {vm_peak_after} kB, VmHWM {hwm_before} -> \
             {hwm_after} kB"
        );
        assert!(
            vm_peak_after < vm_peak_before + 1_000_000,
            "{ctx}: VmPeak grew by {} kB: a body buffer was allocated from the size field",
            vm_peak_after - vm_peak_before
        );
        assert!(
            hwm_after < hwm_before + 256 * 1024,
            "{ctx}: peak RSS grew by {} kB",
            hwm_after - hwm_before
        );
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        assert_nothing_published(&broker, "huge", &ctx);
    }
}

// ------------------------------------------------------------------------------------
// bodies over the configured limits

/// With --max-msg-size=100 --max-body-size=1000 (the upstream test values), bodies over
/// the limit (sent in full) are rejected with the exact errors; exactly the limit works.
#[test]
fn bodies_over_the_configured_limits() {
    let m100 = [b'm'; 100];
    let m101 = [b'm'; 101];
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &["--max-msg-size=100", "--max-body-size=1000"]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        let mut s = v2(broker.tcp);
        s.write_all(&pub_cmd("limits", &m100)).unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: PUB of exactly max-msg-size"),
        );
        s.write_all(&mpub_cmd("limits", &[&m100[..]; 5])).unwrap();
        expect_frame(&mut s, 0, b"OK", &format!("{ctx}: MPUB 5x100"));
        // 4 + 9 * 104 + 60 = 1000 bytes: exactly max-body-size.
        let mut nine: Vec<&[u8]> = vec![&m100; 9];
        let last = [b'l'; 56];
        nine.push(&last);
        s.write_all(&mpub_cmd("limits", &nine)).unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: MPUB of exactly max-body-size"),
        );

        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "PUB 101 > 100",
                pub_cmd("limits", &m101),
                "E_BAD_MESSAGE PUB message too big 101 > 100",
            ),
            (
                "DPUB 101 > 100",
                cat(&[b"DPUB limits 100\n", &sized(&m101)]),
                "E_BAD_MESSAGE DPUB message too big 101 > 100",
            ),
            (
                "MPUB 11x100",
                mpub_cmd("limits", &[&m100[..]; 11]),
                "E_BAD_BODY MPUB body too big 1148 > 1000",
            ),
            (
                "MPUB 5x101",
                mpub_cmd("limits", &[&m101[..]; 5]),
                "E_BAD_MESSAGE MPUB message too big 101 > 100",
            ),
            (
                "MPUB 5x100 + empty",
                mpub_cmd("limits", &[&m100, &m100, &m100, &m100, &m100, b""]),
                "E_BAD_MESSAGE MPUB invalid message(5) body size 0",
            ),
            (
                "IDENTIFY 1001 > 1000",
                identify_cmd(&format!("{{\"client_id\":\"{}\"}}", "c".repeat(1001 - 16))),
                "E_BAD_BODY IDENTIFY body too big 1001 > 1000",
            ),
            (
                "PUB empty",
                pub_cmd("limits", b""),
                "E_BAD_MESSAGE PUB invalid message body size 0",
            ),
        ];
        for (name, bytes, expected) in cases {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&bytes).unwrap();
            expect_fatal(&mut s, expected, &c);
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        // Only the accepted publishes count: 1 + 5 + 10 = 16 (the MPUB 5x101 and the
        // 5x100 + empty batch are all-or-nothing).
        let stats = broker.stats();
        let t = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic_name"] == "limits")
            .cloned()
            .unwrap_or_default();
        assert_eq!(t["message_count"], 16, "{ctx}: topic limits: {t}");
    }
}

/// With the default --max-msg-size (1 MiB): the full body of a too-big PUB is actually
/// sent. The server rejects it from the size field, closes, and is not disturbed by the
/// rest of the body still arriving.
#[test]
fn body_longer_than_default_max_msg_size() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        // Exactly the max is accepted.
        let mut s = v2(broker.tcp);
        s.write_all(&pub_cmd("big", &vec![b'b'; 1_048_576]))
            .unwrap();
        expect_frame(
            &mut s,
            0,
            b"OK",
            &format!("{ctx}: PUB of exactly 1048576 bytes"),
        );

        for _ in 0..3 {
            let mut s = v2(broker.tcp);
            let mut w = s.try_clone().unwrap();
            let writer = thread::spawn(move || {
                // The server may close before the body is in: ignore write errors.
                let _ = w.write_all(&pub_cmd("big", &vec![b'b'; 1_048_577 + 3_000_000]));
            });
            let got = read_until_closed(&mut s, Duration::from_secs(10), &ctx);
            // The error frame may be lost to a reset (unread body data at close); if it
            // arrived, it must be the exact one.
            if !got.is_empty() {
                assert_eq!(
                    split_frames(&got),
                    Some(vec![(
                        1,
                        b"E_BAD_MESSAGE PUB message too big 4048577 > 1048576".to_vec()
                    )]),
                    "{ctx}: reply to a 4 MB PUB: {:?}",
                    show(&got)
                );
            }
            writer.join().unwrap();
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        let stats = broker.stats();
        let t = stats["topics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["topic_name"] == "big")
            .cloned()
            .unwrap_or_default();
        assert_eq!(t["message_count"], 1, "{ctx}: topic big: {t}");
    }
}

// ------------------------------------------------------------------------------------
// long command lines

/// A command line longer than the 16 KiB read buffer: the connection is closed (upstream
/// sends no error frame; if one is sent it must at least be an error frame). A line that
/// fits exactly (16384 bytes with the newline) is processed normally.
#[test]
fn command_line_longer_than_read_buffer() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        // Fits: "PUB " + 16379 + "\n" = 16384 bytes. The name is too long, so E_BAD_TOPIC.
        let name = "a".repeat(16379);
        let mut s = v2(broker.tcp);
        s.write_all(format!("PUB {name}\n").as_bytes()).unwrap();
        expect_fatal(
            &mut s,
            &format!("E_BAD_TOPIC PUB topic name \"{name}\" is not valid"),
            &format!("{ctx}: a 16384-byte line"),
        );

        // A 10000-byte line after a normal command on the same connection.
        let mut s = v2(broker.tcp);
        s.write_all(b"NOP\n").unwrap();
        let name = "b".repeat(10000);
        s.write_all(format!("SUB {name} ch\n").as_bytes()).unwrap();
        expect_fatal(
            &mut s,
            &format!("E_BAD_TOPIC SUB topic name \"{name}\" is not valid"),
            &format!("{ctx}: a 10000-byte SUB line"),
        );

        let too_long: Vec<(&str, Vec<u8>)> = vec![
            (
                "20000-byte PUB line",
                format!("PUB {}\n", "a".repeat(20000)).into_bytes(),
            ),
            (
                "16385-byte line",
                format!("PUB {}\n", "a".repeat(16380)).into_bytes(),
            ),
            ("64 KiB without a newline", vec![b'N'; 65536]),
            ("1 MiB without a newline", vec![b'x'; 1 << 20]),
            (
                "long line after a good command",
                format!("NOP\nPUB {}\n", "z".repeat(40000)).into_bytes(),
            ),
        ];
        for (name, bytes) in too_long {
            let c = format!("{ctx}: {name}");
            let mut s = v2(broker.tcp);
            let mut w = s.try_clone().unwrap();
            let writer = thread::spawn(move || {
                let _ = w.write_all(&bytes);
            });
            let got = read_until_closed(&mut s, Duration::from_secs(10), &c);
            match split_frames(&got) {
                Some(frames) => assert!(
                    frames.iter().all(|(ft, _)| *ft == 1),
                    "{c}: only an error frame may precede the close, got {:?}",
                    show(&got)
                ),
                None => panic!("{c}: garbage before the close: {:?}", show(&got)),
            }
            writer.join().unwrap();
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    }
}

// ------------------------------------------------------------------------------------
// malformed content

/// Garbage after the magic, an empty command line, absurd JSON: exact errors where
/// upstream has one, a close in every case, and no crash (e.g. no stack overflow on
/// deeply nested JSON).
#[test]
fn garbage_and_malformed_commands() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let traffic = Traffic::start(broker.tcp, 2, &ctx);

        let mut s = v2(broker.tcp);
        s.write_all(b"\n\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command ",
            &format!("{ctx}: empty line"),
        );

        let mut s = v2(broker.tcp);
        s.write_all(b"ASDF\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command ASDF",
            &format!("{ctx}: ASDF"),
        );

        let mut s = v2(broker.tcp);
        s.write_all(b"pub lower\n").unwrap();
        expect_fatal(
            &mut s,
            "E_INVALID invalid command pub",
            &format!("{ctx}: lowercase"),
        );

        // Deep nesting under an unknown key. Upstream (Go encoding/json, max depth 10000)
        // rejects it; the spec only says unknown keys are ignored, so accept either the
        // decode error or OK, as long as the broker neither crashes nor hangs.
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let mut s = v2(broker.tcp);
        s.write_all(&identify_cmd(&deep)).unwrap();
        let (ft, data) = read_frame_skip_hb(&mut s)
            .unwrap_or_else(|e| panic!("{ctx}: IDENTIFY with 100000-deep JSON: {e}"));
        assert!(
            (ft, data.as_slice()) == (0, b"OK")
                || (ft, data.as_slice()) == (1, b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
            "{ctx}: IDENTIFY with 100000-deep JSON under an unknown key: {:?}",
            show(&data)
        );
        drop(s);

        let bad_json: Vec<(&str, String)> = vec![
            (
                "a 100000-deep top-level array",
                format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            ),
            ("an unterminated deep array", "[".repeat(500_000)),
            ("a JSON array", "[1,2,3]".to_string()),
            ("not JSON", "hello".to_string()),
            (
                "a float for an int field",
                "{\"heartbeat_interval\":1.5}".to_string(),
            ),
            (
                "a string for a bool field",
                "{\"feature_negotiation\":\"yes\"}".to_string(),
            ),
            (
                "a huge number",
                format!("{{\"msg_timeout\":{}}}", "9".repeat(5000)),
            ),
        ];
        for (name, body) in bad_json {
            let c = format!("{ctx}: IDENTIFY with {name}");
            let mut s = v2(broker.tcp);
            s.write_all(&identify_cmd(&body)).unwrap();
            expect_fatal(&mut s, "E_BAD_BODY IDENTIFY failed to decode JSON body", &c);
        }

        // Random bytes after the magic: every connection must be closed by the server.
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ shards as u64);
        for i in 0..200 {
            let len = 1 + (rng.next() % 8192) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let c = format!("{ctx}: random garbage #{i} ({len} bytes)");
            let mut s = v2(broker.tcp);
            let _ = s.write_all(&bytes);
            // Most garbage has no newline for a while; EOF ends any pending read.
            let _ = s.shutdown(Shutdown::Write);
            let got = read_until_closed(&mut s, Duration::from_secs(10), &c);
            if let Some(frames) = split_frames(&got) {
                assert!(
                    frames.len() <= 1,
                    "{c}: more than one frame: {:?}",
                    show(&got)
                );
            }
        }
        traffic.finish();
        assert_serves(&mut broker, &ctx);
    }
}

// ------------------------------------------------------------------------------------
// many aborted connections

/// 10,000 connections opened and dropped in every kind of half-finished state, from 8
/// threads, 25 open at a time per thread. Then the broker still serves, every connection
/// has been cleaned up (fd count back near the start, no subscribed ghosts), and the
/// background pairs never stalled.
#[test]
fn ten_thousand_connections_dropped_mid_command() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 1250;
    const BATCH: usize = 25;
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.child.id();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let fds_before = fd_count(pid);
        let addr = broker.tcp;
        let t0 = Instant::now();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                thread::spawn(move || {
                    let mut open = Vec::with_capacity(BATCH);
                    for i in 0..PER_THREAD {
                        let mut s = match TcpStream::connect(addr) {
                            Ok(s) => s,
                            Err(e) => panic!("thread {t}: connect #{i} failed: {e}"),
                        };
                        let bytes: Vec<u8> = match (i + t) % 9 {
                            0 => vec![],
                            1 => b"  V".to_vec(),
                            2 => b"  V2".to_vec(),
                            3 => b"  V2PUB abort".to_vec(),
                            4 => cat(&[b"  V2PUB abort\n", &be32(100), &[b'x'; 10]]),
                            5 => cat(&[b"  V2IDENTIFY\n", &be32(60), b"{\"client_id\":\"x\""]),
                            6 => b"  V2SUB abort ch\nRDY 10\n".to_vec(),
                            7 => cat(&[b"  V2MPUB abort\n", &be32(100), &be32(3), &sized(b"a")]),
                            _ => cat(&[b"  V2", &identify_cmd("{\"feature_negotiation\":true}")]),
                        };
                        // The server may already have closed (e.g. bad magic): ignore.
                        let _ = s.write_all(&bytes);
                        open.push(s);
                        if open.len() == BATCH {
                            open.clear();
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        eprintln!("{ctx}: 10000 aborted connections in {:?}", t0.elapsed());
        traffic.finish();
        assert_serves(&mut broker, &ctx);

        // All of them are cleaned up.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let fds = fd_count(pid);
            let stats = broker.stats();
            let ghosts: u64 = stats["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["topic_name"] == "abort")
                .flat_map(|t| t["channels"].as_array().cloned().unwrap_or_default())
                .map(|c| c["client_count"].as_u64().unwrap_or(0))
                .sum();
            if fds <= fds_before + 50 && ghosts == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: 15 s after the storm the broker still has {fds} fds (started with \
                 {fds_before}) and {ghosts} clients subscribed to abort/ch"
            );
            thread::sleep(Duration::from_millis(200));
        }
        assert_nothing_published(&broker, "abort", &ctx);
    }
}

// ------------------------------------------------------------------------------------
// clients that never read

/// Consumers subscribe with RDY 2500 and then never read their sockets while a producer
/// publishes 50 MB (5000 x 10 KB, MPUB batches of 100). The producer gets every OK, a
/// consumer on another channel of the same topic gets every message, /stats keeps
/// answering, the stuck channel accounts for every message (depth + in-flight = 5000,
/// in-flight <= 2500 per client), and the broker's RSS does not grow without bound.
#[test]
fn consumer_that_never_reads_does_not_block_others() {
    const MSGS: usize = 5000;
    const SIZE: usize = 10 * 1024;
    const BATCH: usize = 100;
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.child.id();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let rss_before = proc_status_kb(pid, "VmRSS:");

        // Three of them on one channel (so that, whatever the shard hashing, some are
        // likely to share a shard with the producer, the other consumer or the topic).
        let stuck: Vec<TcpStream> = (0..3)
            .map(|_| {
                let mut s = v2(broker.tcp);
                s.write_all(b"SUB flood stuck\n").unwrap();
                expect_frame(&mut s, 0, b"OK", &format!("{ctx}: stuck SUB"));
                s.write_all(b"RDY 2500\n").unwrap();
                // ... and never read from it again.
                s
            })
            .collect();

        let mut fast = v2(broker.tcp);
        fast.write_all(b"SUB flood fast\n").unwrap();
        expect_frame(&mut fast, 0, b"OK", &format!("{ctx}: fast SUB"));
        fast.write_all(b"RDY 500\n").unwrap();
        let fast_ctx = ctx.clone();
        let fast_reader = thread::spawn(move || {
            let mut seen = vec![false; MSGS];
            let mut count = 0;
            while count < MSGS {
                let (ft, data) = read_frame_skip_hb(&mut fast).unwrap_or_else(|e| {
                    panic!("{fast_ctx}: fast consumer read failed after {count}: {e}")
                });
                assert_eq!(ft, 2, "{fast_ctx}: fast consumer got {:?}", show(&data));
                let (_, _, id, body) = parse_message(&data);
                assert_eq!(body.len(), SIZE, "{fast_ctx}: body size");
                let n: usize = String::from_utf8_lossy(&body[..8]).trim().parse().unwrap();
                assert!(!seen[n], "{fast_ctx}: message {n} delivered twice");
                seen[n] = true;
                count += 1;
                fast.write_all(format!("FIN {id}\n").as_bytes()).unwrap();
            }
            count
        });

        let mut producer = v2(broker.tcp);
        let t0 = Instant::now();
        let mut max_stats = Duration::ZERO;
        for b in 0..MSGS / BATCH {
            let bodies: Vec<Vec<u8>> = (0..BATCH)
                .map(|k| {
                    let mut body = format!("{:<8}", b * BATCH + k).into_bytes();
                    body.resize(SIZE, b'f');
                    body
                })
                .collect();
            let refs: Vec<&[u8]> = bodies.iter().map(|v| v.as_slice()).collect();
            producer.write_all(&mpub_cmd("flood", &refs)).unwrap();
            expect_frame(&mut producer, 0, b"OK", &format!("{ctx}: MPUB batch {b}"));
            if b % 10 == 0 {
                let t = Instant::now();
                let (code, _) = broker.http("GET", "/stats?format=json", b"");
                assert_eq!(code, 200, "{ctx}: /stats during the flood");
                max_stats = max_stats.max(t.elapsed());
            }
        }
        let publish_time = t0.elapsed();
        let got = fast_reader
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        eprintln!(
            "{ctx}: published 50 MB in {publish_time:?}, fast consumer done after {:?}, \
             slowest /stats {max_stats:?}",
            t0.elapsed()
        );
        assert_eq!(got, MSGS);
        assert!(
            max_stats < Duration::from_secs(3),
            "{ctx}: /stats took {max_stats:?}"
        );

        // The stuck channel: nothing lost, RDY respected.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = broker.stats();
            let ch = stats["topics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["topic_name"] == "flood")
                .flat_map(|t| t["channels"].as_array().cloned().unwrap_or_default())
                .find(|c| c["channel_name"] == "stuck")
                .unwrap_or_else(|| panic!("{ctx}: channel flood/stuck missing"));
            let in_flight = ch["in_flight_count"].as_u64().unwrap_or(u64::MAX);
            let depth = ch["depth"].as_u64().unwrap_or(u64::MAX);
            assert!(
                in_flight <= 3 * 2500,
                "{ctx}: stuck in_flight {in_flight} > 3 x RDY 2500"
            );
            for c in ch["clients"].as_array().into_iter().flatten() {
                let n = c["in_flight_count"].as_u64().unwrap_or(0);
                assert!(
                    n <= 2500,
                    "{ctx}: a stuck client has {n} in flight > RDY 2500: {c}"
                );
            }
            if in_flight + depth == MSGS as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: stuck channel depth {depth} + in_flight {in_flight} != {MSGS}: {ch}"
            );
            thread::sleep(Duration::from_millis(100));
        }

        let rss_after = proc_status_kb(pid, "VmRSS:");
        eprintln!("{ctx}: RSS {rss_before} kB -> {rss_after} kB");
        // 50 MB of payload, held at most once per channel, plus buffers: 400 MB is
        // generous; unbounded per-client buffering would blow through it.
        assert!(
            rss_after < rss_before + 400 * 1024,
            "{ctx}: RSS grew from {rss_before} kB to {rss_after} kB"
        );

        traffic.finish();
        assert_serves(&mut broker, &ctx);
        drop(stuck);
        thread::sleep(Duration::from_millis(200));
        assert_serves(
            &mut broker,
            &format!("{ctx}: after the stuck consumer left"),
        );
    }
}

/// A client that pipelines commands and never reads the replies: 400,000 IDENTIFYs
/// with feature negotiation (each answered by a ~270-byte JSON frame, so up to 108 MB of
/// replies). Once its socket buffers are full the broker may stop reading from it, but it
/// must not buffer the replies without bound, and other clients must not notice.
#[test]
fn client_that_never_reads_replies_does_not_block_others() {
    for shards in SHARD_COUNTS {
        let ctx = format!("shards={shards}");
        let mut broker = Broker::start(shards, &[]);
        let pid = broker.child.id();
        let traffic = Traffic::start(broker.tcp, 2, &ctx);
        let rss_before = proc_status_kb(pid, "VmRSS:");

        let flooder = v2(broker.tcp);
        flooder
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut w = flooder.try_clone().unwrap();
        let writer = thread::spawn(move || {
            let one = identify_cmd("{\"feature_negotiation\":true}");
            let chunk: Vec<u8> = (0..1000).flat_map(|_| one.clone()).collect();
            let mut sent = 0usize;
            // Stops when the broker has not read anything for 2 s (write timeout).
            for _ in 0..400 {
                if w.write_all(&chunk).is_err() {
                    break;
                }
                sent += 1000;
            }
            sent
        });
        // While the flood is going on, other clients work.
        thread::sleep(Duration::from_millis(500));
        assert_serves(&mut broker, &format!("{ctx}: during the flood"));
        let sent = writer.join().unwrap();
        let rss_after = proc_status_kb(pid, "VmRSS:");
        eprintln!("{ctx}: pipelined {sent} IDENTIFYs; RSS {rss_before} kB -> {rss_after} kB");
        assert!(
            rss_after < rss_before + 64 * 1024,
            "{ctx}: RSS grew from {rss_before} kB to {rss_after} kB: replies to a client \
             that does not read are buffered without bound"
        );
        traffic.finish();
        assert_serves(&mut broker, &ctx);
        drop(flooder);
        thread::sleep(Duration::from_millis(200));
        assert_serves(&mut broker, &format!("{ctx}: after the flooder left"));
    }
}
