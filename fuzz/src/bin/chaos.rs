//! Chaos: kill -9 at random instants under load (RELIABILITY.md, "Chaos: kill -9 under load").
//!
//!   chaos [--shards N] [--cycles 50] [--seed N] [--min-ms 200] [--max-ms 1500]
//!         [--sync every1|default] [--nsqd PATH]
//!
//! Starts `nsqd --sync-every=1 --max-bytes-per-file=65536` on two loopback ports and a data
//! path that stay the same for the whole run, creates topic `chaos` with channels `c0` and
//! `c1`, then for each cycle: a publisher PUBs (every fifth time an MPUB of 4) numbered
//! bodies and records which got `OK`, one consumer per channel (RDY 50) records every body
//! it gets and FINs it, and after a random delay (seeded) the broker is killed with
//! SIGKILL and restarted at once on the same data path and ports. After the last cycle
//! it restarts the broker once more and drains both channels (until each has every
//! acknowledged body, or 60 s), then checks that every acknowledged body reached each
//! channel (before or after some crash: at-least-once, so redeliveries are counted, not
//! failures), that nothing foreign was delivered, that no log shows a panic, and that the
//! final broker exits 0 on SIGTERM. Exit status 1 on any loss or failure.
//!
//! `--sync default` runs the broker with its default sync policy instead (no
//! `--sync-every=1`) and checks the promise docs/durability.md makes for it: an acknowledged message
//! may be lost only if it was acknowledged within 100 ms + `--sync-timeout` (2 s) of the
//! kill that lost it, plus what the write and the fdatasync take (allowed: 1.5 s more;
//! each loss is counted by its age); any older one lost is a failure. Channel `c1`'s consumer is slow there (RDY 5, 5 ms
//! per message), so a backlog has to be stored, not only messages in flight. Use
//! cycles longer than the window (`--min-ms 3000 --max-ms 6000`).
#![allow(
    clippy::unwrap_used,
    reason = "fuzzing and chaos tools: a panic is a reported failure of the run"
)]
#![forbid(unsafe_code)]

use nsq_fuzz::mutate::Rng;
use nsq_fuzz::net::{self, Broker, Stop};
use std::collections::{BTreeSet, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TOPIC: &str = "chaos";
const CHANNELS: [&str; 2] = ["c0", "c1"];

/// The default policy's loss window: a record reaches the store when 100 ms old and is
/// synced within `--sync-timeout` (2 s by default) of its write.
const DEFAULT_SYNC_WINDOW: Duration = Duration::from_millis(2100);

/// What the write and the fdatasync themselves take on top of the window (measured:
/// losses up to 3.15 s before a kill on 2 cores shared with four fuzzers); a loss older
/// than the window plus this is a failure.
const WRITE_AND_SYNC_ALLOWANCE: Duration = Duration::from_millis(1500);

#[derive(Default)]
struct State {
    /// Bodies whose PUB/MPUB got OK.
    acked: BTreeSet<u64>,
    /// When each body's OK arrived.
    acked_at: HashMap<u64, Instant>,
    /// Next body number to publish.
    next: u64,
    /// Per channel: body -> deliveries.
    received: Vec<HashMap<u64, u32>>,
    foreign: Vec<String>,
    /// Deliveries by the attempts field of the message frame (1, 2, 3, 4+).
    attempts: [u64; 4],
}

/// Command line (the module's doc comment describes the run).
#[derive(clap::Parser, Debug)]
#[command(name = "chaos", about = "kill -9 at random instants under load")]
struct Cli {
    #[command(flatten)]
    tool: net::ToolArgs,
    /// Kill -9 cycles per shard count.
    #[arg(long, default_value_t = 50)]
    cycles: u64,
    /// Shortest time between kills, in ms.
    #[arg(long, default_value_t = 200)]
    min_ms: u64,
    /// Longest time between kills, in ms (at least `--min-ms` + 1).
    #[arg(long, default_value_t = 1500)]
    max_ms: u64,
    /// The broker's sync policy: `every1` (`--sync-every=1`) or `default`.
    #[arg(long, default_value = "every1", value_parser = ["every1", "default"])]
    sync: String,
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    let shards_list = &cli.tool.shards.0;
    let cycles = cli.cycles;
    let seed = cli.tool.seed();
    let min_ms = cli.min_ms;
    let max_ms = cli.max_ms.max(min_ms + 1);
    let default_sync = cli.sync == "default";
    let nsqd = cli.tool.nsqd();
    let mut failed = false;
    for (i, &shards) in shards_list.iter().enumerate() {
        let s = seed.wrapping_add(i as u64 * 7919);
        eprintln!(
            "chaos shards={shards}: seed {s}, {cycles} kill -9 cycles, {min_ms}-{max_ms} ms apart, sync {}, broker {}",
            if default_sync { "default policy" } else { "every 1" },
            nsqd.display()
        );
        let cfg = Config {
            shards,
            cycles,
            seed: s,
            min_ms,
            max_ms,
            default_sync,
        };
        match run(&nsqd, &cfg) {
            Ok(()) => eprintln!("chaos shards={shards}: PASS"),
            Err(e) => {
                eprintln!("chaos shards={shards}: FAIL: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}

/// One run's settings.
struct Config {
    shards: usize,
    cycles: u64,
    seed: u64,
    min_ms: u64,
    max_ms: u64,
    /// The default sync policy instead of `--sync-every=1`.
    default_sync: bool,
}

// A `String` error: CLI-only, printed once before the fuzzer exits.
fn start(nsqd: &Path, data: &Path, cfg: &Config, tcp: u16, http: u16) -> Result<Broker, String> {
    let shards = cfg.shards;
    let mut extra = vec![
        "--max-bytes-per-file=65536".to_string(),
        "--msg-timeout=30s".to_string(),
    ];
    if !cfg.default_sync {
        extra.push("--sync-every=1".into());
    }
    let mut last = String::new();
    // The ports were just released by the killed process; retry briefly if still busy.
    for _ in 0..20 {
        match Broker::start(
            nsqd,
            data,
            shards,
            &format!("127.0.0.1:{tcp}"),
            &format!("127.0.0.1:{http}"),
            &extra,
        ) {
            Ok(b) => return Ok(b),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(250));
    }
    Err(format!("restart failed: {last}"))
}

// A `String` error: CLI-only, printed once before the fuzzer exits.
fn run(nsqd: &Path, cfg: &Config) -> Result<(), String> {
    let Config {
        shards,
        cycles,
        seed,
        min_ms,
        max_ms,
        default_sync,
    } = *cfg;
    let data = net::temp_data_dir("chaos");
    let (tcp_port, http_port) = (net::free_port(), net::free_port());
    let state = Arc::new(Mutex::new(State {
        received: vec![HashMap::new(); CHANNELS.len()],
        ..State::default()
    }));
    let mut rng = Rng::new(seed);
    let mut alarms = Vec::new();
    let t0 = Instant::now();
    let mut restart_ms = Vec::new();
    let mut kills: Vec<Instant> = Vec::new();
    for cycle in 0..cycles {
        let t = Instant::now();
        let mut b = start(nsqd, &data, cfg, tcp_port, http_port)?;
        restart_ms.push(t.elapsed().as_millis() as u64);
        if cycle == 0 {
            for path in [
                format!("/topic/create?topic={TOPIC}"),
                format!("/channel/create?topic={TOPIC}&channel=c0"),
                format!("/channel/create?topic={TOPIC}&channel=c1"),
            ] {
                match net::http(b.http, "POST", &path, b"") {
                    Ok((200, _)) => {}
                    other => return Err(format!("{path}: {other:?}")),
                }
            }
        }
        let stop = Stop::default();
        let mut workers = Vec::new();
        {
            let (state, stop) = (state.clone(), stop.clone());
            let tcp = b.tcp;
            workers.push(thread::spawn(move || publish(tcp, &state, &stop)));
        }
        for ci in 0..CHANNELS.len() {
            let (state, stop) = (state.clone(), stop.clone());
            let tcp = b.tcp;
            let slow = default_sync && ci == 1;
            workers.push(thread::spawn(move || consume(tcp, ci, slow, &state, &stop)));
        }
        let delay = min_ms + rng.below((max_ms - min_ms) as usize) as u64;
        thread::sleep(Duration::from_millis(delay));
        b.kill9();
        kills.push(Instant::now());
        stop.set();
        for w in workers {
            let _ = w.join();
        }
        alarms.extend(b.alarms.lock().unwrap().iter().cloned());
        let s = state.lock().unwrap();
        eprintln!(
            "chaos shards={shards} cycle {}: killed after {delay} ms; acknowledged so far {}, received c0 {} c1 {}",
            cycle + 1,
            s.acked.len(),
            s.received[0].len(),
            s.received[1].len()
        );
    }
    // Final drain.
    let mut b = start(nsqd, &data, cfg, tcp_port, http_port)?;
    let stop = Stop::default();
    let drainers: Vec<_> = (0..CHANNELS.len())
        .map(|ci| {
            let (state, stop) = (state.clone(), stop.clone());
            let tcp = b.tcp;
            thread::spawn(move || consume(tcp, ci, false, &state, &stop))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    // With the default policy some acknowledged bodies may be gone (within the window):
    // the drain also ends once nothing new arrived for 10 s (more than the longest pause
    // between retries of a failed disk read, 5 s).
    let (mut last_count, mut last_change) = (0usize, Instant::now());
    let drain_start = Instant::now();
    let mut longest_gap = Duration::ZERO;
    loop {
        let (done, count) = {
            let s = state.lock().unwrap();
            let done = s
                .received
                .iter()
                .all(|m| s.acked.iter().all(|k| m.contains_key(k)));
            (done, s.received.iter().map(HashMap::len).sum::<usize>())
        };
        if count != last_count {
            longest_gap = longest_gap.max(last_change.elapsed());
            (last_count, last_change) = (count, Instant::now());
        }
        let quiet = default_sync && last_change.elapsed() > Duration::from_secs(10);
        if done || quiet || Instant::now() > deadline {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "chaos shards={shards}: final drain {:.1} s, longest pause between deliveries {:.1} s",
        drain_start.elapsed().as_secs_f64(),
        longest_gap.as_secs_f64()
    );
    thread::sleep(Duration::from_millis(500));
    stop.set();
    for d in drainers {
        let _ = d.join();
    }
    let mut errors = Vec::new();
    alarms.extend(b.alarms.lock().unwrap().iter().cloned());
    if !alarms.is_empty() {
        errors.push(format!("panic/FATAL in a broker log: {alarms:?}"));
    }
    match b.terminate(Duration::from_secs(20)) {
        Some(0) => {}
        other => errors.push(format!("final SIGTERM: exit {other:?}")),
    }
    let s = state.lock().unwrap();
    let mut summary = Vec::new();
    for (ci, m) in s.received.iter().enumerate() {
        let mut lost: Vec<u64> = s
            .acked
            .iter()
            .copied()
            .filter(|k| !m.contains_key(k))
            .collect();
        let mut window_note = String::new();
        if default_sync {
            // How long before the kill that followed it each lost body was acknowledged.
            let age = |k: &u64| -> Option<Duration> {
                let at = *s.acked_at.get(k)?;
                kills.iter().find(|&&kt| kt >= at).map(|&kt| kt - at)
            };
            let (within, beyond): (Vec<u64>, Vec<u64>) = lost
                .iter()
                .partition(|k| age(k).is_some_and(|a| a < DEFAULT_SYNC_WINDOW));
            let (late, beyond): (Vec<u64>, Vec<u64>) = beyond.iter().partition(|k| {
                age(k).is_some_and(|a| a < DEFAULT_SYNC_WINDOW + WRITE_AND_SYNC_ALLOWANCE)
            });
            let ms = |v: &[u64]| -> String {
                let ages: Vec<u128> = v.iter().filter_map(age).map(|a| a.as_millis()).collect();
                match (ages.iter().min(), ages.iter().max()) {
                    (Some(lo), Some(hi)) => format!("{lo}-{hi} ms"),
                    _ => "-".into(),
                }
            };
            window_note = format!(
                ", {} lost within the window (acknowledged {} before the kill), {} within the write and sync allowance ({}), {} older ({})",
                within.len(),
                ms(&within),
                late.len(),
                ms(&late),
                beyond.len(),
                ms(&beyond),
            );
            lost = beyond;
        }
        let redelivered: u64 = m.values().map(|&c| u64::from(c - 1)).sum();
        let unacked = m.keys().filter(|k| !s.acked.contains(k)).count();
        let most = m.iter().max_by_key(|(&k, &c)| (c, std::cmp::Reverse(k)));
        summary.push(format!(
            "{}: {} distinct received, {} lost{window_note}, {redelivered} redeliveries (most: body {:?} delivered {:?} times), {unacked} whose PUB got no OK (sent before a kill)",
            CHANNELS[ci],
            m.len(),
            lost.len(),
            most.map(|m| *m.0),
            most.map(|m| *m.1),
        ));
        if !lost.is_empty() {
            errors.push(format!(
                "channel {}: {} acknowledged messages lost, e.g. {:?}",
                CHANNELS[ci],
                lost.len(),
                &lost[..lost.len().min(10)]
            ));
        }
    }
    if !s.foreign.is_empty() {
        errors.push(format!(
            "foreign bodies: {:?}",
            &s.foreign[..s.foreign.len().min(5)]
        ));
    }
    restart_ms.sort_unstable();
    eprintln!(
        "chaos shards={shards}: {cycles} cycles in {:.1} s, {} PUBs acknowledged of {} sent; {}; deliveries by attempts field 1/2/3/4+: {:?}; restart to listening: median {} ms, max {} ms",
        t0.elapsed().as_secs_f64(),
        s.acked.len(),
        s.next,
        summary.join("; "),
        s.attempts,
        restart_ms.get(restart_ms.len() / 2).copied().unwrap_or(0),
        restart_ms.last().copied().unwrap_or(0),
    );
    let _ = std::fs::remove_dir_all(&data);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

fn body_of(k: u64) -> Vec<u8> {
    format!("chaos-{k:010}").into_bytes()
}

/// Publishes until the broker is gone (the kill) or `stop`. A refused publish (an
/// error frame, fatal as nsqd's: the broker closes the connection, e.g. a disk fault
/// from NSQD_STORAGE_FAULTS) is not acknowledged; the publisher reconnects and goes on.
fn publish(tcp: SocketAddr, state: &Mutex<State>, stop: &Stop) {
    let mut round = 0u64;
    while !stop.is_set() {
        let Ok(mut s) = net::v2(tcp, Duration::from_secs(10)) else {
            return;
        };
        publish_on(&mut s, &mut round, state, stop);
        thread::sleep(Duration::from_millis(10));
    }
}

/// Publishes on one connection until it fails or `stop`.
fn publish_on(s: &mut std::net::TcpStream, round: &mut u64, state: &Mutex<State>, stop: &Stop) {
    while !stop.is_set() {
        let (cmd, nums) = {
            let mut st = state.lock().unwrap();
            let first = st.next;
            let n = if *round % 5 == 4 { 4 } else { 1 };
            st.next += n;
            let nums: Vec<u64> = (first..first + n).collect();
            let cmd = if n == 1 {
                net::pub_cmd(TOPIC, &body_of(first))
            } else {
                net::mpub_cmd(TOPIC, &nums.iter().map(|&k| body_of(k)).collect::<Vec<_>>())
            };
            (cmd, nums)
        };
        *round += 1;
        if s.write_all(&cmd).is_err() {
            return;
        }
        match net::expect_response(s, |_| {}) {
            Ok((0, d)) if d == b"OK" => {
                let now = Instant::now();
                let mut st = state.lock().unwrap();
                for &k in &nums {
                    st.acked_at.insert(k, now);
                }
                st.acked.extend(nums);
            }
            _ => return,
        }
    }
}

/// Consumes one channel (RDY 50), FINs everything, until the connection fails or `stop`.
/// `slow`: RDY 5 and 5 ms per message, so the channel builds a backlog.
fn consume(tcp: SocketAddr, ci: usize, slow: bool, state: &Mutex<State>, stop: &Stop) {
    let Ok(mut s) = net::v2(tcp, Duration::from_secs(10)) else {
        return;
    };
    let rdy = if slow { 5 } else { 50 };
    if s.write_all(format!("SUB {TOPIC} {}\nRDY {rdy}\n", CHANNELS[ci]).as_bytes())
        .is_err()
    {
        return;
    }
    match net::expect_response(&mut s, |_| {}) {
        Ok((0, d)) if d == b"OK" => {}
        _ => return,
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.is_set() {
        let n = match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        let mut at = 0;
        while pending.len() - at >= 8 {
            let size = u32::from_be_bytes(pending[at..at + 4].try_into().unwrap()) as usize;
            if size < 4 || pending.len() - at < 4 + size {
                break;
            }
            let ft = i32::from_be_bytes(pending[at + 4..at + 8].try_into().unwrap());
            let d = &pending[at + 8..at + 4 + size];
            if ft == 0 && d == b"_heartbeat_" {
                out.extend_from_slice(b"NOP\n");
            } else if ft == 2 {
                if let Some((attempts, id, body)) = net::parse_message(d) {
                    let mut st = state.lock().unwrap();
                    st.attempts[usize::from(attempts.clamp(1, 4)) - 1] += 1;
                    match std::str::from_utf8(body)
                        .ok()
                        .and_then(|b| b.strip_prefix("chaos-"))
                        .and_then(|n| n.parse::<u64>().ok())
                    {
                        Some(k) => *st.received[ci].entry(k).or_insert(0) += 1,
                        None => st.foreign.push(String::from_utf8_lossy(body).into_owned()),
                    }
                    out.extend_from_slice(b"FIN ");
                    out.extend_from_slice(&id);
                    out.push(b'\n');
                    if slow {
                        drop(st);
                        thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            at += 4 + size;
        }
        pending.drain(..at);
        if !out.is_empty() && s.write_all(&out).is_err() {
            return;
        }
    }
}
