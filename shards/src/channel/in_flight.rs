//! In-flight messages: FIN, REQ and TOUCH, timeouts and due deferred messages
//! (`process_timers`), the channel's registration in its shard's timer queue, and
//! giving back what a burst made the heaps and maps grow to.

use super::{Channel, Deferred, InFlight, InFlightError};
use crate::client::Client;
use crate::message::{unix_nanos_from_instant, Message, MessageId};
use nsq_storage::journal::EventKind;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

impl Channel {
    fn take_owned(&mut self, client: &Client, id: MessageId) -> Result<InFlight, InFlightError> {
        match self.in_flight.get(&id) {
            None => Err(InFlightError::NotInFlight),
            Some(f) if f.client.id != client.id => Err(InFlightError::NotOwner),
            Some(_) => Ok(self.in_flight.remove(&id).expect("checked above")),
        }
    }

    fn compact_heap(&mut self) {
        if self.in_flight_heap.len() > 2 * self.in_flight.len() + 1024 {
            let live: Vec<_> = self
                .in_flight
                .iter()
                .map(|(id, f)| Reverse((f.deadline, *id)))
                .collect();
            self.in_flight_heap = BinaryHeap::from(live);
        }
    }

    /// Gives back what a burst made the channel's collections grow to (a million
    /// deferred messages, a wide in-flight window) once they hold a quarter of it or
    /// less, and counts it for the shard's heap trim ([`crate::memory_freed`]): a
    /// `BinaryHeap`, `VecDeque` or map otherwise keeps its largest capacity for good.
    /// Halving at a quarter keeps the cost amortized O(1) per message.
    fn shrink_if_sparse(&mut self) {
        const MIN: usize = 4096;
        fn sparse(len: usize, cap: usize) -> bool {
            cap >= MIN && len <= cap / 4
        }
        let mut freed = 0;
        if sparse(self.deferred.len(), self.deferred.capacity()) {
            let before = self.deferred.capacity();
            self.deferred
                .shrink_to((self.deferred.len() * 2).max(MIN / 4));
            freed += (before - self.deferred.capacity()) * std::mem::size_of::<Reverse<Deferred>>();
        }

        if sparse(self.in_flight_heap.len(), self.in_flight_heap.capacity()) {
            let before = self.in_flight_heap.capacity();
            self.in_flight_heap
                .shrink_to((self.in_flight_heap.len() * 2).max(MIN / 4));
            freed += (before - self.in_flight_heap.capacity())
                * std::mem::size_of::<Reverse<(Instant, MessageId)>>();
        }
        if sparse(self.requeued.len(), self.requeued.capacity()) {
            let before = self.requeued.capacity();
            self.requeued
                .shrink_to((self.requeued.len() * 2).max(MIN / 4));
            freed += (before - self.requeued.capacity()) * std::mem::size_of::<Message>();
        }
        if sparse(self.in_flight.len(), self.in_flight.capacity()) {
            let before = self.in_flight.capacity();
            self.in_flight
                .shrink_to((self.in_flight.len() * 2).max(MIN / 4));
            freed += (before.saturating_sub(self.in_flight.capacity()))
                * std::mem::size_of::<(MessageId, InFlight)>();
        }
        crate::memory_freed(freed);
    }

    /// FIN: the message is done (nsqd FinishMessage).
    pub fn finish(&mut self, client: &Client, id: MessageId) -> Result<(), InFlightError> {
        let f = self.take_owned(client, id)?;
        // Its body goes unless the topic's memory tail still holds it: counted toward
        // the shard's next heap trim either way (an estimate that errs toward trimming).
        crate::memory_freed(f.msg.body.len());
        self.shrink_if_sparse();
        if let Some(q) = self.e2e.as_mut() {
            q.insert(crate::message::now_unix_nanos(), f.msg.timestamp);
        }
        if f.msg.attempts >= 2 || f.msg.seq < self.recovered_below {
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
        self.compact_heap();
        Ok(())
    }

    /// REQ: back to the queue now (`delay` zero) or to the deferred heap.
    pub fn requeue(
        &mut self,
        client: &Client,
        id: MessageId,
        delay: Duration,
        now: Instant,
    ) -> Result<(), InFlightError> {
        let f = self.take_owned(client, id)?;
        client.in_flight.set((client.in_flight.get() - 1).max(0));
        client.count_requeue();
        self.requeue_count += 1;
        if delay.is_zero() {
            self.journal(EventKind::Requeued, &f.msg, 0);
            self.put_back(f.msg);
        } else {
            let due = now + delay;
            self.journal(EventKind::Requeued, &f.msg, unix_nanos_from_instant(due));
            self.defer(f.msg, due);
        }
        self.compact_heap();
        Ok(())
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
        let f = match self.in_flight.get_mut(&id) {
            None => return Err(InFlightError::NotInFlight),
            Some(f) if f.client.id != client.id => return Err(InFlightError::NotOwner),
            Some(f) => f,
        };
        let deadline = (now + msg_timeout).min(f.delivered_at + max_msg_timeout);
        f.deadline = deadline;
        self.in_flight_heap.push(Reverse((deadline, id)));
        self.compact_heap();
        Ok(())
    }

    /// Moves timed-out in-flight messages and due deferred ones to the requeue queue.
    /// Returns how many moved (nsqd processInFlightQueue / processDeferredQueue).
    pub fn process_timers(&mut self, now: Instant) -> usize {
        let mut moved = 0;
        while let Some(Reverse((deadline, id))) = self.in_flight_heap.peek().copied() {
            if deadline > now {
                break;
            }
            self.in_flight_heap.pop();
            let live = matches!(self.in_flight.get(&id), Some(f) if f.deadline == deadline);
            if !live {
                continue;
            }
            if let Some(f) = self.in_flight.remove(&id) {
                self.timeout_count += 1;
                f.client
                    .in_flight
                    .set((f.client.in_flight.get() - 1).max(0));
                moved += usize::from(self.put_back(f.msg));
            }
        }
        while let Some(Reverse(d)) = self.deferred.peek() {
            if d.due > now {
                break;
            }
            if let Some(Reverse(d)) = self.deferred.pop() {
                moved += usize::from(match self.deferred_bodies.remove(&d.seq) {
                    Some(msg) => self.put_back(Message {
                        attempts: d.attempts,
                        ..msg
                    }),
                    None => self.put_back_unread(d.seq, d.attempts),
                });
            }
        }
        if moved > 0 {
            self.shrink_if_sparse();
        }
        moved
    }

    /// The earliest instant a timer of this channel fires, if any (finished or touched
    /// messages may still have entries in the in-flight heap: see `prune_in_flight_heap`).
    pub fn next_timer(&self) -> Option<Instant> {
        let a = self.in_flight_heap.peek().map(|Reverse((d, _))| *d);
        let b = self.deferred.peek().map(|Reverse(d)| d.due);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops the heap entries at the top of the in-flight heap whose message was finished,
    /// requeued or touched since, so that `next_timer` gives a live deadline.
    fn prune_in_flight_heap(&mut self) {
        while let Some(Reverse((deadline, id))) = self.in_flight_heap.peek().copied() {
            if matches!(self.in_flight.get(&id), Some(f) if f.deadline == deadline) {
                break;
            }
            self.in_flight_heap.pop();
        }
    }

    /// The instant at which the shard's timer queue must visit this channel, when that is
    /// earlier than the instant it is registered at (or it is not registered): its
    /// earliest live in-flight deadline or deferred due time. The channel then counts as
    /// registered at that instant; `None` means nothing new to register. The shard calls
    /// this after every change to the channel's in-flight or deferred messages (nsqd
    /// instead scans channels every 100 ms in queueScanLoop).
    pub fn timer_to_schedule(&mut self) -> Option<Instant> {
        self.prune_in_flight_heap();
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
