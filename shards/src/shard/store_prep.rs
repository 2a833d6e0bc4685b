//! Topic stores: creating a durable topic's store, retrying the ones that could not be
//! created, and preparing their directories on the blocking thread (the blocking-thread
//! segment path) before the synchronous operations that create them; the store policy
//! from the options.

use super::Shard;
use crate::mesh::AdminOp;
use crate::topic::{StoreMode, Topic};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, HashSet};

/// What the shard's store task and store creation have queued: the directories made
/// ahead for stores about to be created, the topics holding records not yet handed to
/// their stores, and the durable topics whose store could not be created.
#[derive(Default)]
pub(crate) struct StoreQueues {
    /// Topic directories made and opened on the blocking thread for a store about to be
    /// created (or its error), on the blocking-thread segment path only
    /// ([`Shard::prepare_store`]).
    prepared_dirs: RefCell<HashMap<String, Result<std::fs::File, nsq_storage::StoreError>>>,
    /// Topics deleted so far: a directory prepared across a delete is not used.
    topic_deletes: Cell<u64>,
    /// Topics holding records not yet handed to their store (`Topic::store_pump`): the
    /// store task visits these only.
    pub(super) unstored: RefCell<HashSet<String>>,
    /// Durable topics whose store could not be created: retried by
    /// [`Shard::retry_missing_stores`] without a walk of every topic.
    missing_stores: RefCell<BTreeSet<String>>,
    /// A topic holds records not yet handed to its store: wakes `store_loop`.
    pub(super) wake: crate::wake::Notify,
}

impl StoreQueues {
    /// Notified when a topic holds records not yet handed to its store.
    pub(crate) fn wake(&self) -> &crate::wake::Notify {
        &self.wake
    }
}

/// Why a durable topic has no store: `Shard::create_store` failed. Its `Display` is
/// the text `/ping` reports and the log shows (it names the topic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateStoreError {
    /// The topic's data could not be loaded at start-up (the recovery's error text,
    /// `TOPIC(<name>): recovery failed - <cause>`): its directory is left alone.
    RecoveryFailed(String),
    /// On the blocking-thread segment path, a retry found no directory prepared for it:
    /// the error the store had stands (its text; empty when there was none).
    NotPrepared(String),
    /// Making the directory or the first segment failed (`TOPIC(<name>): no durable
    /// store - <cause>`).
    Create {
        topic: String,
        cause: nsq_storage::StoreError,
    },
}

impl std::fmt::Display for CreateStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateStoreError::RecoveryFailed(e) | CreateStoreError::NotPrepared(e) => {
                f.write_str(e)
            }
            CreateStoreError::Create { topic, cause } => {
                write!(f, "TOPIC({topic}): no durable store - {cause}")
            }
        }
    }
}

impl std::error::Error for CreateStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CreateStoreError::Create { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

impl StoreQueues {
    /// `topic` was deleted: a directory prepared for it is not used, nor one being
    /// prepared.
    pub(super) fn topic_deleted(&self, topic: &str) {
        self.topic_deletes.set(self.topic_deletes.get() + 1);
        self.prepared_dirs.borrow_mut().remove(topic);
    }
}

impl Shard {
    /// Creates the topic's store (its directory and first segment), starting at its
    /// log's head. On failure the topic keeps the error (`/ping` reports it) and refuses
    /// publishes until a later attempt succeeds: a durable topic never answers OK for
    /// a message it cannot store (nsqd: E_PUB_FAILED and an unhealthy node when its
    /// disk queue fails).
    ///
    /// On the blocking-thread segment path the directory [`Shard::prepare_store`] made is
    /// used; without one, a new topic (`new_topic`) makes it here, on the shard's thread
    /// (a path that prepares nothing first), and a retry keeps the error it had.
    pub(super) fn create_store(
        &self,
        t: &mut Topic,
        new_topic: bool,
    ) -> Result<(), CreateStoreError> {
        let Some(dp) = &self.opts.data_path else {
            return Ok(());
        };
        if let Some(e) = self.meta.failed_recovery(&t.name) {
            // Its data is still in the directory: a new store there would overwrite it.
            t.set_store_error(e.clone());
            return Err(CreateStoreError::RecoveryFailed(e));
        }
        let dir = nsq_storage::topic_dir(dp, &t.name);
        let prepared = match self.opts.segment_io {
            nsq_storage::SegmentIo::Ring => None,
            nsq_storage::SegmentIo::Threads => {
                self.stores.prepared_dirs.borrow_mut().remove(&t.name)
            }
        };
        let created = match prepared {
            Some(Ok(dir_fd)) => {
                nsq_storage::TopicStore::create_in(dir, dir_fd, self.store_config(), t.log.head)
            }
            Some(Err(e)) => Err(e),
            None if self.opts.segment_io == nsq_storage::SegmentIo::Threads && !new_topic => {
                return Err(CreateStoreError::NotPrepared(
                    t.store_error().unwrap_or_default().to_string(),
                ));
            }
            None => nsq_storage::TopicStore::create(dir, self.store_config(), t.log.head),
        };
        match created {
            Ok(st) => {
                let head = t.log.head;
                t.set_stored(head);
                t.attach_store(st, head);
                self.stores.missing_stores.borrow_mut().remove(&t.name);
                self.mark(t);
                if t.take_store_error() {
                    log::info!("TOPIC({}): durable store created", t.name);
                    self.request_checkpoint();
                }
                Ok(())
            }
            Err(e) => {
                let e = CreateStoreError::Create {
                    topic: t.name.clone(),
                    cause: e,
                };
                t.set_store_error(e.to_string());
                self.stores
                    .missing_stores
                    .borrow_mut()
                    .insert(t.name.clone());
                Err(e)
            }
        }
    }

    /// True while some durable topic of this shard has no store (see
    /// [`Shard::retry_missing_stores`]).
    pub fn has_missing_stores(&self) -> bool {
        !self.stores.missing_stores.borrow().is_empty()
    }

    /// Retries the store of every topic whose store could not be created (before each
    /// `/ping` or `/stats` answer, and every `--sync-timeout` by the checkpoint task), so
    /// that `/ping` turns healthy again once the cause is gone, without waiting for a
    /// publish to that topic. A no-op when every topic has its store.
    /// On the blocking-thread segment path the retry takes what
    /// [`Shard::prepare_missing_stores`] prepared (the checkpoint task runs it first).
    pub fn retry_missing_stores(&self) {
        if self.stores.missing_stores.borrow().is_empty() {
            return;
        }
        let names = self.missing_store_names();
        let mut topics = self.topics.borrow_mut();
        for name in names {
            match topics.get_mut(&name) {
                Some(t) if t.store().is_none() && t.store_error().is_some() => {
                    let _ = self.create_store(t, false);
                }
                _ => {
                    self.stores.missing_stores.borrow_mut().remove(&name);
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
            && !self.stores.prepared_dirs.borrow().contains_key(topic)
            && self
                .topics
                .borrow()
                .get(topic)
                .is_none_or(|t| t.store().is_none())
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
        let deletes = self.stores.topic_deletes.get();
        let made = glommio::executor()
            .spawn_blocking(move || nsq_storage::TopicStore::prepare_dir(&dir))
            .await;
        if self.stores.topic_deletes.get() == deletes
            && self
                .topics
                .borrow()
                .get(topic)
                .is_none_or(|t| t.store().is_none())
        {
            self.stores
                .prepared_dirs
                .borrow_mut()
                .insert(topic.to_string(), made);
        }
    }

    /// [`Shard::prepare_store`] for every topic whose store could not be created, so
    /// that [`Shard::retry_missing_stores`] can retry it without blocking.
    pub async fn prepare_missing_stores(&self) {
        for name in self.missing_store_names() {
            self.prepare_store(&name).await;
        }
    }

    /// The durable topics of this shard without a store (a copy: callers borrow the
    /// topics meanwhile).
    fn missing_store_names(&self) -> Vec<String> {
        self.stores
            .missing_stores
            .borrow()
            .iter()
            .cloned()
            .collect()
    }

    /// When durable topics hand records to their stores: at publish with
    /// `--sync-every=1` (each publish is synced before it is answered) and with
    /// retention (`--retention-time` / `--retention-bytes`: replay needs every record,
    /// see [`Options::retains`](crate::options::Options::retains)), otherwise deferred so
    /// that records finished quickly never reach the disk.
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
}
