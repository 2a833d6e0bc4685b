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
    /// The sequences in `pqueue` (a burst of DPUBs is one range), and the attempts of
    /// those delivered before (a REQ with a delay): the lowest deferred sequence and
    /// whether, and with what attempts, a message is deferred, without walking the heap.
    index: DeferredIndex,
}

/// See [`DeferredQueue::index`].
#[derive(Default)]
struct DeferredIndex {
    seqs: crate::seqset::SeqSet,
    /// Sequence -> attempts, for deferred messages with attempts > 0 only.
    attempts: BTreeMap<u64, u16>,
}

impl DeferredIndex {
    fn insert(&mut self, d: &Deferred) {
        self.seqs.insert(d.seq);
        if d.attempts > 0 {
            self.attempts.insert(d.seq, d.attempts);
        }
    }

    fn remove(&mut self, seq: u64) {
        self.seqs.remove(seq);
        self.attempts.remove(&seq);
    }
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
        self.index = DeferredIndex::default();
        for d in &deferred {
            self.index.insert(d);
        }
        self.pqueue = deferred.into_iter().map(Reverse).collect();
    }

    /// The lowest deferred sequence.
    pub(super) fn first_seq(&self) -> Option<u64> {
        self.index.seqs.first()
    }

    /// The deferred sequences from `from` on, in order (from the index: no heap walk).
    pub(super) fn seqs_from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        self.index.seqs.iter_from(from)
    }

    /// The attempts of the deferred message at `seq`, if it is deferred.
    pub(super) fn attempts_of(&self, seq: u64) -> Option<u16> {
        if !self.index.seqs.contains(seq) {
            return None;
        }
        Some(self.index.attempts.get(&seq).copied().unwrap_or(0))
    }

    /// The body held for the deferred message at `seq`, if any (see `bodies`).
    pub(super) fn body(&self, seq: u64) -> Option<&Message> {
        self.bodies.get(&seq)
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
        let d = Deferred { due, seq, attempts };
        self.index.insert(&d);
        self.pqueue.push(Reverse(d));
    }

    /// Removes and returns the earliest message due at or before `now`, with its body
    /// when it is held here.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Deferred, Option<Message>)> {
        if self.pqueue.peek().is_none_or(|Reverse(d)| d.due > now) {
            return None;
        }
        let Reverse(d) = self.pqueue.pop()?;
        self.index.remove(d.seq);
        Some((d, self.bodies.remove(&d.seq)))
    }

    /// The earliest due time.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.pqueue.peek().map(|Reverse(d)| d.due)
    }

    pub(super) fn clear(&mut self) {
        self.pqueue.clear();
        self.bodies.clear();
        self.index = DeferredIndex::default();
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
