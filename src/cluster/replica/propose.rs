//! Proposing to a topic's group: a publish or change proposed on the leader or
//! forwarded to it, a forwarded proposal answered, and the proposals whose
//! `--replication-ack` policy is met answered (docs/replication.md, "How it works").

use super::requests::Asked;
use super::*;

/// How long a replica that knows no leader waits before it forwards a proposal to the
/// other replicas: longer than an election (0.5 to 0.95 s).
const ASK_OTHERS_AFTER: Duration = Duration::from_secs(1);

impl ShardCluster {
    /// Publishes to replicated `topic` (this shard owns it): see the module docs.
    /// `wire`, when given, is the message part of the MPUB or PUB frame that `bodies`
    /// are slices of: the leader proposes it as the Raft entry's data, uncopied
    /// ([`nsq_replication::Entry::encode_raft`]).
    ///
    /// # Errors
    ///
    /// [`PublishError::Replication`] when the ack policy is not met within
    /// [`PROPOSE_TIMEOUT`]; the store's errors from the leader's apply.
    pub async fn publish(
        &self,
        server: &Server,
        topic: &str,
        bodies: Vec<Bytes>,
        wire: Option<Bytes>,
        defer_until: Option<Instant>,
    ) -> Result<(), PublishError> {
        if server.shard.shutdown.is_set() {
            return Err(PublishError::Exiting);
        }
        if crate::runtime::drain::applied(&server.shard) {
            return Err(PublishError::Draining);
        }
        let defer_ms = defer_until.map_or(0, |d| {
            u32::try_from(d.saturating_duration_since(Instant::now()).as_millis())
                .unwrap_or(u32::MAX)
        });
        let messages = bodies
            .into_iter()
            .map(|b| Message {
                id: [b'0'; 16],
                timestamp_ns: 0,
                attempts: 0,
                defer_ms,
                body: b,
            })
            .collect();
        self.propose(server, topic, Entry::Publish(messages), wire.as_ref())
            .await
            .map_err(|e| {
                // HTTP answers nsqd's 503 EXITING; the reason is here.
                log::warn!("TOPIC({topic}): publish refused: {e}");
                PublishError::Replication(e)
            })
    }

    /// Applies a channel or topic change of replicated `topic` through its group: every
    /// replica applies it at the same place in the log. Errors as [`ShardCluster::publish`].
    pub async fn change(&self, server: &Server, topic: &str, entry: Entry) -> Result<(), String> {
        self.propose(server, topic, entry, None).await
    }

    /// Proposes `entry` on the leader, here or through the network, until its ack
    /// policy is met or [`PROPOSE_TIMEOUT`] passes; `wire` as [`ShardCluster::publish`]
    /// takes it (used when this member leads).
    async fn propose(
        &self,
        server: &Server,
        topic: &str,
        entry: Entry,
        wire: Option<&Bytes>,
    ) -> Result<(), String> {
        let started = Instant::now();
        let deadline = started + PROPOSE_TIMEOUT;
        // Encoded for a forward only: the leader's own group encodes what it proposes.
        let mut encoded: Option<(Vec<u8>, Bytes)> = None;
        let replicas = self.cfg.replicas_of(topic);
        let mut target_turn = 0usize;
        let mut last_error = String::from("no leader elected in time");
        // A replica that hears of no leader for longer than an election takes asks the
        // other replicas of the placement: it may be a member the group has not taken
        // in yet (docs/replication.md, "Adding and removing members").
        let ask_others_at = Instant::now() + ASK_OTHERS_AFTER;
        let me = self.cfg.me.replica;
        while Instant::now() < deadline {
            let target = if self.ensure_group(server, topic) {
                match self.propose_here(server, topic, &entry, wire) {
                    Ok(rx) => return answer(rx, deadline).await,
                    Err(Some(leader)) => leader,
                    Err(None) if Instant::now() >= ask_others_at => {
                        // Only after a second without a leader: off the usual path.
                        let others: Vec<u64> =
                            replicas.iter().copied().filter(|&r| r != me).collect();
                        if others.is_empty() {
                            glommio::timer::sleep(TICK).await;
                            continue;
                        }
                        target_turn += 1;
                        others[target_turn % others.len()]
                    }
                    Err(None) => {
                        glommio::timer::sleep(leader_poll(started)).await;
                        continue;
                    }
                }
            } else {
                let hint = self.hints.borrow().get(topic).copied();
                hint.unwrap_or_else(|| replicas[target_turn % replicas.len()])
            };
            if !self.links.connected(target) {
                // A peer that is down is not waited on: the group elects another leader
                // within its election timeout, or the next replica is tried.
                self.hints.borrow_mut().remove(topic);
                target_turn += 1;
                last_error = format!(
                    "cluster member {} not connected (down, or refusing this member: see its log)",
                    self.cfg.member(target).map_or("?", |m| m.address.as_str())
                );
                glommio::timer::sleep(TICK).await;
                continue;
            }
            let (context, data) = encoded.get_or_insert_with(|| entry.encode_raft(wire));
            match self.forward(target, topic, context, data).await {
                Ok(Reply::Acked) => return Ok(()),
                Ok(Reply::NotLeader { leader }) => {
                    if leader != 0 {
                        self.hints.borrow_mut().insert(topic.to_string(), leader);
                    } else {
                        self.hints.borrow_mut().remove(topic);
                        glommio::timer::sleep(TICK).await;
                    }
                }
                Ok(Reply::Failed(e)) => return Err(e),
                Ok(Reply::Records(_)) => return Err("the leader answered with records".into()),
                Err(ForwardError::Unanswered(e)) => return Err(e),
                // The leader went away before answering (killed, restarted): the next
                // leader gets the batch. If the first had replicated it, it is stored
                // twice, as a producer's own retry would store it (at least once).
                Err(ForwardError::ConnectionLost) => {
                    last_error = "the leader's connection broke".into();
                    self.hints.borrow_mut().remove(topic);
                    glommio::timer::sleep(TICK).await;
                }
                Err(ForwardError::NotSent(e)) => {
                    last_error = e;
                    self.hints.borrow_mut().remove(topic);
                    target_turn += 1;
                    glommio::timer::sleep(TICK).await;
                }
            }
        }
        Err(last_error)
    }

    /// Proposes on this node's group: the receiver of the answer, or the leader to
    /// forward to (`Err(None)`: no leader known, an election was started or is under
    /// way, or this leader is handing the group over).
    fn propose_here(
        &self,
        server: &Server,
        topic: &str,
        entry: &Entry,
        wire: Option<&Bytes>,
    ) -> Result<oneshot::Receiver<Reply>, Option<u64>> {
        let head = server.shard.topic_head(topic);
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(topic) else {
            return Err(None);
        };
        if g.stopped {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send(Reply::Failed(
                "replication of the topic stopped on this member".into(),
            ));
            return Ok(rx);
        }
        if !g.group.is_leader() {
            return match g.group.leader() {
                Some(l) => Err(Some(l)),
                None => {
                    drop(groups);
                    self.campaign_if_leaderless(topic);
                    Err(None)
                }
            };
        }
        let entry = match entry {
            Entry::Publish(msgs) | Entry::PublishAt { messages: msgs, .. } => {
                let now = nsq_shards::message::now_unix_nanos();
                let base = match g.next_seq {
                    Some(next) => next,
                    None => g.seq_after_log(head),
                };
                Entry::PublishAt {
                    base,
                    messages: msgs
                        .iter()
                        .map(|m| Message {
                            id: g.ids.next_id().to_hex(),
                            timestamp_ns: u64::try_from(now).unwrap_or(0),
                            ..m.clone()
                        })
                        .collect(),
                }
            }
            other => other.clone(),
        };
        let (tx, rx) = oneshot::channel();
        match g.group.propose_wire(&entry, wire) {
            Ok(proposal) => {
                if let Entry::PublishAt { base, messages } = &entry {
                    g.next_seq = Some(base.saturating_add(messages.len() as u64));
                    g.published_since_positions += messages.len() as u64;
                    if g.published_since_positions >= self.positions_after(server) {
                        self.positions_due.borrow_mut().insert(topic.to_string());
                    }
                }
                g.waiters.push(Waiter {
                    proposal,
                    reply: tx,
                    durable: None,
                });
            }
            Err(ReplicationError::NotLeader { leader }) => return Err(leader),
            // Looked at again shortly, as when no leader is known: the member taking
            // over leads within a round trip, or the transfer is given up.
            Err(ReplicationError::HandingOver { .. }) => return Err(None),
            Err(e) => {
                let _ = tx.send(Reply::Failed(e.to_string()));
            }
        }
        drop(groups);
        self.mark(topic);
        Ok(rx)
    }

    /// Sends the entry (`context` and `data`, as `Entry::encode_raft` splits it) to
    /// replica `to` and waits for its reply.
    async fn forward(
        &self,
        to: u64,
        topic: &str,
        context: &[u8],
        data: &Bytes,
    ) -> Result<Reply, ForwardError> {
        if to == self.cfg.me.replica {
            return Err(ForwardError::NotSent(
                "this node does not hold the topic".into(),
            ));
        }
        // The leader answers within PROPOSE_TIMEOUT; wait that long and a little more
        // while the connection to it stays up. The group electing another leader
        // (this member holds a replica and heard from it) means `to` will not answer.
        let asked = self
            .ask(
                to,
                |request| wire::encode_propose(request, topic, context, data),
                Instant::now() + FORWARD_TIMEOUT,
                || self.leader_of(topic).is_some_and(|l| l != to),
            )
            .await
            .map_err(|e| ForwardError::NotSent(e.to_string()))?;
        let at = self.cfg.member(to).map_or("?", |m| m.address.as_str());
        match asked {
            Asked::Reply(reply) => Ok(reply),
            Asked::Gone => Err(ForwardError::ConnectionLost),
            Asked::Unanswered => Err(ForwardError::Unanswered(format!(
                "the leader {at} did not answer; the messages may or may not have been published"
            ))),
        }
    }

    /// Proposes an entry another member forwarded (split as `Entry::encode_raft`
    /// splits it): a batch's data, a slice of the frame it came in, is proposed as it
    /// is.
    pub(super) async fn answer_propose(
        &self,
        server: &Server,
        topic: &str,
        context: &[u8],
        data: &Bytes,
    ) -> Reply {
        let entry = match Entry::decode_raft(context, data) {
            Ok(e) => e,
            Err(e) => return Reply::Failed(format!("bad entry: {e}")),
        };
        if !self.ensure_group(server, topic) {
            return Reply::NotLeader { leader: 0 };
        }
        let wire = (!context.is_empty()).then_some(data);
        match self.propose_here(server, topic, &entry, wire) {
            Ok(rx) => match answer(rx, Instant::now() + PROPOSE_TIMEOUT).await {
                Ok(()) => Reply::Acked,
                Err(e) => Reply::Failed(e),
            },
            Err(leader) => Reply::NotLeader {
                leader: leader.unwrap_or(0),
            },
        }
    }

    /// Answers the proposals whose ack policy is met, lost or no longer knowable.
    pub(super) fn resolve(&self, topic: &str, mut durable: Vec<(u64, DurableWait)>) {
        let mut groups = self.groups.borrow_mut();
        let Some(g) = groups.get_mut(topic) else {
            return;
        };
        let policy = self.cfg.ack;
        let waiters = std::mem::take(&mut g.waiters);
        for mut w in waiters {
            if let Some(pos) = durable.iter().position(|(i, _)| *i == w.proposal.index) {
                w.durable = Some(durable.swap_remove(pos).1);
            }
            match g.group.ack_state(w.proposal, policy) {
                AckState::Pending => g.waiters.push(w),
                AckState::Acked => {
                    // `leader`: answered before the commit; the apply comes later.
                    match w.durable.take() {
                        None => {
                            let _ = w.reply.send(Reply::Acked);
                        }
                        Some(d) => {
                            glommio::spawn_local(async move {
                                let r = match crate::owner::wait_durable(Some(d)).await {
                                    Ok(()) => Reply::Acked,
                                    Err(e) => Reply::Failed(e.to_string()),
                                };
                                let _ = w.reply.send(r);
                            })
                            .detach();
                        }
                    }
                }
                AckState::Lost => {
                    let _ = w
                        .reply
                        .send(Reply::Failed("replaced by another leader's entry".into()));
                }
                AckState::Unknown => {
                    let _ = w.reply.send(Reply::Failed(
                        "leadership lost before the replicas confirmed".into(),
                    ));
                }
            }
        }
        if policy == AckPolicy::Leader {
            // Durable waits of batches answered before their commit are not awaited.
            durable.clear();
        }
    }
}

/// How long a request that waits for a leader sleeps before it looks again: 5 ms for
/// the first [`TICK`] x 2 (an election this member started, a new topic's first,
/// usually ends within a few ms), a [`TICK`] after that.
pub(super) fn leader_poll(started: Instant) -> std::time::Duration {
    if started.elapsed() < 2 * TICK {
        std::time::Duration::from_millis(5)
    } else {
        TICK
    }
}

async fn answer(rx: oneshot::Receiver<Reply>, deadline: Instant) -> Result<(), String> {
    let timeout = glommio::timer::sleep(deadline.saturating_duration_since(Instant::now()));
    match futures::future::select(rx, std::pin::pin!(timeout)).await {
        futures::future::Either::Left((Ok(Reply::Acked), _)) => Ok(()),
        futures::future::Either::Left((Ok(Reply::Failed(e)), _)) => Err(e),
        futures::future::Either::Left((Ok(Reply::NotLeader { .. }), _)) => {
            Err("leadership lost".into())
        }
        futures::future::Either::Left((Ok(Reply::Records(_)), _)) => {
            Err("an answer that is not an acknowledgement".into())
        }
        futures::future::Either::Left((Err(_), _)) => Err("replication group gone".into()),
        futures::future::Either::Right(_) => Err("replicas did not confirm in time".into()),
    }
}

/// Why a forwarded proposal got no reply.
enum ForwardError {
    /// It was not sent (safe to send elsewhere).
    NotSent(String),
    /// It was sent and no answer came while the leader stayed connected (the leader
    /// may have applied it).
    Unanswered(String),
    /// It was sent and the connection to the leader broke before the answer.
    ConnectionLost,
}
