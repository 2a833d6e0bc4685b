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
mod checker;
mod client;
mod sessions;

use checker::{clean_topics, consume, publish, topic_names};
use client::fuzz_session;

use nsq_fuzz::mutate::Rng;

use nsq_fuzz::net::{self, Broker, Stop};

use std::collections::HashMap;

use std::net::SocketAddr;

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

/// Command line (the module's doc comment describes the run).
#[derive(clap::Parser, Debug)]
#[command(name = "netfuzz", about = "network fuzzing of the running broker")]
struct Cli {
    #[command(flatten)]
    tool: net::ToolArgs,
    /// How long each run fuzzes, in seconds.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Fuzz client threads.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// The checker's publish rate, messages a second.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// A running broker's TCP address to fuzz instead of starting one (with `--http`).
    #[arg(long, requires = "http")]
    tcp: Option<SocketAddr>,
    /// A running broker's HTTP address (with `--tcp`).
    #[arg(long, requires = "tcp")]
    http: Option<SocketAddr>,
    /// The running broker's pid, to sample its RSS.
    #[arg(long)]
    pid: Option<u32>,
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    let shards = cli.tool.shards.0.clone();
    let duration = Duration::from_secs_f64(cli.duration);
    let seed = cli.tool.seed();
    let clients = cli.clients;
    let rate = cli.rate;
    let nsqd = cli.tool.nsqd();
    eprintln!(
        "netfuzz: seed {seed}, shards {shards:?}, {:?} each, {clients} fuzz clients, checker {rate} msgs/s, broker {}",
        duration,
        nsqd.display()
    );
    // A running broker instead (its RSS sampled when --pid is given).
    let connect = cli.tcp.zip(cli.http).map(|(t, h)| (t, h, cli.pid));
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

// A `String` error: CLI-only, printed once before the fuzzer exits.
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
