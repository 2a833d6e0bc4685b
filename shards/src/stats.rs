//! Stats snapshots in nsqd's /stats JSON schema (nsqd: stats.go), plus the per-shard
//! section this broker adds. Field order is the JSON key order nsqd writes.

use serde::Serialize;

/// `e2e_processing_latency`: `{"count":0,"percentiles":null}` when not configured.
#[derive(Clone, Debug, Serialize, Default)]
pub struct E2eLatency {
    pub count: u64,
    pub percentiles: Option<Vec<Percentile>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Percentile {
    #[serde(serialize_with = "go_float")]
    pub quantile: f64,
    /// ns (nsqd's float64 of an integer number of ns).
    pub value: i64,
}

/// encoding/json writes a whole float64 without a fraction (`1`, not `1.0`).
fn go_float<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

impl E2eLatency {
    /// From a [`crate::quantile::Quantile`] result.
    pub fn from_result((count, values): (u64, Vec<(f64, f64)>)) -> E2eLatency {
        E2eLatency {
            count,
            percentiles: Some(
                values
                    .into_iter()
                    .map(|(quantile, value)| Percentile {
                        quantile,
                        value: value as i64,
                    })
                    .collect(),
            ),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PubCount {
    pub topic: String,
    pub count: u64,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One client in `/stats`: one field per key of nsqd's client stats (ClientV2Stats), so
/// it stays one flat struct.
#[derive(Clone, Debug, Serialize)]
pub struct ClientStats {
    pub client_id: String,
    pub hostname: String,
    pub version: &'static str,
    pub remote_address: String,
    pub state: i32,
    pub ready_count: i64,
    pub in_flight_count: i64,
    pub message_count: u64,
    pub finish_count: u64,
    pub requeue_count: u64,
    pub connect_ts: i64,
    pub sample_rate: i32,
    pub deflate: bool,
    pub snappy: bool,
    pub user_agent: String,
    #[serde(skip_serializing_if = "is_false")]
    pub authed: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub auth_identity: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub auth_identity_url: String,
    /// nsqd master's `topology_zone` and `topology_region` (IDENTIFY's), each only
    /// when the client sent one.
    #[serde(flatten)]
    pub topology: ClientTopologyStats,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pub_counts: Vec<PubCount>,
    pub tls: bool,
    pub tls_cipher_suite: String,
    pub tls_version: String,
    pub tls_negotiated_protocol: String,
    pub tls_negotiated_protocol_is_mutual: bool,
}

/// A client's IDENTIFY topology fields in `/stats` (nsqd master), each left out when
/// empty so that `/stats` stays nsqd 1.3.0's for clients that send none.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientTopologyStats {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub topology_zone: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub topology_region: String,
}

/// One channel in `/stats`: one field per key of nsqd's ChannelStats, so it stays one
/// flat struct.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelStats {
    pub channel_name: String,
    pub depth: u64,
    pub backend_depth: u64,
    pub in_flight_count: usize,
    pub deferred_count: usize,
    pub message_count: u64,
    /// nsqd master's deliveries by topology rank (each key only when not 0).
    #[serde(flatten)]
    pub by_rank: crate::topology::RankCounts,
    pub requeue_count: u64,
    pub timeout_count: u64,
    pub client_count: usize,
    /// `null` when include_clients=false.
    pub clients: Option<Vec<ClientStats>>,
    pub paused: bool,
    pub e2e_processing_latency: E2eLatency,
    /// Beyond nsqd, with `--channel-lag-stats` only: `oldest_unfinished_age_ms` and
    /// `fin_latency`, written after nsqd's keys.
    #[serde(flatten)]
    pub lag: Option<ChannelLag>,
    /// Beyond nsqd: the channel's delivery limits, as extra keys present only where a
    /// limit is in force (so a channel without one shows exactly nsqd's keys).
    #[serde(flatten)]
    pub limits: ChannelLimitStats,
}

/// How far behind a channel is, in time (beyond nsqd; see
/// `shards/src/channel/lag.rs` for what counts).
#[derive(Clone, Debug, Serialize, Default)]
pub struct ChannelLag {
    /// Milliseconds since the publish of the oldest message this channel has not
    /// finished (waiting, ready again, in flight or deferred); 0 when there is none.
    pub oldest_unfinished_age_ms: u64,
    /// Delivery-to-FIN latency over the last one to two minutes.
    pub fin_latency: FinLatency,
}

/// Delivery-to-FIN latency percentiles in ns (microsecond resolution, two significant
/// digits); all 0 while `count` is 0.
#[derive(Clone, Debug, Serialize, Default, PartialEq, Eq)]
pub struct FinLatency {
    /// FINs in the window.
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
}

/// A channel's delivery limits in `/stats` (beyond nsqd; see
/// docs/dead-letters-and-rate-limits.md). Each key is absent when `None`.
#[derive(Clone, Debug, Serialize, Default)]
pub struct ChannelLimitStats {
    /// The maximum attempts in force (the channel's own or `--max-attempts`); present
    /// when it is not unlimited or the channel has its own (then possibly 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u16>,
    /// Messages published to the dead-letter topic and finished here; present with
    /// `max_attempts` or once non-zero.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_count: Option<u64>,
    /// The channel's rate limit in messages a second (`POST /channel/rate-limit`);
    /// present while it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u32>,
}

/// One topic in `/stats`: one field per key of nsqd's TopicStats, so it stays one flat
/// struct.
#[derive(Clone, Debug, Serialize)]
pub struct TopicStats {
    pub topic_name: String,
    pub channels: Vec<ChannelStats>,
    pub depth: u64,
    pub backend_depth: u64,
    pub message_count: u64,
    pub message_bytes: u64,
    pub paused: bool,
    pub e2e_processing_latency: E2eLatency,
    /// Beyond nsqd, only with `--retention-time` / `--retention-bytes`: the publish time
    /// (Unix ns) of the oldest retained message (0 = none), as of the last checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained_oldest_timestamp: Option<i64>,
    /// Messages from the oldest retained one to the newest, as of the last checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained_messages: Option<u64>,
    /// Bytes of the topic's segment files, as of the last checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained_bytes: Option<u64>,
}

/// What a /stats request asks of every shard.
#[derive(Clone, Debug, Default)]
pub struct StatsRequest {
    /// Only this topic ("" = all).
    pub topic: String,
    /// Only this channel of each listed topic ("" = all).
    pub channel: String,
    pub include_clients: bool,
    /// Only the per-shard counters (GET /shards).
    pub counters_only: bool,
}

/// One shard's counters: the per-shard section of /stats, one field per key (a flat
/// snapshot on purpose).
#[derive(Clone, Debug, Serialize, Default)]
pub struct ShardCounters {
    pub shard: usize,
    /// The CPU the shard is pinned to, or (`pinned` false) the one it ran on when the
    /// stats were taken.
    pub cpu: usize,
    /// Whether the shard's thread is pinned to `cpu` (docs/architecture.md, "Shards").
    pub pinned: bool,
    pub topics: usize,
    pub channels: usize,
    pub clients: usize,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    pub depth: u64,
    pub in_flight: u64,
    pub deferred: u64,
    pub cross_shard_sent: u64,
    pub cross_shard_received: u64,
    pub handoffs_sent: u64,
    pub handoffs_received: u64,
    /// How late the shard's timer loop last woke from a timed sleep, in microseconds
    /// (event-loop lag).
    pub loop_lag_us: u64,
    /// The largest such lateness seen, in microseconds.
    pub loop_lag_max_us: u64,
    /// The shard's last disk error, if unhealthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_error: Option<String>,
}

/// A shard's answer to a [`StatsRequest`].
#[derive(Clone, Debug, Default)]
pub struct ShardStats {
    pub topics: Vec<TopicStats>,
    /// TCP clients on this shard that have published; empty when clients are not asked.
    pub producers: Vec<ClientStats>,
    pub counters: ShardCounters,
    /// Every client on the shard (producers and consumers), for `client_count` checks.
    pub client_count: usize,
    /// The request's `topic` filter names a topic of this shard (even when the `channel`
    /// filter then leaves it out): nsqd answers `"topics":[]` then, `null` for an
    /// unknown topic.
    pub topic_found: bool,
    /// The names of the shard's topics, sorted; filled only for a `counters_only`
    /// request (GET /shards lists them: which shard owns which topic).
    pub topic_names: Vec<String>,
}
