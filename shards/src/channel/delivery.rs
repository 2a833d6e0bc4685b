//! Delivery: picking the next message (requeued, ready again, or the log at the cursor),
//! handing messages to ready clients round robin (`dispatch`), the clients' room, putting
//! messages back or deferring them, and an `#ephemeral` channel's overflow.

use super::{Change, Channel, InFlight};
use crate::message::Message;
use crate::topic::Log;
use nsq_storage::journal::EventKind;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// A channel's messages ready again, delivered before its cursor moves on (nsqd: a
/// channel's memoryMsgChan, which a requeued message goes back to), and an `#ephemeral`
/// channel's bound on its ready messages.
pub(super) struct ReadyQueue {
    /// Messages ready again with their bodies (REQ 0, timeouts, due deferred ones whose
    /// bodies were held).
    pub(super) requeued: VecDeque<Message>,
    /// Messages ready again whose bodies are still in the log (a deferred message that
    /// fell due, a requeued one recovered after a restart): sequence -> attempts.
    /// Delivered after `requeued`, from the memory tail or, below it, once a read from
    /// the store brings them back (`unread_read_from`, `unread_arrived`).
    pub(super) unread: BTreeMap<u64, u16>,
    /// `#ephemeral` channels: `--mem-queue-size`, the most ready messages it keeps. A
    /// message that comes back (REQ, timeout, a deferred one falling due) to a full one
    /// is dropped, as nsqd's channel.put drops it into a dummy backend.
    mem_cap: Option<u64>,
    /// The topic's pumped head as of the last pump (to count an `#ephemeral` channel's
    /// ready messages without the log).
    pumped_seen: u64,
}

impl ReadyQueue {
    pub(super) fn new(cursor: u64) -> ReadyQueue {
        ReadyQueue {
            requeued: VecDeque::new(),
            unread: BTreeMap::new(),
            mem_cap: None,
            pumped_seen: cursor,
        }
    }

    /// Messages ready again and not yet redelivered.
    pub(super) fn len(&self) -> usize {
        self.requeued.len() + self.unread.len()
    }

    pub(super) fn clear(&mut self) {
        self.requeued.clear();
        self.unread.clear();
    }

    /// Gives back what a burst made the requeue queue grow to (see
    /// [`shrink_target`](super::in_flight::shrink_target)); returns the bytes.
    pub(super) fn shrink(&mut self) -> usize {
        let (len, capacity) = (self.requeued.len(), self.requeued.capacity());
        let Some(to) = super::in_flight::shrink_target(len, capacity) else {
            return 0;
        };
        self.requeued.shrink_to(to);
        (capacity - self.requeued.capacity()) * std::mem::size_of::<Message>()
    }
}

impl Channel {
    /// A message deferred at publish time goes straight to the deferred heap; the cursor
    /// will step over its record.
    pub fn defer_published(&mut self, msg: Message, due: Instant) {
        if msg.seq >= self.cursor {
            self.skip.insert(msg.seq);
        }
        self.record(
            msg.seq,
            Change::Pending {
                attempts: msg.attempts,
                due: Some(due),
            },
        );
        self.defer(msg, due);
    }

    /// An #ephemeral channel keeps at most `mem_queue_size` ready messages; what a pump
    /// brings beyond that is dropped, the newest first (nsqd's channel.put: an
    /// ephemeral channel's backend is a dummy queue, so a message that finds the memory
    /// queue full is discarded). The kept unread records move to the front queue so
    /// the cursor can pass the dropped ones and the topic can free them. Where the
    /// oldest kept records are no longer in memory (a durable topic whose memory tail
    /// passed the cursor) the oldest unread records are dropped instead.
    pub fn drop_overflow(&mut self, log: &Log, mem_queue_size: u64) {
        self.set_mem_queue_size(mem_queue_size);
        self.ready.pumped_seen = log.pumped;
        let depth = self.depth(log);
        if depth <= mem_queue_size {
            return;
        }
        let excess = depth - mem_queue_size;
        self.record_all();
        if self.cursor < log.base || !self.read_ahead.is_empty() {
            let skip = excess.min(log.pumped.saturating_sub(self.cursor));
            self.cursor += skip;
            let mut rest = (excess - skip) as usize;
            let front = rest.min(self.ready.requeued.len());
            self.ready.requeued.drain(..front);
            rest -= front;
            while rest > 0 && self.ready.unread.pop_first().is_some() {
                rest -= 1;
            }
            return;
        }
        // Keep the oldest `mem_queue_size`: the front queue, then the log in order.
        let mut keep = mem_queue_size.saturating_sub(self.requeued_count() as u64);
        while self.cursor < log.pumped && keep > 0 {
            self.cursor = log.skip_hole(self.cursor);
            if self.cursor >= log.pumped {
                break;
            }
            let seq = self.cursor;
            self.cursor += 1;
            if self.skip.remove(seq) {
                continue;
            }
            if let Some(rec) = log.get(seq) {
                self.ready.requeued.push_back(rec.message());
                keep -= 1;
            }
        }
        // Deferred records among the dropped ones stay in the deferred heap (they are
        // not depth); the cursor has passed their records.
        self.skip.retain_from(log.pumped);
        self.cursor = log.pumped;
    }

    /// A message ready again (REQ 0, a timeout, a deferred one due) goes to the front
    /// queue, unless this is an `#ephemeral` channel already holding its
    /// `--mem-queue-size` ready messages: then it is dropped (nsqd: channel.put, whose
    /// ephemeral backend discards). Returns whether it was kept.
    pub(super) fn put_back(&mut self, msg: Message) -> bool {
        if self.ephemeral_full() {
            return false;
        }
        self.ready.requeued.push_back(msg);
        true
    }

    /// As [`Channel::put_back`], for a message whose body is still in the log.
    pub(super) fn put_back_unread(&mut self, seq: u64, attempts: u16) -> bool {
        if self.ephemeral_full() {
            return false;
        }
        self.ready.unread.insert(seq, attempts);
        true
    }

    /// True for an `#ephemeral` channel that holds its `--mem-queue-size` ready messages.
    fn ephemeral_full(&self) -> bool {
        self.ready.mem_cap.is_some_and(|cap| {
            let ready = self
                .ready
                .pumped_seen
                .saturating_sub(self.cursor)
                .saturating_sub(self.skip.len())
                + self.requeued_count() as u64;
            ready >= cap
        })
    }

    /// Holds `msg` until `due` (REQ with a delay, DPUB, recovery). Only its sequence,
    /// attempts and due time are kept when the log can give its body back.
    pub fn defer(&mut self, msg: Message, due: Instant) {
        self.deferred.push(msg, due);
    }

    /// An `#ephemeral` channel keeps at most `mem_queue_size` ready messages
    /// (`--mem-queue-size`; see [`Channel::drop_overflow`]).
    pub(crate) fn set_mem_queue_size(&mut self, mem_queue_size: u64) {
        self.ready.mem_cap = Some(mem_queue_size);
    }

    /// The next message to deliver: requeued first, then the log at the cursor. Records
    /// published with a defer time still in the future move to the deferred heap.
    fn next_message(&mut self, log: &Log, now: Instant) -> Option<Message> {
        if let Some(m) = self.ready.requeued.pop_front() {
            return Some(m);
        }
        // Ready again with the body in the memory tail; those below it wait for a read.
        while let Some((&seq, &attempts)) = self.ready.unread.range(log.base..).next() {
            self.ready.unread.remove(&seq);
            match log.get(seq) {
                Some(r) => {
                    return Some(Message {
                        attempts,
                        ..r.message()
                    })
                }
                None => log::debug!(
                    "CHANNEL({}): message {seq} ready again is gone from the log",
                    self.name
                ),
            }
        }
        while self.cursor < log.pumped {
            self.cursor = log.skip_hole(self.cursor);
            if self.cursor >= log.pumped {
                break;
            }
            if self.skip.remove(self.cursor) {
                self.cursor += 1;
                continue;
            }
            let rec = if self.cursor < log.base {
                // Below the memory tail: serve from what was read back from disk.
                match self.read_ahead.pop_from(self.cursor) {
                    Some(r) => {
                        self.cursor = r.seq;
                        r
                    }
                    None => {
                        self.read_ahead.want();
                        return None;
                    }
                }
            } else {
                if !self.read_ahead.is_empty() {
                    // Caught up with the memory tail: what is left was read ahead in vain.
                    self.clear_disk();
                }
                match log.get(self.cursor) {
                    Some(r) => r.clone(),
                    None => {
                        // Lost to corruption: skip it.
                        self.cursor += 1;
                        continue;
                    }
                }
            };
            self.cursor += 1;
            let msg = rec.message();
            match rec.defer_until {
                Some(due) if due > now => self.defer(msg, due),
                _ => return Some(msg),
            }
        }
        None
    }

    /// Messages this channel's clients take: the RDY of each subscribed client with
    /// RDY > 0 whose output is being drained (not full); 0 when paused or held. A consumer that
    /// has all its RDY in flight still takes messages (each FIN makes room for the next):
    /// reads for it go on. One that stops reading its socket (a full output), sets RDY 0
    /// or leaves does not.
    pub fn room(&self) -> usize {
        self.rdy_of_takers(true)
    }

    /// The RDY of the subscribed clients with RDY > 0 (`drained`: only those whose
    /// output is not full); 0 when paused or held.
    pub(super) fn rdy_of_takers(&self, drained: bool) -> usize {
        if self.delivery_stopped() {
            return 0;
        }
        self.consumers
            .clients
            .iter()
            .filter(|c| {
                !c.is_closed()
                    && c.state() == crate::client::ClientState::Subscribed
                    && c.ready_count.get() > 0
                    && !(drained && c.output_full())
            })
            .map(|c| c.ready_count.get().max(0) as usize)
            .sum()
    }

    /// True when a ready message exists and a client can take it.
    fn has_work(&self, log: &Log) -> bool {
        !self.delivery_stopped()
            && (!self.ready.requeued.is_empty()
                || self.ready.unread.range(log.base..).next().is_some()
                || (self.cursor < log.pumped && !(self.wants_disk() && self.read_ahead.is_empty())))
    }

    /// Hands messages to ready clients, round robin, until either runs out (nsqd's
    /// messagePump, with RDY as an in-flight window). A client whose output is over its
    /// high-water mark ([`Client::output_full`](crate::client::Client::output_full)) is skipped until its writer drains it
    /// (the writer then asks for a delivery, see
    /// [`Client::resume_delivery`](crate::client::Client::resume_delivery)), so a
    /// consumer that does not read holds about one output buffer of messages whatever
    /// its RDY, and the rest go to the others. Frames are buffered in each
    /// client's output buffer; the writer tasks flush them. Together, this and the TCP
    /// writer task (`src/tcp/writer.rs`) are nsqd's messagePump: this half is its
    /// receive from the channel and SendMessage (pick a message, start its in-flight
    /// timeout, frame it), the writer is its flush and heartbeat half.
    pub fn dispatch(&mut self, log: &Log, now: Instant) -> u64 {
        if !crate::delivery_gate::is_open(now) {
            // This thread's cluster clock is behind: nothing goes out until it ran
            // (crate::delivery_gate), and it dispatches again then.
            return 0;
        }
        let mut delivered = 0;
        let n = self.consumers.clients.len();
        while n > 0 && self.has_work(log) {
            // The first ready client in round-robin order of the lowest topology rank
            // (crate::topology); without the experiment every rank is 0, so the first.
            let mut pick: Option<(usize, u8)> = None;
            for i in 0..n {
                let idx = (self.consumers.next + i) % n;
                let c = &self.consumers.clients[idx];
                if !c.is_ready() {
                    continue;
                }
                if c.output_full() {
                    // Its socket is not taking what it was sent: the message stays
                    // here for the others (nsqd: a messagePump blocked in a write
                    // takes nothing from the channel).
                    c.hold_back();
                    continue;
                }
                let rank = c.settings.borrow().topology.rank;
                if pick.is_none_or(|(_, best)| rank < best) {
                    pick = Some((idx, rank));
                }
                if rank <= crate::topology::RANK_ZONE {
                    break;
                }
            }
            let Some((idx, rank)) = pick else { break };
            if !self.limits.rate.take(now) {
                // Rate-limited: the rest waits for the timer (`next_timer`).
                break;
            }
            self.consumers.next = (idx + 1) % n;
            let Some(mut msg) = self.next_message(log, now) else {
                self.limits.rate.give_back();
                break;
            };
            if self.is_dead(msg.attempts) {
                // Ready again with its attempts used up (recovered after a restart,
                // or the maximum lowered): not delivered.
                self.limits.rate.give_back();
                self.bury(msg);
                continue;
            }
            let client = self.consumers.clients[idx].clone();
            let (sample_rate, msg_timeout) = {
                let s = client.settings.borrow();
                // nsqd's messagePump: the first IDENTIFY's values.
                (s.pump.sample_rate, s.pump.msg_timeout)
            };
            if sample_rate > 0 && fastrand::u32(0..100) > sample_rate {
                continue;
            }
            msg.attempts = msg.attempts.wrapping_add(1);
            self.record(
                msg.seq,
                Change::Pending {
                    attempts: msg.attempts,
                    due: None,
                },
            );
            if msg.attempts >= 2 {
                // A redelivery: its attempts must not go back after a crash.
                self.journal(EventKind::Delivered, &msg, 0);
            }
            client.in_flight.set(client.in_flight.get() + 1);
            client.count_delivery();
            self.counters.by_rank.count(rank);
            client.buffer_message(&msg);
            let deadline = now + msg_timeout;
            self.in_flight.insert(InFlight {
                msg,
                client,
                deadline,
                delivered_at: now,
            });
            delivered += 1;
        }
        crate::memory_freed(self.release_idle_read_ahead());
        delivered
    }
}
