//! This shard's part of `/stats` and of `/ping` (health), the client and e2e latency
//! entries, and the shard's counters.

use super::{bump, Shard};
use crate::client::Client;
use crate::options::Options;
use crate::stats::*;
use std::rc::Rc;

impl Shard {
    /// The first disk error of any topic store of this shard (nsqd's health), else a
    /// channel whose backlog cannot be read back from its segments while the read is
    /// retried (nsqd reports only write errors; a backlog that cannot be delivered is
    /// reported here too, until a read succeeds).
    pub fn health(&self) -> Option<String> {
        let topics = self.topics.borrow();
        topics
            .values()
            .find_map(|t| {
                t.store()
                    .and_then(|s| s.error().map(String::from))
                    .or_else(|| t.store_error().map(String::from))
            })
            .or_else(|| self.meta.error())
            .or_else(|| self.meta.any_failed_recovery())
            .or_else(|| {
                topics
                    .values()
                    .flat_map(|t| t.channels.values())
                    .find_map(|c| c.read_error().map(str::to_string))
            })
    }

    /// Whether the last metadata write of this shard succeeded (no error to report).
    pub fn meta_healthy(&self) -> bool {
        self.meta.error().is_none()
    }

    /// This shard's part of /stats.
    pub fn stats(&self, req: &StatsRequest) -> ShardStats {
        let now_ns = crate::message::now_unix_nanos();
        let now = std::time::Instant::now();
        // A health check tells the state now: a store that can be created now is.
        self.retry_missing_stores();
        let health_error = self.health();
        let topics = self.topics.borrow();
        let mut names: Vec<&String> = topics.keys().collect();
        names.sort();
        let mut out = Vec::new();
        let mut counters = ShardCounters {
            shard: self.index(),
            // The CPU it is pinned to, or (not pinned: fewer shards than CPUs) the one
            // it runs on now.
            cpu: self.place.cpu.unwrap_or_else(rustix::thread::sched_getcpu),
            pinned: self.place.cpu.is_some(),
            topics: topics.len(),
            clients: self.clients.map.borrow().len(),
            messages_in: self.counters.messages_in.get(),
            bytes_in: self.counters.bytes_in.get(),
            messages_out: self.counters.messages_out.get(),
            bytes_out: self.counters.bytes_out.get(),
            cross_shard_sent: self.counters.cross_shard_sent.get(),
            cross_shard_received: self.counters.cross_shard_received.get(),
            handoffs_sent: self.counters.handoffs_sent.get(),
            handoffs_received: self.counters.handoffs_received.get(),
            loop_lag_us: self.counters.loop_lag_us.get(),
            loop_lag_max_us: self.counters.loop_lag_max_us.get(),
            health_error,
            ..Default::default()
        };
        for t in topics.values() {
            counters.channels += t.channels.len();
            counters.depth += t.depth();
            for ch in t.channels.values() {
                counters.depth += ch.depth(&t.log);
                counters.in_flight += ch.in_flight_count() as u64;
                counters.deferred += ch.deferred_count() as u64;
            }
        }
        let mut topic_names = Vec::new();
        if req.counters_only {
            topic_names = names.iter().map(|n| n.to_string()).collect();
            names.clear();
        }
        let retains = self.opts.retains();
        let mut reads = Vec::new();
        for name in names {
            if !req.topic.is_empty() && *name != req.topic {
                continue;
            }
            let t = &topics[name];
            let mut channels = Vec::new();
            for ch in t.channels.values() {
                if !req.channel.is_empty() && ch.name() != req.channel {
                    continue;
                }
                let clients = req.include_clients.then(|| {
                    ch.clients()
                        .iter()
                        .map(|c| client_stats(c, &req.topic))
                        .collect()
                });
                channels.push(ChannelStats {
                    channel_name: ch.name().to_string(),
                    depth: ch.depth(&t.log),
                    backend_depth: ch.backend_depth(&t.log),
                    in_flight_count: ch.in_flight_count(),
                    deferred_count: ch.deferred_count(),
                    message_count: ch.message_count(),
                    by_rank: ch.rank_counts(),
                    requeue_count: ch.requeue_count(),
                    timeout_count: ch.timeout_count(),
                    client_count: ch.clients().len(),
                    clients,
                    paused: ch.is_paused(),
                    e2e_processing_latency: channel_e2e(ch, &self.opts, now_ns),
                    lag: self.opts.channel_lag.then(|| {
                        let oldest = ch.oldest_unfinished(&t.log);
                        if let Some(seq) = oldest.read_wanted {
                            if reads.len() < DISK_TIMESTAMP_READS {
                                reads.push((t.name.clone(), ch.name().to_string(), seq));
                            }
                        }
                        ChannelLag {
                            oldest_unfinished_age_ms: oldest.timestamp.map_or(0, |ts| {
                                (now_ns.saturating_sub(ts).max(0) / 1_000_000) as u64
                            }),
                            fin_latency: ch.fin_latency(now),
                        }
                    }),
                    limits: channel_limits(ch),
                });
            }
            if !req.channel.is_empty() && channels.is_empty() {
                continue;
            }
            out.push(TopicStats {
                topic_name: t.name.clone(),
                channels,
                depth: t.depth(),
                backend_depth: t.backend_depth(),
                message_count: t.message_count(),
                message_bytes: t.message_bytes(),
                paused: t.paused,
                e2e_processing_latency: topic_e2e(t, &self.opts, now_ns),
                retained_oldest_timestamp: retains.then_some(t.retained().oldest_timestamp),
                retained_messages: retains.then_some(t.retained().messages),
                retained_bytes: retains.then_some(t.retained().bytes),
            });
        }
        if !reads.is_empty() {
            self.read_disk_timestamps(reads);
        }
        let mut producers = Vec::new();
        if req.include_clients {
            let clients = self.clients.map.borrow();
            let mut list: Vec<Rc<Client>> = clients.values().filter_map(|w| w.upgrade()).collect();
            list.sort_by_key(|c| c.id);
            for c in list {
                if !c.pub_counts().is_empty() {
                    producers.push(client_stats(&c, &req.topic));
                }
            }
        }
        let client_count = self.clients.map.borrow().len();
        ShardStats {
            topics: out,
            producers,
            counters,
            client_count,
            topic_found: !req.topic.is_empty() && topics.contains_key(&req.topic),
            topic_names,
        }
    }

    pub fn count_cross_sent(&self) {
        bump(&self.counters.cross_shard_sent, 1);
    }

    pub fn count_cross_received(&self) {
        bump(&self.counters.cross_shard_received, 1);
    }

    pub fn count_handoff_sent(&self) {
        bump(&self.counters.handoffs_sent, 1);
    }

    pub fn count_handoff_received(&self) {
        bump(&self.counters.handoffs_received, 1);
    }

    /// Records the lateness of a timer tick (event-loop lag), in microseconds.
    pub fn record_loop_lag(&self, us: u64) {
        self.counters.loop_lag_us.set(us);
        if us > self.counters.loop_lag_max_us.get() {
            self.counters.loop_lag_max_us.set(us);
        }
    }

    pub fn count_bytes_out(&self, n: u64) {
        bump(&self.counters.bytes_out, n);
    }
}

/// A client's /stats entry. `topic` filters pub_counts like nsqd (which lists only the
/// first topic because of an upstream `break`).
pub fn client_stats(c: &Client, topic: &str) -> ClientStats {
    let s = c.settings.borrow();
    let auth = c.auth();
    let pub_counts = c
        .pub_counts()
        .iter()
        .filter(|(t, _)| topic.is_empty() || t == topic)
        .take(1)
        .map(|(t, n)| PubCount {
            topic: t.clone(),
            count: *n,
        })
        .collect();
    ClientStats {
        client_id: s.client_id.clone(),
        hostname: s.hostname.clone(),
        version: "V2",
        remote_address: c.remote_address.clone(),
        state: c.state.get() as i32,
        ready_count: c.ready_count.get(),
        in_flight_count: c.in_flight.get(),
        message_count: c.message_count(),
        finish_count: c.finish_count(),
        requeue_count: c.requeue_count(),
        connect_ts: c.connect_ts,
        sample_rate: s.sample_rate as i32,
        deflate: matches!(c.compression(), crate::client::Compression::Deflate(_)),
        snappy: c.compression() == crate::client::Compression::Snappy,
        user_agent: s.user_agent.clone(),
        authed: c.has_authorizations(),
        auth_identity: auth
            .as_ref()
            .map(|a| a.identity.clone())
            .unwrap_or_default(),
        auth_identity_url: auth
            .as_ref()
            .map(|a| a.identity_url.clone())
            .unwrap_or_default(),
        topology: crate::stats::ClientTopologyStats {
            topology_zone: s.topology.zone.clone(),
            topology_region: s.topology.region.clone(),
        },
        pub_counts,
        tls: c.tls().is_some(),
        tls_cipher_suite: c
            .tls()
            .as_ref()
            .map(|t| t.cipher_suite.clone())
            .unwrap_or_default(),
        tls_version: c
            .tls()
            .as_ref()
            .map(|t| t.version.clone())
            .unwrap_or_default(),
        tls_negotiated_protocol: String::new(),
        tls_negotiated_protocol_is_mutual: false,
    }
}

/// A channel's `e2e_processing_latency` (nsqd: Channel stats, Quantile.Result): zeros
/// for a channel with no FIN yet, `{"count":0,"percentiles":null}` when not configured.
fn channel_e2e(ch: &crate::channel::Channel, opts: &Options, now: i64) -> E2eLatency {
    if opts.e2e_percentiles.is_empty() {
        return E2eLatency::default();
    }
    let mut q = ch.e2e().cloned().unwrap_or_else(|| {
        crate::quantile::Quantile::new(opts.e2e_window, &opts.e2e_percentiles, now)
    });
    E2eLatency::from_result(q.result(now))
}

/// A topic's `e2e_processing_latency`: its channels' streams merged (nsqd:
/// AggregateChannelE2eProcessingLatency); none without channels.
fn topic_e2e(t: &crate::topic::Topic, opts: &Options, now: i64) -> E2eLatency {
    if opts.e2e_percentiles.is_empty() || t.channels.is_empty() {
        return E2eLatency::default();
    }
    let mut agg = crate::quantile::Quantile::new(opts.e2e_window, &opts.e2e_percentiles, now);
    for ch in t.channels.values() {
        if let Some(q) = ch.e2e() {
            agg.merge(q);
        }
    }
    E2eLatency::from_result(agg.result(now))
}

/// The most on-disk records one `/stats` reads (in the background) for the channels'
/// oldest unfinished publish times (`--channel-lag-stats`); the others are read by the
/// next calls.
const DISK_TIMESTAMP_READS: usize = 64;

impl Shard {
    /// Reads, in a task of its own, the publish times of the records `reads` names
    /// (topic, channel, sequence) for the channels' next `oldest_unfinished_age_ms`.
    fn read_disk_timestamps(&self, reads: Vec<(String, String, u64)>) {
        let Some(me) = self.me.borrow().upgrade() else {
            return;
        };
        glommio::spawn_local(async move {
            // Not while the caller still holds the topics (see schedule_disk_reads).
            super::read_ahead::yield_once().await;
            for (topic, channel, seq) in reads {
                let store = me
                    .topics
                    .borrow()
                    .get(&topic)
                    .and_then(|t| t.store().cloned());
                let Some(store) = store else { continue };
                let Ok(recs) = store.read(seq, 1).await else {
                    continue;
                };
                let Some(r) = recs.first() else { continue };
                let mut topics = me.topics.borrow_mut();
                if let Some(ch) = topics
                    .get_mut(&topic)
                    .and_then(|t| t.channels.get_mut(&channel))
                {
                    ch.note_disk_timestamp(seq, r.timestamp);
                }
            }
        })
        .detach();
    }
}

/// The `/stats` extras of a channel's delivery limits (see [`ChannelLimitStats`]).
fn channel_limits(ch: &crate::channel::Channel) -> ChannelLimitStats {
    let max = ch.max_attempts();
    let shown = max > 0 || ch.own_max_attempts().is_some();
    ChannelLimitStats {
        max_attempts: shown.then_some(max),
        dead_count: (shown || ch.dead_count() > 0).then_some(ch.dead_count()),
        rate_limit: ch.rate_limit(),
    }
}
