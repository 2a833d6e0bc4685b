//! A group's Raft log compaction and snapshots (docs/replication.md, "How it works"):
//! what every replica held for long enough is dropped, and a snapshot carries the
//! topic as the leader holds it: its head, its channels' positions and its unfinished
//! records, at the leader's own sequences; a replica that receives one restores it.

use super::{Group, ShardCluster, RETAIN_BYTES};
use crate::server::Server;
use bytes::Bytes;
use nsq_replication::Entry;
use nsq_shards::mesh::AdminOp;
use nsq_shards::message::MessageId;
use nsq_shards::topic::{ReplicaRecord, ReplicaState};
use std::collections::HashMap;
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
    ///
    /// `all`: every group; otherwise only the awake ones (a quiet group's log does not
    /// move: the driver sweeps them all less often).
    pub(super) fn compact_logs(&self, server: &Server, all: bool) {
        let now = Instant::now();
        let keep = self.retain_time(server);
        let me = self.cfg.me.replica;
        let mut groups = self.groups.borrow_mut();
        let names: Vec<String> = if all {
            groups.keys().cloned().collect()
        } else {
            self.awake.borrow().iter().cloned().collect()
        };
        for topic in &names {
            let Some(g) = groups.get_mut(topic).filter(|g| !g.stopped) else {
                continue;
            };
            let applied = g.group.applied_index();
            g.retention.held.entry(me).or_default().sample(now, applied);
            if g.group.is_leader() {
                for v in g.group.voters() {
                    if v == me || !self.links.connected(v) {
                        continue;
                    }
                    if let Some(m) = g.group.matched(v) {
                        g.retention.held.entry(v).or_default().sample(now, m);
                    }
                }
            }
            let mut target = applied.min(g.retention.safe);
            if g.group.is_leader() {
                let mut everywhere = applied;
                for v in g.group.voters() {
                    everywhere =
                        everywhere.min(g.retention.held.get_mut(&v).map_or(0, |h| h.as_of(keep)));
                }
                let declare = everywhere.min(g.retention.last_real);
                if declare > g.retention.safe {
                    // The followers compact as far once they apply this.
                    if g.group.propose(&Entry::Compact { index: declare }).is_ok() {
                        g.retention.safe = declare;
                    }
                    self.mark(topic);
                }
                target = everywhere;
            }
            if g.group.store().log().entry_bytes() > RETAIN_BYTES {
                target = applied;
            }
            if target < g.group.first_index() {
                continue;
            }
            let data = snapshot_data(server, topic, g, target);
            let held = g.group.store().log().entry_bytes();
            match g.group.compact(target, data) {
                Ok(()) => crate::memory::note_freed_by_burst(
                    held.saturating_sub(g.group.store().log().entry_bytes()),
                ),
                Err(e) => log::debug!("TOPIC({topic}): log not compacted: {e}"),
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

/// The most body bytes a snapshot's records carry, and the longest span of sequences
/// they cover: a larger backlog is not sent, and the replica that restores such a
/// snapshot misses it (docs/replication.md, "What a replica can miss"). Both keep a
/// snapshot's frame under the cluster link's frame limit.
pub(super) const SNAPSHOT_MAX_BYTES: usize = 32 << 20;
pub(super) const SNAPSHOT_MAX_SPAN: u64 = 1 << 19;

impl ShardCluster {
    /// The data of a snapshot the leader sends now: the topic as it holds it at this
    /// moment, with its unfinished records ([`ReplicaState`]), later than the snapshot's
    /// index (the replica skips the messages of the entries after that index, which it
    /// then holds, by ID). `None`: the topic is gone.
    pub(super) async fn snapshot_to_send(&self, server: &Server, topic: &str) -> Option<Vec<u8>> {
        if self.deleted(topic) {
            return Some(super::deletion::DELETED_SNAPSHOT.to_vec());
        }
        let state = server
            .shard
            .replica_state(topic, SNAPSHOT_MAX_SPAN, SNAPSHOT_MAX_BYTES)
            .await?;
        Some(encode_state(&state))
    }
}

impl ShardCluster {
    /// Restores a snapshot the leader sent: the topic's channels, its unfinished
    /// records at the leader's sequences and its channels' positions. A snapshot
    /// without the records this replica misses leaves a hole in its log: it then hands
    /// leadership to another replica whenever it gets it while one is connected (for
    /// as long as this process runs).
    pub(super) fn restore(&self, server: &Server, topic: &str, r: &nsq_replication::Restore) {
        let Some(state) = parse_state(&r.data) else {
            log::error!(
                "TOPIC({topic}): the snapshot at Raft index {} does not decode; nothing restored",
                r.index
            );
            return;
        };
        for (ch, _) in &state.channels {
            if !server.shard.has_channel(topic, ch) {
                let _ = server
                    .shard
                    .admin(AdminOp::CreateChannel(topic.to_string(), ch.clone()));
            }
        }
        let carried = state.records.as_ref().map(Vec::len);
        let head = state.head;
        let paged_to = self
            .groups
            .borrow_mut()
            .get_mut(topic)
            .and_then(|g| g.paged_to.take());
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            g.views.forget_all();
        }
        let restored = server.shard.restore_replica(topic, state);
        if restored.missing && paged_to != Some(head) {
            log::warn!(
                "TOPIC({topic}): caught up from a snapshot at Raft index {} without the messages this replica misses (more than a snapshot carries); it hands leadership to another replica",
                r.index
            );
            if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                if g.gap == super::Gap::None {
                    g.gap = super::Gap::Missing { handed_at: None };
                }
            }
        } else if let Some(carried) = carried {
            log::info!(
                "TOPIC({topic}): caught up from a snapshot at Raft index {}: {} of its {carried} unfinished message(s) appended",
                r.index,
                restored.appended,
            );
        } else {
            // A backlog larger than a snapshot carries, which this replica's log held
            // already (fetched in pages first: `catchup`).
            log::info!(
                "TOPIC({topic}): caught up from a snapshot at Raft index {}: this replica's log already holds the leader's unfinished messages (to sequence {})",
                r.index,
                server.shard.topic_head(topic)
            );
        }
    }
}

/// How far a group's Raft log may be compacted, as this node knows it.
#[derive(Default)]
pub(super) struct Retention {
    /// Per replica (this node's own applied index included), what it held over time:
    /// for [`ShardCluster::compact_logs`] on the leader.
    pub held: HashMap<u64, History>,
    /// The highest index the leader declared safe to drop ([`Entry::Compact`]): as far
    /// as a follower compacts, so that it still has what a lagging replica needs if it
    /// becomes the leader.
    pub safe: u64,
    /// The index of the last applied entry that is not a `Compact`: a `Compact` declares
    /// no further (it is itself an entry, which would otherwise call for the next one,
    /// forever).
    pub last_real: u64,
    /// (Raft index, the topic's newest message ID and log head after applying it) of
    /// the applied publishes not yet compacted: a snapshot made at an index carries
    /// those of that index.
    pub ids_at: std::collections::VecDeque<(u64, u64, u64)>,
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
/// A snapshot's data at Raft index `index` as [`compact_logs`](ShardCluster::compact_logs)
/// keeps it: the topic's newest message ID and log head once it had applied that
/// index, and its channels with their positions, without records (the leader adds them
/// when it sends a snapshot: [`ShardCluster::snapshot_to_send`]). Drops the group's
/// record of older indexes.
pub(super) fn snapshot_data(server: &Server, topic: &str, g: &mut Group, index: u64) -> Vec<u8> {
    if g.deleted {
        return super::deletion::DELETED_SNAPSHOT.to_vec();
    }
    let mut at = None;
    while let Some(&(i, last, head)) = g.retention.ids_at.front() {
        if i > index {
            break;
        }
        at = Some((last, head));
        g.retention.ids_at.pop_front();
    }
    let (last_id, head) = match at {
        Some((last, head)) => {
            // Kept as the record of `index` for a later snapshot at the same place.
            g.retention.ids_at.push_front((index, last, head));
            (last, head)
        }
        // No publish applied since the last snapshot: what the topic holds.
        None => (
            server.shard.topic_last_id(topic).map_or(0, |i| i.0),
            server.shard.topic_head(topic),
        ),
    };
    let state = ReplicaState {
        last_id,
        head,
        low: head,
        channels: server
            .shard
            .channel_watermarks(topic)
            .into_iter()
            .map(|(c, p)| (c, p.min(head)))
            .collect(),
        records: None,
    };
    encode_state(&state)
}

/// The version byte of a snapshot's data.
const SNAPSHOT_VERSION: u8 = 2;

/// A [`ReplicaState`] as a snapshot's data (integers little-endian):
///
/// ```text
/// version u8 (= 2) | last_id u64 | head u64 | low u64
/// | channel count u16 | (name len u8 | name | position u64)*
/// | has records u8 | [record count u32 | (seq u64 | id u64 | timestamp i64
///                                       | due i64 | body len u32 | body)*]
/// ```
pub(super) fn encode_state(state: &ReplicaState) -> Vec<u8> {
    let mut b = vec![SNAPSHOT_VERSION];
    for v in [state.last_id, state.head, state.low] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let channels: Vec<&(String, u64)> = state
        .channels
        .iter()
        .filter(|(n, _)| n.len() <= usize::from(u8::MAX))
        .take(usize::from(u16::MAX))
        .collect();
    b.extend_from_slice(&(channels.len() as u16).to_le_bytes());
    for (name, position) in channels {
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&position.to_le_bytes());
    }
    match &state.records {
        None => b.push(0),
        Some(records) => {
            b.push(1);
            b.extend_from_slice(&(records.len() as u32).to_le_bytes());
            for r in records {
                b.extend_from_slice(&r.seq.to_le_bytes());
                b.extend_from_slice(&r.id.0.to_le_bytes());
                b.extend_from_slice(&r.timestamp.to_le_bytes());
                b.extend_from_slice(&r.defer_until_ns.to_le_bytes());
                b.extend_from_slice(&(r.body.len() as u32).to_le_bytes());
                b.extend_from_slice(&r.body);
            }
        }
    }
    b
}

/// Reads what [`encode_state`] wrote; `None` for data that is not such a state (bytes
/// from the network: never panics, allocates no more than they hold).
pub(super) fn parse_state(data: &[u8]) -> Option<ReplicaState> {
    let mut r = Reader(data);
    if r.take(1)?[0] != SNAPSHOT_VERSION {
        return None;
    }
    let last_id = r.u64()?;
    let head = r.u64()?;
    let low = r.u64()?;
    let n = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
    let mut channels = Vec::new();
    for _ in 0..n {
        let len = usize::from(r.take(1)?[0]);
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_string();
        channels.push((name, r.u64()?));
    }
    let records = match r.take(1)?[0] {
        0 => None,
        1 => {
            let n = u32::from_le_bytes(r.take(4)?.try_into().ok()?);
            let mut records = Vec::new();
            for _ in 0..n {
                let seq = r.u64()?;
                let id = MessageId(r.u64()?);
                let timestamp = r.u64()? as i64;
                let defer_until_ns = r.u64()? as i64;
                let len = u32::from_le_bytes(r.take(4)?.try_into().ok()?) as usize;
                let body = Bytes::copy_from_slice(r.take(len)?);
                records.push(ReplicaRecord {
                    seq,
                    id,
                    timestamp,
                    defer_until_ns,
                    body,
                });
            }
            Some(records)
        }
        _ => return None,
    };
    r.0.is_empty().then_some(ReplicaState {
        last_id,
        head,
        low,
        channels,
        records,
    })
}

/// The unread rest of a snapshot's data.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_and_damaged_data_is_refused() {
        let state = ReplicaState {
            last_id: 42,
            head: 17,
            low: 15,
            channels: vec![("c".into(), 15), ("d#ephemeral".into(), 17)],
            records: Some(vec![ReplicaRecord {
                seq: 16,
                id: MessageId(41),
                timestamp: 1_700_000_000_000_000_000,
                defer_until_ns: 0,
                body: Bytes::from_static(b"body"),
            }]),
        };
        let data = encode_state(&state);
        assert_eq!(parse_state(&data), Some(state.clone()));
        let bare = ReplicaState {
            records: None,
            ..state
        };
        assert_eq!(parse_state(&encode_state(&bare)), Some(bare));
        for cut in 0..data.len() {
            assert_eq!(parse_state(&data[..cut]), None, "cut at {cut}");
        }
        let mut longer = data.clone();
        longer.push(0);
        assert_eq!(parse_state(&longer), None);
        let mut other = data;
        other[0] = 1;
        assert_eq!(parse_state(&other), None);
    }
}
