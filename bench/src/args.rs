//! Command line (clap derive) and Go-style duration parsing.

use clap::{Parser, ValueEnum};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Publish only (MPUB batches, PUB when --batch-size=1, DPUB with --deferred-ms).
    Pub,
    /// Consume only, from whatever is published to the topic(s).
    Sub,
    /// Publish and consume in one process: checks counts and measures end-to-end latency.
    Pubsub,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Pub => "pub",
            Mode::Sub => "sub",
            Mode::Pubsub => "pubsub",
        }
    }
    pub fn publishes(self) -> bool {
        self != Mode::Sub
    }
    pub fn consumes(self) -> bool {
        self != Mode::Pub
    }
}

/// Load generator for nsqd (TCP protocol V2).
///
/// Message bodies carry [u64 publish unix ns][u64 sequence][u32 producer][u32 run id]
/// then filler, so consumers measure publish-to-delivery latency and count losses and
/// duplicates per channel. Exits 1 on protocol errors or lost messages, 2 on bad usage.
#[derive(Parser, Debug, Clone)]
#[command(name = "nsq-bench", version)]
// The field docs are the `--help` text, verbatim (`nsq_bench_<runid>`), not Markdown.
#[allow(rustdoc::invalid_html_tags)]
// Wide on purpose: one field per command-line flag (clap derive), found by the flag's name.
pub struct Args {
    /// pub, sub or pubsub
    #[arg(value_enum)]
    pub mode: Mode,

    /// nsqd TCP address (repeatable; producers round-robin over them, consumers connect
    /// to every one)
    #[arg(long = "nsqd-tcp-address", default_value = "127.0.0.1:4150")]
    pub nsqd_tcp_address: Vec<String>,

    /// Topic name (with --topics N > 1: NAME-0 .. NAME-N-1). Default: nsq_bench for
    /// pub/sub, a fresh nsq_bench_<runid> for pubsub
    #[arg(long)]
    pub topic: Option<String>,

    /// Number of topics; producers rotate their batches over them
    #[arg(long, default_value_t = 1)]
    pub topics: usize,

    /// Channel name (with --channels N > 1: NAME-0 .. NAME-N-1, before any #ephemeral)
    #[arg(long, default_value = "bench")]
    pub channel: String,

    /// Channels per topic; each channel gets its own --consumers connections
    #[arg(long, default_value_t = 1)]
    pub channels: usize,

    /// Message body size in bytes (at least 24)
    #[arg(long, default_value_t = 200)]
    pub size: usize,

    /// Messages per MPUB (1 = PUB); capped so an MPUB body stays within 5 MiB
    #[arg(long = "batch-size", default_value_t = 200)]
    pub batch_size: usize,

    /// How long to publish (Go duration: 10s, 500ms, 1m30s), after --warmup
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runfor: Duration,

    /// Load applied before the measured --runfor window and left out of the stats
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,

    /// RDY count of each consumer
    #[arg(long, default_value_t = 2500)]
    pub rdy: u64,

    /// Producer connections (one thread each, plus a reader thread)
    #[arg(long, default_value_t = 2)]
    pub producers: usize,

    /// Consumer connections per channel (per nsqd address)
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,

    /// Open-loop publish rate in messages/s over all producers (0 = as fast as possible)
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,

    /// Open-loop rate phases `DURATION@RATE[,...]` (msgs/s over all producers), e.g.
    /// `10s@400000,20s@100000` for a burst and then a lower rate. Replaces --rate and
    /// --runfor (the run lasts the sum of the phases). With two or more phases the report
    /// gives how long after the last phase started the consumers' backlog took to drain
    /// (`drain_ms`) and the latency of messages published after that
    #[arg(long = "rate-schedule", value_parser = crate::schedule::Schedule::parse)]
    pub rate_schedule: Option<crate::schedule::Schedule>,

    /// Publish with DPUB deferred by this many ms (one DPUB per message)
    #[arg(long = "deferred-ms", default_value_t = 0)]
    pub deferred_ms: u64,

    /// Publish writes (MPUB batches, or groups of PUB/DPUB) in flight per producer.
    /// Default 16 for pub (enough to saturate one topic here), 4 for pubsub: deeper
    /// pipelines make publishing outrun delivery, and the backlog then grows
    #[arg(long)]
    pub pipeline: Option<usize>,

    /// sub: stop once every channel received this many messages; fewer is a loss
    /// (exit 1). For draining the backlog of an earlier `pub` run
    #[arg(long)]
    pub expect: Option<u64>,

    /// After publishing stops, consumers stop once nothing arrived for this long (sub:
    /// once something arrived and then nothing for this long)
    #[arg(long = "idle-timeout", default_value = "1s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Longest drain after publishing stops
    #[arg(long = "drain-timeout", default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// IDENTIFY output_buffer_timeout (ms) for consumers; not sent when absent
    #[arg(long = "output-buffer-timeout", allow_hyphen_values = true)]
    pub output_buffer_timeout: Option<i64>,

    /// IDENTIFY output_buffer_size (bytes) for consumers; not sent when absent
    #[arg(long = "output-buffer-size", allow_hyphen_values = true)]
    pub output_buffer_size: Option<i64>,

    /// Connect over TLS (IDENTIFY tls_v1), trusting the CA certificates in this PEM file;
    /// the broker's certificate must name the host of --nsqd-tcp-address (or --tls-name)
    #[arg(long = "tls-ca")]
    pub tls_ca: Option<std::path::PathBuf>,

    /// The name the broker's certificate must carry with --tls-ca (default: the host of
    /// the address)
    #[arg(long = "tls-name")]
    pub tls_name: Option<String>,

    /// Print one JSON object with the results on stdout (the table goes to stderr)
    #[arg(long)]
    pub json: bool,

    /// No per-second progress line
    #[arg(long, short)]
    pub quiet: bool,
}

impl Args {
    /// The open-loop pacing for all producers together, if any (--rate-schedule, or
    /// --rate as one phase).
    pub fn pacing(&self) -> Option<crate::schedule::Schedule> {
        match &self.rate_schedule {
            Some(s) => Some(s.clone()),
            None if self.rate > 0.0 => Some(crate::schedule::Schedule::constant(self.rate)),
            None => None,
        }
    }

    /// Applies --rate-schedule to --runfor (the sum of its phases).
    pub fn normalize(&mut self) {
        if let Some(s) = &self.rate_schedule {
            self.runfor = s.total();
        }
    }

    pub fn pipeline(&self) -> usize {
        self.pipeline
            .unwrap_or(if self.mode == Mode::Pub { 16 } else { 4 })
    }

    // A `String` error: CLI-only, printed once before the bench exits.
    pub fn validate(&self) -> Result<(), String> {
        if self.size < crate::HEADER {
            return Err(format!("--size must be at least {} bytes", crate::HEADER));
        }
        if self.batch_size == 0 {
            return Err("--batch-size must be at least 1".into());
        }
        if self.topics == 0 || self.channels == 0 {
            return Err("--topics and --channels must be at least 1".into());
        }
        if self.mode.publishes() && self.producers == 0 {
            return Err("--producers must be at least 1".into());
        }
        if self.mode.consumes() && self.consumers == 0 {
            return Err("--consumers must be at least 1".into());
        }
        if self.pipeline == Some(0) {
            return Err("--pipeline must be at least 1".into());
        }
        if self.rate < 0.0 || !self.rate.is_finite() {
            return Err("--rate must be >= 0".into());
        }
        if self.rate_schedule.is_some() && (!self.warmup.is_zero() || self.rate > 0.0) {
            return Err("--rate-schedule replaces --rate and takes no --warmup".into());
        }
        if self.nsqd_tcp_address.is_empty() {
            return Err("need an --nsqd-tcp-address".into());
        }
        if self.runfor.is_zero() {
            return Err("--runfor must be > 0".into());
        }
        Ok(())
    }
}

/// `NAME-i` when there are several, keeping a `#ephemeral` suffix at the end.
pub fn indexed_name(base: &str, i: usize, n: usize) -> String {
    if n <= 1 {
        return base.to_string();
    }
    match base.find('#') {
        Some(p) => format!("{}-{}{}", &base[..p], i, &base[p..]),
        None => format!("{base}-{i}"),
    }
}

/// Go's `time.ParseDuration` (`300ms`, `1.5h`, `2h45m`, units ns us µs ms s m h; the
/// broker's own parser), plus a bare number meaning seconds.
// A `String` error: CLI-only, printed once before the bench exits.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"));
    }
    nsq_wire::duration::parse_duration(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn names() {
        assert_eq!(indexed_name("t", 0, 1), "t");
        assert_eq!(indexed_name("t", 3, 4), "t-3");
        assert_eq!(indexed_name("c#ephemeral", 1, 2), "c-1#ephemeral");
    }

    #[test]
    fn both_flag_styles() {
        let a = Args::try_parse_from([
            "nsq-bench",
            "pubsub",
            "--size=300",
            "--batch-size",
            "50",
            "--runfor=2s",
            "--nsqd-tcp-address",
            "127.0.0.1:1",
            "--nsqd-tcp-address=127.0.0.1:2",
            "--output-buffer-timeout=-1",
        ])
        .unwrap();
        assert_eq!(a.mode, Mode::Pubsub);
        assert_eq!((a.size, a.batch_size), (300, 50));
        assert_eq!(a.runfor, Duration::from_secs(2));
        assert_eq!(a.nsqd_tcp_address, vec!["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(a.output_buffer_timeout, Some(-1));
        let d = Args::try_parse_from(["nsq-bench", "pub"]).unwrap();
        assert_eq!(d.nsqd_tcp_address, vec!["127.0.0.1:4150"]);
        assert_eq!((d.size, d.batch_size, d.rdy), (200, 200, 2500));
    }
}
