//! A replica's copy of its leader's channel state for channels holding more unfinished
//! messages than a leader sends whole each round ([`POSITION_MAX`]): the leader sends
//! what changed ([`ChannelOp::Changes`]), and a replica that holds the state those
//! changes apply to keeps it here, by sequence, until it leads the topic itself
//! (docs/replication.md, "Channel state").
//!
//! A replica holds a channel's exact state once it applied a whole position of it
//! ([`ChannelOp::Position`]) in this process; it loses it when the leader sends only a
//! low watermark ([`ChannelOp::Cursor`]), when the channel is emptied or deleted, when a
//! snapshot replaces the topic, and when this member stops leading (its channels then
//! hold what its own consumers did, which the log does not say). Without it a replica
//! keeps the channel at the leader's low watermark: what is above is delivered again
//! after a failover, as before changes were replicated.
//!
//! [`POSITION_MAX`]: super::POSITION_MAX

use super::ShardCluster;
use crate::server::Server;
use nsq_replication::{ChannelOp, Entry, PendingMessage};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One channel's state as its leader's changes left it.
#[derive(Debug, Default)]
struct ChannelView {
    cursor: u64,
    /// Unfinished messages by sequence: (attempts, due Unix ns or 0).
    pending: BTreeMap<u64, (u16, i64)>,
}

/// The exact channel states a replica holds for one topic.
#[derive(Debug, Default)]
pub(super) struct Views {
    /// Channels whose state, as this replica holds it, is the leader's as of the last
    /// entry applied: set by a whole position, kept in the channel itself.
    exact: HashSet<String>,
    /// Channels whose exact state is kept here (changes applied since).
    views: HashMap<String, ChannelView>,
    /// On a replica: channels whose whole state to ask the leader for, and when each
    /// was last asked for (at most once per [`ASK_EVERY`]).
    to_ask: Vec<String>,
    asked_at: HashMap<String, Instant>,
    /// On the leader: channels a replica asked the whole state of
    /// ([`ChannelOp::SendWhole`]), sent at the next round.
    wanted: HashSet<String>,
    /// On the leader: channels replicated by their changes, and when their last
    /// [`ChannelOp::Changes`] was proposed.
    changes_sent_at: HashMap<String, Instant>,
}

/// How often a leader proposes a channel's [`ChannelOp::Changes`] when nothing changed
/// (then empty): a replica that lacks the state they apply to (it restarted) learns so
/// within this and asks for the whole state, even of a channel nobody uses.
pub(super) const CHANGES_REFRESH: Duration = Duration::from_secs(10);

/// How often a replica without a channel's exact state asks its leader for it.
const ASK_EVERY: Duration = Duration::from_secs(10);

impl Views {
    /// A whole position of `channel` was applied to the channel.
    pub(super) fn whole_applied(&mut self, channel: &str) {
        self.views.remove(channel);
        self.exact.insert(channel.to_string());
    }

    /// `channel`'s exact state is no longer known here.
    pub(super) fn forget(&mut self, channel: &str) {
        self.views.remove(channel);
        self.exact.remove(channel);
    }

    /// No channel's exact state is known here, and no replica's request stands.
    pub(super) fn forget_all(&mut self) {
        self.views.clear();
        self.exact.clear();
        self.wanted.clear();
        self.changes_sent_at.clear();
    }

    /// The leader proposed `channel`'s changes now.
    pub(super) fn changes_sent(&mut self, channel: &str) {
        self.changes_sent_at
            .insert(channel.to_string(), Instant::now());
    }

    /// `channel` is no longer replicated by its changes (it is sent whole, or by its
    /// low watermark).
    pub(super) fn changes_ended(&mut self, channel: &str) {
        self.changes_sent_at.remove(channel);
    }

    /// True when `channel`'s changes were last proposed [`CHANGES_REFRESH`] ago or more.
    pub(super) fn changes_refresh_due_for(&self, channel: &str) -> bool {
        self.changes_sent_at
            .get(channel)
            .is_some_and(|at| at.elapsed() >= CHANGES_REFRESH)
    }

    /// True when some channel's changes are due again ([`CHANGES_REFRESH`]).
    pub(super) fn changes_refresh_due(&self) -> bool {
        self.changes_sent_at
            .values()
            .any(|at| at.elapsed() >= CHANGES_REFRESH)
    }

    /// A replica asked for `channel`'s whole state (this member leads).
    pub(super) fn want_whole(&mut self, channel: &str) {
        self.wanted.insert(channel.to_string());
    }

    /// The channels replicas asked the whole state of.
    pub(super) fn wanted_whole(&self) -> &HashSet<String> {
        &self.wanted
    }

    /// `channel`'s state goes out this round: true when a replica had asked for it
    /// whole (the request is then answered).
    pub(super) fn whole_sent(&mut self, channel: &str) -> bool {
        self.wanted.remove(channel)
    }

    /// This replica has no state that `channel`'s changes apply to: it asks for the
    /// whole state, unless it did within [`ASK_EVERY`].
    fn ask_whole(&mut self, channel: &str) {
        let now = Instant::now();
        if self
            .asked_at
            .get(channel)
            .is_some_and(|&at| now.duration_since(at) < ASK_EVERY)
        {
            return;
        }
        self.asked_at.insert(channel.to_string(), now);
        self.to_ask.push(channel.to_string());
    }

    /// Each channel whose state is kept here: its name, the leader's cursor and how
    /// many messages it holds unfinished (`GET /cluster`).
    pub(super) fn describe(&self) -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = self
            .views
            .iter()
            .map(|(name, v)| {
                serde_json::json!({
                    "channel": name,
                    "cursor": v.cursor,
                    "unfinished": v.pending.len(),
                })
            })
            .collect();
        out.sort_by(|a, b| a["channel"].as_str().cmp(&b["channel"].as_str()));
        out
    }

    /// Channels whose state is kept here.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.views.len()
    }
}

impl ShardCluster {
    /// A replica applies its leader's changes to `channel` of `topic`
    /// ([`nsq_replication::ChannelOp::Changes`]): to the exact state it holds, if any,
    /// then moves the channel itself to the leader's low watermark (what the topic's
    /// log retention needs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_changes(
        &self,
        server: &Server,
        topic: &str,
        channel: &str,
        cursor: u64,
        low: u64,
        finished: &[u64],
        pending: &[PendingMessage],
    ) {
        {
            let mut groups = self.groups.borrow_mut();
            if let Some(g) = groups.get_mut(topic) {
                let v = &mut g.views;
                if !v.views.contains_key(channel) && v.exact.contains(channel) {
                    // The first changes after a whole position: the channel holds the
                    // state they apply to.
                    if let Some((cursor, held)) = server.shard.channel_state(topic, channel) {
                        let view = ChannelView {
                            cursor,
                            pending: held.into_iter().map(|(s, a, d)| (s, (a, d))).collect(),
                        };
                        v.views.insert(channel.to_string(), view);
                    }
                }
                if !v.views.contains_key(channel) {
                    v.ask_whole(channel);
                }
                if let Some(view) = v.views.get_mut(channel) {
                    for seq in finished {
                        view.pending.remove(seq);
                    }
                    for p in pending {
                        view.pending.insert(p.offset, (p.attempts, p.due_unix_ns));
                    }
                    view.cursor = cursor;
                    // Everything below the leader's low watermark is finished.
                    view.pending = view.pending.split_off(&low);
                }
            }
        }
        server.shard.advance_channel(topic, channel, low);
    }

    /// Asks the leaders for the whole states this shard's replicas lack
    /// ([`ChannelOp::SendWhole`], proposed through the leader like any channel
    /// change); called every round.
    pub(super) fn ask_for_whole_states(self: &Rc<Self>, server: &Rc<Server>) {
        let asks: Vec<(String, String)> = self
            .groups
            .borrow_mut()
            .iter_mut()
            .flat_map(|(topic, g)| {
                std::mem::take(&mut g.views.to_ask)
                    .into_iter()
                    .map(move |ch| (topic.clone(), ch))
            })
            .collect();
        for (topic, channel) in asks {
            log::info!(
                "TOPIC({topic}): asks its leader for channel {channel}'s whole state (this replica holds it by its low watermark)"
            );
            let (me, server) = (self.clone(), server.clone());
            glommio::spawn_local(async move {
                let ask = Entry::Channel {
                    channel,
                    op: ChannelOp::SendWhole,
                };
                if let Err(e) = me.change(&server, &topic, ask).await {
                    log::debug!("TOPIC({topic}): asking for a channel's whole state: {e}");
                }
            })
            .detach();
        }
    }

    /// A member that leads `topic` and has applied every entry of its predecessors
    /// sets its channels to the exact states kept for them, and from then on its
    /// channels record their changes for the rounds ([`super::apply`]). Returns false
    /// when it had done so already in this term.
    pub(super) fn take_over_channels(&self, server: &Server, topic: &str) -> bool {
        let views = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(topic) else {
                return false;
            };
            if g.channels_taken_over || !g.group.applied_own_term() {
                return false;
            }
            g.channels_taken_over = true;
            // The first round sends every channel's state.
            g.cursors.clear();
            g.cursors_at = None;
            std::mem::take(&mut g.views.views)
        };
        for (channel, view) in views {
            let pending: Vec<(u64, u16, i64)> = view
                .pending
                .into_iter()
                .map(|(s, (a, d))| (s, a, d))
                .collect();
            log::info!(
                "TOPIC({topic}): channel {channel} takes over {} unfinished message(s) as its last leader left them",
                pending.len()
            );
            server
                .shard
                .set_channel_position(topic, &channel, view.cursor, &pending);
        }
        server.shard.start_tracking_changes(topic);
        // Held since this member became the leader (unless a hand-over is under way).
        self.apply_delivery_hold(server, topic);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_position_makes_a_channel_exact_and_forgetting_undoes_it() {
        let mut v = Views::default();
        v.whole_applied("c");
        assert!(v.exact.contains("c"));
        v.views.insert("c".into(), ChannelView::default());
        v.whole_applied("c");
        assert_eq!(v.len(), 0);
        v.views.insert("c".into(), ChannelView::default());
        v.forget("c");
        assert!(!v.exact.contains("c") && v.len() == 0);
        v.whole_applied("d");
        v.forget_all();
        assert!(v.exact.is_empty());
    }
}
