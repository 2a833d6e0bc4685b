//! Looking at a channel's messages without changing anything (beyond nsqd: `GET
//! /message` and `GET /messages`): the state of one message on this channel, and the
//! messages it would deliver next. Nothing here moves the cursor, counts an attempt,
//! reads ahead or touches a client.

use super::Channel;
use crate::message::{Message, MessageId};
use crate::topic::Log;

/// Where a message stands on one channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageState {
    /// Not yet delivered (at or after the cursor), or ready again after a REQ or a
    /// timeout.
    Waiting,
    /// Delivered and neither finished, requeued nor timed out yet.
    InFlight,
    /// Waiting for its due time (DPUB, REQ with a delay).
    Deferred,
    /// The channel will not deliver it: finished, or passed over (the channel was
    /// created after it, emptied, or sought past it).
    Finished,
}

impl MessageState {
    /// The name `/message` shows: `waiting`, `in_flight`, `deferred`, `finished`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Waiting => "waiting",
            MessageState::InFlight => "in_flight",
            MessageState::Deferred => "deferred",
            MessageState::Finished => "finished",
        }
    }
}

/// One message a channel would deliver: its sequence and attempts so far, with the
/// message when its body is at hand (memory, read-ahead, held), else `None`: the caller
/// reads the record at `seq` from the topic's store.
#[derive(Clone, Debug)]
pub struct Peeked {
    pub seq: u64,
    pub attempts: u16,
    pub msg: Option<Message>,
}

impl Channel {
    /// The state of the message at `seq`, whose ID is `id`, on this channel, with its
    /// deliveries so far (0 for a message not delivered yet, and for a finished one:
    /// its attempts are not kept). O(log n) but for the messages ready again with their
    /// bodies (bounded by what timed out or was requeued from the in-flight window).
    pub fn message_state(&self, log: &Log, seq: u64, id: MessageId) -> (MessageState, u16) {
        if let Some(f) = self.in_flight.get(id).filter(|f| f.msg.seq == seq) {
            return (MessageState::InFlight, f.msg.attempts);
        }
        if let Some(a) = self.deferred.attempts_of(seq) {
            return (MessageState::Deferred, a);
        }
        if let Some(m) = self.ready.requeued.iter().find(|m| m.seq == seq) {
            return (MessageState::Waiting, m.attempts);
        }
        if let Some(&a) = self.ready.unread.get(&seq) {
            return (MessageState::Waiting, a);
        }
        if seq >= self.cursor && !self.skip.contains(seq) && log.skip_hole(seq) == seq {
            return (MessageState::Waiting, 0);
        }
        (MessageState::Finished, 0)
    }

    /// Up to `count` messages in the order this channel would deliver them now: those
    /// ready again (requeued with their bodies, then those whose records are in the log,
    /// by sequence), then the pumped records from the cursor on, stepping over what the
    /// cursor steps over; records below `from_seq` are left out of the cursor's part.
    /// Deferred messages are not included (not deliverable before they are due). A
    /// record neither in memory nor read ahead comes back with `msg: None`.
    pub fn peek(&self, log: &Log, count: usize, from_seq: u64) -> Vec<Peeked> {
        let mut out = Vec::with_capacity(count.min(1024));
        let at_hand = |seq: u64| {
            log.get(seq)
                .or_else(|| self.read_ahead.find(seq))
                .map(|r| r.message())
        };
        for m in self.ready.requeued.iter().take(count) {
            out.push(Peeked {
                seq: m.seq,
                attempts: m.attempts,
                msg: Some(m.clone()),
            });
        }
        for (&seq, &attempts) in &self.ready.unread {
            if out.len() >= count {
                return out;
            }
            let msg = at_hand(seq).map(|m| Message { attempts, ..m });
            out.push(Peeked { seq, attempts, msg });
        }
        let mut seq = self.cursor.max(from_seq);
        while out.len() < count {
            // Step over holes and stepped-over ranges (each step passes a whole range).
            let next = self.skip.next_absent(log.skip_hole(seq));
            if next != seq {
                seq = next;
                continue;
            }
            if seq >= log.pumped {
                break;
            }
            out.push(Peeked {
                seq,
                attempts: 0,
                msg: at_hand(seq),
            });
            seq += 1;
        }
        out
    }
}
