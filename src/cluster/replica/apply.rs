//! What a group's committed entries do to the topic on this shard, and the channel
//! state the leader replicates (docs/replication.md, "How it works"): a batch appended
//! with the leader's IDs, a channel change applied where it sits in the log, each
//! channel's cursor and unfinished messages set on the replicas.

use super::{ShardCluster, CURSOR_EVERY, POSITION_MAX, TICK, WHOLE_MAX};
use crate::server::Server;
use nsq_replication::{ChannelOp, Entry, PendingMessage};
use nsq_shards::mesh::AdminOp;
use nsq_shards::message::MessageId;
use nsq_shards::shard::{DurableWait, PendingState};
use nsq_shards::topic::STORE_DELAY;
use std::hash::{Hash, Hasher};
use std::time::Instant;

impl ShardCluster {
    /// Proposes the delivery state of the channels of the topics this shard leads,
    /// where it changed: each channel's cursor and unfinished messages
    /// ([`ChannelOp::Position`]); for a channel holding more than [`POSITION_MAX`]
    /// unfinished messages, what changed since the previous round
    /// ([`ChannelOp::Changes`]), or only its low watermark ([`ChannelOp::Cursor`]) when
    /// its changes were not all recorded.
    pub(super) fn replicate_cursors(&self, server: &Server) {
        let led: Vec<String> = self.led.borrow().iter().cloned().collect();
        self.replicate_cursors_of(server, led);
    }

    /// Messages a led topic takes before its channels' positions are proposed again
    /// without waiting for [`CURSOR_EVERY`]: a quarter of `--mem-queue-size` (at least
    /// 16; never with `--mem-queue-size=0`, where every record is written anyway). A
    /// follower hands the records older than its newest `--mem-queue-size` to its store
    /// unless it knows them finished; positions this frequent tell it which ones the
    /// consumers finished, so that a busy topic's followers write what the leader
    /// writes (what is unfinished) rather than nearly every record. A topic with a
    /// channel holding more than [`POSITION_MAX`] unfinished messages waits for the
    /// 100 ms round, which sends its changes ([`ShardCluster::replicate_busy`]).
    pub(super) fn positions_after(&self, server: &Server) -> u64 {
        match server.shard.opts.mem_queue_size {
            0 => u64::MAX,
            mq => (mq / 4).max(16),
        }
    }

    /// [`ShardCluster::replicate_cursors`] for the led `topics` that took
    /// [`ShardCluster::positions_after`] messages since their last round, except those
    /// with a channel holding more than [`POSITION_MAX`] unfinished messages.
    pub(super) fn replicate_busy(&self, server: &Server, topics: Vec<String>) {
        let topics = topics
            .into_iter()
            .filter(|t| {
                if server.shard.channel_pending_max(t) <= POSITION_MAX {
                    return true;
                }
                if let Some(g) = self.groups.borrow_mut().get_mut(t) {
                    g.published_since_positions = 0;
                }
                false
            })
            .collect();
        self.replicate_cursors_of(server, topics);
    }

    /// [`ShardCluster::replicate_cursors`] for `topics` (those this node leads).
    pub(super) fn replicate_cursors_of(&self, server: &Server, topics: Vec<String>) {
        for topic in topics {
            if !self.led.borrow().contains(&topic)
                || !self
                    .groups
                    .borrow()
                    .get(&topic)
                    .is_some_and(|g| g.channels_taken_over)
            {
                // Its channels take over their states once the entries of the leaders
                // before are applied ([`ShardCluster::take_over_channels`]).
                continue;
            }
            if let Some(g) = self.groups.borrow_mut().get_mut(&topic) {
                g.published_since_positions = 0;
            }
            let changes = server.shard.topic_changes(&topic);
            let whole = self
                .groups
                .borrow()
                .get(&topic)
                .map(|g| g.views.wanted_whole().clone())
                .unwrap_or_default();
            if changes.is_some()
                && whole.is_empty()
                && !self
                    .groups
                    .borrow()
                    .get(&topic)
                    .is_some_and(|g| g.views.changes_refresh_due())
                && self
                    .groups
                    .borrow()
                    .get(&topic)
                    .is_some_and(|g| g.cursors_at == changes)
            {
                // Nothing happened to the topic since its state was last proposed.
                continue;
            }
            let positions = server
                .shard
                .channel_positions(&topic, POSITION_MAX, &whole, WHOLE_MAX);
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(&topic) else {
                continue;
            };
            let mut proposed = false;
            // Every proposal of this round taken: the next round may skip the topic
            // while it does not change.
            let mut complete = true;
            // A channel the leader no longer has (an #ephemeral one whose last consumer
            // left is deleted there, as nsqd does) goes on the replicas too.
            let gone: Vec<String> = g
                .cursors
                .keys()
                .filter(|c| !positions.iter().any(|p| &p.channel == *c))
                .cloned()
                .collect();
            for channel in gone {
                let e = Entry::Channel {
                    channel: channel.clone(),
                    op: ChannelOp::Delete,
                };
                if g.group.propose(&e).is_ok() {
                    g.cursors.remove(&channel);
                    proposed = true;
                } else {
                    complete = false;
                }
            }
            for pos in positions {
                // Asked for by a replica: sent whole (if it holds at most WHOLE_MAX)
                // even when it is what was last proposed.
                let asked = g.views.whole_sent(&pos.channel);
                if asked && !matches!(pos.state, PendingState::Whole(_)) {
                    log::warn!(
                        "TOPIC({topic}): channel {} holds more than {WHOLE_MAX} unfinished messages: a replica that asked for its whole state holds it by its low watermark",
                        pos.channel
                    );
                }
                let mut h = std::hash::DefaultHasher::new();
                // Changes go whenever there are any (the same changes twice are news
                // twice); the rest when they differ from what was last proposed.
                let mut news = asked;
                let op = match pos.state {
                    PendingState::Whole(pending) => {
                        (pos.cursor, &pending).hash(&mut h);
                        ChannelOp::Position {
                            cursor: pos.cursor,
                            pending: pending.into_iter().map(pending_message).collect(),
                        }
                    }
                    PendingState::Changes { finished, pending } => {
                        (u64::MAX - 1, pos.cursor, pos.low).hash(&mut h);
                        // Also every CHANGES_REFRESH without any: a replica that lacks
                        // the state they apply to learns so, and asks for it.
                        news = !(finished.is_empty() && pending.is_empty())
                            || g.views.changes_refresh_due_for(&pos.channel);
                        ChannelOp::Changes {
                            cursor: pos.cursor,
                            low: pos.low,
                            finished,
                            pending: pending.into_iter().map(pending_message).collect(),
                        }
                    }
                    PendingState::Watermark => {
                        (u64::MAX, pos.low).hash(&mut h);
                        ChannelOp::Cursor { offset: pos.low }
                    }
                };
                let digest = h.finish();
                let by_changes = matches!(op, ChannelOp::Changes { .. });
                if !by_changes {
                    g.views.changes_ended(&pos.channel);
                }
                if !news && g.cursors.get(&pos.channel) == Some(&digest) {
                    continue;
                }
                let e = Entry::Channel {
                    channel: pos.channel.clone(),
                    op,
                };
                if g.group.propose(&e).is_ok() {
                    // A channel sent whole because a replica asked goes on by its
                    // changes: its refresh clock runs from now, so that the replica,
                    // which keeps the state only from the next changes on, gets them
                    // within CHANGES_REFRESH even if the channel stays idle.
                    if by_changes || asked {
                        g.views.changes_sent(&pos.channel);
                    }
                    g.cursors.insert(pos.channel, digest);
                    proposed = true;
                } else {
                    // The replicas did not get what the channel's changes since are
                    // relative to.
                    server.shard.channel_changes_lost(&topic, &pos.channel);
                    g.cursors.remove(&pos.channel);
                    complete = false;
                }
            }
            if complete {
                g.cursors_at = changes;
            }
            drop(groups);
            if proposed {
                self.mark(&topic);
            }
        }
    }
}

fn pending_message((offset, attempts, due_unix_ns): (u64, u16, i64)) -> PendingMessage {
    PendingMessage {
        offset,
        attempts,
        due_unix_ns,
    }
}

/// Applies one committed entry to the topic on this shard; a batch's durable wait when
/// the sync policy asks for one. `Err`: a batch the topic's store refused (logged).
///
/// `own`: the entry is this leader's own proposal of its term, so its channels are
/// already in the state a channel position describes (an earlier leader's positions
/// apply on every replica, a new leader included).
pub(super) fn apply(
    server: &Server,
    topic: &str,
    entry: Entry,
    own: bool,
) -> Result<Option<DurableWait>, Unstored> {
    let shard = &server.shard;
    let entry_base = match &entry {
        Entry::PublishAt { base, .. } => Some(*base),
        _ => None,
    };
    match entry {
        Entry::Publish(msgs) | Entry::PublishAt { messages: msgs, .. } => {
            let base = entry_base;
            let now_i = Instant::now();
            let now_ns = nsq_shards::message::now_unix_nanos();
            // The leader's IDs are 16 hex digits; one that is not (never seen) keeps its
            // place in the numbering with ID 0.
            let batch = msgs
                .into_iter()
                .map(|m| {
                    let id = MessageId::from_hex(&m.id).unwrap_or(MessageId(0));
                    let ts = i64::try_from(m.timestamp_ns).unwrap_or(i64::MAX);
                    let defer = (m.defer_ms > 0).then(|| {
                        nsq_shards::message::instant_at(
                            ts.saturating_add(i64::from(m.defer_ms) * 1_000_000),
                            now_i,
                            now_ns,
                        )
                    });
                    (id, ts, defer, m.body)
                })
                .collect();
            let stored = match base {
                Some(base) => shard.publish_replicated_at(topic, base, batch),
                None => shard.publish_replicated(topic, batch),
            };
            // A follower learns of FINs from the leader's positions, every CURSOR_EVERY:
            // its records wait that much longer for the store (from the next batch on),
            // so what the leader's consumers finish in time is written nowhere.
            let leads = server.cluster.as_ref().is_some_and(|c| c.leads(topic));
            shard.set_store_delay(
                topic,
                if leads {
                    STORE_DELAY
                } else {
                    REPLICA_STORE_DELAY
                },
            );
            match stored {
                Ok(w) => Ok(w),
                Err(e) => {
                    log::error!("TOPIC({topic}): a committed batch was not stored: {e}");
                    Err(Unstored)
                }
            }
        }
        Entry::Channel { channel, op } => {
            let t = topic.to_string();
            let cluster = server.cluster.as_ref();
            let views = |f: &dyn Fn(&mut super::positions::Views)| {
                if let Some(c) = cluster {
                    if let Some(g) = c.groups.borrow_mut().get_mut(topic) {
                        f(&mut g.views);
                    }
                }
            };
            let r = match op {
                ChannelOp::Create => {
                    // A led topic's new channel: the next lease check looks at it.
                    if let Some(c) = cluster {
                        c.leases_changed();
                    }
                    shard.admin(AdminOp::CreateChannel(t, channel))
                }
                ChannelOp::Delete => {
                    views(&|v| v.forget(&channel));
                    shard.admin(AdminOp::DeleteChannel(t, channel))
                }
                ChannelOp::Empty => {
                    views(&|v| v.forget(&channel));
                    shard.admin(AdminOp::EmptyChannel(t, channel))
                }
                ChannelOp::Pause(p) => shard.admin(AdminOp::PauseChannel(t, channel, p)),
                ChannelOp::Cursor { offset } => {
                    if !own {
                        views(&|v| v.forget(&channel));
                    }
                    shard.advance_channel(topic, &channel, offset);
                    Ok(())
                }
                ChannelOp::SendWhole => {
                    if cluster.is_some_and(|c| c.leads(topic)) {
                        views(&|v| v.want_whole(&channel));
                    }
                    Ok(())
                }
                ChannelOp::Position { .. } | ChannelOp::Changes { .. } if own => Ok(()),
                ChannelOp::Position { cursor, pending } => {
                    let pending: Vec<(u64, u16, i64)> = pending
                        .iter()
                        .map(|p| (p.offset, p.attempts, p.due_unix_ns))
                        .collect();
                    if shard.set_channel_position(topic, &channel, cursor, &pending) {
                        views(&|v| v.whole_applied(&channel));
                    }
                    Ok(())
                }
                ChannelOp::Changes {
                    cursor,
                    low,
                    finished,
                    pending,
                } => {
                    if let Some(c) = cluster {
                        c.apply_changes(server, topic, &channel, cursor, low, &finished, &pending);
                    }
                    Ok(())
                }
                // Not proposed by this version: FINs, REQs and attempts travel as
                // positions.
                ChannelOp::Fin { .. } | ChannelOp::Req { .. } | ChannelOp::Attempt { .. } => Ok(()),
            };
            if let Err(e) = r {
                log::debug!("TOPIC({topic}): replicated channel change: {e:?}");
            }
            Ok(None)
        }
        Entry::TopicPause(p) => {
            let _ = shard.admin(AdminOp::PauseTopic(topic.to_string(), p));
            Ok(None)
        }
        Entry::TopicCreate => {
            shard.create_topic(topic);
            Ok(None)
        }
        // Taken by the group's driver (ShardCluster::process).
        Entry::Compact { .. } | Entry::TopicDelete => Ok(None),
    }
}

/// How long a follower's unfinished records wait before they are handed to its store:
/// the leader's own wait, then one more round of positions ([`CURSOR_EVERY`]) and a
/// tick to commit and apply it. A record the leader's consumers finished within
/// [`STORE_DELAY`] is then known finished on the follower before it is due.
pub(super) const REPLICA_STORE_DELAY: std::time::Duration = STORE_DELAY
    .saturating_add(CURSOR_EVERY)
    .saturating_add(TICK);

/// A committed batch the topic's store refused (a disk error).
#[derive(Debug)]
pub(super) struct Unstored;
