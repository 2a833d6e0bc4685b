//! The shard-to-shard channel mesh: one bounded glommio shared channel for each ordered
//! pair of shards, so shard `i` sends to shard `j` on a channel only the two of them use.
//!
//! Why not glommio's `MeshBuilder`: its join connects a shard's channels one peer after
//! the other, each connect waiting for that peer to reach the same point of its own
//! loop, so the start-up is a chain of n x n cross-thread hand-shakes. With more shards
//! than cores each step waits for a thread to be scheduled: on 2 cores 16 shards took
//! 3.1 s to start, 32 took 12 s, 48 took 22 s and 64 did not finish within two
//! minutes. Here every channel is made up front on the main thread ([`build`]) and each
//! shard connects all of its ends at once ([`Peer::connect`]), once every shard's thread
//! has reached that point: glommio keeps an executor with a connect pending from going
//! to sleep (it re-polls the connect and, before each sleep it then skips, issues a
//! process-wide `membarrier`), so shards connecting early would spin, interrupting every
//! CPU, while the main thread still starts the rest. The mesh is joined as soon as the
//! last shard has started.

use crate::server::Server;
use crate::tcp::{self, HandOff};
use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::join_all;
use futures::FutureExt;
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use glommio::GlommioError;
use nsq_shards::mesh::{AdminError, AdminOp};
use nsq_shards::shard::inspect::{InspectAnswer, InspectError, InspectRequest};
use nsq_shards::stats::{ShardStats, StatsRequest};
use nsq_shards::topic::PublishError;
use std::io::{Error, ErrorKind};
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// A request one shard sends another over the mesh. Each variant that expects an answer
/// carries a oneshot sender; nothing else crosses threads. Defined here, not in the
/// shards crate, because a hand-off carries the connection's TLS session
/// ([`crate::tcp::TlsSession`], rustls) and the shards crate does not depend on rustls.
pub enum ShardMsg {
    /// Publish to a topic this shard owns; answered once the messages are in the log.
    Publish {
        topic: String,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        /// Answered once synced, whatever the sync policy (dead letters).
        synced: bool,
        reply: oneshot::Sender<Result<(), PublishError>>,
    },
    /// A connection moving to this shard (see [`crate::tcp::HandOff`]).
    HandOff(Box<HandOff>),
    Stats {
        req: StatsRequest,
        reply: oneshot::Sender<ShardStats>,
    },
    Admin {
        op: AdminOp,
        reply: oneshot::Sender<Result<(), AdminError>>,
    },
    /// `GET /message` or `GET /messages` for a topic this shard owns; answered on a task
    /// of its own (it may read the disk).
    Inspect {
        req: InspectRequest,
        reply: oneshot::Sender<Result<InspectAnswer, InspectError>>,
    },
    /// A frame from cluster peer `from` (replica id) for this shard: a Raft message or
    /// a proposal for a topic it owns, or the reply to a proposal it forwarded.
    Cluster {
        from: u64,
        frame: nsq_replication::wire::Frame,
    },
    /// Where cluster peer `replica`'s clients connect (from its greeting to shard 0).
    PeerTcp { replica: u64, tcp: String },
    /// `POST /topic/move-leader` for a topic this shard owns; answered on a task of its
    /// own once `to` leads it (or it failed).
    MoveLeader {
        topic: String,
        to: String,
        reply: oneshot::Sender<Result<(), crate::cluster::replica::MoveLeaderError>>,
    },
    /// `GET /cluster`: this shard's replicated topics.
    ClusterState {
        reply: oneshot::Sender<Vec<serde_json::Value>>,
    },
    /// Registration changes for shard 0, which owns the nsqlookupd connections.
    Lookup(Vec<nsq_shards::shard::LookupEvent>),
    /// To shard 0, which owns the node-wide settings: make this change on every shard;
    /// answered once every shard has it (see [`nsq_shards::node`]).
    NodeChange {
        update: nsq_shards::node::NodeUpdate,
        reply: oneshot::Sender<()>,
    },
    /// From shard 0: apply this change to this shard's copy of the node-wide settings;
    /// answered once applied.
    NodeApply {
        update: nsq_shards::node::NodeUpdate,
        reply: oneshot::Sender<()>,
    },
}

/// One shard's ends of the mesh before its executor connects them (they are `Send`: they
/// travel from the main thread to the shard's thread).
pub struct Peer {
    index: usize,
    /// `senders[j]`: the channel to shard `j` (`None` for this shard itself).
    senders: Vec<Option<SharedSender<ShardMsg>>>,
    /// `receivers[j]`: the channel from shard `j` (`None` for this shard itself).
    receivers: Vec<Option<SharedReceiver<ShardMsg>>>,
    /// Every shard's thread waits here before connecting.
    start: Arc<Barrier>,
}

/// The `n` shards' ends of a full mesh whose channels hold `capacity` messages each
/// (allocated now: n x (n - 1) channels).
pub fn build(n: usize, capacity: usize) -> Vec<Peer> {
    let start = Arc::new(Barrier::new(n));
    let mut peers: Vec<Peer> = (0..n)
        .map(|index| Peer {
            index,
            senders: (0..n).map(|_| None).collect(),
            receivers: (0..n).map(|_| None).collect(),
            start: start.clone(),
        })
        .collect();
    for from in 0..n {
        for to in 0..n {
            if from != to {
                let (tx, rx) = shared_channel::new_bounded(capacity);
                peers[from].senders[to] = Some(tx);
                peers[to].receivers[from] = Some(rx);
            }
        }
    }
    peers
}

impl Peer {
    /// Connects every end on the calling shard's executor, all at once; returns when
    /// every peer has connected its side of each channel (or dropped it). The receivers
    /// come with the index of the shard that sends on each.
    ///
    /// Blocks the calling thread until every shard has called this (the shard serves
    /// nothing before its mesh is joined); a shard whose executor never starts keeps the
    /// others waiting, so the caller must give up on the start (the main thread learns
    /// of it and exits).
    pub async fn connect(self) -> (Senders, Vec<(usize, ConnectedReceiver<ShardMsg>)>) {
        self.start.wait();
        let senders = join_all(
            self.senders
                .into_iter()
                .map(|s| async move { Some(s?.connect().await) }),
        );
        let receivers = join_all(
            self.receivers
                .into_iter()
                .enumerate()
                .map(|(j, r)| async move { Some((j, r?.connect().await)) }),
        );
        let (senders, receivers) = futures::join!(senders, receivers);
        (
            Senders {
                index: self.index,
                senders,
            },
            receivers.into_iter().flatten().collect(),
        )
    }
}

/// A shard's connected sending ends, one per other shard.
pub struct Senders {
    index: usize,
    senders: Vec<Option<ConnectedSender<ShardMsg>>>,
}

impl Senders {
    /// The index of the shard these ends belong to.
    pub fn peer_id(&self) -> usize {
        self.index
    }

    /// Sends `msg` to shard `to`, waiting while its channel is full. Errors: the
    /// receiving shard has gone (the channel is closed), or `to` is this shard or no
    /// shard (`InvalidInput`); the message comes back in the error where glommio
    /// returns it.
    pub async fn send_to(&self, to: usize, msg: ShardMsg) -> Result<(), GlommioError<ShardMsg>> {
        match self.senders.get(to) {
            Some(Some(tx)) => tx.send(msg).await,
            _ => Err(GlommioError::IoError(Error::new(
                ErrorKind::InvalidInput,
                format!("shard {to} is not another shard of the mesh"),
            ))),
        }
    }
}

/// Handles a message another shard sent this one over the mesh (each shard runs one
/// receiver task per peer, started once every shard has recovered).
pub(crate) fn handle_mesh(server: &Rc<Server>, msg: ShardMsg) {
    let shard = &server.shard;
    match msg {
        ShardMsg::Publish {
            topic,
            bodies,
            defer_until,
            synced,
            reply,
        } => {
            shard.count_cross_received();
            if server.replicates(&topic) {
                let s = server.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(
                        s.publish_replicated(&topic, bodies, None, defer_until)
                            .await,
                    );
                })
                .detach();
                return;
            }
            match crate::owner::Publish::start(shard, &topic, bodies, defer_until, synced) {
                crate::owner::Publish::Done(r) => {
                    let _ = reply.send(r);
                }
                step => {
                    let s = server.clone();
                    glommio::spawn_local(async move {
                        let _ = reply.send(step.finish(&s.shard).await);
                    })
                    .detach();
                }
            }
        }
        ShardMsg::HandOff(h) => {
            // An adapter, not an `async` block (which would hold the connection's
            // future twice); its end counts towards this shard's heap trim.
            let conn = tcp::resume(server.clone(), *h).map(|()| crate::memory::connection_closed());
            glommio::spawn_local(conn).detach();
        }
        ShardMsg::Stats { req, reply } => {
            let _ = reply.send(shard.stats(&req));
        }
        ShardMsg::Admin { op, reply } if server.replicates(op.topic()) => {
            let s = server.clone();
            glommio::spawn_local(async move {
                let r = match crate::cluster::replica::admin(&s, &op).await {
                    Some(r) => r,
                    None => {
                        crate::owner::Admin::start(&s.shard, op)
                            .finish(&s.shard)
                            .await
                    }
                };
                let _ = reply.send(r);
            })
            .detach();
        }
        ShardMsg::Admin { op, reply } => match crate::owner::Admin::start(shard, op) {
            crate::owner::Admin::Done(r) => {
                let _ = reply.send(r);
            }
            step => {
                let s = server.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(step.finish(&s.shard).await);
                })
                .detach();
            }
        },
        ShardMsg::Inspect { req, reply } => {
            let s = server.clone();
            glommio::spawn_local(async move {
                let _ = reply.send(s.shard.inspect(req).await);
            })
            .detach();
        }
        ShardMsg::Lookup(events) => {
            shard.lookup.extend(events);
        }
        ShardMsg::PeerTcp { replica, tcp } => {
            if let Some(c) = &server.cluster {
                c.set_peer_tcp(replica, tcp);
            }
        }
        ShardMsg::MoveLeader { topic, to, reply } => {
            let s = server.clone();
            glommio::spawn_local(async move {
                let r = match &s.cluster {
                    Some(c) => c.move_leader(&s, &topic, &to).await,
                    None => Err(crate::cluster::replica::MoveLeaderError::TopicNotFound),
                };
                let _ = reply.send(r);
            })
            .detach();
        }
        ShardMsg::ClusterState { reply } => {
            let state = server
                .cluster
                .as_ref()
                .map(|c| c.state())
                .unwrap_or_default();
            let _ = reply.send(state);
        }
        ShardMsg::Cluster { from, frame } => {
            if let Some(c) = &server.cluster {
                c.handle(server, from, frame);
            }
        }
        ShardMsg::NodeChange { update, reply } => {
            // It waits for every shard: not on the mesh receiver's task.
            let s = server.clone();
            glommio::spawn_local(async move {
                s.apply_node_settings_everywhere(update).await;
                let _ = reply.send(());
            })
            .detach();
        }
        ShardMsg::NodeApply { update, reply } => {
            shard.node.apply(&update);
            let _ = reply.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use glommio::{LocalExecutorBuilder, Placement};

    /// More shards than cores join at once and every pair can talk both ways.
    #[test]
    fn every_pair_of_shards_talks_both_ways() {
        let n = 12;
        let peers = build(n, 4);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let handles: Vec<_> = peers
            .into_iter()
            .map(|p| {
                let done = done_tx.clone();
                LocalExecutorBuilder::new(Placement::Unbound)
                    .spawn(move || async move {
                        let me = p.index;
                        let (tx, rx) = p.connect().await;
                        assert_eq!(tx.peer_id(), me);
                        assert_eq!(rx.len(), n - 1);
                        assert!(tx.send_to(me, ShardMsg::Lookup(Vec::new())).await.is_err());
                        assert!(tx.send_to(n, ShardMsg::Lookup(Vec::new())).await.is_err());
                        for j in (0..n).filter(|&j| j != me) {
                            tx.send_to(j, ShardMsg::Lookup(Vec::new())).await.unwrap();
                        }
                        let mut from = Vec::new();
                        for (j, r) in rx {
                            assert!(matches!(r.recv().await, Some(ShardMsg::Lookup(_))));
                            from.push(j);
                        }
                        from.sort_unstable();
                        let want: Vec<usize> = (0..n).filter(|&j| j != me).collect();
                        assert_eq!(from, want);
                        done.send(me).unwrap();
                    })
                    .unwrap()
            })
            .collect();
        drop(done_tx);
        let mut got: Vec<usize> = done_rx.iter().collect();
        got.sort_unstable();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        for h in handles {
            h.join().unwrap();
        }
    }
}
