//! Preferred leaders (`--rebalance-leaders`, docs/replication.md, "Preferred leaders"):
//! each topic's preferred leader is the first member of its placement (the member with
//! the highest rendezvous score for the topic, so the topics' preferred leaders spread
//! evenly over the members). Elections put leadership wherever a member campaigned
//! first, and a member that restarts leads nothing until another fails, so after a
//! rolling restart the members that stayed up lead nearly every topic. With the flag
//! on, a leader that is not its topic's preferred member hands the leadership to it,
//! as `POST /topic/move-leader` does, once that member is a voter in touch (heard from
//! within 400 ms) holding every committed entry. This is Kafka's preferred-replica election
//! (`auto.leader.rebalance.enable`).
//!
//! Off by default: a move holds the topic's deliveries while its consumers finish what
//! they hold (`handover`), and the old leader's consumers are served through it (one
//! more hop) until they reconnect; publishes wait for the new leader during the
//! transfer and none is refused.

use super::{Gap, ShardCluster};
use crate::server::Server;
use std::time::Duration;

/// How often a leader looks for topics whose preferred member could lead.
pub(super) const REBALANCE_EVERY: Duration = Duration::from_secs(5);

/// The most topics a shard hands over per look: a member that comes back does not
/// disconnect every consumer of its topics at once.
const MOVES_PER_ROUND: usize = 16;

impl ShardCluster {
    /// Hands the leadership of up to [`MOVES_PER_ROUND`] topics this member leads to
    /// their preferred members (see the module docs); nothing without
    /// `--rebalance-leaders`.
    pub(super) fn rebalance_leaders(&self, server: &Server) {
        if !self.cfg.rebalance_leaders {
            return;
        }
        let me = self.cfg.me.replica;
        let moves: Vec<(String, u64)> = {
            let groups = self.groups.borrow();
            groups
                .iter()
                .filter_map(|(topic, g)| {
                    if !g.group.is_leader()
                        || g.stopped
                        || g.gap != Gap::None
                        || g.placement != super::membership::Placement::Placed
                        || g.group.membership_pending()
                    {
                        return None;
                    }
                    let preferred = *self.cfg.replicas_of(topic).first()?;
                    let ready = preferred != me
                        && g.group.voters().contains(&preferred)
                        && self.links.connected(preferred)
                        && super::liveness::in_touch(preferred)
                        && g.group
                            .matched(preferred)
                            .is_some_and(|m| m >= g.group.commit_index());
                    ready.then(|| (topic.clone(), preferred))
                })
                .take(MOVES_PER_ROUND)
                .collect()
        };
        if moves.is_empty() {
            return;
        }
        for (topic, to) in moves {
            log::info!(
                "TOPIC({topic}): handing leadership to {}, its preferred leader (--rebalance-leaders)",
                self.address_of(to)
            );
            self.transfer_leader(server, &topic, to);
        }
    }
}
