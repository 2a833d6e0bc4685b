//! `GET /message` and `GET /messages` on the topic's owner (beyond nsqd): find a message
//! by ID and tell its state on every channel, and list what a channel would deliver
//! next, without changing anything. Records not in memory are read from the topic's
//! store with its asynchronous reads, never holding the topic across a read.

use super::Shard;
use crate::channel::{MessageState, Peeked};
use crate::message::{Message, MessageId};
use crate::topic::Record;
use bytes::Bytes;
use std::rc::Rc;

/// The most messages one `GET /messages` returns (a larger `count` is cut to this).
pub const MAX_PEEK: usize = 1000;

/// Why a lookup found nothing (HTTP: 404 `TOPIC_NOT_FOUND`, `CHANNEL_NOT_FOUND`,
/// `MESSAGE_NOT_FOUND`; 500 `INTERNAL_ERROR` for a failed read, logged on the owner).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InspectError {
    TopicNotFound,
    ChannelNotFound,
    MessageNotFound,
    /// A read from the store failed (the message is logged).
    Disk,
    /// The owner shard is shutting down (HTTP 503 `EXITING`).
    Exiting,
}

/// A message found by ID: the record and its state on each channel (by channel name).
#[derive(Clone, Debug)]
pub struct MessageView {
    pub id: MessageId,
    /// Publish time, Unix ns (as in the message frame).
    pub timestamp: i64,
    pub body: Bytes,
    /// Per channel, sorted by name: (name, state, deliveries so far).
    pub channels: Vec<(String, MessageState, u16)>,
}

/// What a `/message` or `/messages` request asks the topic's owner.
#[derive(Clone, Debug)]
pub enum InspectRequest {
    Message {
        topic: String,
        id: MessageId,
    },
    Peek {
        topic: String,
        channel: String,
        /// At most [`MAX_PEEK`].
        count: usize,
        /// Leave out messages published before this (Unix ns).
        from_ns: Option<i64>,
    },
}

/// The owner's answer.
#[derive(Clone, Debug)]
pub enum InspectAnswer {
    Message(MessageView),
    /// Messages in delivery order, with their attempts so far.
    Peek(Vec<Message>),
}

impl Shard {
    /// Answers `req` for a topic this shard owns.
    pub async fn inspect(&self, req: InspectRequest) -> Result<InspectAnswer, InspectError> {
        match req {
            InspectRequest::Message { topic, id } => self
                .find_message(&topic, id)
                .await
                .map(InspectAnswer::Message),
            InspectRequest::Peek {
                topic,
                channel,
                count,
                from_ns,
            } => self
                .peek_messages(&topic, &channel, count.min(MAX_PEEK), from_ns)
                .await
                .map(InspectAnswer::Peek),
        }
    }

    /// The message `id` of `topic`: from memory or a channel's copy (in flight or
    /// requeued) at once, else from the store (its records not yet written first) ([`nsq_storage::TopicStore::find_id`], O(log n) reads).
    pub async fn find_message(
        &self,
        topic: &str,
        id: MessageId,
    ) -> Result<MessageView, InspectError> {
        let store = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(InspectError::TopicNotFound)?;
            let held = t.log.find_id(id).cloned().or_else(|| {
                t.channels
                    .values()
                    .find_map(|ch| ch.held_message(id).map(record_of))
            });
            if let Some(r) = held {
                return Ok(view(t, &r));
            }
            t.store().cloned()
        };
        let Some(store) = store else {
            return Err(InspectError::MessageNotFound);
        };
        let found = store.find_id(id.0).await.map_err(|e| {
            log::error!("TOPIC({topic}): finding message {id:?}: {e}");
            InspectError::Disk
        })?;
        let rec = found.ok_or(InspectError::MessageNotFound)?;
        let topics = self.topics.borrow();
        let t = topics.get(topic).ok_or(InspectError::TopicNotFound)?;
        Ok(view(t, &Record::from_stored(rec)))
    }

    /// Up to `count` messages channel `channel` of `topic` would deliver next (see
    /// [`crate::channel::Channel::peek`]), those published before `from_ns` left out, and
    /// none after the one whose body takes the answer to [`PEEK_MAX_BYTES`].
    /// Changes nothing.
    pub async fn peek_messages(
        &self,
        topic: &str,
        channel: &str,
        count: usize,
        from_ns: Option<i64>,
    ) -> Result<Vec<Message>, InspectError> {
        let disk_err = |e: nsq_storage::StoreError| {
            log::error!("TOPIC({topic}): peeking at channel {channel}: {e}");
            InspectError::Disk
        };
        // Where the cursor's part starts: the first record published at or after
        // `from_ns`, in memory or, when memory holds only newer ones, on disk.
        let mut from_seq = 0;
        if let Some(ts) = from_ns {
            let (in_memory, store) = {
                let topics = self.topics.borrow();
                let t = topics.get(topic).ok_or(InspectError::TopicNotFound)?;
                (t.seek_in_memory(ts), t.store().cloned())
            };
            from_seq = match (in_memory, store) {
                (Ok(seq), _) | (Err(seq), None) => seq,
                (Err(first), Some(st)) => st
                    .seek_timestamp(ts)
                    .await
                    .map_err(disk_err)?
                    .unwrap_or(first)
                    .min(first),
            };
        }
        let (plan, store) = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(InspectError::TopicNotFound)?;
            let ch = t
                .channels
                .get(channel)
                .ok_or(InspectError::ChannelNotFound)?;
            (ch.peek(&t.log, count, from_seq), t.store().cloned())
        };
        let mut out = Vec::with_capacity(plan.len());
        let mut bytes = 0usize;
        let mut read = std::collections::HashMap::new();
        let mut i = 0;
        while i < plan.len() && bytes < PEEK_MAX_BYTES {
            // What memory no longer holds is read as it is reached, PEEK_READ_AT_ONCE
            // records at a time, so a byte-capped answer reads little more than it shows.
            if plan[i].msg.is_none() && !read.contains_key(&plan[i].seq) {
                if let Some(st) = &store {
                    let next: Vec<u64> = plan[i..]
                        .iter()
                        .filter(|p| p.msg.is_none())
                        .take(PEEK_READ_AT_ONCE)
                        .map(|p| p.seq)
                        .collect();
                    read = read_seqs(st, next).await.map_err(disk_err)?;
                }
            }
            let Peeked { seq, attempts, msg } = plan[i].clone();
            i += 1;
            let msg = msg.or_else(|| {
                read.get(&seq).map(|r| Message {
                    attempts,
                    ..r.message()
                })
            });
            // A record gone meanwhile (retention, a corrupt record skipped) is left out.
            let Some(m) = msg else { continue };
            if from_ns.is_some_and(|ts| m.timestamp < ts) {
                continue;
            }
            bytes += m.body.len();
            out.push(m);
        }
        Ok(out)
    }
}

/// The most message body bytes one `/messages` answer carries: it stops after the message
/// that reaches this (so it always has at least one), whatever `count` asked for.
pub const PEEK_MAX_BYTES: usize = 16 << 20;

/// Records one step of `/messages` reads from the store.
const PEEK_READ_AT_ONCE: usize = 64;

/// The records at `seqs` (ascending) read from `store`, by sequence; those it does not
/// have are absent. One read per run of nearby sequences, each at most 512 records.
async fn read_seqs(
    store: &Rc<nsq_storage::TopicStore>,
    mut seqs: Vec<u64>,
) -> Result<std::collections::HashMap<u64, Record>, nsq_storage::StoreError> {
    seqs.sort_unstable();
    let mut out = std::collections::HashMap::new();
    let mut i = 0;
    while i < seqs.len() {
        let from = seqs[i];
        let want = (seqs.len() - i).min(512);
        let recs = store.read(from, want).await?;
        let last = recs.last().map_or(from, |r| r.seq);
        for r in recs {
            if seqs[i..].binary_search(&r.seq).is_ok() {
                out.insert(r.seq, Record::from_stored(r));
            }
        }
        // Past everything that read covered (a sequence it did not return is gone).
        while i < seqs.len() && seqs[i] <= last {
            i += 1;
        }
    }
    Ok(out)
}

/// A record standing for an in-flight copy of a message.
fn record_of(m: &Message) -> Record {
    Record {
        seq: m.seq,
        id: m.id,
        timestamp: m.timestamp,
        defer_until: None,
        body: m.body.clone(),
    }
}

/// The view of record `r` of topic `t`: its state on every channel.
fn view(t: &crate::topic::Topic, r: &Record) -> MessageView {
    let mut channels: Vec<(String, MessageState, u16)> = t
        .channels
        .values()
        .map(|ch| {
            let (state, attempts) = ch.message_state(&t.log, r.seq, r.id);
            (ch.name().to_string(), state, attempts)
        })
        .collect();
    channels.sort_by(|a, b| a.0.cmp(&b.0));
    MessageView {
        id: r.id,
        timestamp: r.timestamp,
        body: r.body.clone(),
        channels,
    }
}
