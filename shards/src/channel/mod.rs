//! A channel: a cursor into its topic's log plus the ready queue (`delivery.rs`), the
//! in-flight table and heap by timeout (`in_flight.rs`), the deferred heap by due time
//! (`deferred.rs`) and what it reads back from the store (`read_back.rs`) (nsqd:
//! channel.go, in_flight_pqueue.go, protocol_v2.go messagePump).

use crate::client::{Client, ClientState};
use crate::message::{Message, MessageId};
use crate::names::is_ephemeral;
use crate::topic::Log;
use nsq_storage::journal::EventKind;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::time::{Duration, Instant};

mod changes;
mod dead;
mod deferred;
mod delivery;
mod in_flight;
mod inspect;
mod lag;
mod rate;
mod read_back;

pub use changes::{Change, ChangeLog, CHANGES_MAX};
pub use dead::{dead_letter_topic, dead_letters_waiting};
pub use inspect::{MessageState, Peeked};
pub use lag::{OldestUnfinished, FIN_LATENCY_WINDOW};

use deferred::DeferredQueue;
use delivery::ReadyQueue;
use in_flight::InFlightTable;
use read_back::ReadAhead;

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
/// (the `unread` part of a channel's ready queue), or, where the log cannot give it back
/// (a topic without a store), in the `bodies` of the channel's deferred queue.
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

/// One channel of a topic, its state grouped by concern: the ready queue, the in-flight
/// table, the deferred queue, the store read-ahead, the consumers, the counters and the
/// journal. Outside this module, read it through the accessors and change it through the
/// operations (`dispatch`, `finish`, `requeue`, `touch`, `process_timers`, `empty`,
/// `seek`, ...), each of which takes the time as `now` and does no I/O beyond journaling
/// (durable channels).
pub struct Channel {
    name: String,
    flags: Flags,
    /// Next log sequence this channel reads.
    cursor: u64,
    /// Sequences at or above the cursor already handed to this channel's deferred queue
    /// when they were published (nsqd gives a DPUB to each channel at once), or finished
    /// before the cursor reached them (recovery); the cursor steps over them.
    skip: crate::seqset::SeqSet,
    ready: ReadyQueue,
    in_flight: InFlightTable,
    deferred: DeferredQueue,
    read_ahead: ReadAhead,
    consumers: Consumers,
    counters: ChannelCounters,
    journal: Journal,
    /// Delivery limits beyond nsqd: maximum attempts, dead letters and the rate limit.
    limits: Limits,
    /// The earliest instant this channel is registered at in its shard's timer queue
    /// (crate::timers), if any.
    timer_scheduled: Option<Instant>,
    /// Changes to the delivery state since they were last taken, while recorded (the
    /// leader of a replicated topic: `changes.rs`).
    changes: Option<changes::ChangeLog>,
}

/// A channel's flags (nsqd: Channel.ephemeral, Channel.paused).
struct Flags {
    /// An `#ephemeral` channel: never persisted, overflow beyond `--mem-queue-size`
    /// dropped.
    ephemeral: bool,
    /// No delivery while set.
    paused: bool,
    /// No delivery while this member hands the topic's leadership over (not nsqd's
    /// pause: not persisted, not shown in `/stats`): see [`Channel::set_held`].
    held: bool,
}

/// A channel's delivery limits beyond nsqd (docs/dead-letters-and-rate-limits.md).
#[derive(Default)]
struct Limits {
    /// Maximum attempts and the dead letters on their way to `<topic>.dead`.
    dead: dead::DeadLetters,
    /// `POST /channel/rate-limit`: the token bucket pacing delivery.
    rate: rate::RateLimit,
}

/// The subscribed clients, in the order delivery goes round (nsqd: Channel.clients).
struct Consumers {
    clients: Vec<Rc<Client>>,
    /// The client the next round-robin pick starts at.
    next: usize,
}

/// A channel's counters for `/stats` (nsqd: Channel.messageCount, requeueCount,
/// timeoutCount, e2eProcessingLatencyStream).
#[derive(Default)]
struct ChannelCounters {
    message_count: u64,
    requeue_count: u64,
    timeout_count: u64,
    /// Deliveries by the topology rank of the client (all 0 without the experiment).
    by_rank: crate::topology::RankCounts,
    /// FIN latencies when `--e2e-processing-latency-percentile` is set (nsqd:
    /// e2eProcessingLatencyStream); created by the shard on the first FIN.
    e2e: Option<crate::quantile::Quantile>,
    /// Delivery-to-FIN latencies (beyond nsqd), made on the first FIN.
    fin_latency: Option<Box<lag::FinLatency>>,
    /// (sequence, publish time) of the oldest unfinished record last read from disk
    /// for `/stats` (see `lag.rs`).
    disk_oldest: Option<(u64, i64)>,
}

/// Journaling of a durable channel's requeues, redeliveries and their FINs into the
/// topic's store, so that attempts and requeue delays survive a crash.
#[derive(Default)]
struct Journal {
    /// The topic's store (durable channels only).
    store: Option<Rc<nsq_storage::TopicStore>>,
    /// Recovery sets this to the topic's head: messages below it may have been delivered
    /// before the restart (everything between the checkpointed cursor and the head, and
    /// the checkpoint's pending ones), so their FIN is journaled even after a single
    /// delivery (see [`Channel::finish`]). The first checkpoint after the restart
    /// covers those FINs and sets it back to 0 (as for a channel that was not
    /// recovered), so this costs one event per FIN only until then.
    recovered_below: u64,
}

impl Channel {
    pub fn new(name: &str, cursor: u64) -> Channel {
        Channel {
            name: name.to_string(),
            flags: Flags {
                ephemeral: is_ephemeral(name),
                paused: false,
                held: false,
            },
            cursor,
            skip: crate::seqset::SeqSet::new(),
            ready: ReadyQueue::new(cursor),
            in_flight: InFlightTable::default(),
            deferred: DeferredQueue::default(),
            read_ahead: ReadAhead::default(),
            consumers: Consumers {
                clients: Vec::new(),
                next: 0,
            },
            counters: ChannelCounters::default(),
            journal: Journal::default(),
            limits: Limits::default(),
            timer_scheduled: None,
            changes: None,
        }
    }

    /// The channel's name (with its `#ephemeral` suffix, if any).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True for an `#ephemeral` channel (never persisted; overflow beyond
    /// `--mem-queue-size` dropped).
    pub fn is_ephemeral(&self) -> bool {
        self.flags.ephemeral
    }

    /// True while the channel is paused (no delivery; nsqd: Channel.IsPaused).
    pub fn is_paused(&self) -> bool {
        self.flags.paused
    }

    /// Pauses or unpauses delivery. Unpausing does not deliver by itself: call `dispatch`.
    pub fn set_paused(&mut self, paused: bool) {
        self.flags.paused = paused;
    }

    /// Holds or releases delivery while this member hands its replicated topic's
    /// leadership over: the consumers finish what they hold in flight, and nothing is
    /// in flight here when the new leader takes the channel's state, so nothing is
    /// delivered twice. Releasing does not deliver by itself: call `dispatch`.
    pub fn set_held(&mut self, held: bool) {
        self.flags.held = held;
    }

    /// No delivery now: paused, or held ([`Channel::set_held`]).
    fn delivery_stopped(&self) -> bool {
        self.flags.paused || self.flags.held
    }

    /// The next log sequence this channel reads.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Messages delivered and not yet finished, requeued or timed out (`in_flight_count`).
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// Messages in flight to clients that are still this channel's consumers, the ones
    /// that can still finish them. A consumer that left keeps its messages in flight
    /// until their timeout, as nsqd does (its RemoveClient requeues nothing).
    pub fn in_flight_to_consumers(&self) -> usize {
        if self.in_flight.len() == 0 {
            return 0;
        }
        let ids: Vec<u64> = self.consumers.clients.iter().map(|c| c.id).collect();
        self.in_flight
            .values()
            .filter(|f| ids.contains(&f.client.id))
            .count()
    }

    /// Who holds this channel's in-flight messages: each holding client with how many
    /// it holds and whether it is still one of the channel's consumers (one that is
    /// not holds them until they time out).
    pub fn in_flight_holders(&self) -> Vec<(Rc<Client>, usize, bool)> {
        let mut out: Vec<(Rc<Client>, usize, bool)> = Vec::new();
        for f in self.in_flight.values() {
            match out.iter_mut().find(|(c, _, _)| c.id() == f.client.id()) {
                Some(e) => e.1 += 1,
                None => {
                    let subscribed = self.clients().iter().any(|c| c.id() == f.client.id());
                    out.push((f.client.clone(), 1, subscribed));
                }
            }
        }
        out
    }

    /// The in-flight message `id`, if it is in flight.
    pub fn in_flight(&self, id: MessageId) -> Option<&InFlight> {
        self.in_flight.get(id)
    }

    /// The message `id` if this channel holds its body: in flight, or ready again after
    /// a REQ or a timeout (`GET /message`; the log may have dropped its record and the
    /// store not yet written it). O(1) for in flight, linear in the requeued messages
    /// (bounded by the in-flight window they came from).
    pub fn held_message(&self, id: MessageId) -> Option<&Message> {
        self.in_flight
            .get(id)
            .map(|f| &f.msg)
            .or_else(|| self.ready.requeued.iter().find(|m| m.id == id))
    }

    /// Messages waiting for their due time (`deferred_count`).
    pub fn deferred_count(&self) -> usize {
        self.deferred.len()
    }

    /// Messages ready again (REQ 0, timed out, due deferred) and not yet redelivered;
    /// part of `depth`.
    pub fn requeued_count(&self) -> usize {
        self.ready.len()
    }

    /// The subscribed clients, in the order delivery goes round.
    pub fn clients(&self) -> &[Rc<Client>] {
        &self.consumers.clients
    }

    /// Messages the topic handed to this channel (stats `message_count`; requeues and
    /// timeouts do not add to it).
    pub fn message_count(&self) -> u64 {
        self.counters.message_count
    }

    /// REQs, delayed or not (stats `requeue_count`).
    pub fn requeue_count(&self) -> u64 {
        self.counters.requeue_count
    }

    /// Deliveries by the topology rank of their client (stats `zone_local_msg_count`,
    /// `region_local_msg_count`, `global_msg_count`; see [`crate::topology`]).
    pub fn rank_counts(&self) -> crate::topology::RankCounts {
        self.counters.by_rank
    }

    /// In-flight messages that timed out (stats `timeout_count`).
    pub fn timeout_count(&self) -> u64 {
        self.counters.timeout_count
    }

    /// FIN latencies, when `--e2e-processing-latency-percentile` is set and a FIN came.
    pub fn e2e(&self) -> Option<&crate::quantile::Quantile> {
        self.counters.e2e.as_ref()
    }

    /// Calls `f` with the sequence, attempts and due time (deferred ones only) of every
    /// message this channel holds in flight, requeued or deferred, in that order (for
    /// its checkpoint).
    pub fn for_each_pending(&self, mut f: impl FnMut(u64, u16, Option<Instant>)) {
        for fl in self.in_flight.values() {
            f(fl.msg.seq, fl.msg.attempts, None);
        }
        for m in &self.ready.requeued {
            f(m.seq, m.attempts, None);
        }
        for (&seq, &attempts) in &self.ready.unread {
            f(seq, attempts, None);
        }
        for d in self.deferred.iter() {
            f(d.seq, d.attempts, Some(d.due));
        }
        for m in self.limits.dead.iter() {
            f(m.seq, m.attempts, None);
        }
    }

    /// The sequences at or above `from` the cursor will step over (see `skip`).
    pub fn stepped_over_from(&self, from: u64) -> impl Iterator<Item = u64> + '_ {
        self.skip.iter_from(from)
    }

    /// Recovery: the cursor steps over `seqs` (messages deferred at publish time, or
    /// finished before the cursor reached them).
    pub(crate) fn step_over(&mut self, seqs: impl IntoIterator<Item = u64>) {
        self.skip.extend(seqs);
    }

    /// Recovery: the channel's pending messages, deferred ones and those ready again
    /// (sequence, attempts), whose bodies are read back from the store.
    pub(crate) fn restore_pending(&mut self, deferred: Vec<Deferred>, ready: Vec<(u64, u16)>) {
        self.deferred.restore(deferred);
        self.ready.unread = ready.into_iter().collect();
    }

    /// Journals this channel's requeues, redeliveries and their FINs into `store` (a
    /// durable channel of a topic with a store).
    pub(crate) fn set_journal(&mut self, store: Option<Rc<nsq_storage::TopicStore>>) {
        self.journal.store = store;
    }

    /// The topic's store and the sequence from which it holds every record: deferred
    /// messages of those records hold no body (see [`Channel::defer`]).
    pub(crate) fn set_reread(&mut self, reread: Option<(u64, Rc<nsq_storage::TopicStore>)>) {
        self.deferred.set_reread(reread);
    }

    /// Recovery: messages below `head` may have been delivered before the restart, so
    /// their FIN is journaled even after a single delivery (see [`Channel::finish`]),
    /// until [`Channel::recovery_checkpointed`].
    pub(crate) fn set_recovered_below(&mut self, head: u64) {
        self.journal.recovered_below = head;
    }

    /// The first checkpoint after recovery covers the FINs since: from now on a FIN is
    /// journaled as for a channel that was not recovered.
    pub(crate) fn recovery_checkpointed(&mut self) {
        self.journal.recovered_below = 0;
    }

    /// The topic pumped `n` messages to this channel (stats `message_count`).
    pub(crate) fn count_pumped(&mut self, n: u64) {
        self.counters.message_count += n;
    }

    /// Bodies of deferred messages held because the store cannot give them back (yet).
    pub fn deferred_bodies_count(&self) -> usize {
        self.deferred.bodies_len()
    }

    /// Messages ready again whose bodies are still in the log (part of
    /// [`Channel::requeued_count`]).
    pub fn ready_unread_count(&self) -> usize {
        self.ready.unread.len()
    }

    /// Starts recording FIN latencies into `q` (`--e2e-processing-latency-percentile`).
    pub(crate) fn start_e2e(&mut self, q: crate::quantile::Quantile) {
        self.counters.e2e = Some(q);
    }

    /// Journals an event of this channel when it is durable.
    fn journal(&self, kind: EventKind, msg: &Message, due_unix_ns: i64) {
        if let Some(st) = &self.journal.store {
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
        for m in &self.ready.requeued {
            low = low.min(m.seq);
        }
        if let Some(seq) = self.deferred.first_seq() {
            low = low.min(seq);
        }
        if let Some((&seq, _)) = self.ready.unread.first_key_value() {
            low = low.min(seq);
        }
        for m in self.limits.dead.iter() {
            low = low.min(m.seq);
        }
        low
    }

    /// Messages this channel holds in flight, requeued, deferred or for the
    /// dead-letter topic.
    pub fn pending_count(&self) -> usize {
        self.in_flight.len() + self.requeued_count() + self.deferred.len() + self.limits.dead.len()
    }

    /// Calls `f` with the sequence of every message this channel holds in flight,
    /// requeued or deferred (unfinished although the cursor may have passed it).
    pub fn pending_seqs(&self, mut f: impl FnMut(u64)) {
        for fl in self.in_flight.values() {
            f(fl.msg.seq);
        }
        for m in &self.ready.requeued {
            f(m.seq);
        }
        for d in self.deferred.iter() {
            f(d.seq);
        }
        for &seq in self.ready.unread.keys() {
            f(seq);
        }
        for m in self.limits.dead.iter() {
            f(m.seq);
        }
    }

    /// [`Channel::pending_seqs`] within `range` only: the deferred ones (which may be
    /// millions) come from their index, in order, without walking the others.
    pub fn pending_seqs_in(&self, range: std::ops::Range<u64>, mut f: impl FnMut(u64)) {
        for fl in self.in_flight.values() {
            if range.contains(&fl.msg.seq) {
                f(fl.msg.seq);
            }
        }
        for m in &self.ready.requeued {
            if range.contains(&m.seq) {
                f(m.seq);
            }
        }
        for seq in self.deferred.seqs_from(range.start) {
            if seq >= range.end {
                break;
            }
            f(seq);
        }
        for &seq in self.ready.unread.range(range.clone()).map(|(s, _)| s) {
            f(seq);
        }
        for m in self.limits.dead.iter() {
            if range.contains(&m.seq) {
                f(m.seq);
            }
        }
    }

    /// Every message this channel holds unfinished (as [`Channel::pending_seqs`]) with
    /// its attempts and, for a deferred one, when it is due (`None`: ready now; an
    /// in-flight message is ready again on a replica that takes over). What a
    /// replicated topic's leader sends its replicas (docs/replication.md).
    pub fn pending_states(&self, mut f: impl FnMut(u64, u16, Option<Instant>)) {
        for fl in self.in_flight.values() {
            f(fl.msg.seq, fl.msg.attempts, None);
        }
        for m in &self.ready.requeued {
            f(m.seq, m.attempts, None);
        }
        for d in self.deferred.iter() {
            f(d.seq, d.attempts, Some(d.due));
        }
        for (&seq, &attempts) in &self.ready.unread {
            f(seq, attempts, None);
        }
        for m in self.limits.dead.iter() {
            f(m.seq, m.attempts, None);
        }
    }

    /// A replica takes its leader's channel state: the cursor at `cursor` and the
    /// unfinished messages `pending` (sequence, attempts, due time; those at or above
    /// the cursor are stepped over when it reaches them), whose bodies come from the
    /// topic's log. Messages this channel held in flight stay (see [`Channel::seek`]).
    pub(crate) fn set_position(&mut self, cursor: u64, pending: Vec<(u64, u16, Option<Instant>)>) {
        self.seek(cursor);
        let mut deferred = Vec::new();
        let mut ready = Vec::new();
        for (seq, attempts, due) in pending {
            if seq >= cursor {
                self.skip.insert(seq);
            }
            match due {
                Some(due) => deferred.push(Deferred { due, seq, attempts }),
                None => ready.push((seq, attempts)),
            }
        }
        self.restore_pending(deferred, ready);
    }

    /// nsqd channel Empty: drops ready, in-flight and deferred messages and zeroes the
    /// consumers' in-flight counts.
    pub fn empty(&mut self, log: &Log) {
        self.record_all();
        self.cursor = log.pumped;
        if let Some(st) = &self.journal.store {
            st.journal(EventKind::Emptied, &self.name, self.cursor, 0, 0);
        }
        self.skip.clear();
        self.clear_disk();
        self.ready.clear();
        self.in_flight.clear();
        self.deferred.clear();
        self.limits.dead.clear();
        for c in &self.consumers.clients {
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
        self.record_all();
        self.cursor = seq;
        self.ready.clear();
        self.deferred.clear();
        self.limits.dead.clear();
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
        if self.consumers.clients.iter().any(|c| c.id == client.id) {
            return Ok(());
        }
        if max > 0 && self.consumers.clients.len() >= max {
            return Err(ConsumerLimit { max });
        }
        self.consumers.clients.push(client);
        Ok(())
    }

    pub fn remove_client(&mut self, id: u64) {
        self.consumers.clients.retain(|c| c.id != id);
        if self.consumers.next >= self.consumers.clients.len() {
            self.consumers.next = 0;
        }
    }

    /// Closes every subscribed connection (channel delete).
    pub fn close_clients(&mut self) {
        for c in self.consumers.clients.drain(..) {
            c.state.set(ClientState::Closing);
            c.kill();
        }
    }

    /// Takes every consumer out of the channel without closing its connection, each
    /// with the IDs of the messages it held in flight, which are ready again here (as
    /// [`Channel::requeue_in_flight`] makes them). The consumers stay subscribed as far
    /// as their connections know: the caller serves them from elsewhere (a replicated
    /// topic's new leader, through this member).
    pub fn detach_clients(&mut self) -> Vec<(Rc<Client>, Vec<MessageId>)> {
        let mut held: HashMap<u64, Vec<MessageId>> = HashMap::new();
        for f in self.in_flight.values() {
            held.entry(f.client.id).or_default().push(f.msg.id);
        }
        self.requeue_in_flight();
        self.consumers.next = 0;
        self.consumers
            .clients
            .drain(..)
            .map(|c| {
                *c.subscription.borrow_mut() = None;
                let ids = held.remove(&c.id).unwrap_or_default();
                (c, ids)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
