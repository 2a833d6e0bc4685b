//! A channel: a cursor into its topic's log plus the requeue queue, the in-flight table
//! and heap (by timeout) and the deferred heap (by due time) (nsqd: channel.go,
//! in_flight_pqueue.go, protocol_v2.go messagePump).

use crate::client::{Client, ClientState};
use crate::message::{Message, MessageId};
use crate::names::is_ephemeral;
use crate::topic::{Log, Record};
use nsq_storage::journal::EventKind;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::time::{Duration, Instant};

mod delivery;
mod in_flight;
mod read_back;

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
