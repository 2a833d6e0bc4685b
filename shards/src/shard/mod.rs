//! One shard: the topics it owns and everything hanging off them, its connections'
//! handles, its counters, and its end of the mesh. Only its own executor thread touches
//! it; every method is synchronous and never holds a borrow across an `.await`.
//!
//! This file holds the struct, its constructor and the helpers every concern uses (the
//! metadata and store marks, checkpoints on request, topic creation and deletion); the
//! methods are split by concern over `publish.rs`, `subscribe.rs` (SUB, clients, RDY),
//! `delivery.rs` (dispatch, FIN/REQ/TOUCH, timers), `read_ahead.rs` (disk reads),
//! `store_prep.rs` (topic stores), `admin.rs` (admin operations, seek) and `stats.rs`
//! (/stats, health, counters). Recovery and checkpoints are in [`crate::persist`].

use crate::options::Options;
use crate::topic::Topic;
use crate::wake::Latch;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Weak;
use std::time::Duration;

mod admin;
mod dead;
mod delivery;
pub mod inspect;
mod lookup;
mod publish;
mod read_ahead;
mod replica;
pub use replica::{ChannelPosition, DetachedConsumer, PendingState};
mod stats;
mod store_prep;
mod subscribe;

pub use admin::DrainLeft;
pub use dead::DeadLetters;
pub use delivery::Timers;
pub use lookup::Lookup;
pub use publish::DurableWait;
pub use stats::client_stats;
pub use store_prep::CreateStoreError;
pub use subscribe::SubError;

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

/// Counters kept per shard (the per-shard /stats section), one field per counter.
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

/// One shard, its state grouped by concern: where it is, its options, its topics, its
/// connections, its counters, the lookup registration, the metadata checkpoints, the
/// topic stores' queues and its timers.
pub struct Shard {
    place: Place,
    pub opts: Options,
    /// This shard's copy of the node-wide settings that change at run time (shard 0
    /// owns them: see [`crate::node`]).
    pub node: crate::node::NodeSettings,
    pub(crate) topics: RefCell<HashMap<String, Topic>>,
    clients: subscribe::ClientRegistry,
    counters: Counters,
    /// Set on SIGINT/SIGTERM: listeners stop, connections close.
    pub shutdown: Latch,
    pub lookup: Lookup,
    pub(crate) meta: MetaState,
    pub(crate) stores: store_prep::StoreQueues,
    pub timers: delivery::Timers,
    /// This shard as an `Rc`, for tasks its synchronous methods spawn.
    pub me: RefCell<Weak<Shard>>,
}

/// Where a shard is: its index among `count` shards, and the CPU its thread is pinned
/// to (`None`: not pinned, the kernel places it).
struct Place {
    index: usize,
    count: usize,
    cpu: Option<usize>,
}

/// The metadata checkpoints of a shard's durable topics (nsqd: PersistMetadata): what
/// changed since the last one, the requests for one, and their errors.
pub(crate) struct MetaState {
    /// A topic or channel was created or deleted: the checkpoint task writes metadata
    /// soon (nsqd: Notify persists metadata on every such change).
    wake: crate::wake::Notify,
    /// Metadata checkpoints asked for (`request_checkpoint`) and the last one written:
    /// a channel created, deleted or paused is answered once it is in the metadata.
    requested: Cell<u64>,
    written: crate::wake::Progress,
    /// A checkpoint is being written (one at a time: [`Shard::run_checkpoint`]).
    running: Cell<bool>,
    /// Durable topics whose metadata may have changed since the last checkpoint took
    /// them ([`Shard::mark_changed`]): a checkpoint looks at these only, so its cost
    /// follows what changed, not how many topics the shard holds.
    changed: RefCell<HashSet<String>>,
    /// The last metadata write's error, until one succeeds (nsqd's health).
    error: RefCell<Option<String>>,
    /// Logs failed metadata writes: a cause that repeats (a full disk, no descriptors
    /// left, for every changed topic at each checkpoint) at most once a second, with
    /// the count; the last cause logged.
    error_log: (nsq_storage::repeat_log::RepeatLog, RefCell<String>),
    /// Topics whose data could not be loaded at start-up, with the error (by topic
    /// name): reported by [`Shard::health`] until the next start, and their stores are
    /// never created afresh over the data left in their directories (a publish to one
    /// is refused, as to a topic whose store failed).
    failed_recoveries: RefCell<std::collections::BTreeMap<String, String>>,
}

impl MetaState {
    /// Notified when a checkpoint is asked for.
    pub fn wake(&self) -> &crate::wake::Notify {
        &self.wake
    }

    /// The last metadata write's error, until one succeeds.
    pub(crate) fn error(&self) -> Option<String> {
        self.error.borrow().clone()
    }

    /// The outcome of a checkpoint: its last failed write's error, or `None`.
    pub(crate) fn set_error(&self, error: Option<String>) {
        *self.error.borrow_mut() = error;
    }

    /// Logs a failed metadata write `e` whose cause is `cause`: a cause that repeats
    /// at most once a second, with the count.
    pub(crate) fn log_error(&self, cause: String, e: &dyn std::fmt::Display) {
        let (log, last) = &self.error_log;
        let same = *last.borrow() == cause;
        log.error(same, format_args!("{e}"));
        *last.borrow_mut() = cause;
    }

    /// The data of `topic` could not be loaded at start-up (`error`).
    pub(crate) fn recovery_failed(&self, topic: &str, error: String) {
        self.failed_recoveries
            .borrow_mut()
            .insert(topic.to_string(), error);
    }

    /// The error with which `topic`'s data could not be loaded, if it could not.
    pub(crate) fn failed_recovery(&self, topic: &str) -> Option<String> {
        self.failed_recoveries.borrow().get(topic).cloned()
    }

    /// The first topic's recovery error, if any topic's data could not be loaded.
    pub(crate) fn any_failed_recovery(&self) -> Option<String> {
        self.failed_recoveries.borrow().values().next().cloned()
    }
}

/// Bytes a topic's store may have waiting for its writer before publishers wait
/// (backpressure: memory stays bounded when publishing outruns the disk).
pub const STORE_PENDING_HIGH: usize = 32 << 20;

/// How often a shard re-registers the timers of all its channels (a safety net for the
/// timer queue; nsqd: QueueScanRefreshInterval, 5 s).
pub const TIMER_REFRESH: Duration = Duration::from_secs(5);

impl Shard {
    /// Shard `index` of `count`, pinned to `cpu` (`None`: not pinned).
    pub fn new(index: usize, count: usize, cpu: Option<usize>, opts: Options) -> Shard {
        Shard {
            place: Place { index, count, cpu },
            opts,
            node: crate::node::NodeSettings::default(),
            topics: RefCell::new(HashMap::new()),
            clients: subscribe::ClientRegistry::default(),
            counters: Counters::default(),
            shutdown: Latch::default(),
            lookup: Lookup::default(),
            meta: MetaState {
                wake: crate::wake::Notify::default(),
                requested: Cell::new(0),
                written: crate::wake::Progress::default(),
                running: Cell::new(false),
                changed: RefCell::new(HashSet::new()),
                error: RefCell::new(None),
                error_log: Default::default(),
                failed_recoveries: RefCell::new(std::collections::BTreeMap::new()),
            },
            stores: store_prep::StoreQueues::default(),
            timers: delivery::Timers::default(),
            me: RefCell::new(Weak::new()),
        }
    }

    /// This shard's index among [`Shard::count`] shards.
    pub fn index(&self) -> usize {
        self.place.index
    }

    /// The number of shards (one per core).
    pub fn count(&self) -> usize {
        self.place.count
    }

    /// Notified when a metadata checkpoint is asked for (the checkpoint task waits on
    /// it).
    pub fn meta_wake(&self) -> &crate::wake::Notify {
        self.meta.wake()
    }

    /// True when this shard owns `topic`.
    pub fn owns(&self, topic: &str) -> bool {
        owner_of(topic, self.count()) == self.index()
    }

    /// A topic or channel came or went (nsqd: NSQD.Notify): queues the registration
    /// change for nsqlookupd and asks for a metadata checkpoint, so that a crash soon
    /// after does not forget the topic or channel.
    pub fn notify_lookup(&self, ev: LookupEvent) {
        self.request_checkpoint();
        self.lookup.push(ev);
    }

    /// Asks the checkpoint task for a metadata write soon (counted: see
    /// [`Shard::persist_changes`]).
    pub fn request_checkpoint(&self) {
        self.meta.requested.set(self.meta.requested.get() + 1);
        self.meta.wake.notify();
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
    /// Counts the change on the topic too ([`Topic::changes`]) however it is stored.
    pub(crate) fn mark(&self, t: &mut Topic) {
        t.count_change();
        if self.opts.data_path.is_some() && t.mark_changed() {
            self.meta.changed.borrow_mut().insert(t.name.clone());
        }
    }

    /// Takes the topics marked changed since the last call (for the checkpoint); they
    /// are marked again by their next change.
    pub(crate) fn take_changed(&self) -> HashSet<String> {
        let names = std::mem::take(&mut *self.meta.changed.borrow_mut());
        let mut topics = self.topics.borrow_mut();
        for name in &names {
            if let Some(t) = topics.get_mut(name) {
                t.clear_changed();
            }
        }
        names
    }

    /// Notes that `topic` holds records not yet handed to its store and wakes the store
    /// task.
    pub(crate) fn mark_unstored(&self, topic: &str) {
        let mut unstored = self.stores.unstored.borrow_mut();
        if !unstored.contains(topic) {
            unstored.insert(topic.to_string());
        }
        drop(unstored);
        self.stores.wake.notify();
    }

    /// The topics [`Shard::mark_unstored`] noted, for the store task.
    pub(crate) fn unstored_topics(&self) -> Vec<String> {
        self.stores.unstored.borrow().iter().cloned().collect()
    }

    /// `topic` has handed every record to its store (or is gone).
    pub(crate) fn stored_all(&self, topic: &str) {
        self.stores.unstored.borrow_mut().remove(topic);
    }

    /// Writes a metadata checkpoint now ([`Shard::checkpoint`]), after the one being
    /// written, if any, has finished: checkpoints never overlap, and the one run here
    /// covers every change made before the call. Used by the checkpoint task and by
    /// answers that must wait for the metadata on disk (run in their own task: a wake of
    /// the checkpoint task from a connection's task was seen to take up to 20 ms).
    pub async fn run_checkpoint(&self) {
        self.run_checkpoint_with(true).await;
    }

    /// [`Shard::run_checkpoint`] with the writes fsynced (`sync`) or only written
    /// ([`Shard::checkpoint_with`]).
    async fn run_checkpoint_with(&self, sync: bool) {
        while self.meta.running.get() {
            let t = self.meta.written.ticks();
            self.meta.written.next_tick(t).await;
        }
        // Released however this ends: the future of a connection's task can be dropped
        // mid-checkpoint (its client gone, shutdown), and a flag left set would stop
        // every later checkpoint, the shutdown's included.
        struct Running<'a>(&'a Shard);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.meta.running.set(false);
                // Wakes the waiters (without counting anything written): one runs next.
                self.0.meta.written.advance_to(0);
            }
        }
        self.meta.running.set(true);
        let running = Running(self);
        let requested = self.meta.requested.get();
        self.checkpoint_with(sync).await;
        drop(running);
        self.meta.written.advance_to(requested);
    }

    /// Waits until what changed so far on this shard (each change asks for a
    /// checkpoint) is in the metadata files, writing them now if it is not (a no-op
    /// without a data path). The write follows the sync policy, as a publish does: with
    /// `--sync-every=1` it is fsynced before this returns (power loss keeps it);
    /// otherwise it is written (kill -9 keeps it) and fsynced by the next checkpoint,
    /// within `--sync-timeout`. A failed write is reported by `/ping` (nsqd logs a failed
    /// PersistMetadata and answers all the same).
    pub async fn persist_changes(&self) {
        if self.opts.data_path.is_none() {
            return;
        }
        if self.meta.written.get() < self.meta.requested.get() {
            self.run_checkpoint_with(self.opts.sync_every <= 1).await;
        }
    }

    fn topic_deleted(&self, t: &Topic) {
        self.stores.topic_deleted(&t.name);
        crate::memory_freed(
            t.log.body_bytes()
                + t.channels
                    .values()
                    .map(|c| c.disk_buffered_bytes())
                    .sum::<usize>(),
        );
        if let Some(st) = t.store() {
            st.destroy();
        }
        self.notify_lookup(LookupEvent::Unregister(t.name.clone(), None));
        for c in t.channels.keys() {
            self.notify_lookup(LookupEvent::Unregister(t.name.clone(), Some(c.clone())));
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
            t.set_store_mode(self.store_mode());
            if let (Some(_), false) = (&self.opts.data_path, t.ephemeral) {
                if let Err(e) = self.create_store(&mut t, true) {
                    // `e` names the topic already.
                    log::error!("{e}; publishes are refused until it can be created");
                }
            }
            t.held = self.lookup.hold(name);
            topics.insert(name.to_string(), t);
        }
        let t = topics.get_mut(name).expect("inserted above");
        self.mark(t);
        t
    }

    /// Creates a topic (no-op if it exists).
    pub fn create_topic(&self, topic: &str) {
        let mut topics = self.topics.borrow_mut();
        self.get_or_create_topic(&mut topics, topic);
    }
}

/// True while `t`'s memory tail may still shrink without any channel moving: some of its
/// records are not yet handed to its store or not yet readable from disk (see
/// `Topic::trim`).
fn memory_may_shrink(t: &Topic) -> bool {
    t.store()
        .is_some_and(|st| t.stored() < t.log.head || st.readable_seq() < st.next_seq())
}

#[cfg(test)]
mod tests;
