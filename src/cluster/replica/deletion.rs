//! A replicated topic's deletion and re-creation through its log (docs/replication.md,
//! "Deleting a topic"): [`Entry::TopicDelete`](nsq_replication::Entry::TopicDelete)
//! deletes the topic on every replica at the same place in the log, and the group
//! lives on without a topic, its term and vote in a mark outside the topic's directory
//! ([`vote::tombstone_path`]), so that a member that restarts, or hears of the group
//! from a peer, does not make the topic again. A later publish, channel creation or
//! [`Entry::TopicCreate`](nsq_replication::Entry::TopicCreate) makes it again on every
//! replica.

use super::vote::{self, Saved};
use super::ShardCluster;
use crate::server::Server;
use nsq_shards::mesh::{AdminError, AdminOp};

/// A snapshot's data for a group whose topic is deleted: its version byte alone (the
/// data of a live topic starts with 2: `compaction::encode_state`).
pub(super) const DELETED_SNAPSHOT: &[u8] = &[0xd0];

impl ShardCluster {
    /// Deletes `topic` on this replica (a committed `TopicDelete`, or a snapshot of a
    /// deleted topic): its channels' consumers are closed, it leaves nsqlookupd and its
    /// files go, as `/topic/delete` does on nsqd; the group keeps running without it.
    pub(super) async fn delete_here(&self, server: &Server, topic: &str) {
        match server.shard.admin(AdminOp::DeleteTopic(topic.to_string())) {
            Ok(()) | Err(AdminError::TopicNotFound) => {}
            Err(e) => log::warn!("TOPIC({topic}): not deleted here: {e:?}"),
        }
        let leads = self.leads(topic);
        let saved = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(topic) else {
                return;
            };
            g.deleted = true;
            g.cursors.clear();
            g.cursors_at = None;
            g.retention.ids_at.clear();
            g.next_seq = leads.then(|| g.seq_after_log(0));
            g.vote.saved
        };
        log::info!("TOPIC({topic}): deleted through its replication log");
        if let Some(data) = server.shard.opts.data_path.clone() {
            let t = topic.to_string();
            let moved = glommio::executor()
                .spawn_blocking(move || move_vote(&data, &t, &saved, true))
                .await;
            if let Err(e) = moved {
                log::error!("TOPIC({topic}): the mark of its deletion was not written: {e}");
            }
        }
    }

    /// Makes `topic` again on this replica after [`ShardCluster::delete_here`] (a
    /// committed entry that needs it, or a snapshot of the live topic); false when it
    /// was not deleted here.
    pub(super) async fn recreate_here(&self, server: &Server, topic: &str) -> bool {
        let saved = {
            let mut groups = self.groups.borrow_mut();
            match groups.get_mut(topic) {
                Some(g) if g.deleted => {
                    g.deleted = false;
                    g.vote.saved
                }
                _ => return false,
            }
        };
        server.shard.create_topic(topic);
        log::info!("TOPIC({topic}): created again through its replication log");
        if let Some(data) = server.shard.opts.data_path.clone() {
            let t = topic.to_string();
            let moved = glommio::executor()
                .spawn_blocking(move || move_vote(&data, &t, &saved, false))
                .await;
            if let Err(e) = moved {
                log::error!("TOPIC({topic}): its term and vote were not moved back: {e}");
            }
        }
        true
    }

    /// True while `topic`'s group runs without the topic (deleted through its log).
    pub(super) fn deleted(&self, topic: &str) -> bool {
        self.groups.borrow().get(topic).is_some_and(|g| g.deleted)
    }
}

/// Writes `saved` where the group's term and vote live from now on (the deletion mark
/// when `deleted`, else the topic's directory) and removes the other file (blocking).
fn move_vote(
    data: &std::path::Path,
    topic: &str,
    saved: &Saved,
    deleted: bool,
) -> std::io::Result<()> {
    let (to, from) = if deleted {
        (vote::tombstone_path(data, topic), vote::path(data, topic))
    } else {
        (vote::path(data, topic), vote::tombstone_path(data, topic))
    };
    vote::store_blocking(&to, saved, true)?;
    match std::fs::remove_file(&from) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if deleted {
        // A topic that never stored a message keeps a directory holding only its vote
        // file: gone with it, so that a restart finds no topic there.
        if let Some(dir) = from.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
    Ok(())
}
