//! Publishing to a topic this shard owns: the append, the hand-over to the store, the
//! durable wait a publisher may need before its answer, and the release of a topic held
//! for nsqlookupd's channel list.

use super::{bump, memory_may_shrink, Shard, STORE_PENDING_HIGH};
use crate::message::MessageId;
use crate::shard::LookupEvent;
use crate::topic::PublishError;
use bytes::Bytes;
use std::rc::Rc;
use std::time::Instant;

/// What a publisher waits for when its publish must be durable: the topic's store and
/// the sequence every record below which must be synced.
pub struct DurableWait {
    pub store: Rc<nsq_storage::TopicStore>,
    /// Wait until every record below this sequence is synced (`--sync-every=1`, or after
    /// a disk error).
    pub durable: Option<u64>,
}

/// What a publish appends: new bodies (IDs and timestamps given here) or a replicated
/// topic's committed messages.
enum Batch {
    Fresh(Vec<Bytes>, Option<Instant>),
    Replicated(Vec<(MessageId, i64, Option<Instant>, Bytes)>),
    /// Numbered by the leader from the sequence given.
    ReplicatedAt(u64, Vec<(MessageId, i64, Option<Instant>, Bytes)>),
}

impl Shard {
    /// Publishes to a topic this shard owns, creating it if needed, and delivers what
    /// ready clients can take. Returns what to wait for before answering when the
    /// publish must be durable (`--sync-every=1`, or the store reported an error: then the
    /// answer tells whether this write reached the disk).
    pub fn publish_local(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<Option<DurableWait>, PublishError> {
        self.publish_local_synced(topic, bodies, defer_until, false)
    }

    /// [`Shard::publish_local`], durable whatever the sync policy when `synced` (the
    /// records go to the store at once and the wait returned covers their fdatasync):
    /// the dead-letter publisher's, which finishes the source message only after.
    pub fn publish_local_synced(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        synced: bool,
    ) -> Result<Option<DurableWait>, PublishError> {
        if self.shutdown.is_set() {
            return Err(PublishError::Exiting);
        }
        if self.node.draining() {
            return Err(PublishError::Draining);
        }
        self.append_batch(topic, Batch::Fresh(bodies, defer_until), synced)
    }

    /// Appends messages of a replicated topic as its group committed them, with the IDs
    /// and timestamps the leader gave (docs/replication.md); creates the topic if needed.
    /// Not refused by a drain: the entry is committed, and every replica applies it.
    /// Returns what [`Shard::publish_local`] returns.
    pub fn publish_replicated(
        &self,
        topic: &str,
        messages: Vec<(MessageId, i64, Option<Instant>, Bytes)>,
    ) -> Result<Option<DurableWait>, PublishError> {
        self.append_batch(topic, Batch::Replicated(messages), false)
    }

    /// [`Shard::publish_replicated`] for a batch the leader numbered from `base`
    /// ([`crate::topic::Topic::append_replicated_at`]).
    pub fn publish_replicated_at(
        &self,
        topic: &str,
        base: u64,
        messages: Vec<(MessageId, i64, Option<Instant>, Bytes)>,
    ) -> Result<Option<DurableWait>, PublishError> {
        self.append_batch(topic, Batch::ReplicatedAt(base, messages), false)
    }

    fn append_batch(
        &self,
        topic: &str,
        batch: Batch,
        synced: bool,
    ) -> Result<Option<DurableWait>, PublishError> {
        let bytes: u64 = match &batch {
            Batch::Fresh(bodies, _) => bodies.iter().map(|b| b.len() as u64).sum(),
            Batch::Replicated(m) | Batch::ReplicatedAt(_, m) => {
                m.iter().map(|(_, _, _, b)| b.len() as u64).sum()
            }
        };
        let mut topics = self.topics.borrow_mut();
        let t = self.get_or_create_topic(&mut topics, topic);
        if t.store().is_none() && t.store_error().is_some() {
            self.create_store(t, false)
                .map_err(|e| PublishError::Disk(e.to_string()))?;
        }
        if let Some(st) = t.store() {
            // A failing disk holds what it could not write in memory until it heals;
            // once that is full, this publish is refused before it is appended, so
            // nothing already acknowledged ever makes room for it.
            st.admit(bytes as usize)
                .map_err(|e| PublishError::Disk(String::from(e)))?;
        }
        let (n, end) = match batch {
            Batch::Fresh(bodies, defer_until) => {
                t.publish(bodies, defer_until, self.opts.mem_queue_size)
            }
            Batch::Replicated(m) => t.append_replicated(m, self.opts.mem_queue_size),
            Batch::ReplicatedAt(base, m) => {
                t.append_replicated_at(base, m, self.opts.mem_queue_size)
            }
        };
        bump(&self.counters.messages_in, n);
        bump(&self.counters.bytes_in, bytes);
        let must_sync =
            synced || self.opts.sync_every <= 1 || t.store().is_some_and(|st| st.error().is_some());
        if t.stored() < t.log.head {
            // Deferred store mode: what exceeds the memory queue goes now (all of it when
            // this publish must be durable); the rest when it is due, unless finished.
            let cutoff = t.store_cutoff();
            if t.store_pump(cutoff, self.opts.mem_queue_size, must_sync) {
                self.mark_unstored(topic);
            }
        }
        let wait = t.store().and_then(|st| {
            let durable = must_sync.then_some(end);
            (durable.is_some() || st.pending_bytes() > STORE_PENDING_HIGH).then(|| DurableWait {
                store: st.clone(),
                durable,
            })
        });
        self.dispatch_topic(t);
        if memory_may_shrink(t) {
            self.timers.trim_pending.borrow_mut().insert(t.name.clone());
        }
        Ok(wait)
    }

    /// The answer to a topic's [`TopicCreatedHook`](super::TopicCreatedHook) query:
    /// creates `channels` (those nsqlookupd knows for the topic) all at once, then starts
    /// the topic's pump, so that every one of them gets what was published meanwhile.
    /// Ignored when the topic is gone or is another one by now (deleted and created
    /// again: another token).
    pub fn release_topic(&self, topic: &str, token: u64, channels: &[String]) {
        let mq = self.opts.mem_queue_size;
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if t.held != Some(token) {
            return;
        }
        for c in channels {
            if t.create_channel_with(c, mq, self.opts.max_attempts) {
                log::info!("TOPIC({topic}): new channel({c})");
                self.notify_lookup(LookupEvent::Register(topic.to_string(), Some(c.clone())));
            }
        }
        t.held = None;
        t.pump(mq);
        self.dispatch_topic(t);
        if memory_may_shrink(t) {
            self.timers.trim_pending.borrow_mut().insert(t.name.clone());
        }
    }
}
