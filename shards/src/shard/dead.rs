//! Dead letters of this shard's channels (beyond nsqd; see `crate::channel`'s `dead`
//! module): handed to the root crate's publisher, which publishes each batch to its
//! dead-letter topic through the topic's owner and reports back, and only then finished.

use super::Shard;
use crate::message::{Message, MessageId};

/// Dead letters of one channel, to be published to `dead_topic`.
#[derive(Debug)]
pub struct DeadLetters {
    pub topic: String,
    pub channel: String,
    /// `<topic>.dead` ([`crate::channel::dead_letter_topic`]).
    pub dead_topic: String,
    /// In the order they died; bodies unchanged.
    pub messages: Vec<Message>,
}

impl Shard {
    /// Takes the dead letters waiting in this shard's channels (they stay unfinished
    /// until [`Shard::dead_lettered`]). Visits every channel: the publisher calls it only
    /// after `crate::channel::dead_letters_waiting` completed.
    pub fn take_dead_letters(&self) -> Vec<DeadLetters> {
        let mut out = Vec::new();
        for (tn, t) in self.topics.borrow_mut().iter_mut() {
            let Some(dead_topic) = crate::channel::dead_letter_topic(tn) else {
                continue;
            };
            for (cn, ch) in t.channels.iter_mut() {
                if ch.has_dead_letters() {
                    out.push(DeadLetters {
                        topic: tn.clone(),
                        channel: cn.clone(),
                        dead_topic: dead_topic.clone(),
                        messages: ch.take_dead_letters(),
                    });
                }
            }
        }
        out
    }

    /// The dead-letter topic has the messages `ids` of `topic`/`channel`: they are
    /// finished there (a channel or topic deleted meanwhile is skipped).
    pub fn dead_lettered(&self, topic: &str, channel: &str, ids: &[MessageId]) {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if let Some(ch) = t.channels.get_mut(channel) {
            for &id in ids {
                ch.dead_lettered(id);
            }
        }
        self.mark(t);
        t.trim(self.opts.mem_queue_size);
    }

    /// Publishing the messages `ids` of `topic`/`channel` to the dead-letter topic
    /// failed: they wait to be taken again.
    pub fn dead_letter_failed(&self, topic: &str, channel: &str, ids: &[MessageId]) {
        let mut topics = self.topics.borrow_mut();
        if let Some(ch) = topics
            .get_mut(topic)
            .and_then(|t| t.channels.get_mut(channel))
        {
            for &id in ids {
                ch.dead_letter_failed(id);
            }
        }
    }
}
