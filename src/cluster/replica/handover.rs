//! A leader's hand-over of a topic to another replica (`POST /topic/move-leader`,
//! `--rebalance-leaders`, a member leaving the topic's placement): delivery on the
//! topic's channels is held until its consumers have finished what they hold in flight
//! (at most [`HAND_OVER_DRAIN`]), the channels' positions are replicated, and only
//! then is the leadership transferred (raft-rs's leadership transfer). The new leader
//! thereby takes channel states in which nothing is in flight to the old leader's
//! consumers, which it relays to the new leader on their connections: a move delivers
//! nothing twice unless a consumer holds a message past the bound. Messages in flight
//! to a consumer that has gone are not waited for: they wait for their timeout, as in
//! nsqd, and the new leader delivers them again. Publishes are taken
//! as usual while the consumers finish, and wait for the new leader during the
//! transfer itself ([`nsq_replication::ReplicationError::HandingOver`]).

use super::ShardCluster;
use crate::server::Server;
use nsq_replication::raft::eraftpb::{Message as RaftMessage, MessageType};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest a leader holds delivery for its consumers to finish what they hold in
/// flight before it hands a topic over; what is still in flight then is delivered
/// again by the new leader.
pub(super) const HAND_OVER_DRAIN: Duration = Duration::from_secs(2);

/// How often the driver looks at hand-overs under way (instead of every `TICK`).
pub(super) const HAND_OVER_POLL: Duration = Duration::from_millis(2);

/// The longest delivery stays held once the transfer was asked for (raft-rs gives a
/// transfer up after an election timeout, 0.5-0.95 s); and after
/// [`HAND_OVER_DRAIN`] more than this from the start, whatever happened.
const TRANSFER_WAIT: Duration = Duration::from_secs(3);

/// The oldest campaign request (raft-rs's `MsgTimeoutNow`, by its sender's wall clock)
/// a replica acts on. The leader that sent it gave the transfer up after an election
/// timeout (0.5-0.95 s); one that is older reached a replica that was stopped (SIGSTOP)
/// or cut off while its connection stayed up, and would depose a leader nobody asked to
/// move any more. Members' clocks must agree to within about a second for a transfer to
/// go through (NTP keeps them within milliseconds): a replica whose clock runs this far
/// ahead of the leader's ignores its requests, logged, and the transfer fails as a
/// timed-out one does (`MOVE_LEADER_TIMEOUT`).
pub(super) const TIMEOUT_NOW_MAX_AGE: Duration = Duration::from_secs(2);

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Stamps a campaign request with the sender's wall clock (in its context, which
/// raft-rs leaves unused on this message), for [`stale_campaign_request`].
pub(super) fn stamp_campaign_request(m: &mut RaftMessage) {
    if m.get_msg_type() == MessageType::MsgTimeoutNow {
        m.context = wall_ms().to_le_bytes().to_vec().into();
    }
}

/// How old a stamped campaign request is, when it is older than
/// [`TIMEOUT_NOW_MAX_AGE`] (`None`: another message, unstamped, or recent).
pub(super) fn stale_campaign_request(m: &RaftMessage) -> Option<Duration> {
    if m.get_msg_type() != MessageType::MsgTimeoutNow {
        return None;
    }
    let sent: [u8; 8] = m.context.as_ref().try_into().ok()?;
    let age = Duration::from_millis(wall_ms().saturating_sub(u64::from_le_bytes(sent)));
    (age > TIMEOUT_NOW_MAX_AGE).then_some(age)
}

/// One topic's hand-over under way on its leader.
pub(super) struct HandOver {
    /// The replica to hand the leadership to.
    to: u64,
    /// When delivery was held.
    since: Instant,
    /// When the transfer was asked of raft-rs (`None`: the consumers still finish).
    transferred_at: Option<Instant>,
}

impl ShardCluster {
    /// Starts handing `topic`, which this member leads, to replica `to`: delivery on the
    /// topic's channels is held from now on, and [`ShardCluster::advance_hand_overs`]
    /// transfers the leadership once nothing is in flight. A hand-over already under
    /// way goes on (to `to`, if its transfer was not asked for yet).
    pub(super) fn start_hand_over(&self, server: &Server, topic: &str, to: u64) {
        if to == self.cfg.me.replica {
            return;
        }
        // A replica out of touch (down, stopped, cut off) cannot take the leadership:
        // holding delivery and publishes for it would only stall the topic (a
        // `move-leader` asks again each second until its 5 s run out).
        if !super::liveness::in_touch(to) {
            log::info!(
                "TOPIC({topic}): not handing leadership to {}: it is out of touch (no frame from it within {} ms)",
                self.address_of(to),
                super::liveness::SILENT_AFTER.as_millis()
            );
            return;
        }
        let mut hand_overs = self.hand_overs.borrow_mut();
        if let Some(h) = hand_overs.get_mut(topic) {
            if h.transferred_at.is_none() {
                h.to = to;
            }
            return;
        }
        hand_overs.insert(
            topic.to_string(),
            HandOver {
                to,
                since: Instant::now(),
                transferred_at: None,
            },
        );
        drop(hand_overs);
        let in_flight = self.apply_delivery_hold(server, topic);
        log::info!(
            "TOPIC({topic}): handing leadership to {}; delivery held until the {in_flight} message(s) in flight are finished (at most {} s)",
            self.address_of(to),
            HAND_OVER_DRAIN.as_secs()
        );
        self.wake.notify();
    }

    /// Holds or releases delivery on `topic`'s channels as this member's state says,
    /// the one rule for every reason to hold it: a hand-over under way (its consumers
    /// finish what they hold first); a leadership whose channels have not yet taken
    /// over the states of the entries before its term
    /// ([`ShardCluster::take_over_channels`]: a follower's states may lag the last
    /// leader's by the commits it had not heard of); or a leadership to confirm after
    /// the shard stalled ([`super::stall`]: another member may lead by now). Returns the messages in flight to
    /// the topic's consumers ([`nsq_shards::Shard::hold_topic_deliveries`]).
    pub(super) fn apply_delivery_hold(&self, server: &Server, topic: &str) -> usize {
        let (taken_over, confirming) =
            self.groups.borrow().get(topic).map_or((false, false), |g| {
                (g.channels_taken_over, g.confirming.is_some())
            });
        let leads = self.led.borrow().contains(topic);
        let held =
            (leads && (!taken_over || confirming)) || self.hand_overs.borrow().contains_key(topic);
        server.shard.hold_topic_deliveries(topic, held)
    }

    /// True while a hand-over is under way on this shard (the driver then looks at it
    /// every [`HAND_OVER_POLL`]).
    pub(super) fn handing_over(&self) -> bool {
        !self.hand_overs.borrow().is_empty()
    }

    /// Moves each hand-over on: transfers the leadership once the topic's consumers hold
    /// nothing in flight (or [`HAND_OVER_DRAIN`] passed), and releases delivery once
    /// the transfer ended, either way (this member no longer leads: its consumers were
    /// relayed to the new leader; or it still does, the transfer given up), or when this
    /// member stopped leading meanwhile.
    pub(super) fn advance_hand_overs(&self, server: &Server) {
        let topics: Vec<String> = self.hand_overs.borrow().keys().cloned().collect();
        for topic in topics {
            let (leader_now, transferring) = {
                let groups = self.groups.borrow();
                groups.get(&topic).map_or((false, false), |g| {
                    (g.group.is_leader() && !g.stopped, g.group.transferring())
                })
            };
            // Cleared once the step-down was handled (its consumers detached and
            // relayed): only then may delivery go on here without reaching them.
            let led = self.led.borrow().contains(&topic);
            let (to, since, transferred_at) = match self.hand_overs.borrow().get(&topic) {
                Some(h) => (h.to, h.since, h.transferred_at),
                None => continue,
            };
            let release = match transferred_at {
                // However the group fares, delivery is not held for longer.
                _ if since.elapsed() >= HAND_OVER_DRAIN + TRANSFER_WAIT => true,
                None if !led => true,
                None => {
                    let in_flight = server.shard.topic_in_flight_to_consumers(&topic);
                    if leader_now && (in_flight == 0 || since.elapsed() >= HAND_OVER_DRAIN) {
                        if in_flight > 0 {
                            log::info!(
                                "TOPIC({topic}): {in_flight} message(s) still in flight after {} s, held by {}; the new leader delivers them again",
                                HAND_OVER_DRAIN.as_secs(),
                                server.shard.topic_in_flight_holders(&topic).join(", ")
                            );
                        }
                        // The positions go first: what was finished reaches the new
                        // leader before it leads.
                        self.replicate_cursors_of(server, vec![topic.clone()]);
                        if let Some(g) = self.groups.borrow_mut().get_mut(&topic) {
                            g.group.transfer_leader(to);
                        }
                        if let Some(h) = self.hand_overs.borrow_mut().get_mut(&topic) {
                            h.transferred_at = Some(Instant::now());
                        }
                        self.mark(&topic);
                    }
                    false
                }
                // Given up by raft-rs while this member still leads, or stuck.
                Some(at) => !led || (leader_now && !transferring) || at.elapsed() >= TRANSFER_WAIT,
            };
            if release {
                self.hand_overs.borrow_mut().remove(&topic);
                self.apply_delivery_hold(server, &topic);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_request_older_than_the_bound_is_stale() {
        let mut m = RaftMessage::default();
        m.set_msg_type(MessageType::MsgTimeoutNow);
        assert_eq!(stale_campaign_request(&m), None, "unstamped");
        stamp_campaign_request(&mut m);
        assert_eq!(stale_campaign_request(&m), None, "just sent");
        let old = wall_ms() - 5_000;
        m.context = old.to_le_bytes().to_vec().into();
        let age = stale_campaign_request(&m).expect("stale");
        assert!(age >= Duration::from_secs(5), "{age:?}");
        // Other messages are neither stamped nor judged.
        let mut a = RaftMessage::default();
        a.set_msg_type(MessageType::MsgAppend);
        stamp_campaign_request(&mut a);
        assert!(a.context.is_empty());
        a.context = old.to_le_bytes().to_vec().into();
        assert_eq!(stale_campaign_request(&a), None);
    }
}
