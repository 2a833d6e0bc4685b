//! Runtime options every shard reads (a copy per shard; nothing is shared).

use std::time::Duration;

/// The subset of nsqd's options the broker core needs, already validated.
/// Durations are exact; sizes are bytes; counts are messages. One field per option, so
/// it stays one flat struct.
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
    /// `--msg-timeout`: default in-flight timeout.
    pub msg_timeout: Duration,
    /// `--max-msg-timeout`: the longest IDENTIFY msg_timeout and TOUCH extension.
    pub max_msg_timeout: Duration,
    /// `--max-req-timeout`: REQ delays are clamped to it, DPUB delays above it rejected.
    pub max_req_timeout: Duration,
    /// `--max-rdy-count`.
    pub max_rdy_count: i64,
    /// `--max-heartbeat-interval`.
    pub max_heartbeat_interval: Duration,
    /// `--output-buffer-timeout` (default flush delay of a client's buffer).
    pub output_buffer_timeout: Duration,
    /// `--min-output-buffer-timeout`.
    pub min_output_buffer_timeout: Duration,
    /// `--max-output-buffer-timeout`.
    pub max_output_buffer_timeout: Duration,
    /// `--max-output-buffer-size` in bytes.
    pub max_output_buffer_size: i64,
    /// `--max-channel-consumers` (0 = unlimited).
    pub max_channel_consumers: usize,
    /// `--max-attempts` (beyond nsqd; 0 = unlimited): deliveries after which a message
    /// goes to its topic's dead-letter topic (see `channel::dead_letter_topic`).
    pub max_attempts: u16,
    /// nsqd's fixed ClientTimeout (60 s): the default heartbeat is half of it.
    pub client_timeout: Duration,
    /// `--max-deflate-level` (reported in IDENTIFY and /info).
    pub max_deflate_level: i64,
    /// `--snappy`: clients may negotiate snappy compression.
    pub snappy: bool,
    /// `--deflate`: clients may negotiate deflate compression.
    pub deflate: bool,
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
            msg_timeout: Duration::from_secs(60),
            max_msg_timeout: Duration::from_secs(15 * 60),
            max_req_timeout: Duration::from_secs(3600),
            max_rdy_count: 2500,
            max_heartbeat_interval: Duration::from_secs(60),
            output_buffer_timeout: Duration::from_millis(250),
            min_output_buffer_timeout: Duration::from_millis(25),
            max_output_buffer_timeout: Duration::from_secs(30),
            max_output_buffer_size: 65536,
            max_channel_consumers: 0,
            max_attempts: 0,
            client_timeout: Duration::from_secs(60),
            max_deflate_level: 6,
            snappy: true,
            deflate: true,
            data_path: None,
            sync_every: 2500,
            sync_timeout: Duration::from_secs(2),
            max_bytes_per_file: 104857600,
            retention_time: Duration::ZERO,
            retention_bytes: 0,
            e2e_percentiles: Vec::new(),
            e2e_window: Duration::from_secs(600),
            segment_io: nsq_storage::SegmentIo::Ring,
        }
    }
}
