//! The end report: a table (stdout, or stderr with --json) and the JSON object.

use crate::args::{Args, Mode};
use crate::Shared;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

pub struct ChannelResult {
    pub topic: String,
    pub channel: String,
    /// Messages acknowledged to this channel's topic.
    pub sent: u64,
    /// Messages delivered (duplicates included).
    pub received: u64,
    /// Distinct messages delivered.
    pub unique: u64,
    /// Acknowledged messages never delivered.
    pub lost: u64,
    pub duplicates: u64,
}

// Wide on purpose: one field per figure the report prints and its JSON object holds.
pub struct Results {
    pub mode: Mode,
    pub args: Args,
    /// Length of the measured window.
    pub measured_s: f64,
    /// Messages acknowledged within the window.
    pub pub_msgs: u64,
    /// Messages received within the window.
    pub sub_msgs: u64,
    /// Messages acknowledged (whole run, warmup included).
    pub sent: u64,
    /// Messages written (acknowledged or not).
    pub written: u64,
    /// Messages received on all channels (whole run, drain included).
    pub received: u64,
    pub foreign: u64,
    pub errors: u64,
    pub error_messages: Vec<String>,
    /// Publish-to-delivery, µs.
    pub latency: Histogram<u64>,
    /// PUB/MPUB/DPUB write to OK, µs.
    pub ack_latency: Histogram<u64>,
    pub channels: Vec<ChannelResult>,
    pub topics: Vec<String>,
    /// With a --rate-schedule of several phases: ms from the start of the last phase
    /// until the backlog drained (None: it did not), and the publish-to-delivery latency
    /// (µs) of messages published after that.
    pub drain: Option<(Option<f64>, Histogram<u64>)>,
}

const MIB: f64 = 1024.0 * 1024.0;

fn quantiles(h: &Histogram<u64>) -> Value {
    let q = |x: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(x)
        }
    };
    json!({
        "count": h.len(),
        "min": if h.is_empty() { 0 } else { h.min() },
        "mean": if h.is_empty() { 0.0 } else { (h.mean() * 10.0).round() / 10.0 },
        "p50": q(0.50),
        "p90": q(0.90),
        "p99": q(0.99),
        "p999": q(0.999),
        "p9999": q(0.9999),
        "max": if h.is_empty() { 0 } else { h.max() },
    })
}

/// `1234567` -> `1,234,567`.
pub fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// µs in a short human form.
pub fn fmt_us(us: u64) -> String {
    if us < 1000 {
        format!("{us}us")
    } else if us < 1_000_000 {
        format!("{:.2}ms", us as f64 / 1000.0)
    } else {
        format!("{:.2}s", us as f64 / 1e6)
    }
}

impl Results {
    /// The report of a run that could not start.
    pub fn failed(shared: &Shared) -> Results {
        Results {
            mode: shared.args.mode,
            args: shared.args.clone(),
            measured_s: 0.0,
            pub_msgs: 0,
            sub_msgs: 0,
            sent: 0,
            written: 0,
            received: 0,
            foreign: 0,
            errors: shared.error_count.load(Ordering::SeqCst),
            error_messages: shared
                .errors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
            latency: crate::new_hist(),
            ack_latency: crate::new_hist(),
            channels: Vec::new(),
            topics: shared.topics.clone(),
            drain: None,
        }
    }

    pub fn lost(&self) -> u64 {
        self.channels.iter().map(|c| c.lost).sum()
    }

    pub fn duplicates(&self) -> u64 {
        self.channels.iter().map(|c| c.duplicates).sum()
    }

    pub fn pub_rate(&self) -> f64 {
        if self.measured_s > 0.0 {
            self.pub_msgs as f64 / self.measured_s
        } else {
            0.0
        }
    }

    pub fn sub_rate(&self) -> f64 {
        if self.measured_s > 0.0 {
            self.sub_msgs as f64 / self.measured_s
        } else {
            0.0
        }
    }

    /// 1 on errors, lost messages, or a publishing run that published nothing.
    pub fn exit_code(&self) -> i32 {
        let nothing = self.mode.publishes() && self.sent == 0;
        if self.errors > 0 || self.lost() > 0 || nothing {
            1
        } else {
            0
        }
    }

    pub fn to_json(&self) -> Value {
        let size = self.args.size as f64;
        let channels: Vec<Value> = self
            .channels
            .iter()
            .map(|c| {
                json!({
                    "topic": c.topic, "channel": c.channel, "sent": c.sent,
                    "received": c.received, "unique": c.unique, "lost": c.lost,
                    "duplicates": c.duplicates,
                })
            })
            .collect();
        let a = &self.args;
        let mut v = json!({
            "mode": self.mode.name(),
            "ok": self.exit_code() == 0,
            "pub_msgs_per_sec": self.pub_rate().round(),
            "sub_msgs_per_sec": self.sub_rate().round(),
            "pub_mib_per_sec": (self.pub_rate() * size / MIB * 100.0).round() / 100.0,
            "sub_mib_per_sec": (self.sub_rate() * size / MIB * 100.0).round() / 100.0,
            "sent": self.sent,
            "written": self.written,
            "received": self.received,
            "lost": self.lost(),
            "duplicates": self.duplicates(),
            "foreign": self.foreign,
            "errors": self.errors,
            "error_messages": self.error_messages,
            "latency_us": quantiles(&self.latency),
            "pub_ack_latency_us": quantiles(&self.ack_latency),
            "measured_s": (self.measured_s * 1000.0).round() / 1000.0,
            "channels": channels,
            "config": {
                "nsqd_tcp_address": a.nsqd_tcp_address,
                "topics": self.topics.len(), "channels": a.channels,
                "size": a.size, "batch_size": a.batch_size, "producers": a.producers,
                "consumers": a.consumers, "rate": a.rate, "rdy": a.rdy,
                "deferred_ms": a.deferred_ms, "pipeline": a.pipeline(),
                "runfor_s": a.runfor.as_secs_f64(), "warmup_s": a.warmup.as_secs_f64(),
            },
        });
        if let Some((ms, after)) = &self.drain {
            v["drain_ms"] = json!(ms.map(|m| m.round()));
            v["latency_after_drain_us"] = quantiles(after);
        }
        v
    }

    pub fn table(&self) -> String {
        let a = &self.args;
        let mut s = String::new();
        let size = a.size as f64;
        s.push_str(&format!(
            "nsq-bench {}: {} topic(s) x {} channel(s), {} producer(s), {} consumer(s)/channel, \
             {} B bodies, batch {}, rate {}, {:.1}s measured\n",
            self.mode.name(),
            self.topics.len(),
            a.channels,
            if self.mode.publishes() {
                a.producers
            } else {
                0
            },
            if self.mode.consumes() { a.consumers } else { 0 },
            a.size,
            a.batch_size,
            if a.rate > 0.0 {
                format!("{}/s", fmt_count(a.rate as u64))
            } else {
                "max".into()
            },
            self.measured_s
        ));
        s.push_str(&format!("{:<14}{:>14}{:>10}\n", "", "msgs/s", "MiB/s"));
        if self.mode.publishes() {
            s.push_str(&format!(
                "{:<14}{:>14}{:>10.2}\n",
                "publish",
                fmt_count(self.pub_rate() as u64),
                self.pub_rate() * size / MIB
            ));
        }
        if self.mode.consumes() {
            s.push_str(&format!(
                "{:<14}{:>14}{:>10.2}\n",
                "consume",
                fmt_count(self.sub_rate() as u64),
                self.sub_rate() * size / MIB
            ));
        }
        s.push_str(&format!(
            "{:<14}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}\n",
            "latency", "p50", "p90", "p99", "p99.9", "p99.99", "max", "count"
        ));
        let mut row = |name: &str, h: &Histogram<u64>| {
            let q = |x: f64| {
                if h.is_empty() {
                    0
                } else {
                    h.value_at_quantile(x)
                }
            };
            s.push_str(&format!(
                "{:<14}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>12}\n",
                name,
                fmt_us(q(0.5)),
                fmt_us(q(0.9)),
                fmt_us(q(0.99)),
                fmt_us(q(0.999)),
                fmt_us(q(0.9999)),
                fmt_us(if h.is_empty() { 0 } else { h.max() }),
                fmt_count(h.len())
            ));
        };
        if self.mode.consumes() {
            row("pub->deliver", &self.latency);
        }
        if self.mode.publishes() {
            row("pub ack", &self.ack_latency);
        }
        if let Some((_, after)) = &self.drain {
            row("after drain", after);
        }
        if let Some((ms, _)) = &self.drain {
            match ms {
                Some(ms) => s.push_str(&format!(
                    "backlog drained {:.2}s after the last rate phase started\n",
                    ms / 1000.0
                )),
                None => s.push_str("backlog did not drain\n"),
            }
        }
        s.push_str(&format!(
            "sent {}  received {}  lost {}  duplicates {}  foreign {}  errors {}\n",
            fmt_count(self.sent),
            fmt_count(self.received),
            fmt_count(self.lost()),
            fmt_count(self.duplicates()),
            fmt_count(self.foreign),
            self.errors
        ));
        if self.channels.len() > 1 || self.lost() > 0 {
            for c in &self.channels {
                if self.channels.len() <= 8 || c.lost > 0 || c.duplicates > 0 {
                    s.push_str(&format!(
                        "  {}/{}: sent {} received {} unique {} lost {} duplicates {}\n",
                        c.topic,
                        c.channel,
                        fmt_count(c.sent),
                        fmt_count(c.received),
                        fmt_count(c.unique),
                        fmt_count(c.lost),
                        fmt_count(c.duplicates)
                    ));
                }
            }
        }
        for e in self.error_messages.iter().take(10) {
            s.push_str(&format!("  error: {e}\n"));
        }
        if self.exit_code() != 0 {
            s.push_str("RESULT: FAIL\n");
        }
        s
    }

    pub fn print(&self, json: bool) {
        if json {
            eprint!("{}", self.table());
            println!("{}", self.to_json());
        } else {
            print!("{}", self.table());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(1234567), "1,234,567");
        assert_eq!(fmt_us(999), "999us");
        assert_eq!(fmt_us(1500), "1.50ms");
        assert_eq!(fmt_us(2_500_000), "2.50s");
    }
}
