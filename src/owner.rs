//! The owner's side of a publish or an admin operation: one path for this shard's own
//! connections ([`Server::publish`](crate::server::Server::publish),
//! [`Server::admin`](crate::server::Server::admin)) and for calls forwarded by other
//! shards over the mesh (`handle_mesh` in src/mesh.rs).
//!
//! Each is taken in two steps. `start` runs synchronously, so what can be done at once
//! is done in arrival order (the mesh receiver starts each forwarded call before it
//! reads the next message, which keeps a producer's order across shards). What must
//! wait is returned as a step for `finish`, which a local caller awaits in its own task
//! and the mesh receiver awaits in a task of its own: the topic's directory made off
//! the shard's thread (FUSE, network filesystems), a durable write under
//! `--sync-every`, the metadata on disk after a channel change, a seek's disk search.

use bytes::Bytes;
use nsq_shards::mesh::{AdminError, AdminOp};
use nsq_shards::shard::DurableWait;
use nsq_shards::topic::PublishError;
use nsq_shards::Shard;
use std::time::Instant;

/// A publish on the topic's owning shard (nsqd: `Topic.PutMessage(s)`).
pub enum Publish {
    /// Appended or refused; nothing to wait for.
    Done(Result<(), PublishError>),
    /// Appended; answered once the store has it as the sync policy asks
    /// ([`wait_durable`]).
    Appended(DurableWait),
    /// The topic's store needs its directory first (made on the blocking thread); the
    /// messages are appended after it.
    NeedsStore {
        topic: String,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        synced: bool,
    },
}

impl Publish {
    /// Appends `bodies` to `topic` on `shard`, its owner, now when its store is ready;
    /// `synced`: answered only once they are synced, whatever the sync policy
    /// ([`Shard::publish_local_synced`]).
    pub fn start(
        shard: &Shard,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        synced: bool,
    ) -> Publish {
        // A drain refuses before a new topic's store is prepared.
        if crate::runtime::drain::applied(shard) {
            return Publish::Done(Err(PublishError::Draining));
        }
        if shard.needs_prepared_store(topic) {
            return Publish::NeedsStore {
                topic: topic.to_string(),
                bodies,
                defer_until,
                synced,
            };
        }
        match shard.publish_local_synced(topic, bodies, defer_until, synced) {
            Ok(Some(wait)) => Publish::Appended(wait),
            r => Publish::Done(r.map(|_| ())),
        }
    }

    /// The answer: at once for [`Publish::Done`], else after the wait.
    pub async fn finish(self, shard: &Shard) -> Result<(), PublishError> {
        match self {
            Publish::Done(r) => r,
            Publish::Appended(wait) => wait_durable(Some(wait)).await,
            Publish::NeedsStore {
                topic,
                bodies,
                defer_until,
                synced,
            } => {
                shard.prepare_store(&topic).await;
                let wait = shard.publish_local_synced(&topic, bodies, defer_until, synced)?;
                wait_durable(wait).await
            }
        }
    }
}

/// Waits, when asked, until the store has synced the publish (group commit).
pub async fn wait_durable(wait: Option<DurableWait>) -> Result<(), PublishError> {
    let Some(w) = wait else { return Ok(()) };
    w.store
        .wait_pending_below(nsq_shards::shard::STORE_PENDING_HIGH)
        .await;
    match w.durable {
        None => Ok(()),
        Some(seq) => w
            .store
            .wait_durable(seq)
            .await
            .map_err(|e| PublishError::Disk(e.into())),
    }
}

/// An admin operation on the topic's owning shard (`/topic/*`, `/channel/*` and the
/// topic and channel a `SUB` makes).
pub enum Admin {
    /// Applied (or refused); nothing to wait for.
    Done(Result<(), AdminError>),
    /// Applied; answered once the metadata has it ([`Shard::persist_changes`]: a
    /// channel created, deleted or paused, or a topic paused, on a durable topic).
    Persist,
    /// Applied by [`Shard::admin_async`] in `finish`: a seek (it reads the disk) or an
    /// operation that makes the topic's directory first.
    Later(AdminOp),
}

impl Admin {
    /// Applies `op` on `shard`, its topic's owner, now when it needs no wait first.
    pub fn start(shard: &Shard, op: AdminOp) -> Admin {
        // A drain refuses a creation before its store is prepared.
        crate::runtime::drain::applied(shard);
        if let Err(e) = shard.drain_allows(&op) {
            return Admin::Done(Err(e));
        }
        if matches!(op, AdminOp::SeekChannel(..)) || shard.admin_creates_store(&op) {
            return Admin::Later(op);
        }
        let persist = shard.admin_persists(&op);
        match shard.admin(op) {
            Ok(()) if persist => Admin::Persist,
            r => Admin::Done(r),
        }
    }

    /// The answer: at once for [`Admin::Done`], else after the wait.
    pub async fn finish(self, shard: &Shard) -> Result<(), AdminError> {
        match self {
            Admin::Done(r) => r,
            Admin::Persist => {
                shard.persist_changes().await;
                Ok(())
            }
            Admin::Later(op) => shard.admin_async(op).await,
        }
    }
}
