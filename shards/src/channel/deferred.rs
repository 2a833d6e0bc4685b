//! Deferred messages (nsqd: Channel.deferredMessages and deferredPQ): a min-heap by due
//! time of (due, sequence, attempts), and the bodies of those whose records the topic's
//! store cannot give back.

use super::Deferred;
use crate::message::Message;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::rc::Rc;
use std::time::Instant;

/// A channel's deferred messages (REQ with a delay, DPUB, recovered ones).
#[derive(Default)]
pub(super) struct DeferredQueue {
    pqueue: BinaryHeap<Reverse<Deferred>>,
    /// Bodies of deferred messages whose records cannot be read back from the topic's
    /// store (yet): the topic has no store, the record predates it, or it is not written
    /// yet (see `reread`), by sequence. [`DeferredQueue::drop_readable_bodies`] lets go
    /// of those the store has made readable since.
    bodies: BTreeMap<u64, Message>,
    /// The topic's store, and the sequence from which it holds every record: a record
    /// at or above it and below the store's readable point can be read back for as long
    /// as the channel holds it unfinished (the store writes what a channel holds and
    /// retention keeps it: it counts toward the low watermark), so a deferred or
    /// recovered message of such a record holds no body. `None`: the topic has no store.
    reread: Option<(u64, Rc<nsq_storage::TopicStore>)>,
}

impl DeferredQueue {
    pub(super) fn len(&self) -> usize {
        self.pqueue.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Deferred> {
        self.pqueue.iter().map(|Reverse(d)| d)
    }

    /// Bodies held because the store cannot give them back (yet).
    pub(super) fn bodies_len(&self) -> usize {
        self.bodies.len()
    }

    pub(super) fn set_reread(&mut self, reread: Option<(u64, Rc<nsq_storage::TopicStore>)>) {
        self.reread = reread;
    }

    /// Replaces the deferred messages with recovered ones (bodies read back when due).
    pub(super) fn restore(&mut self, deferred: Vec<Deferred>) {
        self.pqueue = deferred.into_iter().map(Reverse).collect();
    }

    /// True when the store can give back the record at `seq` for as long as the
    /// channel holds it (see `reread`).
    pub(super) fn rereads(&self, seq: u64) -> bool {
        self.reread
            .as_ref()
            .is_some_and(|(from, st)| seq >= *from && seq < st.readable_seq())
    }

    /// Holds `msg` until `due`: only its sequence, attempts and due time when the store
    /// can give its body back.
    pub(super) fn push(&mut self, msg: Message, due: Instant) {
        let (seq, attempts) = (msg.seq, msg.attempts);
        if !self.rereads(seq) {
            self.bodies.insert(seq, msg);
        }
        self.pqueue.push(Reverse(Deferred { due, seq, attempts }));
    }

    /// Removes and returns the earliest message due at or before `now`, with its body
    /// when it is held here.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Deferred, Option<Message>)> {
        if self.pqueue.peek().is_none_or(|Reverse(d)| d.due > now) {
            return None;
        }
        let Reverse(d) = self.pqueue.pop()?;
        Some((d, self.bodies.remove(&d.seq)))
    }

    /// The earliest due time.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.pqueue.peek().map(|Reverse(d)| d.due)
    }

    pub(super) fn clear(&mut self) {
        self.pqueue.clear();
        self.bodies.clear();
    }

    /// Lets go of the bodies whose records the store has made readable since they were
    /// deferred; returns the body bytes let go. Cheap when there are none.
    pub(super) fn drop_readable_bodies(&mut self) -> usize {
        if self.bodies.is_empty() {
            return 0;
        }
        let Some((from, st)) = &self.reread else {
            return 0;
        };
        let (from, readable) = (*from, st.readable_seq());
        if from >= readable || self.bodies.range(from..readable).next().is_none() {
            return 0;
        }
        let mut readable_part = self.bodies.split_off(&from);
        let mut rest = readable_part.split_off(&readable);
        self.bodies.append(&mut rest);
        readable_part.values().map(|m| m.body.len()).sum()
    }

    /// Gives back what a burst made the heap grow to (see
    /// [`shrink_target`](super::in_flight::shrink_target)); returns the bytes.
    pub(super) fn shrink(&mut self) -> usize {
        let Some(to) = super::in_flight::shrink_target(self.pqueue.len(), self.pqueue.capacity())
        else {
            return 0;
        };
        let before = self.pqueue.capacity();
        self.pqueue.shrink_to(to);
        (before - self.pqueue.capacity()) * std::mem::size_of::<Reverse<Deferred>>()
    }
}
