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

use crate::client::Client;
use crate::options::Options;
use crate::timers::TimerQueue;
use crate::topic::Topic;
use crate::wake::Latch;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::rc::Weak;
use std::time::Duration;

mod admin;
mod delivery;
mod publish;
mod read_ahead;
mod stats;
mod store_prep;
mod subscribe;

pub use publish::DurableWait;
pub use stats::client_stats;
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
    cpu: usize,
    pub opts: Options,
    pub(crate) topics: RefCell<HashMap<String, Topic>>,
    /// Topic directories made and opened on the blocking thread for a store about to be
    /// created (or its error), on the blocking-thread segment path only
    /// ([`Shard::prepare_store`]).
    prepared_dirs: RefCell<HashMap<String, Result<std::fs::File, String>>>,
    /// Topics deleted so far: a directory prepared across a delete is not used.
    topic_deletes: Cell<u64>,
    /// Every connection on this shard (for producers in /stats and for shutdown).
    pub clients: RefCell<HashMap<u64, Weak<Client>>>,
    counters: Counters,
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
    meta_requested: Cell<u64>,
    meta_written: crate::wake::Progress,
    /// The last metadata write's error, until one succeeds (nsqd's health).
    pub(crate) meta_error: RefCell<Option<String>>,
    /// Logs failed metadata writes: a cause that repeats (a full disk, no descriptors
    /// left, for every changed topic at each checkpoint) at most once a second, with
    /// the count; the last cause logged.
    pub(crate) meta_error_log: (nsq_storage::repeat_log::RepeatLog, RefCell<String>),
    /// Topics whose data could not be loaded at start-up, with the error (by topic
    /// name): reported by [`Shard::health`] until the next start, and their stores are
    /// never created afresh over the data left in their directories (a publish to one
    /// is refused, as to a topic whose store failed).
    pub(crate) failed_recoveries: RefCell<std::collections::BTreeMap<String, String>>,
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
    pub(crate) store_wake: crate::wake::Notify,
    next_client: Cell<u64>,
    /// Channels with an in-flight timeout or a deferred message, by the earliest due
    /// instant, as (topic, channel) (see crate::timers).
    timers: RefCell<TimerQueue<(String, String)>>,
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

/// Bytes a topic's store may have waiting for its writer before publishers wait
/// (backpressure: memory stays bounded when publishing outruns the disk).
pub const STORE_PENDING_HIGH: usize = 32 << 20;

/// How often a shard re-registers the timers of all its channels (a safety net for the
/// timer queue; nsqd: QueueScanRefreshInterval, 5 s).
pub const TIMER_REFRESH: Duration = Duration::from_secs(5);

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
        if self.opts.data_path.is_some() && t.mark_changed() {
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
                t.clear_changed();
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
