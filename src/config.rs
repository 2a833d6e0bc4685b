//! Command line: nsqd's flag names, defaults and units (nsqd: apps/nsqd/options.go),
//! plus `--shards`. Go-style single-dash long flags (`-tcp-address=...`) are accepted
//! too, as nsqd's flag package does.

use clap::Parser;
use nsq_shards::Options;
use std::time::Duration;

/// Parses a Go duration such as `60s`, `250ms`, `1h30m`, `1.5s`, `100us`; a bare `0` is
/// zero. Errors name the bad value.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?} (use Go syntax, e.g. 60s, 250ms, 1h)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_len == 0 {
            return Err(err());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += n * unit;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go's `time.Duration.String()` does (`1m0s`, `250ms`,
/// `1.235858905s`).
pub fn go_duration_string(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return trim_frac(format!("{:.3}", ns as f64 / 1e3)) + "µs";
    }
    if ns < 1_000_000_000 {
        return trim_frac(format!("{:.6}", ns as f64 / 1e6)) + "ms";
    }
    let h = ns / 3_600_000_000_000;
    let m = (ns / 60_000_000_000) % 60;
    let s_ns = ns % 60_000_000_000;
    let secs = trim_frac(format!(
        "{}.{:09}",
        s_ns / 1_000_000_000,
        s_ns % 1_000_000_000
    )) + "s";
    if h > 0 {
        format!("{h}h{m}m{secs}")
    } else if m > 0 {
        format!("{m}m{secs}")
    } else {
        secs
    }
}

fn trim_frac(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// nsqd's default node id: crc32(md5(hostname)) % 1024.
fn default_node_id() -> u16 {
    use md5::Digest;
    let digest = md5::Md5::digest(hostname().as_bytes());
    (crc32fast::hash(&digest) % 1024) as u16
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nsqd",
    version = "v1.3.0 (built w/rust)",
    override_usage = "nsqd [OPTIONS]",
    about = "A thread-per-core, shared-nothing drop-in replacement for nsqd (protocol V2, nsqd's HTTP API and flags)"
)]
pub struct Cli {
    /// <addr>:<port> to listen on for TCP clients
    #[arg(long, default_value = "0.0.0.0:4150")]
    pub tcp_address: String,
    /// <addr>:<port> to listen on for HTTP clients
    #[arg(long, default_value = "0.0.0.0:4151")]
    pub http_address: String,
    /// address that will be registered with lookupd (default: the OS hostname)
    #[arg(long)]
    pub broadcast_address: Option<String>,
    /// TCP port that will be registered with lookupd (0: the TCP listening port)
    #[arg(long, default_value_t = 0)]
    pub broadcast_tcp_port: u16,
    /// HTTP port that will be registered with lookupd (0: the HTTP listening port)
    #[arg(long, default_value_t = 0)]
    pub broadcast_http_port: u16,
    /// path to store disk-backed messages (default: the current directory)
    #[arg(long, default_value = "")]
    pub data_path: String,
    /// number of messages to keep in memory per topic/channel (the cap of #ephemeral ones)
    #[arg(long, default_value_t = 10000)]
    pub mem_queue_size: u64,
    /// number of bytes per segment file before rolling to a new one
    #[arg(long, default_value_t = 104857600)]
    pub max_bytes_per_file: u64,
    /// number of messages per topic after which fdatasync runs; 1 = every publish is durable before it is answered
    #[arg(long, default_value_t = 2500)]
    pub sync_every: u64,
    /// longest time between fdatasyncs while messages are unsynced (Go duration)
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub sync_timeout: Duration,
    /// maximum size in bytes of a single message
    #[arg(long, default_value_t = 1048576)]
    pub max_msg_size: i64,
    /// maximum size in bytes of a single command body (IDENTIFY, AUTH, MPUB)
    #[arg(long, default_value_t = 5242880)]
    pub max_body_size: i64,
    /// default duration to wait before auto-requeueing a message (Go duration, e.g. 60s)
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub msg_timeout: Duration,
    /// maximum duration before a message will time out (IDENTIFY msg_timeout, TOUCH)
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub max_msg_timeout: Duration,
    /// maximum requeuing timeout per message (REQ is clamped to it, DPUB rejected above it)
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub max_req_timeout: Duration,
    /// maximum RDY count for a client
    #[arg(long, default_value_t = 2500)]
    pub max_rdy_count: i64,
    /// maximum client configurable duration of time between client heartbeats
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub max_heartbeat_interval: Duration,
    /// default duration of time between flushing a client's output buffer
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub output_buffer_timeout: Duration,
    /// minimum client configurable output buffer timeout
    #[arg(long, default_value = "25ms", value_parser = parse_duration)]
    pub min_output_buffer_timeout: Duration,
    /// maximum client configurable output buffer timeout
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub max_output_buffer_timeout: Duration,
    /// maximum client configurable output buffer size in bytes
    #[arg(long, default_value_t = 65536)]
    pub max_output_buffer_size: i64,
    /// maximum channel consumer connection count per nsqd instance (0: unlimited)
    #[arg(long, default_value_t = 0)]
    pub max_channel_consumers: usize,
    /// maximum deflate compression level a client can negotiate (1-9)
    #[arg(long, default_value_t = 6)]
    pub max_deflate_level: i64,
    /// enable snappy feature negotiation (client compression)
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub snappy: bool,
    /// enable deflate feature negotiation (client compression)
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub deflate: bool,
    /// log level: debug, info, warn, error or fatal
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// log message prefix
    #[arg(long, default_value = "[nsqd] ")]
    pub log_prefix: String,
    /// unique part of message IDs, [0,1024) (default: crc32 of the md5 of the hostname)
    #[arg(long)]
    pub node_id: Option<i64>,
    /// lookupd TCP address (may be given multiple times)
    #[arg(long = "lookupd-tcp-address")]
    pub lookupd_tcp_address: Vec<String>,
    /// number of shards: executors, each pinned to one CPU (default: the CPUs this process may use)
    #[arg(long)]
    pub shards: Option<usize>,
    /// UDP <addr>:<port> of a statsd daemon for pushing stats
    #[arg(long, default_value = "")]
    pub statsd_address: String,
    /// prefix used for keys sent to statsd (%s for host replacement)
    #[arg(long, default_value = "nsq.%s")]
    pub statsd_prefix: String,
    /// duration between pushing to statsd (Go duration)
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub statsd_interval: Duration,
    /// toggle sending memory and GC stats to statsd
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub statsd_mem_stats: bool,
    /// the size in bytes of statsd UDP packets
    #[arg(long, default_value_t = 508)]
    pub statsd_udp_packet_size: usize,
    /// skip ephemeral topics and channels when sending stats to statsd
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub statsd_exclude_ephemeral: bool,
    /// (beyond nsqd) keep consumed messages for replay (POST /channel/seek) until they are older than this (Go duration; 0: a segment goes once every channel has consumed it)
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub retention_time: Duration,
    /// (beyond nsqd) keep consumed messages for replay until a topic's segment files exceed this many bytes, oldest first (0: no size limit)
    #[arg(long, default_value_t = 0)]
    pub retention_bytes: u64,
    /// (testing) interval between PINGs to each nsqlookupd
    #[arg(long, hide = true, default_value = "15s", value_parser = parse_duration)]
    pub lookupd_ping_interval: Duration,
}

/// Go's strconv.ParseBool, as nsqd's bool flags take it (`-flag`, `-flag=false`).
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean value {s:?}")),
    }
}

/// The validated process configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub tcp_address: String,
    pub http_address: String,
    pub broadcast_address: String,
    pub broadcast_tcp_port: u16,
    pub broadcast_http_port: u16,
    pub hostname: String,
    pub data_path: String,
    pub shards: usize,
    pub lookupd_tcp_addresses: Vec<String>,
    pub log_level: log::LevelFilter,
    pub log_prefix: String,
    pub opts: Options,
    /// Unix seconds at start.
    pub start_time: i64,
    /// statsd (nsqd: statsd.go); an empty address disables it. The prefix is as given
    /// (`%s` is replaced once the HTTP port is known, see [`crate::statsd::prefix`]).
    pub statsd_address: String,
    pub statsd_prefix: String,
    pub statsd_interval: Duration,
    pub statsd_mem_stats: bool,
    pub statsd_udp_packet_size: usize,
    pub statsd_exclude_ephemeral: bool,
    /// How often shard 0 PINGs each nsqlookupd (nsqd: 15 s; a hidden flag for tests).
    pub lookupd_ping_interval: Duration,
}

/// Rewrites Go-style `-long-flag` arguments into `--long-flag`.
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            if i > 0 && a.starts_with('-') && !a.starts_with("--") && a.len() > 2 {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

pub fn parse_level(s: &str) -> Option<log::LevelFilter> {
    Some(match s.to_ascii_lowercase().as_str() {
        "debug" => log::LevelFilter::Debug,
        "info" => log::LevelFilter::Info,
        "warn" => log::LevelFilter::Warn,
        "error" => log::LevelFilter::Error,
        "fatal" => log::LevelFilter::Error,
        _ => return None,
    })
}

impl Config {
    /// Validates the command line (nsqd's startup checks).
    pub fn from_cli(cli: Cli) -> Result<Config, String> {
        let node_id = match cli.node_id {
            None => default_node_id() as i64,
            Some(n) => n,
        };
        if !(0..1024).contains(&node_id) {
            return Err("--node-id must be [0,1024)".into());
        }
        if !(1..=9).contains(&cli.max_deflate_level) {
            return Err("--max-deflate-level must be [1,9]".into());
        }
        let log_level = parse_level(&cli.log_level)
            .ok_or_else(|| format!("invalid log-level {}", cli.log_level))?;
        if cli.statsd_interval.is_zero() {
            return Err("--statsd-interval must be > 0".into());
        }
        if cli.lookupd_ping_interval.is_zero() {
            return Err("--lookupd-ping-interval must be > 0".into());
        }
        let shards = cli.shards.unwrap_or_else(default_shards);
        if shards == 0 || shards > 1024 {
            return Err("--shards must be in [1,1024]".into());
        }
        let hostname = hostname();
        let opts = Options {
            node_id: node_id as u16,
            mem_queue_size: cli.mem_queue_size,
            max_msg_size: cli.max_msg_size,
            max_body_size: cli.max_body_size,
            msg_timeout: cli.msg_timeout,
            max_msg_timeout: cli.max_msg_timeout,
            max_req_timeout: cli.max_req_timeout,
            max_rdy_count: cli.max_rdy_count,
            max_heartbeat_interval: cli.max_heartbeat_interval,
            output_buffer_timeout: cli.output_buffer_timeout,
            min_output_buffer_timeout: cli.min_output_buffer_timeout,
            max_output_buffer_timeout: cli.max_output_buffer_timeout,
            max_output_buffer_size: cli.max_output_buffer_size,
            max_channel_consumers: cli.max_channel_consumers,
            client_timeout: Duration::from_secs(60),
            max_deflate_level: cli.max_deflate_level,
            snappy: cli.snappy,
            deflate: cli.deflate,
            data_path: Some(if cli.data_path.is_empty() {
                std::path::PathBuf::from(".")
            } else {
                std::path::PathBuf::from(&cli.data_path)
            }),
            sync_every: cli.sync_every.max(1),
            sync_timeout: if cli.sync_timeout.is_zero() {
                Duration::from_secs(2)
            } else {
                cli.sync_timeout
            },
            max_bytes_per_file: cli.max_bytes_per_file.max(4096),
            retention_time: cli.retention_time,
            retention_bytes: cli.retention_bytes,
        };
        Ok(Config {
            tcp_address: cli.tcp_address,
            http_address: cli.http_address,
            broadcast_address: cli.broadcast_address.unwrap_or_else(|| hostname.clone()),
            broadcast_tcp_port: cli.broadcast_tcp_port,
            broadcast_http_port: cli.broadcast_http_port,
            hostname,
            data_path: cli.data_path,
            shards,
            lookupd_tcp_addresses: cli.lookupd_tcp_address,
            log_level,
            log_prefix: cli.log_prefix,
            opts,
            start_time: nsq_shards::message::now_unix_nanos() / 1_000_000_000,
            statsd_address: cli.statsd_address,
            statsd_prefix: cli.statsd_prefix,
            statsd_interval: cli.statsd_interval,
            statsd_mem_stats: cli.statsd_mem_stats,
            statsd_udp_packet_size: cli.statsd_udp_packet_size,
            statsd_exclude_ephemeral: cli.statsd_exclude_ephemeral,
            lookupd_ping_interval: cli.lookupd_ping_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("abc").is_err());
        assert_eq!(go_duration_string(Duration::from_millis(1235)), "1.235s");
        assert_eq!(go_duration_string(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration_string(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn single_dash_flags() {
        let a =
            normalize_args(["nsqd", "-tcp-address=1:2", "--shards", "2", "-h"].map(String::from));
        assert_eq!(a, ["nsqd", "--tcp-address=1:2", "--shards", "2", "-h"]);
    }
}
