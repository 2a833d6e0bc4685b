//! A group's Raft log compaction and snapshots (docs/replication.md, "How it works"):
//! what every replica held for long enough is dropped, and a snapshot says which
//! message a replica that restores it is at and which channels the topic has.

use super::{Group, ShardCluster, RETAIN_BYTES};
use crate::server::Server;
use nsq_replication::Entry;
use nsq_shards::message::MessageId;
use std::time::{Duration, Instant};

impl ShardCluster {
    /// Drops the Raft log entries that every replica held [`ShardCluster::retain_time`]
    /// before it was last heard from (a replica that crashed may have lost from its
    /// disk what it received within that time: it gets it again from the log). The
    /// leader computes that index and proposes it ([`Entry::Compact`]); a follower
    /// compacts only as far as the last one it applied. Once a topic's log holds
    /// more than [`RETAIN_BYTES`], it keeps only what this node has not applied, and a
    /// replica behind the log's start gets a snapshot (docs/replication.md, "What a
    /// replica can miss"). The bodies live in the topic's own log: the Raft log holds
    /// them only until the replicas have them.
    pub(super) fn compact_logs(&self, server: &Server) {
        let now = Instant::now();
        let keep = self.retain_time(server);
        let me = self.cfg.me.replica;
        let mut groups = self.groups.borrow_mut();
        for (topic, g) in groups.iter_mut() {
            let applied = g.group.applied_index();
            g.held.entry(me).or_default().sample(now, applied);
            if g.group.is_leader() {
                for v in g.group.voters() {
                    if v == me || !self.links.connected(v) {
                        continue;
                    }
                    if let Some(m) = g.group.matched(v) {
                        g.held.entry(v).or_default().sample(now, m);
                    }
                }
            }
            let mut target = applied.min(g.safe);
            if g.group.is_leader() {
                let mut everywhere = applied;
                for v in g.group.voters() {
                    everywhere = everywhere.min(g.held.get_mut(&v).map_or(0, |h| h.as_of(keep)));
                }
                let declare = everywhere.min(g.last_real);
                if declare > g.safe {
                    // The followers compact as far once they apply this.
                    if g.group.propose(&Entry::Compact { index: declare }).is_ok() {
                        g.safe = declare;
                    }
                    self.dirty.borrow_mut().insert(topic.clone());
                    self.wake.notify();
                }
                target = everywhere;
            }
            if g.group.store().entry_bytes() > RETAIN_BYTES {
                target = applied;
            }
            if target < g.group.first_index() {
                continue;
            }
            let data = snapshot_data(server, topic, g, target);
            if let Err(e) = g.group.compact(target, data) {
                log::debug!("TOPIC({topic}): log not compacted: {e}");
            }
        }
    }
    /// How long the Raft log keeps an entry after every replica has it: what a replica's
    /// crash can take from its disk (a record is stored when 100 ms old and synced within
    /// `--sync-timeout`), plus a second.
    fn retain_time(&self, server: &Server) -> Duration {
        server.shard.opts.sync_timeout + Duration::from_millis(1100)
    }
}

/// Samples of one replica's position (match or applied index), taken every
/// [`CURSOR_EVERY`] while it is reachable.
#[derive(Default)]
pub(super) struct History(std::collections::VecDeque<(Instant, u64)>);

impl History {
    pub(super) fn sample(&mut self, at: Instant, index: u64) {
        self.0.push_back((at, index));
    }

    /// The position it had `keep` before its last sample (0: no sample that old yet);
    /// older samples are dropped.
    pub(super) fn as_of(&mut self, keep: Duration) -> u64 {
        let Some(&(last, _)) = self.0.back() else {
            return 0;
        };
        let cutoff = last.checked_sub(keep).unwrap_or(last);
        let mut safe = None;
        while let Some(&(at, index)) = self.0.front() {
            if at > cutoff {
                break;
            }
            safe = Some(index);
            self.0.pop_front();
        }
        match safe {
            Some(index) => {
                self.0.push_front((cutoff, index));
                index
            }
            None => 0,
        }
    }
}
/// A snapshot's data at Raft index `index`: the newest message ID the topic held once
/// it had applied that index (16 hex digits; empty when none). A replica restoring it
/// compares it with its own newest ID to know whether it misses messages. Drops the
/// group's record of older indexes.
pub(super) fn snapshot_data(server: &Server, topic: &str, g: &mut Group, index: u64) -> Vec<u8> {
    let mut id = None;
    while let Some(&(i, last)) = g.ids_at.front() {
        if i > index {
            break;
        }
        id = Some(last);
        g.ids_at.pop_front();
    }
    let id = match id {
        Some(last) => {
            // Kept as the record of `index` for a later snapshot at the same place.
            g.ids_at.push_front((index, last));
            last
        }
        // No publish applied since the last snapshot: what the topic holds.
        None => server.shard.topic_last_id(topic).map_or(0, |i| i.0),
    };
    let mut data = if id == 0 {
        Vec::new()
    } else {
        MessageId(id).to_hex().to_vec()
    };
    for c in server.shard.channel_names(topic) {
        data.push(b'\n');
        data.extend_from_slice(c.as_bytes());
    }
    data
}
/// What a snapshot's data says: the newest message ID (0: none) and the channels.
pub(super) fn parse_snapshot(data: &[u8]) -> (u64, Vec<String>) {
    let mut parts = data.split(|&b| b == b'\n');
    let id = parts
        .next()
        .and_then(MessageId::from_hex)
        .map_or(0, |i| i.0);
    let channels = parts
        .filter_map(|c| std::str::from_utf8(c).ok())
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    (id, channels)
}
