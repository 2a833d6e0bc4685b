//! Command line: nsqd's flag names, defaults and units (nsqd: apps/nsqd/options.go),
//! plus `--shards`. Go-style single-dash long flags (`-tcp-address=...`) are accepted
//! too, as nsqd's flag package does.

use crate::config_file::{
    broadcast_address_go, log_level_go, node_id_go, set_broadcast_address, set_log_level,
    set_node_id, set_shards, shards_go,
};
use clap::Parser;
use nsq_shards::Options;
use std::time::Duration;

pub use nsq_wire::duration::{go_duration_string, parse_duration};

pub(crate) fn default_shards() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub(crate) fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// nsqd's default node id: crc32(md5(hostname)) % 1024.
pub(crate) fn default_node_id() -> u16 {
    use md5::Digest;
    let digest = md5::Md5::digest(hostname().as_bytes());
    (crc32fast::hash(&digest) % 1024) as u16
}

/// Declares every nsqd option once: from one entry per option it makes the clap field
/// of [`Cli`] (flag name, aliases, default, value parser and `--help` text come from the
/// field's `#[arg]` attribute and doc comment) and, for the options nsqd's config file and
/// `/config` know, its row of [`OPTIONS`]: the cfg name (TOML key, `/config/<name>`),
/// nsqd's `Options` field name (go-options' messages), its Go type, its rank in nsqd's
/// `Options` struct (go-options resolves, and so fails, in that order), whether
/// `PUT /config/<name>` may change it at run time, and, where the flag's value is not
/// nsqd's Go value as is, the functions converting it. An entry ends with `=> flag` for a
/// command-line-only flag, else with `=> { [core,] rank, cfg, go, kind [, put] [, get,
/// set] }`; `core` copies the value as given into the field of the same name of
/// `nsq_shards::Options`, `identify` into the field of the same name of its IDENTIFY limits
/// (`Options::identify`, an `nsq_wire::identify::IdentifyLimits`) (`core_options!`, used by
/// [`Config::from_cli`], which sets the core's other fields from derived values).
macro_rules! nsqd_options {
    (
        $(#[$struct_attr:meta])*
        pub struct Cli {
            $(
                $(#[$attr:meta])*
                pub $field:ident : $ty:ty => $how:tt
            ),* $(,)?
        }
    ) => {
        $(#[$struct_attr])*
        pub struct Cli {
            $(
                $(#[$attr])*
                pub $field: $ty,
            )*
            /// cfg names of list options the config file set to a Go nil slice (`/config`
            /// shows `null` for them, as nsqd does); see [`crate::config_file`].
            #[arg(skip)]
            pub go_nil_lists: Vec<&'static str>,
        }

        /// nsqd's options in nsqd's `Options` struct order (nsqd 1.3.0's
        /// nsqd/options.go, then nsqd master's `auth_http_request_method` and topology
        /// options, then this broker's own), made by `nsqd_options!` from the declaration of [`Cli`].
        pub static OPTIONS: std::sync::LazyLock<Vec<crate::config_file::OptSpec>> =
            std::sync::LazyLock::new(|| {
                let mut specs: Vec<(u32, crate::config_file::OptSpec)> = Vec::new();
                $( nsqd_options!(@spec specs, $field, $how); )*
                specs.sort_by_key(|(rank, _)| *rank);
                // A declaration error, caught by the first test that reads the table.
                assert!(
                    specs.windows(2).all(|w| w[0].0 < w[1].0),
                    "two nsqd options declared with the same rank"
                );
                specs.into_iter().map(|(_, spec)| spec).collect()
            });

        nsqd_options!(@core ($) [] [] $( $field $how )*);
    };
    // The options declared `core` and `identify`, collected into `core_options!` (`$d`
    // is a `$`, for the metavariables of the macro made here).
    (@core ($d:tt) [$($core:ident)*] [$($id:ident)*] $field:ident { core, $($spec:tt)* }
        $($rest:tt)*) => {
        nsqd_options!(@core ($d) [$($core)* $field] [$($id)*] $($rest)*);
    };
    (@core ($d:tt) [$($core:ident)*] [$($id:ident)*] $field:ident { identify, $($spec:tt)* }
        $($rest:tt)*) => {
        nsqd_options!(@core ($d) [$($core)*] [$($id)* $field] $($rest)*);
    };
    (@core ($d:tt) [$($core:ident)*] [$($id:ident)*] $field:ident $how:tt $($rest:tt)*) => {
        nsqd_options!(@core ($d) [$($core)*] [$($id)*] $($rest)*);
    };
    (@core ($d:tt) [$($core:ident)*] [$($id:ident)*]) => {
        /// `nsq_shards::Options { ... }` from a `Cli`: the options declared `core` are
        /// copied as given, those declared `identify` into its `identify` limits
        /// (`IdentifyLimits`), after which come the derived fields of the limits, then
        /// those of `Options`. (A field in none of these is a compile error: "missing
        /// field".)
        macro_rules! core_options {
            ($d cli:ident, identify: { $d($d derived_id:tt)* }, { $d($d derived:tt)* }) => {
                Options {
                    $( $core: $d cli.$core, )*
                    identify: nsq_wire::identify::IdentifyLimits {
                        $( $id: $d cli.$id, )*
                        $d($d derived_id)*
                    },
                    $d($d derived)*
                }
            };
        }
    };
    (@spec $specs:ident, $field:ident, flag) => {};
    (@spec $specs:ident, $field:ident, {
        $(core,)? $(identify,)?
        rank: $rank:literal, cfg: $cfg:literal, go: $go:literal, kind: $kind:ident
        $(, put: $put:literal)?
        $(, get: $get:path, set: $set:path)?
        $(,)?
    }) => {
        $specs.push((
            $rank,
            crate::config_file::OptSpec {
                cfg: $cfg,
                arg: stringify!($field),
                go_field: $go,
                kind: crate::config_file::Kind::$kind,
                put_at_run_time: false $(|| $put)?,
                get: nsqd_options!(@get $field $(, $get)?),
                set: nsqd_options!(@set $field $(, $set)?),
            },
        ));
    };
    (@get $field:ident) => {
        |c: &Cli| crate::config_file::GoField::to_go(&c.$field)
    };
    (@get $field:ident, $get:path) => {
        $get
    };
    (@set $field:ident) => {
        |c: &mut Cli, v| {
            c.$field = crate::config_file::GoField::from_go(v)?;
            Ok(())
        }
    };
    (@set $field:ident, $set:path) => {
        $set
    };
}

nsqd_options! {
#[derive(Parser, Debug, Clone)]
#[command(
    name = "nsqd",
    // `nsqd v1.3.0 (built w/rust; ...)`: nsqd's first words (the version this broker is
    // compatible with, as `nsqd v1.3.0 (built w/go1.x)`), then this build.
    version = crate::BUILD_VERSION,
    override_usage = "nsqd [OPTIONS]",
    args_override_self = true,
    about = "A thread-per-core, shared-nothing drop-in replacement for nsqd (protocol V2, nsqd's HTTP API and flags)"
)]
// The field docs are the `--help` text, verbatim (`<addr>:<port>`, `[deprecated]` as
// nsqd prints them), not Markdown for rustdoc.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
// Wide on purpose: one field per nsqd flag (each also a config-file option in OPTIONS),
// as nsqd's Options struct is, so a flag is found by its name.
pub struct Cli {
    /// <addr>:<port> to listen on for TCP clients
    #[arg(long, default_value = "0.0.0.0:4150")]
    pub tcp_address: String => { rank: 4, cfg: "tcp_address", go: "TCPAddress", kind: Str },
    /// <addr>:<port> to listen on for HTTP clients
    #[arg(long, default_value = "0.0.0.0:4151")]
    pub http_address: String => { rank: 5, cfg: "http_address", go: "HTTPAddress", kind: Str },
    /// address that will be registered with lookupd (default: the OS hostname)
    #[arg(long)]
    pub broadcast_address: Option<String> =>
        { rank: 7, cfg: "broadcast_address", go: "BroadcastAddress", kind: Str,
          get: broadcast_address_go, set: set_broadcast_address },
    /// TCP port that will be registered with lookupd (0: the TCP listening port)
    #[arg(long, default_value_t = 0)]
    pub broadcast_tcp_port: u16 =>
        { rank: 8, cfg: "broadcast_tcp_port", go: "BroadcastTCPPort", kind: Int },
    /// HTTP port that will be registered with lookupd (0: the HTTP listening port)
    #[arg(long, default_value_t = 0)]
    pub broadcast_http_port: u16 =>
        { rank: 9, cfg: "broadcast_http_port", go: "BroadcastHTTPPort", kind: Int },
    /// path to store disk-backed messages (default: the current directory)
    #[arg(long, default_value = "")]
    pub data_path: String => { rank: 14, cfg: "data_path", go: "DataPath", kind: Str },
    /// number of messages to keep in memory per topic/channel (the cap of #ephemeral ones)
    #[arg(long, default_value_t = 10000)]
    pub mem_queue_size: i64 => { rank: 15, cfg: "mem_queue_size", go: "MemQueueSize", kind: Int },
    /// number of bytes per segment file before rolling to a new one
    #[arg(long, default_value_t = 104857600)]
    pub max_bytes_per_file: u64 =>
        { rank: 16, cfg: "max_bytes_per_file", go: "MaxBytesPerFile", kind: Int },
    /// number of messages per topic after which fdatasync runs; 1 = every publish is durable before it is answered
    #[arg(long, default_value_t = 2500)]
    pub sync_every: u64 => { rank: 17, cfg: "sync_every", go: "SyncEvery", kind: Int },
    /// longest time between fdatasyncs while messages are unsynced (Go duration)
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub sync_timeout: Duration =>
        { rank: 18, cfg: "sync_timeout", go: "SyncTimeout", kind: Duration },
    /// maximum size in bytes of a single message
    #[arg(long, default_value_t = 1048576)]
    pub max_msg_size: i64 => { core, rank: 23, cfg: "max_msg_size", go: "MaxMsgSize", kind: Int },
    /// maximum size in bytes of a single command body (IDENTIFY, AUTH, MPUB)
    #[arg(long, default_value_t = 5242880)]
    pub max_body_size: i64 => { core, rank: 24, cfg: "max_body_size", go: "MaxBodySize", kind: Int },
    /// default duration to wait before auto-requeueing a message (Go duration, e.g. 60s)
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub msg_timeout: Duration => { identify, rank: 21, cfg: "msg_timeout", go: "MsgTimeout", kind: Duration },
    /// maximum duration before a message will time out (IDENTIFY msg_timeout, TOUCH)
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub max_msg_timeout: Duration =>
        { identify, rank: 22, cfg: "max_msg_timeout", go: "MaxMsgTimeout", kind: Duration },
    /// maximum requeuing timeout per message (REQ is clamped to it, DPUB rejected above it)
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub max_req_timeout: Duration =>
        { core, rank: 25, cfg: "max_req_timeout", go: "MaxReqTimeout", kind: Duration },
    /// maximum RDY count for a client
    #[arg(long, default_value_t = 2500)]
    pub max_rdy_count: i64 => { identify, rank: 27, cfg: "max_rdy_count", go: "MaxRdyCount", kind: Int },
    /// maximum client configurable duration of time between client heartbeats
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub max_heartbeat_interval: Duration =>
        { identify, rank: 26, cfg: "max_heartbeat_interval", go: "MaxHeartbeatInterval", kind: Duration },
    /// default duration of time between flushing a client's output buffer
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    pub output_buffer_timeout: Duration =>
        { identify, rank: 31, cfg: "output_buffer_timeout", go: "OutputBufferTimeout", kind: Duration },
    /// minimum client configurable output buffer timeout
    #[arg(long, default_value = "25ms", value_parser = parse_duration)]
    pub min_output_buffer_timeout: Duration =>
        { identify, rank: 30, cfg: "min_output_buffer_timeout", go: "MinOutputBufferTimeout",
          kind: Duration },
    /// maximum client configurable output buffer timeout
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub max_output_buffer_timeout: Duration =>
        { identify, rank: 29, cfg: "max_output_buffer_timeout", go: "MaxOutputBufferTimeout",
          kind: Duration },
    /// maximum client configurable output buffer size in bytes
    #[arg(long, default_value_t = 65536)]
    pub max_output_buffer_size: i64 =>
        { identify, rank: 28, cfg: "max_output_buffer_size", go: "MaxOutputBufferSize", kind: Int },
    /// maximum channel consumer connection count per nsqd instance (0: unlimited)
    #[arg(long, default_value_t = 0)]
    pub max_channel_consumers: usize =>
        { core, rank: 32, cfg: "max_channel_consumers", go: "MaxChannelConsumers", kind: Int },
    /// maximum deflate compression level a client can negotiate (1-9)
    #[arg(long, default_value_t = 6)]
    pub max_deflate_level: i64 =>
        { identify, rank: 48, cfg: "max_deflate_level", go: "MaxDeflateLevel", kind: Int },
    /// enable snappy feature negotiation (client compression)
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub snappy: bool => { identify, rank: 49, cfg: "snappy", go: "SnappyEnabled", kind: Bool },
    /// enable deflate feature negotiation (client compression)
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub deflate: bool => { identify, rank: 47, cfg: "deflate", go: "DeflateEnabled", kind: Bool },
    /// log level: debug, info, warn, error or fatal
    #[arg(long, default_value = "info")]
    pub log_level: String =>
        { rank: 2, cfg: "log_level", go: "LogLevel", kind: Int, put: true,
          get: log_level_go, set: set_log_level },
    /// log message prefix
    #[arg(long, default_value = "[nsqd] ")]
    pub log_prefix: String => { rank: 3, cfg: "log_prefix", go: "LogPrefix", kind: Str },
    /// unique part of message IDs, [0,1024) (default: crc32 of the md5 of the hostname)
    #[arg(long)]
    pub node_id: Option<i64> =>
        { rank: 1, cfg: "id", go: "ID", kind: Int, get: node_id_go, set: set_node_id },
    /// lookupd TCP address (may be given multiple times)
    #[arg(long = "lookupd-tcp-address")]
    pub lookupd_tcp_address: Vec<String> =>
        { rank: 10, cfg: "nsqlookupd_tcp_addresses", go: "NSQLookupdTCPAddresses",
          kind: StrList, put: true },
    /// number of shards: executors, each pinned to one CPU when they take every CPU this process may use (default: the CPUs this process may use)
    #[arg(long)]
    pub shards: Option<usize> =>
        { rank: 66, cfg: "shards", go: "Shards", kind: Int, get: shards_go, set: set_shards },
    /// UDP <addr>:<port> of a statsd daemon for pushing stats
    #[arg(long, default_value = "")]
    pub statsd_address: String =>
        { rank: 33, cfg: "statsd_address", go: "StatsdAddress", kind: Str },
    /// prefix used for keys sent to statsd (%s for host replacement)
    #[arg(long, default_value = "nsq.%s")]
    pub statsd_prefix: String => { rank: 34, cfg: "statsd_prefix", go: "StatsdPrefix", kind: Str },
    /// duration between pushing to statsd (Go duration)
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub statsd_interval: Duration =>
        { rank: 35, cfg: "statsd_interval", go: "StatsdInterval", kind: Duration },
    /// toggle sending memory and GC stats to statsd
    #[arg(long, default_value = "true", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub statsd_mem_stats: bool =>
        { rank: 36, cfg: "statsd_mem_stats", go: "StatsdMemStats", kind: Bool },
    /// the size in bytes of statsd UDP packets
    #[arg(long, default_value_t = 508)]
    pub statsd_udp_packet_size: usize =>
        { rank: 37, cfg: "statsd_udp_packet_size", go: "StatsdUDPPacketSize", kind: Int },
    /// skip ephemeral topics and channels when sending stats to statsd
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub statsd_exclude_ephemeral: bool =>
        { rank: 38, cfg: "statsd_exclude_ephemeral", go: "StatsdExcludeEphemeral", kind: Bool },
    /// (beyond nsqd) keep consumed messages for replay (POST /channel/seek) until they are older than this (Go duration; 0: a segment goes once every channel has consumed it)
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub retention_time: Duration =>
        { core, rank: 54, cfg: "retention_time", go: "RetentionTime", kind: Duration },
    /// (beyond nsqd) keep consumed messages for replay until a topic's segment files exceed this many bytes, oldest first (0: no size limit)
    #[arg(long, default_value_t = 0)]
    pub retention_bytes: u64 =>
        { core, rank: 55, cfg: "retention_bytes", go: "RetentionBytes", kind: Int },
    /// A region represents a larger domain, made up of one or more zones for preferring closer consumer (nsqd master)
    #[arg(long, default_value = "")]
    pub topology_region: String =>
        { rank: 51, cfg: "topology_region", go: "TopologyRegion", kind: Str },
    /// A zone represents a logical failure domain for preferring closer consumer (nsqd master)
    #[arg(long, default_value = "")]
    pub topology_zone: String =>
        { rank: 52, cfg: "topology_zone", go: "TopologyZone", kind: Str },
    /// enable experimental feature (may be given multiple times) (valid options: "topology-aware-consumption") (nsqd master)
    #[arg(long = "enable-experiment")]
    pub enable_experiment: Vec<String> =>
        { rank: 53, cfg: "enable_experiment", go: "Experiments", kind: StrList },
    /// (beyond nsqd, RFC nsqio/nsq#1302) what SIGTERM does: clean-shutdown (exit at once, as nsqd) or drain (refuse publishes and new topics and channels, deliver what is queued, then exit)
    #[arg(long, default_value = SIGTERM_CLEAN_SHUTDOWN, value_parser = [SIGTERM_CLEAN_SHUTDOWN, SIGTERM_DRAIN])]
    pub sigterm: String => { rank: 56, cfg: "sigterm", go: "Sigterm", kind: Str },
    /// (beyond nsqd) show each channel's lag in time in /stats, /metrics and statsd: the age of its oldest unfinished message and its delivery-to-FIN latency percentiles
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub channel_lag_stats: bool =>
        { rank: 58, cfg: "channel_lag_stats", go: "ChannelLagStats", kind: Bool },
    /// (beyond nsqd) deliveries after which a message is published to its topic's dead-letter topic <topic>.dead and finished (0: unlimited, as nsqd; POST /channel/max-attempts overrides it per channel)
    #[arg(long, default_value_t = 0)]
    pub max_attempts: u16 =>
        { core, rank: 57, cfg: "max_attempts", go: "MaxAttempts", kind: Int },
    /// (beyond nsqd) HOST:PORT of this node's replication listener; with --cluster-peer, topics are replicated across the cluster (docs/replication.md). Peers must list this exact string
    #[arg(long, default_value = "")]
    pub cluster_address: String =>
        { rank: 59, cfg: "cluster_address", go: "ClusterAddress", kind: Str },
    /// (beyond nsqd) HOST:PORT of another cluster member's --cluster-address (may be given multiple times)
    #[arg(long = "cluster-peer")]
    pub cluster_peer: Vec<String> =>
        { rank: 60, cfg: "cluster_peers", go: "ClusterPeers", kind: StrList },
    /// (beyond nsqd) how many members hold each topic (capped at the cluster size)
    #[arg(long, default_value_t = 3)]
    pub replication_factor: u16 =>
        { rank: 61, cfg: "replication_factor", go: "ReplicationFactor", kind: Int },
    /// (beyond nsqd) when a replicated PUB is answered OK: quorum (a majority of the topic's replicas have it), all (every replica), leader (the leader alone)
    #[arg(long, default_value = "quorum", value_parser = ["quorum", "all", "leader"])]
    pub replication_ack: String =>
        { rank: 62, cfg: "replication_ack", go: "ReplicationAck", kind: Str },
    /// (beyond nsqd) mutual TLS 1.3 between cluster members: each presents --tls-cert/--tls-key and accepts a peer only with a certificate signed by --tls-root-ca-file, naming the host of its --cluster-peer address
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub cluster_tls: bool =>
        { rank: 63, cfg: "cluster_tls", go: "ClusterTLS", kind: Bool },
    /// (beyond nsqd) a cluster member that leads a topic hands the leadership to the topic's preferred member (the first of its placement) once that member is in sync, so that leadership spreads evenly again after restarts; each move disconnects the topic's consumers on the old leader, which find the new one through nsqlookupd
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub rebalance_leaders: bool =>
        { rank: 64, cfg: "rebalance_leaders", go: "RebalanceLeaders", kind: Bool },
    /// check what the host must provide (io_uring, locked memory, CPUs, data path, ports),
    /// print each problem with its fix, and exit (0: ready to run, 1: problems)
    #[arg(long)]
    pub preflight: bool => flag,
    /// (testing) interval between PINGs to each nsqlookupd
    #[arg(long, hide = true, default_value = "15s", value_parser = parse_duration)]
    pub lookupd_ping_interval: Duration => flag,

    // -----------------------------------------------------------------------------------
    // The rest of nsqd 1.3.0's flags (apps/nsqd/options.go), so that any nsqd command line
    // starts this broker; TLS (src/tls.rs) and AUTH (src/auth.rs) included.
    // -----------------------------------------------------------------------------------
    /// path to a TOML config file (nsqd's cfg names; a flag given here overrides the file)
    #[arg(long, default_value = "")]
    pub config: String => flag,
    /// [deprecated] has no effect, use --log-level
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub verbose: bool => flag,
    /// [deprecated] use --node-id
    #[arg(long, default_value = "false", value_parser = parse_go_bool, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub worker_id: bool => flag,
    /// <addr>:<port> to listen on for HTTPS clients
    #[arg(long, default_value = "0.0.0.0:4152")]
    pub https_address: String => { rank: 6, cfg: "https_address", go: "HTTPSAddress", kind: Str },
    /// <addr>:<port> or a full url to query auth server (may be given multiple times)
    #[arg(long = "auth-http-address")]
    pub auth_http_address: Vec<String> =>
        { rank: 11, cfg: "auth_http_addresses", go: "AuthHTTPAddresses", kind: StrList },
    /// HTTP method to use for auth server requests: get or post (nsqd master)
    #[arg(long, default_value = "get")]
    pub auth_http_request_method: String =>
        { rank: 50, cfg: "auth_http_request_method", go: "AuthHTTPRequestMethod", kind: Str },
    /// timeout for HTTP connect (Go duration)
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub http_client_connect_timeout: Duration =>
        { rank: 12, cfg: "http_client_connect_timeout", go: "HTTPClientConnectTimeout",
          kind: Duration },
    /// timeout for HTTP request (Go duration)
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub http_client_request_timeout: Duration =>
        { rank: 13, cfg: "http_client_request_timeout", go: "HTTPClientRequestTimeout",
          kind: Duration },
    /// accepted for compatibility; not needed by this design (each shard's timer pass covers all its channels: no queue scan)
    #[arg(long, default_value_t = 4)]
    pub queue_scan_worker_pool_max: i64 =>
        { rank: 20, cfg: "queue_scan_worker_pool_max", go: "QueueScanWorkerPoolMax", kind: Int },
    /// accepted for compatibility; not needed by this design (each shard's timer pass covers all its channels: no queue scan)
    #[arg(long, default_value_t = 20)]
    pub queue_scan_selection_count: i64 =>
        { rank: 19, cfg: "queue_scan_selection_count", go: "QueueScanSelectionCount", kind: Int },
    /// message processing time percentiles (as float (0, 1.0]) to track (can be given multiple times or comma separated '1.0,0.99,0.95', default none)
    #[arg(long = "e2e-processing-latency-percentile", value_delimiter = ',')]
    pub e2e_processing_latency_percentile: Vec<f64> =>
        { rank: 40, cfg: "e2e_processing_latency_percentiles", go: "E2EProcessingLatencyPercentiles",
          kind: FloatList },
    /// calculate end to end latency quantiles for this duration of time (Go duration)
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub e2e_processing_latency_window_time: Duration =>
        { rank: 39, cfg: "e2e_processing_latency_window_time", go: "E2EProcessingLatencyWindowTime",
          kind: Duration },
    /// path to certificate file
    #[arg(long, default_value = "")]
    pub tls_cert: String => { rank: 41, cfg: "tls_cert", go: "TLSCert", kind: Str },
    /// path to key file
    #[arg(long, default_value = "")]
    pub tls_key: String => { rank: 42, cfg: "tls_key", go: "TLSKey", kind: Str },
    /// client certificate auth policy ('require' or 'require-verify')
    #[arg(long, default_value = "")]
    pub tls_client_auth_policy: String =>
        { rank: 43, cfg: "tls_client_auth_policy", go: "TLSClientAuthPolicy", kind: Str },
    /// path to certificate authority file
    #[arg(long, default_value = "")]
    pub tls_root_ca_file: String =>
        { rank: 44, cfg: "tls_root_ca_file", go: "TLSRootCAFile", kind: Str },
    /// require TLS for client connections (true, false, tcp-https)
    #[arg(long, default_value = "false", value_parser = parse_tls_required, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub tls_required: u8 => { rank: 45, cfg: "tls_required", go: "TLSRequired", kind: Int },
    /// minimum SSL/TLS version acceptable ('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')
    #[arg(long, default_value = "tls1.0", value_parser = parse_tls_min_version)]
    pub tls_min_version: u16 =>
        { rank: 46, cfg: "tls_min_version", go: "TLSMinVersion", kind: Int },
}
}

impl Cli {
    /// Parses the command line (Go-style `-flag` too), then `--config FILE` under it:
    /// a flag given on the command line overrides the file, the file overrides the
    /// default (nsqd: go-options Resolve). Exits like clap on a bad command line.
    pub fn load(
        args: impl IntoIterator<Item = String>,
    ) -> Result<Cli, crate::config_file::LoadError> {
        let (mut cli, matches) = Cli::parse_flags(args);
        crate::config_file::apply(&mut cli, &matches)?;
        Ok(cli)
    }

    /// The command line alone (no `--config` file read yet), with clap's matches, which
    /// [`crate::config_file::apply`] needs to tell flags given from defaults. Exits as
    /// [`Cli::load`] does on a bad flag.
    pub fn parse_flags(args: impl IntoIterator<Item = String>) -> Flags {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches_from(normalize_args(args));
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        // nsqd's FloatArray flag keeps its values sorted, largest first.
        cli.e2e_processing_latency_percentile
            .sort_by(|a, b| b.total_cmp(a));
        (cli, matches)
    }
}

/// A parsed command line: the options and clap's matches ([`Cli::parse_flags`]).
pub type Flags = (Cli, clap::ArgMatches);

/// `--sigterm=clean-shutdown` (the default): SIGTERM shuts down cleanly at once, as nsqd.
pub const SIGTERM_CLEAN_SHUTDOWN: &str = "clean-shutdown";
/// `--sigterm=drain`: SIGTERM starts a drain (docs/draining.md).
pub const SIGTERM_DRAIN: &str = "drain";

/// nsqd's `--tls-required` values (nsqd: nsqd.go TLSNotRequired, TLSRequiredExceptHTTP,
/// TLSRequired).
pub const TLS_NOT_REQUIRED: u8 = 0;
pub const TLS_REQUIRED_EXCEPT_HTTP: u8 = 1;
pub const TLS_REQUIRED: u8 = 2;

/// A flag value nsqd's flag parsing refuses; `Display` is nsqd's text (clap prints it
/// after the flag's name; the config file's check wraps it in its own message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlagValueError {
    /// `--tls-required`: neither `tcp-https` nor a Go bool (`parse error`).
    TlsRequired,
    /// `--tls-min-version`: `unknown tlsVersionOption "x"` (the value lowercased).
    TlsMinVersion(String),
    /// A Go bool: `invalid boolean value "x"`.
    Bool(String),
}

impl std::fmt::Display for FlagValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlagValueError::TlsRequired => f.write_str("parse error"),
            FlagValueError::TlsMinVersion(v) => write!(f, "unknown tlsVersionOption {v:?}"),
            FlagValueError::Bool(v) => write!(f, "invalid boolean value {v:?}"),
        }
    }
}

impl std::error::Error for FlagValueError {}

/// `--tls-required`: `tcp-https`, or a Go bool (nsqd: apps/nsqd/options.go
/// tlsRequiredOption.Set). Returns 0, 1 or 2 (the `TLS_*` constants).
pub fn parse_tls_required(s: &str) -> Result<u8, FlagValueError> {
    let s = s.to_ascii_lowercase();
    if s == "tcp-https" {
        return Ok(TLS_REQUIRED_EXCEPT_HTTP);
    }
    match parse_go_bool(&s) {
        Ok(true) => Ok(TLS_REQUIRED),
        Ok(false) => Ok(TLS_NOT_REQUIRED),
        Err(_) => Err(FlagValueError::TlsRequired),
    }
}

/// `--tls-min-version`: `tls1.0`..`tls1.3` (any case) as Go's `tls.VersionTLS1x` number
/// (0x0301..0x0304); an empty value keeps the default tls1.0 (nsqd:
/// tlsMinVersionOption.Set).
pub fn parse_tls_min_version(s: &str) -> Result<u16, FlagValueError> {
    match s.to_ascii_lowercase().as_str() {
        "" | "tls1.0" => Ok(0x0301),
        "tls1.1" => Ok(0x0302),
        "tls1.2" => Ok(0x0303),
        "tls1.3" => Ok(0x0304),
        other => Err(FlagValueError::TlsMinVersion(other.to_string())),
    }
}

/// Go's strconv.ParseBool, as nsqd's bool flags take it (`-flag`, `-flag=false`).
pub fn parse_go_bool(s: &str) -> Result<bool, FlagValueError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(FlagValueError::Bool(s.to_string())),
    }
}

/// The validated process configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Every flag as resolved (flag > config file > default), as declared in
    /// `nsqd_options!`: the options the edges read as given (listen addresses, the
    /// broadcast ports, `--log-prefix`, statsd, `--lookupd-ping-interval`, ...) are read
    /// from here. The fields below are the ones start-up derives or checks.
    pub flags: Cli,
    /// `--broadcast-address`, else the hostname.
    pub broadcast_address: String,
    pub hostname: String,
    /// `--shards`, else the CPUs this process may use.
    pub shards: usize,
    pub log_level: log::LevelFilter,
    pub opts: Options,
    /// Unix seconds at start.
    pub start_time: i64,
    /// Every nsqd option after resolution (flag > config file > default), by cfg name:
    /// what `GET /config/<name>` answers for options that do not change at run time.
    pub options: Vec<(&'static str, crate::config_file::GoValue)>,
    /// The TLS server configuration (`--tls-cert` and `--tls-key` set), see [`crate::tls`].
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// `--tls-required` after nsqd's adjustment (a client auth policy implies it): one of
    /// the `TLS_*` constants.
    pub tls_required: u8,
    /// The auth servers and the HTTP client settings for them (AUTH is enabled when
    /// `auth.addresses` is not empty).
    pub auth: crate::auth::AuthConfig,
    /// The cluster (`--cluster-address`, `--cluster-peer`; `None`: standalone).
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

pub use nsq_wire::goflag::normalize_args;

/// A `--log-level` value as a filter (one parser for nsqd and nsqlookupd).
pub use nsq_wire::logger::parse_level;

/// Why the options are refused at start-up (nsqd.New's checks); `Display` is nsqd's
/// text, which the caller prints after `failed to instantiate nsqd - `.
#[derive(Debug)]
pub enum ConfigError {
    /// `--max-deflate-level must be [1,9]`.
    MaxDeflateLevel,
    /// `--node-id must be [0,1024)`.
    NodeId,
    /// The TLS certificate, key or CA could not be used.
    Tls(crate::tls::TlsConfigError),
    /// `cannot require TLS client connections without TLS key and cert`.
    TlsRequiredWithoutCert,
    /// `--tls-root-ca-file` could not be read (`failed to build client TLS config - open
    /// PATH: why`).
    RootCaOpen(crate::tls::OpenError),
    /// `--tls-root-ca-file` holds no certificate (`failed to build client TLS config -
    /// failed to append certificate to pool`).
    RootCaEmpty,
    /// `--auth-http-request-method must be post or get`.
    AuthMethod,
    /// `invalid sigterm=<v> (valid: "clean-shutdown", "drain")` (a config file's
    /// value; the command line is checked by clap).
    Sigterm(String),
    /// `invalid E2E processing latency percentile: <v>` (Go's `%v` of the value).
    E2ePercentile(f64),
    /// `invalid log-level <name>`.
    LogLevel(String),
    /// `--statsd-interval must be > 0`.
    StatsdInterval,
    /// `--lookupd-ping-interval must be > 0`.
    LookupdPingInterval,
    /// `--shards must be in [1,1024]`.
    Shards,
    /// A cluster flag that cannot work (the text says which and why).
    Cluster(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::MaxDeflateLevel => f.write_str("--max-deflate-level must be [1,9]"),
            ConfigError::NodeId => f.write_str("--node-id must be [0,1024)"),
            ConfigError::Tls(e) => e.fmt(f),
            ConfigError::TlsRequiredWithoutCert => {
                f.write_str("cannot require TLS client connections without TLS key and cert")
            }
            ConfigError::RootCaOpen(e) => write!(f, "failed to build client TLS config - {e}"),
            ConfigError::RootCaEmpty => f.write_str(
                "failed to build client TLS config - failed to append certificate to pool",
            ),
            ConfigError::AuthMethod => {
                f.write_str("--auth-http-request-method must be post or get")
            }
            ConfigError::Sigterm(v) => write!(
                f,
                "invalid sigterm={v:?} (valid: {SIGTERM_CLEAN_SHUTDOWN:?}, {SIGTERM_DRAIN:?})"
            ),
            ConfigError::E2ePercentile(v) => write!(
                f,
                "invalid E2E processing latency percentile: {}",
                crate::config_file::go_float_v(*v)
            ),
            ConfigError::LogLevel(l) => write!(f, "invalid log-level {l}"),
            ConfigError::StatsdInterval => f.write_str("--statsd-interval must be > 0"),
            ConfigError::LookupdPingInterval => f.write_str("--lookupd-ping-interval must be > 0"),
            ConfigError::Shards => f.write_str("--shards must be in [1,1024]"),
            ConfigError::Cluster(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Validates the command line (nsqd's startup checks).
    pub fn from_cli(cli: Cli) -> Result<Config, ConfigError> {
        let options = crate::config_file::resolved(&cli);
        let node_id = match cli.node_id {
            None => default_node_id() as i64,
            Some(n) => n,
        };
        // nsqd.New's checks, in its order.
        if !(1..=9).contains(&cli.max_deflate_level) {
            return Err(ConfigError::MaxDeflateLevel);
        }
        if !(0..1024).contains(&node_id) {
            return Err(ConfigError::NodeId);
        }
        let (tls, tls_required) = check_tls_and_auth(&cli)?;
        for v in &cli.e2e_processing_latency_percentile {
            if *v <= 0.0 || *v > 1.0 || v.is_nan() {
                return Err(ConfigError::E2ePercentile(*v));
            }
        }
        let log_level = parse_level(&cli.log_level)
            .ok_or_else(|| ConfigError::LogLevel(cli.log_level.clone()))?;
        if cli.statsd_interval.is_zero() {
            return Err(ConfigError::StatsdInterval);
        }
        if cli.lookupd_ping_interval.is_zero() {
            return Err(ConfigError::LookupdPingInterval);
        }
        let shards = cli.shards.unwrap_or_else(default_shards);
        if shards == 0 || shards > 1024 {
            return Err(ConfigError::Shards);
        }
        let cluster = crate::cluster::ClusterConfig::from_flags(
            &cli.cluster_address,
            &cli.cluster_peer,
            cli.replication_factor,
            &cli.replication_ack,
            node_id as u16,
        )
        .map_err(ConfigError::Cluster)?;
        let mut cluster = cluster_tls(&cli, cluster)?;
        if cli.rebalance_leaders {
            let Some(c) = cluster.as_mut() else {
                return Err(ConfigError::Cluster(
                    "--rebalance-leaders needs --cluster-address (a cluster)".into(),
                ));
            };
            c.rebalance_leaders = true;
        }
        let hostname = hostname();
        let opts = core_options!(cli, identify: {
            // nsqd's ClientTimeout is fixed, not a flag.
            client_timeout: Duration::from_secs(60),
        }, {
            node_id: node_id as u16,
            // nsqd 1.3.0 keeps no memory queue for a size <= 0 (NewTopic, NewChannel).
            mem_queue_size: cli.mem_queue_size.max(0) as u64,
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
            // One O_DIRECT block at least (the segment's alignment, not the page size).
            max_bytes_per_file: cli.max_bytes_per_file.max(4096),
            // Largest first from flags, file order from --config (as nsqd).
            e2e_percentiles: cli.e2e_processing_latency_percentile.clone(),
            e2e_window: cli.e2e_processing_latency_window_time,
            // Chosen from the data path's filesystem when the broker starts (runtime::run).
            segment_io: nsq_storage::SegmentIo::Ring,
            topology: nsq_shards::topology::Topology {
                region: cli.topology_region.clone(),
                zone: cli.topology_zone.clone(),
                aware: cli
                    .enable_experiment
                    .iter()
                    .any(|e| e == nsq_shards::topology::TOPOLOGY_AWARE_CONSUMPTION),
            },
            channel_lag: cli.channel_lag_stats,
            replicated: cluster.is_some(),
        });
        Ok(Config {
            broadcast_address: cli
                .broadcast_address
                .clone()
                .unwrap_or_else(|| hostname.clone()),
            hostname,
            shards,
            log_level,
            opts,
            start_time: nsq_shards::message::now_unix_nanos() / 1_000_000_000,
            options,
            tls,
            tls_required,
            cluster,
            auth: crate::auth::AuthConfig {
                addresses: cli.auth_http_address.clone(),
                post: cli.auth_http_request_method == "post",
                connect_timeout: cli.http_client_connect_timeout,
                request_timeout: cli.http_client_request_timeout,
            },
            flags: cli,
        })
    }
}

impl Config {
    /// An option's resolved value by cfg name (as nsqd's `Options` holds it).
    pub fn option(&self, cfg: &str) -> Option<&crate::config_file::GoValue> {
        self.options.iter().find(|(n, _)| *n == cfg).map(|(_, v)| v)
    }
}

/// `--cluster-tls`: the cluster's member connections with mutual TLS, which needs a
/// cluster, a certificate and key, and the root CA that signed every member's.
fn cluster_tls(
    cli: &Cli,
    cluster: Option<crate::cluster::ClusterConfig>,
) -> Result<Option<crate::cluster::ClusterConfig>, ConfigError> {
    if !cli.cluster_tls {
        return Ok(cluster);
    }
    let Some(mut cluster) = cluster else {
        return Err(ConfigError::Cluster(
            "--cluster-tls needs --cluster-address (a cluster to secure)".into(),
        ));
    };
    if cli.tls_cert.is_empty() || cli.tls_key.is_empty() || cli.tls_root_ca_file.is_empty() {
        return Err(ConfigError::Cluster(
            "--cluster-tls needs --tls-cert, --tls-key and --tls-root-ca-file (the CA that signed every member's certificate)".into(),
        ));
    }
    let (server, client) = crate::tls::cluster_configs(&crate::tls::TlsOptions {
        cert: &cli.tls_cert,
        key: &cli.tls_key,
        client_auth_policy: "",
        root_ca_file: &cli.tls_root_ca_file,
        min_version: cli.tls_min_version,
    })
    .map_err(ConfigError::Tls)?;
    cluster.tls = Some(crate::cluster::ClusterTls { server, client });
    Ok(Some(cluster))
}

/// nsqd.New's TLS and auth checks, with its messages: a client auth policy implies
/// `--tls-required`; requiring TLS needs a certificate; the root CA file must hold a
/// certificate; the auth request method is get or post (nsqd master).
type TlsSetup = (Option<std::sync::Arc<rustls::ServerConfig>>, u8);

fn check_tls_and_auth(cli: &Cli) -> Result<TlsSetup, ConfigError> {
    let mut tls_required = cli.tls_required;
    if !cli.tls_client_auth_policy.is_empty() && tls_required == TLS_NOT_REQUIRED {
        tls_required = TLS_REQUIRED;
    }
    let tls = crate::tls::server_config(&crate::tls::TlsOptions {
        cert: &cli.tls_cert,
        key: &cli.tls_key,
        client_auth_policy: &cli.tls_client_auth_policy,
        root_ca_file: &cli.tls_root_ca_file,
        min_version: cli.tls_min_version,
    })
    .map_err(ConfigError::Tls)?;
    if tls.is_none() && tls_required != TLS_NOT_REQUIRED {
        return Err(ConfigError::TlsRequiredWithoutCert);
    }
    if !cli.tls_root_ca_file.is_empty() {
        let pem = crate::tls::read_file(&cli.tls_root_ca_file).map_err(ConfigError::RootCaOpen)?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::RootCaEmpty);
        }
    }
    if cli.auth_http_request_method != "post" && cli.auth_http_request_method != "get" {
        return Err(ConfigError::AuthMethod);
    }
    if cli.sigterm != SIGTERM_CLEAN_SHUTDOWN && cli.sigterm != SIGTERM_DRAIN {
        return Err(ConfigError::Sigterm(cli.sigterm.clone()));
    }
    Ok((tls, tls_required))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_flags() {
        let a =
            normalize_args(["nsqd", "-tcp-address=1:2", "--shards", "2", "-h"].map(String::from));
        assert_eq!(a, ["nsqd", "--tcp-address=1:2", "--shards", "2", "-h"]);
    }

    /// `Options::default()` (what the core's tests start from) is nsqd's defaults, as an
    /// empty command line gives them: the flags above are the one declaration, and this
    /// catches a default changed there and not in the core.
    #[test]
    fn the_cores_default_options_are_an_empty_command_lines() {
        let c = Config::from_cli(Cli::parse_from(["nsqd"])).expect("defaults are valid");
        let from_flags = nsq_shards::Options {
            node_id: 0,
            data_path: None,
            ..c.opts
        };
        assert_eq!(
            format!("{from_flags:?}"),
            format!("{:?}", nsq_shards::Options::default())
        );
    }
}
