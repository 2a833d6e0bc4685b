//! Connections on this shard: client ids and registration, SUB (joining a channel),
//! RDY changes, a connection's end (and #ephemeral channels and topics left without
//! clients), and closing every connection at shutdown.

use super::{LookupEvent, Shard};
use crate::client::{Client, ClientState};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};

/// Why a SUB could not join its channel. `Display` gives nsqd's text, which the
/// connection sends as `E_SUB_FAILED SUB failed <text>` (nsqd: protocol_v2.go SUB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubError {
    /// The broker is shutting down: `exiting`.
    Exiting,
    /// The channel has `--max-channel-consumers` clients already:
    /// `consumers for <topic>:<channel> exceeds limit of <max>`.
    TooManyConsumers {
        topic: String,
        channel: String,
        max: usize,
    },
    /// The node drains and the topic or the channel does not exist (nsqd RFC
    /// nsqio/nsq#1302: a drain refuses new topics and channels). `Display` is the whole
    /// error frame: `E_NSQD_DRAINING SUB create channel <topic>:<channel> failed. nsqd
    /// is draining` (the draining prototype's text, nsqio/nsq#1305).
    Draining { topic: String, channel: String },
}

impl std::fmt::Display for SubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubError::Exiting => f.write_str("exiting"),
            SubError::TooManyConsumers {
                topic,
                channel,
                max,
            } => write!(
                f,
                "consumers for {topic}:{channel} {}",
                crate::channel::ConsumerLimit { max: *max }
            ),
            SubError::Draining { topic, channel } => write!(
                f,
                "E_NSQD_DRAINING SUB create channel {topic}:{channel} failed. nsqd is draining"
            ),
        }
    }
}

impl std::error::Error for SubError {}

/// Every connection on this shard (for producers in /stats and for shutdown), and the
/// next client id.
pub(super) struct ClientRegistry {
    pub(super) map: RefCell<HashMap<u64, Weak<Client>>>,
    next_id: Cell<u64>,
}

impl Default for ClientRegistry {
    fn default() -> ClientRegistry {
        ClientRegistry {
            map: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
        }
    }
}

impl Shard {
    /// A process-unique client id (shard index in the top bits).
    pub fn new_client_id(&self) -> u64 {
        let n = self.clients.next_id.get();
        self.clients.next_id.set(n + 1);
        ((self.index() as u64) << 48) | n
    }

    /// True while some connection on this shard is open.
    pub fn has_clients(&self) -> bool {
        !self.clients.map.borrow().is_empty()
    }

    pub fn register_client(&self, c: &Rc<Client>) {
        self.clients.map.borrow_mut().insert(c.id, Rc::downgrade(c));
    }

    /// A connection on this shard ended (or moved away): it leaves its channel, and an
    /// #ephemeral channel left without clients is deleted, then an #ephemeral topic left
    /// without channels (nsqd: channel.RemoveClient, topic.DeleteExistingChannel).
    pub fn client_gone(&self, c: &Client) {
        self.clients.map.borrow_mut().remove(&c.id);
        let sub = c.subscription.borrow().clone();
        let Some((t, ch)) = sub else { return };
        let mut topics = self.topics.borrow_mut();
        let Some(topic) = topics.get_mut(&t) else {
            return;
        };
        self.mark(topic);
        let mut delete_channel = false;
        if let Some(channel) = topic.channels.get_mut(&ch) {
            channel.remove_client(c.id);
            delete_channel = channel.is_ephemeral() && channel.clients().is_empty();
        }
        if delete_channel {
            topic.channels.remove(&ch);
            topic.trim(self.opts.mem_queue_size);
            log::info!("TOPIC({t}): deleting channel {ch}");
            self.notify_lookup(LookupEvent::Unregister(t.clone(), Some(ch.clone())));
            if topic.ephemeral && topic.channels.is_empty() {
                if let Some(gone) = topics.remove(&t) {
                    self.topic_deleted(&gone);
                }
                log::info!("TOPIC({t}): deleting");
            }
        }
    }

    /// SUB on this shard: creates topic and channel, adds the client (nsqd: SUB).
    ///
    /// Returns true when it created a durable channel: the SUB is answered once
    /// [`Shard::persist_changes`] has the channel in the metadata on disk, so that a
    /// message acknowledged after the answer is never lost to the channel by a crash.
    pub fn subscribe(&self, c: &Rc<Client>, topic: &str, channel: &str) -> Result<bool, SubError> {
        if self.shutdown.is_set() {
            return Err(SubError::Exiting);
        }
        let mut topics = self.topics.borrow_mut();
        if self.node.draining()
            && !topics
                .get(topic)
                .is_some_and(|t| t.channels.contains_key(channel))
        {
            return Err(SubError::Draining {
                topic: topic.to_string(),
                channel: channel.to_string(),
            });
        }
        let t = self.get_or_create_topic(&mut topics, topic);
        let mut created = false;
        if t.create_channel_with(channel, self.opts.mem_queue_size, self.opts.max_attempts) {
            log::info!("TOPIC({topic}): new channel({channel})");
            self.notify_lookup(LookupEvent::Register(
                topic.to_string(),
                Some(channel.to_string()),
            ));
            created = t.store().is_some() && !crate::names::is_ephemeral(channel);
        }
        let ch = t.channels.get_mut(channel).expect("created above");
        ch.add_client(c.clone(), self.opts.max_channel_consumers)
            .map_err(|e| SubError::TooManyConsumers {
                topic: topic.to_string(),
                channel: channel.to_string(),
                max: e.max,
            })?;
        *c.subscription.borrow_mut() = Some((topic.to_string(), channel.to_string()));
        c.state.set(ClientState::Subscribed);
        Ok(created)
    }

    /// RDY changed (or the client otherwise may take more): deliver.
    pub fn client_ready_changed(&self, c: &Client) {
        let sub = c.subscription.borrow();
        if let Some((t, ch)) = sub.as_ref() {
            self.dispatch_channel(t, ch);
        }
    }

    /// Closes every connection (graceful shutdown).
    pub fn close_all_clients(&self) {
        let list: Vec<Rc<Client>> = self
            .clients
            .map
            .borrow()
            .values()
            .filter_map(|w| w.upgrade())
            .collect();
        for c in list {
            c.kill();
        }
    }
}
