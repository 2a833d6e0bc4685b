//! /stats rendering: nsqd's JSON schema and text layout (nsqd: http.go doStats,
//! printStats), merged from every shard's snapshot, plus this broker's per-shard section.

use super::process::Memory;
use crate::config::go_duration_string;
use crate::server::Server;
use crate::timefmt;
use nsq_shards::stats::{ClientStats, ShardCounters, ShardStats, StatsRequest, TopicStats};
use nsq_wire::identify::VERSION;
use serde::Serialize;
use std::fmt::Write;

#[derive(Serialize)]
struct StatsDoc<'a> {
    version: &'static str,
    health: &'a str,
    start_time: i64,
    topics: Option<Vec<&'a TopicStats>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Memory>,
    producers: Option<Vec<&'a ClientStats>>,
    /// Added by this broker: one entry per shard.
    shards: Vec<&'a ShardCounters>,
    /// Added by this broker in a cluster: `GET /cluster`'s document (members, each
    /// replicated topic's leader, replicas, in-sync set and lag; docs/replication.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<serde_json::Value>,
}

/// Every shard's topics (by name) and producers. A `topic=` filter naming no topic gives
/// no topics (`None`: JSON `null`) and no producers, as nsqd's GetStats returns early;
/// a known topic without the `channel=` filter's channel gives `Some([])`.
fn merged<'a>(
    req: &StatsRequest,
    shards: &'a [ShardStats],
) -> (Option<Vec<&'a TopicStats>>, Vec<&'a ClientStats>) {
    if !req.topic.is_empty() && !shards.iter().any(|s| s.topic_found) {
        return (None, Vec::new());
    }
    let mut topics: Vec<&TopicStats> = shards.iter().flat_map(|s| s.topics.iter()).collect();
    topics.sort_by(|a, b| a.topic_name.cmp(&b.topic_name));
    let producers = shards.iter().flat_map(|s| s.producers.iter()).collect();
    (Some(topics), producers)
}

/// `/stats?format=json`. An unknown `topic=` filter gives `"topics":null` (and
/// `"producers":null`) like nsqd, a known topic without the `channel=` filter's channel
/// `"topics":[]`; no producers gives `"producers":null`.
pub fn json(
    server: &Server,
    req: &StatsRequest,
    shards: &[ShardStats],
    include_mem: bool,
    cluster: Option<serde_json::Value>,
) -> Vec<u8> {
    let (topics, producers) = merged(req, shards);
    let health = health_text(shards);
    let doc = StatsDoc {
        version: VERSION,
        health: &health,
        start_time: server.cfg.start_time,
        topics,
        memory: include_mem.then(Memory::read),
        producers: (!producers.is_empty()).then_some(producers),
        shards: shards.iter().map(|s| &s.counters).collect(),
        cluster,
    };
    nsq_wire::json::to_vec_go(&doc)
}

/// nsqd's health string: `OK` or `NOK - <last disk error>`.
fn health_text(shards: &[ShardStats]) -> String {
    match shards.iter().find_map(|s| s.counters.health_error.clone()) {
        None => "OK".into(),
        Some(e) => format!("NOK - {e}"),
    }
}

fn client_line(c: &ClientStats) -> String {
    let port = c
        .remote_address
        .rsplit_once(':')
        .map(|(_, p)| p)
        .unwrap_or("");
    let id = format!("{}:{} {}", c.hostname, port, c.user_agent);
    let connected = (timefmt::now_secs() - c.connect_ts).max(0) as u64;
    let dur = go_duration_string(std::time::Duration::from_secs(connected));
    if !c.pub_counts.is_empty() {
        let total: u64 = c.pub_counts.iter().map(|p| p.count).sum();
        let topics: Vec<String> = c
            .pub_counts
            .iter()
            .map(|p| format!("{}={}", p.topic, p.count))
            .collect();
        return format!(
            "[{} {:<21}] msgs: {:<8} topics: {} connected: {}",
            c.version,
            id,
            total,
            topics.join(","),
            dur
        );
    }
    format!(
        "[{} {:<21}] state: {} inflt: {:<4} rdy: {:<4} fin: {:<8} re-q: {:<8} msgs: {:<8} connected: {}",
        c.version, id, c.state, c.in_flight_count, c.ready_count, c.finish_count, c.requeue_count, c.message_count, dur
    )
}

/// The `e2e%:` column: each percentile's value, `, `-separated (nsqd: quantile.Result
/// String with stringy.NanoSecondToHuman: `1.2ms`, `850.0us`).
fn e2e_text(e: &nsq_shards::stats::E2eLatency) -> String {
    let human = |v: f64| {
        let (v, unit) = if v > 1e9 {
            (v / 1e9, "s")
        } else if v > 1e6 {
            (v / 1e6, "ms")
        } else if v > 1e3 {
            (v / 1e3, "us")
        } else {
            (v, "ns")
        };
        format!("{v:.1}{unit}")
    };
    let parts: Vec<String> = e
        .percentiles
        .iter()
        .flatten()
        .map(|p| human(p.value as f64))
        .collect();
    parts.join(", ")
}

/// `/stats` (text), laid out like nsqd's printStats, then a `Shards:` section.
pub fn text(
    server: &Server,
    req: &StatsRequest,
    shards: &[ShardStats],
    include_mem: bool,
) -> Vec<u8> {
    let (topics, producers) = merged(req, shards);
    let topics = topics.unwrap_or_default();
    let mut w = String::new();
    let start = server.cfg.start_time;
    let uptime = std::time::Duration::from_nanos(
        (nsq_shards::message::now_unix_nanos() - start * 1_000_000_000).max(0) as u64,
    );
    let _ = writeln!(w, "nsqd v{VERSION} (built w/rust)");
    let _ = writeln!(w, "start_time {}", timefmt::rfc3339(start));
    let _ = writeln!(w, "uptime {}", go_duration_string(uptime));
    let _ = writeln!(w, "\nHealth: {}", health_text(shards));
    if include_mem {
        memory_text(&mut w);
    }
    if topics.is_empty() {
        let _ = writeln!(w, "\nTopics: None");
    } else {
        let _ = write!(w, "\nTopics:");
    }
    for t in &topics {
        topic_text(&mut w, t);
    }
    if producers.is_empty() {
        let _ = writeln!(w, "\nProducers: None");
    } else {
        let _ = writeln!(w, "\nProducers:");
        for c in producers {
            let _ = writeln!(w, "   {}", client_line(c));
        }
    }
    shards_text(&mut w, shards);
    w.into_bytes()
}

/// The memory section of the text /stats (nsqd: printStats with include_mem).
fn memory_text(w: &mut String) {
    let m = Memory::read();
    let _ = writeln!(w, "\nMemory:");
    for (k, v) in [
        ("heap_objects", m.heap_objects),
        ("heap_idle_bytes", m.heap_idle_bytes),
        ("heap_in_use_bytes", m.heap_in_use_bytes),
        ("heap_released_bytes", m.heap_released_bytes),
        ("gc_pause_usec_100", m.gc_pause_usec_100),
        ("gc_pause_usec_99", m.gc_pause_usec_99),
        ("gc_pause_usec_95", m.gc_pause_usec_95),
        ("next_gc_bytes", m.next_gc_bytes),
        ("gc_total_runs", m.gc_total_runs),
    ] {
        let _ = writeln!(w, "   {k:<25}\t{v}");
    }
}

/// A topic's line and its channels' lines (with their clients) in the text /stats.
fn topic_text(w: &mut String, t: &TopicStats) {
    let p = if t.paused { "*P " } else { "   " };
    let _ = writeln!(
        w,
        "\n{p}[{:<15}] depth: {:<5} be-depth: {:<5} msgs: {:<8} e2e%: {}",
        t.topic_name,
        t.depth,
        t.backend_depth,
        t.message_count,
        e2e_text(&t.e2e_processing_latency)
    );
    for c in &t.channels {
        let p = if c.paused { "   *P " } else { "      " };
        let _ = writeln!(
            w,
            "{p}[{:<25}] depth: {:<5} be-depth: {:<5} inflt: {:<4} def: {:<4} re-q: {:<5} timeout: {:<5} msgs: {:<8} e2e%: {}",
            c.channel_name,
            c.depth,
            c.backend_depth,
            c.in_flight_count,
            c.deferred_count,
            c.requeue_count,
            c.timeout_count,
            c.message_count,
            e2e_text(&c.e2e_processing_latency)
        );
        for cl in c.clients.iter().flatten() {
            let _ = writeln!(w, "        {}", client_line(cl));
        }
    }
}

/// This broker's per-shard section of the text /stats.
fn shards_text(w: &mut String, shards: &[ShardStats]) {
    let _ = writeln!(w, "\nShards:");
    for s in shards {
        let c = &s.counters;
        let _ = writeln!(
            w,
            "   [shard {:<3} cpu {:<3}] topics: {:<5} channels: {:<5} clients: {:<5} msgs-in: {:<10} msgs-out: {:<10} depth: {:<8} inflt: {:<6} def: {:<6} xshard-sent: {:<8} xshard-recv: {:<8} handoffs: {}/{}",
            c.shard, c.cpu, c.topics, c.channels, c.clients, c.messages_in, c.messages_out, c.depth, c.in_flight, c.deferred,
            c.cross_shard_sent, c.cross_shard_received, c.handoffs_sent, c.handoffs_received
        );
    }
}
