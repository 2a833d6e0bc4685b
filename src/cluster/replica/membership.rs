//! Membership changes (docs/replication.md, "Adding and removing members"): a topic's
//! replicas follow the placement its leader computes from its `--cluster-peer` list.
//! When they differ (a member was added to the list or removed from it), the leader
//! moves the group one Raft membership change at a time:
//!
//! 1. a member the placement names and the group lacks joins as a learner: it gets
//!    the topic from a snapshot and then the log, and does not count towards a
//!    commit meanwhile;
//! 2. once it holds every committed entry it becomes a voter;
//! 3. then a voter the placement no longer names is removed (a leader that is itself
//!    removed first hands leadership to a caught-up replica).
//!
//! So a topic is never held by fewer caught-up voters than before, and no message is
//! copied twice: the new replica's log is the leader's, by Raft. A member applies its
//! own removal by deleting its copy of the topic.
//!
//! Each member keeps its group's voters and learners in `cluster-members/<topic>`
//! under the data path (JSON, written when the group starts and when a change
//! applies): a member that restarts starts the group from them, not from its
//! placement, which may already differ; a member that was removed keeps the file (it
//! no longer names it), so a publish or SUB does not make the group there again. A
//! leader that adds it back sends it the log, which makes the group again.

use super::{Group, ShardCluster};
use crate::server::Server;
use nsq_replication::Membership;
use nsq_shards::mesh::{AdminError, AdminOp};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a leader compares its groups' members with the placement.
pub(super) const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// How long a learner may take to catch up before its leader warns (and between two
/// warnings).
const STUCK_AFTER: Duration = Duration::from_secs(30);

/// Whether a group's members are its placement, as last computed (on the group's start
/// and after each change applied here): the leader looks only at groups that are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Placement {
    /// The voters are the placement, and there is no learner.
    Placed,
    /// They differ; `since` is when the members last changed (or the warning about a
    /// learner that does not catch up was last logged).
    Moving { since: Instant },
}

impl Placement {
    pub(super) fn of(voters: &[u64], learners: &[u64], target: &[u64]) -> Placement {
        let placed = learners.is_empty()
            && voters.len() == target.len()
            && target.iter().all(|t| voters.contains(t));
        if placed {
            Placement::Placed
        } else {
            Placement::Moving {
                since: Instant::now(),
            }
        }
    }
}

/// A group's members as saved: (voters, learners), by replica id.
pub(super) type Members = (Vec<u64>, Vec<u64>);

/// Where `topic`'s members are saved under `data_path`: outside the topic's directory,
/// so that a topic deleted through its log keeps them.
pub(super) fn path(data_path: &Path, topic: &str) -> PathBuf {
    data_path.join("cluster-members").join(topic)
}

/// The saved members of `topic`, or `None` (no change ever applied here, or an
/// unreadable file: the placement is used).
pub(super) fn load(path: &Path) -> Option<Members> {
    let bytes = std::fs::read(path).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let ids = |k: &str| -> Option<Vec<u64>> {
        v.get(k)?
            .as_array()?
            .iter()
            .map(serde_json::Value::as_u64)
            .collect()
    };
    Some((ids("voters")?, ids("learners")?))
}

/// Writes `members` to `path` whole (a temporary file renamed over it, synced), so a
/// crash leaves the old file or the new one (blocking).
fn store_blocking(path: &Path, members: &Members) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let text = serde_json::json!({ "voters": members.0, "learners": members.1 }).to_string();
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Saves the members a group starts with when none were saved (a new group, or one
/// kept by an earlier version of this broker), in the background: a member that
/// restarts after its `--cluster-peer` list changed starts the group from them, not
/// from a placement that may no longer name it.
pub(super) fn save_initial(data_path: &Path, topic: &str, members: Members) {
    let p = path(data_path, topic);
    let topic = topic.to_string();
    glommio::spawn_local(async move {
        let written = glommio::executor()
            .spawn_blocking(move || store_blocking(&p, &members))
            .await;
        if let Err(e) = written {
            log::error!("TOPIC({topic}): its replicas were not saved: {e}");
        }
    })
    .detach();
}

/// Removes `path` if it is there (blocking).
fn remove_blocking(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The next change a leader makes to `g` to reach `target` (the placement), or `None`
/// when there is none to make now. `caught_up(r)`: replica `r` is reachable and holds
/// every committed entry.
fn next_change(
    me: u64,
    g: &Group,
    target: &[u64],
    caught_up: impl Fn(u64) -> bool,
) -> Option<Step> {
    let voters = g.group.voters();
    let learners = g.group.learners();
    if let Some(&l) = learners.iter().find(|l| !target.contains(l)) {
        return Some(Step::Change(Membership::Remove(l)));
    }
    if let Some(&l) = learners.iter().find(|&&l| caught_up(l)) {
        return Some(Step::Change(Membership::Add(l)));
    }
    if let Some(&l) = learners.first() {
        return Some(Step::Wait(l));
    }
    if let Some(&t) = target.iter().find(|t| !voters.contains(t)) {
        return Some(Step::Learner(t));
    }
    let &gone = voters.iter().find(|v| !target.contains(v))?;
    if gone != me {
        return Some(Step::Change(Membership::Remove(gone)));
    }
    target
        .iter()
        .copied()
        .find(|&t| t != me && caught_up(t))
        .map(Step::HandOver)
}

/// What [`next_change`] decided.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Propose this change.
    Change(Membership),
    /// Add this replica as a learner (it gets the topic from a snapshot, a backlog larger
    /// than one carries in pages first).
    Learner(u64),
    /// Hand leadership to this replica (the leader is not in the placement).
    HandOver(u64),
    /// Nothing yet: this learner is catching up.
    Wait(u64),
}

impl ShardCluster {
    /// On each group this member leads: the next membership change towards the
    /// placement ([`next_change`]), proposed when none is pending.
    pub(super) async fn reconcile_members(&self, server: &Server) {
        let me = self.cfg.me.replica;
        let mut steps = Vec::new();
        {
            let groups = self.groups.borrow();
            for (topic, g) in groups.iter() {
                if g.placement == Placement::Placed
                    || !g.group.is_leader()
                    || g.stopped
                    || g.group.membership_pending()
                {
                    continue;
                }
                let target = self.cfg.replicas_of(topic);
                let commit = g.group.commit_index();
                let caught_up = |r: u64| {
                    r == me
                        || (self.links.connected(r)
                            && g.group.matched(r).is_some_and(|m| m >= commit))
                };
                if let Some(step) = next_change(me, g, &target, caught_up) {
                    steps.push((topic.clone(), step));
                }
            }
        }
        for (topic, step) in steps {
            let change = match step {
                Step::Change(c) => c,
                Step::Wait(learner) => {
                    self.warn_if_stuck(&topic, learner);
                    continue;
                }
                Step::HandOver(to) => {
                    log::info!(
                        "TOPIC({topic}): handing leadership to {} (this member no longer holds a replica in the placement)",
                        self.address_of(to)
                    );
                    self.transfer_leader(server, &topic, to);
                    continue;
                }
                Step::Learner(to) => {
                    // A backlog larger than a snapshot carries reaches the learner in
                    // pages first (`catchup`).
                    if !self.log_starts_at_a_snapshot(server, &topic) {
                        continue;
                    }
                    Membership::AddLearner(to)
                }
            };
            let proposed = self
                .groups
                .borrow_mut()
                .get_mut(&topic)
                .map(|g| g.group.propose_membership(change));
            match proposed {
                Some(Ok(_)) => {
                    let (what, r) = match change {
                        Membership::AddLearner(r) => ("adding as a learner", r),
                        Membership::Add(r) => ("making a voter", r),
                        Membership::Remove(r) => ("removing", r),
                    };
                    log::info!(
                        "TOPIC({topic}): replicas follow the placement: {what} {}",
                        self.address_of(r)
                    );
                    self.mark(&topic);
                }
                Some(Err(e)) => log::debug!("TOPIC({topic}): {change:?} not proposed: {e}"),
                None => {}
            }
        }
    }

    /// Makes sure a new replica of `topic` starts from a snapshot, not from the first
    /// entry: the snapshot carries the group's members, which its first entries do
    /// not (a new member's own placement may differ from the members the group started
    /// with). A leader whose log still starts at the first entry compacts it to what
    /// it applied once every voter it is connected to has that (a voter that is down,
    /// such as a member being removed, gets a snapshot when it returns); false until
    /// then.
    fn log_starts_at_a_snapshot(&self, server: &Server, topic: &str) -> bool {
        let me = self.cfg.me.replica;
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(topic) else {
            return false;
        };
        if g.group.first_index() > 1 {
            return true;
        }
        let applied = g.group.applied_index();
        let everywhere = g.group.voters().into_iter().all(|v| {
            v == me || !self.links.connected(v) || g.group.matched(v).is_some_and(|m| m >= applied)
        });
        if applied == 0 || !everywhere {
            return false;
        }
        let data = super::compaction::snapshot_data(server, topic, g, applied);
        g.group.compact(applied, data).is_ok() && g.group.first_index() > 1
    }

    /// Logs, every [`STUCK_AFTER`], that `learner` has not caught up since the
    /// members last changed: it is down, or it refuses this member (a `--cluster-peer`
    /// list that does not name this member, or a mistyped address here).
    fn warn_if_stuck(&self, topic: &str, learner: u64) {
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(topic) else {
            return;
        };
        let Placement::Moving { since, .. } = &mut g.placement else {
            return;
        };
        if since.elapsed() < STUCK_AFTER {
            return;
        }
        *since = Instant::now();
        let connected = self.links.connected(learner);
        log::warn!(
            "TOPIC({topic}): new replica {} has not caught up in {} s ({}); check that it runs and that its --cluster-peer list names this member",
            self.address_of(learner),
            STUCK_AFTER.as_secs(),
            if connected {
                "connected"
            } else {
                "not connected"
            }
        );
    }

    pub(super) fn address_of(&self, replica: u64) -> String {
        self.cfg.member(replica).map_or_else(
            || format!("replica {replica:016x} (not in this member's --cluster-peer list)"),
            |m| m.address.clone(),
        )
    }

    /// A membership change applied here (or a snapshot restored): saves the members,
    /// and when this member is no longer among them, stops the group and deletes its
    /// copy of the topic.
    pub(super) async fn members_changed(
        &self,
        server: &Server,
        topic: &str,
        voters: Vec<u64>,
        learners: Vec<u64>,
    ) {
        let me = self.cfg.me.replica;
        let removed = !voters.contains(&me) && !learners.contains(&me);
        let data = server.shard.opts.data_path.clone();
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            g.placement = Placement::of(&voters, &learners, &self.cfg.replicas_of(topic));
        }
        // Kept after a removal too: the saved members without this one keep it from
        // making the group again on a publish or SUB (until a leader adds it again).
        if let Some(d) = &data {
            let p = path(d, topic);
            let members = (voters, learners);
            let written = glommio::executor()
                .spawn_blocking(move || store_blocking(&p, &members))
                .await;
            if let Err(e) = written {
                log::error!("TOPIC({topic}): its replicas were not saved: {e}");
            }
        }
        if !removed {
            return;
        }
        log::info!("TOPIC({topic}): this member no longer holds a replica; its copy is deleted");
        // Its files first: while the group is still here, a frame from the leader cannot
        // make it again from them.
        if let Some(d) = data {
            let t = topic.to_string();
            let removed = glommio::executor()
                .spawn_blocking(move || {
                    remove_blocking(&super::vote::tombstone_path(&d, &t))?;
                    super::journal::remove_blocking(&d, &t, true)?;
                    let vote = super::vote::path(&d, &t);
                    remove_blocking(&vote)?;
                    if let Some(dir) = vote.parent() {
                        let _ = std::fs::remove_dir(dir);
                    }
                    Ok::<(), std::io::Error>(())
                })
                .await;
            if let Err(e) = removed {
                log::warn!("TOPIC({topic}): files of the removed replica left: {e}");
            }
        }
        self.groups.borrow_mut().remove(topic);
        self.led.borrow_mut().remove(topic);
        self.dirty.borrow_mut().remove(topic);
        self.awake.borrow_mut().remove(topic);
        match server.shard.admin(AdminOp::DeleteTopic(topic.to_string())) {
            Ok(()) | Err(AdminError::TopicNotFound) => {}
            Err(e) => log::warn!("TOPIC({topic}): not deleted here: {e:?}"),
        }
    }
}
