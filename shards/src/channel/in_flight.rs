//! In-flight messages: FIN, REQ and TOUCH, timeouts and due deferred messages
//! (`process_timers`), the channel's registration in its shard's timer queue, and
//! giving back what a burst made the heaps and maps grow to.

use super::{Change, Channel, IdMap, InFlight, InFlightError};
use crate::client::Client;
use crate::message::{unix_nanos_from_instant, Message, MessageId};
use nsq_storage::journal::EventKind;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// The messages delivered and not yet finished, by ID (nsqd: Channel.inFlightMessages),
/// and their deadlines in a min-heap (nsqd: in_flight_pqueue.go).
#[derive(Default)]
pub(super) struct InFlightTable {
    messages: IdMap<InFlight>,
    /// (deadline, id); entries whose message was finished or touched are skipped when
    /// popped and compacted away when they outnumber the live ones.
    pqueue: BinaryHeap<Reverse<(Instant, MessageId)>>,
}

impl InFlightTable {
    pub(super) fn len(&self) -> usize {
        self.messages.len()
    }

    pub(super) fn get(&self, id: MessageId) -> Option<&InFlight> {
        self.messages.get(&id)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &InFlight> {
        self.messages.values()
    }

    /// Starts the timeout of a delivered message.
    pub(super) fn insert(&mut self, f: InFlight) {
        self.pqueue.push(Reverse((f.deadline, f.msg.id)));
        self.messages.insert(f.msg.id, f);
    }

    pub(super) fn clear(&mut self) {
        self.messages.clear();
        self.pqueue.clear();
    }

    /// Removes the message `id` if `client` owns it.
    fn take_owned(&mut self, client: &Client, id: MessageId) -> Result<InFlight, InFlightError> {
        match self.messages.get(&id) {
            None => Err(InFlightError::NotInFlight),
            Some(f) if f.client.id != client.id => Err(InFlightError::NotOwner),
            Some(_) => Ok(self.messages.remove(&id).expect("checked above")),
        }
    }

    /// Gives the message `id`, if `client` owns it, the deadline `deadline` computes
    /// from it.
    fn touch(
        &mut self,
        client: &Client,
        id: MessageId,
        deadline: impl FnOnce(&InFlight) -> Instant,
    ) -> Result<(), InFlightError> {
        let f = match self.messages.get_mut(&id) {
            None => return Err(InFlightError::NotInFlight),
            Some(f) if f.client.id != client.id => return Err(InFlightError::NotOwner),
            Some(f) => f,
        };
        f.deadline = deadline(f);
        self.pqueue.push(Reverse((f.deadline, id)));
        Ok(())
    }

    /// Removes and returns every message, in sequence order.
    fn take_all(&mut self) -> Vec<InFlight> {
        self.pqueue.clear();
        let mut all: Vec<InFlight> = self.messages.drain().map(|(_, f)| f).collect();
        all.sort_by_key(|f| f.msg.seq);
        all
    }

    /// Removes and returns a message whose deadline is at or before `now`, the earliest
    /// first.
    fn pop_timed_out(&mut self, now: Instant) -> Option<InFlight> {
        while let Some(Reverse((deadline, id))) = self.pqueue.peek().copied() {
            if deadline > now {
                return None;
            }
            self.pqueue.pop();
            if matches!(self.messages.get(&id), Some(f) if f.deadline == deadline) {
                return self.messages.remove(&id);
            }
        }
        None
    }

    /// The earliest deadline in the heap (possibly of a message finished or touched
    /// since: see `prune`).
    fn next_deadline(&self) -> Option<Instant> {
        self.pqueue.peek().map(|Reverse((d, _))| *d)
    }

    /// Drops the heap entries at the top whose message was finished, requeued or
    /// touched since, so that `next_deadline` gives a live deadline.
    fn prune(&mut self) {
        while let Some(Reverse((deadline, id))) = self.pqueue.peek().copied() {
            if matches!(self.messages.get(&id), Some(f) if f.deadline == deadline) {
                break;
            }
            self.pqueue.pop();
        }
    }

    /// Rebuilds the heap from the live messages once stale entries outnumber them.
    fn compact(&mut self) {
        if self.pqueue.len() > 2 * self.messages.len() + 1024 {
            let live: Vec<_> = self
                .messages
                .iter()
                .map(|(id, f)| Reverse((f.deadline, *id)))
                .collect();
            self.pqueue = BinaryHeap::from(live);
        }
    }

    /// Shrinks the heap and the map where they are sparse (see [`shrink_target`]);
    /// returns the bytes given back.
    fn shrink(&mut self) -> usize {
        let mut freed = 0;
        if let Some(to) = shrink_target(self.pqueue.len(), self.pqueue.capacity()) {
            let before = self.pqueue.capacity();
            self.pqueue.shrink_to(to);
            freed += (before - self.pqueue.capacity())
                * std::mem::size_of::<Reverse<(Instant, MessageId)>>();
        }
        if let Some(to) = shrink_target(self.messages.len(), self.messages.capacity()) {
            let before = self.messages.capacity();
            self.messages.shrink_to(to);
            freed += before.saturating_sub(self.messages.capacity())
                * std::mem::size_of::<(MessageId, InFlight)>();
        }
        freed
    }
}

/// Collections smaller than this (in entries) keep their capacity.
const SHRINK_MIN: usize = 4096;

/// The capacity to shrink a collection of `len` entries and `capacity` to, once it holds
/// a quarter of it or less: a burst (a million deferred messages, a wide in-flight
/// window) would otherwise leave a `BinaryHeap`, `VecDeque` or map at its largest
/// capacity for good. Halving at a quarter keeps the cost amortized O(1) per message.
pub(super) fn shrink_target(len: usize, capacity: usize) -> Option<usize> {
    (capacity >= SHRINK_MIN && len <= capacity / 4).then(|| (len * 2).max(SHRINK_MIN / 4))
}

impl Channel {
    /// Gives back what a burst made the channel's collections grow to (see
    /// [`shrink_target`]) and counts it for the shard's heap trim
    /// ([`crate::memory_freed`]).
    fn shrink_if_sparse(&mut self) {
        let freed = self.deferred.shrink() + self.in_flight.shrink() + self.ready.shrink();
        crate::memory_freed(freed);
    }

    /// FIN: the message is done (nsqd FinishMessage).
    pub fn finish(&mut self, client: &Client, id: MessageId) -> Result<(), InFlightError> {
        // The clock is read only when the latency is recorded (--channel-lag-stats).
        let now = self.counters.fin_latency.is_some().then(Instant::now);
        self.finish_inner(client, id, now)
    }

    /// [`Channel::finish`] at `now`, which also records the delivery-to-FIN latency
    /// (when recording: [`Channel::start_fin_latency`]).
    pub fn finish_at(
        &mut self,
        client: &Client,
        id: MessageId,
        now: Instant,
    ) -> Result<(), InFlightError> {
        self.finish_inner(client, id, Some(now))
    }

    fn finish_inner(
        &mut self,
        client: &Client,
        id: MessageId,
        now: Option<Instant>,
    ) -> Result<(), InFlightError> {
        let f = self.in_flight.take_owned(client, id)?;
        self.record(f.msg.seq, Change::Finished);
        if let (Some(h), Some(now)) = (self.counters.fin_latency.as_mut(), now) {
            h.record(now.saturating_duration_since(f.delivered_at), now);
        }
        // Its body goes unless the topic's memory tail still holds it: counted toward
        // the shard's next heap trim either way (an estimate that errs toward trimming).
        crate::memory_freed(f.msg.body.len());
        self.shrink_if_sparse();
        if let Some(q) = self.counters.e2e.as_mut() {
            q.insert(crate::message::now_unix_nanos(), f.msg.timestamp);
        }
        if f.msg.attempts >= 2 || f.msg.seq < self.journal.recovered_below {
            // A first delivery's FIN needs no event: a crash before the next checkpoint
            // delivers the message once more, with attempts 1. A message recovered
            // after a restart may be exactly that redelivery, and its attempts say
            // nothing (a crash loses a first delivery's increment): without the event,
            // each crash before a checkpoint would deliver it once more, so a broker
            // crashing faster than --sync-timeout would replay its whole backlog on
            // every start.
            self.journal(EventKind::Finished, &f.msg, 0);
        }
        client.in_flight.set((client.in_flight.get() - 1).max(0));
        client.count_finish();
        self.in_flight.compact();
        Ok(())
    }

    /// REQ: back to the queue now (`delay` zero) or to the deferred heap; a message that
    /// used up its maximum attempts goes to the dead letters at once, whatever `delay`.
    pub fn requeue(
        &mut self,
        client: &Client,
        id: MessageId,
        delay: Duration,
        now: Instant,
    ) -> Result<(), InFlightError> {
        let f = self.in_flight.take_owned(client, id)?;
        client.in_flight.set((client.in_flight.get() - 1).max(0));
        client.count_requeue();
        self.counters.requeue_count += 1;
        let (seq, attempts) = (f.msg.seq, f.msg.attempts);
        if self.is_dead(f.msg.attempts) {
            // Ready again with its attempts until the dead-letter topic has it.
            self.journal(EventKind::Requeued, &f.msg, 0);
            self.bury(f.msg);
            self.record(
                seq,
                Change::Pending {
                    attempts,
                    due: None,
                },
            );
        } else if delay.is_zero() {
            self.journal(EventKind::Requeued, &f.msg, 0);
            let kept = self.put_back(f.msg);
            self.record_put_back(seq, kept);
        } else {
            let due = now + delay;
            self.journal(EventKind::Requeued, &f.msg, unix_nanos_from_instant(due));
            self.defer(f.msg, due);
            self.record(
                seq,
                Change::Pending {
                    attempts,
                    due: Some(due),
                },
            );
        }
        self.in_flight.compact();
        Ok(())
    }

    /// This member stopped leading the channel's replicated topic and its consumers
    /// are served through the new leader: the messages they held in flight are ready
    /// again here at once, with their attempts. They are the new leader's to deliver,
    /// and the state it replicates (which a replica's channel takes, keeping what it holds in flight:
    /// [`Channel::seek`]) says what this member holds from then on; left in flight,
    /// they would time out and be delivered again should it lead once more, even if
    /// finished meanwhile.
    pub fn requeue_in_flight(&mut self) {
        for f in self.in_flight.take_all() {
            f.client
                .in_flight
                .set((f.client.in_flight.get() - 1).max(0));
            let seq = f.msg.seq;
            let kept = self.put_back(f.msg);
            self.record_put_back(seq, kept);
        }
    }

    /// TOUCH: a new deadline of now + the client's msg_timeout, never past delivery +
    /// `max_msg_timeout`.
    pub fn touch(
        &mut self,
        client: &Client,
        id: MessageId,
        now: Instant,
        max_msg_timeout: Duration,
    ) -> Result<(), InFlightError> {
        let msg_timeout = client.settings.borrow().msg_timeout;
        self.in_flight.touch(client, id, |f| {
            (now + msg_timeout).min(f.delivered_at + max_msg_timeout)
        })?;
        self.in_flight.compact();
        Ok(())
    }

    /// Moves timed-out in-flight messages and due deferred ones to the requeue queue
    /// (a timed-out one that used up its attempts to the dead letters instead).
    /// Returns how many moved, plus one when a rate-limited channel may deliver again (nsqd processInFlightQueue / processDeferredQueue).
    pub fn process_timers(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        while let Some(f) = self.in_flight.pop_timed_out(now) {
            self.counters.timeout_count += 1;
            f.client
                .in_flight
                .set((f.client.in_flight.get() - 1).max(0));
            if self.is_dead(f.msg.attempts) {
                self.bury(f.msg);
                moved += 1;
            } else {
                let seq = f.msg.seq;
                let kept = self.put_back(f.msg);
                self.record_put_back(seq, kept);
                moved += usize::from(kept);
            }
        }
        while let Some((d, body)) = self.deferred.pop_due(now) {
            let kept = match body {
                Some(msg) => self.put_back(Message {
                    attempts: d.attempts,
                    ..msg
                }),
                None => self.put_back_unread(d.seq, d.attempts),
            };
            self.record_put_back(d.seq, kept);
            moved += usize::from(kept);
        }
        if moved > 0 {
            self.shrink_if_sparse();
        }
        // A rate-limited channel whose next token is back: deliver again.
        moved + usize::from(self.limits.rate.resume_due(now))
    }

    /// The earliest instant a timer of this channel fires, if any: an in-flight deadline,
    /// a deferred due time, or the instant a rate-limited channel gets its next token
    /// (finished or touched messages may still have entries in the in-flight heap: see
    /// `timer_to_schedule`).
    pub fn next_timer(&self) -> Option<Instant> {
        [
            self.in_flight.next_deadline(),
            self.deferred.next_due(),
            self.limits.rate.resume_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The instant at which the shard's timer queue must visit this channel, when that is
    /// earlier than the instant it is registered at (or it is not registered): its
    /// earliest live in-flight deadline or deferred due time. The channel then counts as
    /// registered at that instant; `None` means nothing new to register. The shard calls
    /// this after every change to the channel's in-flight or deferred messages (nsqd
    /// instead scans channels every 100 ms in queueScanLoop).
    pub fn timer_to_schedule(&mut self) -> Option<Instant> {
        self.in_flight.prune();
        let next = self.next_timer()?;
        if self.timer_scheduled.is_some_and(|s| s <= next) {
            return None;
        }
        self.timer_scheduled = Some(next);
        Some(next)
    }

    /// The shard's timer queue visited this channel at `now`: registrations at or before
    /// `now` are used up (call `process_timers(now)`, then `timer_to_schedule`).
    pub fn timer_fired(&mut self, now: Instant) {
        if self.timer_scheduled.is_some_and(|s| s <= now) {
            self.timer_scheduled = None;
        }
    }
}
