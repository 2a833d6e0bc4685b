//! The cluster's entry points from the rest of the broker: admin operations and SUBs
//! on replicated topics, and frames from peers routed to their shard.

use super::{ShardCluster, PROPOSE_TIMEOUT, TICK};
use crate::cluster::ClusterConfig;
use crate::mesh::ShardMsg;
use crate::server::Server;
use nsq_replication::wire::{EncodeError, Frame, OutFrame, Reply};
use nsq_replication::{ChannelOp, Entry};
use nsq_shards::mesh::{AdminError, AdminOp};
use std::rc::Rc;
use std::time::Instant;

/// An admin operation on a topic this shard owns, when the cluster takes it: a channel's
/// creation, deletion, emptying or pause, or a topic's pause, on a replicated topic, is
/// proposed to its group (every replica applies it at the same place in the log).
/// `None`: not the cluster's; run it locally.
pub async fn admin(server: &Server, op: &AdminOp) -> Option<Result<(), AdminError>> {
    let c = server.cluster.as_ref()?;
    let topic = op.topic();
    if !ClusterConfig::replicates(topic) {
        return None;
    }
    let channel_op = |t: &str, ch: &str, op: ChannelOp| {
        (
            t.to_string(),
            Entry::Channel {
                channel: ch.to_string(),
                op,
            },
        )
    };
    let (topic, entry) = match op {
        AdminOp::CreateTopic(t) => {
            if !c.ensure_group(server, t) {
                // A member that holds no replica of the topic (`--replication-factor`
                // below the cluster size): the topic is made on its replicas, through
                // their group, and not here (a publish here is forwarded the same way).
                return Some(c.change(server, t, Entry::TopicCreate).await.map_err(|e| {
                    log::warn!("TOPIC({t}): replicated change refused: {e}");
                    AdminError::Exiting
                }));
            }
            c.campaign_if_leaderless(t);
            if !c.deleted(t) {
                return Some(Ok(()));
            }
            (t.clone(), Entry::TopicCreate)
        }
        AdminOp::DeleteTopic(t) => {
            if !server.shard.topic_exists(t) {
                return Some(Err(AdminError::TopicNotFound));
            }
            if !c.ensure_group(server, t) {
                return None;
            }
            (t.clone(), Entry::TopicDelete)
        }
        AdminOp::CreateChannel(t, ch) => channel_op(t, ch, ChannelOp::Create),
        AdminOp::DeleteChannel(t, ch) => channel_op(t, ch, ChannelOp::Delete),
        AdminOp::EmptyChannel(t, ch) => channel_op(t, ch, ChannelOp::Empty),
        AdminOp::PauseChannel(t, ch, p) => channel_op(t, ch, ChannelOp::Pause(*p)),
        AdminOp::PauseTopic(t, p) => (t.clone(), Entry::TopicPause(*p)),
        _ => return None,
    };
    let exists = server.shard.topic_exists(&topic);
    if let Entry::Channel { channel, op } = &entry {
        let needs_channel = !matches!(op, ChannelOp::Create);
        if needs_channel && !exists {
            return Some(Err(AdminError::TopicNotFound));
        }
        if needs_channel && !server.shard.has_channel(&topic, channel) {
            return Some(Err(AdminError::ChannelNotFound));
        }
        if !needs_channel && server.shard.has_channel(&topic, channel) {
            return Some(Ok(()));
        }
    } else if !exists && !matches!(entry, Entry::TopicCreate) {
        return Some(Err(AdminError::TopicNotFound));
    }
    Some(c.change(server, &topic, entry).await.map_err(|e| {
        log::warn!("TOPIC({topic}): replicated change refused: {e}");
        AdminError::Exiting
    }))
}
/// A SUB to a replicated topic on the shard that owns it: only the topic's leader serves
/// consumers. On the leader the channel is created through the group first (so every
/// replica has it from the same place in the log); on another member holding a replica
/// the SUB is relayed to the leader ([`SubRoute::Relay`]); a member without a replica,
/// or a topic without a leader in time, refuses it with `E_SUB_FAILED`. `None`: not a
/// replicated topic.
pub async fn subscribe(
    server: &Server,
    topic: &str,
    channel: &str,
) -> Option<Result<(), SubRoute>> {
    let c = server.cluster.as_ref()?;
    if !ClusterConfig::replicates(topic) {
        return None;
    }
    let refused = |why: &str| {
        Some(Err(SubRoute::Refused(format!(
            "E_SUB_FAILED SUB failed {why}"
        ))))
    };
    if !c.ensure_group(server, topic) {
        return refused(&format!("topic {topic} is not held by this cluster member"));
    }
    c.campaign_if_leaderless(topic);
    let started = Instant::now();
    let deadline = started + PROPOSE_TIMEOUT;
    loop {
        let leader = c.groups.borrow().get(topic).and_then(|g| g.group.leader());
        match leader {
            Some(l) if l == c.cfg.me.replica && c.leads(topic) => break,
            Some(l) if l != c.cfg.me.replica && c.peer_tcp(l).is_some() => {
                return Some(Err(SubRoute::Relay));
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return refused(&format!("topic {topic} has no leader"));
        }
        glommio::timer::sleep(super::propose::leader_poll(started)).await;
    }
    if server.shard.has_channel(topic, channel) {
        return Some(Ok(()));
    }
    let create = Entry::Channel {
        channel: channel.to_string(),
        op: ChannelOp::Create,
    };
    Some(
        c.change(server, topic, create)
            .await
            .map_err(|e| SubRoute::Refused(format!("E_SUB_FAILED SUB failed {e}"))),
    )
}
/// False when `topic` is replicated and this member does not lead it now: a SUB routed
/// to this member's channel must be routed again (leadership moved while it waited).
/// True standalone and for an #ephemeral topic.
pub fn serves_consumers(server: &Server, topic: &str) -> bool {
    match &server.cluster {
        Some(c) if ClusterConfig::replicates(topic) => c.leads(topic),
        _ => true,
    }
}
/// Where a SUB to a replicated topic goes when not to this member's channel.
pub enum SubRoute {
    /// Through the leader ([`crate::cluster::relay`]).
    Relay,
    /// Refused with this error frame (fatal).
    Refused(String),
}
/// This member's TCP address for clients as peers reach it: `--tcp-address`'s host when
/// it names one, else `--broadcast-address`.
pub(super) fn client_address(server: &Server) -> String {
    let host = server
        .cfg
        .flags
        .tcp_address
        .rsplit_once(':')
        .map(|(h, _)| h.trim_matches(['[', ']']))
        .filter(|h| !h.is_empty() && *h != "0.0.0.0" && *h != "::")
        .map_or_else(|| server.cfg.broadcast_address.clone(), str::to_string);
    if host.contains(':') {
        format!("[{host}]:{}", server.tcp_port)
    } else {
        format!("{host}:{}", server.tcp_port)
    }
}
/// Tells every shard where peer `replica`'s clients connect (its greeting said).
pub async fn peer_greeted(server: &Rc<Server>, replica: u64, tcp: String) {
    if let Some(c) = &server.cluster {
        c.set_peer_tcp(replica, tcp.clone());
    }
    let Some(mesh) = server.mesh() else { return };
    for i in (0..server.shard.count()).filter(|&i| i != server.shard.index()) {
        let msg = ShardMsg::PeerTcp {
            replica,
            tcp: tcp.clone(),
        };
        let _ = mesh.send_to(i, msg).await;
    }
}
/// Hands a frame from peer `from` to the shard it is for: the topic's owner, or for a
/// reply the shard that sent the request.
pub async fn route(server: &Rc<Server>, from: u64, frame: Frame) {
    let shards = server.shard.count();
    let to = match &frame {
        Frame::Raft { topic, .. } | Frame::Propose { topic, .. } | Frame::Fetch { topic, .. } => {
            nsq_shards::owner_of(topic, shards)
        }
        Frame::Reply { request, .. } => usize::try_from(request >> 48).unwrap_or(usize::MAX),
        Frame::Hello(_) | Frame::Ping { .. } => return,
    };
    if to == server.shard.index() {
        if let Some(c) = &server.cluster {
            c.handle(server, from, frame);
        }
        return;
    }
    if to >= shards {
        return;
    }
    if let Some(mesh) = server.mesh() {
        let _ = mesh.send_to(to, ShardMsg::Cluster { from, frame }).await;
    }
}

/// Why `POST /topic/move-leader` failed; [`MoveLeaderError::code`] is the HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveLeaderError {
    /// `to` is not a member's `--cluster-address`.
    NotAMember,
    /// `to` is a member that holds no replica of the topic.
    NotAReplica,
    /// The topic is not replicated on this member.
    TopicNotFound,
    /// `to` did not become the leader within [`PROPOSE_TIMEOUT`] (it is down or too far
    /// behind, or no leader was elected meanwhile).
    Timeout,
    /// The broker is exiting.
    Exiting,
}

impl MoveLeaderError {
    /// The HTTP status and nsqd-style message (`{"message": ...}`) of this error.
    pub fn code(&self) -> (u16, &'static str) {
        match self {
            MoveLeaderError::NotAMember => (400, "INVALID_ARG_TO"),
            MoveLeaderError::NotAReplica => (400, "TO_NOT_A_REPLICA"),
            MoveLeaderError::TopicNotFound => (404, "TOPIC_NOT_FOUND"),
            MoveLeaderError::Timeout => (500, "MOVE_LEADER_TIMEOUT"),
            MoveLeaderError::Exiting => (500, "EXITING"),
        }
    }
}

impl super::ShardCluster {
    /// Moves the leadership of `topic` (owned by this shard) to the member whose
    /// `--cluster-address` is `to`, as Raft's leadership transfer does: the leader first
    /// holds delivery until its consumers finished what they hold in flight (at most
    /// 2 s) and replicates its channels' positions (so that its consumers, which it
    /// relays to the new leader when it stops leading, get nothing again: the
    /// `handover` module), brings `to` up to date, then tells it to campaign at once.
    /// Publishes wait for the new leader during the transfer
    /// ([`nsq_replication::ReplicationError::HandingOver`]), as during an election. A
    /// follower passes the request to the leader. Answers once `to` leads.
    pub async fn move_leader(
        &self,
        server: &Server,
        topic: &str,
        to: &str,
    ) -> Result<(), MoveLeaderError> {
        let member = std::iter::once(&self.cfg.me)
            .chain(&self.cfg.peers)
            .find(|m| m.address == to)
            .ok_or(MoveLeaderError::NotAMember)?
            .replica;
        let voters = self.groups.borrow().get(topic).map(|g| g.group.voters());
        if !voters
            .unwrap_or_else(|| self.cfg.replicas_of(topic))
            .contains(&member)
        {
            return Err(MoveLeaderError::NotAReplica);
        }
        let deadline = Instant::now() + PROPOSE_TIMEOUT;
        // Asked again each second: a request a follower passed on can be lost, and a
        // leader gives a transfer up after an election timeout.
        let mut ask_at = Instant::now();
        loop {
            let leader = self
                .group_leader(topic)
                .ok_or(MoveLeaderError::TopicNotFound)?;
            if leader == Some(member) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(MoveLeaderError::Timeout);
            }
            if Instant::now() >= ask_at && leader.is_some() {
                self.transfer_leader(server, topic, member);
                ask_at = Instant::now() + std::time::Duration::from_secs(1);
            }
            glommio::timer::sleep(TICK).await;
        }
    }
}

/// What a request to a peer ([`ShardCluster::ask`]) came to.
pub(super) enum Asked {
    /// The peer's reply.
    Reply(Reply),
    /// The connection to the peer went down, or the caller gave up on the peer, before
    /// a reply.
    Gone,
    /// No reply by the deadline while the connection stayed up.
    Unanswered,
}

impl ShardCluster {
    /// Sends the request frame `make` encodes for a fresh request number to peer `to`,
    /// and waits for the peer's [`Frame::Reply`] to it (routed back to this shard by the
    /// number's top 16 bits) until `deadline`. Every [`TICK`] it checks the connection,
    /// and `give_up` (e.g. the topic's leader moved): either ends the wait as
    /// [`Asked::Gone`].
    ///
    /// # Errors
    ///
    /// What `make` returns: the frame was not sent.
    pub(super) async fn ask<F: Into<OutFrame>>(
        &self,
        to: u64,
        make: impl FnOnce(u64) -> Result<F, EncodeError>,
        deadline: Instant,
        give_up: impl Fn() -> bool,
    ) -> Result<Asked, EncodeError> {
        let n = self.next_request.get();
        self.next_request.set(n + 1);
        // The top 16 bits name this shard: the reply comes back to it.
        let request = (n & 0xffff_ffff_ffff) | ((self.shard_index as u64) << 48);
        let frame = make(request)?;
        let (tx, mut rx) = futures::channel::oneshot::channel();
        self.requests.borrow_mut().insert(request, tx);
        self.links.send(to, frame);
        let asked = loop {
            let tick = std::pin::pin!(glommio::timer::sleep(TICK));
            match futures::future::select(&mut rx, tick).await {
                futures::future::Either::Left((Ok(reply), _)) => break Asked::Reply(reply),
                futures::future::Either::Left((Err(_), _)) => break Asked::Unanswered,
                futures::future::Either::Right(_) => {
                    if !self.links.connected(to) || give_up() {
                        break Asked::Gone;
                    }
                    if Instant::now() >= deadline {
                        break Asked::Unanswered;
                    }
                }
            }
        };
        self.requests.borrow_mut().remove(&request);
        Ok(asked)
    }
}
