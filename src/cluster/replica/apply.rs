//! What a group's committed entries do to the topic on this shard, and the channel
//! state the leader replicates (docs/replication.md, "How it works"): a batch appended
//! with the leader's IDs, a channel change applied where it sits in the log, each
//! channel's cursor and unfinished messages set on the replicas.

use super::{ShardCluster, CURSOR_EVERY, POSITION_MAX, TICK};
use crate::server::Server;
use nsq_replication::{ChannelOp, Entry, PendingMessage};
use nsq_shards::mesh::AdminOp;
use nsq_shards::message::MessageId;
use nsq_shards::shard::DurableWait;
use nsq_shards::topic::STORE_DELAY;
use std::hash::{Hash, Hasher};
use std::time::Instant;

impl ShardCluster {
    /// Proposes the delivery state of the channels of the topics this shard leads,
    /// where it changed: each channel's cursor and unfinished messages
    /// ([`ChannelOp::Position`]), or only its low watermark ([`ChannelOp::Cursor`]) for
    /// a channel holding more than [`POSITION_MAX`] unfinished messages.
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
    /// 100 ms round: its position is then only a low watermark, found by walking all
    /// of them ([`ShardCluster::replicate_busy`]).
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
            if !self.led.borrow().contains(&topic) {
                continue;
            }
            if let Some(g) = self.groups.borrow_mut().get_mut(&topic) {
                g.published_since_positions = 0;
            }
            let changes = server.shard.topic_changes(&topic);
            if changes.is_some()
                && self
                    .groups
                    .borrow()
                    .get(&topic)
                    .is_some_and(|g| g.cursors_at == changes)
            {
                // Nothing happened to the topic since its state was last proposed.
                continue;
            }
            let positions = server.shard.channel_positions(&topic, POSITION_MAX);
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
                let mut h = std::hash::DefaultHasher::new();
                let op = match pos.pending {
                    Some(pending) => {
                        (pos.cursor, &pending).hash(&mut h);
                        ChannelOp::Position {
                            cursor: pos.cursor,
                            pending: pending
                                .into_iter()
                                .map(|(offset, attempts, due_unix_ns)| PendingMessage {
                                    offset,
                                    attempts,
                                    due_unix_ns,
                                })
                                .collect(),
                        }
                    }
                    None => {
                        (u64::MAX, pos.low).hash(&mut h);
                        ChannelOp::Cursor { offset: pos.low }
                    }
                };
                let digest = h.finish();
                if g.cursors.get(&pos.channel) == Some(&digest) {
                    continue;
                }
                let e = Entry::Channel {
                    channel: pos.channel.clone(),
                    op,
                };
                if g.group.propose(&e).is_ok() {
                    g.cursors.insert(pos.channel, digest);
                    proposed = true;
                } else {
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

/// Applies one committed entry to the topic on this shard; a batch's durable wait when
/// the sync policy asks for one. `Err`: a batch the topic's store refused (logged).
pub(super) fn apply(
    server: &Server,
    topic: &str,
    entry: Entry,
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
            let leads = server.cluster.as_ref().is_some_and(|c| c.leads(topic));
            let r = match op {
                ChannelOp::Create => shard.admin(AdminOp::CreateChannel(t, channel)),
                ChannelOp::Delete => shard.admin(AdminOp::DeleteChannel(t, channel)),
                ChannelOp::Empty => shard.admin(AdminOp::EmptyChannel(t, channel)),
                ChannelOp::Pause(p) => shard.admin(AdminOp::PauseChannel(t, channel, p)),
                ChannelOp::Cursor { offset } => {
                    shard.advance_channel(topic, &channel, offset);
                    Ok(())
                }
                // The leader's own channel is the state it sent.
                ChannelOp::Position { .. } if leads => Ok(()),
                ChannelOp::Position { cursor, pending } => {
                    let pending: Vec<(u64, u16, i64)> = pending
                        .iter()
                        .map(|p| (p.offset, p.attempts, p.due_unix_ns))
                        .collect();
                    shard.set_channel_position(topic, &channel, cursor, &pending);
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
