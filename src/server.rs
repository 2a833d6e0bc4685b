//! Per-shard server context: the shard, the process configuration and the helpers that
//! route work to a topic's owning shard (locally, or through the mesh).

use crate::config::Config;
use crate::mesh::Senders;
use crate::mesh::ShardMsg;
use bytes::Bytes;
use futures::channel::oneshot;
use nsq_shards::mesh::{AdminError, AdminOp};
use nsq_shards::node::NodeUpdate;
use nsq_shards::shard::inspect::{InspectAnswer, InspectError, InspectRequest};
use nsq_shards::stats::{ShardStats, StatsRequest};
use nsq_shards::topic::PublishError;
use nsq_shards::{owner_of, Shard};
use std::rc::Rc;
use std::time::Instant;

pub struct Server {
    pub shard: Rc<Shard>,
    pub cfg: Rc<Config>,
    /// Real listening addresses (after port 0 was resolved).
    pub tcp_port: u16,
    pub http_port: u16,
    /// The HTTPS listener's port (0 without one).
    pub https_port: u16,
    pub mesh: Option<Rc<Senders>>,
    /// This shard's part of the cluster (`--cluster-address`; docs/replication.md).
    pub cluster: Option<Rc<crate::cluster::ShardCluster>>,
}

impl Server {
    pub fn mesh(&self) -> Option<Rc<Senders>> {
        self.mesh.clone()
    }

    /// True when `topic` is replicated across the cluster (a cluster member, a topic
    /// that is not `#ephemeral`).
    pub fn replicates(&self, topic: &str) -> bool {
        self.cluster.is_some() && crate::cluster::ClusterConfig::replicates(topic)
    }

    /// Publishes to a replicated topic this shard owns, through its group
    /// ([`crate::cluster::ShardCluster::publish`], which says what `wire` is).
    pub async fn publish_replicated(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        wire: Option<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<(), PublishError> {
        match &self.cluster {
            Some(c) => c.publish(self, topic, bodies, wire, defer_until).await,
            None => Err(PublishError::Exiting),
        }
    }

    /// [`Server::publish`] of the bodies of one PUB, DPUB or MPUB frame: `wire` is the
    /// frame's message part (each body after its 4-byte size), which a replicated
    /// topic's leader proposes as it is instead of copying the bodies.
    pub async fn publish_frame(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        wire: Option<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<(), PublishError> {
        if owner_of(topic, self.shard.count()) == self.shard.index() && self.replicates(topic) {
            return self
                .publish_replicated(topic, bodies, wire, defer_until)
                .await;
        }
        self.publish(topic, bodies, defer_until).await
    }

    /// Publishes on the topic's owner: directly when it is this shard, else forwarded
    /// through the mesh and answered once the owner has appended the messages.
    pub async fn publish(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<(), PublishError> {
        self.publish_synced(topic, bodies, defer_until, false).await
    }

    /// [`Server::publish`], answered only once the messages are synced to disk when
    /// `synced`, whatever the sync policy (the dead-letter publisher's,
    /// [`crate::dead_letter`]).
    pub async fn publish_synced(
        &self,
        topic: &str,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        synced: bool,
    ) -> Result<(), PublishError> {
        let owner = owner_of(topic, self.shard.count());
        if owner == self.shard.index() {
            if self.replicates(topic) {
                return self
                    .publish_replicated(topic, bodies, None, defer_until)
                    .await;
            }
            return crate::owner::Publish::start(&self.shard, topic, bodies, defer_until, synced)
                .finish(&self.shard)
                .await;
        }
        let Some(mesh) = self.mesh() else {
            return Err(PublishError::Exiting);
        };
        let (tx, rx) = oneshot::channel();
        let msg = ShardMsg::Publish {
            topic: topic.to_string(),
            bodies,
            defer_until,
            synced,
            reply: tx,
        };
        self.shard.count_cross_sent();
        if mesh.send_to(owner, msg).await.is_err() {
            return Err(PublishError::Exiting);
        }
        rx.await.unwrap_or(Err(PublishError::Exiting))
    }

    /// Runs an admin operation on the topic's owner.
    pub async fn admin(&self, op: AdminOp) -> Result<(), AdminError> {
        let topic = op.topic().to_string();
        let owner = owner_of(&topic, self.shard.count());
        if owner == self.shard.index() {
            if let Some(r) = crate::cluster::replica::admin(self, &op).await {
                return r;
            }
            return crate::owner::Admin::start(&self.shard, op)
                .finish(&self.shard)
                .await;
        }
        let Some(mesh) = self.mesh() else {
            return Err(AdminError::Exiting);
        };
        let (tx, rx) = oneshot::channel();
        if mesh
            .send_to(owner, ShardMsg::Admin { op, reply: tx })
            .await
            .is_err()
        {
            return Err(AdminError::Exiting);
        }
        rx.await.unwrap_or(Err(AdminError::Exiting))
    }

    /// Answers `GET /message` or `GET /messages` on the topic's owner (here, or through
    /// the mesh as [`Server::admin`] does). Errors as [`Shard::inspect`]'s; `Exiting`
    /// when the owner is gone.
    pub async fn inspect(&self, req: InspectRequest) -> Result<InspectAnswer, InspectError> {
        let topic = match &req {
            InspectRequest::Message { topic, .. } | InspectRequest::Peek { topic, .. } => {
                topic.clone()
            }
        };
        let owner = owner_of(&topic, self.shard.count());
        if owner == self.shard.index() {
            return self.shard.inspect(req).await;
        }
        let Some(mesh) = self.mesh() else {
            return Err(InspectError::Exiting);
        };
        let (tx, rx) = oneshot::channel();
        if mesh
            .send_to(owner, ShardMsg::Inspect { req, reply: tx })
            .await
            .is_err()
        {
            return Err(InspectError::Exiting);
        }
        rx.await.unwrap_or(Err(InspectError::Exiting))
    }

    pub async fn create_topic(&self, topic: &str) {
        let _ = self.admin(AdminOp::CreateTopic(topic.to_string())).await;
    }

    /// Makes a change of the node-wide settings on every shard (see [`nsq_shards::node`]):
    /// on shard 0, which owns them, at once; from another shard through shard 0. Returns
    /// once every shard has it.
    pub async fn change_node_settings(&self, update: NodeUpdate) {
        if self.shard.index() == 0 {
            return self.apply_node_settings_everywhere(update).await;
        }
        let Some(mesh) = self.mesh() else {
            self.shard.node.apply(&update);
            return;
        };
        let (tx, rx) = oneshot::channel();
        let msg = ShardMsg::NodeChange { update, reply: tx };
        if mesh.send_to(0, msg).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// On shard 0: applies `update` here (waking the lookup loop when the lookupd TCP
    /// addresses changed), then sends it to every other shard and waits until each has
    /// applied it. Changes reach every shard in the order shard 0 makes them.
    pub async fn apply_node_settings_everywhere(&self, update: NodeUpdate) {
        self.shard.node.apply(&update);
        if let NodeUpdate::LookupdTcpAddresses(_) = update {
            self.shard.lookup.wake().notify();
        }
        let Some(mesh) = self.mesh() else { return };
        let mut acks = Vec::new();
        for i in (0..self.shard.count()).filter(|&i| i != self.shard.index()) {
            let (tx, rx) = oneshot::channel();
            let msg = ShardMsg::NodeApply {
                update: update.clone(),
                reply: tx,
            };
            if mesh.send_to(i, msg).await.is_ok() {
                acks.push(rx);
            }
        }
        for rx in acks {
            let _ = rx.await;
        }
    }

    /// `GET /cluster` (docs/replication.md): this node's address, its peers and every
    /// replicated topic's group as its owning shard sees it; `None` when standalone.
    pub async fn cluster_state(&self) -> Option<serde_json::Value> {
        let c = self.cluster.as_ref()?;
        let mut topics = Vec::new();
        for i in 0..self.shard.count() {
            if i == self.shard.index() {
                topics.extend(c.state());
                continue;
            }
            let Some(mesh) = self.mesh() else { continue };
            let (tx, rx) = oneshot::channel();
            if mesh
                .send_to(i, ShardMsg::ClusterState { reply: tx })
                .await
                .is_ok()
            {
                if let Ok(s) = rx.await {
                    topics.extend(s);
                }
            }
        }
        topics.sort_by(|a, b| a["topic"].as_str().cmp(&b["topic"].as_str()));
        Some(serde_json::json!({
            "address": c.cfg.me.address,
            "node_id": c.cfg.node_id,
            "peers": c.cfg.peers.iter().map(|m| m.address.clone()).collect::<Vec<_>>(),
            "refused_peers": c.cfg.refusals.to_json(),
            "peers_listing_other_members": c.cfg.other_lists.to_json(),
            "replication_factor": c.cfg.factor,
            "replication_ack": format!("{:?}", c.cfg.ack).to_lowercase(),
            "rebalance_leaders": c.cfg.rebalance_leaders,
            "topics": topics,
        }))
    }

    /// `POST /topic/move-leader` on the topic's owner shard (here, or through the mesh):
    /// see [`crate::cluster::replica::ShardCluster::move_leader`].
    pub async fn move_leader(
        &self,
        topic: &str,
        to: &str,
    ) -> Result<(), crate::cluster::replica::MoveLeaderError> {
        use crate::cluster::replica::MoveLeaderError;
        let Some(c) = self.cluster.as_ref() else {
            return Err(MoveLeaderError::TopicNotFound);
        };
        let owner = owner_of(topic, self.shard.count());
        if owner == self.shard.index() {
            return c.move_leader(self, topic, to).await;
        }
        let Some(mesh) = self.mesh() else {
            return Err(MoveLeaderError::Exiting);
        };
        let (tx, rx) = oneshot::channel();
        let msg = ShardMsg::MoveLeader {
            topic: topic.to_string(),
            to: to.to_string(),
            reply: tx,
        };
        if mesh.send_to(owner, msg).await.is_err() {
            return Err(MoveLeaderError::Exiting);
        }
        rx.await.unwrap_or(Err(MoveLeaderError::Exiting))
    }

    /// Every shard's stats, in shard order.
    pub async fn gather_stats(&self, req: &StatsRequest) -> Vec<ShardStats> {
        let mut out = Vec::with_capacity(self.shard.count());
        for i in 0..self.shard.count() {
            if i == self.shard.index() {
                out.push(self.shard.stats(req));
                continue;
            }
            let Some(mesh) = self.mesh() else { continue };
            let (tx, rx) = oneshot::channel();
            let msg = ShardMsg::Stats {
                req: req.clone(),
                reply: tx,
            };
            if mesh.send_to(i, msg).await.is_ok() {
                if let Ok(s) = rx.await {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// Opens the descriptor a listener loop keeps in reserve for running out of them.
fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Out of descriptors (EMFILE: the process's limit; ENFILE: the system's).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// How long, out of descriptors, the loop waits for the connection the failed accept
/// left pending (it may have gone meanwhile).
const SHED_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Accepts connections on `listener` until the shard shuts down, running `serve` for each
/// on its own task (`what` names the listener in logs: "TCP", "HTTP").
///
/// Out of descriptors, it closes the connection it could not accept instead of leaving
/// it in the backlog (where its client hangs and every accept fails again at once): it
/// gives back a descriptor held in reserve (`/dev/null` opened), accepts the connection
/// with it, closes it and takes the reserve again (libev's and nginx's way). An accept
/// error is logged at once, then at most once a second while the same one repeats, with
/// the count ([`nsq_storage::repeat_log::RepeatLog`]).
pub async fn accept_until_shutdown<F, Fut>(
    server: Rc<Server>,
    listener: glommio::net::TcpListener,
    what: &'static str,
    serve: F,
) where
    F: Fn(Rc<Server>, glommio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    use futures::future::{select, Either};
    use futures::FutureExt;
    use std::pin::pin;
    let mut reserve = open_reserve();
    let errors = nsq_storage::repeat_log::RepeatLog::default();
    let mut last_error: Option<std::io::ErrorKind> = None;
    let mut last_errno: Option<i32> = None;
    loop {
        let accept = pin!(listener.accept());
        let stop = pin!(server.shard.shutdown.wait());
        match select(accept, stop).await {
            Either::Left((Ok(stream), _)) => {
                // An adapter, not an `async` block around the future: that would hold
                // the connection's state machine twice (rustc keeps the moved-in
                // future beside the awaited one), 12 KB more per idle connection.
                let conn =
                    serve(server.clone(), stream).map(|()| crate::memory::connection_closed());
                glommio::spawn_local(conn).detach();
            }
            Either::Left((Err(e), _)) => {
                let e = std::io::Error::from(e);
                let same = last_error == Some(e.kind()) && last_errno == e.raw_os_error();
                (last_error, last_errno) = (Some(e.kind()), e.raw_os_error());
                if out_of_descriptors(&e) && reserve.take().is_some() {
                    errors.error(
                        same,
                        format_args!(
                            "{what}: accept error - {e}; closing the connection (raise the \
                             open files limit: ulimit -n, systemd LimitNOFILE=)"
                        ),
                    );
                    let accept = pin!(listener.accept());
                    let wait = pin!(glommio::timer::sleep(SHED_WAIT));
                    if let Either::Left((Ok(stream), _)) = select(accept, wait).await {
                        drop(stream);
                    }
                    reserve = open_reserve();
                    if reserve.is_some() {
                        continue;
                    }
                } else {
                    errors.error(same, format_args!("{what}: accept error - {e}"));
                }
                // No reserve to shed with, or another error: back off briefly instead
                // of spinning.
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                if reserve.is_none() {
                    reserve = open_reserve();
                }
            }
            Either::Right(_) => break,
        }
    }
}
