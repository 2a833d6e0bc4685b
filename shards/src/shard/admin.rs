//! Admin operations on topics this shard owns (nsqd's http.go handlers: create, delete,
//! empty, pause), the metadata wait their answers may need, and `/channel/seek`.

use super::{bump, LookupEvent, Shard};
use crate::mesh::{AdminError, AdminOp, SeekTo};
use std::rc::Rc;
use std::time::Instant;

/// What a drain still waits for on one shard ([`Shard::drain_left`]), in messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainLeft {
    /// Messages of topics that have channels: the topic's depth (not yet given to its
    /// channels, e.g. while the topic is paused) plus each channel's depth, in-flight and
    /// deferred counts. The drain ends when this is 0 on every shard.
    pub messages: u64,
    /// Messages of topics without any channel: not waited for (nothing can consume
    /// them while draining); they stay in the data path for the next start.
    pub without_channels: u64,
}

impl Shard {
    /// While the node drains, creating a topic (`channel` `None`) or a channel that does
    /// not exist yet is refused with [`AdminError::Draining`] (nsqd RFC nsqio/nsq#1302);
    /// an existing one is fine. Always `Ok` when the node does not drain.
    pub fn drain_allows_creating(
        &self,
        topic: &str,
        channel: Option<&str>,
    ) -> Result<(), AdminError> {
        if !self.node.draining() {
            return Ok(());
        }
        let topics = self.topics.borrow();
        let exists = topics
            .get(topic)
            .is_some_and(|t| channel.is_none_or(|c| t.channels.contains_key(c)));
        if exists {
            Ok(())
        } else {
            Err(AdminError::Draining)
        }
    }

    /// What a drain still waits for on this shard (docs/draining.md).
    pub fn drain_left(&self) -> DrainLeft {
        let mut left = DrainLeft::default();
        for t in self.topics.borrow().values() {
            if t.channels.is_empty() {
                // Nobody can consume these: no channel may be created while draining.
                // They stay in the data path, as on any clean shutdown.
                left.without_channels += t.depth();
                continue;
            }
            left.messages += t.depth();
            for ch in t.channels.values() {
                left.messages +=
                    ch.depth(&t.log) + ch.in_flight_count() as u64 + ch.deferred_count() as u64;
            }
        }
        left
    }

    /// The drain's check of `op` ([`Shard::drain_allows_creating`] for the creations).
    pub fn drain_allows(&self, op: &AdminOp) -> Result<(), AdminError> {
        match op {
            AdminOp::CreateTopic(t) => self.drain_allows_creating(t, None),
            AdminOp::CreateChannel(t, c) => self.drain_allows_creating(t, Some(c)),
            _ => Ok(()),
        }
    }

    /// Runs an admin operation on a topic this shard owns (nsqd: http.go handlers).
    pub fn admin(&self, op: AdminOp) -> Result<(), AdminError> {
        self.drain_allows(&op)?;
        self.mark_changed(op.topic());
        let mut topics = self.topics.borrow_mut();
        let mq = self.opts.mem_queue_size;
        match op {
            AdminOp::CreateTopic(t) => {
                self.get_or_create_topic(&mut topics, &t);
            }
            AdminOp::DeleteTopic(t) => {
                let mut topic = topics.remove(&t).ok_or(AdminError::TopicNotFound)?;
                for ch in topic.channels.values_mut() {
                    ch.close_clients();
                }
                self.topic_deleted(&topic);
                log::info!("TOPIC({t}): deleting");
            }
            AdminOp::EmptyTopic(t) => {
                topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?.empty();
            }
            AdminOp::PauseTopic(t, paused) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                topic.paused = paused;
                self.request_checkpoint();
                if !paused {
                    topic.pump(mq);
                    self.dispatch_topic(topic);
                }
            }
            AdminOp::CreateChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                if topic.create_channel_with(&c, mq, self.opts.max_attempts) {
                    log::info!("TOPIC({t}): new channel({c})");
                    self.notify_lookup(LookupEvent::Register(t.clone(), Some(c.clone())));
                }
            }
            AdminOp::DeleteChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let mut ch = topic
                    .channels
                    .remove(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.close_clients();
                crate::memory_freed(ch.disk_buffered_bytes());
                topic.trim(self.opts.mem_queue_size);
                log::info!("TOPIC({t}): deleting channel {c}");
                self.notify_lookup(LookupEvent::Unregister(t.clone(), Some(c.clone())));
                if topic.ephemeral && topic.channels.is_empty() {
                    if let Some(gone) = topics.remove(&t) {
                        self.topic_deleted(&gone);
                    }
                }
            }
            AdminOp::EmptyChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.empty(&topic.log);
                topic.trim(self.opts.mem_queue_size);
            }
            AdminOp::ChannelMaxAttempts(t, c, max) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.set_own_max_attempts(max);
                log::info!("TOPIC({t}) CHANNEL({c}): max attempts {max:?}");
                self.request_checkpoint();
            }
            AdminOp::ChannelRateLimit(t, c, per_sec) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.set_rate_limit(per_sec);
                log::info!("TOPIC({t}) CHANNEL({c}): rate limit {per_sec} msgs/s");
                self.request_checkpoint();
                let out = ch.dispatch(&topic.log, Instant::now());
                bump(&self.counters.messages_out, out);
                self.schedule_timer(&t, ch);
            }
            // It may need the disk: callers go through `admin_async`.
            AdminOp::SeekChannel(..) => return Err(AdminError::Internal),
            AdminOp::PauseChannel(t, c, paused) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.set_paused(paused);
                self.request_checkpoint();
                if !paused {
                    let out = ch.dispatch(&topic.log, Instant::now());
                    bump(&self.counters.messages_out, out);
                    self.schedule_timer(&t, ch);
                }
            }
        }
        Ok(())
    }

    /// Runs an admin operation on a topic this shard owns, waiting for the disk when it
    /// must (`SeekChannel`); the others complete at once as with [`Shard::admin`].
    pub async fn admin_async(&self, op: AdminOp) -> Result<(), AdminError> {
        match op {
            // Boxed: its disk search's state (1.2 KB) would otherwise sit in every
            // future that awaits an admin operation (every connection's task).
            AdminOp::SeekChannel(t, c, to) => {
                Box::pin(self.seek_channel(&t, &c, to)).await.map(|_| ())
            }
            op => {
                if self.admin_creates_store(&op) {
                    self.prepare_store(op.topic()).await;
                }
                let persist = self.admin_persists(&op);
                self.admin(op)?;
                if persist {
                    Box::pin(self.persist_changes()).await;
                }
                Ok(())
            }
        }
    }

    /// True when `op`'s answer waits for the metadata on disk ([`Shard::persist_changes`]):
    /// a channel created, deleted, paused or given its maximum attempts or rate limit, or a topic
    /// paused, on a durable topic (nsqd
    /// persists metadata on pause before answering; here also on create and delete,
    /// which nsqd writes soon after), so that a crash after the answer never brings a
    /// deleted channel back or loses an acknowledged message to a new one.
    pub fn admin_persists(&self, op: &AdminOp) -> bool {
        matches!(
            op,
            AdminOp::CreateChannel(..)
                | AdminOp::DeleteChannel(..)
                | AdminOp::PauseChannel(..)
                | AdminOp::PauseTopic(..)
                | AdminOp::ChannelMaxAttempts(..)
                | AdminOp::ChannelRateLimit(..)
        ) && self
            .topics
            .borrow()
            .get(op.topic())
            .is_some_and(|t| t.store().is_some())
    }

    /// `POST /channel/seek` (beyond nsqd) on a topic this shard owns: moves the channel's
    /// cursor to the oldest retained message (`Oldest`), past the newest one the channel
    /// was given (`Newest`: the topic's pump position), or to the first retained message
    /// published at or after a time (`Timestamp`, Unix ns; past the newest when none
    /// is that recent). The in-memory tail is searched first, then the store
    /// ([`nsq_storage::TopicStore::seek_timestamp`]); the result is kept within
    /// [oldest retained, pump position]. What happens to the channel's messages is
    /// [`crate::channel::Channel::seek`]'s rule. The new cursor is persisted by the next
    /// checkpoint like any cursor. Returns the new cursor; errors: `TopicNotFound`,
    /// `ChannelNotFound` (also when either was deleted during the disk search),
    /// `Internal` when the disk read failed (logged).
    pub async fn seek_channel(
        &self,
        topic: &str,
        channel: &str,
        to: SeekTo,
    ) -> Result<u64, AdminError> {
        // Records below the memory tail are on disk only: those the writer has not
        // flushed yet (it buffers until the next sync) are made readable first, for the
        // search and for the channel's reads.
        let unflushed = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(AdminError::TopicNotFound)?;
            if !t.channels.contains_key(channel) {
                return Err(AdminError::ChannelNotFound);
            }
            // (Only what was handed to the store: records finished before they were
            // due to be written never are, without retention.)
            t.store().and_then(|st| {
                let upto = t.log.base.min(st.next_seq());
                (to != SeekTo::Newest && st.readable_seq() < upto).then(|| (st.clone(), upto))
            })
        };
        if let Some((st, upto)) = unflushed {
            if let Err(e) = st.wait_durable(upto).await {
                log::error!("TOPIC({topic}) CHANNEL({channel}): seek failed - {e}");
                return Err(AdminError::Internal);
            }
        }
        enum Plan {
            At(u64),
            /// Search the store for `ts`; `first` is the oldest in-memory match.
            Disk {
                store: Rc<nsq_storage::TopicStore>,
                ts: i64,
                first: u64,
            },
        }
        let plan = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(AdminError::TopicNotFound)?;
            if !t.channels.contains_key(channel) {
                return Err(AdminError::ChannelNotFound);
            }
            match to {
                SeekTo::Oldest => Plan::At(t.oldest_retained()),
                SeekTo::Newest => Plan::At(t.log.pumped),
                SeekTo::Timestamp(ts) => match (t.seek_in_memory(ts), t.store()) {
                    (Ok(seq), _) => Plan::At(seq),
                    (Err(first), None) => Plan::At(first),
                    (Err(first), Some(st)) => Plan::Disk {
                        store: st.clone(),
                        ts,
                        first,
                    },
                },
            }
        };
        let target = match plan {
            Plan::At(seq) => seq,
            Plan::Disk { store, ts, first } => match store.seek_timestamp(ts).await {
                Ok(found) => found.map_or(first, |s| s.min(first)),
                Err(e) => {
                    log::error!("TOPIC({topic}) CHANNEL({channel}): seek failed - {e}");
                    return Err(AdminError::Internal);
                }
            },
        };
        let mut topics = self.topics.borrow_mut();
        let t = topics.get_mut(topic).ok_or(AdminError::TopicNotFound)?;
        let target = target.max(t.oldest_retained()).min(t.log.pumped);
        let ch = t
            .channels
            .get_mut(channel)
            .ok_or(AdminError::ChannelNotFound)?;
        let from = ch.cursor();
        ch.seek(target);
        log::info!("TOPIC({topic}) CHANNEL({channel}): seek {to:?}: cursor {from} -> {target}");
        let out = ch.dispatch(&t.log, Instant::now());
        self.schedule_timer(topic, ch);
        bump(&self.counters.messages_out, out);
        self.mark(t);
        t.trim(self.opts.mem_queue_size);
        self.schedule_disk_reads(t);
        Ok(target)
    }
}
