//! A replica catching up on a backlog larger than a snapshot carries
//! (docs/replication.md, "Snapshots of any size").
//!
//! A snapshot carries a topic's unfinished records only up to
//! [`super::compaction::SNAPSHOT_MAX_BYTES`]; beyond that it names the leader's head and
//! channels without them. A replica that receives such a snapshot while its own topic
//! log ends below the leader's head does not restore it yet: it asks the member that
//! sent it for the records in pages ([`Frame::Fetch`], [`PAGE_BYTES`] of bodies each),
//! from its own head (or the snapshot's low watermark, when higher) to the snapshot's
//! head, and appends each page at the leader's sequences, as a snapshot's records are.
//! Then it restores the snapshot it held back, which now finds every sequence in the
//! log. Meanwhile it drops the group's appends and snapshots (the leader sends them
//! again) and takes its heartbeats, so that it stays a follower and starts no election.
//!
//! A catch-up that stops (the sender died or stopped leading, the store failed) keeps
//! the pages it appended; the next snapshot from a leader resumes from the log's head.
//! Pages go one at a time and each waits for the store to take the one before, so a
//! backlog of any size costs the replica a page of memory, not the backlog.

use super::compaction::{encode_state, parse_state};
use super::requests::Asked;
use super::{ShardCluster, TICK};
use crate::server::Server;
use nsq_replication::raft::eraftpb::Message as RaftMessage;
use nsq_replication::wire::{self, Reply};
use nsq_shards::mesh::AdminOp;
use nsq_shards::topic::{ReplicaRecord, ReplicaState};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The bytes of bodies one page carries (at least one record).
pub(super) const PAGE_BYTES: u32 = 4 << 20;

/// How long a page may take, and how long a sender may have nothing readable, before
/// the catch-up stops (the next snapshot resumes it).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

impl ShardCluster {
    /// Whether `topic`'s group drops the leader's appends and snapshots now: a
    /// catch-up in pages is under way.
    pub(super) fn catching_up(&self, topic: &str) -> bool {
        self.groups
            .borrow()
            .get(topic)
            .is_some_and(|g| g.catching_up)
    }

    /// A snapshot the leader sent (`message`): when it carries no records and names a
    /// head beyond this replica's topic log, starts a catch-up in pages and returns
    /// true (the snapshot is restored once the pages are in); otherwise false, and the
    /// snapshot is stepped as usual.
    pub(super) fn catch_up_first(
        self: &Rc<Self>,
        server: &Rc<Server>,
        topic: &str,
        message: &RaftMessage,
    ) -> bool {
        let Some(state) = parse_state(message.get_snapshot().get_data()) else {
            return false;
        };
        if state.records.is_some() || server.shard.topic_head(topic) >= state.head {
            return false;
        }
        // Only a snapshot of the current term from another member, on a replica that
        // does not lead (raft-rs ignores the others).
        match self.groups.borrow_mut().get_mut(topic) {
            Some(g)
                if !g.catching_up
                    && !g.deleted
                    && !g.stopped
                    && !g.group.is_leader()
                    && message.term >= g.group.term() =>
            {
                g.catching_up = true;
                g.paged_to = None;
            }
            _ => return false,
        }
        // The channels first: a channel made after the records would start past them.
        for (ch, _) in &state.channels {
            if !server.shard.has_channel(topic, ch) {
                let _ = server
                    .shard
                    .admin(AdminOp::CreateChannel(topic.to_string(), ch.clone()));
            }
        }
        let me = self.clone();
        let server = server.clone();
        let topic = topic.to_string();
        let snapshot = message.clone();
        glommio::spawn_local(async move {
            let done = me
                .catch_up(
                    &server,
                    &topic,
                    snapshot.from,
                    snapshot.term,
                    state.low,
                    state.head,
                )
                .await;
            if let Some(g) = me.groups.borrow_mut().get_mut(&topic) {
                g.catching_up = false;
                g.idle_ticks = 0;
                if done {
                    // What the snapshot's restore checks: this log reached its head
                    // through pages, although its newest message may be older than
                    // the leader's newest (finished there meanwhile).
                    g.paged_to = Some(state.head);
                    if let Err(e) = g.group.step(snapshot) {
                        log::debug!("TOPIC({topic}): the held-back snapshot was refused: {e}");
                    }
                }
            }
            me.mark(&topic);
        })
        .detach();
        true
    }

    /// Whether a catch-up of `topic` from member `from` goes on: the group is still
    /// here, catching up, neither deleted nor stopped, and `from` still leads it (a new
    /// leader sends its own snapshot, which resumes the catch-up).
    fn may_go_on(&self, topic: &str, from: u64, term: u64) -> Result<(), String> {
        let groups = self.groups.borrow();
        let Some(g) = groups.get(topic) else {
            return Err("the topic's group is gone".into());
        };
        if !g.catching_up || g.deleted || g.stopped {
            return Err("the topic was deleted or its replication stopped".into());
        }
        let now = g.group.term();
        if now > term || (now == term && g.group.leader().is_some_and(|l| l != from)) {
            return Err("the sender no longer leads the topic".into());
        }
        Ok(())
    }

    /// Fetches `topic`'s records from member `from` in pages, from this log's head (or
    /// `low`) until the log reaches `head`, and appends them. Returns whether it did.
    async fn catch_up(
        &self,
        server: &Server,
        topic: &str,
        from: u64,
        term: u64,
        low: u64,
        head: u64,
    ) -> bool {
        let at = self
            .cfg
            .member(from)
            .map_or_else(|| format!("{from:016x}"), |m| m.address.clone());
        let mut next = server.shard.topic_head(topic).max(low);
        log::info!(
            "TOPIC({topic}): the leader's snapshot names more unfinished messages than it carries (sequences {next} to {head}); fetching them from {at} in pages before restoring it"
        );
        let started = Instant::now();
        let (mut pages, mut records, mut bytes) = (0u64, 0usize, 0usize);
        let mut empty_since: Option<Instant> = None;
        let stop = |next: u64, why: &str| {
            log::warn!(
                "TOPIC({topic}): catching up in pages stopped at sequence {next} of {head}: {why}; the next snapshot a leader sends resumes it"
            );
            false
        };
        while next < head {
            if server.shard.shutdown.is_set() {
                return false;
            }
            let fetched = self.fetch(from, topic, next).await;
            // Checked again after the wait, with no await before the page is appended.
            if let Err(why) = self.may_go_on(topic, from, term) {
                return stop(next, &why);
            }
            let (mut page, page_next) = match fetched {
                Ok(p) => p,
                Err(why) => return stop(next, &why),
            };
            // A durable topic whose store could not be made would keep the backlog in
            // memory only.
            if server.shard.opts.data_path.is_some()
                && server.shard.topic_exists(topic)
                && server.shard.topic_durable_wait(topic).is_none()
            {
                return stop(
                    next,
                    "the topic's store is not open (see the store's error above)",
                );
            }
            // No further than the snapshot's head: the entries after the snapshot bring
            // the rest, at the place the log gives them.
            page.retain(|r| r.seq < head);
            let page_next = page_next.min(head);
            if page.is_empty() && page_next <= next {
                // Not flushed on the sender yet.
                let since = *empty_since.get_or_insert_with(Instant::now);
                if since.elapsed() > FETCH_TIMEOUT {
                    log::warn!(
                        "TOPIC({topic}): catching up in pages stopped at sequence {next} of {head}: {at} has had nothing readable there for {} s",
                        FETCH_TIMEOUT.as_secs()
                    );
                    return false;
                }
                glommio::timer::sleep(TICK).await;
                continue;
            }
            empty_since = None;
            pages += 1;
            records += page.len();
            bytes += page.iter().map(|r| r.body.len()).sum::<usize>();
            server.shard.restore_replica(
                topic,
                ReplicaState {
                    last_id: 0,
                    head: page_next,
                    low: next,
                    channels: Vec::new(),
                    records: Some(page),
                },
            );
            next = page_next.max(next + 1);
            // The next page once the store has taken this one.
            if let Some(w) = server.shard.topic_durable_wait(topic) {
                let taken = std::pin::pin!(w
                    .store
                    .wait_pending_below(nsq_shards::shard::STORE_PENDING_HIGH));
                let late = std::pin::pin!(glommio::timer::sleep(FETCH_TIMEOUT));
                if let futures::future::Either::Right(_) =
                    futures::future::select(taken, late).await
                {
                    return stop(next, "the store took no page for 10 s");
                }
            }
        }
        log::info!(
            "TOPIC({topic}): fetched {records} message(s) ({bytes} bytes of bodies) from {at} in {pages} page(s) in {:.1} s; restoring the snapshot",
            started.elapsed().as_secs_f64()
        );
        true
    }

    /// Asks member `to` for a page of `topic`'s records from sequence `from`: the
    /// records and the sequence the next page starts at.
    async fn fetch(
        &self,
        to: u64,
        topic: &str,
        from: u64,
    ) -> Result<(Vec<ReplicaRecord>, u64), String> {
        let asked = self
            .ask(
                to,
                |request| wire::encode_fetch(request, topic, from, PAGE_BYTES),
                Instant::now() + FETCH_TIMEOUT,
                || false,
            )
            .await
            .map_err(|e| e.to_string())?;
        let reply = match asked {
            Asked::Reply(r) => Some(r),
            Asked::Gone | Asked::Unanswered => None,
        };
        match reply {
            Some(Reply::Records(data)) => match parse_state(&data) {
                Some(ReplicaState {
                    head,
                    records: Some(records),
                    ..
                }) => Ok((records, head)),
                _ => Err("a page that does not decode".into()),
            },
            Some(Reply::Failed(why)) => Err(why),
            Some(_) => Err("an answer that is not a page".into()),
            None => Err("no answer".into()),
        }
    }

    /// Answers a peer's [`Frame::Fetch`](nsq_replication::wire::Frame::Fetch): a page
    /// of `topic`'s records from `from` ([`nsq_shards::shard::Shard::replica_page`]),
    /// encoded as a snapshot's state is (its head: where the next page starts).
    pub(super) async fn answer_fetch(
        &self,
        server: &Server,
        topic: &str,
        from: u64,
        max_bytes: u32,
    ) -> Reply {
        let gap = self
            .groups
            .borrow()
            .get(topic)
            .is_some_and(|g| g.gap != super::Gap::None);
        if gap {
            // Its log has a hole: the replica waits for another leader's snapshot.
            return Reply::Failed("this member misses messages of the topic".into());
        }
        let max = usize::try_from(max_bytes.min(PAGE_BYTES)).unwrap_or(1);
        match server.shard.replica_page(topic, from, max).await {
            Some((records, next)) => Reply::Records(encode_state(&ReplicaState {
                last_id: 0,
                head: next,
                low: from,
                channels: Vec::new(),
                records: Some(records),
            })),
            None => Reply::Failed(format!(
                "topic {topic} is not held here, or its store could not be read"
            )),
        }
    }
}
