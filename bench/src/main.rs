//! nsq-bench: a load generator for nsqd-compatible brokers, speaking TCP protocol V2.
//!
//! Plain OS threads with blocking sockets: each producer is a writer thread (MPUB batches
//! built in one reused buffer, up to --pipeline writes in flight) plus a reader thread
//! matching OKs; each consumer is one thread reading 1 MiB at a time and FINishing all
//! the messages of a read with one write. Nothing is allocated per message.
//!
//! Every body starts with a 24-byte header `[u64 publish unix ns][u64 seq][u32 producer]
//! [u32 run id]` (big-endian). In pubsub mode consumers mark (producer, seq) in a bitmap
//! per channel, so the end report gives exact lost and duplicate counts.

mod args;
mod consumer;
mod producer;
mod report;
mod schedule;
mod tls;

use args::{indexed_name, Args, Mode};
use clap::Parser;
use consumer::{ConsumerStats, Seen, Sub};
use hdrhistogram::Histogram;
use producer::ProducerStats;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Size of the header every body starts with.
pub const HEADER: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ts_ns: u64,
    pub seq: u64,
    pub producer: u32,
    pub run_id: u32,
}

pub fn write_header(b: &mut [u8], ts_ns: u64, seq: u64, producer: u32, run_id: u32) {
    b[0..8].copy_from_slice(&ts_ns.to_be_bytes());
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    b[16..20].copy_from_slice(&producer.to_be_bytes());
    b[20..24].copy_from_slice(&run_id.to_be_bytes());
}

pub fn read_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER {
        return None;
    }
    let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    Some(Header {
        ts_ns: u64_at(0),
        seq: u64_at(8),
        producer: u32_at(16),
        run_id: u32_at(20),
    })
}

pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Latency histogram in µs, 1 µs .. 1 hour, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

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
        let mut e = self.errors.lock().unwrap();
        if e.len() < 100 {
            e.push(msg);
        }
    }
}

struct ConsumerSlot {
    topic: usize,
    channel: usize,
    stats: Arc<ConsumerStats>,
    handle: std::thread::JoinHandle<Seen>,
}

fn main() {
    let mut args = Args::parse();
    args.normalize();
    if let Err(e) = args.validate() {
        eprintln!("nsq-bench: {e}");
        std::process::exit(2);
    }
    std::process::exit(run(args));
}

fn run(args: Args) -> i32 {
    let mode = args.mode;
    let run_id = ((now_unix_ns() / 1000) as u32 ^ (std::process::id() << 12)) | 1;
    let base_topic = args.topic.clone().unwrap_or_else(|| match mode {
        Mode::Pubsub => format!("nsq_bench_{run_id:08x}"),
        _ => "nsq_bench".to_string(),
    });
    let topics: Vec<String> = (0..args.topics)
        .map(|i| indexed_name(&base_topic, i, args.topics))
        .collect();
    let channels: Vec<String> = (0..args.channels)
        .map(|i| indexed_name(&args.channel, i, args.channels))
        .collect();
    let tls = match &args.tls_ca {
        None => None,
        Some(p) => match tls::client_config(p) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("nsq-bench: --tls-ca: {e}");
                return 2;
            }
        },
    };
    let shared = Arc::new(Shared {
        args: args.clone(),
        run_id,
        topics,
        channels,
        check_seq: mode == Mode::Pubsub,
        stop_consumers: AtomicBool::new(false),
        abort: AtomicBool::new(false),
        measure_from_ns: AtomicU64::new(0),
        drained_ns: AtomicU64::new(0),
        error_count: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        tls,
    });
    let a = &shared.args;

    // Consumers first, so a pubsub run's channels exist before anything is published.
    let mut consumers: Vec<ConsumerSlot> = Vec::new();
    if mode.consumes() {
        for addr in &a.nsqd_tcp_address {
            for t in 0..shared.topics.len() {
                for c in 0..shared.channels.len() {
                    for k in 0..a.consumers {
                        let stats = Arc::new(ConsumerStats::new());
                        let name = format!("consumer-{}-{}-{}-{}", consumers.len(), t, c, k);
                        let (sh, st, addr) = (shared.clone(), stats.clone(), addr.clone());
                        let handle = std::thread::Builder::new()
                            .name(format!("cons-{}", consumers.len()))
                            .spawn(move || {
                                let sub = Sub {
                                    addr: &addr,
                                    topic: &sh.topics[t],
                                    channel: &sh.channels[c],
                                    name,
                                };
                                consumer::run(sh.clone(), sub, st)
                            })
                            .expect("spawn consumer");
                        consumers.push(ConsumerSlot {
                            topic: t,
                            channel: c,
                            stats,
                            handle,
                        });
                    }
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = consumers.iter().all(|c| {
                c.stats.subscribed.load(Ordering::SeqCst) || c.stats.done.load(Ordering::SeqCst)
            });
            if ready || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !consumers
            .iter()
            .all(|c| c.stats.subscribed.load(Ordering::SeqCst))
        {
            shared.error("not every consumer subscribed within 10s".into());
            if mode == Mode::Pubsub {
                shared.stop_consumers.store(true, Ordering::SeqCst);
                for c in consumers {
                    let _ = c.handle.join();
                }
                let r = report::Results::failed(&shared);
                r.print(a.json);
                return 1;
            }
        }
    }

    let t0 = Instant::now();
    let measure_start = t0 + a.warmup;
    let end = measure_start + a.runfor;
    shared
        .measure_from_ns
        .store(now_unix_ns() + a.warmup.as_nanos() as u64, Ordering::SeqCst);

    let mut producer_stats: Vec<Arc<ProducerStats>> = Vec::new();
    let mut producers = Vec::new();
    if mode.publishes() {
        for p in 0..a.producers {
            let stats = Arc::new(ProducerStats::new(shared.topics.len()));
            producer_stats.push(stats.clone());
            let addr = a.nsqd_tcp_address[p % a.nsqd_tcp_address.len()].clone();
            let sh = shared.clone();
            producers.push(
                std::thread::Builder::new()
                    .name(format!("prod-{p}"))
                    .spawn(move || producer::run(sh, p as u32, addr, t0, end, stats))
                    .expect("spawn producer"),
            );
        }
    }

    let acked = || -> u64 {
        producer_stats
            .iter()
            .map(|s| s.acked.load(Ordering::Relaxed))
            .sum()
    };
    let received = || -> u64 {
        consumers
            .iter()
            .map(|c| c.stats.received.load(Ordering::Relaxed))
            .sum()
    };
    let merged_hist = || {
        let mut h = new_hist();
        for c in &consumers {
            let _ = h.add(&*c.stats.hist.lock().unwrap());
        }
        h
    };
    // A schedule of several phases: when, after its last phase started, the channels'
    // backlog (acknowledged x channels - received) fell to what 100 ms of the last rate
    // (at least 1000 messages) leaves in flight.
    let burst = a
        .rate_schedule
        .as_ref()
        .filter(|s| s.len() > 1 && mode == Mode::Pubsub)
        .map(|s| {
            (
                t0 + s.last_phase_start(),
                (s.last_rate() * 0.1).max(1000.0) as u64,
            )
        });
    let mut drained_at: Option<Instant> = None;
    let mut check_drain = |now: Instant| {
        if let (Some((from, limit)), None) = (burst, drained_at) {
            let expected = acked() * shared.channels.len() as u64;
            if now >= from && expected.saturating_sub(received()) <= limit {
                drained_at = Some(now);
                shared.drained_ns.store(now_unix_ns(), Ordering::SeqCst);
            }
        }
    };

    // Run: a progress line every second, counters sampled at the window's edges. A `sub`
    // run also ends once something arrived and then nothing for --idle-timeout (a drained
    // backlog); its window then ends at the last arrival.
    let mut window_start = (0u64, 0u64);
    let mut measured_started = a.warmup.is_zero();
    let mut next_tick = t0 + Duration::from_secs(1);
    let mut last = (t0, 0u64, 0u64);
    let mut last_rx = (t0, 0u64);
    let mut window_end_at = end;
    loop {
        let mut next = next_tick.min(end);
        if !measured_started {
            next = next.min(measure_start);
        }
        let now = Instant::now();
        if mode == Mode::Sub {
            next = next.min(now + Duration::from_millis(20));
        }
        if burst.is_some() && shared.drained_ns.load(Ordering::Relaxed) == 0 {
            next = next.min(now + Duration::from_millis(20));
        }
        if next > now {
            std::thread::sleep(next - now);
        }
        let now = Instant::now();
        check_drain(now);
        if !measured_started && now >= measure_start {
            window_start = (acked(), received());
            measured_started = true;
        }
        if now >= end {
            break;
        }
        if now >= next_tick {
            next_tick += Duration::from_secs(1);
            let (pa, sr) = (acked(), received());
            let dt = (now - last.0).as_secs_f64();
            if !a.quiet {
                let mut line = format!("[{:>5.1}s]", (now - t0).as_secs_f64());
                if mode.publishes() {
                    line += &format!(
                        " pub {:>10}/s",
                        report::fmt_count(((pa - last.1) as f64 / dt) as u64)
                    );
                }
                if mode.consumes() {
                    line += &format!(
                        " sub {:>10}/s  p99 {:>8}",
                        report::fmt_count(((sr - last.2) as f64 / dt) as u64),
                        report::fmt_us(merged_hist().value_at_quantile(0.99))
                    );
                }
                line += &format!("  errors {}", shared.error_count.load(Ordering::Relaxed));
                if now < measure_start {
                    line += " (warmup)";
                }
                eprintln!("{line}");
            }
            last = (now, pa, sr);
        }
        if mode == Mode::Sub {
            let r = received();
            if let Some(expect) = a.expect {
                let per_channel = shared.topics.len() * shared.channels.len();
                let all_in = (0..per_channel).all(|i| {
                    let got: u64 = consumers
                        .iter()
                        .filter(|c| c.topic * shared.channels.len() + c.channel == i)
                        .map(|c| c.stats.received.load(Ordering::Relaxed))
                        .sum();
                    got >= expect
                });
                if all_in {
                    window_end_at = now;
                    break;
                }
            }
            if r != last_rx.1 {
                last_rx = (now, r);
            } else if r > 0 && now - last_rx.0 >= a.idle_timeout {
                window_end_at = last_rx.0;
                break;
            }
            if consumers
                .iter()
                .all(|c| c.stats.done.load(Ordering::SeqCst))
            {
                window_end_at = now;
                break;
            }
        }
    }
    let measured = window_end_at
        .min(Instant::now())
        .saturating_duration_since(measure_start)
        .min(a.runfor);
    let window_end = (acked(), received());

    let mut ack_hist = new_hist();
    for p in producers {
        if let Ok(h) = p.join() {
            let _ = ack_hist.add(&h);
        }
    }

    // Drain: until every channel has everything, nothing arrived for --idle-timeout, or
    // --drain-timeout.
    let sent_per_topic: Vec<u64> = (0..shared.topics.len())
        .map(|t| {
            producer_stats
                .iter()
                .map(|s| s.acked_per_topic[t].load(Ordering::SeqCst))
                .sum()
        })
        .collect();
    if mode == Mode::Pubsub {
        let idle = a
            .idle_timeout
            .max(Duration::from_millis(a.deferred_ms) + Duration::from_secs(1));
        let drain_start = Instant::now();
        let mut last_total = received();
        let mut last_change = drain_start;
        loop {
            let complete = (0..shared.topics.len()).all(|t| {
                (0..shared.channels.len()).all(|c| {
                    let got: u64 = consumers
                        .iter()
                        .filter(|s| s.topic == t && s.channel == c)
                        .map(|s| s.stats.received.load(Ordering::Relaxed))
                        .sum();
                    got >= sent_per_topic[t]
                })
            });
            let now = Instant::now();
            check_drain(now);
            let total = received();
            if total != last_total {
                last_total = total;
                last_change = now;
            }
            if complete
                || now - last_change >= idle
                || now - drain_start >= a.drain_timeout
                || consumers
                    .iter()
                    .all(|c| c.stats.done.load(Ordering::SeqCst))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    shared.stop_consumers.store(true, Ordering::SeqCst);
    let hist = merged_hist();
    let drain = burst.map(|(from, _)| {
        let mut after = new_hist();
        for c in &consumers {
            let _ = after.add(&*c.stats.hist_after.lock().unwrap());
        }
        let ms = drained_at.map(|t| t.saturating_duration_since(from).as_secs_f64() * 1e3);
        (ms, after)
    });
    let mut per_channel: Vec<report::ChannelResult> = Vec::new();
    let mut seen_by: Vec<Option<Seen>> = (0..shared.topics.len() * shared.channels.len())
        .map(|_| None)
        .collect();
    let mut foreign = 0;
    let mut raw_by: Vec<u64> = vec![0; seen_by.len()];
    for c in consumers {
        let idx = c.topic * shared.channels.len() + c.channel;
        foreign += c.stats.foreign.load(Ordering::SeqCst);
        raw_by[idx] += c.stats.received.load(Ordering::SeqCst);
        if let Ok(s) = c.handle.join() {
            match &mut seen_by[idx] {
                Some(m) => m.merge(&s),
                slot @ None => *slot = Some(s),
            }
        }
    }
    if mode.consumes() {
        for (t, &sent) in sent_per_topic.iter().enumerate() {
            for c in 0..shared.channels.len() {
                let idx = t * shared.channels.len() + c;
                let seen = seen_by[idx].take().unwrap_or_default();
                let mut cr = report::ChannelResult {
                    topic: shared.topics[t].clone(),
                    channel: shared.channels[c].clone(),
                    sent,
                    received: raw_by[idx],
                    unique: 0,
                    lost: 0,
                    duplicates: 0,
                };
                if mode == Mode::Pubsub {
                    cr.unique = seen.total();
                    cr.duplicates = seen.duplicates;
                    cr.lost = producer_stats
                        .iter()
                        .enumerate()
                        .map(|(p, s)| {
                            let n = s.acked_per_topic[t].load(Ordering::SeqCst);
                            n - seen.count_below(p, n).min(n)
                        })
                        .sum();
                } else {
                    cr.unique = cr.received;
                    if let Some(expect) = a.expect {
                        cr.sent = expect;
                        cr.lost = expect.saturating_sub(cr.received);
                    }
                }
                per_channel.push(cr);
            }
        }
    }

    let secs = measured.as_secs_f64().max(1e-9);
    let r = report::Results {
        mode,
        args: a.clone(),
        measured_s: secs,
        pub_msgs: window_end.0 - window_start.0,
        sub_msgs: window_end.1 - window_start.1,
        sent: acked(),
        written: producer_stats
            .iter()
            .map(|s| s.written.load(Ordering::SeqCst))
            .sum(),
        received: per_channel.iter().map(|c| c.received).sum(),
        foreign,
        errors: shared.error_count.load(Ordering::SeqCst),
        error_messages: shared.errors.lock().unwrap().clone(),
        latency: hist,
        ack_latency: ack_hist,
        channels: per_channel,
        topics: shared.topics.clone(),
        drain,
    };
    r.print(a.json);
    r.exit_code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let mut b = [0u8; 30];
        write_header(&mut b, 1_700_000_000_000_000_001, 42, 7, 0xdead_beef);
        let h = read_header(&b).unwrap();
        assert_eq!(
            h,
            Header {
                ts_ns: 1_700_000_000_000_000_001,
                seq: 42,
                producer: 7,
                run_id: 0xdead_beef
            }
        );
        assert_eq!(read_header(&b[..23]), None);
    }
}
