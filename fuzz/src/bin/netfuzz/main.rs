//! Network fuzzing of the running broker (RELIABILITY.md, "Network fuzzing of the running broker").
//!
//!   netfuzz [--shards 1,2,4] [--duration SECS] [--seed N] [--clients N] [--rate MSGS/S]
//!           [--nsqd PATH]
//!   netfuzz --tcp HOST:PORT --http HOST:PORT [--pid PID] [--duration SECS] ...
//!
//! The second form fuzzes a broker that is already running (its RSS sampled when `--pid`
//! is given; the janitor deletes only topics that did not exist at the start; the
//! broker is left running).
//!
//! For each shard count: starts `nsqd` (the binary next to this one, `--nsqd` or
//! `NSQD_BIN`) on loopback ports with a fresh data path and `--msg-timeout=300s`, then for
//! `--duration` seconds
//! * `--clients` fuzz threads open connection after connection and send mutated valid
//!   sessions: V2 (magic, IDENTIFY with JSON, SUB, RDY, PUB, MPUB, DPUB, FIN, REQ, TOUCH,
//!   NOP, CLS, AUTH; they FIN/REQ/TOUCH the messages they get) and HTTP/1.1 keep-alive
//!   (/pub, /mpub text and binary, chunked bodies, /stats, /topic/..., /channel/...,
//!   /ping, /info), mutated by byte flips, the smoke fuzzer's mutator, truncation, splices
//!   of two sessions and huge size fields (V2 sizes, Content-Length), and delivered whole,
//!   in small pieces, or dripped one byte at a time with pauses, some closed abruptly
//!   mid-frame; all deterministic from `--seed` (thread scheduling aside);
//! * a checker publishes unique bodies (PUB and MPUB, `--rate` a second) to topic
//!   `netfuzz-check` on its own connection and consumes channels `c0` and `c1` (two
//!   consumers each, FIN every message);
//! * a janitor deletes every other topic every 10 s (what the fuzz clients create), so
//!   that memory measures leaks rather than queued fuzz messages;
//! * the broker's VmRSS is sampled every second.
//!
//! Then it stops the fuzz clients and the publisher, waits (30 s at most) until both
//! channels got every acknowledged message, and checks: the broker is alive, `/ping`
//! answers `OK`, no panic or FATAL in its log, every checker message was delivered
//! exactly once to each channel (no loss, no duplicate, nothing unknown), the checker
//! never waited over 10 s for a reply, SIGTERM ends it with status 0, and (runs of 90 s
//! or more) the RSS after the first minute stays within 10 % of its value at 60 s.
//! Exit status 1 on any failure.
#![allow(
    clippy::unwrap_used,
    reason = "fuzzing and chaos tools: a panic is a reported failure of the run"
)]
#![forbid(unsafe_code)]

use nsq_fuzz::mutate::{mutate, Rng};
use nsq_fuzz::net::{self, Broker, Stop};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const CHECK_TOPIC: &str = "netfuzz-check";
const CHANNELS: [&str; 2] = ["c0", "c1"];
const KINDS: [&str; 9] = [
    "plain",
    "flip",
    "mutate",
    "truncate",
    "splice",
    "huge-size",
    "drip",
    "close-mid-frame",
    "chunks",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("usage: netfuzz [--shards 1,2,4] [--duration SECS] [--seed N] [--clients N] [--rate MSGS/S] [--nsqd PATH]\n       netfuzz --tcp HOST:PORT --http HOST:PORT [--pid PID] [--duration SECS] ...   (a running broker)");
        return;
    }
    let shards = net::shards_arg(&args, "1");
    let duration = Duration::from_secs_f64(net::num_arg(&args, "--duration", 60.0));
    let seed: u64 = net::num_arg(
        &args,
        "--seed",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1),
    );
    let clients: usize = net::num_arg(&args, "--clients", 8);
    let rate: u64 = net::num_arg(&args, "--rate", 200);
    let nsqd = net::arg(&args, "--nsqd")
        .map(PathBuf::from)
        .unwrap_or_else(net::default_nsqd);
    eprintln!(
        "netfuzz: seed {seed}, shards {shards:?}, {:?} each, {clients} fuzz clients, checker {rate} msgs/s, broker {}",
        duration,
        nsqd.display()
    );
    // A running broker instead (its RSS sampled when --pid is given).
    let connect = match (net::arg(&args, "--tcp"), net::arg(&args, "--http")) {
        (Some(t), Some(h)) => {
            let parse = |v: &str| -> SocketAddr {
                v.parse().unwrap_or_else(|_| {
                    eprintln!("not an address: {v}");
                    std::process::exit(2)
                })
            };
            let pid = net::arg(&args, "--pid").and_then(|p| p.parse().ok());
            Some((parse(&t), parse(&h), pid))
        }
        (None, None) => None,
        _ => {
            eprintln!("--tcp and --http go together");
            std::process::exit(2)
        }
    };
    let shards = if connect.is_some() { vec![0] } else { shards };
    let mut failed = false;
    for (i, &n) in shards.iter().enumerate() {
        let cfg = Config {
            nsqd: nsqd.clone(),
            shards: n,
            duration,
            seed: seed.wrapping_add(i as u64 * 1_000_003),
            clients,
            rate,
            connect,
        };
        let label = cfg.label();
        match run(&cfg) {
            Ok(()) => eprintln!("netfuzz {label}: PASS"),
            Err(e) => {
                eprintln!("netfuzz {label}: FAIL: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}

struct Config {
    nsqd: PathBuf,
    shards: usize,
    duration: Duration,
    seed: u64,
    clients: usize,
    rate: u64,
    /// (tcp, http, pid): fuzz a running broker instead of starting one.
    connect: Option<(SocketAddr, SocketAddr, Option<u32>)>,
}

impl Config {
    fn label(&self) -> String {
        match self.connect {
            Some((t, _, _)) => format!("broker at {t}"),
            None => format!("shards={}", self.shards),
        }
    }
}

#[derive(Default)]
struct Counters {
    sessions: AtomicU64,
    bytes: AtomicU64,
    connect_errors: AtomicU64,
    msgs_answered: AtomicU64,
    kinds: [AtomicU64; KINDS.len()],
}

/// What the checker's consumers received: channel -> body number -> deliveries.
type Received = Arc<Mutex<Vec<HashMap<u64, u32>>>>;

fn run(cfg: &Config) -> Result<(), String> {
    let ctx = cfg.label();
    let data = net::temp_data_dir("netfuzz");
    let extra = vec!["--msg-timeout=300s".to_string()];
    let mut broker = match cfg.connect {
        None => Some(Broker::start(
            &cfg.nsqd,
            &data,
            cfg.shards,
            "127.0.0.1:0",
            "127.0.0.1:0",
            &extra,
        )?),
        Some(_) => None,
    };
    let (tcp, http, pid) = match (&broker, cfg.connect) {
        (Some(b), _) => (b.tcp, b.http, b.pid()),
        (None, Some((t, h, p))) => (t, h, p.unwrap_or(0)),
        (None, None) => unreachable!(),
    };
    // Alive: our child's status, or for a running broker its /proc entry (or, without a
    // pid, its /ping).
    let alive = move |broker: &mut Option<Broker>| -> bool {
        match broker {
            Some(b) => b.alive(),
            None if pid != 0 => std::path::Path::new(&format!("/proc/{pid}")).exists(),
            None => net::http(http, "GET", "/ping", b"").is_ok(),
        }
    };
    if broker.is_none() {
        // A checker topic left by an earlier run would hold foreign bodies.
        let _ = net::http(
            http,
            "POST",
            &format!("/topic/delete?topic={CHECK_TOPIC}"),
            b"",
        );
    }
    eprintln!(
        "netfuzz {ctx}: broker pid {pid}, tcp {tcp}, http {http}, seed {}",
        cfg.seed
    );
    for path in [
        format!("/topic/create?topic={CHECK_TOPIC}"),
        format!("/channel/create?topic={CHECK_TOPIC}&channel=c0"),
        format!("/channel/create?topic={CHECK_TOPIC}&channel=c1"),
    ] {
        match net::http(http, "POST", &path, b"") {
            Ok((200, _)) => {}
            other => return Err(format!("{path}: {other:?}")),
        }
    }
    let faults: Arc<Mutex<Vec<String>>> = Arc::default();
    let received: Received = Arc::new(Mutex::new(vec![HashMap::new(); CHANNELS.len()]));
    let stop_consumers = Stop::default();
    let stop_load = Stop::default();
    let counters = Arc::new(Counters::default());

    // Checker consumers: two per channel.
    let mut consumers = Vec::new();
    for (ci, ch) in CHANNELS.iter().enumerate() {
        for _ in 0..2 {
            let (received, stop, faults) =
                (received.clone(), stop_consumers.clone(), faults.clone());
            let ch = ch.to_string();
            consumers.push(thread::spawn(move || {
                if let Err(e) = consume(tcp, &ch, ci, &received, &stop) {
                    faults
                        .lock()
                        .unwrap()
                        .push(format!("checker consumer {ch}: {e}"));
                }
            }));
        }
    }
    // Checker publisher.
    let published = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (stop, faults, published) = (stop_load.clone(), faults.clone(), published.clone());
        let rate = cfg.rate.max(1);
        thread::spawn(move || {
            if let Err(e) = publish(tcp, rate, &published, &stop) {
                faults
                    .lock()
                    .unwrap()
                    .push(format!("checker publisher: {e}"));
            }
        })
    };
    // RSS sampler.
    let rss: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let sampler = {
        let (rss, stop) = (rss.clone(), stop_consumers.clone());
        thread::spawn(move || {
            let t0 = Instant::now();
            while !stop.is_set() && pid != 0 {
                rss.lock()
                    .unwrap()
                    .push((t0.elapsed().as_secs_f64(), net::rss_kb(pid)));
                thread::sleep(Duration::from_secs(1));
            }
        })
    };
    // Janitor: deletes the fuzz clients' topics every 10 s (on a running broker, only
    // topics that were not there at the start).
    let keep: std::collections::HashSet<String> = if broker.is_none() {
        topic_names(http)
    } else {
        Default::default()
    };
    let janitor = {
        let stop = stop_load.clone();
        thread::spawn(move || {
            let mut deleted = 0u64;
            let mut next = Instant::now() + Duration::from_secs(10);
            while !stop.is_set() {
                thread::sleep(Duration::from_millis(200));
                if Instant::now() < next {
                    continue;
                }
                next = Instant::now() + Duration::from_secs(10);
                deleted += clean_topics(http, &keep);
            }
            deleted
        })
    };
    // Fuzz clients.
    let deadline = Instant::now() + cfg.duration;
    let fuzzers: Vec<_> = (0..cfg.clients)
        .map(|i| {
            let counters = counters.clone();
            let seed = cfg.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            thread::spawn(move || {
                let mut rng = Rng::new(seed);
                while Instant::now() < deadline {
                    fuzz_session(&mut rng, tcp, http, &counters);
                }
            })
        })
        .collect();
    for f in fuzzers {
        let _ = f.join();
    }
    let fuzz_overrun = Instant::now().saturating_duration_since(deadline);
    stop_load.set();
    let _ = publisher.join();
    let topics_deleted = janitor.join().unwrap_or(0);
    let n = published.load(Ordering::SeqCst);

    // Drain: every acknowledged message on both channels, then a second for duplicates.
    let t_drain = Instant::now();
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = received.lock().unwrap().iter().all(|m| m.len() as u64 >= n);
        if done || Instant::now() > drain_deadline || !alive(&mut broker) {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let drain_time = t_drain.elapsed();
    thread::sleep(Duration::from_secs(1));
    stop_consumers.set();
    for c in consumers {
        let _ = c.join();
    }
    let _ = sampler.join();

    let mut errors: Vec<String> = faults.lock().unwrap().clone();
    // Exactly once per channel.
    for (ci, m) in received.lock().unwrap().iter().enumerate() {
        let missing: Vec<u64> = (0..n).filter(|k| !m.contains_key(k)).collect();
        let dups: Vec<(u64, u32)> = m
            .iter()
            .filter(|(_, &c)| c > 1)
            .map(|(&k, &c)| (k, c))
            .collect();
        let unknown: Vec<u64> = m.keys().copied().filter(|&k| k >= n).collect();
        if !missing.is_empty() || !dups.is_empty() {
            errors.push(format!(
                "channel {}: {} of {n} messages missing (e.g. {:?}), {} delivered more than once (e.g. {:?})",
                CHANNELS[ci],
                missing.len(),
                &missing[..missing.len().min(5)],
                dups.len(),
                &dups[..dups.len().min(5)]
            ));
        }
        if !unknown.is_empty() {
            // A PUB whose OK never arrived (the publisher stopped mid-request) may land.
            if unknown.len() > 1 || unknown[0] != n {
                errors.push(format!(
                    "channel {}: unexpected bodies {unknown:?}",
                    CHANNELS[ci]
                ));
            }
        }
    }
    let is_alive = alive(&mut broker);
    if !is_alive {
        let tail = broker.as_ref().map(|b| b.log_tail(30)).unwrap_or_default();
        errors.push(format!("broker died: {tail:?}"));
    } else {
        match net::http(http, "GET", "/ping", b"") {
            Ok((200, b)) if b == b"OK" => {}
            other => errors.push(format!("/ping at the end: {other:?}")),
        }
    }
    let alarms = broker
        .as_ref()
        .map(|b| b.alarms.lock().unwrap().clone())
        .unwrap_or_default();
    if !alarms.is_empty() {
        errors.push(format!("panic/FATAL in the broker log: {alarms:?}"));
    }
    // RSS.
    let samples = rss.lock().unwrap().clone();
    let (rss_min, rss_max) = samples
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &(_, r)| (lo.min(r), hi.max(r)));
    let first = samples.first().map(|s| s.1).unwrap_or(0);
    let last = samples.last().map(|s| s.1).unwrap_or(0);
    let at60 = samples.iter().find(|(t, _)| *t >= 60.0).map(|s| s.1);
    let rss_note = match at60 {
        Some(base) if base > 0 && cfg.duration >= Duration::from_secs(90) => {
            let after = samples
                .iter()
                .filter(|(t, _)| *t >= 60.0)
                .map(|s| s.1)
                .max()
                .unwrap_or(base);
            let pct = (after as f64 / base as f64 - 1.0) * 100.0;
            if pct > 10.0 {
                errors.push(format!(
                    "RSS grew {pct:.1} % after the first minute ({base} kB -> max {after} kB)"
                ));
            }
            format!("at 60 s {base} kB, max after {after} kB ({pct:+.1} %)")
        }
        _ => "growth after the first minute not checked (run under 90 s)".to_string(),
    };
    let exit = match broker.as_mut() {
        Some(b) if is_alive => b.terminate(Duration::from_secs(20)),
        _ => None,
    };
    if is_alive && broker.is_some() && exit != Some(0) {
        errors.push(format!("SIGTERM: exit {exit:?}"));
    }
    let kinds: Vec<String> = KINDS
        .iter()
        .zip(counters.kinds.iter())
        .map(|(k, c)| format!("{k} {}", c.load(Ordering::Relaxed)))
        .collect();
    eprintln!(
        "netfuzz {ctx}: fuzz clients ended {:.1} s after the deadline, checker drained in {:.1} s; {} fuzz sessions ({}), {} bytes sent, {} messages FIN/REQ/TOUCHed by fuzz clients, {} connect errors, {} fuzz topics deleted; checker: {n} messages x {} channels; RSS first {first} kB, min {rss_min} kB, max {rss_max} kB, last {last} kB ({} samples), {rss_note}",
        fuzz_overrun.as_secs_f64(),
        drain_time.as_secs_f64(),
        counters.sessions.load(Ordering::Relaxed),
        kinds.join(", "),
        counters.bytes.load(Ordering::Relaxed),
        counters.msgs_answered.load(Ordering::Relaxed),
        counters.connect_errors.load(Ordering::Relaxed),
        topics_deleted,
        CHANNELS.len(),
        samples.len(),
    );
    let _ = std::fs::remove_dir_all(&data);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn body_of(k: u64) -> Vec<u8> {
    format!("nfc-{k:010}").into_bytes()
}

fn parse_body(b: &[u8]) -> Option<u64> {
    std::str::from_utf8(b.strip_prefix(b"nfc-")?)
        .ok()?
        .parse()
        .ok()
}

/// PUBs (and every fourth time an MPUB of 5) numbered bodies, each acknowledged before the
/// next; `published` counts the acknowledged ones (numbers 0..published).
fn publish(tcp: SocketAddr, rate: u64, published: &AtomicU64, stop: &Stop) -> Result<(), String> {
    let mut s = net::v2(tcp, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut k = 0u64;
    let mut round = 0u64;
    while !stop.is_set() {
        let (cmd, count) = if round % 4 == 3 {
            let bodies: Vec<Vec<u8>> = (k..k + 5).map(body_of).collect();
            (net::mpub_cmd(CHECK_TOPIC, &bodies), 5)
        } else {
            (net::pub_cmd(CHECK_TOPIC, &body_of(k)), 1)
        };
        round += 1;
        s.write_all(&cmd)
            .map_err(|e| format!("write after {k}: {e}"))?;
        match net::expect_response(&mut s, |_| {}) {
            Ok((0, d)) if d == b"OK" => {}
            Ok((ft, d)) => {
                return Err(format!(
                    "PUB {k}: frame {ft} {:?}",
                    String::from_utf8_lossy(&d)
                ))
            }
            Err(e) => return Err(format!("PUB {k}: no reply within 10 s: {e}")),
        }
        k += count;
        published.store(k, Ordering::SeqCst);
        // Pace to `rate` messages a second.
        let due = t0 + Duration::from_secs_f64(k as f64 / rate as f64);
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
    }
    Ok(())
}

fn consume(
    tcp: SocketAddr,
    ch: &str,
    ci: usize,
    received: &Received,
    stop: &Stop,
) -> Result<(), String> {
    let mut s = net::v2(tcp, Duration::from_millis(500)).map_err(|e| e.to_string())?;
    s.write_all(format!("SUB {CHECK_TOPIC} {ch}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    match net::expect_response(&mut s, |_| {}) {
        Ok((0, d)) if d == b"OK" => {}
        other => return Err(format!("SUB: {other:?}")),
    }
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    s.write_all(b"RDY 100\n").map_err(|e| e.to_string())?;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.is_set() {
        let n = match s.read(&mut buf) {
            Ok(0) => return Err("connection closed by the broker".into()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        let mut at = 0;
        while pending.len() - at >= 8 {
            let size = u32::from_be_bytes(pending[at..at + 4].try_into().unwrap()) as usize;
            if !(4..=16 << 20).contains(&size) {
                return Err(format!("bad frame size {size}"));
            }
            if pending.len() - at < 4 + size {
                break;
            }
            let ft = i32::from_be_bytes(pending[at + 4..at + 8].try_into().unwrap());
            let d = &pending[at + 8..at + 4 + size];
            match ft {
                0 if d == b"_heartbeat_" => out.extend_from_slice(b"NOP\n"),
                2 => {
                    let (_, id, body) = net::parse_message(d).ok_or("short message frame")?;
                    let k = parse_body(body).ok_or_else(|| {
                        format!("foreign body {:?}", String::from_utf8_lossy(body))
                    })?;
                    *received.lock().unwrap()[ci].entry(k).or_insert(0) += 1;
                    out.extend_from_slice(b"FIN ");
                    out.extend_from_slice(&id);
                    out.push(b'\n');
                }
                _ => return Err(format!("frame {ft}: {:?}", String::from_utf8_lossy(d))),
            }
            at += 4 + size;
        }
        pending.drain(..at);
        if !out.is_empty() {
            s.write_all(&out).map_err(|e| format!("FIN: {e}"))?;
        }
    }
    let _ = s.write_all(b"CLS\n");
    Ok(())
}

/// The broker's topic names (empty if /stats fails).
fn topic_names(http: SocketAddr) -> std::collections::HashSet<String> {
    let Ok((200, body)) = net::http(http, "GET", "/stats?format=json&include_clients=false", b"")
    else {
        return Default::default();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Default::default();
    };
    v["topics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["topic_name"].as_str().map(String::from))
        .collect()
}

/// Deletes every topic but the checker's and those in `keep`; returns how many.
fn clean_topics(http: SocketAddr, keep: &std::collections::HashSet<String>) -> u64 {
    let mut n = 0;
    for name in topic_names(http) {
        let name = name.as_str();
        if name == CHECK_TOPIC || keep.contains(name) {
            continue;
        }
        let q: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        if let Ok((200, _)) = net::http(http, "POST", &format!("/topic/delete?topic={q}"), b"") {
            n += 1;
        }
    }
    n
}

// ------------------------------------------------------------------ sessions

/// A seed session: its parts (commands or requests), each with the offset of its 4-byte
/// size field if it has one.
struct Session {
    parts: Vec<(Vec<u8>, Option<usize>)>,
    http: bool,
}

impl Session {
    fn bytes(&self) -> Vec<u8> {
        self.parts
            .iter()
            .flat_map(|(b, _)| b.iter().copied())
            .collect()
    }
}

fn pick<'a>(rng: &mut Rng, xs: &[&'a str]) -> &'a str {
    xs[rng.below(xs.len())]
}

fn topic(rng: &mut Rng) -> String {
    format!("fz.{}", rng.below(4))
}

fn channel(rng: &mut Rng) -> String {
    if rng.below(6) == 0 {
        format!("ch{}#ephemeral", rng.below(2))
    } else {
        format!("ch{}", rng.below(3))
    }
}

fn body(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => 0,
        1 => rng.below(64 * 1024),
        _ => 1 + rng.below(200),
    };
    (0..len)
        .map(|i| b'a' + ((i + rng.below(3)) % 26) as u8)
        .collect()
}

fn hex_id(rng: &mut Rng) -> Vec<u8> {
    format!("{:016x}", rng.next_u64()).into_bytes()
}

fn sized(prefix: String, payload: &[u8]) -> (Vec<u8>, Option<usize>) {
    let mut v = prefix.into_bytes();
    let at = v.len();
    v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    v.extend_from_slice(payload);
    (v, Some(at))
}

const IDENTIFY_JSON: &[&str] = &[
    r#"{"client_id":"fz","hostname":"fz","feature_negotiation":true}"#,
    r#"{"heartbeat_interval":1000,"output_buffer_size":16384,"output_buffer_timeout":5}"#,
    r#"{"heartbeat_interval":-1,"output_buffer_timeout":-1,"msg_timeout":2000}"#,
    r#"{"sample_rate":50,"user_agent":"netfuzz/1.0"}"#,
    r#"{"feature_negotiation":true,"snappy":true}"#,
    r#"{"feature_negotiation":true,"deflate":true,"deflate_level":3}"#,
    r#"{"tls_v1":false,"long_id":"a","short_id":"b","msg_timeout":1000}"#,
    r#"{}"#,
];

fn v2_session(rng: &mut Rng) -> Session {
    let mut parts = vec![(b"  V2".to_vec(), None)];
    if rng.below(10) < 6 {
        parts.push(sized(
            "IDENTIFY\n".into(),
            pick(rng, IDENTIFY_JSON).as_bytes(),
        ));
    }
    let subscribed = rng.below(2) == 0;
    if subscribed {
        parts.push((
            format!("SUB {} {}\n", topic(rng), channel(rng)).into_bytes(),
            None,
        ));
        parts.push((format!("RDY {}\n", rng.below(50)).into_bytes(), None));
    }
    for _ in 0..1 + rng.below(12) {
        let p = match rng.below(12) {
            0..=2 => sized(format!("PUB {}\n", topic(rng)), &body(rng)),
            3 => {
                let bodies: Vec<Vec<u8>> = (0..1 + rng.below(5)).map(|_| body(rng)).collect();
                let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
                for b in &bodies {
                    inner.extend_from_slice(&(b.len() as u32).to_be_bytes());
                    inner.extend_from_slice(b);
                }
                sized(format!("MPUB {}\n", topic(rng)), &inner)
            }
            4 => sized(
                format!("DPUB {} {}\n", topic(rng), rng.below(5000)),
                &body(rng),
            ),
            5 => (
                [b"FIN ".to_vec(), hex_id(rng), b"\n".to_vec()].concat(),
                None,
            ),
            6 => (
                [
                    b"REQ ".to_vec(),
                    hex_id(rng),
                    format!(" {}\n", rng.below(2000)).into_bytes(),
                ]
                .concat(),
                None,
            ),
            7 => (
                [b"TOUCH ".to_vec(), hex_id(rng), b"\n".to_vec()].concat(),
                None,
            ),
            8 => (b"NOP\n".to_vec(), None),
            9 => (format!("RDY {}\n", rng.below(3000)).into_bytes(), None),
            10 => sized("AUTH\n".into(), b"secret"),
            _ => (
                format!("SUB {} {}\n", topic(rng), channel(rng)).into_bytes(),
                None,
            ),
        };
        parts.push(p);
    }
    if rng.below(3) == 0 {
        parts.push((b"CLS\n".to_vec(), None));
    }
    Session { parts, http: false }
}

fn http_request(rng: &mut Rng, last: bool) -> (Vec<u8>, Option<usize>) {
    let t = topic(rng);
    let c = channel(rng);
    let (method, path, body): (&str, String, Vec<u8>) = match rng.below(14) {
        0..=2 => ("POST", format!("/pub?topic={t}"), body(rng)),
        3 => (
            "POST",
            format!("/pub?topic={t}&defer={}", rng.below(3000)),
            body(rng),
        ),
        4 => {
            let lines: Vec<Vec<u8>> = (0..1 + rng.below(6)).map(|_| body(rng)).collect();
            ("POST", format!("/mpub?topic={t}"), lines.join(&b'\n'))
        }
        5 => {
            let bodies: Vec<Vec<u8>> = (0..1 + rng.below(4)).map(|_| body(rng)).collect();
            let mut inner = (bodies.len() as u32).to_be_bytes().to_vec();
            for b in &bodies {
                inner.extend_from_slice(&(b.len() as u32).to_be_bytes());
                inner.extend_from_slice(b);
            }
            ("POST", format!("/mpub?topic={t}&binary=true"), inner)
        }
        6 => (
            "GET",
            pick(
                rng,
                &[
                    "/stats?format=json",
                    "/stats",
                    "/stats?format=json&include_clients=false",
                ],
            )
            .to_string(),
            vec![],
        ),
        7 => (
            "GET",
            format!("/stats?format=json&topic={t}&channel={c}"),
            vec![],
        ),
        8 => (
            "POST",
            format!(
                "/topic/{}?topic={t}",
                pick(rng, &["create", "pause", "unpause", "empty"])
            ),
            vec![],
        ),
        9 | 10 => (
            "POST",
            format!(
                "/channel/{}?topic={t}&channel={c}",
                pick(rng, &["create", "pause", "unpause", "empty", "delete"])
            ),
            vec![],
        ),
        11 => (
            "GET",
            pick(rng, &["/ping", "/info", "/config/nsqlookupd_tcp_addresses"]).to_string(),
            vec![],
        ),
        12 => ("HEAD", "/ping".to_string(), vec![]),
        _ => ("POST", format!("/topic/delete?topic={t}"), vec![]),
    };
    let conn = if last && rng.below(2) == 0 {
        "Connection: close\r\n"
    } else {
        ""
    };
    if method == "POST" && rng.below(5) == 0 {
        // Chunked body.
        let mut v = format!(
            "{method} {path} HTTP/1.1\r\nHost: fz\r\n{conn}Transfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        for chunk in body.chunks(1 + rng.below(64)) {
            v.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            v.extend_from_slice(chunk);
            v.extend_from_slice(b"\r\n");
        }
        v.extend_from_slice(b"0\r\n\r\n");
        return (v, None);
    }
    let mut v = format!(
        "{method} {path} HTTP/1.1\r\nHost: fz\r\n{conn}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(&body);
    (v, None)
}

fn http_session(rng: &mut Rng) -> Session {
    let n = 1 + rng.below(4);
    Session {
        parts: (0..n).map(|i| http_request(rng, i + 1 == n)).collect(),
        http: true,
    }
}

fn session(rng: &mut Rng) -> Session {
    if rng.below(3) == 0 {
        http_session(rng)
    } else {
        v2_session(rng)
    }
}

const HUGE: &[u32] = &[
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x0100_0000,
    0x0010_0001,
    0x0500_0001,
];
const HUGE_CHUNK: &[&str] = &[
    "ffffffffffffffff",
    "10000000000",
    "7fffffff",
    "100001",
    "fffffffffffffffff",
];
const HUGE_CL: &[&str] = &[
    "99999999999999999999",
    "4294967296",
    "1048577",
    "5242881",
    "-1",
    "0x10",
    "18446744073709551615",
];

/// One fuzz connection: a seed session, mutated, delivered one of several ways.
fn fuzz_session(rng: &mut Rng, tcp: SocketAddr, http: SocketAddr, counters: &Counters) {
    let s = session(rng);
    let mut bytes = s.bytes();
    let kind = rng.below(KINDS.len());
    match KINDS[kind] {
        "flip" => {
            for _ in 0..1 + rng.below(4) {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
            }
        }
        "mutate" => {
            let other = session(rng).bytes();
            mutate(&mut bytes, &other, rng, 256 * 1024);
        }
        "truncate" | "close-mid-frame" => {
            let n = rng.below(bytes.len() + 1);
            bytes.truncate(n);
        }
        "splice" => {
            let other = session(rng).bytes();
            let a = rng.below(bytes.len() + 1);
            let b = rng.below(other.len() + 1);
            bytes.truncate(a);
            bytes.extend_from_slice(&other[b..]);
        }
        "huge-size" => {
            if s.http {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let huge = HUGE_CL[rng.below(HUGE_CL.len())];
                let mut out = String::new();
                let mut rest = text.as_str();
                // A huge first chunk size (chunked), else replaces the first
                // Content-Length value (or adds one).
                let chunked = "Transfer-Encoding: chunked\r\n\r\n";
                if let Some(i) = rest.find(chunked).filter(|_| rng.below(2) == 0) {
                    let start = i + chunked.len();
                    let end = rest[start..].find("\r\n").map_or(start, |e| start + e);
                    let size = HUGE_CHUNK[rng.below(HUGE_CHUNK.len())];
                    bytes = format!("{}{size}{}", &rest[..start], &rest[end..]).into_bytes();
                } else if let Some(i) = rest.find("Content-Length: ") {
                    out.push_str(&rest[..i + 16]);
                    rest = &rest[i + 16..];
                    let end = rest.find("\r\n").unwrap_or(0);
                    out.push_str(huge);
                    out.push_str(&rest[end..]);
                    bytes = out.into_bytes();
                } else {
                    bytes = text
                        .replacen(
                            "\r\n\r\n",
                            &format!("\r\nContent-Length: {huge}\r\n\r\n"),
                            1,
                        )
                        .into_bytes();
                }
            } else {
                let sizes: Vec<usize> = {
                    let mut off = 0;
                    let mut v = Vec::new();
                    for (p, at) in &s.parts {
                        if let Some(a) = at {
                            v.push(off + a);
                        }
                        off += p.len();
                    }
                    v
                };
                if !sizes.is_empty() {
                    let at = sizes[rng.below(sizes.len())];
                    let h = HUGE[rng.below(HUGE.len())];
                    bytes[at..at + 4].copy_from_slice(&h.to_be_bytes());
                    // The broker must answer without waiting for (or allocating) it all.
                    bytes.truncate(at + 4 + rng.below(64));
                }
            }
        }
        _ => {}
    }
    let addr = if s.http { http } else { tcp };
    let mut conn = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(c) => c,
        Err(_) => {
            counters.connect_errors.fetch_add(1, Ordering::Relaxed);
            thread::sleep(Duration::from_millis(50));
            return;
        }
    };
    counters.sessions.fetch_add(1, Ordering::Relaxed);
    counters.kinds[kind].fetch_add(1, Ordering::Relaxed);
    let _ = conn.set_nodelay(true);
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
    let mut inbox = Vec::new();
    let sent = match KINDS[kind] {
        "drip" => {
            // One byte at a time with 1-10 ms pauses for up to ~1.5 s, then the rest.
            let t0 = Instant::now();
            let mut i = 0;
            let mut ok = true;
            while i < bytes.len() && t0.elapsed() < Duration::from_millis(1500) && ok {
                ok = conn.write_all(&bytes[i..i + 1]).is_ok();
                i += 1;
                thread::sleep(Duration::from_millis(1 + rng.below(10) as u64));
            }
            if ok {
                ok = conn.write_all(&bytes[i..]).is_ok();
            }
            if ok {
                bytes.len()
            } else {
                i
            }
        }
        "chunks" => {
            // Pieces of 1-64 bytes for up to ~1.5 s, then the rest at once.
            let t0 = Instant::now();
            let mut i = 0;
            while i < bytes.len() {
                if t0.elapsed() > Duration::from_millis(1500) {
                    if conn.write_all(&bytes[i..]).is_ok() {
                        i = bytes.len();
                    }
                    break;
                }
                let n = (1 + rng.below(64)).min(bytes.len() - i);
                if conn.write_all(&bytes[i..i + n]).is_err() {
                    break;
                }
                i += n;
                if rng.below(4) == 0 {
                    thread::sleep(Duration::from_millis(rng.below(3) as u64));
                }
                if rng.below(16) == 0 {
                    drain(&mut conn, &mut inbox);
                }
            }
            i
        }
        _ => {
            if conn.write_all(&bytes).is_ok() {
                bytes.len()
            } else {
                0
            }
        }
    };
    counters.bytes.fetch_add(sent as u64, Ordering::Relaxed);
    if KINDS[kind] == "close-mid-frame" {
        return; // dropped at once, with whatever the broker sent unread (RST).
    }
    // Read replies for a while; a V2 client answers the messages it gets.
    let until = Instant::now() + Duration::from_millis(100 + rng.below(300) as u64);
    while Instant::now() < until {
        let before = inbox.len();
        if !drain(&mut conn, &mut inbox) {
            break;
        }
        if !s.http && inbox.len() > before {
            let mut out = Vec::new();
            let mut at = 0;
            while inbox.len() - at >= 8 {
                let size = u32::from_be_bytes(inbox[at..at + 4].try_into().unwrap()) as usize;
                if size < 4 || inbox.len() - at < 4 + size {
                    break;
                }
                let ft = i32::from_be_bytes(inbox[at + 4..at + 8].try_into().unwrap());
                if ft == 2 {
                    if let Some((_, id, _)) = net::parse_message(&inbox[at + 8..at + 4 + size]) {
                        let verb = pick(rng, &["FIN ", "FIN ", "REQ ", "TOUCH "]);
                        out.extend_from_slice(verb.as_bytes());
                        out.extend_from_slice(&id);
                        out.extend_from_slice(if verb == "REQ " { b" 10\n" } else { b"\n" });
                        counters.msgs_answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
                at += 4 + size;
            }
            inbox.drain(..at);
            if !out.is_empty() && conn.write_all(&out).is_err() {
                break;
            }
        }
    }
    if rng.below(2) == 0 {
        let _ = conn.shutdown(Shutdown::Write);
        drain(&mut conn, &mut inbox);
    }
}

/// Reads what is there (20 ms read timeout); false once the connection is closed.
fn drain(conn: &mut TcpStream, inbox: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 16 * 1024];
    match conn.read(&mut buf) {
        Ok(0) => false,
        Ok(n) => {
            if inbox.len() < 1 << 20 {
                inbox.extend_from_slice(&buf[..n]);
            }
            true
        }
        Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
    }
}
