//! A leader that stopped running confirms it still leads before it delivers again.
//!
//! A member whose process was stopped (SIGSTOP, a paused VM) for longer than its
//! followers wait before they elect another leader wakes up believing it still leads
//! its topics. Until a message of the new term reaches it, it would deliver from its
//! channels what the new leader has been delivering meanwhile (the same messages, with
//! the same attempts: duplicates no failover bound covers). So the shard's clock
//! ([`clock`]) runs every [`super::TICK`]; when it finds it did not run for [`STALL`]:
//!
//! - every topic this shard leads that has channels holds delivery
//!   ([`ShardCluster::apply_delivery_hold`]) and asks a majority of its replicas
//!   whether it still leads ([`nsq_replication::TopicGroup::confirm_leadership`]: a
//!   heartbeat with a number of its own, which an answer sent before the stall cannot
//!   carry). A confirmation releases delivery once the topic's delivery lease holds
//!   again ([`super::lease`]: a stalled shard's replicas answered no ping meanwhile);
//!   an answer with a higher term deposes the member, whose consumers are then relayed
//!   to the new leader. A request that gets no answer is asked again every
//!   [`CONFIRM_AGAIN`].
//! - The consumers of those topics keep what was framed for them before the stall and
//!   not yet written ([`nsq_shards::client::Outbox::hold_flushes`]): another leader may
//!   have delivered those messages since. It is written once the leadership is
//!   confirmed, and dropped when the member is deposed (the new leader delivers them
//!   again).
//! - Until the clock has run, nothing is delivered or written to a client on the
//!   shard's thread at all ([`nsq_shards::delivery_gate`], which the clock keeps open
//!   for [`STALL`] past each run): on waking, the consumers' queued FINs and RDYs may be
//!   read before the clock runs, and each would deliver more, and a writer whose
//!   output-buffer timer ran out during the stall would write what was buffered.
//!
//! The same clock checks each led topic's delivery lease ([`super::lease`]), what stops
//! a leader that keeps running while cut off from its replicas; a lease that runs out
//! holds the topic the same way.
//!
//! [`STALL`] is well under the least time its followers wait before electing another
//! leader (a follower that hears nothing from the leader's member for 400 ms campaigns
//! within 1 to 5 ticks more; docs/replication.md, "Failover"), so a leader whose clock
//! kept to it cannot have been replaced without hearing of it.

use super::{Group, ShardCluster, TICK};
use crate::server::Server;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A gap between two runs of the clock longer than this is a stall.
pub const STALL: Duration = Duration::from_millis(200);

/// How long a confirmation may take before it is asked again (raft-rs drops a request
/// on a leader that has not committed an entry of its term yet, and a heartbeat can be
/// lost with a connection).
pub const CONFIRM_AGAIN: Duration = Duration::from_millis(250);

/// A leader's question to its replicas after a stall: the number it asked with, and
/// when.
#[derive(Clone, Copy, Debug)]
pub struct Confirming {
    request: u64,
    asked: Instant,
}

/// The shard's clock: runs every [`TICK`] until the shard shuts down (see the module
/// docs).
pub async fn clock(server: Rc<Server>) {
    let Some(c) = server.cluster.clone() else {
        return;
    };
    let mut last = Instant::now();
    let mut gate = last + STALL;
    nsq_shards::delivery_gate::open_until(gate);
    while !server.shard.shutdown.is_set() {
        glommio::timer::sleep(TICK).await;
        let now = Instant::now();
        let gap = now - last;
        last = now;
        if gap > STALL {
            c.stalled(&server, gap);
        }
        c.confirm_again();
        let closed_meanwhile = now >= gate;
        gate = c.check_leases(&server, now + STALL);
        nsq_shards::delivery_gate::open_until(gate);
        if closed_meanwhile {
            // What the closed gate refused goes out now, except on the topics held
            // until they are confirmed.
            server.shard.dispatch_every_topic();
        }
    }
    // Shutting down: what is left to write (a drain's last deliveries) does not wait
    // for a clock that no longer runs.
    nsq_shards::delivery_gate::open_for_good();
}

impl ShardCluster {
    /// The shard did not run for `gap`: each topic it leads that has channels holds
    /// delivery until a majority confirms it still leads.
    fn stalled(&self, server: &Server, gap: Duration) {
        let led: Vec<String> = self.led.borrow().iter().cloned().collect();
        let mut asked = 0;
        for topic in led {
            if server.shard.channel_names(&topic).is_empty() {
                continue;
            }
            self.hold_until_confirmed(server, &topic);
            asked += 1;
        }
        if asked > 0 {
            log::info!(
                "CLUSTER: this shard did not run for {} ms; delivery on the {asked} topic(s) it leads held until its replicas confirm it still leads them",
                gap.as_millis()
            );
        }
    }

    /// Holds `topic`'s delivery, and what was framed for its consumers and not yet
    /// written, until its replicas confirm this member still leads it: another leader
    /// may have delivered those messages since. Written once confirmed, dropped if
    /// deposed ([`ShardCluster::leadership_confirmed`]).
    pub(super) fn hold_until_confirmed(&self, server: &Server, topic: &str) {
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            self.ask_to_confirm(topic, g);
        }
        self.apply_delivery_hold(server, topic);
        for client in server.shard.topic_consumers(topic) {
            client.outbox().hold_flushes(true);
        }
        self.mark(topic);
    }

    /// Asks `topic`'s replicas (`g`) whether this member still leads, with a number not
    /// used before.
    fn ask_to_confirm(&self, topic: &str, g: &mut Group) {
        let request = self.next_request.get();
        self.next_request.set(request + 1);
        g.confirming = Some(Confirming {
            request,
            asked: Instant::now(),
        });
        g.group.confirm_leadership(request);
        self.confirming.borrow_mut().insert(topic.to_string());
    }

    /// Asks again where a confirmation has been waited for longer than
    /// [`CONFIRM_AGAIN`].
    fn confirm_again(&self) {
        if self.confirming.borrow().is_empty() {
            return;
        }
        let topics: Vec<String> = self.confirming.borrow().iter().cloned().collect();
        for topic in topics {
            let mut groups = self.groups.borrow_mut();
            match groups.get_mut(&topic) {
                Some(g) if g.confirming.is_some() => {
                    if g.confirming
                        .is_some_and(|c| c.asked.elapsed() >= CONFIRM_AGAIN)
                    {
                        self.ask_to_confirm(&topic, g);
                        drop(groups);
                        self.mark(&topic);
                    }
                }
                // Confirmed, or no longer led (an election answered it).
                _ => {
                    self.confirming.borrow_mut().remove(&topic);
                }
            }
        }
    }

    /// `topic`'s group answered the requests `confirmed`: delivery is released when one
    /// is the request this member waits for and a quorum of the topic's replicas is
    /// fresh ([`super::lease`]); with the quorum not fresh yet, it asks again at the
    /// clock's next run.
    pub(super) fn leadership_confirmed(&self, server: &Server, topic: &str, confirmed: &[u64]) {
        let lease = self.lease_holds(topic);
        let released = self.groups.borrow_mut().get_mut(topic).is_some_and(|g| {
            let Some(c) = g.confirming.filter(|c| confirmed.contains(&c.request)) else {
                return false;
            };
            if lease {
                g.confirming = None;
            } else {
                let now = Instant::now();
                g.confirming = Some(Confirming {
                    request: c.request,
                    asked: now.checked_sub(CONFIRM_AGAIN).unwrap_or(now),
                });
            }
            lease
        });
        if released {
            // Delivering again: the next lease check looks at it, whatever it found last.
            self.leases_changed();
            log::info!("TOPIC({topic}): its replicas confirmed this member still leads it; delivery goes on");
            for client in server.shard.topic_consumers(topic) {
                client.outbox().hold_flushes(false);
            }
            self.apply_delivery_hold(server, topic);
        }
    }
}
