//! A leader cut off from its replicas while it runs stops delivering before they can
//! elect another: its delivery lease.
//!
//! A leader whose process keeps running while the network between it and its replicas
//! fails (a partition, with its TCP connections left open) believes it leads until
//! raft-rs's check-quorum steps it down, an election timeout after it last heard a
//! majority. Its replicas may elect another leader before that: they campaign once its
//! member has been silent for [`liveness::SILENT_AFTER`] (400 ms). Both would then
//! deliver the same messages to their consumers.
//!
//! So a leader delivers a topic only while a quorum of the topic's voters (itself
//! among them) is *fresh*: a replica is fresh while this shard's connection to it is
//! up and, less than [`LEASE`] ago by this member's clock, it sent back a ping time of
//! this member's ([`liveness::echoed`]). A replica that sent back time `t` heard this
//! member at or after `t`, so it neither campaigns nor grants a pre-vote against it
//! before `t` + 350 ms (see [`LEASE`]; docs/replication.md, "Quiet groups"): no other
//! leader can be elected within the 250 ms of the lease. (A replica that sees every
//! connection from this member close treats it as gone at once; this member then sees
//! its own connection to the replica fail within a write, and that replica is no
//! longer fresh for it. A write to a consumer already under way when the lease ends
//! finishes.)
//!
//! The shard's clock ([`super::stall::clock`]) checks the lease every [`super::TICK`]:
//!
//! - a topic this shard leads, with channels, whose voters are no longer a fresh quorum
//!   holds delivery
//!   as after a stall ([`ShardCluster::hold_until_confirmed`]): its consumers keep what
//!   was framed for them, and it asks its replicas whether it still leads. It delivers
//!   again once a confirmation comes while its quorum is fresh again; an answer with a
//!   higher term deposes it, and what its consumers were not written is dropped (the
//!   new leader delivers it).
//! - nothing is delivered or written on the shard's thread past the moment the first
//!   fresh replica's lease would run out ([`nsq_shards::delivery_gate`]): a clock that
//!   runs late cannot let a topic deliver on a lease that ended meanwhile.
//!
//! When every replica is fresh (a cluster in good health) a check reads one clock and
//! two atomics per peer. While some replica is not (a member that is down), each led
//! topic is looked at once per change of which replicas are fresh, of the topics this
//! shard leads, or of a group's voters, not at every run.

use super::ShardCluster;
use crate::cluster::liveness;
use crate::server::Server;
use nsq_replication::ReplicaSet;
use std::time::{Duration, Instant};

/// How long a replica's answer to a ping keeps it fresh. A replica that sent back time
/// `t` campaigns or grants a vote against this member 350 ms after `t` at the earliest:
/// 400 ms after it last heard this member ([`liveness::SILENT_AFTER`]), or an election
/// timeout of its group (10 ticks, 450-500 ms by where the first falls) after the
/// group's last heartbeat, which a busy group sends every 100 ms, so at most 100 ms
/// before `t`. Pings go every [`liveness::PING_EVERY`], so a replica's answer is that
/// plus a round trip old when the next comes: 250 ms leaves room on both sides.
pub const LEASE: Duration = Duration::from_millis(250);

// The lease ends before a replica can turn against its leader.
const _: () = assert!(LEASE.as_millis() + 100 <= liveness::SILENT_AFTER.as_millis());

/// What the last full look at the led topics was made under: which replicas were not
/// fresh, and the shard's count of changes to its led topics and their voters
/// ([`ShardCluster::leases_changed`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseCheck {
    stale: Vec<u64>,
    changes: u64,
}

/// The replicas that are fresh for this shard now and until `until_ms` (this member's
/// [`liveness::clock_ms`]), this member included, and the first time one of them stops
/// being fresh (`None`: no peer is fresh).
fn fresh(c: &ShardCluster, until_ms: u64) -> (ReplicaSet, Vec<u64>, Option<u64>) {
    let lease_ms = u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX);
    let mut fresh = ReplicaSet::default();
    fresh.insert(c.cfg.me.replica);
    let mut stale = Vec::new();
    let mut first_end: Option<u64> = None;
    for m in &c.cfg.peers {
        let r = m.replica;
        let ends = liveness::echoed(r)
            .filter(|_| c.links.connected(r))
            .map(|at| at.saturating_add(lease_ms));
        match ends {
            Some(end) if end > until_ms => {
                fresh.insert(r);
                first_end = Some(first_end.map_or(end, |f| f.min(end)));
            }
            _ => stale.push(r),
        }
    }
    (fresh, stale, first_end)
}

impl ShardCluster {
    /// Checks every led topic's lease (see the module docs); returns until when the
    /// shard's delivery gate may stay open (at most `open_until`).
    pub(super) fn check_leases(&self, server: &Server, open_until: Instant) -> Instant {
        let now_ms = liveness::clock_ms();
        let (fresh, stale, first_end) = fresh(self, now_ms);
        let gate = first_end.map_or(open_until, |end| {
            open_until.min(Instant::now() + Duration::from_millis(end.saturating_sub(now_ms)))
        });
        if stale.is_empty() {
            *self.lease_checked.borrow_mut() = None;
            return gate;
        }
        let check = LeaseCheck {
            stale,
            changes: self.lease_changes.get(),
        };
        if self.lease_checked.borrow().as_ref() == Some(&check) {
            return gate;
        }
        let led: Vec<String> = self.led.borrow().iter().cloned().collect();
        let mut held = Vec::new();
        for topic in led {
            // A topic without channels delivers nothing (a channel made later is made
            // through the log, which counts as a change: looked at again then).
            if server.shard.channel_names(&topic).is_empty() {
                continue;
            }
            let lapsed = self
                .groups
                .borrow()
                .get(&topic)
                .is_some_and(|g| g.confirming.is_none() && !g.group.has_quorum(&fresh));
            if lapsed {
                self.hold_until_confirmed(server, &topic);
                held.push(topic);
            }
        }
        if !held.is_empty() {
            let names: Vec<String> = check
                .stale
                .iter()
                .map(|&r| {
                    self.cfg
                        .member(r)
                        .map_or("?", |m| m.address.as_str())
                        .to_string()
                })
                .collect();
            log::warn!(
                "CLUSTER: no answer from {} for {} ms; delivery on {} topic(s) held (first {}) until their replicas confirm this member still leads them",
                names.join(", "),
                LEASE.as_millis(),
                held.len(),
                held.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            );
        }
        *self.lease_checked.borrow_mut() = Some(check);
        gate
    }

    /// Whether `topic`'s voters are a quorum of fresh replicas now (see the module
    /// docs).
    pub(super) fn lease_holds(&self, topic: &str) -> bool {
        let (fresh, _, _) = fresh(self, liveness::clock_ms());
        self.groups
            .borrow()
            .get(topic)
            .is_some_and(|g| g.group.has_quorum(&fresh))
    }

    /// The topics this shard leads, a group's voters or a topic's channels changed, or a
    /// topic stopped waiting for a confirmation: the next lease check looks at every led
    /// topic again.
    pub(super) fn leases_changed(&self) {
        self.lease_changes
            .set(self.lease_changes.get().wrapping_add(1));
    }
}
