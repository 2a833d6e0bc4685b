//! A topic: an append-only log of records plus its channels (nsqd: topic.go).
//!
//! Each message is appended once (to memory and, for non-ephemeral topics, to the
//! topic's segment store); every channel reads the log through its own cursor. `pumped`
//! is nsqd's topic pump position: records below it have been handed to the channels that
//! existed at that moment; records at or above it wait in the topic (no channels yet, or
//! the topic is paused). A new channel starts at `pumped`, which gives the first channel
//! the whole backlog and later channels only new messages.
//!
//! Memory keeps the newest records (about `--mem-queue-size`, more while the store has
//! not flushed them); a channel whose cursor falls below the memory tail reads the older
//! records back from the store in batches.
//!
//! When records reach the store ([`StoreMode`]): with `--sync-every=1` (and with
//! retention, which must keep everything) each record is appended at publish, as before.
//! Otherwise the disk stays off the path of consumers that keep up: a record is handed to
//! the store once it is [`STORE_DELAY`] old, or once `--mem-queue-size` newer records
//! exist (memory stays bounded, as nsqd's memory queue spills to its disk queue), and it
//! is not written at all if every channel has finished it by then. nsqd writes only what
//! overflows its memory queue and loses all of that memory on a crash; here everything
//! unfinished reaches the disk within `STORE_DELAY` + `--sync-timeout` of its publish.

use crate::channel::Channel;
use crate::message::{
    instant_from_unix_nanos, unix_nanos_from_instant, IdGenerator, Message, MessageId,
};
use crate::names::is_ephemeral;
use bytes::Bytes;
use nsq_storage::{StoredRecord, TopicStore};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

mod replica;
pub use replica::{ReplicaRecord, ReplicaState, Restored, PAGE_RECORDS};

/// How old an unfinished record may get before it is handed to the store (under
/// [`StoreMode::Deferred`]). Records every channel finishes sooner are never written.
pub const STORE_DELAY: Duration = Duration::from_millis(100);

/// At most this many messages held in flight, requeued or deferred by a topic's channels
/// for `trim` to let finished records go at once (the check walks all of them).
const SKIP_INLINE_MAX: usize = 512;

/// When a durable topic's records are appended to its segment store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreMode {
    /// At publish: every record is written (`--sync-every=1`, or retention keeps
    /// consumed records for replay).
    Immediate,
    /// After [`STORE_DELAY`] or when `--mem-queue-size` newer records exist, and only
    /// if some channel has not finished it (the default sync policy).
    Deferred,
}

/// One published message as the topic holds it.
#[derive(Clone, Debug)]
pub struct Record {
    pub seq: u64,
    pub id: MessageId,
    pub timestamp: i64,
    /// DPUB / `/pub?defer=`: not deliverable before this instant.
    pub defer_until: Option<Instant>,
    pub body: Bytes,
}

impl Record {
    /// A fresh (attempts 0) message for a channel.
    pub fn message(&self) -> Message {
        Message {
            seq: self.seq,
            id: self.id,
            timestamp: self.timestamp,
            attempts: 0,
            body: self.body.clone(),
        }
    }

    pub fn from_stored(r: StoredRecord) -> Record {
        Record {
            seq: r.seq,
            id: MessageId(r.id),
            timestamp: r.timestamp,
            defer_until: (r.defer_until != 0).then(|| instant_from_unix_nanos(r.defer_until)),
            body: r.body,
        }
    }

    fn to_stored(&self) -> StoredRecord {
        StoredRecord {
            seq: self.seq,
            timestamp: self.timestamp,
            defer_until: self.defer_until.map(unix_nanos_from_instant).unwrap_or(0),
            id: self.id.0,
            attempts: 0,
            body: self.body.clone(),
        }
    }
}

/// The topic's log: sequences `[base, head)` are in memory (`None` for a sequence lost
/// to corruption); everything below `base` is on disk only.
#[derive(Default)]
///
/// Its fields are the crate's (the shard, the channels and recovery keep them
/// consistent); other crates read them through the accessors.
pub struct Log {
    records: VecDeque<Option<Record>>,
    /// Sequence of `records[0]`.
    pub(crate) base: u64,
    /// Sequence the next record gets.
    pub(crate) head: u64,
    /// Records below this were pumped to the channels.
    pub(crate) pumped: u64,
    /// Ranges `[from, to)` removed by topic empty: channels jump over them.
    pub(crate) holes: Vec<(u64, u64)>,
}

impl Log {
    /// Body bytes of the records held in memory.
    pub fn body_bytes(&self) -> usize {
        self.records.iter().flatten().map(|r| r.body.len()).sum()
    }

    /// Sequence of the oldest record in memory; everything below is on disk only.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Sequence the next record gets.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Records below this sequence were pumped to the channels.
    pub fn pumped(&self) -> u64 {
        self.pumped
    }

    /// Ranges `[from, to)` removed by topic empty: channels jump over them.
    pub fn holes(&self) -> &[(u64, u64)] {
        &self.holes
    }

    /// The in-memory record at `seq`: `None` when it is on disk only or gone.
    pub fn get(&self, seq: u64) -> Option<&Record> {
        seq.checked_sub(self.base)
            .and_then(|i| self.records.get(i as usize))
            .and_then(|r| r.as_ref())
    }

    /// The in-memory record whose ID is `id`: a binary search, since a topic's IDs grow
    /// with its sequence ([`IdGenerator`] never goes back); `None` slots are passed over.
    pub fn find_id(&self, id: MessageId) -> Option<&Record> {
        let (mut lo, mut hi) = (0usize, self.records.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let found = (mid..hi).find_map(|i| self.records.get(i)?.as_ref().map(|r| (i, r)));
            let Some((i, r)) = found else {
                hi = mid;
                continue;
            };
            match r.id.cmp(&id) {
                std::cmp::Ordering::Equal => return Some(r),
                std::cmp::Ordering::Less => lo = i + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }

    /// Where a cursor at `seq` continues when `seq` falls in a hole.
    pub fn skip_hole(&self, seq: u64) -> u64 {
        let mut s = seq;
        for &(from, to) in &self.holes {
            if s >= from && s < to {
                s = to;
            }
        }
        s
    }

    fn push(&mut self, r: Record) {
        self.records.push_back(Some(r));
        self.head += 1;
    }

    /// Starts the log at `base` with recovered records (gaps become `None`). When the
    /// gaps would outnumber the records (sequences finished before they were due to be
    /// written leave a gap up to `head`, as large as the traffic of the topic's life),
    /// the memory tail starts empty at `head` instead: the records stay readable from
    /// disk, and memory does not grow with the gap.
    pub fn restore(&mut self, base: u64, head: u64, tail: impl IntoIterator<Item = Record>) {
        let tail: Vec<Record> = tail.into_iter().filter(|r| r.seq >= base).collect();
        self.records.clear();
        let span = head.max(tail.last().map_or(base, |r| r.seq + 1)) - base;
        if span > (tail.len() as u64).saturating_mul(2).max(RESTORE_GAP_MAX) {
            self.base = head;
            self.head = head;
            return;
        }
        self.base = base;
        self.head = base;
        for r in tail {
            if r.seq < self.head {
                continue;
            }
            while self.head < r.seq {
                self.records.push_back(None);
                self.head += 1;
            }
            self.push(r);
        }
        while self.head < head {
            self.records.push_back(None);
            self.head += 1;
        }
    }

    fn trim_to(&mut self, seq: u64) {
        while self.base < seq && !self.records.is_empty() {
            self.records.pop_front();
            self.base += 1;
        }
        if self.records.is_empty() {
            self.base = self.base.max(seq.min(self.head));
        }
    }

    /// Records held in memory.
    pub fn in_memory(&self) -> usize {
        self.records.len()
    }
}

/// The most `None` slots [`Log::restore`] fills in below the recovered records' count.
const RESTORE_GAP_MAX: u64 = 1 << 16;

/// Why a publish was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    Exiting,
    /// The node drains (docs/draining.md): `draining`, the error text nsqd's draining
    /// topic gives (nsqd RFC nsqio/nsq#1302).
    Draining,
    /// A disk error (nsqd: E_PUB_FAILED ... with the error text).
    Disk(String),
    /// A replicated topic's publish did not reach its replicas as `--replication-ack`
    /// asks (no leader in time, leadership lost, the entry replaced): the text says why
    /// (docs/replication.md).
    Replication(String),
}

impl PublishError {
    /// nsqd's text after `E_PUB_FAILED <cmd> failed ` (`exiting`, or the disk error).
    pub fn text(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublishError::Exiting => f.write_str("exiting"),
            PublishError::Draining => f.write_str("draining"),
            PublishError::Disk(e) | PublishError::Replication(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for PublishError {}

/// A topic: its log, its channels, and its state grouped by concern (counters, the
/// segment store, the checkpoint's memo). `name`, the flags, `log` and `channels` are
/// open to the crate; the store and the checkpoint memo are changed through methods.
pub struct Topic {
    pub name: String,
    pub ephemeral: bool,
    pub paused: bool,
    /// Its channels record their changes (this member leads the replicated topic:
    /// `channel/changes.rs`); a channel made meanwhile records them from the start.
    pub tracks_changes: bool,
    /// Created while nsqlookupd is asked for the topic's channels (nsqd: GetTopic starts
    /// the topic's pump only after creating them): the pump waits, as when paused, until
    /// the answer (or its failure) releases it with this token. Not a paused flag: /stats
    /// and the metadata do not show it.
    pub held: Option<u64>,
    /// Delivery held on every channel while this member hands its leadership over
    /// (`Shard::hold_topic_deliveries`); a channel made meanwhile starts held too.
    pub deliveries_held: bool,
    pub log: Log,
    /// Sorted by name, as /stats lists them.
    pub channels: BTreeMap<String, Channel>,
    counters: TopicCounters,
    storage: TopicStorage,
    checkpoint: CheckpointMemo,
    ids: IdGenerator,
    /// Counts the changes the shard marks ([`crate::Shard::mark`]: publishes,
    /// deliveries, FINs, REQs, TOUCHes, timers, channel changes): unchanged, the
    /// channels' delivery state is what it was.
    changes: u64,
}

/// A topic's counters for `/stats` (nsqd: Topic.messageCount, messageBytes).
#[derive(Default)]
struct TopicCounters {
    /// Messages published (also those an `#ephemeral` topic with no reader dropped).
    message_count: u64,
    /// Body bytes published.
    message_bytes: u64,
}

/// A durable topic's segment store and how far the log has been handed to it (nsqd: a
/// topic's diskqueue backend).
struct TopicStorage {
    /// The segment store (non-ephemeral topics with storage on).
    store: Option<Rc<TopicStore>>,
    /// Records at or above this sequence are in the store, or in the memory tail until
    /// handed to it (see [`Channel::set_reread`]); `None` without a store.
    reread_from: Option<u64>,
    /// Why a durable topic has no store (its creation failed; retried at each publish,
    /// which is refused meanwhile).
    error: Option<String>,
    /// Records below this sequence were handed to the store or found finished by every
    /// channel (and so never written); the ones from here to the head exist only in
    /// memory, which must keep them.
    stored: u64,
    mode: StoreMode,
    /// How old an unfinished record gets before it is handed to the store under
    /// [`StoreMode::Deferred`]: [`STORE_DELAY`], or more on a replica that learns of
    /// its channels' FINs from its leader ([`Topic::set_store_delay`]).
    delay: Duration,
}

/// What the checkpoint remembers of a topic between runs.
#[derive(Default)]
struct CheckpointMemo {
    /// A digest of the metadata last written to the store's `meta.json` (a checkpoint
    /// skips the write when nothing changed; see [`crate::persist::meta_digest`]).
    written_digest: Option<u128>,
    /// That write was fsynced. An answer that waits for the metadata under the default
    /// policy writes it without a sync; the next checkpoint syncs it.
    synced: bool,
    /// In the shard's set of topics marked changed ([`crate::Shard::mark`]).
    marked: bool,
    /// The retained range as of the last checkpoint (only with `--retention-time` or
    /// `--retention-bytes`; see `Shard::checkpoint`).
    retained: Retained,
    /// Retention's memo of the newest publish time (Unix ns) in each sealed segment, by
    /// base sequence: a sealed segment never changes, so it is read once.
    segment_newest: BTreeMap<u64, i64>,
}

/// What a topic keeps for replay (`/stats`: `retained_*`), measured at each checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    /// Sequence of the oldest retained message (the head when none).
    pub oldest_seq: u64,
    /// Publish time (Unix ns) of the oldest retained message; 0 when none.
    pub oldest_timestamp: i64,
    /// Messages from the oldest retained one to the newest.
    pub messages: u64,
    /// Bytes of the topic's segment files.
    pub bytes: u64,
}

impl Topic {
    pub fn new(name: &str, node_id: u16) -> Topic {
        Topic {
            name: name.to_string(),
            ephemeral: is_ephemeral(name),
            paused: false,
            tracks_changes: false,
            deliveries_held: false,
            held: None,
            log: Log::default(),
            channels: BTreeMap::new(),
            counters: TopicCounters::default(),
            storage: TopicStorage {
                store: None,
                reread_from: None,
                error: None,
                stored: 0,
                mode: StoreMode::Immediate,
                delay: STORE_DELAY,
            },
            checkpoint: CheckpointMemo::default(),
            ids: IdGenerator::new(node_id),
            changes: 0,
        }
    }

    /// Makes records wait `delay` (instead of [`STORE_DELAY`]) before they are handed to
    /// the store under [`StoreMode::Deferred`]. A replica whose channels' positions come
    /// from its leader at intervals waits that much longer, so that what the leader's
    /// consumers finished in time is not written there either.
    pub fn set_store_delay(&mut self, delay: Duration) {
        self.storage.delay = delay;
    }

    /// The publish time (Unix ns) at or before which an unfinished record is due for
    /// the store now (see [`Topic::set_store_delay`]).
    pub fn store_cutoff(&self) -> i64 {
        let delay = i64::try_from(self.storage.delay.as_nanos()).unwrap_or(i64::MAX);
        crate::message::now_unix_nanos().saturating_sub(delay)
    }

    /// How many changes the shard marked on the topic so far (wrapping): the same
    /// number twice means its channels' delivery state did not change in between.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub(crate) fn count_change(&mut self) {
        self.changes = self.changes.wrapping_add(1);
    }

    /// Messages published (stats `message_count`).
    pub fn message_count(&self) -> u64 {
        self.counters.message_count
    }

    /// Body bytes published (stats `message_bytes`).
    pub fn message_bytes(&self) -> u64 {
        self.counters.message_bytes
    }

    /// The segment store (non-ephemeral topics with storage on).
    pub fn store(&self) -> Option<&Rc<TopicStore>> {
        self.storage.store.as_ref()
    }

    /// Why this durable topic has no store, while it has none.
    pub fn store_error(&self) -> Option<&str> {
        self.storage.error.as_deref()
    }

    /// The store could not be created: publishes are refused until a retry succeeds.
    pub(crate) fn set_store_error(&mut self, error: String) {
        self.storage.error = Some(error);
    }

    /// Clears the store's creation error; returns whether there was one.
    pub(crate) fn take_store_error(&mut self) -> bool {
        self.storage.error.take().is_some()
    }

    /// Records below this sequence were handed to the store or finished by every
    /// channel; the ones from here to the head exist only in memory.
    pub fn stored(&self) -> u64 {
        self.storage.stored
    }

    pub(crate) fn set_stored(&mut self, seq: u64) {
        self.storage.stored = seq;
    }

    pub(crate) fn set_store_mode(&mut self, mode: StoreMode) {
        self.storage.mode = mode;
    }

    /// The store and the sequence from which it holds every record, for a channel's
    /// deferred messages (see [`Channel::set_reread`]).
    pub(crate) fn reread(&self) -> Option<(u64, Rc<TopicStore>)> {
        self.storage.reread_from.zip(self.storage.store.clone())
    }

    /// Gives the topic its store, which holds every record from `reread_from` on; the
    /// channels read their deferred messages' bodies back from it.
    pub(crate) fn attach_store(&mut self, store: Rc<TopicStore>, reread_from: u64) {
        self.storage.store = Some(store);
        self.storage.reread_from = Some(reread_from);
        let reread = self.reread();
        for ch in self.channels.values_mut() {
            ch.set_reread(reread.clone());
        }
    }

    /// The digest of the metadata last written (see [`crate::persist::meta_digest`]).
    pub(crate) fn written_digest(&self) -> Option<u128> {
        self.checkpoint.written_digest
    }

    /// Notes the metadata written, fsynced or not (`synced`).
    pub(crate) fn set_written_digest(&mut self, digest: u128, synced: bool) {
        self.checkpoint.written_digest = Some(digest);
        self.checkpoint.synced = synced;
    }

    /// The metadata last written is fsynced.
    pub(crate) fn meta_synced(&self) -> bool {
        self.checkpoint.synced
    }

    /// The metadata last written has been fsynced since.
    pub(crate) fn set_meta_synced(&mut self) {
        self.checkpoint.synced = true;
    }

    /// Marks the topic changed for the next checkpoint; returns true when it was not
    /// marked yet (then the shard adds it to its set of changed topics).
    pub(crate) fn mark_changed(&mut self) -> bool {
        !std::mem::replace(&mut self.checkpoint.marked, true)
    }

    /// The checkpoint took the topic: its next change marks it again.
    pub(crate) fn clear_changed(&mut self) {
        self.checkpoint.marked = false;
    }

    /// The retained range as of the last checkpoint (with retention only).
    pub fn retained(&self) -> Retained {
        self.checkpoint.retained
    }

    pub(crate) fn set_retained(&mut self, retained: Retained) {
        self.checkpoint.retained = retained;
    }

    /// The remembered newest publish time (Unix ns) of the sealed segment at `base`.
    pub(crate) fn segment_newest(&self, base: u64) -> Option<i64> {
        self.checkpoint.segment_newest.get(&base).copied()
    }

    pub(crate) fn remember_segment_newest(&mut self, base: u64, ts: i64) {
        self.checkpoint.segment_newest.insert(base, ts);
    }

    /// Forgets the segments below `cut` (deleted by retention).
    pub(crate) fn forget_segments_below(&mut self, cut: u64) {
        let memo = &mut self.checkpoint.segment_newest;
        *memo = memo.split_off(&cut);
    }

    /// Messages waiting in the topic itself (not yet pumped to channels).
    pub fn depth(&self) -> u64 {
        let holes: u64 = self
            .log
            .holes
            .iter()
            .map(|&(f, t)| t.min(self.log.head).saturating_sub(f.max(self.log.pumped)))
            .sum();
        (self.log.head - self.log.pumped).saturating_sub(holes)
    }

    /// Of `depth`, the messages only on disk.
    pub fn backend_depth(&self) -> u64 {
        self.log
            .base
            .saturating_sub(self.log.pumped)
            .min(self.depth())
    }

    /// Appends messages (nsqd PutMessages) to memory and to the store. A message deferred
    /// into the future goes straight to the deferred heap of every channel that has read
    /// everything before it, as nsqd's pump does. An #ephemeral topic with no reader
    /// drops what exceeds `mem_queue_size`. Returns (accepted, sequence after the last).
    pub fn publish(
        &mut self,
        bodies: impl IntoIterator<Item = Bytes>,
        defer_until: Option<Instant>,
        mem_queue_size: u64,
    ) -> (u64, u64) {
        let timestamp = crate::message::now_unix_nanos();
        let mut n = 0;
        for body in bodies {
            let id = self.ids.next_id();
            n += self.push_published(id, timestamp, defer_until, body, mem_queue_size);
        }
        self.published(mem_queue_size);
        (n, self.log.head)
    }

    /// Appends messages a replicated topic's leader gave their IDs and timestamps
    /// (docs/replication.md), as [`Topic::publish`] does; a message whose ID is not above
    /// the newest this topic holds is skipped (a replica replaying entries it already
    /// applied before a restart). Returns (appended, log head).
    pub fn append_replicated(
        &mut self,
        messages: impl IntoIterator<Item = (MessageId, i64, Option<Instant>, Bytes)>,
        mem_queue_size: u64,
    ) -> (u64, u64) {
        let mut n = 0;
        for (id, timestamp, defer_until, body) in messages {
            if self.ids.last().is_some_and(|last| id.0 <= last.0) {
                continue;
            }
            self.ids.resume_after(id);
            n += self.push_published(id, timestamp, defer_until, body, mem_queue_size);
        }
        self.published(mem_queue_size);
        (n, self.log.head)
    }

    /// The newest message ID this topic gave or holds (`None`: none yet).
    pub fn last_id(&self) -> Option<MessageId> {
        self.ids.last()
    }

    /// One published message into the log (0 when an ephemeral topic without channels
    /// drops it at `--mem-queue-size`, else 1).
    fn push_published(
        &mut self,
        id: MessageId,
        timestamp: i64,
        defer_until: Option<Instant>,
        body: Bytes,
        mem_queue_size: u64,
    ) -> u64 {
        self.counters.message_count += 1;
        self.counters.message_bytes += body.len() as u64;
        if self.ephemeral && self.channels.is_empty() && self.depth() >= mem_queue_size {
            return 0;
        }
        let rec = Record {
            seq: self.log.head,
            id,
            timestamp,
            defer_until,
            body,
        };
        if let (Some(store), StoreMode::Immediate) = (&self.storage.store, self.storage.mode) {
            store.append(&rec.to_stored());
        }
        self.log.push(rec);
        1
    }

    /// After a batch of [`Topic::push_published`]: the store mark and the pump.
    fn published(&mut self, mem_queue_size: u64) {
        if self.storage.store.is_none() || self.storage.mode == StoreMode::Immediate {
            self.storage.stored = self.log.head;
        }
        self.pump(mem_queue_size);
    }

    /// After recovery: new message IDs follow `last`, the newest recovered one (see
    /// [`IdGenerator::resume_after`]).
    pub fn resume_ids_after(&mut self, last: MessageId) {
        self.ids.resume_after(last);
    }

    /// Moves the pump position to the head when the topic has channels and is neither
    /// paused nor held, counting the messages into each channel.
    pub fn pump(&mut self, mem_queue_size: u64) {
        if self.paused || self.held.is_some() || self.channels.is_empty() {
            return;
        }
        let n = self.depth();
        if self.log.head == self.log.pumped {
            return;
        }
        let from = self.log.pumped;
        self.log.pumped = self.log.head;
        // A record deferred into the future goes to each channel's deferred heap as it
        // is pumped (nsqd's topic messagePump: PutMessageDeferred), also when the channel
        // came after the DPUB: it counts as deferred, not as depth. (A record no longer
        // in memory moves there when the channel reads it.)
        let now = Instant::now();
        for seq in from..self.log.head {
            let Some(rec) = self.log.get(seq) else {
                continue;
            };
            if let Some(due) = rec.defer_until.filter(|d| *d > now) {
                let msg = rec.message();
                for ch in self.channels.values_mut() {
                    ch.defer_published(msg.clone(), due);
                }
            }
        }
        for ch in self.channels.values_mut() {
            ch.count_pumped(n);
            if ch.is_ephemeral() {
                ch.drop_overflow(&self.log, mem_queue_size);
            }
        }
        self.trim(mem_queue_size);
    }

    /// The lowest sequence some channel (or the topic's own backlog) still needs.
    pub fn low_watermark(&self) -> u64 {
        let mut low = self.log.pumped;
        for ch in self.channels.values() {
            low = low.min(ch.low_watermark());
        }
        low
    }

    /// Frees memory: records every channel has read go; with a store, the memory tail is
    /// also cut to `mem_queue_size` records once they are readable from disk. Records not
    /// yet handed to the store always stay. Deferred messages let go of their bodies
    /// once the store can give them back ([`Channel::drop_readable_bodies`]).
    pub fn trim(&mut self, mem_queue_size: u64) {
        if self.storage.store.is_some() && self.storage.stored < self.log.head {
            // Let finished records go now rather than at the store task's next tick, when
            // that is cheap (few messages held by the channels): large messages then stay
            // in memory, and in the CPU caches, no longer than an #ephemeral topic keeps
            // them.
            let held: usize = self.channels.values().map(|c| c.pending_count()).sum();
            if held <= SKIP_INLINE_MAX {
                self.skip_finished();
            }
        }
        // Messages ready again whose bodies come from the log count as unread: their
        // records stay in memory until the store can give them back (a channel state
        // taken over from a leader holds them below its cursor; read back before the
        // store wrote them, they would wait for its write).
        let mut low = self.log.pumped;
        for ch in self.channels.values() {
            low = low.min(ch.cursor());
            if let Some(seq) = ch.lowest_unread() {
                low = low.min(seq);
            }
        }
        let mut to = low;
        if let Some(store) = &self.storage.store {
            let keep_from = self.log.head.saturating_sub(mem_queue_size);
            // Below `stored`, a record is either on disk or finished everywhere; once the
            // store has flushed all it was given, all of that may leave memory.
            let on_disk = if store.readable_seq() >= store.next_seq() {
                self.storage.stored
            } else {
                store.readable_seq()
            };
            to = to.max(keep_from.min(on_disk)).min(self.storage.stored);
        }
        self.log.trim_to(to);
        // Deferred messages let go of their bodies once the store can give them back.
        let mut freed = 0;
        for ch in self.channels.values_mut() {
            freed += ch.drop_readable_bodies();
        }
        crate::memory_freed(freed);
    }

    /// The oldest sequence a channel can seek to: the oldest record still on disk or
    /// in memory.
    pub fn oldest_retained(&self) -> u64 {
        let disk = self.storage.store.as_ref().and_then(|s| s.first_seq());
        disk.unwrap_or(self.log.base).min(self.log.base)
    }

    /// The first in-memory sequence whose record was published at or after `ts_ns`
    /// (Unix ns): `Ok(seq)`; `Err(first)` when even the oldest in-memory record (at
    /// `first`, the memory tail) is that recent, so older ones must be looked for on
    /// disk; `Ok(head)` when every record in memory is older.
    pub fn seek_in_memory(&self, ts_ns: i64) -> Result<u64, u64> {
        let mut first = true;
        for (i, r) in self.log.records.iter().enumerate() {
            let Some(r) = r else { continue };
            if r.timestamp >= ts_ns {
                let seq = self.log.base + i as u64;
                return if first { Err(seq) } else { Ok(seq) };
            }
            first = false;
        }
        if first {
            Err(self.log.head)
        } else {
            Ok(self.log.head)
        }
    }

    /// Moves `stored` over the records every channel has already finished (below every
    /// cursor and held by none): they will never be written, so memory may let them go
    /// at once instead of after [`STORE_DELAY`] (large messages would otherwise pin
    /// `STORE_DELAY` worth of traffic in memory).
    pub fn skip_finished(&mut self) {
        let mut unread_from = self.log.pumped;
        for ch in self.channels.values() {
            unread_from = unread_from.min(ch.cursor());
        }
        let from = self.storage.stored;
        if from >= unread_from {
            return;
        }
        let mut first_pending = unread_from;
        for ch in self.channels.values() {
            ch.pending_seqs_in(from..first_pending, |seq| {
                first_pending = first_pending.min(seq);
            });
        }
        self.storage.stored = first_pending;
    }

    /// Hands records to the store (under [`StoreMode::Deferred`]): every record published
    /// at or before `cutoff_ns` (Unix ns), every record older than the newest
    /// `mem_queue_size`, and with `all` every record. A record every channel has finished
    /// (below all cursors and not in flight, requeued or deferred anywhere) is not
    /// written. Returns true while records are left for later.
    pub fn store_pump(&mut self, cutoff_ns: i64, mem_queue_size: u64, all: bool) -> bool {
        let head = self.log.head;
        let Some(store) = self.storage.store.clone() else {
            self.storage.stored = head;
            return false;
        };
        if self.storage.stored >= head {
            return false;
        }
        let force_to = if all {
            head
        } else {
            head.saturating_sub(mem_queue_size)
        };
        let mut upto = self.storage.stored.max(force_to);
        while upto < head {
            match self.log.get(upto) {
                Some(r) if r.timestamp > cutoff_ns => break,
                _ => upto += 1,
            }
        }
        if upto <= self.storage.stored {
            return true;
        }
        // Records at or above the lowest cursor (or not yet pumped) are unread somewhere.
        let mut unread_from = self.log.pumped;
        for ch in self.channels.values() {
            unread_from = unread_from.min(ch.cursor());
        }
        // Below it, only what some channel holds in flight, requeued or deferred.
        let mut pending: Vec<u64> = Vec::new();
        if self.storage.stored < unread_from {
            let range = self.storage.stored..unread_from.min(upto);
            for ch in self.channels.values() {
                ch.pending_seqs_in(range.clone(), |seq| pending.push(seq));
            }
            pending.sort_unstable();
        }
        for seq in self.storage.stored..upto {
            if seq < unread_from && pending.binary_search(&seq).is_err() {
                continue;
            }
            if let Some(r) = self.log.get(seq) {
                store.append(&r.to_stored());
            }
        }
        self.storage.stored = upto;
        upto < head
    }

    /// Adds a channel (no-op if present). It starts reading at the pump position.
    pub fn create_channel(&mut self, name: &str, mem_queue_size: u64) -> bool {
        self.create_channel_with(name, mem_queue_size, 0)
    }

    /// [`Topic::create_channel`] with `--max-attempts` (0 = unlimited; see
    /// [`Channel::set_max_attempts_flag`]).
    pub fn create_channel_with(
        &mut self,
        name: &str,
        mem_queue_size: u64,
        max_attempts: u16,
    ) -> bool {
        if self.channels.contains_key(name) {
            return false;
        }
        let mut ch = Channel::new(name, self.log.pumped);
        ch.set_max_attempts_flag(&self.name, max_attempts);
        if ch.is_ephemeral() {
            ch.set_mem_queue_size(mem_queue_size);
        } else {
            ch.set_journal(self.storage.store.clone());
        }
        ch.set_reread(self.reread());
        ch.track_changes(self.tracks_changes);
        ch.set_held(self.deliveries_held);
        self.channels.insert(name.to_string(), ch);
        self.pump(mem_queue_size);
        true
    }

    /// nsqd topic Empty: drops what waits in the topic (not yet pumped); channels keep
    /// what they already received.
    pub fn empty(&mut self) {
        let (from, to) = (self.log.pumped, self.log.head);
        if from < to {
            if self.storage.store.is_some() {
                self.log.holes.push((from, to));
                self.log.pumped = to;
                let keep = (from.saturating_sub(self.log.base)) as usize;
                for r in self.log.records.iter_mut().skip(keep) {
                    *r = None;
                }
            } else {
                let keep = (from - self.log.base) as usize;
                self.log.records.truncate(keep);
                self.log.head = from;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, timestamp: i64) -> Record {
        Record {
            seq,
            id: MessageId(seq),
            timestamp,
            defer_until: None,
            body: Bytes::from(format!("m{seq}")),
        }
    }

    /// Memory holds sequences 10..20 (15 lost), published at 100 + 10 * (seq - 10).
    fn topic() -> Topic {
        let mut t = Topic::new("t", 0);
        let recs = (10..20)
            .filter(|s| *s != 15)
            .map(|s| rec(s, 100 + 10 * (s as i64 - 10)));
        t.log.restore(10, 20, recs);
        t.log.pumped = 20;
        t
    }

    #[test]
    fn restore_keeps_memory_to_the_records_not_the_gap_before_the_head() {
        // One record on disk at 0, 30 M sequences finished before they were written.
        let mut log = Log::default();
        log.restore(0, 30_000_000, [rec(0, 1)]);
        assert_eq!(log.in_memory(), 0, "the gap is not filled with slots");
        assert_eq!((log.base(), log.head()), (30_000_000, 30_000_000));
        assert!(log.get(0).is_none(), "read from disk instead");
        // A small gap keeps the records in memory.
        let mut log = Log::default();
        log.restore(5, 100, (5..50).map(|s| rec(s, 1)));
        assert_eq!((log.base(), log.head(), log.in_memory()), (5, 100, 95));
        assert_eq!(log.get(7).map(|r| r.seq), Some(7));
        log.push(rec(100, 1));
        assert_eq!(log.get(100).map(|r| r.seq), Some(100));
    }

    #[test]
    fn find_id_searches_the_memory_tail_past_lost_records() {
        let t = topic();
        for seq in (10..20).filter(|s| *s != 15) {
            assert_eq!(t.log.find_id(MessageId(seq)).map(|r| r.seq), Some(seq));
        }
        for id in [0, 9, 15, 20, u64::MAX] {
            assert!(t.log.find_id(MessageId(id)).is_none(), "{id}");
        }
        assert!(Log::default().find_id(MessageId(1)).is_none());
    }

    #[test]
    fn seek_in_memory_finds_the_first_record_at_or_after() {
        let t = topic();
        // Older than or exactly the memory tail: maybe more on disk.
        assert_eq!(t.seek_in_memory(0), Err(10));
        assert_eq!(t.seek_in_memory(100), Err(10));
        assert_eq!(t.seek_in_memory(101), Ok(11));
        assert_eq!(t.seek_in_memory(120), Ok(12));
        // 15 is gone: the next one.
        assert_eq!(t.seek_in_memory(145), Ok(16));
        assert_eq!(t.seek_in_memory(190), Ok(19));
        // Newer than everything: the head.
        assert_eq!(t.seek_in_memory(191), Ok(20));
        assert_eq!(Topic::new("e", 0).seek_in_memory(5), Err(0), "empty log");
        assert_eq!(t.oldest_retained(), 10, "no store: the memory tail");
    }

    #[test]
    fn the_store_cutoff_follows_the_topics_store_delay() {
        let mut t = Topic::new("d", 0);
        let ms = |d: i64| d * 1_000_000;
        let age = |t: &Topic| {
            let cutoff = t.store_cutoff();
            crate::message::now_unix_nanos() - cutoff
        };
        // STORE_DELAY by default: a record becomes due 100 ms after its publish.
        let a = age(&t);
        assert!((ms(100)..ms(150)).contains(&a), "{a}");
        t.set_store_delay(Duration::from_millis(250));
        let a = age(&t);
        assert!((ms(250)..ms(300)).contains(&a), "{a}");
        t.set_store_delay(STORE_DELAY);
        let a = age(&t);
        assert!((ms(100)..ms(150)).contains(&a), "{a}");
    }

    #[test]
    fn held_topic_pumps_only_when_released() {
        let mut t = Topic::new("h", 0);
        t.held = Some(7);
        t.publish([Bytes::from_static(b"a")], None, 100);
        // A channel created while held (a SUB) waits with the others.
        t.create_channel("sub", 100);
        assert_eq!((t.depth(), t.log.pumped), (1, 0));
        t.create_channel("c1", 100);
        t.create_channel("c2", 100);
        assert_eq!(t.channels["c1"].depth(&t.log), 0);
        t.held = None;
        t.pump(100);
        assert_eq!(t.depth(), 0);
        for c in ["sub", "c1", "c2"] {
            assert_eq!(t.channels[c].depth(&t.log), 1, "{c}");
        }
    }
}
