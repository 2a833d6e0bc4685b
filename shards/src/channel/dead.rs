//! Dead letters (beyond nsqd): a message whose next delivery would exceed the channel's
//! maximum attempts is not delivered again. The channel holds it, unfinished, until the
//! root crate has published its body to the dead-letter topic `<topic>.dead`
//! ([`dead_letter_topic`]), and only then finishes it ([`Channel::dead_lettered`]), so a
//! crash in between delivers it to the dead-letter topic again rather than losing it.
//!
//! "Attempts" is the `attempts` field of nsqd's message frame: deliveries so far on this
//! channel. With a maximum of N, a message delivered N times that times out or is
//! REQ'd (with or without a delay) is dead-lettered at that moment; one that comes back
//! ready with N attempts by another way (recovered after a restart, or the maximum
//! lowered) is dead-lettered when it would next be delivered.

use super::{Channel, IdMap};
use crate::message::{Message, MessageId};
use nsq_storage::journal::EventKind;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// The dead-letter topic of `topic`: `<topic>.dead`, or `None` where a topic cannot have
/// one (its messages are then redelivered without limit, as by nsqd): an `#ephemeral`
/// topic (`<topic>#ephemeral.dead` is not a topic name), a dead-letter topic itself
/// (a name ending in `.dead`, so dead letters never cascade), or a name whose `.dead`
/// would pass nsqd's 64 characters.
pub fn dead_letter_topic(topic: &str) -> Option<String> {
    if crate::names::is_ephemeral(topic) || topic.ends_with(".dead") {
        return None;
    }
    let dead = format!("{topic}.dead");
    crate::names::is_valid_topic_name(&dead).then_some(dead)
}

/// A channel's dead-letter state: its maximum attempts and the messages on their way to
/// the dead-letter topic.
#[derive(Default)]
pub(super) struct DeadLetters {
    /// `--max-attempts` for this channel's topic: 0 (unlimited) where the topic has no
    /// dead-letter topic.
    flag: u16,
    /// `POST /channel/max-attempts`: this channel's own maximum (0 = unlimited).
    own: Option<u16>,
    /// Dead letters not yet handed to the publisher, in the order they died.
    waiting: VecDeque<Message>,
    /// Dead letters handed to the publisher ([`Channel::take_dead_letters`]), until it
    /// reports the publish.
    sending: IdMap<Message>,
    /// Messages dead-lettered (stats `dead_count`).
    count: u64,
}

impl DeadLetters {
    /// Messages held for the dead-letter topic.
    pub(super) fn len(&self) -> usize {
        self.waiting.len() + self.sending.len()
    }

    /// Every message held for the dead-letter topic.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Message> {
        self.waiting.iter().chain(self.sending.values())
    }

    pub(super) fn clear(&mut self) {
        self.waiting.clear();
        self.sending.clear();
    }
}

impl Channel {
    /// Sets `--max-attempts` for this channel: `flag` (0 = unlimited) where its topic has
    /// a dead-letter topic ([`dead_letter_topic`] of `topic`), else 0.
    pub fn set_max_attempts_flag(&mut self, topic: &str, flag: u16) {
        self.limits.dead.flag = if dead_letter_topic(topic).is_some() {
            flag
        } else {
            0
        };
    }

    /// This channel's own maximum attempts (`POST /channel/max-attempts`; 0 = unlimited),
    /// `None` when it follows `--max-attempts`.
    pub fn own_max_attempts(&self) -> Option<u16> {
        self.limits.dead.own
    }

    /// Sets (`Some`) or removes (`None`) this channel's own maximum attempts. A lower
    /// maximum applies to messages already waiting when they would next be delivered.
    pub fn set_own_max_attempts(&mut self, max: Option<u16>) {
        self.limits.dead.own = max;
    }

    /// The maximum attempts in force: the channel's own, else `--max-attempts`; 0 means
    /// unlimited (also on a topic without a dead-letter topic, where `POST
    /// /channel/max-attempts` is refused).
    pub fn max_attempts(&self) -> u16 {
        self.limits.dead.own.unwrap_or(self.limits.dead.flag)
    }

    /// Messages dead-lettered on this channel (stats `dead_count`).
    pub fn dead_count(&self) -> u64 {
        self.limits.dead.count
    }

    /// Messages held, unfinished, until they are on the dead-letter topic.
    pub fn dead_waiting_count(&self) -> usize {
        self.limits.dead.len()
    }

    /// True when a message that was delivered `attempts` times must not be delivered
    /// again.
    pub(super) fn is_dead(&self, attempts: u16) -> bool {
        let max = self.max_attempts();
        max > 0 && attempts >= max
    }

    /// Holds `msg` for the dead-letter topic and wakes the shard's dead-letter publisher.
    pub(super) fn bury(&mut self, msg: Message) {
        log::debug!(
            "CHANNEL({}): message {} reached {} attempts: dead-lettered",
            self.name,
            std::str::from_utf8(&msg.id.to_hex()).unwrap_or("?"),
            msg.attempts
        );
        self.limits.dead.waiting.push_back(msg);
        DEAD_WAKE.with(|w| w.notify());
    }

    /// Hands the dead letters waiting here to the publisher; they stay unfinished until
    /// [`Channel::dead_lettered`] (or go back to waiting by
    /// [`Channel::dead_letter_failed`]).
    pub fn take_dead_letters(&mut self) -> Vec<Message> {
        let out: Vec<Message> = self.limits.dead.waiting.drain(..).collect();
        for m in &out {
            self.limits.dead.sending.insert(m.id, m.clone());
        }
        out
    }

    /// The dead letter `id` is on the dead-letter topic: it is finished here (journaled,
    /// so a crash does not bring it back). Returns false when the channel no longer
    /// holds it (emptied or sought meanwhile).
    pub fn dead_lettered(&mut self, id: MessageId) -> bool {
        let Some(msg) = self.limits.dead.sending.remove(&id) else {
            return false;
        };
        self.record(msg.seq, super::Change::Finished);
        self.journal(EventKind::Finished, &msg, 0);
        self.limits.dead.count += 1;
        true
    }

    /// Publishing the dead letter `id` failed: it waits to be taken again.
    pub fn dead_letter_failed(&mut self, id: MessageId) {
        if let Some(msg) = self.limits.dead.sending.remove(&id) {
            self.limits.dead.waiting.push_back(msg);
        }
    }

    /// True when dead letters wait to be taken.
    pub fn has_dead_letters(&self) -> bool {
        !self.limits.dead.waiting.is_empty()
    }
}

thread_local! {
    /// Wakes this shard's dead-letter publisher when a channel holds a new dead letter.
    static DEAD_WAKE: DeadWake = DeadWake::default();
}

/// A flag and the waker of the one task that waits for it (see [`dead_letters_waiting`]).
#[derive(Default)]
struct DeadWake {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl DeadWake {
    fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

/// Completes once a channel of the calling shard has held a new dead letter since the
/// last completion (one waiting task a shard: the root crate's dead-letter publisher,
/// which then calls `Shard::take_dead_letters`).
pub fn dead_letters_waiting() -> impl Future<Output = ()> {
    DeadWait
}

struct DeadWait;

impl Future for DeadWait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        DEAD_WAKE.with(|w| {
            if w.set.replace(false) {
                return Poll::Ready(());
            }
            *w.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}
