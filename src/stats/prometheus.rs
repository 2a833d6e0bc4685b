//! GET /metrics: Prometheus text exposition format 0.0.4 of the nsqd-style topic and
//! channel metrics (labelled by topic, channel and shard), per-shard counters and process
//! metrics. GET /shards: the per-shard counters as JSON.

use super::process::{open_fds, Process};
use nsq_shards::stats::{ChannelLag, ChannelStats, ShardCounters, ShardStats, TopicStats};
use std::fmt::Write;

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    samples: Vec<(String, f64)>,
}

fn render(out: &mut String, f: Family) {
    let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
    let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
    for (labels, v) in f.samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{} {}", f.name, v);
        } else {
            let _ = writeln!(out, "{}{{{}}} {}", f.name, labels, v);
        }
    }
}

/// A metric family's (name, help, type).
type Spec = (&'static str, &'static str, &'static str);

/// Per topic, labelled by topic and shard; values from [`topic_values`].
const TOPIC_FAMILIES: &[Spec] = &[
    (
        "nsq_topic_depth",
        "Messages waiting in the topic (not yet pumped to channels).",
        "gauge",
    ),
    (
        "nsq_topic_messages_total",
        "Messages published to the topic.",
        "counter",
    ),
    (
        "nsq_topic_message_bytes_total",
        "Bytes published to the topic.",
        "counter",
    ),
    ("nsq_topic_paused", "1 when the topic is paused.", "gauge"),
];

/// Per channel, labelled by topic, channel and shard; values from [`channel_values`].
const CHANNEL_FAMILIES: &[Spec] = &[
    (
        "nsq_channel_depth",
        "Messages ready for delivery on the channel.",
        "gauge",
    ),
    (
        "nsq_channel_in_flight",
        "Messages delivered and not yet finished.",
        "gauge",
    ),
    (
        "nsq_channel_deferred",
        "Messages waiting for their defer time.",
        "gauge",
    ),
    (
        "nsq_channel_messages_total",
        "Messages the channel received from its topic.",
        "counter",
    ),
    (
        "nsq_channel_requeued_total",
        "Messages requeued (REQ).",
        "counter",
    ),
    (
        "nsq_channel_timed_out_total",
        "Messages that timed out in flight.",
        "counter",
    ),
    ("nsq_channel_clients", "Subscribed clients.", "gauge"),
    (
        "nsq_channel_paused",
        "1 when the channel is paused.",
        "gauge",
    ),
    (
        "nsq_channel_dead_lettered_total",
        "Messages that used up their maximum attempts and went to the dead-letter topic.",
        "counter",
    ),
];

/// Per channel with `--channel-lag-stats` (beyond nsqd; see shards/src/channel/lag.rs);
/// values from [`lag_values`].
const LAG_FAMILIES: &[Spec] = &[
    (
        "nsq_channel_oldest_unfinished_age_seconds",
        "Age (since publish) of the oldest message the channel has not finished; 0 when none.",
        "gauge",
    ),
    (
        "nsq_channel_fin_latency_p50_seconds",
        "Median time from delivery to FIN over the last one to two minutes.",
        "gauge",
    ),
    (
        "nsq_channel_fin_latency_p99_seconds",
        "99th percentile of the time from delivery to FIN over the last one to two minutes.",
        "gauge",
    ),
    (
        "nsq_channel_fin_latency_p999_seconds",
        "99.9th percentile of the time from delivery to FIN over the last one to two minutes.",
        "gauge",
    ),
];

/// Per shard, labelled by shard and CPU; values from [`shard_values`].
const SHARD_FAMILIES: &[Spec] = &[
    ("nsq_shard_topics", "Topics owned by the shard.", "gauge"),
    (
        "nsq_shard_clients",
        "TCP connections on the shard.",
        "gauge",
    ),
    (
        "nsq_shard_messages_in_total",
        "Messages published on the shard.",
        "counter",
    ),
    (
        "nsq_shard_messages_out_total",
        "Messages delivered by the shard.",
        "counter",
    ),
    (
        "nsq_shard_bytes_out_total",
        "Bytes written to consumers and producers.",
        "counter",
    ),
    (
        "nsq_shard_cross_shard_sent_total",
        "Publishes forwarded to another shard.",
        "counter",
    ),
    (
        "nsq_shard_cross_shard_received_total",
        "Publishes received from another shard.",
        "counter",
    ),
    (
        "nsq_shard_handoffs_received_total",
        "Connections handed to this shard.",
        "counter",
    ),
    (
        "nsq_shard_loop_lag_seconds",
        "Lateness of the shard's last timer tick.",
        "gauge",
    ),
];

/// Empty families for `specs`, in order.
fn families(specs: &[Spec]) -> Vec<Family<'static>> {
    specs
        .iter()
        .map(|&(name, help, kind)| Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        })
        .collect()
}

/// Adds one sample with `labels` to each family, in order.
fn push_samples<const N: usize>(fs: &mut [Family], labels: &str, vals: [f64; N]) {
    for (f, v) in fs.iter_mut().zip(vals) {
        f.samples.push((labels.to_string(), v));
    }
}

fn topic_values(t: &TopicStats) -> [f64; 4] {
    [
        t.depth as f64,
        t.message_count as f64,
        t.message_bytes as f64,
        t.paused as u8 as f64,
    ]
}

fn channel_values(c: &ChannelStats) -> [f64; 9] {
    [
        c.depth as f64,
        c.in_flight_count as f64,
        c.deferred_count as f64,
        c.message_count as f64,
        c.requeue_count as f64,
        c.timeout_count as f64,
        c.client_count as f64,
        c.paused as u8 as f64,
        c.limits.dead_count.unwrap_or(0) as f64,
    ]
}

fn lag_values(l: &ChannelLag) -> [f64; 4] {
    [
        l.oldest_unfinished_age_ms as f64 / 1e3,
        l.fin_latency.p50 as f64 / 1e9,
        l.fin_latency.p99 as f64 / 1e9,
        l.fin_latency.p999 as f64 / 1e9,
    ]
}

fn shard_values(c: &ShardCounters) -> [f64; 9] {
    [
        c.topics as f64,
        c.clients as f64,
        c.messages_in as f64,
        c.messages_out as f64,
        c.bytes_out as f64,
        c.cross_shard_sent as f64,
        c.cross_shard_received as f64,
        c.handoffs_received as f64,
        c.loop_lag_us as f64 / 1e6,
    ]
}

/// Renders every shard's stats (gathered with clients included) as Prometheus text.
pub fn prometheus(shards: &[ShardStats], start_time: i64) -> String {
    let mut out = String::new();
    let mut topic_f = families(TOPIC_FAMILIES);
    let mut chan_f = families(CHANNEL_FAMILIES);
    let mut lag_f = families(LAG_FAMILIES);
    let mut shard_f = families(SHARD_FAMILIES);
    for s in shards {
        let sh = s.counters.shard;
        for t in &s.topics {
            let l = format!("topic=\"{}\",shard=\"{sh}\"", esc(&t.topic_name));
            push_samples(&mut topic_f, &l, topic_values(t));
            for c in &t.channels {
                let l = format!(
                    "topic=\"{}\",channel=\"{}\",shard=\"{sh}\"",
                    esc(&t.topic_name),
                    esc(&c.channel_name)
                );
                push_samples(&mut chan_f, &l, channel_values(c));
                if let Some(lag) = &c.lag {
                    push_samples(&mut lag_f, &l, lag_values(lag));
                }
            }
        }
        let c = &s.counters;
        // An unpinned shard moves between CPUs: an empty label keeps its series one.
        let cpu = if c.pinned {
            c.cpu.to_string()
        } else {
            String::new()
        };
        let l = format!("shard=\"{sh}\",cpu=\"{cpu}\"");
        push_samples(&mut shard_f, &l, shard_values(c));
    }
    // The lag families only when some channel has them (`--channel-lag-stats`).
    lag_f.retain(|f| !f.samples.is_empty());
    for f in topic_f
        .into_iter()
        .chain(chan_f)
        .chain(lag_f)
        .chain(shard_f)
    {
        render(&mut out, f);
    }
    process_metrics(&mut out, start_time);
    out
}

/// The replicated topics' families (docs/replication.md) from `GET /cluster`'s JSON:
/// per topic whose owning shard is here, whether this member leads it, the term, the
/// commit index and the Raft log's bytes; on the leader, each replica's lag in entries.
pub fn cluster_metrics(state: &serde_json::Value) -> String {
    let mut out = String::new();
    let mut f = families(&[
        (
            "nsq_cluster_topic_is_leader",
            "1 when this member leads the topic's replication group.",
            "gauge",
        ),
        (
            "nsq_cluster_topic_term",
            "The Raft term of the topic's group.",
            "gauge",
        ),
        (
            "nsq_cluster_topic_commit_index",
            "The Raft commit index of the topic's group.",
            "gauge",
        ),
        (
            "nsq_cluster_topic_raft_log_bytes",
            "Bytes of entries in the topic's Raft log (compacted once every replica has them).",
            "gauge",
        ),
    ]);
    let mut lag = families(&[(
        "nsq_cluster_replica_lag_entries",
        "Raft entries a replica of a topic this member leads is behind the leader.",
        "gauge",
    )]);
    for t in state["topics"].as_array().into_iter().flatten() {
        let l = format!("topic=\"{}\"", esc(t["topic"].as_str().unwrap_or("")));
        let num = |k: &str| t[k].as_f64().unwrap_or(0.0);
        let leads = if t["is_leader"] == true { 1.0 } else { 0.0 };
        push_samples(
            &mut f,
            &l,
            [leads, num("term"), num("commit_index"), num("log_bytes")],
        );
        for r in t["replicas"].as_array().into_iter().flatten() {
            if let Some(n) = r["lag_entries"].as_f64() {
                let rl = format!(
                    "{l},replica=\"{}\"",
                    esc(r["address"].as_str().unwrap_or(""))
                );
                push_samples(&mut lag, &rl, [n]);
            }
        }
    }
    for fam in f.into_iter().chain(lag) {
        render(&mut out, fam);
    }
    out
}

/// The process_* metrics of the Prometheus client libraries.
fn process_metrics(out: &mut String, start_time: i64) {
    let p = Process::read();
    let (cpu, rss, fds) = (p.cpu_seconds, p.resident_bytes as f64, open_fds() as f64);
    for (name, help, kind, v) in [
        (
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            cpu,
        ),
        (
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
            rss,
        ),
        (
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
            fds,
        ),
        (
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            start_time as f64,
        ),
    ] {
        render(
            out,
            Family {
                name,
                help,
                kind,
                samples: vec![(String::new(), v)],
            },
        );
    }
}
