//! A replicated topic's log as its leader hands it to a replica that restores a Raft
//! snapshot (docs/replication.md, "What a replica can miss"): the unfinished records
//! with the leader's own sequences, so that every replica numbers the topic's log the
//! same way and a channel position replicated as a sequence means the same message on
//! every replica.

use super::{StoreMode, Topic, RESTORE_GAP_MAX};
use crate::message::{instant_at, now_unix_nanos, unix_nanos_from_instant, MessageId};
use bytes::Bytes;
use std::time::Instant;

/// The most records one page of [`Topic::records_from`] (and of a store read for one)
/// carries: small bodies would otherwise make a page's encoding many times its bodies.
pub const PAGE_RECORDS: usize = 4096;

/// One record of a [`ReplicaState`]: the leader's sequence, ID, timestamp (Unix ns,
/// nsqd's `Message.Timestamp`), due time of a DPUB (Unix ns; 0: none) and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub seq: u64,
    pub id: MessageId,
    pub timestamp: i64,
    pub defer_until_ns: i64,
    pub body: Bytes,
}

/// A replicated topic as its leader holds it, for a replica that restores a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaState {
    /// The newest message ID (0: none yet).
    pub last_id: u64,
    /// The log head: the sequence the next message gets.
    pub head: u64,
    /// Every sequence below it is finished on every channel (the topic's low
    /// watermark); `records` starts there.
    pub low: u64,
    /// Each channel (#ephemeral ones too) with its low watermark.
    pub channels: Vec<(String, u64)>,
    /// The records from `low` to `head` by sequence (a sequence missing is one the
    /// leader does not hold: finished before it was written, or lost); `None` when the
    /// leader did not send them (more than it sends at once).
    pub records: Option<Vec<ReplicaRecord>>,
}

/// What [`Topic::restore_replica`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Records appended from the state.
    pub appended: u64,
    /// The state carried no records and named messages this topic does not hold: its
    /// log has a hole where the others have them.
    pub missing: bool,
}

impl Topic {
    /// Continues the log at `seq` when its head is below: the sequences in between hold
    /// nothing on this replica (a hole that channels step over, counted in no depth).
    /// Memory holds empty slots for a short hole; for a long one, every record still
    /// in memory is handed to the store first, so that memory can start at `seq`.
    pub(crate) fn skip_to(&mut self, seq: u64, mem_queue_size: u64) {
        let from = self.log.head;
        if seq <= from {
            return;
        }
        if !self.log.records.is_empty()
            && seq - from > RESTORE_GAP_MAX
            && self.storage.store.is_some()
        {
            self.store_pump(i64::MAX, mem_queue_size, true);
            self.log.records.clear();
            self.log.base = from;
        }
        if self.log.records.is_empty() {
            self.log.base = seq;
            self.log.head = seq;
            if self.storage.stored >= from {
                self.storage.stored = seq;
                if let Some(store) = &self.storage.store {
                    store.advance_to(seq);
                }
            }
        } else {
            while self.log.head < seq {
                self.log.records.push_back(None);
                self.log.head += 1;
            }
        }
        if self.log.pumped == from {
            self.log.pumped = seq;
        }
        self.log.holes.push((from, seq));
    }

    /// Appends a batch a replicated topic's leader numbered from `base` (nsq-replication's
    /// `Entry::PublishAt`): message `i` takes sequence `base + i`; one whose sequence
    /// this log already reaches is held here and skipped, and a log that ends below a
    /// message's sequence steps to it first (a hole). Returns (appended, log head).
    pub fn append_replicated_at(
        &mut self,
        base: u64,
        messages: impl IntoIterator<Item = (MessageId, i64, Option<Instant>, Bytes)>,
        mem_queue_size: u64,
    ) -> (u64, u64) {
        let mut n = 0;
        // A skipped message newer than any this log holds was not here: after a
        // snapshot that carried only the unfinished records, a finished one; otherwise
        // its leader numbered it below what the log held, and every replica skips it
        // the same way (lost). Logged for the second case.
        let newest = self.ids.last().map_or(0, |i| i.0);
        let mut misnumbered = 0u64;
        for (i, (id, timestamp, defer_until, body)) in messages.into_iter().enumerate() {
            let seq = base.saturating_add(i as u64);
            if seq < self.log.head {
                if id.0 > newest {
                    misnumbered += 1;
                }
                continue;
            }
            self.skip_to(seq, mem_queue_size);
            self.ids.resume_after(id);
            n += self.push_published(id, timestamp, defer_until, body, mem_queue_size);
        }
        self.published(mem_queue_size);
        if misnumbered > 0 {
            log::warn!(
                "TOPIC({}): {misnumbered} replicated message(s) numbered from {base}, below the log's head {}, skipped although newer than any it holds (lost unless this replica restored a snapshot past them)",
                self.name,
                self.log.head
            );
        }
        (n, self.log.head)
    }

    /// Makes this replica's topic hold what `state` says the leader holds: its records
    /// above this log's head are appended at the leader's sequences, the head moves to
    /// the leader's, and each channel moves forward to the leader's position (channels
    /// the state names must exist already). Records below the head are skipped (this
    /// replica holds their sequences).
    pub fn restore_replica(&mut self, state: ReplicaState, mem_queue_size: u64) -> Restored {
        let newest_here = self.ids.last().map_or(0, |i| i.0);
        let mut out = Restored::default();
        match state.records {
            Some(records) => {
                // Everything below `low` is finished everywhere.
                self.skip_to(state.low, mem_queue_size);
                let (now_i, now_ns) = (Instant::now(), now_unix_nanos());
                for r in records {
                    if r.seq < self.log.head {
                        continue;
                    }
                    self.skip_to(r.seq, mem_queue_size);
                    self.ids.resume_after(r.id);
                    let defer =
                        (r.defer_until_ns > 0).then(|| instant_at(r.defer_until_ns, now_i, now_ns));
                    out.appended +=
                        self.push_published(r.id, r.timestamp, defer, r.body, mem_queue_size);
                }
            }
            None => out.missing = state.last_id > newest_here,
        }
        self.skip_to(state.head, mem_queue_size);
        if state.last_id > newest_here {
            self.ids.resume_after(MessageId(state.last_id));
        }
        if self.storage.store.is_none() || self.storage.mode == StoreMode::Immediate {
            self.storage.stored = self.log.head;
        }
        // The records are counted into the channels as a pump does; a channel that
        // reads a record due later defers it then.
        if !self.paused && self.held.is_none() && !self.channels.is_empty() {
            let n = self.depth();
            for ch in self.channels.values_mut() {
                ch.count_pumped(n);
            }
            self.log.pumped = self.log.head;
        }
        let head = self.log.head;
        for (name, position) in state.channels {
            if let Some(ch) = self.channels.get_mut(&name) {
                let position = position.min(head);
                if ch.low_watermark() < position {
                    ch.seek(position);
                }
            }
        }
        self.trim(mem_queue_size);
        out
    }

    /// This topic as a replica restoring a snapshot needs it ([`ReplicaState`]), with
    /// the records held in memory; `records` is `None` when the unfinished span is
    /// longer than `max_span` sequences. The caller adds the records below the memory
    /// tail ([`super::Log::base`]) from the store.
    pub fn replica_state(&self, max_span: u64) -> ReplicaState {
        let head = self.log.head;
        let low = self.low_watermark().min(head);
        let records = (head - low <= max_span).then(|| {
            (low.max(self.log.base)..head)
                .filter_map(|seq| self.log.get(seq))
                .map(|r| ReplicaRecord {
                    seq: r.seq,
                    id: r.id,
                    timestamp: r.timestamp,
                    defer_until_ns: r.defer_until.map_or(0, unix_nanos_from_instant),
                    body: r.body.clone(),
                })
                .collect()
        });
        ReplicaState {
            last_id: self.ids.last().map_or(0, |i| i.0),
            head,
            low,
            channels: self
                .channels
                .iter()
                .map(|(n, c)| (n.clone(), c.low_watermark()))
                .collect(),
            records,
        }
    }

    /// The records this topic holds in memory from sequence `from` (at or above the
    /// memory tail, [`super::Log::base`]) in sequence order, up to about `max_bytes` of
    /// bodies and [`PAGE_RECORDS`] records (at least one record), and the sequence after the last one looked at
    /// (the head once it is reached). Sequences that hold nothing (finished, or a
    /// hole) are stepped over.
    pub fn records_from(&self, from: u64, max_bytes: usize) -> (Vec<ReplicaRecord>, u64) {
        let head = self.log.head;
        let mut records = Vec::new();
        let mut bytes = 0;
        let mut seq = from.max(self.log.base);
        while seq < head
            && (records.is_empty() || (bytes < max_bytes && records.len() < PAGE_RECORDS))
        {
            if let Some(r) = self.log.get(seq) {
                bytes += r.body.len();
                records.push(ReplicaRecord {
                    seq: r.seq,
                    id: r.id,
                    timestamp: r.timestamp,
                    defer_until_ns: r.defer_until.map_or(0, unix_nanos_from_instant),
                    body: r.body.clone(),
                });
            }
            seq += 1;
        }
        (records, seq.max(from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(ids: std::ops::Range<u64>) -> Vec<(MessageId, i64, Option<Instant>, Bytes)> {
        ids.map(|i| (MessageId(i), 1, None, Bytes::from(format!("m{i}"))))
            .collect()
    }

    /// A batch numbered by the leader lands at its sequences: a log that ends below
    /// steps to the base (a hole), and sequences this log already reaches are held.
    #[test]
    fn a_batch_numbered_by_the_leader_lands_at_its_sequences() {
        let mut t = Topic::new("t", 0);
        assert_eq!(t.append_replicated_at(0, batch(100..103), 10), (3, 3));
        // The leader's log was at 5: sequences 3 and 4 hold nothing here.
        assert_eq!(t.append_replicated_at(5, batch(105..107), 10), (2, 7));
        assert!(t.log.get(4).is_none());
        assert_eq!(t.log.get(5).map(|r| r.id), Some(MessageId(105)));
        assert_eq!(t.log.holes(), &[(3, 5)]);
        // A replay from 6: 6 is held, 7 and 8 are new.
        assert_eq!(t.append_replicated_at(6, batch(106..109), 10), (2, 9));
        assert_eq!(t.log.get(8).map(|r| r.id), Some(MessageId(108)));
        assert_eq!(t.last_id(), Some(MessageId(108)));
    }
}
