//! Reading back from the topic's store: read-ahead for a cursor below the memory tail
//! (`disk_read_from`, `push_disk`), and the bodies of messages ready again whose records
//! are only on disk (`unread_read_from`, `unread_arrived`), or of deferred messages the
//! store has made readable since (`drop_readable_bodies`).

use super::{Channel, DISK_READ_AHEAD, DISK_READ_BATCH};
use crate::topic::Record;
use std::collections::VecDeque;
use std::time::Duration;

/// What a channel read back from its topic's store, and the state of its reads (nsqd
/// reads a channel's backlog from its diskqueue instead).
#[derive(Default)]
pub(super) struct ReadAhead {
    /// Records read back for a cursor below the memory tail, in sequence order.
    records: VecDeque<Record>,
    /// Body bytes held in `records`.
    bytes: usize,
    /// The cursor is below the memory tail and `records` is empty: a read is wanted.
    wanted: bool,
    /// A read for the cursor is under way (or a failed one waits for its retry).
    reading: bool,
    /// A read for the messages ready again below the memory tail is under way (or a
    /// failed one waits for its retry).
    unread_reading: bool,
    /// Reads that failed in a row (the retry backs off: 100 ms, doubling, at most 5 s).
    failures: u32,
    /// The last failed read's error while reads keep failing, for the shard's health
    /// (`/ping` answers it until a read succeeds or the channel is gone).
    error: Option<String>,
    /// Where the last read ended (the next sequential read starts there).
    pos: Option<nsq_storage::ReadPos>,
    /// Bumped whenever the cursor jumps (empty, seek): a read started before is dropped.
    epoch: u64,
}

impl ReadAhead {
    fn push(&mut self, recs: impl IntoIterator<Item = Record>) {
        for r in recs {
            self.bytes += r.body.len();
            self.records.push_back(r);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record at `seq`, if it is held (`records` is in sequence order).
    pub(super) fn find(&self, seq: u64) -> Option<&Record> {
        let i = self.records.binary_search_by_key(&seq, |r| r.seq).ok()?;
        self.records.get(i)
    }

    /// The first record held at or above `seq`, removed with those below it.
    pub(super) fn pop_from(&mut self, seq: u64) -> Option<Record> {
        while let Some(r) = self.records.pop_front() {
            self.bytes -= r.body.len();
            if r.seq >= seq {
                return Some(r);
            }
        }
        None
    }

    /// Asks for a read (the cursor reached the end of what is held).
    pub(super) fn want(&mut self) {
        self.wanted = true;
    }

    /// Drops what is held; a read under way is dropped when it arrives.
    pub(super) fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
        self.pos = None;
        self.wanted = false;
        self.epoch += 1;
    }

    /// A read failed with `error`: held for `/ping` until a read succeeds. Returns the
    /// pause before it is tried again, which doubles from 100 ms up to 5 s: a disk that
    /// keeps failing must not turn into a loop of reads and error lines.
    fn failed(&mut self, error: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.error = Some(error);
        Duration::from_millis(100 << (self.failures - 1).min(6)).min(Duration::from_secs(5))
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.error = None;
    }
}

impl Channel {
    /// Lets go of the bodies of deferred messages whose records the store has made
    /// readable since they were deferred; returns the body bytes let go. Cheap when
    /// there are none: the topic calls it as it trims its memory tail.
    pub fn drop_readable_bodies(&mut self) -> usize {
        self.deferred.drop_readable_bodies()
    }

    /// Adds records read back from the store (in sequence order, after those held).
    pub fn push_disk(&mut self, recs: impl IntoIterator<Item = Record>) {
        self.read_ahead.push(recs);
    }

    /// Body bytes read back from the store and held for delivery.
    pub fn disk_buffered_bytes(&self) -> usize {
        self.read_ahead.bytes
    }

    /// Records read back from the store and held for delivery.
    pub fn disk_buffered(&self) -> usize {
        self.read_ahead.records.len()
    }

    /// Drops what was read back from the store (the cursor jumped).
    pub fn clear_disk(&mut self) {
        self.read_ahead.clear();
    }

    /// True when the cursor is below the memory tail with nothing read back for it: a
    /// read is wanted.
    pub fn wants_disk(&self) -> bool {
        self.read_ahead.wanted
    }

    /// The last failed read's error while reads from the store keep failing.
    pub fn read_error(&self) -> Option<&str> {
        self.read_ahead.error.as_deref()
    }

    /// Counts each jump of the cursor (empty, seek): a read started before another
    /// jump is stale when it arrives.
    pub(crate) fn read_epoch(&self) -> u64 {
        self.read_ahead.epoch
    }

    /// True while a read for the cursor is under way (or waits for its retry).
    pub(crate) fn disk_read_pending(&self) -> bool {
        self.read_ahead.reading
    }

    /// True while a read for the messages ready again is under way (or waits for its
    /// retry).
    pub(crate) fn unread_read_pending(&self) -> bool {
        self.read_ahead.unread_reading
    }

    /// A read for the cursor ([`Channel::disk_read_from`]) starts: returns where the
    /// last one ended (a hint for the store) and the current [`Channel::read_epoch`].
    pub(crate) fn start_disk_read(&mut self) -> (Option<nsq_storage::ReadPos>, u64) {
        self.read_ahead.reading = true;
        (self.read_ahead.pos, self.read_ahead.epoch)
    }

    /// A read for the messages ready again ([`Channel::unread_read_from`]) starts (or
    /// waits to start again): returns the current [`Channel::read_epoch`].
    pub(crate) fn start_unread_read(&mut self) -> u64 {
        self.read_ahead.unread_reading = true;
        self.read_ahead.epoch
    }

    /// The read for the cursor is over (arrived, stale, or its retry is due).
    pub(crate) fn disk_read_done(&mut self) {
        self.read_ahead.reading = false;
    }

    /// The read for the messages ready again is over (arrived, stale, or its retry is
    /// due).
    pub(crate) fn unread_read_done(&mut self) {
        self.read_ahead.unread_reading = false;
    }

    /// The retry of a failed read for the cursor is due: a read is wanted again.
    pub(crate) fn disk_read_retry_due(&mut self) {
        self.read_ahead.reading = false;
        self.read_ahead.wanted = true;
    }

    /// A read from the store succeeded: the error reported for the channel goes.
    pub(crate) fn read_succeeded(&mut self) {
        self.read_ahead.succeeded();
    }

    /// Forgets the last read error (no read is wanted any more).
    pub(crate) fn clear_read_error(&mut self) {
        self.read_ahead.error = None;
    }

    /// A read from the store failed with `error` (the text `/ping` reports). Returns the
    /// pause before it is tried again: 100 ms, doubling with each failure in a row, at
    /// most 5 s.
    pub(crate) fn read_failed(&mut self, error: String) -> Duration {
        self.read_ahead.failed(error)
    }

    /// A failed read for the cursor waits for its retry (counted as under way, so that
    /// no other starts meanwhile).
    pub(crate) fn disk_read_waits_for_retry(&mut self) {
        self.read_ahead.wanted = false;
        self.read_ahead.reading = true;
    }

    /// Records read for the cursor arrived (`pos`: where the read ended).
    pub(crate) fn disk_read_arrived(
        &mut self,
        pos: Option<nsq_storage::ReadPos>,
        recs: impl IntoIterator<Item = Record>,
    ) {
        self.read_ahead.wanted = false;
        self.read_ahead.pos = pos;
        self.read_ahead.push(recs);
    }

    /// A read for the cursor at `from` found nothing below the memory tail at `base`:
    /// when nothing is held and the cursor has not passed `from`, those records are
    /// gone (corrupt or deleted) and the cursor continues from memory. Returns true
    /// when the cursor moved.
    pub(crate) fn disk_read_found_nothing(&mut self, from: u64, base: u64) -> bool {
        let skip = self.read_ahead.is_empty() && self.cursor <= from && from < base;
        if skip {
            self.cursor = base;
        }
        self.read_ahead.wanted = false;
        skip
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
        if self.read_ahead.reading || self.delivery_stopped() || self.cursor >= log_base {
            return None;
        }
        let room = self.room().min(DISK_READ_AHEAD.0);
        if room == 0 {
            return None;
        }
        if !self.read_ahead.wanted
            && (self.read_ahead.records.len() >= room || self.read_ahead.bytes >= DISK_READ_AHEAD.1)
        {
            return None;
        }
        let from = self
            .read_ahead
            .records
            .back()
            .map(|r| r.seq + 1)
            .unwrap_or(self.cursor)
            .max(self.cursor);
        let max = (room - self.read_ahead.records.len().min(room)).clamp(1, DISK_READ_BATCH.0);
        // Not a sliver per FIN: a read is worth making once a tenth of the room is free.
        if !self.read_ahead.wanted && !self.read_ahead.is_empty() && max < (room / 10).max(1) {
            return None;
        }
        (from < log_base).then_some((from, max))
    }

    /// The read that brings back the bodies of messages ready again below the memory
    /// tail (the ready queue's `unread`), if one should start now: none is under way and a client
    /// can take messages. Returns the first sequence and how many records to read: up
    /// to the last wanted one within the clients' room, at most [`DISK_READ_BATCH`].
    pub fn unread_read_from(&self, log_base: u64) -> Option<(u64, usize)> {
        if self.read_ahead.unread_reading || self.delivery_stopped() {
            return None;
        }
        let (&first, _) = self.ready.unread.range(..log_base).next()?;
        let room = self.room().min(DISK_READ_AHEAD.0);
        if room == 0 {
            return None;
        }
        let last = self
            .ready
            .unread
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

    /// Records read from the store at `from` for the ready queue's `unread` arrived: the wanted
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
            if let Some(attempts) = self.ready.unread.remove(&r.seq) {
                let mut msg = r.message();
                msg.attempts = attempts;
                msg.body = bytes::Bytes::copy_from_slice(&msg.body);
                self.ready.requeued.push_back(msg);
            }
        }
        // Nothing is covered when the store's readable end is below the read's start.
        let gone: Vec<u64> = self
            .ready
            .unread
            .range(from..covered_to.max(from))
            .map(|(&s, _)| s)
            .collect();
        for s in &gone {
            self.ready.unread.remove(s);
        }
        gone.len()
    }

    /// The lowest sequence of the messages ready again whose bodies come from the log
    /// (`unread`: a channel state taken over from a leader, or restored after a
    /// restart), if any. The memory tail keeps them while the store has not written
    /// them ([`crate::topic::Topic::trim`]): otherwise they wait for its write.
    pub fn lowest_unread(&self) -> Option<u64> {
        self.ready.unread.keys().next().copied()
    }

    /// True when the first message ready again below the memory tail waits for the
    /// store to make its record readable (at or above `readable`).
    pub fn unread_waits_for_store(&self, log_base: u64, readable: u64) -> bool {
        self.ready
            .unread
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
        if self.read_ahead.is_empty() || self.rdy_of_takers(false) > 0 {
            return 0;
        }
        let bytes = self.read_ahead.bytes;
        self.clear_disk();
        bytes
    }
}
