//! One shard: the topics it owns and everything hanging off them, its connections'
//! handles, its counters, and its end of the mesh. Only its own executor thread touches
//! it; every method is synchronous and never holds a borrow across an `.await`.

use crate::channel::InFlightError;
use crate::client::{Client, ClientState};
use crate::mesh::{AdminError, AdminOp, SeekTo};
use crate::message::MessageId;
use crate::options::Options;
use crate::stats::*;
use crate::timers::TimerQueue;
use crate::topic::{PublishError, StoreMode, Topic, STORE_DELAY};
use crate::wake::Latch;
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// The shard that owns `topic` among `shards`: FNV-1a 64 of the name's bytes, modulo the
/// shard count. Fixed and documented so the mapping is stable across restarts.
pub fn owner_of(topic: &str, shards: usize) -> usize {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in topic.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % shards.max(1) as u64) as usize
}

/// A topic or channel appeared or went away: what nsqd sends nsqlookupd
/// (`REGISTER`/`UNREGISTER <topic> [<channel>]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupEvent {
    Register(String, Option<String>),
    Unregister(String, Option<String>),
}

/// Called on the topic's owner when a topic is created outside recovery, with the topic
/// name and a token (nsqd: GetTopic asks nsqlookupd for the topic's channels before it
/// starts the topic's pump). Returns true when it started a query whose answer will come
/// back through [`Shard::release_topic`] with that token; the topic holds its pump
/// until then. It must not touch the shard's topics synchronously.
pub type TopicCreatedHook = Box<dyn Fn(&str, u64) -> bool>;

/// Counters kept per shard (the per-shard /stats section).
#[derive(Default)]
pub struct Counters {
    pub messages_in: Cell<u64>,
    pub bytes_in: Cell<u64>,
    pub messages_out: Cell<u64>,
    pub bytes_out: Cell<u64>,
    pub cross_shard_sent: Cell<u64>,
    pub cross_shard_received: Cell<u64>,
    pub handoffs_sent: Cell<u64>,
    pub handoffs_received: Cell<u64>,
    pub loop_lag_us: Cell<u64>,
    pub loop_lag_max_us: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

pub struct Shard {
    pub index: usize,
    pub count: usize,
    pub cpu: usize,
    pub opts: Options,
    pub topics: RefCell<HashMap<String, Topic>>,
    /// Topic directories made and opened on the blocking thread for a store about to be
    /// created (or its error), on the blocking-thread segment path only
    /// ([`Shard::prepare_store`]).
    prepared_dirs: RefCell<HashMap<String, Result<std::fs::File, String>>>,
    /// Topics deleted so far: a directory prepared across a delete is not used.
    topic_deletes: Cell<u64>,
    /// Every connection on this shard (for producers in /stats and for shutdown).
    pub clients: RefCell<HashMap<u64, Weak<Client>>>,
    pub counters: Counters,
    /// Set on SIGINT/SIGTERM: listeners stop, connections close.
    pub shutdown: Latch,
    /// Registration changes waiting for the lookup task (only kept when lookupd
    /// addresses are configured).
    pub lookup_events: RefCell<Vec<LookupEvent>>,
    pub lookup_wake: crate::wake::Notify,
    /// This shard's copy of the node-wide settings that change at run time (shard 0
    /// owns them: see [`crate::node`]).
    pub node: crate::node::NodeSettings,
    pub lookup_enabled: Cell<bool>,
    /// A topic or channel was created or deleted: the checkpoint task writes metadata
    /// soon (nsqd: Notify persists metadata on every such change).
    pub meta_wake: crate::wake::Notify,
    /// Metadata checkpoints asked for (`request_checkpoint`) and the last one written:
    /// a channel created, deleted or paused is answered once it is in the metadata.
    pub meta_requested: Cell<u64>,
    pub meta_written: crate::wake::Progress,
    /// The last metadata write's error, until one succeeds (nsqd's health).
    pub meta_error: RefCell<Option<String>>,
    /// Logs failed metadata writes: a cause that repeats (a full disk, no descriptors
    /// left, for every changed topic at each checkpoint) at most once a second, with
    /// the count; the last cause logged.
    pub(crate) meta_error_log: (nsq_storage::repeat_log::RepeatLog, RefCell<String>),
    /// Topics whose data could not be loaded at start-up, with the error (by topic
    /// name): reported by [`Shard::health`] until the next start, and their stores are
    /// never created afresh over the data left in their directories (a publish to one
    /// is refused, as to a topic whose store failed).
    pub failed_recoveries: RefCell<std::collections::BTreeMap<String, String>>,
    /// A checkpoint is being written (one at a time: [`Shard::run_checkpoint`]).
    checkpoint_running: Cell<bool>,
    /// Durable topics whose metadata may have changed since the last checkpoint took
    /// them ([`Shard::mark_changed`]): a checkpoint looks at these only, so its cost
    /// follows what changed, not how many topics the shard holds.
    meta_changed: RefCell<HashSet<String>>,
    /// Topics holding records not yet handed to their store (`Topic::store_pump`): the
    /// store task visits these only.
    unstored: RefCell<HashSet<String>>,
    /// Durable topics whose store could not be created: retried by
    /// [`Shard::retry_missing_stores`] without a walk of every topic.
    missing_stores: RefCell<BTreeSet<String>>,
    /// A topic holds records not yet handed to its store: wakes `store_loop`.
    pub store_wake: crate::wake::Notify,
    next_client: Cell<u64>,
    /// Channels with an in-flight timeout or a deferred message, by the earliest due
    /// instant, as (topic, channel) (see crate::timers).
    pub timers: RefCell<TimerQueue<(String, String)>>,
    /// Wakes the shard's timer loop when a timer earlier than every registered one was
    /// registered (the loop may be sleeping until a later instant).
    pub timer_wake: crate::wake::Notify,
    /// Durable topics whose memory tail may still shrink when their store makes more
    /// records readable from disk (see `Topic::trim`); each timer pass trims them.
    trim_pending: RefCell<BTreeSet<String>>,
    /// This shard as an `Rc`, for tasks its synchronous methods spawn.
    pub me: RefCell<Weak<Shard>>,
    /// Set once recovery is over (see [`TopicCreatedHook`]).
    pub topic_created: RefCell<Option<TopicCreatedHook>>,
    next_hold: Cell<u64>,
}

/// Returns `Pending` once (after asking to be polled again), so that what follows runs
/// after the code that spawned the task has returned.
async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// What a publisher waits for when its publish must be durable: the topic's store and
/// the sequence every record below which must be synced.
pub struct DurableWait {
    pub store: Rc<nsq_storage::TopicStore>,
    /// Wait until every record below this sequence is synced (`--sync-every=1`, or after
    /// a disk error).
    pub durable: Option<u64>,
}

/// A read from the store for one lagging channel.
/// How long a read for messages ready again waits before it is tried again when their
/// records are handed to the store but not written yet.
const UNREAD_WAIT: Duration = Duration::from_millis(10);

struct DiskRead {
    topic: String,
    channel: String,
    from: u64,
    /// Records to read at most (what the channel's clients can take, see
    /// [`crate::channel::Channel::disk_read_from`]).
    max: usize,
    hint: Option<nsq_storage::ReadPos>,
    epoch: u64,
}

/// Bytes a topic's store may have waiting for its writer before publishers wait
/// (backpressure: memory stays bounded when publishing outruns the disk).
pub const STORE_PENDING_HIGH: usize = 32 << 20;

/// How often a shard re-registers the timers of all its channels (a safety net for the
/// timer queue; nsqd: QueueScanRefreshInterval, 5 s).
pub const TIMER_REFRESH: Duration = Duration::from_secs(5);

/// Why a SUB could not join its channel. `Display` gives nsqd's text, which the
/// connection sends as `E_SUB_FAILED SUB failed <text>` (nsqd: protocol_v2.go SUB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubError {
    /// The broker is shutting down: `exiting`.
    Exiting,
    /// The channel has `--max-channel-consumers` clients already:
    /// `consumers for <topic>:<channel> exceeds limit of <max>`.
    TooManyConsumers {
        topic: String,
        channel: String,
        max: usize,
    },
}

impl std::fmt::Display for SubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubError::Exiting => f.write_str("exiting"),
            SubError::TooManyConsumers {
                topic,
                channel,
                max,
            } => write!(
                f,
                "consumers for {topic}:{channel} {}",
                crate::channel::ConsumerLimit { max: *max }
            ),
        }
    }
}

impl std::error::Error for SubError {}

impl Shard {
    pub fn new(index: usize, count: usize, cpu: usize, opts: Options) -> Shard {
        Shard {
            index,
            count,
            cpu,
            opts,
            topics: RefCell::new(HashMap::new()),
            prepared_dirs: RefCell::new(HashMap::new()),
            topic_deletes: Cell::new(0),
            clients: RefCell::new(HashMap::new()),
            counters: Counters::default(),
            shutdown: Latch::default(),
            lookup_events: RefCell::new(Vec::new()),
            lookup_wake: crate::wake::Notify::default(),
            node: crate::node::NodeSettings::default(),
            lookup_enabled: Cell::new(false),
            meta_wake: crate::wake::Notify::default(),
            meta_requested: Cell::new(0),
            meta_written: crate::wake::Progress::default(),
            meta_error: RefCell::new(None),
            meta_error_log: Default::default(),
            failed_recoveries: RefCell::new(std::collections::BTreeMap::new()),
            checkpoint_running: Cell::new(false),
            meta_changed: RefCell::new(HashSet::new()),
            unstored: RefCell::new(HashSet::new()),
            missing_stores: RefCell::new(BTreeSet::new()),
            store_wake: crate::wake::Notify::default(),
            next_client: Cell::new(1),
            timers: RefCell::new(TimerQueue::default()),
            timer_wake: crate::wake::Notify::default(),
            trim_pending: RefCell::new(BTreeSet::new()),
            me: RefCell::new(Weak::new()),
            topic_created: RefCell::new(None),
            next_hold: Cell::new(1),
        }
    }

    /// True when this shard owns `topic`.
    pub fn owns(&self, topic: &str) -> bool {
        owner_of(topic, self.count) == self.index
    }

    /// A topic or channel came or went (nsqd: NSQD.Notify): queues the registration
    /// change for nsqlookupd and asks for a metadata checkpoint, so that a crash soon
    /// after does not forget the topic or channel.
    pub fn notify_lookup(&self, ev: LookupEvent) {
        self.request_checkpoint();
        if self.lookup_enabled.get() {
            self.lookup_events.borrow_mut().push(ev);
            self.lookup_wake.notify();
        }
    }

    /// Asks the checkpoint task for a metadata write soon (counted: see
    /// [`Shard::persist_changes`]).
    pub fn request_checkpoint(&self) {
        self.meta_requested.set(self.meta_requested.get() + 1);
        self.meta_wake.notify();
    }

    /// Notes that `topic`'s metadata (channels, cursors, pending messages, paused flags,
    /// sequences) may have changed: the next checkpoint compares and, if it differs,
    /// writes it. Every path that changes a topic's durable state calls this; a call
    /// too many costs one comparison, a call missing leaves the previous checkpoint on
    /// disk (a crash then redelivers more, never less).
    /// By name, for callers that hold no borrow of the topics (a no-op for a topic that
    /// does not exist); `Shard::mark` where the topic is at hand.
    pub fn mark_changed(&self, topic: &str) {
        if let Some(t) = self.topics.borrow_mut().get_mut(topic) {
            self.mark(t);
        }
    }

    /// [`Shard::mark_changed`] for a topic at hand: a field test on every call after the
    /// first (this runs for every publish and FIN), one insert per checkpoint interval.
    pub(crate) fn mark(&self, t: &mut Topic) {
        if self.opts.data_path.is_some() && !t.meta_marked {
            t.meta_marked = true;
            self.meta_changed.borrow_mut().insert(t.name.clone());
        }
    }

    /// Takes the topics marked changed since the last call (for the checkpoint); they
    /// are marked again by their next change.
    pub(crate) fn take_changed(&self) -> HashSet<String> {
        let names = std::mem::take(&mut *self.meta_changed.borrow_mut());
        let mut topics = self.topics.borrow_mut();
        for name in &names {
            if let Some(t) = topics.get_mut(name) {
                t.meta_marked = false;
            }
        }
        names
    }

    /// Notes that `topic` holds records not yet handed to its store and wakes the store
    /// task.
    pub(crate) fn mark_unstored(&self, topic: &str) {
        let mut unstored = self.unstored.borrow_mut();
        if !unstored.contains(topic) {
            unstored.insert(topic.to_string());
        }
        drop(unstored);
        self.store_wake.notify();
    }

    /// The topics [`Shard::mark_unstored`] noted, for the store task.
    pub(crate) fn unstored_topics(&self) -> Vec<String> {
        self.unstored.borrow().iter().cloned().collect()
    }

    /// `topic` has handed every record to its store (or is gone).
    pub(crate) fn stored_all(&self, topic: &str) {
        self.unstored.borrow_mut().remove(topic);
    }

    /// Writes a metadata checkpoint now ([`Shard::checkpoint`]), after the one being
    /// written, if any, has finished: checkpoints never overlap, and the one run here
    /// covers every change made before the call. Used by the checkpoint task and by
    /// answers that must wait for the metadata on disk (run in their own task: a wake of
    /// the checkpoint task from a connection's task was seen to take up to 20 ms).
    pub async fn run_checkpoint(&self) {
        while self.checkpoint_running.get() {
            let t = self.meta_written.ticks();
            self.meta_written.next_tick(t).await;
        }
        // Released however this ends: the future of a connection's task can be dropped
        // mid-checkpoint (its client gone, shutdown), and a flag left set would stop
        // every later checkpoint, the shutdown's included.
        struct Running<'a>(&'a Shard);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.checkpoint_running.set(false);
                // Wakes the waiters (without counting anything written): one runs next.
                self.0.meta_written.advance_to(0);
            }
        }
        self.checkpoint_running.set(true);
        let running = Running(self);
        let requested = self.meta_requested.get();
        self.checkpoint().await;
        drop(running);
        self.meta_written.advance_to(requested);
    }

    /// Waits until what changed so far on this shard (each change asks for a
    /// checkpoint) is in the metadata on disk, writing it now if it is not (a no-op
    /// without a data path). A failed write is reported by `/ping` (nsqd logs a failed
    /// PersistMetadata and answers all the same).
    pub async fn persist_changes(&self) {
        if self.opts.data_path.is_none() {
            return;
        }
        if self.meta_written.get() < self.meta_requested.get() {
            self.run_checkpoint().await;
        }
    }

    fn topic_deleted(&self, t: &Topic) {
        self.topic_deletes.set(self.topic_deletes.get() + 1);
        self.prepared_dirs.borrow_mut().remove(&t.name);
        crate::memory_freed(
            t.log.body_bytes()
                + t.channels
                    .values()
                    .map(|c| c.disk_buffered_bytes())
                    .sum::<usize>(),
        );
        if let Some(st) = &t.store {
            st.destroy();
        }
        self.notify_lookup(LookupEvent::Unregister(t.name.clone(), None));
        for c in t.channels.keys() {
            self.notify_lookup(LookupEvent::Unregister(t.name.clone(), Some(c.clone())));
        }
    }

    /// A process-unique client id (shard index in the top bits).
    pub fn new_client_id(&self) -> u64 {
        let n = self.next_client.get();
        self.next_client.set(n + 1);
        ((self.index as u64) << 48) | n
    }

    pub fn register_client(&self, c: &Rc<Client>) {
        self.clients.borrow_mut().insert(c.id, Rc::downgrade(c));
    }

    /// A connection on this shard ended (or moved away): it leaves its channel, and an
    /// #ephemeral channel left without clients is deleted, then an #ephemeral topic left
    /// without channels (nsqd: channel.RemoveClient, topic.DeleteExistingChannel).
    pub fn client_gone(&self, c: &Client) {
        self.clients.borrow_mut().remove(&c.id);
        let sub = c.subscription.borrow().clone();
        let Some((t, ch)) = sub else { return };
        let mut topics = self.topics.borrow_mut();
        let Some(topic) = topics.get_mut(&t) else {
            return;
        };
        self.mark(topic);
        let mut delete_channel = false;
        if let Some(channel) = topic.channels.get_mut(&ch) {
            channel.remove_client(c.id);
            delete_channel = channel.ephemeral && channel.clients.is_empty();
        }
        if delete_channel {
            topic.channels.remove(&ch);
            topic.trim(self.opts.mem_queue_size);
            log::info!("TOPIC({t}): deleting channel {ch}");
            self.notify_lookup(LookupEvent::Unregister(t.clone(), Some(ch.clone())));
            if topic.ephemeral && topic.channels.is_empty() {
                if let Some(gone) = topics.remove(&t) {
                    self.topic_deleted(&gone);
                }
                log::info!("TOPIC({t}): deleting");
            }
        }
    }

    fn get_or_create_topic<'a>(
        &self,
        topics: &'a mut HashMap<String, Topic>,
        name: &str,
    ) -> &'a mut Topic {
        if !topics.contains_key(name) {
            log::info!("TOPIC({name}): created");
            self.notify_lookup(LookupEvent::Register(name.to_string(), None));
            let mut t = Topic::new(name, self.opts.node_id);
            t.store_mode = self.store_mode();
            if let (Some(_), false) = (&self.opts.data_path, t.ephemeral) {
                if let Err(e) = self.create_store(&mut t, true) {
                    // `e` names the topic already.
                    log::error!("{e}; publishes are refused until it can be created");
                }
            }
            if let Some(hook) = self.topic_created.borrow().as_ref() {
                let token = self.next_hold.get();
                self.next_hold.set(token + 1);
                if hook(name, token) {
                    t.held = Some(token);
                }
            }
            topics.insert(name.to_string(), t);
        }
        let t = topics.get_mut(name).expect("inserted above");
        self.mark(t);
        t
    }

    /// Creates the topic's store (its directory and first segment), starting at its
    /// log's head. On failure the topic keeps the error (`/ping` reports it) and refuses
    /// publishes until a later attempt succeeds: a durable topic never answers OK for
    /// a message it cannot store (nsqd: E_PUB_FAILED and an unhealthy node when its
    /// disk queue fails).
    ///
    /// On the blocking-thread segment path the directory [`Shard::prepare_store`] made is
    /// used; without one, a new topic (`new_topic`) makes it here, on the shard's thread
    /// (a path that prepares nothing first), and a retry keeps the error it had.
    fn create_store(&self, t: &mut Topic, new_topic: bool) -> Result<(), String> {
        let Some(dp) = &self.opts.data_path else {
            return Ok(());
        };
        if let Some(e) = self.failed_recoveries.borrow().get(&t.name) {
            // Its data is still in the directory: a new store there would overwrite it.
            t.store_error = Some(e.clone());
            return Err(e.clone());
        }
        let dir = nsq_storage::topic_dir(dp, &t.name);
        let prepared = match self.opts.segment_io {
            nsq_storage::SegmentIo::Ring => None,
            nsq_storage::SegmentIo::Threads => self.prepared_dirs.borrow_mut().remove(&t.name),
        };
        let created = match prepared {
            Some(Ok(dir_fd)) => {
                nsq_storage::TopicStore::create_in(dir, dir_fd, self.store_config(), t.log.head)
            }
            Some(Err(e)) => Err(nsq_storage::StoreError::new(std::io::ErrorKind::Other, e)),
            None if self.opts.segment_io == nsq_storage::SegmentIo::Threads && !new_topic => {
                return Err(t.store_error.clone().unwrap_or_default());
            }
            None => nsq_storage::TopicStore::create(dir, self.store_config(), t.log.head),
        };
        match created {
            Ok(st) => {
                t.store = Some(st);
                t.stored = t.log.head;
                t.reread_from = Some(t.log.head);
                for ch in t.channels.values_mut() {
                    ch.reread = t.reread_from.zip(t.store.clone());
                }
                self.missing_stores.borrow_mut().remove(&t.name);
                self.mark(t);
                if t.store_error.take().is_some() {
                    log::info!("TOPIC({}): durable store created", t.name);
                    self.request_checkpoint();
                }
                Ok(())
            }
            Err(e) => {
                let e = format!("TOPIC({}): no durable store - {e}", t.name);
                t.store_error = Some(e.clone());
                self.missing_stores.borrow_mut().insert(t.name.clone());
                Err(e)
            }
        }
    }

    /// Retries the store of every topic whose store could not be created (before each
    /// `/ping` or `/stats` answer, and every `--sync-timeout` by the checkpoint task), so
    /// that `/ping` turns healthy again once the cause is gone, without waiting for a
    /// publish to that topic. A no-op when every topic has its store.
    /// On the blocking-thread segment path the retry takes what
    /// [`Shard::prepare_missing_stores`] prepared (the checkpoint task runs it first).
    pub fn retry_missing_stores(&self) {
        if self.missing_stores.borrow().is_empty() {
            return;
        }
        let names: Vec<String> = self.missing_stores.borrow().iter().cloned().collect();
        let mut topics = self.topics.borrow_mut();
        for name in names {
            match topics.get_mut(&name) {
                Some(t) if t.store.is_none() && t.store_error.is_some() => {
                    let _ = self.create_store(t, false);
                }
                _ => {
                    self.missing_stores.borrow_mut().remove(&name);
                }
            }
        }
    }

    /// Whether `op` would create a durable topic's store that still needs its directory
    /// ([`Shard::needs_prepared_store`]): `/topic/create`, and `/channel/create` of a
    /// topic that exists without its store (one that does not exist is refused, as
    /// nsqd's `TOPIC_NOT_FOUND`, without waiting for a directory).
    pub fn admin_creates_store(&self, op: &AdminOp) -> bool {
        match op {
            AdminOp::CreateTopic(t) => self.needs_prepared_store(t),
            AdminOp::CreateChannel(t, _) => {
                self.topics.borrow().contains_key(t) && self.needs_prepared_store(t)
            }
            _ => false,
        }
    }

    /// Whether a durable topic `topic` still needs its directory before its store can be
    /// created, on the blocking-thread segment path (FUSE, network filesystems: there a
    /// `mkdir` can wait for a server, which must not happen on the shard's thread).
    pub fn needs_prepared_store(&self, topic: &str) -> bool {
        self.opts.segment_io == nsq_storage::SegmentIo::Threads
            && self.opts.data_path.is_some()
            && !topic.ends_with("#ephemeral")
            && nsq_wire::names::is_valid_topic_name(topic)
            && !self.prepared_dirs.borrow().contains_key(topic)
            && self
                .topics
                .borrow()
                .get(topic)
                .is_none_or(|t| t.store.is_none())
    }

    /// Makes and opens the directory of `topic`'s store on the blocking thread when
    /// [`Shard::needs_prepared_store`], for the store the next publish, subscribe or
    /// admin operation creates (the result, or its error, is kept until then). Call it
    /// before those synchronous operations; elsewhere a no-op.
    pub async fn prepare_store(&self, topic: &str) {
        if !self.needs_prepared_store(topic) {
            return;
        }
        let Some(dp) = &self.opts.data_path else {
            return;
        };
        let dir = nsq_storage::topic_dir(dp, topic);
        let deletes = self.topic_deletes.get();
        let made = glommio::executor()
            .spawn_blocking(move || nsq_storage::TopicStore::prepare_dir(&dir))
            .await
            .map_err(|e| e.to_string());
        if self.topic_deletes.get() == deletes
            && self
                .topics
                .borrow()
                .get(topic)
                .is_none_or(|t| t.store.is_none())
        {
            self.prepared_dirs
                .borrow_mut()
                .insert(topic.to_string(), made);
        }
    }

    /// [`Shard::prepare_store`] for every topic whose store could not be created, so
    /// that [`Shard::retry_missing_stores`] can retry it without blocking.
    pub async fn prepare_missing_stores(&self) {
        let missing: Vec<String> = self.missing_stores.borrow().iter().cloned().collect();
        for name in missing {
            self.prepare_store(&name).await;
        }
    }

    /// Publishes to a topic this shard owns, creating it if needed, and delivers what
    /// ready clients can take. Returns what to wait for before answering when the
    /// publish must be durable (`--sync-every=1`, or the store reported an error: then the
    /// answer tells whether this write reached the disk).
    pub fn publish_local(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<Option<DurableWait>, PublishError> {
        if self.shutdown.is_set() {
            return Err(PublishError::Exiting);
        }
        let bytes: u64 = bodies.iter().map(|b| b.len() as u64).sum();
        let mut topics = self.topics.borrow_mut();
        let t = self.get_or_create_topic(&mut topics, topic);
        if t.store.is_none() && t.store_error.is_some() {
            self.create_store(t, false).map_err(PublishError::Disk)?;
        }
        if let Some(st) = &t.store {
            // A failing disk holds what it could not write in memory until it heals;
            // once that is full, this publish is refused before it is appended, so
            // nothing already acknowledged ever makes room for it.
            st.admit(bytes as usize)
                .map_err(|e| PublishError::Disk(String::from(e)))?;
        }
        let (n, end) = t.publish(bodies, defer_until, self.opts.mem_queue_size);
        bump(&self.counters.messages_in, n);
        bump(&self.counters.bytes_in, bytes);
        let must_sync =
            self.opts.sync_every <= 1 || t.store.as_ref().is_some_and(|st| st.error().is_some());
        if t.stored < t.log.head {
            // Deferred store mode: what exceeds the memory queue goes now (all of it when
            // this publish must be durable); the rest when it is due, unless finished.
            let cutoff = crate::message::now_unix_nanos() - STORE_DELAY.as_nanos() as i64;
            if t.store_pump(cutoff, self.opts.mem_queue_size, must_sync) {
                self.mark_unstored(topic);
            }
        }
        let wait = t.store.as_ref().and_then(|st| {
            let durable = must_sync.then_some(end);
            (durable.is_some() || st.pending_bytes() > STORE_PENDING_HIGH).then(|| DurableWait {
                store: st.clone(),
                durable,
            })
        });
        self.dispatch_topic(t);
        if memory_may_shrink(t) {
            self.trim_pending.borrow_mut().insert(t.name.clone());
        }
        Ok(wait)
    }

    /// When durable topics hand records to their stores: at publish with
    /// `--sync-every=1` (each publish is synced before it is answered) and with
    /// retention (`--retention-time` / `--retention-bytes`: replay needs every record,
    /// see [`Options::retains`]), otherwise deferred so that records finished quickly
    /// never reach the disk.
    pub fn store_mode(&self) -> StoreMode {
        if self.opts.sync_every <= 1 || self.opts.retains() {
            StoreMode::Immediate
        } else {
            StoreMode::Deferred
        }
    }

    /// The store policy from the options.
    pub fn store_config(&self) -> nsq_storage::StoreConfig {
        nsq_storage::StoreConfig {
            max_bytes_per_file: self.opts.max_bytes_per_file,
            sync_every: self.opts.sync_every.max(1),
            sync_timeout: self.opts.sync_timeout,
            io: self.opts.segment_io,
        }
    }

    /// The first disk error of any topic store of this shard (nsqd's health), else a
    /// channel whose backlog cannot be read back from its segments while the read is
    /// retried (nsqd reports only write errors; a backlog that cannot be delivered is
    /// reported here too, until a read succeeds).
    pub fn health(&self) -> Option<String> {
        let topics = self.topics.borrow();
        topics
            .values()
            .find_map(|t| {
                t.store
                    .as_ref()
                    .and_then(|s| s.error().map(String::from))
                    .or_else(|| t.store_error.clone())
            })
            .or_else(|| self.meta_error.borrow().clone())
            .or_else(|| self.failed_recoveries.borrow().values().next().cloned())
            .or_else(|| {
                topics
                    .values()
                    .flat_map(|t| t.channels.values())
                    .find_map(|c| c.disk_error.clone())
            })
    }

    /// Starts a read from the store for every channel of `t` whose cursor is below the
    /// memory tail and whose read-ahead buffer runs low (without stalling anything else).
    fn schedule_disk_reads(&self, t: &mut Topic) {
        let Some(store) = t.store.clone() else { return };
        let base = t.log.base;
        for ch in t.channels.values_mut() {
            if let Some((from, max)) = ch.unread_read_from(base) {
                let me = self.me.borrow().upgrade();
                let Some(me) = me else { return };
                ch.unread_inflight = true;
                let read = DiskRead {
                    topic: t.name.clone(),
                    channel: ch.name.clone(),
                    from,
                    max,
                    hint: None,
                    epoch: ch.disk_epoch,
                };
                let store = store.clone();
                glommio::spawn_local(async move {
                    yield_once().await;
                    me.unread_read(store, read).await;
                })
                .detach();
            }
            let Some((from, max)) = ch.disk_read_from(base) else {
                continue;
            };
            let me = self.me.borrow().upgrade();
            let Some(me) = me else { return };
            ch.disk_inflight = true;
            let read = DiskRead {
                topic: t.name.clone(),
                channel: ch.name.clone(),
                from,
                max,
                hint: ch.disk_pos,
                epoch: ch.disk_epoch,
            };
            let store = store.clone();
            glommio::spawn_local(async move {
                // glommio polls a spawned task at once, while the caller still holds
                // the topics borrow: a read that completes without waiting (nothing
                // readable) must not borrow them before that returns.
                yield_once().await;
                me.disk_read(store, read).await;
            })
            .detach();
        }
    }

    /// The pause after a failed read is over: reads may start again.
    fn retry_disk_read(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        self.mark(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            ch.disk_inflight = false;
            ch.wants_disk = true;
        }
        self.schedule_disk_reads(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            if !ch.disk_inflight {
                // No read is wanted any more (the cursor moved past the disk: an empty,
                // a seek): the failing read is not retried, so it is no longer a fault.
                ch.disk_error = None;
            }
        }
    }

    /// Reads back the bodies of messages ready again below the memory tail (a deferred
    /// message that fell due, a requeued one recovered after a restart: see
    /// [`crate::channel::Channel::unread_read_from`]), then delivers. A failed read is
    /// retried after a pause that doubles, as the cursor's reads are.
    async fn unread_read(&self, store: Rc<nsq_storage::TopicStore>, r: DiskRead) {
        let (_, max_bytes) = crate::channel::DISK_READ_BATCH;
        let res = store.read_at(r.from, r.max.max(1), max_bytes, None).await;
        let readable = store.readable_seq();
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(&r.topic) else {
            return;
        };
        let base = t.log.base;
        let Some(ch) = t.channels.get_mut(&r.channel) else {
            return;
        };
        if ch.disk_epoch != r.epoch {
            // Emptied or sought meanwhile: what it was for is gone.
            ch.unread_inflight = false;
            self.schedule_disk_reads(t);
            return;
        }
        match res {
            Ok((recs, _)) => {
                ch.unread_inflight = false;
                ch.disk_failures = 0;
                ch.disk_error = None;
                let recs = recs
                    .into_iter()
                    .map(crate::topic::Record::from_stored)
                    .collect();
                let gone = ch.unread_arrived(r.from, base, readable, recs);
                if ch.unread_waits_for_store(base, readable) {
                    // Out of the memory tail and not written yet: read again shortly.
                    ch.unread_inflight = true;
                    if let Some(me) = self.me.borrow().upgrade() {
                        let (topic, channel) = (r.topic.clone(), r.channel.clone());
                        glommio::spawn_local(async move {
                            glommio::timer::sleep(UNREAD_WAIT).await;
                            me.retry_unread_read(&topic, &channel);
                        })
                        .detach();
                    }
                }
                if gone > 0 {
                    log::warn!(
                        "TOPIC({}) CHANNEL({}): {gone} messages ready again are missing on disk (finished before they were written, or lost); skipped",
                        r.topic,
                        r.channel
                    );
                }
            }
            Err(e) => {
                ch.disk_failures = ch.disk_failures.saturating_add(1);
                ch.disk_error = Some(format!(
                    "TOPIC({}) CHANNEL({}): disk read failed - {e}",
                    r.topic, r.channel
                ));
                let delay = Duration::from_millis(100 << (ch.disk_failures - 1).min(6))
                    .min(Duration::from_secs(5));
                log::error!(
                    "TOPIC({}) CHANNEL({}): disk read failed - {e}; retrying in {}",
                    r.topic,
                    r.channel,
                    nsq_wire::duration::go_duration_string(delay)
                );
                if let Some(me) = self.me.borrow().upgrade() {
                    let (topic, channel) = (r.topic.clone(), r.channel.clone());
                    glommio::spawn_local(async move {
                        glommio::timer::sleep(delay).await;
                        me.retry_unread_read(&topic, &channel);
                    })
                    .detach();
                }
                return;
            }
        }
        self.mark(t);
        if let Some(ch) = t.channels.get_mut(&r.channel) {
            let out = ch.dispatch(&t.log, Instant::now());
            self.schedule_timer(&r.topic, ch);
            bump(&self.counters.messages_out, out);
        }
        self.schedule_disk_reads(t);
    }

    /// The pause after a failed read for messages ready again is over.
    fn retry_unread_read(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if let Some(ch) = t.channels.get_mut(channel) {
            ch.unread_inflight = false;
        }
        self.schedule_disk_reads(t);
        if let Some(ch) = t.channels.get_mut(channel) {
            if !ch.unread_inflight && !ch.disk_inflight {
                ch.disk_error = None;
            }
        }
    }

    async fn disk_read(&self, store: Rc<nsq_storage::TopicStore>, r: DiskRead) {
        let (max, max_bytes) = crate::channel::DISK_READ_BATCH;
        let res = store
            .read_at(r.from, r.max.clamp(1, max), max_bytes, r.hint)
            .await;
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(&r.topic) else {
            return;
        };
        self.mark(t);
        let base = t.log.base;
        let Some(ch) = t.channels.get_mut(&r.channel) else {
            return;
        };
        if ch.disk_epoch != r.epoch {
            // The cursor jumped meanwhile (empty, seek): this read is stale.
            ch.disk_inflight = false;
            self.schedule_disk_reads(t);
            return;
        }
        ch.disk_inflight = false;
        if res.is_ok() {
            ch.disk_failures = 0;
            ch.disk_error = None;
        }
        match res {
            Ok((recs, pos)) if !recs.is_empty() => {
                ch.wants_disk = false;
                ch.disk_pos = pos;
                // Each body is copied out of the read's 1 MiB window: a slice would keep
                // the whole window alive as long as the message is held (in flight to a
                // consumer that does not read, requeued), a window per message.
                ch.push_disk(recs.into_iter().map(|r| {
                    let mut r = crate::topic::Record::from_stored(r);
                    r.body = bytes::Bytes::copy_from_slice(&r.body);
                    r
                }));
            }
            Ok(_) => {
                // Nothing on disk at or after `from` below the memory tail: those
                // records are gone (corrupt or deleted); continue from memory.
                if ch.disk.is_empty() && ch.cursor <= r.from && r.from < base {
                    log::error!(
                        "TOPIC({}) CHANNEL({}): records {}..{base} missing on disk; skipped",
                        r.topic,
                        r.channel,
                        r.from
                    );
                    ch.cursor = base;
                }
                ch.wants_disk = false;
            }
            Err(e) => {
                // Retried after a pause that doubles (100 ms .. 5 s): a disk that keeps
                // failing must not turn into a loop of reads and error lines.
                ch.disk_failures = ch.disk_failures.saturating_add(1);
                ch.disk_error = Some(format!(
                    "TOPIC({}) CHANNEL({}): disk read failed - {e}",
                    r.topic, r.channel
                ));
                let delay = Duration::from_millis(100 << (ch.disk_failures - 1).min(6))
                    .min(Duration::from_secs(5));
                log::error!(
                    "TOPIC({}) CHANNEL({}): disk read failed - {e}; retrying in {}",
                    r.topic,
                    r.channel,
                    nsq_wire::duration::go_duration_string(delay)
                );
                ch.wants_disk = false;
                ch.disk_inflight = true;
                if let Some(me) = self.me.borrow().upgrade() {
                    let (topic, channel) = (r.topic.clone(), r.channel.clone());
                    glommio::spawn_local(async move {
                        glommio::timer::sleep(delay).await;
                        me.retry_disk_read(&topic, &channel);
                    })
                    .detach();
                }
            }
        }
        let out = ch.dispatch(&t.log, Instant::now());
        self.schedule_timer(&r.topic, ch);
        bump(&self.counters.messages_out, out);
        self.schedule_disk_reads(t);
    }

    /// The answer to a topic's [`TopicCreatedHook`] query: creates `channels` (those
    /// nsqlookupd knows for the topic) all at once, then starts the topic's pump, so
    /// that every one of them gets what was published meanwhile. Ignored when the topic
    /// is gone or is another one by now (deleted and created again: another token).
    pub fn release_topic(&self, topic: &str, token: u64, channels: &[String]) {
        let mq = self.opts.mem_queue_size;
        let mut topics = self.topics.borrow_mut();
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        if t.held != Some(token) {
            return;
        }
        for c in channels {
            if t.create_channel(c, mq) {
                log::info!("TOPIC({topic}): new channel({c})");
                self.notify_lookup(LookupEvent::Register(topic.to_string(), Some(c.clone())));
            }
        }
        t.held = None;
        t.pump(mq);
        self.dispatch_topic(t);
        if memory_may_shrink(t) {
            self.trim_pending.borrow_mut().insert(t.name.clone());
        }
    }

    /// Creates a topic (no-op if it exists).
    pub fn create_topic(&self, topic: &str) {
        let mut topics = self.topics.borrow_mut();
        self.get_or_create_topic(&mut topics, topic);
    }

    fn dispatch_topic(&self, t: &mut Topic) {
        self.mark(t);
        let now = Instant::now();
        let mut out = 0;
        let mut disk = false;
        for ch in t.channels.values_mut() {
            out += ch.dispatch(&t.log, now);
            disk |= ch.wants_read(t.log.base);
            self.schedule_timer(&t.name, ch);
        }
        bump(&self.counters.messages_out, out);
        t.trim(self.opts.mem_queue_size);
        if disk {
            self.schedule_disk_reads(t);
        }
    }

    fn dispatch_channel(&self, topic: &str, channel: &str) {
        let mut topics = self.topics.borrow_mut();
        if let Some(t) = topics.get_mut(topic) {
            if let Some(ch) = t.channels.get_mut(channel) {
                let out = ch.dispatch(&t.log, Instant::now());
                let disk = ch.wants_read(t.log.base);
                self.schedule_timer(topic, ch);
                if out > 0 {
                    bump(&self.counters.messages_out, out);
                    t.trim(self.opts.mem_queue_size);
                    self.mark(t);
                }
                if disk {
                    self.schedule_disk_reads(t);
                }
            }
        }
    }

    /// SUB on this shard: creates topic and channel, adds the client (nsqd: SUB).
    ///
    /// Returns true when it created a durable channel: the SUB is answered once
    /// [`Shard::persist_changes`] has the channel in the metadata on disk, so that a
    /// message acknowledged after the answer is never lost to the channel by a crash.
    pub fn subscribe(&self, c: &Rc<Client>, topic: &str, channel: &str) -> Result<bool, SubError> {
        if self.shutdown.is_set() {
            return Err(SubError::Exiting);
        }
        let mut topics = self.topics.borrow_mut();
        let t = self.get_or_create_topic(&mut topics, topic);
        let mut created = false;
        if t.create_channel(channel, self.opts.mem_queue_size) {
            log::info!("TOPIC({topic}): new channel({channel})");
            self.notify_lookup(LookupEvent::Register(
                topic.to_string(),
                Some(channel.to_string()),
            ));
            created = t.store.is_some() && !crate::names::is_ephemeral(channel);
        }
        let ch = t.channels.get_mut(channel).expect("created above");
        ch.add_client(c.clone(), self.opts.max_channel_consumers)
            .map_err(|e| SubError::TooManyConsumers {
                topic: topic.to_string(),
                channel: channel.to_string(),
                max: e.max,
            })?;
        *c.subscription.borrow_mut() = Some((topic.to_string(), channel.to_string()));
        c.state.set(ClientState::Subscribed);
        Ok(created)
    }

    /// RDY changed (or the client otherwise may take more): deliver.
    pub fn client_ready_changed(&self, c: &Client) {
        let sub = c.subscription.borrow();
        if let Some((t, ch)) = sub.as_ref() {
            self.dispatch_channel(t, ch);
        }
    }

    fn with_channel<R>(
        &self,
        c: &Client,
        f: impl FnOnce(&mut crate::channel::Channel) -> Result<R, InFlightError>,
    ) -> Result<R, InFlightError> {
        let sub = c.subscription.borrow();
        let Some((t, chn)) = sub.as_ref() else {
            return Err(InFlightError::NotInFlight);
        };
        let r = {
            let mut topics = self.topics.borrow_mut();
            let topic = topics.get_mut(t).ok_or(InFlightError::NotInFlight)?;
            let ch = topic
                .channels
                .get_mut(chn)
                .ok_or(InFlightError::NotInFlight)?;
            let r = f(ch)?;
            self.mark(topic);
            r
        };
        self.dispatch_channel(t, chn);
        Ok(r)
    }

    pub fn finish(&self, c: &Client, id: MessageId) -> Result<(), InFlightError> {
        let opts = &self.opts;
        self.with_channel(c, |ch| {
            if ch.e2e.is_none() && !opts.e2e_percentiles.is_empty() {
                ch.e2e = Some(crate::quantile::Quantile::new(
                    opts.e2e_window,
                    &opts.e2e_percentiles,
                    crate::message::now_unix_nanos(),
                ));
            }
            ch.finish(c, id)
        })
    }

    pub fn requeue(&self, c: &Client, id: MessageId, delay: Duration) -> Result<(), InFlightError> {
        self.with_channel(c, |ch| ch.requeue(c, id, delay, Instant::now()))
    }

    pub fn touch(&self, c: &Client, id: MessageId) -> Result<(), InFlightError> {
        let max = self.opts.max_msg_timeout;
        self.with_channel(c, |ch| ch.touch(c, id, Instant::now(), max))
    }

    /// Registers `ch` (of `topic`) in the shard's timer queue if its earliest in-flight
    /// deadline or deferred due time moved earlier than where it is registered. Called
    /// after every change to a channel's timers; wakes the timer loop when the new
    /// instant is the earliest of the shard.
    pub fn schedule_timer(&self, topic: &str, ch: &mut crate::channel::Channel) {
        let Some(due) = ch.timer_to_schedule() else {
            return;
        };
        let mut timers = self.timers.borrow_mut();
        let earliest = timers.next_due().is_none_or(|d| due < d);
        timers.push(due, (topic.to_string(), ch.name.clone()));
        drop(timers);
        if earliest {
            self.timer_wake.notify();
        }
    }

    /// Registers the timers of every channel (after recovery, and every
    /// [`TIMER_REFRESH`] as a safety net; nsqd's queueScanLoop likewise refreshes its
    /// channel list every 5 s). Costs one look at each channel.
    pub fn schedule_all_timers(&self) {
        let mut topics = self.topics.borrow_mut();
        for t in topics.values_mut() {
            for ch in t.channels.values_mut() {
                self.schedule_timer(&t.name, ch);
            }
        }
    }

    /// When the next timer of this shard is due (an in-flight timeout or a deferred
    /// message of some channel), if any.
    pub fn next_timer_due(&self) -> Option<Instant> {
        self.timers.borrow().next_due()
    }

    /// One pass of the shard's timer at `now`: this is nsqd's queueScanLoop (nsqd.go),
    /// run by each shard's timer loop (`src/runtime.rs` timer_loop) for the channels it
    /// owns. The channels whose earliest timer is due move expired in-flight messages and
    /// due deferred messages back to their queue and deliver them again; the other
    /// channels are not visited. How it differs: nsqd wakes every 100 ms, samples 20
    /// random channels (queueScanSelectionCount) and rescans at once while more than 25 %
    /// of them were dirty, with a pool of workers; here the shard keeps its channels by
    /// earliest due time (`timers`), so it visits exactly the due ones, at most `TICK`
    /// (10 ms) after they are due, with no pool (each shard scans its own).
    /// Also trims the memory tail of topics whose store made more records readable, and
    /// delivers to every ready consumer of this shard whose channel has messages (a
    /// safety net: every change that makes a client ready delivers at once). Returns how
    /// many channels were visited for timers.
    pub fn process_timers(&self, now: Instant) -> usize {
        let due = self.timers.borrow_mut().pop_due(now);
        let visited = due.len();
        let mut out = 0;
        let mut topics = self.topics.borrow_mut();
        for (tn, cn) in due {
            let Some(t) = topics.get_mut(&tn) else {
                continue;
            };
            let Some(ch) = t.channels.get_mut(&cn) else {
                continue;
            };
            ch.timer_fired(now);
            let mut disk = false;
            let moved = ch.process_timers(now) > 0;
            if moved {
                out += ch.dispatch(&t.log, now);
                disk = ch.wants_disk || ch.wants_read(t.log.base);
            }
            self.schedule_timer(&tn, ch);
            if moved {
                self.mark(t);
            }
            if disk {
                self.schedule_disk_reads(t);
            }
        }
        // Memory is also freed as the store makes records readable from disk.
        let pending: Vec<String> = self.trim_pending.borrow().iter().cloned().collect();
        for name in pending {
            let done = match topics.get_mut(&name) {
                Some(t) => {
                    t.trim(self.opts.mem_queue_size);
                    !memory_may_shrink(t)
                }
                None => true,
            };
            if done {
                self.trim_pending.borrow_mut().remove(&name);
            }
        }
        drop(topics);
        bump(&self.counters.messages_out, out);
        let ready: Vec<(String, String)> = self
            .clients
            .borrow()
            .values()
            .filter_map(|w| w.upgrade())
            .filter(|c| c.is_ready() && !c.output_full())
            .filter_map(|c| c.subscription.borrow().clone())
            .collect();
        for (t, ch) in ready {
            self.dispatch_channel(&t, &ch);
        }
        visited
    }

    /// Runs an admin operation on a topic this shard owns (nsqd: http.go handlers).
    pub fn admin(&self, op: AdminOp) -> Result<(), AdminError> {
        self.mark_changed(op.topic());
        let mut topics = self.topics.borrow_mut();
        let mq = self.opts.mem_queue_size;
        match op {
            AdminOp::CreateTopic(t) => {
                self.get_or_create_topic(&mut topics, &t);
            }
            AdminOp::DeleteTopic(t) => {
                let mut topic = topics.remove(&t).ok_or(AdminError::TopicNotFound)?;
                for ch in topic.channels.values_mut() {
                    ch.close_clients();
                }
                self.topic_deleted(&topic);
                log::info!("TOPIC({t}): deleting");
            }
            AdminOp::EmptyTopic(t) => {
                topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?.empty();
            }
            AdminOp::PauseTopic(t, paused) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                topic.paused = paused;
                self.request_checkpoint();
                if !paused {
                    topic.pump(mq);
                    self.dispatch_topic(topic);
                }
            }
            AdminOp::CreateChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                if topic.create_channel(&c, mq) {
                    log::info!("TOPIC({t}): new channel({c})");
                    self.notify_lookup(LookupEvent::Register(t.clone(), Some(c.clone())));
                }
            }
            AdminOp::DeleteChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let mut ch = topic
                    .channels
                    .remove(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.close_clients();
                crate::memory_freed(ch.disk_buffered_bytes());
                topic.trim(self.opts.mem_queue_size);
                log::info!("TOPIC({t}): deleting channel {c}");
                self.notify_lookup(LookupEvent::Unregister(t.clone(), Some(c.clone())));
                if topic.ephemeral && topic.channels.is_empty() {
                    if let Some(gone) = topics.remove(&t) {
                        self.topic_deleted(&gone);
                    }
                }
            }
            AdminOp::EmptyChannel(t, c) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.empty(&topic.log);
                topic.trim(self.opts.mem_queue_size);
            }
            // It may need the disk: callers go through `admin_async`.
            AdminOp::SeekChannel(..) => return Err(AdminError::Internal),
            AdminOp::PauseChannel(t, c, paused) => {
                let topic = topics.get_mut(&t).ok_or(AdminError::TopicNotFound)?;
                let ch = topic
                    .channels
                    .get_mut(&c)
                    .ok_or(AdminError::ChannelNotFound)?;
                ch.paused = paused;
                self.request_checkpoint();
                if !paused {
                    let out = ch.dispatch(&topic.log, Instant::now());
                    bump(&self.counters.messages_out, out);
                    self.schedule_timer(&t, ch);
                }
            }
        }
        Ok(())
    }

    /// Runs an admin operation on a topic this shard owns, waiting for the disk when it
    /// must (`SeekChannel`); the others complete at once as with [`Shard::admin`].
    pub async fn admin_async(&self, op: AdminOp) -> Result<(), AdminError> {
        match op {
            // Boxed: its disk search's state (1.2 KB) would otherwise sit in every
            // future that awaits an admin operation (every connection's task).
            AdminOp::SeekChannel(t, c, to) => {
                Box::pin(self.seek_channel(&t, &c, to)).await.map(|_| ())
            }
            op => {
                if self.admin_creates_store(&op) {
                    self.prepare_store(op.topic()).await;
                }
                let persist = self.admin_persists(&op);
                self.admin(op)?;
                if persist {
                    Box::pin(self.persist_changes()).await;
                }
                Ok(())
            }
        }
    }

    /// True when `op`'s answer waits for the metadata on disk ([`Shard::persist_changes`]):
    /// a channel created, deleted or paused, or a topic paused, on a durable topic (nsqd
    /// persists metadata on pause before answering; here also on create and delete,
    /// which nsqd writes soon after), so that a crash after the answer never brings a
    /// deleted channel back or loses an acknowledged message to a new one.
    pub fn admin_persists(&self, op: &AdminOp) -> bool {
        matches!(
            op,
            AdminOp::CreateChannel(..)
                | AdminOp::DeleteChannel(..)
                | AdminOp::PauseChannel(..)
                | AdminOp::PauseTopic(..)
        ) && self
            .topics
            .borrow()
            .get(op.topic())
            .is_some_and(|t| t.store.is_some())
    }

    /// `POST /channel/seek` (beyond nsqd) on a topic this shard owns: moves the channel's
    /// cursor to the oldest retained message (`Oldest`), past the newest one the channel
    /// was given (`Newest`: the topic's pump position), or to the first retained message
    /// published at or after a time (`Timestamp`, Unix ns; past the newest when none
    /// is that recent). The in-memory tail is searched first, then the store
    /// ([`nsq_storage::TopicStore::seek_timestamp`]); the result is kept within
    /// [oldest retained, pump position]. What happens to the channel's messages is
    /// [`crate::channel::Channel::seek`]'s rule. The new cursor is persisted by the next
    /// checkpoint like any cursor. Returns the new cursor; errors: `TopicNotFound`,
    /// `ChannelNotFound` (also when either was deleted during the disk search),
    /// `Internal` when the disk read failed (logged).
    pub async fn seek_channel(
        &self,
        topic: &str,
        channel: &str,
        to: SeekTo,
    ) -> Result<u64, AdminError> {
        // Records below the memory tail are on disk only: those the writer has not
        // flushed yet (it buffers until the next sync) are made readable first, for the
        // search and for the channel's reads.
        let unflushed = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(AdminError::TopicNotFound)?;
            if !t.channels.contains_key(channel) {
                return Err(AdminError::ChannelNotFound);
            }
            // (Only what was handed to the store: records finished before they were
            // due to be written never are, without retention.)
            t.store.as_ref().and_then(|st| {
                let upto = t.log.base.min(st.next_seq());
                (to != SeekTo::Newest && st.readable_seq() < upto).then(|| (st.clone(), upto))
            })
        };
        if let Some((st, upto)) = unflushed {
            if let Err(e) = st.wait_durable(upto).await {
                log::error!("TOPIC({topic}) CHANNEL({channel}): seek failed - {e}");
                return Err(AdminError::Internal);
            }
        }
        enum Plan {
            At(u64),
            /// Search the store for `ts`; `first` is the oldest in-memory match.
            Disk {
                store: Rc<nsq_storage::TopicStore>,
                ts: i64,
                first: u64,
            },
        }
        let plan = {
            let topics = self.topics.borrow();
            let t = topics.get(topic).ok_or(AdminError::TopicNotFound)?;
            if !t.channels.contains_key(channel) {
                return Err(AdminError::ChannelNotFound);
            }
            match to {
                SeekTo::Oldest => Plan::At(t.oldest_retained()),
                SeekTo::Newest => Plan::At(t.log.pumped),
                SeekTo::Timestamp(ts) => match (t.seek_in_memory(ts), &t.store) {
                    (Ok(seq), _) => Plan::At(seq),
                    (Err(first), None) => Plan::At(first),
                    (Err(first), Some(st)) => Plan::Disk {
                        store: st.clone(),
                        ts,
                        first,
                    },
                },
            }
        };
        let target = match plan {
            Plan::At(seq) => seq,
            Plan::Disk { store, ts, first } => match store.seek_timestamp(ts).await {
                Ok(found) => found.map_or(first, |s| s.min(first)),
                Err(e) => {
                    log::error!("TOPIC({topic}) CHANNEL({channel}): seek failed - {e}");
                    return Err(AdminError::Internal);
                }
            },
        };
        let mut topics = self.topics.borrow_mut();
        let t = topics.get_mut(topic).ok_or(AdminError::TopicNotFound)?;
        let target = target.max(t.oldest_retained()).min(t.log.pumped);
        let ch = t
            .channels
            .get_mut(channel)
            .ok_or(AdminError::ChannelNotFound)?;
        let from = ch.cursor;
        ch.seek(target);
        log::info!("TOPIC({topic}) CHANNEL({channel}): seek {to:?}: cursor {from} -> {target}");
        let out = ch.dispatch(&t.log, Instant::now());
        self.schedule_timer(topic, ch);
        bump(&self.counters.messages_out, out);
        self.mark(t);
        t.trim(self.opts.mem_queue_size);
        self.schedule_disk_reads(t);
        Ok(target)
    }

    /// This shard's part of /stats.
    pub fn stats(&self, req: &StatsRequest) -> ShardStats {
        let now_ns = crate::message::now_unix_nanos();
        // A health check tells the state now: a store that can be created now is.
        self.retry_missing_stores();
        let health_error = self.health();
        let topics = self.topics.borrow();
        let mut names: Vec<&String> = topics.keys().collect();
        names.sort();
        let mut out = Vec::new();
        let mut counters = ShardCounters {
            shard: self.index,
            cpu: self.cpu,
            topics: topics.len(),
            clients: self.clients.borrow().len(),
            messages_in: self.counters.messages_in.get(),
            bytes_in: self.counters.bytes_in.get(),
            messages_out: self.counters.messages_out.get(),
            bytes_out: self.counters.bytes_out.get(),
            cross_shard_sent: self.counters.cross_shard_sent.get(),
            cross_shard_received: self.counters.cross_shard_received.get(),
            handoffs_sent: self.counters.handoffs_sent.get(),
            handoffs_received: self.counters.handoffs_received.get(),
            loop_lag_us: self.counters.loop_lag_us.get(),
            loop_lag_max_us: self.counters.loop_lag_max_us.get(),
            health_error,
            ..Default::default()
        };
        for t in topics.values() {
            counters.channels += t.channels.len();
            counters.depth += t.depth();
            for ch in t.channels.values() {
                counters.depth += ch.depth(&t.log);
                counters.in_flight += ch.in_flight.len() as u64;
                counters.deferred += ch.deferred.len() as u64;
            }
        }
        let mut topic_names = Vec::new();
        if req.counters_only {
            topic_names = names.iter().map(|n| n.to_string()).collect();
            names.clear();
        }
        let retains = self.opts.retains();
        for name in names {
            if !req.topic.is_empty() && *name != req.topic {
                continue;
            }
            let t = &topics[name];
            let mut channels = Vec::new();
            for ch in t.channels.values() {
                if !req.channel.is_empty() && ch.name != req.channel {
                    continue;
                }
                let clients = req.include_clients.then(|| {
                    ch.clients
                        .iter()
                        .map(|c| client_stats(c, &req.topic))
                        .collect()
                });
                channels.push(ChannelStats {
                    channel_name: ch.name.clone(),
                    depth: ch.depth(&t.log),
                    backend_depth: ch.backend_depth(&t.log),
                    in_flight_count: ch.in_flight.len(),
                    deferred_count: ch.deferred.len(),
                    message_count: ch.message_count,
                    requeue_count: ch.requeue_count,
                    timeout_count: ch.timeout_count,
                    client_count: ch.clients.len(),
                    clients,
                    paused: ch.paused,
                    e2e_processing_latency: channel_e2e(ch, &self.opts, now_ns),
                });
            }
            if !req.channel.is_empty() && channels.is_empty() {
                continue;
            }
            out.push(TopicStats {
                topic_name: t.name.clone(),
                channels,
                depth: t.depth(),
                backend_depth: t.backend_depth(),
                message_count: t.message_count,
                message_bytes: t.message_bytes,
                paused: t.paused,
                e2e_processing_latency: topic_e2e(t, &self.opts, now_ns),
                retained_oldest_timestamp: retains.then_some(t.retained.oldest_timestamp),
                retained_messages: retains.then_some(t.retained.messages),
                retained_bytes: retains.then_some(t.retained.bytes),
            });
        }
        let mut producers = Vec::new();
        if req.include_clients {
            let clients = self.clients.borrow();
            let mut list: Vec<Rc<Client>> = clients.values().filter_map(|w| w.upgrade()).collect();
            list.sort_by_key(|c| c.id);
            for c in list {
                if !c.pub_counts.borrow().is_empty() {
                    producers.push(client_stats(&c, &req.topic));
                }
            }
        }
        let client_count = self.clients.borrow().len();
        ShardStats {
            topics: out,
            producers,
            counters,
            client_count,
            topic_found: !req.topic.is_empty() && topics.contains_key(&req.topic),
            topic_names,
        }
    }

    /// Closes every connection (graceful shutdown).
    pub fn close_all_clients(&self) {
        let list: Vec<Rc<Client>> = self
            .clients
            .borrow()
            .values()
            .filter_map(|w| w.upgrade())
            .collect();
        for c in list {
            c.kill();
        }
    }

    pub fn count_cross_sent(&self) {
        bump(&self.counters.cross_shard_sent, 1);
    }
    pub fn count_cross_received(&self) {
        bump(&self.counters.cross_shard_received, 1);
    }
    pub fn count_handoff_sent(&self) {
        bump(&self.counters.handoffs_sent, 1);
    }
    pub fn count_handoff_received(&self) {
        bump(&self.counters.handoffs_received, 1);
    }
    /// Records the lateness of a timer tick (event-loop lag), in microseconds.
    pub fn record_loop_lag(&self, us: u64) {
        self.counters.loop_lag_us.set(us);
        if us > self.counters.loop_lag_max_us.get() {
            self.counters.loop_lag_max_us.set(us);
        }
    }

    pub fn count_bytes_out(&self, n: u64) {
        bump(&self.counters.bytes_out, n);
    }
}

/// True while `t`'s memory tail may still shrink without any channel moving: some of its
/// records are not yet handed to its store or not yet readable from disk (see
/// `Topic::trim`).
fn memory_may_shrink(t: &Topic) -> bool {
    t.store
        .as_ref()
        .is_some_and(|st| t.stored < t.log.head || st.readable_seq() < st.next_seq())
}

/// A client's /stats entry. `topic` filters pub_counts like nsqd (which lists only the
/// first topic because of an upstream `break`).
pub fn client_stats(c: &Client, topic: &str) -> ClientStats {
    let s = c.settings.borrow();
    let auth = c.auth.borrow();
    let pub_counts = c
        .pub_counts
        .borrow()
        .iter()
        .filter(|(t, _)| topic.is_empty() || t == topic)
        .take(1)
        .map(|(t, n)| PubCount {
            topic: t.clone(),
            count: *n,
        })
        .collect();
    ClientStats {
        client_id: s.client_id.clone(),
        hostname: s.hostname.clone(),
        version: "V2",
        remote_address: c.remote_address.clone(),
        state: c.state.get() as i32,
        ready_count: c.ready_count.get(),
        in_flight_count: c.in_flight.get(),
        message_count: c.message_count.get(),
        finish_count: c.finish_count.get(),
        requeue_count: c.requeue_count.get(),
        connect_ts: c.connect_ts,
        sample_rate: s.sample_rate as i32,
        deflate: matches!(c.compression.get(), crate::client::Compression::Deflate(_)),
        snappy: c.compression.get() == crate::client::Compression::Snappy,
        user_agent: s.user_agent.clone(),
        authed: c.has_authorizations(),
        auth_identity: auth
            .as_ref()
            .map(|a| a.identity.clone())
            .unwrap_or_default(),
        auth_identity_url: auth
            .as_ref()
            .map(|a| a.identity_url.clone())
            .unwrap_or_default(),
        pub_counts,
        tls: c.tls.borrow().is_some(),
        tls_cipher_suite: c
            .tls
            .borrow()
            .as_ref()
            .map(|t| t.1.clone())
            .unwrap_or_default(),
        tls_version: c
            .tls
            .borrow()
            .as_ref()
            .map(|t| t.0.clone())
            .unwrap_or_default(),
        tls_negotiated_protocol: String::new(),
        tls_negotiated_protocol_is_mutual: false,
    }
}

/// A channel's `e2e_processing_latency` (nsqd: Channel stats, Quantile.Result): zeros
/// for a channel with no FIN yet, `{"count":0,"percentiles":null}` when not configured.
fn channel_e2e(ch: &crate::channel::Channel, opts: &Options, now: i64) -> E2eLatency {
    if opts.e2e_percentiles.is_empty() {
        return E2eLatency::default();
    }
    let mut q = ch.e2e.clone().unwrap_or_else(|| {
        crate::quantile::Quantile::new(opts.e2e_window, &opts.e2e_percentiles, now)
    });
    E2eLatency::from_result(q.result(now))
}

/// A topic's `e2e_processing_latency`: its channels' streams merged (nsqd:
/// AggregateChannelE2eProcessingLatency); none without channels.
fn topic_e2e(t: &crate::topic::Topic, opts: &Options, now: i64) -> E2eLatency {
    if opts.e2e_percentiles.is_empty() || t.channels.is_empty() {
        return E2eLatency::default();
    }
    let mut agg = crate::quantile::Quantile::new(opts.e2e_window, &opts.e2e_percentiles, now);
    for ch in t.channels.values() {
        if let Some(q) = &ch.e2e {
            agg.merge(q);
        }
    }
    E2eLatency::from_result(agg.result(now))
}

#[cfg(test)]
mod tests {
    //! SUB, pause and delete through the shard (no store, no runtime needed).
    use super::*;
    use crate::client::ClientSettings;

    fn client(shard: &Shard) -> Rc<Client> {
        let c = Rc::new(Client::new(
            shard.new_client_id(),
            "127.0.0.1:1".into(),
            ClientSettings {
                client_id: "c".into(),
                hostname: "h".into(),
                user_agent: String::new(),
                heartbeat_interval: None,
                output_buffer_size: 16384,
                output_buffer_timeout: Duration::from_millis(250),
                sample_rate: 0,
                msg_timeout: Duration::from_secs(60),
                identified: false,
                pump: Default::default(),
            }
            .with_current_pump(),
        ));
        shard.register_client(&c);
        c
    }

    fn shard(max_channel_consumers: usize) -> Shard {
        Shard::new(
            0,
            1,
            0,
            Options {
                max_channel_consumers,
                ..Options::default()
            },
        )
    }

    fn in_flight(s: &Shard, t: &str, c: &str) -> usize {
        s.topics.borrow()[t].channels[c].in_flight_count()
    }

    #[test]
    fn sub_beyond_max_channel_consumers_is_refused_with_nsqds_text() {
        let s = shard(1);
        let (a, b) = (client(&s), client(&s));
        s.subscribe(&a, "t", "c").unwrap();
        assert_eq!(a.state(), ClientState::Subscribed);
        assert_eq!(a.subscription(), Some(("t".into(), "c".into())));
        let e = s.subscribe(&b, "t", "c").unwrap_err();
        assert_eq!(
            e,
            SubError::TooManyConsumers {
                topic: "t".into(),
                channel: "c".into(),
                max: 1
            }
        );
        assert_eq!(e.to_string(), "consumers for t:c exceeds limit of 1");
        assert_eq!(b.state(), ClientState::Init);
        assert_eq!(b.subscription(), None);
        // Another channel of the topic is not affected.
        s.subscribe(&b, "t", "d").unwrap();
    }

    /// Runs `body` on a glommio executor with a one-shard `Shard` whose data path is
    /// `dir` (the caller makes and removes it), given the path too.
    fn on_durable_shard<F, Fut>(dir: &std::path::Path, body: F)
    where
        F: FnOnce(Shard, std::path::PathBuf) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        on_durable_shard_with(dir, Options::default(), body)
    }

    /// [`on_durable_shard`] with `opts` (its data path set to `dir`).
    fn on_durable_shard_with<F, Fut>(dir: &std::path::Path, opts: Options, body: F)
    where
        F: FnOnce(Shard, std::path::PathBuf) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let d = dir.to_path_buf();
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let s = Shard::new(
                    0,
                    1,
                    0,
                    Options {
                        data_path: Some(d.clone()),
                        ..opts
                    },
                );
                body(s, d).await
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_checkpoint_looks_only_at_the_topics_that_changed() {
        // 300 durable topics with a channel and a message each; once their metadata is
        // written, an idle checkpoint looks at none of them and a change to one topic
        // costs a look at that topic only.
        let dir = std::env::temp_dir().join(format!("nsq-shards-changed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        on_durable_shard(&dir, |s, d2| async move {
            for i in 0..300 {
                let t = format!("t{i}");
                s.publish_local(&t, vec![Bytes::from_static(b"a")], None)
                    .unwrap();
                s.admin(AdminOp::CreateChannel(t, "c".into())).unwrap();
            }
            assert_eq!(s.checkpoint().await, 300);
            assert_eq!(s.checkpoint().await, 0, "nothing changed");
            s.admin(AdminOp::CreateChannel("t7".into(), "d".into()))
                .unwrap();
            assert_eq!(s.checkpoint().await, 1, "one topic changed");
            let meta = nsq_storage::topic_dir(&d2, "t7").join("meta.json");
            let text = std::fs::read_to_string(&meta).unwrap();
            assert!(text.contains("\"d\""), "{text}");
            s.publish_local("t9", vec![Bytes::from_static(b"b")], None)
                .unwrap();
            assert_eq!(s.checkpoint().await, 1, "one topic published to");
            s.shutdown.set();
            s.close_stores().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_checkpoint_dropped_mid_write_does_not_stop_the_next_ones() {
        // A connection's task that answers after the metadata is written runs the
        // checkpoint itself; when its client goes away mid-write, the future is dropped.
        // Later checkpoints (the shutdown's included) must still run.
        let dir = std::env::temp_dir().join(format!("nsq-shards-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        on_durable_shard(&dir, |s, d2| async move {
            s.publish_local("t", vec![Bytes::from_static(b"a")], None)
                .unwrap();
            s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
                .unwrap();
            {
                let mut fut = std::pin::pin!(s.run_checkpoint());
                assert!(
                    futures::poll!(fut.as_mut()).is_pending(),
                    "the metadata write waits for the disk"
                );
                assert!(s.checkpoint_running.get());
            }
            assert!(!s.checkpoint_running.get(), "released when dropped");
            let next = glommio::timer::timeout(Duration::from_secs(10), async {
                s.persist_changes().await;
                Ok(())
            })
            .await;
            assert!(next.is_ok(), "a later checkpoint ran");
            let meta = nsq_storage::topic_dir(&d2, "t").join("meta.json");
            let text = std::fs::read_to_string(&meta).unwrap();
            assert!(text.contains("\"c\""), "{text}");
            s.shutdown.set();
            s.close_stores().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Waits (yielding to the executor) until `cond` holds, for at most 10 s.
    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if cond() {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting until {what}");
    }

    #[test]
    fn deferred_messages_hold_no_body_and_are_read_back_from_disk_when_due() {
        // A durable topic's deferred messages keep their bodies in the log only once
        // the store has written them: then, out of the memory tail, falling due reads them
        // back from the store and delivers them with their bodies. After a restart they come back without a
        // read of any body, and are delivered when due the same way.
        let dir = std::env::temp_dir().join(format!("nsq-shards-defer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let opts = Options {
            mem_queue_size: 10,
            ..Options::default()
        };
        on_durable_shard_with(&dir, opts, |s, d2| async move {
            let s = Rc::new(s);
            *s.me.borrow_mut() = Rc::downgrade(&s);
            let bodies = |from: usize| -> Vec<Bytes> {
                (from..from + 100)
                    .map(|i| Bytes::from(format!("body-{i:04}")))
                    .collect()
            };
            let delivered = |c: &Client, from: usize| {
                let out = c.out.borrow();
                (from..from + 100)
                    .filter(|i| {
                        let b = format!("body-{i:04}");
                        out.windows(b.len()).any(|w| w == b.as_bytes())
                    })
                    .count()
            };
            s.publish_local("t", vec![Bytes::from_static(b"first")], None)
                .unwrap();
            s.admin(AdminOp::CreateChannel("t".into(), "c".into()))
                .unwrap();
            let due = Instant::now() + Duration::from_millis(300);
            s.publish_local("t", bodies(0), Some(due)).unwrap();
            {
                let topics = s.topics.borrow();
                let ch = &topics["t"].channels["c"];
                assert_eq!(ch.deferred_count(), 100);
                assert_eq!(ch.deferred_bodies.len(), 100, "held until written");
            }
            // Written, then (90 of them) out of the memory tail.
            s.pump_stores(true);
            until("the deferred records leave memory", || {
                let mut topics = s.topics.borrow_mut();
                let t = topics.get_mut("t").unwrap();
                t.trim(s.opts.mem_queue_size);
                // All but the newest --mem-queue-size (10).
                t.log.base() + 10 == t.log.head()
            })
            .await;
            assert!(
                s.topics.borrow()["t"].channels["c"]
                    .deferred_bodies
                    .is_empty(),
                "no body held once written"
            );
            let c = client(&s);
            s.subscribe(&c, "t", "c").unwrap();
            c.set_ready_count(500);
            s.client_ready_changed(&c);
            until("the undeferred one is read back and delivered", || {
                in_flight(&s, "t", "c") == 1
            })
            .await;
            assert_eq!(delivered(&c, 0), 0, "none is due yet");
            glommio::timer::sleep(due.saturating_duration_since(Instant::now())).await;
            s.process_timers(Instant::now());
            until("every deferred message is in flight", || {
                in_flight(&s, "t", "c") == 101
            })
            .await;
            assert_eq!(delivered(&c, 0), 100, "bodies read back from disk");

            // Deferred again, held across a clean restart.
            let due = Instant::now() + Duration::from_millis(400);
            s.publish_local("t", bodies(100), Some(due)).unwrap();
            s.shutdown.set();
            s.close_stores().await;
            drop(c);
            let s2 = Rc::new(Shard::new(
                0,
                1,
                0,
                Options {
                    data_path: Some(d2.clone()),
                    mem_queue_size: 10,
                    ..Options::default()
                },
            ));
            *s2.me.borrow_mut() = Rc::downgrade(&s2);
            s2.recover().await;
            {
                let topics = s2.topics.borrow();
                let t = &topics["t"];
                let ch = &t.channels["c"];
                assert_eq!(ch.deferred_count(), 100);
                assert!(ch.deferred_bodies.is_empty(), "no body read at start");
                // The 101 in flight before the restart are ready again, bodies unread.
                assert_eq!(ch.requeued_count(), 101);
                assert_eq!(ch.ready_unread.len(), 101);
            }
            let c2 = client(&s2);
            s2.subscribe(&c2, "t", "c").unwrap();
            c2.set_ready_count(500);
            s2.client_ready_changed(&c2);
            until(
                "the recovered in-flight messages are delivered again",
                || in_flight(&s2, "t", "c") == 101,
            )
            .await;
            assert_eq!(delivered(&c2, 0), 100);
            assert_eq!(delivered(&c2, 100), 0, "not due yet");
            glommio::timer::sleep(due.saturating_duration_since(Instant::now())).await;
            s2.process_timers(Instant::now());
            until("the recovered deferred messages are delivered", || {
                in_flight(&s2, "t", "c") == 201
            })
            .await;
            assert_eq!(delivered(&c2, 100), 100);
            s2.shutdown.set();
            s2.close_stores().await;
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sub_while_exiting_is_refused() {
        let s = shard(0);
        let c = client(&s);
        s.shutdown.set();
        let e = s.subscribe(&c, "t", "c").unwrap_err();
        assert_eq!(
            (e.clone(), e.to_string()),
            (SubError::Exiting, "exiting".into())
        );
        assert!(s.topics.borrow().is_empty(), "nothing created");
    }

    #[test]
    fn pause_channel_stops_delivery_and_unpause_resumes_it() {
        let s = shard(0);
        let c = client(&s);
        s.subscribe(&c, "t", "c").unwrap();
        c.set_ready_count(10);
        s.admin(AdminOp::PauseChannel("t".into(), "c".into(), true))
            .unwrap();
        s.publish_local("t", vec![Bytes::from_static(b"a")], None)
            .unwrap();
        assert_eq!(in_flight(&s, "t", "c"), 0);
        s.client_ready_changed(&c);
        assert_eq!(in_flight(&s, "t", "c"), 0, "still paused");
        s.admin(AdminOp::PauseChannel("t".into(), "c".into(), false))
            .unwrap();
        assert_eq!(in_flight(&s, "t", "c"), 1, "unpause delivers");
        assert_eq!(c.message_count(), 1);
    }

    #[test]
    fn delete_channel_closes_its_consumers_and_forgets_its_messages() {
        let s = shard(0);
        let c = client(&s);
        s.subscribe(&c, "t", "c").unwrap();
        c.set_ready_count(10);
        s.publish_local("t", vec![Bytes::from_static(b"a")], None)
            .unwrap();
        assert_eq!(in_flight(&s, "t", "c"), 1);
        s.admin(AdminOp::DeleteChannel("t".into(), "c".into()))
            .unwrap();
        assert!(c.closed.get());
        assert_eq!(c.state(), ClientState::Closing);
        assert!(!s.topics.borrow()["t"].channels.contains_key("c"));
        assert_eq!(
            s.admin(AdminOp::DeleteChannel("t".into(), "c".into())),
            Err(AdminError::ChannelNotFound)
        );
        // FIN of what was in flight fails now.
        let id = MessageId(0);
        assert!(s.finish(&c, id).is_err());
    }

    #[test]
    fn ephemeral_channel_and_topic_go_with_their_last_client() {
        let s = shard(0);
        let c = client(&s);
        s.subscribe(&c, "t#ephemeral", "c#ephemeral").unwrap();
        s.client_gone(&c);
        assert!(s.topics.borrow().is_empty());
    }

    #[test]
    fn a_topic_that_failed_to_load_is_unhealthy_and_keeps_its_data() {
        // Recovery at start-up could not load the topic (`Shard::recover` records it):
        // `/ping` reports it, and a publish to it is refused rather than starting a new
        // store over the segments still in its directory.
        let dir = std::env::temp_dir().join(format!("nsq-shards-failed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let topic_dir = nsq_storage::topic_dir(&dir, "t");
        std::fs::create_dir_all(&topic_dir).unwrap();
        let seg = topic_dir.join("00000000000000000000.seg");
        std::fs::write(&seg, b"old data").unwrap();
        on_durable_shard(&dir, |s, _| async move {
            assert_eq!(s.health(), None);
            let e = "TOPIC(t): recovery failed - Too many open files (os error 24)";
            s.failed_recoveries
                .borrow_mut()
                .insert("t".into(), e.into());
            assert_eq!(s.health().as_deref(), Some(e));
            let r = s.publish_local("t", vec![Bytes::from_static(b"new")], None);
            assert!(
                matches!(&r, Err(PublishError::Disk(m)) if m == e),
                "{:?}",
                r.err()
            );
            s.retry_missing_stores();
            assert!(
                s.topics.borrow()["t"].store.is_none(),
                "no store made afresh"
            );
            assert_eq!(s.health().as_deref(), Some(e));
        });
        assert_eq!(
            std::fs::read(&seg).unwrap(),
            b"old data",
            "the old data is kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
