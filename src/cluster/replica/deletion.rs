//! A replicated topic's deletion and re-creation through its log (docs/replication.md,
//! "Deleting a topic"): [`Entry::TopicDelete`](nsq_replication::Entry::TopicDelete)
//! deletes the topic on every replica at the same place in the log, and the group
//! lives on without a topic, its term and vote in a mark outside the topic's directory
//! ([`vote::tombstone_path`]), so that a member that restarts, or hears of the group
//! from a peer, does not make the topic again. A later publish, channel creation or
//! [`Entry::TopicCreate`](nsq_replication::Entry::TopicCreate) makes it again on every
//! replica.
//!
//! A deleted topic's group that has been quiet for [`DROP_AFTER`] leaves memory
//! ([`ShardCluster::drop_deleted_groups`]): what is kept is a [`Dropped`] record (its
//! term, vote, members and the last entry it applied, about a hundred bytes against
//! the tens of KB of a running group), and its deletion mark on disk. Anything that
//! names the topic again (a peer's Raft message, a publish, `/topic/create`) makes the
//! group again from the record, its log starting after that entry: every entry up to
//! it was committed, so every later leader holds it with the same term, and the group
//! goes on from there as if it had never left. A member that ran the group as leader
//! comes back without knowing a leader and campaigns; its followers, quiet, would
//! refuse it for their lease, so a vote request from the leader a follower follows
//! ends that leader for it ([`nsq_replication::TopicGroup::step`]).

use super::vote::{self, Saved};
use super::ShardCluster;
use crate::server::Server;
use nsq_replication::raft::eraftpb::{ConfState, SnapshotMetadata};
use nsq_replication::{JournaledLog, MemLog};
use nsq_shards::mesh::{AdminError, AdminOp};
use std::time::Duration;

/// How long a deleted topic's group stays quiet in memory before it is dropped.
pub(super) const DROP_AFTER: Duration = Duration::from_secs(10);

/// A deleted topic's group dropped from memory: what making it again needs.
#[derive(Clone, Debug)]
pub(super) struct Dropped {
    /// Its term, vote and vote floor as saved (in the deletion mark when there is a data
    /// path).
    pub saved: Saved,
    /// (term, index) of the last entry it applied, all it had (it was settled).
    pub base: (u64, u64),
    /// Its voters and learners.
    pub members: (Vec<u64>, Vec<u64>),
}

impl Dropped {
    /// `store` (the log a restart would give the group: empty, or its journal's) made
    /// to start after [`Dropped::base`] where it ends before it, journaled as `store`
    /// is.
    pub(super) fn log_from_base(
        &self,
        store: JournaledLog,
        (voters, learners): (&[u64], &[u64]),
    ) -> JournaledLog {
        use nsq_replication::raft::Storage;
        let last = store.log().last_index().unwrap_or(0);
        if last >= self.base.1 {
            return store;
        }
        let mut meta = SnapshotMetadata {
            index: self.base.1,
            term: self.base.0,
            ..Default::default()
        };
        meta.set_conf_state(ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            ..Default::default()
        });
        let log = MemLog::from_base(&meta, self.saved.term, self.saved.vote);
        if store.is_journaled() {
            JournaledLog::journaled(log)
        } else {
            JournaledLog::in_memory(log)
        }
    }
}

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
            g.deleted_at = Some(std::time::Instant::now());
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
                    g.deleted_at = None;
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

    /// Drops from memory the groups of deleted topics that have been so for
    /// [`DROP_AFTER`] and are quiet now: nothing waits on them, their Raft state is
    /// settled (every entry applied; on the leader, every replica has them all) and
    /// their term and vote are saved. Each leaves a [`Dropped`] record.
    pub(super) fn drop_deleted_groups(&self) {
        let due: Vec<String> = {
            let groups = self.groups.borrow();
            let awake = self.awake.borrow();
            groups
                .iter()
                .filter(|(t, g)| {
                    g.deleted
                        && !g.stopped
                        && g.deleted_at.is_some_and(|at| at.elapsed() >= DROP_AFTER)
                        && !awake.contains(*t)
                        && g.waiters.is_empty()
                        && g.group.settled()
                        && (g.group.term(), g.group.vote())
                            == (g.vote.saved.term, g.vote.saved.vote)
                })
                .map(|(t, _)| t.clone())
                .collect()
        };
        for topic in due {
            let Some(g) = self.groups.borrow_mut().remove(&topic) else {
                continue;
            };
            let Some(base) = g.group.applied_position() else {
                // Its last applied entry's term is no longer known: kept running.
                self.groups.borrow_mut().insert(topic, g);
                continue;
            };
            self.dirty.borrow_mut().remove(&topic);
            self.positions_due.borrow_mut().remove(&topic);
            self.led.borrow_mut().remove(&topic);
            log::debug!("TOPIC({topic}): its group, deleted and quiet, dropped from memory");
            self.dropped.borrow_mut().insert(
                topic,
                Dropped {
                    saved: g.vote.saved,
                    base,
                    members: (g.group.voters(), g.group.learners()),
                },
            );
        }
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
