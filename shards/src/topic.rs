//! A topic: an append-only log of records plus its channels (nsqd: topic.go).
//!
//! Each message is appended once; every channel reads the log through its own cursor.
//! `pumped` is nsqd's topic pump position: records below it have been handed to the
//! channels that existed at that moment; records at or above it wait in the topic
//! (no channels yet, or the topic is paused). A new channel starts at `pumped`, which
//! gives the first channel the whole backlog and later channels only new messages.

use crate::channel::Channel;
use crate::message::{IdGenerator, Message, MessageId};
use crate::names::is_ephemeral;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// One published message as the topic holds it.
#[derive(Clone, Debug)]
pub struct Record {
    pub id: MessageId,
    pub timestamp: i64,
    /// DPUB / `/pub?defer=`: not deliverable before this instant.
    pub defer_until: Option<Instant>,
    pub body: Bytes,
}

/// The topic's log: records `[base, head)` in memory.
#[derive(Default)]
pub struct Log {
    records: VecDeque<Record>,
    /// Sequence of `records[0]`.
    pub base: u64,
    /// Sequence the next record gets.
    pub head: u64,
    /// Records below this were pumped to the channels.
    pub pumped: u64,
}

impl Log {
    pub fn get(&self, seq: u64) -> Option<&Record> {
        seq.checked_sub(self.base)
            .and_then(|i| self.records.get(i as usize))
    }

    fn push(&mut self, r: Record) {
        self.records.push_back(r);
        self.head += 1;
    }

    /// Drops records every channel has read (and the pump has passed).
    fn trim_to(&mut self, seq: u64) {
        while self.base < seq && !self.records.is_empty() {
            self.records.pop_front();
            self.base += 1;
        }
    }
}

/// Why a publish was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    Exiting,
}

pub struct Topic {
    pub name: String,
    pub ephemeral: bool,
    pub paused: bool,
    pub log: Log,
    /// Sorted by name, as /stats lists them.
    pub channels: BTreeMap<String, Channel>,
    pub message_count: u64,
    pub message_bytes: u64,
    ids: IdGenerator,
}

impl Topic {
    pub fn new(name: &str, node_id: u16) -> Topic {
        Topic {
            name: name.to_string(),
            ephemeral: is_ephemeral(name),
            paused: false,
            log: Log::default(),
            channels: BTreeMap::new(),
            message_count: 0,
            message_bytes: 0,
            ids: IdGenerator::new(node_id),
        }
    }

    /// Messages waiting in the topic itself (not yet pumped to channels).
    pub fn depth(&self) -> u64 {
        self.log.head - self.log.pumped
    }

    /// Appends messages (nsqd PutMessages). With `defer_until` set and channels present
    /// on an unpaused topic, each channel gets the message straight into its deferred
    /// heap, as nsqd's pump does. An #ephemeral topic with no reader drops what exceeds
    /// `mem_queue_size`. Returns the number of messages accepted.
    pub fn publish(
        &mut self,
        bodies: impl IntoIterator<Item = Bytes>,
        defer_until: Option<Instant>,
        mem_queue_size: u64,
    ) -> u64 {
        let timestamp = crate::message::now_unix_nanos();
        let direct_defer = defer_until.is_some() && !self.paused && !self.channels.is_empty();
        let mut n = 0;
        for body in bodies {
            n += 1;
            self.message_count += 1;
            self.message_bytes += body.len() as u64;
            let id = self.ids.next_id();
            if direct_defer {
                let due = defer_until.unwrap_or_else(Instant::now);
                for ch in self.channels.values_mut() {
                    ch.message_count += 1;
                    ch.defer(
                        Message {
                            id,
                            timestamp,
                            attempts: 0,
                            body: body.clone(),
                        },
                        due,
                    );
                }
                continue;
            }
            if self.ephemeral && self.channels.is_empty() && self.depth() >= mem_queue_size {
                continue;
            }
            self.log.push(Record {
                id,
                timestamp,
                defer_until,
                body,
            });
        }
        self.pump(mem_queue_size);
        n
    }

    /// Moves the pump position to the head when the topic has channels and is not
    /// paused, counting the messages into each channel.
    pub fn pump(&mut self, mem_queue_size: u64) {
        if self.paused || self.channels.is_empty() {
            return;
        }
        let n = self.log.head - self.log.pumped;
        if n == 0 {
            return;
        }
        self.log.pumped = self.log.head;
        for ch in self.channels.values_mut() {
            ch.message_count += n;
            if ch.ephemeral {
                ch.drop_overflow(&self.log, mem_queue_size);
            }
        }
        self.trim();
    }

    /// Frees records no channel will read again.
    pub fn trim(&mut self) {
        let mut low = self.log.pumped;
        for ch in self.channels.values() {
            low = low.min(ch.cursor);
        }
        self.log.trim_to(low);
    }

    /// Adds a channel (no-op if present). It starts reading at the pump position.
    pub fn create_channel(&mut self, name: &str, mem_queue_size: u64) -> bool {
        if self.channels.contains_key(name) {
            return false;
        }
        let ch = Channel::new(name, self.log.pumped);
        self.channels.insert(name.to_string(), ch);
        self.pump(mem_queue_size);
        true
    }

    /// nsqd topic Empty: drops what waits in the topic (not yet pumped); channels keep
    /// what they already received.
    pub fn empty(&mut self) {
        let keep = (self.log.pumped - self.log.base) as usize;
        self.log.records.truncate(keep);
        self.log.head = self.log.pumped;
    }

    /// Deliverable message for `ch` at its cursor (helper for dispatch).
    pub fn record_at(&self, seq: u64) -> Option<&Record> {
        self.log.get(seq)
    }
}
