//! Pushing stats to statsd over UDP (nsqd: statsd.go, internal/statsd, internal/writers).
//!
//! Shard 0 runs [`statsd_loop`] when `--statsd-address` is set: every `--statsd-interval`
//! it gathers every shard's stats through the mesh and writes nsqd's metric names
//!
//! ```text
//! <prefix>topic.<t>.message_count:<delta>|c        <prefix>topic.<t>.depth:<n>|g
//! <prefix>topic.<t>.channel.<c>.requeue_count:<delta>|c    <prefix>mem.heap_objects:<n>|g
//! ```
//!
//! one line each, packed without splitting into UDP packets of at most
//! `--statsd-udp-packet-size` bytes, spread over (interval - 1 s). Counters are deltas
//! since the previous push (wrapping like nsqd's uint64 subtraction cast to int64).
//! Nothing here touches the data path: it only reads stats snapshots.

use super::process::Memory;
use crate::server::Server;
use nsq_shards::stats::{ChannelStats, ShardStats, StatsRequest, TopicStats};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// nsqd's prefix: `%s` replaced by `<broadcast-address>_<broadcast-http-port>` with `.`
/// and `:` turned into `_`, and a trailing `.` added when missing. An empty prefix stays
/// empty.
pub fn prefix(template: &str, broadcast_address: &str, http_port: u16) -> String {
    if template.is_empty() {
        return String::new();
    }
    let host = if broadcast_address.contains(':') {
        format!("[{broadcast_address}]:{http_port}") // net.JoinHostPort
    } else {
        format!("{broadcast_address}:{http_port}")
    };
    let key = host.replace(['.', ':'], "_");
    let mut p = template.replace("%s", &key);
    if !p.ends_with('.') {
        p.push('.');
    }
    p
}

/// The prefix this server uses (broadcast HTTP port, or the listening one when 0).
pub fn server_prefix(server: &Server) -> String {
    let c = &server.cfg;
    let port = if c.flags.broadcast_http_port != 0 {
        c.flags.broadcast_http_port
    } else {
        server.http_port
    };
    prefix(&c.flags.statsd_prefix, &c.broadcast_address, port)
}

/// Counter values of the previous push, keyed by metric name.
#[derive(Default)]
pub struct Previous {
    counters: HashMap<String, u64>,
}

/// Writes statsd lines (`<prefix><stat>:<value>|c` or `|g`).
pub struct Lines {
    prefix: String,
    pub lines: Vec<String>,
}

impl Lines {
    pub fn new(prefix: &str) -> Lines {
        Lines {
            prefix: prefix.to_string(),
            lines: Vec::new(),
        }
    }
    fn incr(&mut self, stat: &str, v: i64) {
        self.lines.push(format!("{}{stat}:{v}|c\n", self.prefix));
    }
    fn gauge(&mut self, stat: &str, v: i64) {
        self.lines.push(format!("{}{stat}:{v}|g\n", self.prefix));
    }
}

/// The delta of a counter since the previous push; nsqd compares with the same topic or
/// channel of the previous collection (0 when it was not there).
fn delta(
    prev: &HashMap<String, u64>,
    next: &mut HashMap<String, u64>,
    key: String,
    v: u64,
) -> (String, i64) {
    let last = prev.get(&key).copied().unwrap_or(0);
    next.insert(key.clone(), v);
    (key, v.wrapping_sub(last) as i64)
}

/// nsqd's `%.0f` of quantile × 100 (0.99 → `99`, 0.999 → `100`).
fn quantile_name(q: f64) -> String {
    format!("{:.0}", q * 100.0)
}

/// Every line of one push, in nsqd's order: per topic (sorted by name) its counters and
/// gauges, then per channel; then the memory gauges.
pub fn render(
    topics: &[&TopicStats],
    prev: &mut Previous,
    prefix: &str,
    exclude_ephemeral: bool,
    mem: Option<&Memory>,
) -> Vec<String> {
    let mut push = Push {
        out: Lines::new(prefix),
        prev: &prev.counters,
        next: HashMap::new(),
    };
    for t in topics {
        if exclude_ephemeral && t.topic_name.ends_with("#ephemeral") {
            continue;
        }
        push.topic(t);
        for c in &t.channels {
            if exclude_ephemeral && c.channel_name.ends_with("#ephemeral") {
                continue;
            }
            push.channel(&t.topic_name, c);
        }
    }
    if let Some(m) = mem {
        push.memory(m);
    }
    let Push { out, next, .. } = push;
    prev.counters = next;
    out.lines
}

/// One push being rendered: its lines and the counter values it saw.
struct Push<'a> {
    out: Lines,
    /// Counter values of the previous push.
    prev: &'a HashMap<String, u64>,
    /// Counter values of this push.
    next: HashMap<String, u64>,
}

impl Push<'_> {
    /// A counter, as its delta since the previous push.
    fn counter(&mut self, key: String, v: u64) {
        let (k, d) = delta(self.prev, &mut self.next, key, v);
        self.out.incr(&k, d);
    }

    fn gauge(&mut self, stat: &str, v: i64) {
        self.out.gauge(stat, v);
    }

    /// A topic's lines (nsqd: statsd.go, per topic).
    fn topic(&mut self, t: &TopicStats) {
        let tn = &t.topic_name;
        self.counter(format!("topic.{tn}.message_count"), t.message_count);
        self.counter(format!("topic.{tn}.message_bytes"), t.message_bytes);
        self.gauge(&format!("topic.{tn}.depth"), t.depth as i64);
        self.gauge(&format!("topic.{tn}.backend_depth"), t.backend_depth as i64);
        for pc in t.e2e_processing_latency.percentiles.iter().flatten() {
            let q = quantile_name(pc.quantile);
            self.gauge(&format!("topic.{tn}.e2e_processing_latency_{q}"), pc.value);
        }
    }

    /// A channel's lines (nsqd: statsd.go, per channel).
    fn channel(&mut self, tn: &str, c: &ChannelStats) {
        let base = format!("topic.{tn}.channel.{}", c.channel_name);
        self.counter(format!("{base}.message_count"), c.message_count);
        self.gauge(&format!("{base}.depth"), c.depth as i64);
        self.gauge(&format!("{base}.backend_depth"), c.backend_depth as i64);
        self.gauge(&format!("{base}.in_flight_count"), c.in_flight_count as i64);
        self.gauge(&format!("{base}.deferred_count"), c.deferred_count as i64);
        self.counter(format!("{base}.requeue_count"), c.requeue_count);
        self.counter(format!("{base}.timeout_count"), c.timeout_count);
        self.gauge(&format!("{base}.clients"), c.client_count as i64);
        // Beyond nsqd: only for a channel with a maximum attempts in force.
        if let Some(n) = c.limits.dead_count {
            self.counter(format!("{base}.dead_count"), n);
        }
        for pc in c.e2e_processing_latency.percentiles.iter().flatten() {
            let q = quantile_name(pc.quantile);
            self.gauge(&format!("{base}.e2e_processing_latency_{q}"), pc.value);
        }
        // Beyond nsqd, with --channel-lag-stats: the channel's lag in time (ms), see
        // shards/src/channel/lag.rs.
        let Some(lag) = &c.lag else { return };
        let age = lag.oldest_unfinished_age_ms as i64;
        self.gauge(&format!("{base}.oldest_unfinished_age_ms"), age);
        for (q, ns) in [
            ("p50", lag.fin_latency.p50),
            ("p99", lag.fin_latency.p99),
            ("p999", lag.fin_latency.p999),
        ] {
            self.gauge(
                &format!("{base}.fin_latency_{q}_ms"),
                (ns / 1_000_000) as i64,
            );
        }
    }

    /// The memory gauges (nsqd: statsd.go with --statsd-mem-stats).
    fn memory(&mut self, m: &Memory) {
        self.gauge("mem.heap_objects", m.heap_objects as i64);
        self.gauge("mem.heap_idle_bytes", m.heap_idle_bytes as i64);
        self.gauge("mem.heap_in_use_bytes", m.heap_in_use_bytes as i64);
        self.gauge("mem.heap_released_bytes", m.heap_released_bytes as i64);
        self.gauge("mem.gc_pause_usec_100", m.gc_pause_usec_100 as i64);
        self.gauge("mem.gc_pause_usec_99", m.gc_pause_usec_99 as i64);
        self.gauge("mem.gc_pause_usec_95", m.gc_pause_usec_95 as i64);
        self.gauge("mem.next_gc_bytes", m.next_gc_bytes as i64);
        self.counter("mem.gc_runs".into(), m.gc_total_runs);
    }
}

/// Packs lines into packets of at most `size` bytes without splitting a line (nsqd's
/// BoundaryBufferedWriter: a line longer than `size` goes out alone).
pub fn pack(lines: &[String], size: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    for l in lines {
        if !cur.is_empty() && cur.len() + l.len() > size {
            out.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(l.as_bytes());
        if cur.len() >= size {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Resolves the statsd address (`host:port`) off the executor thread (DNS may block;
/// [`crate::dns`]).
async fn resolve(addr: &str) -> Option<SocketAddr> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Some(sa);
    }
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    crate::dns::lookup(host, port.parse().ok()?).await.ok()
}

/// One push: dial UDP, send the packets spread over `spread`, close. Errors are logged
/// and the push is skipped, as nsqd does.
async fn push(server: &Server, prev: &mut Previous, spread: Duration) {
    let c = &server.cfg;
    let addr = &c.flags.statsd_address;
    let Some(sa) = resolve(addr).await else {
        log::error!("failed to create UDP socket to statsd({addr})");
        return;
    };
    let bind = if sa.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let sock = match glommio::net::UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => {
            log::error!("failed to create UDP socket to statsd({addr}) - {e}");
            return;
        }
    };
    if let Err(e) = sock.connect(sa).await {
        log::error!("failed to create UDP socket to statsd({addr}) - {e}");
        return;
    }
    log::info!("STATSD: pushing stats to {addr}");
    let req = StatsRequest {
        include_clients: false,
        ..Default::default()
    };
    let shards: Vec<ShardStats> = server.gather_stats(&req).await;
    let mut topics: Vec<&TopicStats> = shards.iter().flat_map(|s| s.topics.iter()).collect();
    topics.sort_by(|a, b| a.topic_name.cmp(&b.topic_name));
    let mem = c.flags.statsd_mem_stats.then(Memory::read);
    let lines = render(
        &topics,
        prev,
        &server_prefix(server),
        c.flags.statsd_exclude_ephemeral,
        mem.as_ref(),
    );
    let packets = pack(&lines, c.flags.statsd_udp_packet_size.max(1));
    let gap = if packets.is_empty() {
        Duration::ZERO
    } else {
        spread / packets.len() as u32
    };
    let mut exiting = false;
    for p in &packets {
        // UDP errors (e.g. ECONNREFUSED from an earlier ICMP) are ignored, like nsqd.
        let _ = sock.send(p).await;
        if !gap.is_zero() && !exiting {
            // Exiting skips the remaining sleeps but still sends (nsqd's SpreadWriter).
            let sleep = pin!(glommio::timer::sleep(gap));
            let stop = pin!(server.shard.shutdown.wait());
            exiting = matches!(
                futures::future::select(sleep, stop).await,
                futures::future::Either::Right(_)
            );
        }
    }
}

/// Shard 0's statsd loop (started only when `--statsd-address` is set).
pub async fn statsd_loop(server: Rc<Server>) {
    let interval = server.cfg.flags.statsd_interval;
    let spread = interval.saturating_sub(Duration::from_secs(1));
    let mut prev = Previous::default();
    let mut next = Instant::now() + interval;
    loop {
        let sleep = pin!(glommio::timer::sleep(
            next.saturating_duration_since(Instant::now())
        ));
        let stop = pin!(server.shard.shutdown.wait());
        if let futures::future::Either::Right(_) = futures::future::select(sleep, stop).await {
            break;
        }
        push(&server, &mut prev, spread).await;
        next += interval;
        let now = Instant::now();
        if next < now {
            // A push ran late: keep the ticker's cadence, skipping missed ticks.
            next = now + interval
                - Duration::from_nanos(((now - next).as_nanos() % interval.as_nanos()) as u64);
        }
    }
    log::info!("STATSD: closing");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(
            prefix("nsq.%s", "host.example", 4151),
            "nsq.host_example_4151."
        );
        assert_eq!(prefix("nsq.%s.", "h", 1), "nsq.h_1.");
        assert_eq!(prefix("", "h", 1), "");
        assert_eq!(prefix("stats", "::1", 4151), "stats.");
        assert_eq!(prefix("%s", "::1", 80), "[__1]_80.");
    }

    #[test]
    fn packing_never_splits_lines() {
        let lines: Vec<String> = (0..10).map(|i| format!("nsq.a.b_{i}:1|c\n")).collect();
        let ps = pack(&lines, 40);
        for p in &ps {
            assert!(p.len() <= 40);
            assert!(p.ends_with(b"\n"));
        }
        let all: Vec<u8> = ps.concat();
        assert_eq!(all, lines.concat().into_bytes());
        // a line longer than the packet size goes out alone
        let long = vec!["x".repeat(50) + "\n", "y:1|c\n".into()];
        let ps = pack(&long, 40);
        assert_eq!(ps.len(), 2);
    }

    #[test]
    fn quantiles() {
        assert_eq!(quantile_name(0.99), "99");
        assert_eq!(quantile_name(0.999), "100");
        assert_eq!(quantile_name(0.5), "50");
    }
}
