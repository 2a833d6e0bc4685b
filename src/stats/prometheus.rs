//! GET /metrics: Prometheus text exposition format 0.0.4 of the nsqd-style topic and
//! channel metrics (labelled by topic, channel and shard), per-shard counters and process
//! metrics. GET /shards: the per-shard counters as JSON.

use super::process::{open_fds, Process};
use nsq_shards::stats::ShardStats;
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

/// Renders every shard's stats (gathered with clients included) as Prometheus text.
pub fn prometheus(shards: &[ShardStats], start_time: i64) -> String {
    let mut out = String::new();
    let mut topic_f = vec![
        (
            "nsq_topic_depth",
            "Messages waiting in the topic (not yet pumped to channels).",
            "gauge",
            vec![],
        ),
        (
            "nsq_topic_messages_total",
            "Messages published to the topic.",
            "counter",
            vec![],
        ),
        (
            "nsq_topic_message_bytes_total",
            "Bytes published to the topic.",
            "counter",
            vec![],
        ),
        (
            "nsq_topic_paused",
            "1 when the topic is paused.",
            "gauge",
            vec![],
        ),
    ];
    let mut chan_f = vec![
        (
            "nsq_channel_depth",
            "Messages ready for delivery on the channel.",
            "gauge",
            vec![],
        ),
        (
            "nsq_channel_in_flight",
            "Messages delivered and not yet finished.",
            "gauge",
            vec![],
        ),
        (
            "nsq_channel_deferred",
            "Messages waiting for their defer time.",
            "gauge",
            vec![],
        ),
        (
            "nsq_channel_messages_total",
            "Messages the channel received from its topic.",
            "counter",
            vec![],
        ),
        (
            "nsq_channel_requeued_total",
            "Messages requeued (REQ).",
            "counter",
            vec![],
        ),
        (
            "nsq_channel_timed_out_total",
            "Messages that timed out in flight.",
            "counter",
            vec![],
        ),
        (
            "nsq_channel_clients",
            "Subscribed clients.",
            "gauge",
            vec![],
        ),
        (
            "nsq_channel_paused",
            "1 when the channel is paused.",
            "gauge",
            vec![],
        ),
    ];
    let mut shard_f = vec![
        (
            "nsq_shard_topics",
            "Topics owned by the shard.",
            "gauge",
            vec![],
        ),
        (
            "nsq_shard_clients",
            "TCP connections on the shard.",
            "gauge",
            vec![],
        ),
        (
            "nsq_shard_messages_in_total",
            "Messages published on the shard.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_messages_out_total",
            "Messages delivered by the shard.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_bytes_out_total",
            "Bytes written to consumers and producers.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_cross_shard_sent_total",
            "Publishes forwarded to another shard.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_cross_shard_received_total",
            "Publishes received from another shard.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_handoffs_received_total",
            "Connections handed to this shard.",
            "counter",
            vec![],
        ),
        (
            "nsq_shard_loop_lag_seconds",
            "Lateness of the shard's last timer tick.",
            "gauge",
            vec![],
        ),
    ];
    for s in shards {
        let sh = s.counters.shard;
        for t in &s.topics {
            let l = format!("topic=\"{}\",shard=\"{sh}\"", esc(&t.topic_name));
            let vals = [
                t.depth as f64,
                t.message_count as f64,
                t.message_bytes as f64,
                t.paused as u8 as f64,
            ];
            for (f, v) in topic_f.iter_mut().zip(vals) {
                f.3.push((l.clone(), v));
            }
            for c in &t.channels {
                let l = format!(
                    "topic=\"{}\",channel=\"{}\",shard=\"{sh}\"",
                    esc(&t.topic_name),
                    esc(&c.channel_name)
                );
                let vals = [
                    c.depth as f64,
                    c.in_flight_count as f64,
                    c.deferred_count as f64,
                    c.message_count as f64,
                    c.requeue_count as f64,
                    c.timeout_count as f64,
                    c.client_count as f64,
                    c.paused as u8 as f64,
                ];
                for (f, v) in chan_f.iter_mut().zip(vals) {
                    f.3.push((l.clone(), v));
                }
            }
        }
        let c = &s.counters;
        let l = format!("shard=\"{sh}\",cpu=\"{}\"", c.cpu);
        let vals = [
            c.topics as f64,
            c.clients as f64,
            c.messages_in as f64,
            c.messages_out as f64,
            c.bytes_out as f64,
            c.cross_shard_sent as f64,
            c.cross_shard_received as f64,
            c.handoffs_received as f64,
            c.loop_lag_us as f64 / 1e6,
        ];
        for (f, v) in shard_f.iter_mut().zip(vals) {
            f.3.push((l.clone(), v));
        }
    }
    for (name, help, kind, samples) in topic_f.into_iter().chain(chan_f).chain(shard_f) {
        render(
            &mut out,
            Family {
                name,
                help,
                kind,
                samples,
            },
        );
    }
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
            &mut out,
            Family {
                name,
                help,
                kind,
                samples: vec![(String::new(), v)],
            },
        );
    }
    out
}
