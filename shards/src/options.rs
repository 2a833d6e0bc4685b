//! Runtime options every shard reads (a copy per shard; nothing is shared).

use nsq_wire::identify::IdentifyLimits;
use std::time::Duration;

/// The subset of nsqd's options the broker core needs, already validated.
/// Durations are exact; sizes are bytes; counts are messages. One field per option (the
/// IDENTIFY limits grouped in `identify`), so it stays a flat struct of many fields.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--node-id` (0..1024): seeds message IDs.
    pub node_id: u16,
    /// `--mem-queue-size`: messages an #ephemeral topic or channel holds before dropping.
    pub mem_queue_size: u64,
    /// `--max-msg-size` in bytes (one PUB/DPUB body or MPUB element).
    pub max_msg_size: i64,
    /// `--max-body-size` in bytes (IDENTIFY, AUTH and MPUB bodies).
    pub max_body_size: i64,
    /// `--max-req-timeout`: REQ delays are clamped to it, DPUB delays above it rejected.
    pub max_req_timeout: Duration,
    /// `--max-channel-consumers` (0 = unlimited).
    pub max_channel_consumers: usize,
    /// The flags IDENTIFY is checked against and answers with (`--msg-timeout`,
    /// `--max-msg-timeout`, `--max-rdy-count`, `--max-heartbeat-interval`, the output
    /// buffer bounds, `--max-deflate-level`, `--snappy`, `--deflate`, and nsqd's fixed
    /// 60 s client timeout); the wire crate's IDENTIFY functions take them as they are.
    pub identify: IdentifyLimits,
    /// `--max-attempts` (beyond nsqd; 0 = unlimited): deliveries after which a message
    /// goes to its topic's dead-letter topic (see `channel::dead_letter_topic`).
    pub max_attempts: u16,
    /// `--data-path`: where non-ephemeral topics keep their segment logs; `None` keeps
    /// everything in memory.
    pub data_path: Option<std::path::PathBuf>,
    /// `--sync-every`: fdatasync after this many records; 1 makes every publish wait for
    /// the sync that covers it.
    pub sync_every: u64,
    /// `--sync-timeout`: fdatasync at least this often while records are unsynced.
    pub sync_timeout: Duration,
    /// `--max-bytes-per-file`: segment size before rotation.
    pub max_bytes_per_file: u64,
    /// `--e2e-processing-latency-percentile` (empty: not tracked) and
    /// `--e2e-processing-latency-window-time` (see [`crate::quantile`]).
    pub e2e_percentiles: Vec<f64>,
    pub e2e_window: Duration,
    /// `--retention-time` (beyond nsqd): consumed segments are kept until their newest
    /// record is older than this; zero = no time limit (see [`Options::retains`]).
    pub retention_time: Duration,
    /// `--retention-bytes` (beyond nsqd), per topic: consumed segments are kept until the
    /// topic's sealed segment files exceed this many bytes (oldest go first; the segment
    /// being written is not counted); 0 = no size limit.
    pub retention_bytes: u64,
    /// How segment files are written and read: chosen at start-up from the data path's
    /// filesystem and `NSQD_SEGMENT_IO` (beyond nsqd; [`nsq_storage::SegmentIo::choose`]).
    pub segment_io: nsq_storage::SegmentIo,
    /// `--topology-region`, `--topology-zone` and whether
    /// `--enable-experiment=topology-aware-consumption` is on (nsqd master; see
    /// [`crate::topology`]).
    pub topology: crate::topology::Topology,
    /// `--channel-lag-stats` (beyond nsqd): channels record their delivery-to-FIN
    /// latencies and `/stats`, `/metrics` and statsd show each channel's lag in time
    /// (see `crate::channel` lag). Off: `/stats` is nsqd's exactly.
    pub channel_lag: bool,
    /// `--cluster-address` is set: every durable topic is replicated (docs/replication.md).
    /// Recovery then continues a topic's log after the last record on disk, so that a
    /// replay from the topic's leader puts what a crash took back at the same sequences.
    pub replicated: bool,
}

impl Options {
    /// True when consumed messages are retained for replay (`--retention-time` or
    /// `--retention-bytes` set): then every record of a non-ephemeral topic must be
    /// written to its segment log, even one every channel finished before the writer got
    /// to it, and segments every channel has passed are deleted only by the retention
    /// rule (`Shard::checkpoint`). False (the default): a segment goes once every channel
    /// has passed it, as nsqd forgets a message once every channel has it.
    pub fn retains(&self) -> bool {
        !self.retention_time.is_zero() || self.retention_bytes > 0
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node_id: 0,
            mem_queue_size: 10000,
            max_msg_size: 1048576,
            max_body_size: 5242880,
            max_req_timeout: Duration::from_secs(3600),
            max_channel_consumers: 0,
            identify: IdentifyLimits {
                msg_timeout: Duration::from_secs(60),
                max_msg_timeout: Duration::from_secs(15 * 60),
                max_rdy_count: 2500,
                max_heartbeat_interval: Duration::from_secs(60),
                output_buffer_timeout: Duration::from_millis(250),
                min_output_buffer_timeout: Duration::from_millis(25),
                max_output_buffer_timeout: Duration::from_secs(30),
                max_output_buffer_size: 65536,
                client_timeout: Duration::from_secs(60),
                max_deflate_level: 6,
                snappy: true,
                deflate: true,
            },
            max_attempts: 0,
            data_path: None,
            sync_every: 2500,
            sync_timeout: Duration::from_secs(2),
            max_bytes_per_file: 104857600,
            retention_time: Duration::ZERO,
            retention_bytes: 0,
            e2e_percentiles: Vec::new(),
            e2e_window: Duration::from_secs(600),
            segment_io: nsq_storage::SegmentIo::Ring,
            topology: crate::topology::Topology::default(),
            channel_lag: false,
            replicated: false,
        }
    }
}
