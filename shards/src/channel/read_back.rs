//! Reading back from the topic's store: read-ahead for a cursor below the memory tail
//! (`disk_read_from`, `push_disk`), and the bodies of messages ready again whose records
//! are only on disk (`unread_read_from`, `unread_arrived`), or of deferred messages the
//! store has made readable since (`drop_readable_bodies`).

use super::{Channel, DISK_READ_AHEAD, DISK_READ_BATCH};
use crate::topic::Record;

impl Channel {
    /// True when the store can give back the record at `seq` for as long as this
    /// channel holds it (see `reread`).
    pub(super) fn rereads(&self, seq: u64) -> bool {
        self.reread
            .as_ref()
            .is_some_and(|(from, st)| seq >= *from && seq < st.readable_seq())
    }

    /// Lets go of the bodies of deferred messages whose records the store has made
    /// readable since they were deferred; returns the body bytes let go. Cheap when
    /// there are none: the topic calls it as it trims its memory tail.
    pub fn drop_readable_bodies(&mut self) -> usize {
        let Some((from, st)) = &self.reread else {
            return 0;
        };
        let (from, readable) = (*from, st.readable_seq());
        if from >= readable || self.deferred_bodies.range(from..readable).next().is_none() {
            return 0;
        }
        let mut readable_part = self.deferred_bodies.split_off(&from);
        let mut rest = readable_part.split_off(&readable);
        self.deferred_bodies.append(&mut rest);
        readable_part.values().map(|m| m.body.len()).sum()
    }

    pub(super) fn pop_disk(&mut self) -> Option<Record> {
        let r = self.disk.pop_front()?;
        self.disk_bytes -= r.body.len();
        Some(r)
    }

    /// Adds records read back from the store (in sequence order, after those held).
    pub fn push_disk(&mut self, recs: impl IntoIterator<Item = Record>) {
        for r in recs {
            self.disk_bytes += r.body.len();
            self.disk.push_back(r);
        }
    }

    /// Body bytes read back from the store and held for delivery.
    pub fn disk_buffered_bytes(&self) -> usize {
        self.disk_bytes
    }

    /// Records read back from the store and held for delivery.
    pub fn disk_buffered(&self) -> usize {
        self.disk.len()
    }

    /// Drops what was read back from the store (the cursor jumped).
    pub fn clear_disk(&mut self) {
        self.disk.clear();
        self.disk_bytes = 0;
        self.disk_pos = None;
        self.wants_disk = false;
        self.disk_epoch += 1;
    }

    /// Where the next read from the store should start and how many records it should
    /// read at most, if one should start now: the cursor is below the memory tail
    /// (`log_base`), no read is under way, a client can take messages now
    /// ([`Channel::room`]), and fewer records than that room (at most
    /// [`DISK_READ_AHEAD`] records or bytes) are buffered. Each read gives the channel its
    /// own copy of the bodies, so what is read is bounded by what its clients can take:
    /// a lagging channel without a ready client (none subscribed, RDY 0, or outputs that
    /// are not drained) holds nothing read from disk. Reading ahead while buffered
    /// records are delivered keeps the disk busy, so a lagging channel with ready
    /// clients catches up at the disk's speed rather than one read's latency per batch.
    pub fn disk_read_from(&self, log_base: u64) -> Option<(u64, usize)> {
        if self.disk_inflight || self.paused || self.cursor >= log_base {
            return None;
        }
        let room = self.room().min(DISK_READ_AHEAD.0);
        if room == 0 {
            return None;
        }
        if !self.wants_disk && (self.disk.len() >= room || self.disk_bytes >= DISK_READ_AHEAD.1) {
            return None;
        }
        let from = self
            .disk
            .back()
            .map(|r| r.seq + 1)
            .unwrap_or(self.cursor)
            .max(self.cursor);
        let max = (room - self.disk.len().min(room)).clamp(1, DISK_READ_BATCH.0);
        // Not a sliver per FIN: a read is worth making once a tenth of the room is free.
        if !self.wants_disk && !self.disk.is_empty() && max < (room / 10).max(1) {
            return None;
        }
        (from < log_base).then_some((from, max))
    }

    /// The read that brings back the bodies of messages ready again below the memory
    /// tail (`ready_unread`), if one should start now: none is under way and a client
    /// can take messages. Returns the first sequence and how many records to read: up
    /// to the last wanted one within the clients' room, at most [`DISK_READ_BATCH`].
    pub fn unread_read_from(&self, log_base: u64) -> Option<(u64, usize)> {
        if self.unread_inflight || self.paused {
            return None;
        }
        let (&first, _) = self.ready_unread.range(..log_base).next()?;
        let room = self.room().min(DISK_READ_AHEAD.0);
        if room == 0 {
            return None;
        }
        let last = self
            .ready_unread
            .range(first..log_base)
            .take(room)
            .last()
            .map_or(first, |(&s, _)| s);
        let span = (last - first)
            .saturating_add(1)
            .min(DISK_READ_BATCH.0 as u64);
        Some((first, span as usize))
    }

    /// True when a read from the store should start for this channel now (its cursor's
    /// read-ahead, or bodies of messages ready again).
    pub fn wants_read(&self, log_base: u64) -> bool {
        self.disk_read_from(log_base).is_some() || self.unread_read_from(log_base).is_some()
    }

    /// Records read from the store at `from` for `ready_unread` arrived: the wanted
    /// ones become ready messages (bodies copied out of the read's window, so that a
    /// held message does not pin it). Wanted sequences the read covered but did not
    /// return are gone from the store (finished everywhere before they were due to be
    /// written, or lost to damage) and are dropped: returns how many. A read covers
    /// up to its last record, or, when empty, everything wanted below `log_base`; never
    /// what the store has not made readable yet (`readable`: a record handed to it and
    /// not yet written, which the store writes since this channel holds it).
    pub fn unread_arrived(
        &mut self,
        from: u64,
        log_base: u64,
        readable: u64,
        recs: Vec<Record>,
    ) -> usize {
        let covered_to = recs
            .last()
            .map_or(log_base, |r| r.seq.saturating_add(1))
            .min(readable);
        for r in recs {
            if let Some(attempts) = self.ready_unread.remove(&r.seq) {
                let mut msg = r.message();
                msg.attempts = attempts;
                msg.body = bytes::Bytes::copy_from_slice(&msg.body);
                self.requeued.push_back(msg);
            }
        }
        let gone: Vec<u64> = self
            .ready_unread
            .range(from..covered_to)
            .map(|(&s, _)| s)
            .collect();
        for s in &gone {
            self.ready_unread.remove(s);
        }
        gone.len()
    }

    /// True when the first message ready again below the memory tail waits for the
    /// store to make its record readable (at or above `readable`).
    pub fn unread_waits_for_store(&self, log_base: u64, readable: u64) -> bool {
        self.ready_unread
            .range(..log_base)
            .next()
            .is_some_and(|(&s, _)| s >= readable)
    }

    /// Drops what was read back from the store when no client takes messages (none
    /// subscribed with RDY > 0, or paused; see [`Channel::disk_read_from`]); returns the
    /// body bytes let go. The cursor
    /// stays: the next read starts there once a client is ready again.
    pub fn release_idle_read_ahead(&mut self) -> usize {
        // A full output is often only a moment (a consumer slower than the disk):
        // dropping then would read the same records again and again.
        if self.disk.is_empty() || self.rdy_of_takers(false) > 0 {
            return 0;
        }
        let bytes = self.disk_bytes;
        self.clear_disk();
        bytes
    }
}
