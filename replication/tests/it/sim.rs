//! An in-process simulated network of replication groups: N drivers, a message queue
//! between them, and faults (links cut in either direction, random drops, crashes).
//! Everything is driven by `tick`: no threads, no sleeps, no wall clock; the only
//! randomness is a seeded generator, so each run is the same.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use nsq_replication::{
    AckPolicy, AckState, Entry, GroupConfig, Leadership, MemLog, Membership, Output, ProposalId,
    RaftMessage, ReplicationError, TopicGroup,
};
use raft::eraftpb::MessageType;
use raft::Storage;

/// Ticks before a follower campaigns (raft's election timeout in the tests).
pub const ELECTION_TICK: usize = 10;

/// Ticks between a leader's heartbeats, which also tell the followers the commit index
/// when no append follows a commit.
pub const HEARTBEAT_TICK: usize = 2;

/// The longest election timeout of any node in a 5-node sim (see `Sim::config`).
pub const MAX_TIMEOUT: usize = ELECTION_TICK + 3 * 4 + 1;

/// One simulated broker: its group (`None` while crashed) and the state its topic would
/// have: the entries applied, by index.
pub struct Node {
    pub group: Option<TopicGroup>,
    /// The store a crashed node left behind (what a durable store keeps on disk).
    pub disk: Option<MemLog>,
    /// index -> (term, entry) of every entry applied, as a topic would hold them.
    pub applied: BTreeMap<u64, (u64, Entry)>,
    pub leaderships: Vec<Leadership>,
    /// Snapshots this node restored from.
    pub restores: usize,
    /// The voters after the last membership change it applied.
    pub voters: Option<Vec<u64>>,
    /// The learners after the last membership change it applied.
    pub learners: Option<Vec<u64>>,
    /// The requests of `confirm_leadership` a majority answered, in order.
    pub confirmed: Vec<u64>,
}

impl Node {
    fn apply(&mut self, out: &mut Output) {
        if let Some(restore) = out.restore.take() {
            self.applied = decode_state(&restore.data);
            self.restores += 1;
        }
        for c in out.committed.drain(..) {
            let last = self.applied.keys().next_back().copied().unwrap_or(0);
            assert!(c.index > last, "entry {} applied after {}", c.index, last);
            let entry = c.entry.expect("committed entry decodes");
            self.applied.insert(c.index, (c.term, entry));
        }
        if let Some(l) = out.leadership.take() {
            self.leaderships.push(l);
        }
        if let Some(v) = out.voters.take() {
            self.voters = Some(v);
        }
        if let Some(l) = out.learners.take() {
            self.learners = Some(l);
        }
        self.confirmed.append(&mut out.confirmed);
    }

    pub fn group(&self) -> &TopicGroup {
        self.group.as_ref().expect("node is up")
    }

    pub fn group_mut(&mut self) -> &mut TopicGroup {
        self.group.as_mut().expect("node is up")
    }
}

/// The simulated cluster.
pub struct Sim {
    pub nodes: BTreeMap<u64, Node>,
    /// The initial voters (every replica's log starts from them).
    voters: Vec<u64>,
    queue: VecDeque<RaftMessage>,
    /// Directed links (from, to) whose messages are dropped.
    cut: BTreeSet<(u64, u64)>,
    /// Chance that any one message is dropped, in thousandths.
    pub drop_per_mille: u32,
    rng: fastrand::Rng,
    pub ticks: u64,
}

impl Sim {
    /// `n` nodes with ids 1..=n, all up with empty logs.
    pub fn new(n: u64, seed: u64) -> Self {
        let voters: Vec<u64> = (1..=n).collect();
        let mut sim = Self {
            nodes: BTreeMap::new(),
            voters,
            queue: VecDeque::new(),
            cut: BTreeSet::new(),
            drop_per_mille: 0,
            rng: fastrand::Rng::with_seed(seed),
            ticks: 0,
        };
        for id in 1..=n {
            sim.start_empty(id);
        }
        sim
    }

    /// Starts replica `id` with an empty log and no topic state.
    fn start_empty(&mut self, id: u64) {
        let voters = self.voters.clone();
        self.start_joining(id, &voters);
    }

    /// Starts replica `id` with an empty log whose initial voters are `voters`, which
    /// may differ from the group's (a member that joins the cluster later computes its
    /// own placement): it must learn the group's real membership from the leader.
    pub fn start_joining(&mut self, id: u64, voters: &[u64]) {
        let group = TopicGroup::new(&self.config(id), MemLog::new(voters)).expect("valid config");
        self.nodes.insert(
            id,
            Node {
                group: Some(group),
                disk: None,
                applied: BTreeMap::new(),
                leaderships: Vec::new(),
                restores: 0,
                voters: None,
                learners: None,
                confirmed: Vec::new(),
            },
        );
    }

    /// Each node's election timeout is fixed and different (10, 13, 16, ... ticks):
    /// raft-rs would otherwise draw it from an unseeded generator, and the tests must
    /// replay the same way every run. Different timeouts also keep elections from
    /// splitting forever.
    fn config(&self, id: u64) -> GroupConfig {
        let mut config = GroupConfig::new(id);
        config.election_tick = ELECTION_TICK;
        config.heartbeat_tick = HEARTBEAT_TICK;
        config.min_election_tick = ELECTION_TICK + 3 * usize::try_from(id - 1).unwrap();
        config.max_election_tick = config.min_election_tick + 1;
        // Small appends, so catching up takes several rounds.
        config.max_size_per_msg = 4096;
        config.max_inflight_msgs = 8;
        config
    }

    /// The replicas in the sim (up or crashed).
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[&id]
    }

    pub fn group(&mut self, id: u64) -> &mut TopicGroup {
        self.nodes.get_mut(&id).unwrap().group_mut()
    }

    /// Polls every up node and delivers messages until nothing moves (a bounded number
    /// of rounds: Raft settles within a few round trips once ticks stop).
    pub fn settle(&mut self) {
        for _ in 0..1000 {
            for id in self.ids() {
                self.poll(id);
            }
            if self.queue.is_empty() {
                return;
            }
            while let Some(m) = self.queue.pop_front() {
                self.deliver(m);
            }
        }
        panic!("the network never settled");
    }

    /// Polls one node, applies what it committed, queues its messages.
    pub fn poll(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        let Some(group) = node.group.as_mut() else {
            return;
        };
        let mut out = group.poll().expect("poll");
        node.apply(&mut out);
        self.queue.extend(out.messages);
        self.queue.extend(out.persisted_messages);
        if out.snapshot_wanted {
            self.compact(id);
        }
    }

    /// Delivers one message now (dropped if its link is cut or its node is down).
    pub fn deliver_now(&mut self, m: RaftMessage) {
        self.deliver(m);
    }

    fn deliver(&mut self, m: RaftMessage) {
        let (from, to) = (m.from, m.to);
        let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
        let dropped = self.cut.contains(&(from, to))
            || self.nodes.get(&to).is_none_or(|n| n.group.is_none())
            || (self.drop_per_mille > 0 && self.rng.u32(0..1000) < self.drop_per_mille);
        if !dropped {
            // A response from a node outside the group or a stale message is refused by
            // raft-rs; a transport would drop it the same way.
            let _ = self.group(to).step(m);
        }
        if snapshot {
            if let Some(sender) = self.nodes.get_mut(&from).and_then(|n| n.group.as_mut()) {
                sender.report_snapshot(to, !dropped);
            }
        }
    }

    /// One tick on every up node, then the network settles.
    pub fn tick(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(g) = node.group.as_mut() {
                g.tick();
            }
        }
        self.ticks += 1;
        self.settle();
    }

    pub fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            self.tick();
        }
    }

    /// The leader of the highest term among the up nodes, if any.
    pub fn leader(&self) -> Option<u64> {
        self.nodes
            .iter()
            .filter_map(|(&id, n)| n.group.as_ref().map(|g| (id, g)))
            .filter(|(_, g)| g.is_leader())
            .max_by_key(|(_, g)| g.term())
            .map(|(id, _)| id)
    }

    /// Ticks until a leader (other than `not`) is elected; returns it and the ticks taken.
    pub fn await_leader(&mut self, not: Option<u64>, max_ticks: usize) -> (u64, usize) {
        for t in 0..=max_ticks {
            if let Some(l) = self.leader().filter(|&l| Some(l) != not) {
                return (l, t);
            }
            self.tick();
        }
        panic!("no leader after {max_ticks} ticks");
    }

    pub fn propose(&mut self, id: u64, entry: &Entry) -> Result<ProposalId, ReplicationError> {
        self.group(id).propose(entry)
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&mut self, id: u64) {
        for other in self.ids() {
            if other != id {
                self.cut.insert((id, other));
                self.cut.insert((other, id));
            }
        }
    }

    /// Cuts both directions between `a` and `b`.
    pub fn cut_link(&mut self, a: u64, b: u64) {
        self.cut.insert((a, b));
        self.cut.insert((b, a));
    }

    /// Splits the nodes into `side` and the rest.
    pub fn partition(&mut self, side: &[u64]) {
        for &a in side {
            for b in self.ids() {
                if !side.contains(&b) {
                    self.cut_link(a, b);
                }
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Stops a node; its store stays (as on disk).
    pub fn crash(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        if let Some(group) = node.group.take() {
            node.disk = Some(group.into_store());
        }
    }

    /// Starts a crashed node on the store it left, with the topic state it can rebuild:
    /// its latest snapshot, then the committed entries raft-rs hands out again.
    pub fn restart(&mut self, id: u64) {
        let config = self.config(id);
        let node = self.nodes.get_mut(&id).unwrap();
        let disk = node.disk.take().expect("crashed node has a store");
        node.applied = match disk.snapshot(0, id) {
            Ok(snap) => decode_state(snap.get_data()),
            Err(_) => BTreeMap::new(),
        };
        node.group = Some(TopicGroup::new(&config, disk).expect("restart"));
    }

    /// Drops node `id`'s group and makes it again with a log that starts after the last
    /// entry it applied, with its term and vote (what a member does with a deleted
    /// topic's quiet group: it leaves memory and comes back when the topic is named).
    pub fn remake_from_applied(&mut self, id: u64) {
        let config = self.config(id);
        let g = self.group(id);
        let (term, index) = g.applied_position().expect("applied position");
        let conf = raft::eraftpb::ConfState {
            voters: g.voters(),
            learners: g.learners(),
            ..Default::default()
        };
        let mut meta = raft::eraftpb::SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(conf);
        let log = MemLog::from_base(&meta, g.term(), g.vote());
        self.nodes.get_mut(&id).unwrap().group =
            Some(TopicGroup::new(&config, log).expect("remake"));
    }

    /// Replaces replica `old`, whose disk is lost, by a new empty replica `new` (the
    /// same machine under a new replica id): the leader removes `old`, then adds `new`,
    /// each change committed before the next.
    pub fn replace_empty(&mut self, old: u64, new: u64) {
        self.nodes.remove(&old);
        self.start_empty(new);
        for change in [Membership::Remove(old), Membership::Add(new)] {
            let (leader, _) = self.await_leader(None, 4 * MAX_TIMEOUT);
            let p = self
                .group(leader)
                .propose_membership(change)
                .expect("change");
            for _ in 0..MAX_TIMEOUT {
                self.tick();
                if self.node(leader).group().ack_state(p, AckPolicy::Quorum) == AckState::Acked {
                    break;
                }
            }
            let voters = self.node(leader).voters.clone().expect("change applied");
            assert_eq!(voters.contains(&new), change == Membership::Add(new));
            assert!(!voters.contains(&old));
        }
    }

    /// Proposes `change` on the leader and runs until the leader applied it; returns the
    /// leader's voters and learners after it.
    pub fn change_membership(&mut self, change: Membership) -> (Vec<u64>, Vec<u64>) {
        let (leader, _) = self.await_leader(None, 4 * MAX_TIMEOUT);
        self.group(leader)
            .propose_membership(change)
            .expect("change proposed");
        for _ in 0..MAX_TIMEOUT {
            self.tick();
            if !self.node(leader).group().membership_pending() {
                break;
            }
        }
        let g = self.node(leader).group();
        assert!(!g.membership_pending(), "{change:?} applied on the leader");
        (g.voters(), g.learners())
    }

    /// Snapshots node `id`'s topic state at its applied index and compacts its log.
    pub fn compact(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        let data = encode_state(&node.applied);
        let group = node.group_mut();
        let applied = group.applied_index();
        group.compact(applied, data).expect("compact");
    }

    /// The entries node `id` applied, in order.
    pub fn applied(&self, id: u64) -> Vec<Entry> {
        self.nodes[&id]
            .applied
            .values()
            .map(|(_, e)| e.clone())
            .collect()
    }

    pub fn rng(&mut self) -> &mut fastrand::Rng {
        &mut self.rng
    }
}

/// The test topic's state as snapshot data: (index u64, term u64, len u32, entry) each.
fn encode_state(applied: &BTreeMap<u64, (u64, Entry)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, (term, entry)) in applied {
        let bytes = entry.encode();
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&term.to_le_bytes());
        out.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn decode_state(mut data: &[u8]) -> BTreeMap<u64, (u64, Entry)> {
    let mut applied = BTreeMap::new();
    while !data.is_empty() {
        let index = u64::from_le_bytes(data[..8].try_into().unwrap());
        let term = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let len = u32::from_le_bytes(data[16..20].try_into().unwrap()) as usize;
        let entry = Entry::decode(&data[20..20 + len]).unwrap();
        applied.insert(index, (term, entry));
        data = &data[20 + len..];
    }
    applied
}

/// A publish of one message whose body is `tag` (unique per test entry).
pub fn publish(tag: u64) -> Entry {
    Entry::Publish(vec![nsq_replication::Message {
        id: *format!("{tag:016x}").as_bytes().first_chunk().unwrap(),
        timestamp_ns: tag,
        attempts: 0,
        defer_ms: 0,
        body: format!("message {tag}").into_bytes().into(),
    }])
}
