//! A channel: a cursor into its topic's log plus the requeue queue, the in-flight table
//! and heap (by timeout) and the deferred heap (by due time) (nsqd: channel.go,
//! in_flight_pqueue.go, protocol_v2.go messagePump).

use crate::client::{Client, ClientState};
use crate::message::{unix_nanos_from_instant, Message, MessageId};
use crate::names::is_ephemeral;
use crate::topic::{Log, Record};
use nsq_storage::journal::EventKind;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Hashes message IDs (already unique integers) with one multiply.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<MessageId, V, BuildHasherDefault<IdHasher>>;

/// A message delivered and not yet finished.
pub struct InFlight {
    pub msg: Message,
    pub client: Rc<Client>,
    pub deadline: Instant,
    pub delivered_at: Instant,
}

/// A message waiting for its due time: 32 bytes. Its body is not here: it stays in the
/// topic's log (memory tail or store) and is read back when the message falls due
/// (a channel's `ready_unread`), or, where the log cannot give it back (a topic without
/// a store), in the channel's `deferred_bodies`.
#[derive(Clone, Copy, Debug)]
pub struct Deferred {
    pub due: Instant,
    /// The message's record in the topic's log.
    pub seq: u64,
    /// Deliveries so far (kept across the deferral, as nsqd keeps a REQ'd message's).
    pub attempts: u16,
}

impl PartialEq for Deferred {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.seq == o.seq
    }
}
impl Eq for Deferred {}
impl PartialOrd for Deferred {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Deferred {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

/// Why FIN, REQ or TOUCH failed (non-fatal; nsqd's E_FIN_FAILED etc.).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightError {
    /// `ID not in flight`
    NotInFlight,
    /// `client does not own message`
    NotOwner,
}

impl InFlightError {
    /// nsqd's text after `E_FIN_FAILED FIN <id> failed ` (and REQ's, TOUCH's).
    pub fn text(self) -> &'static str {
        match self {
            InFlightError::NotInFlight => "ID not in flight",
            InFlightError::NotOwner => "client does not own message",
        }
    }
}

impl std::fmt::Display for InFlightError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl std::error::Error for InFlightError {}

/// A channel already has `--max-channel-consumers` clients (`max`): a SUB is refused
/// (nsqd: channel.AddClient; the shard words it as
/// [`SubError::TooManyConsumers`](crate::shard::SubError::TooManyConsumers)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerLimit {
    pub max: usize,
}

impl std::fmt::Display for ConsumerLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exceeds limit of {}", self.max)
    }
}

impl std::error::Error for ConsumerLimit {}

/// The delay of `REQ <id> <timeout_ms>`: `timeout_ms` clamped to [0, `max`]
/// (`--max-req-timeout`), with `true` when it was out of range. nsqd clamps with no
/// error and only logs (nsqd: protocol_v2.go REQ); the caller logs the original value.
pub fn clamp_req_timeout(timeout_ms: i64, max: Duration) -> (Duration, bool) {
    if timeout_ms < 0 {
        return (Duration::ZERO, true);
    }
    let delay = Duration::from_millis(timeout_ms as u64);
    if delay > max {
        (max, true)
    } else {
        (delay, false)
    }
}

/// Read ahead from the store while fewer than this many records, or bytes of bodies,
/// are buffered for a lagging channel, and never more records than its clients can take
/// now ([`Channel::room`]): a channel without a ready client holds no read-ahead.
pub const DISK_READ_AHEAD: (usize, usize) = (16384, 4 << 20);

/// Records, and bytes of bodies, read from the store at once.
pub const DISK_READ_BATCH: (usize, usize) = (8192, 2 << 20);

/// One channel of a topic. Its fields are the crate's: outside it, read them through the
/// accessors and change them through the operations (`dispatch`, `finish`, `requeue`,
/// `touch`, `process_timers`, `empty`, `seek`, ...), each of which takes the time as
/// `now` and does no I/O beyond journaling (durable channels).
pub struct Channel {
    pub(crate) name: String,
    pub(crate) ephemeral: bool,
    pub(crate) paused: bool,
    /// Next log sequence this channel reads.
    pub(crate) cursor: u64,
    /// Messages ready again (REQ 0, timeouts, due deferred): delivered before the cursor
    /// moves on.
    pub(crate) requeued: VecDeque<Message>,
    pub(crate) in_flight: IdMap<InFlight>,
    /// (deadline, id); entries whose message was finished or touched are skipped when
    /// popped and compacted away when they outnumber the live ones.
    in_flight_heap: BinaryHeap<Reverse<(Instant, MessageId)>>,
    pub(crate) deferred: BinaryHeap<Reverse<Deferred>>,
    /// Bodies of deferred messages whose records cannot be read back from the topic's
    /// store (yet): the topic has no store, the record predates it, or it is not written
    /// yet (see `reread`), by sequence. [`Channel::drop_readable_bodies`] lets go of
    /// those the store has made readable since.
    pub(crate) deferred_bodies: BTreeMap<u64, Message>,
    /// The topic's store, and the sequence from which it holds every record: a record
    /// at or above it and below the store's readable point can be read back for as long
    /// as this channel holds it unfinished (the store writes what a channel holds and
    /// retention keeps it: it counts toward the low watermark), so a deferred or
    /// recovered message of such a record holds no body. `None`: the topic has no store.
    pub(crate) reread: Option<(u64, Rc<nsq_storage::TopicStore>)>,
    /// Messages ready again whose bodies are still in the log (a deferred message that
    /// fell due, a requeued one recovered after a restart): sequence -> attempts. Part
    /// of depth; delivered after `requeued`, from the memory tail or, below it, once a
    /// read from the store brings them back (`unread_read_from`, `unread_arrived`).
    pub(crate) ready_unread: BTreeMap<u64, u16>,
    /// A read from the store for `ready_unread` is under way.
    pub(crate) unread_inflight: bool,
    pub(crate) clients: Vec<Rc<Client>>,
    next_client: usize,
    pub(crate) message_count: u64,
    pub(crate) requeue_count: u64,
    pub(crate) timeout_count: u64,
    /// Records read back from the store for a cursor below the memory tail.
    pub(crate) disk: VecDeque<Record>,
    /// The cursor is below the memory tail and `disk` is empty: a read is wanted.
    pub(crate) wants_disk: bool,
    /// A read from the store is under way (or a failed one waits for its retry).
    pub(crate) disk_inflight: bool,
    /// Reads from the store that failed in a row (the retry backs off: 100 ms, doubling,
    /// at most 5 s).
    pub(crate) disk_failures: u32,
    /// The last failed read's error while reads keep failing, for the shard's health
    /// (`/ping` answers it until a read succeeds or the channel is gone).
    pub(crate) disk_error: Option<String>,
    /// Body bytes held in `disk`.
    pub(crate) disk_bytes: usize,
    /// Where the last read from the store ended (the next sequential read starts there).
    pub(crate) disk_pos: Option<nsq_storage::ReadPos>,
    /// Bumped whenever the cursor jumps (empty, seek): a read started before is dropped.
    pub(crate) disk_epoch: u64,
    /// Sequences at or above the cursor already handed to this channel's deferred heap
    /// when they were published (nsqd gives a DPUB to each channel at once); the cursor
    /// steps over them.
    pub(crate) skip: crate::seqset::SeqSet,
    /// The earliest instant this channel is registered at in its shard's timer queue
    /// (crate::timers), if any.
    timer_scheduled: Option<Instant>,
    /// FIN latencies when `--e2e-processing-latency-percentile` is set (nsqd:
    /// e2eProcessingLatencyStream); created by the shard on the first FIN.
    pub(crate) e2e: Option<crate::quantile::Quantile>,
    /// The topic's store, for journaling requeues, redeliveries and their FINs, so that
    /// attempts and requeue delays survive a crash (durable channels only).
    pub(crate) journal: Option<Rc<nsq_storage::TopicStore>>,
    /// Recovery sets this to the topic's head: messages below it may have been delivered
    /// before the restart (everything between the checkpointed cursor and the head, and
    /// the checkpoint's pending ones), so their FIN is journaled even after a single
    /// delivery (see [`Channel::finish`]). The first checkpoint after the restart
    /// covers those FINs and sets it back to 0 (as for a channel that was not
    /// recovered), so this costs one event per FIN only until then.
    pub(crate) recovered_below: u64,
    /// `#ephemeral` channels: `--mem-queue-size`, the most ready messages it keeps, and
    /// the topic's pumped head as of the last pump (to count ready messages without the
    /// log). A message that comes back (REQ, timeout, a deferred one falling due) to a
    /// full one is dropped, as nsqd's channel.put drops it into a dummy backend.
    pub(crate) ephemeral_cap: Option<u64>,
    pumped_seen: u64,
}

impl Channel {
    pub fn new(name: &str, cursor: u64) -> Channel {
        Channel {
            name: name.to_string(),
            ephemeral: is_ephemeral(name),
            ephemeral_cap: None,
            pumped_seen: cursor,
            paused: false,
            cursor,
            requeued: VecDeque::new(),
            in_flight: IdMap::default(),
            in_flight_heap: BinaryHeap::new(),
            deferred: BinaryHeap::new(),
            deferred_bodies: BTreeMap::new(),
            reread: None,
            ready_unread: BTreeMap::new(),
            unread_inflight: false,
            clients: Vec::new(),
            next_client: 0,
            message_count: 0,
            requeue_count: 0,
            timeout_count: 0,
            disk: VecDeque::new(),
            wants_disk: false,
            disk_inflight: false,
            disk_failures: 0,
            disk_error: None,
            disk_bytes: 0,
            disk_pos: None,
            disk_epoch: 0,
            skip: crate::seqset::SeqSet::new(),
            timer_scheduled: None,
            e2e: None,
            journal: None,
            recovered_below: 0,
        }
    }

    /// The channel's name (with its `#ephemeral` suffix, if any).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for an `#ephemeral` channel (never persisted; overflow beyond
    /// `--mem-queue-size` dropped).
    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral
    }

    /// True while the channel is paused (no delivery; nsqd: Channel.IsPaused).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Pauses or unpauses delivery. Unpausing does not deliver by itself: call `dispatch`.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    /// The next log sequence this channel reads.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Messages delivered and not yet finished, requeued or timed out (`in_flight_count`).
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// The in-flight message `id`, if it is in flight.
    pub fn in_flight(&self, id: MessageId) -> Option<&InFlight> {
        self.in_flight.get(&id)
    }

    /// Messages waiting for their due time (`deferred_count`).
    pub fn deferred_count(&self) -> usize {
        self.deferred.len()
    }

    /// Messages ready again (REQ 0, timed out, due deferred) and not yet redelivered;
    /// part of `depth`.
    pub fn requeued_count(&self) -> usize {
        self.requeued.len() + self.ready_unread.len()
    }

    /// The subscribed clients, in the order delivery goes round.
    pub fn clients(&self) -> &[Rc<Client>] {
        &self.clients
    }

    /// Messages the topic handed to this channel (stats `message_count`; requeues and
    /// timeouts do not add to it).
    pub fn message_count(&self) -> u64 {
        self.message_count
    }

    /// REQs, delayed or not (stats `requeue_count`).
    pub fn requeue_count(&self) -> u64 {
        self.requeue_count
    }

    /// In-flight messages that timed out (stats `timeout_count`).
    pub fn timeout_count(&self) -> u64 {
        self.timeout_count
    }

    /// FIN latencies, when `--e2e-processing-latency-percentile` is set and a FIN came.
    pub fn e2e(&self) -> Option<&crate::quantile::Quantile> {
        self.e2e.as_ref()
    }

    /// Journals an event of this channel when it is durable.
    fn journal(&self, kind: EventKind, msg: &Message, due_unix_ns: i64) {
        if let Some(st) = &self.journal {
            st.journal(kind, &self.name, msg.seq, msg.attempts, due_unix_ns);
        }
    }

    /// Messages ready for delivery: unread pumped records plus requeued ones (nsqd
    /// depth; in-flight and deferred are not counted).
    pub fn depth(&self, log: &Log) -> u64 {
        let holes: u64 = log
            .holes
            .iter()
            .map(|&(f, t)| t.min(log.pumped).saturating_sub(f.max(self.cursor)))
            .sum();
        (log.pumped.saturating_sub(self.cursor))
            .saturating_sub(holes)
            .saturating_sub(self.skip.len())
            + self.requeued_count() as u64
    }

    /// Of `depth`, the records only on disk.
    pub fn backend_depth(&self, log: &Log) -> u64 {
        log.base.min(log.pumped).saturating_sub(self.cursor)
    }

    /// Every sequence below this is finished on this channel (the segment retention
    /// watermark).
    pub fn low_watermark(&self) -> u64 {
        let mut low = self.cursor;
        for f in self.in_flight.values() {
            low = low.min(f.msg.seq);
        }
        for m in &self.requeued {
            low = low.min(m.seq);
        }
        for Reverse(d) in self.deferred.iter() {
            low = low.min(d.seq);
        }
        if let Some((&seq, _)) = self.ready_unread.first_key_value() {
            low = low.min(seq);
        }
        low
    }

    /// Messages this channel holds in flight, requeued or deferred.
    pub fn pending_count(&self) -> usize {
        self.in_flight.len() + self.requeued_count() + self.deferred.len()
    }

    /// Calls `f` with the sequence of every message this channel holds in flight,
    /// requeued or deferred (unfinished although the cursor may have passed it).
    pub fn pending_seqs(&self, mut f: impl FnMut(u64)) {
        for fl in self.in_flight.values() {
            f(fl.msg.seq);
        }
        for m in &self.requeued {
            f(m.seq);
        }
        for Reverse(d) in self.deferred.iter() {
            f(d.seq);
        }
        for &seq in self.ready_unread.keys() {
            f(seq);
        }
    }

    /// A message deferred at publish time goes straight to the deferred heap; the cursor
    /// will step over its record.
    pub fn defer_published(&mut self, msg: Message, due: Instant) {
        if msg.seq >= self.cursor {
            self.skip.insert(msg.seq);
        }
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
        self.ephemeral_cap = Some(mem_queue_size);
        self.pumped_seen = log.pumped;
        let depth = self.depth(log);
        if depth <= mem_queue_size {
            return;
        }
        let excess = depth - mem_queue_size;
        if self.cursor < log.base || !self.disk.is_empty() {
            let skip = excess.min(log.pumped.saturating_sub(self.cursor));
            self.cursor += skip;
            let mut rest = (excess - skip) as usize;
            let front = rest.min(self.requeued.len());
            self.requeued.drain(..front);
            rest -= front;
            while rest > 0 && self.ready_unread.pop_first().is_some() {
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
                self.requeued.push_back(rec.message());
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
    fn put_back(&mut self, msg: Message) -> bool {
        if let Some(cap) = self.ephemeral_cap {
            let ready = self
                .pumped_seen
                .saturating_sub(self.cursor)
                .saturating_sub(self.skip.len())
                + self.requeued_count() as u64;
            if ready >= cap {
                return false;
            }
        }
        self.requeued.push_back(msg);
        true
    }

    /// As [`Channel::put_back`], for a message whose body is still in the log.
    fn put_back_unread(&mut self, seq: u64, attempts: u16) -> bool {
        if let Some(cap) = self.ephemeral_cap {
            let ready = self
                .pumped_seen
                .saturating_sub(self.cursor)
                .saturating_sub(self.skip.len())
                + self.requeued_count() as u64;
            if ready >= cap {
                return false;
            }
        }
        self.ready_unread.insert(seq, attempts);
        true
    }

    /// True when the store can give back the record at `seq` for as long as this
    /// channel holds it (see `reread`).
    fn rereads(&self, seq: u64) -> bool {
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

    /// Holds `msg` until `due` (REQ with a delay, DPUB, recovery). Only its sequence,
    /// attempts and due time are kept when the log can give its body back.
    pub fn defer(&mut self, msg: Message, due: Instant) {
        let (seq, attempts) = (msg.seq, msg.attempts);
        if !self.rereads(seq) {
            self.deferred_bodies.insert(seq, msg);
        }
        self.deferred.push(Reverse(Deferred { due, seq, attempts }));
    }

    /// The next message to deliver: requeued first, then the log at the cursor. Records
    /// published with a defer time still in the future move to the deferred heap.
    fn next_message(&mut self, log: &Log, now: Instant) -> Option<Message> {
        if let Some(m) = self.requeued.pop_front() {
            return Some(m);
        }
        // Ready again with the body in the memory tail; those below it wait for a read.
        while let Some((&seq, &attempts)) = self.ready_unread.range(log.base..).next() {
            self.ready_unread.remove(&seq);
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
                while self.disk.front().is_some_and(|r| r.seq < self.cursor) {
                    self.pop_disk();
                }
                match self.pop_disk() {
                    Some(r) => {
                        self.cursor = r.seq;
                        r
                    }
                    None => {
                        self.wants_disk = true;
                        return None;
                    }
                }
            } else {
                if !self.disk.is_empty() {
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

    fn pop_disk(&mut self) -> Option<Record> {
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

    /// Messages this channel's clients take: the RDY of each subscribed client with
    /// RDY > 0 whose output is being drained (not full); 0 when paused. A consumer that
    /// has all its RDY in flight still takes messages (each FIN makes room for the next):
    /// reads for it go on. One that stops reading its socket (a full output), sets RDY 0
    /// or leaves does not.
    pub fn room(&self) -> usize {
        self.rdy_of_takers(true)
    }

    /// The RDY of the subscribed clients with RDY > 0 (`drained`: only those whose
    /// output is not full); 0 when paused.
    fn rdy_of_takers(&self, drained: bool) -> usize {
        if self.paused {
            return 0;
        }
        self.clients
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

    /// True when a ready message exists and a client can take it.
    fn has_work(&self, log: &Log) -> bool {
        !self.paused
            && (!self.requeued.is_empty()
                || self.ready_unread.range(log.base..).next().is_some()
                || (self.cursor < log.pumped && !(self.wants_disk && self.disk.is_empty())))
    }

    /// Hands messages to ready clients, round robin, until either runs out (nsqd's
    /// messagePump, with RDY as an in-flight window). A client whose output is over its
    /// high-water mark ([`Client::output_full`]) is skipped until its writer drains it
    /// (the writer then asks for a delivery, see [`Client::resume_delivery`]), so a
    /// consumer that does not read holds about one output buffer of messages whatever
    /// its RDY, and the rest go to the others. Frames are buffered in each
    /// client's output buffer; the writer tasks flush them. Together, this and the TCP
    /// writer task (`src/tcp/writer.rs`) are nsqd's messagePump: this half is its
    /// receive from the channel and SendMessage (pick a message, start its in-flight
    /// timeout, frame it), the writer is its flush and heartbeat half.
    pub fn dispatch(&mut self, log: &Log, now: Instant) -> u64 {
        let mut delivered = 0;
        let n = self.clients.len();
        while n > 0 && self.has_work(log) {
            let mut pick = None;
            for i in 0..n {
                let idx = (self.next_client + i) % n;
                let c = &self.clients[idx];
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
                pick = Some(idx);
                break;
            }
            let Some(idx) = pick else { break };
            self.next_client = (idx + 1) % n;
            let Some(mut msg) = self.next_message(log, now) else {
                break;
            };
            let client = self.clients[idx].clone();
            let (sample_rate, msg_timeout) = {
                let s = client.settings.borrow();
                // nsqd's messagePump: the first IDENTIFY's values.
                (s.pump.sample_rate, s.pump.msg_timeout)
            };
            if sample_rate > 0 && fastrand::u32(0..100) > sample_rate {
                continue;
            }
            msg.attempts = msg.attempts.wrapping_add(1);
            if msg.attempts >= 2 {
                // A redelivery: its attempts must not go back after a crash.
                self.journal(EventKind::Delivered, &msg, 0);
            }
            client.in_flight.set(client.in_flight.get() + 1);
            client.message_count.set(client.message_count.get() + 1);
            client.buffer_message(&msg);
            let deadline = now + msg_timeout;
            self.in_flight_heap.push(Reverse((deadline, msg.id)));
            self.in_flight.insert(
                msg.id,
                InFlight {
                    msg,
                    client,
                    deadline,
                    delivered_at: now,
                },
            );
            delivered += 1;
        }
        crate::memory_freed(self.release_idle_read_ahead());
        delivered
    }

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
        client.finish_count.set(client.finish_count.get() + 1);
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
        client.requeue_count.set(client.requeue_count.get() + 1);
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

    /// nsqd channel Empty: drops ready, in-flight and deferred messages and zeroes the
    /// consumers' in-flight counts.
    pub fn empty(&mut self, log: &Log) {
        self.cursor = log.pumped;
        if let Some(st) = &self.journal {
            st.journal(EventKind::Emptied, &self.name, self.cursor, 0, 0);
        }
        self.skip.clear();
        self.clear_disk();
        self.requeued.clear();
        self.in_flight.clear();
        self.in_flight_heap.clear();
        self.deferred.clear();
        self.deferred_bodies.clear();
        self.ready_unread.clear();
        for c in &self.clients {
            c.in_flight.set(0);
        }
    }

    /// `POST /channel/seek` (beyond nsqd): the cursor moves to `seq` (forwards or
    /// backwards, also below the memory tail: the records are then read back from disk).
    /// Everything the channel holds that is not in flight is dropped: requeued and
    /// deferred messages below `seq` because they precede the new cursor, those at or
    /// above it because the cursor delivers them again (a message published with a
    /// defer time still in the future is deferred again when the cursor passes it).
    /// In-flight messages are left alone (FIN, REQ and TOUCH keep working); the cursor
    /// steps over those at or above `seq`, so a message is never in flight twice.
    /// Messages the cursor reaches are delivered with attempts 1.
    pub fn seek(&mut self, seq: u64) {
        self.cursor = seq;
        self.requeued.clear();
        self.deferred.clear();
        self.deferred_bodies.clear();
        self.ready_unread.clear();
        self.skip.clear();
        for f in self.in_flight.values() {
            if f.msg.seq >= seq {
                self.skip.insert(f.msg.seq);
            }
        }
        self.clear_disk();
    }

    /// Adds a subscribed client (no-op when it is already there). `max` 0 means
    /// unlimited; otherwise a channel with `max` clients refuses more.
    pub fn add_client(&mut self, client: Rc<Client>, max: usize) -> Result<(), ConsumerLimit> {
        if self.clients.iter().any(|c| c.id == client.id) {
            return Ok(());
        }
        if max > 0 && self.clients.len() >= max {
            return Err(ConsumerLimit { max });
        }
        self.clients.push(client);
        Ok(())
    }

    pub fn remove_client(&mut self, id: u64) {
        self.clients.retain(|c| c.id != id);
        if self.next_client >= self.clients.len() {
            self.next_client = 0;
        }
    }

    /// Closes every subscribed connection (channel delete).
    pub fn close_clients(&mut self) {
        for c in self.clients.drain(..) {
            c.state.set(ClientState::Closing);
            c.kill();
        }
    }
}

#[cfg(test)]
mod tests;
