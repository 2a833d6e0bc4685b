//! [`TopicGroup`]: one topic's Raft group, driven synchronously by the shard that owns
//! the topic.
//!
//! The driver owns a raft-rs [`RawNode`] and its [`LogStore`]; it has no threads, no
//! timers, no locks and no I/O of its own. The caller (a shard's task, or a test's
//! simulated network) does four things:
//!
//! - [`TopicGroup::tick`] at a fixed period (the election and heartbeat timeouts are
//!   counted in ticks);
//! - [`TopicGroup::step`] each Raft message received from a peer;
//! - [`TopicGroup::propose`] an [`Entry`] on the leader (a publish batch, a channel
//!   operation);
//! - [`TopicGroup::poll`] after any of these: it persists what raft-rs asks to persist and
//!   returns the messages to send to peers, a snapshot to restore, the entries committed
//!   since the last poll (in index order, to apply to the topic) and a leadership change.
//!
//! [`TopicGroup::ack_state`] tells, for a proposal, whether the policy that the PUB asked
//! for ([`AckPolicy`]) is met, computed from raft-rs's own log and progress tracker.

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, Entry as RaftEntry, EntryType,
    Message as RaftMessage, Snapshot,
};
use raft::{Config, RawNode, StateRole};

use crate::entry::{DecodeError, Entry};

/// A set of replica ids, with the hasher raft-rs's quorum checks take
/// ([`TopicGroup::has_quorum`]).
pub type ReplicaSet = std::collections::HashSet<u64, fxhash::FxBuildHasher>;
use crate::store::LogStore;
#[cfg(doc)]
use crate::store::MemLog;

/// How a group is set up: this node's id, the voters, and raft-rs's timing and flow
/// limits. Ticks are the unit of time: the broker ticks every group on a fixed period.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// This node's replica id in the group (nonzero). The voters are not here: they
    /// come from the [`LogStore`] (initially [`MemLog::new`]'s, then membership changes).
    /// A replica that lost its log must come back under a new id (see
    /// [`Membership`]).
    pub id: u64,
    /// Ticks without hearing from a leader before a follower campaigns (raft's
    /// election timeout; a follower waits a random count in
    /// `[min_election_tick, max_election_tick)`).
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats (must be below `election_tick`).
    pub heartbeat_tick: usize,
    /// The lower bound of the randomised election timeout (0: `election_tick`).
    pub min_election_tick: usize,
    /// The upper bound, exclusive (0: `2 * election_tick`).
    pub max_election_tick: usize,
    /// The last index the application has already applied (after a restart with a
    /// durable store and state); raft-rs hands out only entries after it.
    pub applied: u64,
    /// Largest total entry size, in bytes, of one append message.
    pub max_size_per_msg: u64,
    /// Most append messages in flight to one follower before waiting for its answer.
    pub max_inflight_msgs: usize,
}

impl GroupConfig {
    /// Replica `id`'s settings: election after 10 to 19 ticks, heartbeats every 2,
    /// appends of up to 1 MiB, 256 in flight per follower.
    #[must_use]
    pub fn new(id: u64) -> Self {
        Self {
            id,
            election_tick: 10,
            heartbeat_tick: 2,
            min_election_tick: 0,
            max_election_tick: 0,
            applied: 0,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
        }
    }

    fn raft_config(&self) -> Config {
        Config {
            id: self.id,
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            min_election_tick: self.min_election_tick,
            max_election_tick: self.max_election_tick,
            applied: self.applied,
            max_size_per_msg: self.max_size_per_msg,
            max_inflight_msgs: self.max_inflight_msgs,
            // Pre-vote: a node coming back from a partition asks before it raises its
            // term, so it does not depose a healthy leader. Check-quorum: a leader that
            // hears from no majority for an election timeout steps down, so an isolated
            // leader stops accepting proposals it cannot commit.
            pre_vote: true,
            check_quorum: true,
            // A commit is not announced to the followers by an append of its own: it
            // goes with the next append, or with the next heartbeat (every
            // `heartbeat_tick`) when no append follows. Under load this halves the
            // appends a leader sends and the answers it reads; a follower learns of a
            // commit at most a heartbeat later when the load stops. Nothing waits on a
            // follower's commit index but `settled` (a group goes quiet only once every
            // replica knows the commit), and a new leader commits what it holds with
            // its first entry.
            skip_bcast_commit: true,
            ..Config::default()
        }
    }
}

/// When a PUB is answered OK (`--replication-ack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckPolicy {
    /// Once a majority of the voters have the entry in their logs: Raft's commit. Any
    /// minority of the replicas (one of 3, two of 5) can be lost without losing it.
    Quorum,
    /// Once the entry is committed and every replica of the group has it in its log
    /// (each one's match index in the leader's progress tracker, learners included).
    /// Waits for the slowest replica.
    All,
    /// Once the leader has appended it to its own log; the message is lost if the leader
    /// is lost before a majority has it.
    Leader,
}

impl std::str::FromStr for AckPolicy {
    type Err = String;

    /// Parses the flag's value: `quorum`, `all` or `leader`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quorum" => Ok(Self::Quorum),
            "all" => Ok(Self::All),
            "leader" => Ok(Self::Leader),
            other => Err(format!(
                "replication-ack {other:?}: expected quorum, all or leader"
            )),
        }
    }
}

/// A change of the group's voters: one replica added or removed per change (Raft's
/// single-server membership change; raft-rs allows one pending at a time).
///
/// A replica whose log was lost (a replaced disk) must not rejoin under its old id:
/// Raft assumes a replica never forgets what it acknowledged, and raft-rs panics when
/// a leader's commit index runs past a follower's log. It is removed and a fresh replica
/// with a new id is added; that one catches up from the log or a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Adds a voter.
    Add(u64),
    /// Removes a voter or a learner.
    Remove(u64),
    /// Adds a learner: it receives the log (or a snapshot) but does not vote or count
    /// towards a commit; [`Membership::Add`] of a learner makes it a voter (raft-rs's
    /// `AddLearnerNode`, then `AddNode`). A replica that joins a group with a backlog
    /// catches up this way without weakening the group's quorum meanwhile.
    AddLearner(u64),
}

/// A proposal's place in the log: the leader's term when it proposed and the index the
/// entry got. The entry is the proposal's as long as the log holds `term` at `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProposalId {
    /// The proposing leader's term.
    pub term: u64,
    /// The entry's log index.
    pub index: u64,
}

/// Where a proposal stands for one [`AckPolicy`] ([`TopicGroup::ack_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckState {
    /// Not yet: ask again after the next poll.
    Pending,
    /// The policy is met: answer the PUB OK.
    Acked,
    /// The entry was replaced by another leader's: it will never be applied anywhere
    /// (answer E_PUB_FAILED; the producer may retry).
    Lost,
    /// This node cannot tell any more: it lost leadership before `All` was seen, or the
    /// index was compacted away before it was asked. The entry may or may not be applied.
    Unknown,
}

/// A committed entry to apply to the topic, in index order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// The Raft index.
    pub index: u64,
    /// The term of the leader that proposed it.
    pub term: u64,
    /// The entry; an error if its bytes do not decode (a corrupt log or a newer
    /// version's entry: the broker stops applying the group rather than skip it).
    pub entry: Result<Entry, DecodeError>,
}

/// A snapshot received from the leader: the application replaces the topic's state with
/// `data` (made by the leader's [`TopicGroup::compact`]) before applying later entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restore {
    /// The last index the snapshot covers.
    pub index: u64,
    /// That index's term.
    pub term: u64,
    /// The application's state as of `index`.
    pub data: Vec<u8>,
}

/// Who leads the group now, as this node last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The leader's node id; `None` during an election.
    pub leader: Option<u64>,
    /// The term.
    pub term: u64,
    /// Whether the leader is this node (it must register the topic with nsqlookupd and
    /// take PUBs; a follower forwards them).
    pub is_self: bool,
}

/// What one [`TopicGroup::poll`] returns. Apply `restore` first, then `committed` in
/// order; send `messages` to their `to` node in any order (Raft tolerates loss,
/// duplication and reordering).
#[derive(Debug, Default)]
pub struct Output {
    /// Raft messages for peers (each names its `to`) that may go before the store's
    /// writes of this poll are durable: a leader's appends and heartbeats (Raft lets a
    /// leader write its log in parallel with its followers).
    pub messages: Vec<RaftMessage>,
    /// Raft messages that promise what this poll wrote (a follower's acknowledgements,
    /// votes and vote requests): sent only once the store's writes are durable.
    pub persisted_messages: Vec<RaftMessage>,
    /// A snapshot to restore before `committed`.
    pub restore: Option<Restore>,
    /// Entries committed since the last poll, in index order.
    pub committed: Vec<Committed>,
    /// Set when the leader or the term changed since the last poll.
    pub leadership: Option<Leadership>,
    /// The voters after a membership change committed or a snapshot restored in this
    /// poll (a replica in neither this nor [`Output::learners`] was removed: the broker
    /// stops its group).
    pub voters: Option<Vec<u64>>,
    /// The learners, set with [`Output::voters`].
    pub learners: Option<Vec<u64>>,
    /// The requests of [`TopicGroup::confirm_leadership`] that a majority answered in
    /// this leader's term since the last poll, by the number each was asked with.
    pub confirmed: Vec<u64>,
    /// A lagging replica needs a snapshot the store cannot give: make one with
    /// [`TopicGroup::compact`] at the applied index (raft-rs retries on a later
    /// heartbeat).
    pub snapshot_wanted: bool,
}

/// Why a call into the group failed.
#[derive(Debug)]
pub enum ReplicationError {
    /// A proposal on a node that is not the leader; `leader` is where to forward it.
    NotLeader {
        /// The current leader, if known.
        leader: Option<u64>,
    },
    /// A proposal on a leader that is handing its leadership to `to` (raft-rs drops
    /// proposals until the transfer ends: `to` leads, or the transfer is given up after
    /// an election timeout); propose again then.
    HandingOver {
        /// The member taking over.
        to: u64,
    },
    /// A message addressed to another node.
    WrongRecipient {
        /// The message's `to`.
        to: u64,
    },
    /// raft-rs refused (a bad config, a dropped proposal, a storage error).
    Raft(raft::Error),
}

impl std::fmt::Display for ReplicationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotLeader { leader: Some(l) } => write!(f, "not the leader; node {l} is"),
            Self::NotLeader { leader: None } => write!(f, "not the leader; no leader now"),
            Self::HandingOver { to } => write!(f, "handing the leadership to node {to}"),
            Self::WrongRecipient { to } => write!(f, "message for node {to}"),
            // Some of raft-rs's own texts start with "raft: " already.
            Self::Raft(e) => {
                let text = e.to_string();
                write!(f, "raft: {}", text.strip_prefix("raft: ").unwrap_or(&text))
            }
        }
    }
}

impl std::error::Error for ReplicationError {}

impl From<raft::Error> for ReplicationError {
    fn from(e: raft::Error) -> Self {
        Self::Raft(e)
    }
}

/// One topic's Raft group on this node. `S` is where Raft's log is kept
/// ([`crate::MemLog`] by default). See the [module docs](self) for the calling
/// protocol.
pub struct TopicGroup<S: LogStore = crate::store::MemLog> {
    node: RawNode<S>,
    /// (leader id, term) as last reported by `poll`.
    reported: (u64, u64),
    /// (term, index): a candidate whose log ends before it gets no vote or pre-vote
    /// from this node ([`TopicGroup::set_vote_floor`]).
    vote_floor: (u64, u64),
    /// This node started with no saved state ([`TopicGroup::set_fresh`]); its vote
    /// rules apply while its Raft log is empty.
    fresh: bool,
    /// Ticks in a row without a known leader while this node's Raft log is empty and it
    /// has a vote floor or no saved state ([`TopicGroup::tick`]): after
    /// [`FLOOR_RELAX_TICKS`] and [`FLOOR_DROP_TICKS`] its vote rules give way, so that a
    /// group whose members restarted or lost their disks elects a leader again.
    leaderless_ticks: u32,
    /// A peer's message showed that the group has entries (a last index, a log term or
    /// a commit index above 0): a candidate with an empty log then lacks some.
    saw_entries: bool,
    /// Ticks since the group started here.
    age_ticks: u32,
    /// [`TopicGroup::set_fresh_grace`].
    fresh_grace: u32,
    /// Batches proposed with the producer's frame as their data ([`TopicGroup::propose_wire`]).
    uncopied: u64,
}

/// Ticks a node that restarted with a vote floor and has not heard of a leader keeps
/// the whole floor (100 ticks: 5 s at the broker's 50 ms tick, several election
/// timeouts). After them it also votes for a candidate whose log has entries, though
/// they end before the floor: a member that kept its log (it did not restart) when
/// none reaches the floor, so the group does not stay without a leader.
pub const FLOOR_RELAX_TICKS: u32 = 100;

/// Ticks after which such a node drops its vote floor (200: 10 s at 50 ms): every
/// member restarted, every Raft log is empty and none can reach another's floor; the
/// group elects one of them, and what was acknowledged after the floors of the
/// members that elect it may be lost (docs/replication.md, "Guarantees").
pub const FLOOR_DROP_TICKS: u32 = 200;

/// What [`TopicGroup::tick`] reports when a restarted node's vote floor gives way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorRelaxed {
    /// After [`FLOOR_RELAX_TICKS`]: candidates whose log has entries get votes.
    ForKeptLogs,
    /// After [`FLOOR_RELAX_TICKS`] on a node that started without saved state
    /// ([`TopicGroup::set_fresh`]): candidates whose log has entries get votes.
    FreshVotes,
    /// After [`FLOOR_DROP_TICKS`]: the floor is dropped.
    Dropped,
}

impl<S: LogStore> TopicGroup<S> {
    /// Starts the group on `store` (empty for a new group, or what a durable store
    /// recovered: raft-rs reads its hard state and entries).
    ///
    /// # Errors
    ///
    /// [`ReplicationError::Raft`] if raft-rs refuses the config (id 0, heartbeat not
    /// below the election timeout, ...) or the store's initial state.
    pub fn new(config: &GroupConfig, store: S) -> Result<Self, ReplicationError> {
        let raft_config = config.raft_config();
        raft_config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&raft_config, store, &logger)?;
        Ok(Self {
            node,
            reported: (0, 0),
            vote_floor: (0, 0),
            fresh: false,
            leaderless_ticks: 0,
            saw_entries: false,
            age_ticks: 0,
            fresh_grace: 0,
            uncopied: 0,
        })
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.node.raft.id
    }

    /// The current term.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The leader as this node knows it (`None` during an election).
    #[must_use]
    pub fn leader(&self) -> Option<u64> {
        Some(self.node.raft.leader_id).filter(|&l| l != 0)
    }

    /// The node this one voted for in the current term (0: none).
    #[must_use]
    pub fn vote(&self) -> u64 {
        self.node.raft.vote
    }

    /// This node's Raft role: `"follower"`, `"pre_candidate"` (asking whether it could
    /// win before raising its term: pre-vote), `"candidate"` or `"leader"`.
    #[must_use]
    pub fn role(&self) -> &'static str {
        match self.node.raft.state {
            StateRole::Follower => "follower",
            StateRole::PreCandidate => "pre_candidate",
            StateRole::Candidate => "candidate",
            StateRole::Leader => "leader",
        }
    }

    /// Whether this node is asking for votes (pre-vote or vote) now.
    #[must_use]
    pub fn campaigning(&self) -> bool {
        matches!(
            self.node.raft.state,
            StateRole::PreCandidate | StateRole::Candidate
        )
    }

    /// Whether this node gave its vote in the current term to another node: an election
    /// of this term is under way or won (a leadership transfer's, too), and the winner
    /// makes itself known with its first append. A campaign started meanwhile by a
    /// member that has not heard from it yet would depose it.
    #[must_use]
    pub fn voted_for_another(&self) -> bool {
        let raft = &self.node.raft;
        raft.vote != raft::INVALID_ID && raft.vote != raft.id
    }

    /// Whether this node leads the group.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// True on a leader that has applied an entry of its own term, and so every entry
    /// of the leaders before it (Raft commits them with the empty entry a new leader
    /// appends).
    #[must_use]
    pub fn applied_own_term(&self) -> bool {
        self.is_leader()
            && self
                .node
                .raft
                .raft_log
                .term(self.applied_index())
                .is_ok_and(|t| t == self.term())
    }

    /// The highest index known committed.
    #[must_use]
    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The log's last index.
    #[must_use]
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }

    /// The group's log store.
    #[must_use]
    pub fn store(&self) -> &S {
        self.node.store()
    }

    /// The store, to change what it records beside the log (such as
    /// [`crate::JournaledLog::start_over`]); its log must stay as it is.
    pub fn store_mut(&mut self) -> &mut S {
        self.node.mut_store()
    }

    /// Stops the group and hands back its store (what a durable store would still have
    /// on disk after the process stopped).
    #[must_use]
    pub fn into_store(self) -> S {
        self.node.raft.r.raft_log.store
    }

    /// Advances the group's clock by one tick (elections, heartbeats, check-quorum).
    /// Returns how a restarted node's vote floor gave way at this tick, if it did
    /// ([`FLOOR_RELAX_TICKS`], [`FLOOR_DROP_TICKS`]), for the caller to log.
    pub fn tick(&mut self) -> Option<FloorRelaxed> {
        self.node.tick();
        self.age_ticks = self.age_ticks.saturating_add(1);
        let log = &self.node.raft.raft_log;
        let last = (log.last_term(), log.last_index());
        // The floor still decides votes while this log ends before it; the rules of a
        // node without saved state while its log is empty.
        let floor = self.vote_floor != (0, 0) && last < self.vote_floor;
        let fresh = self.fresh && last.1 == 0;
        // A leader known (even one whose old heartbeat just arrived), or nothing to
        // give way: the count starts again.
        if self.node.raft.leader_id != raft::INVALID_ID || !(floor || fresh) {
            self.leaderless_ticks = 0;
            return None;
        }
        self.leaderless_ticks = self.leaderless_ticks.saturating_add(1);
        match self.leaderless_ticks {
            FLOOR_RELAX_TICKS if fresh => Some(FloorRelaxed::FreshVotes),
            FLOOR_RELAX_TICKS => Some(FloorRelaxed::ForKeptLogs),
            FLOOR_DROP_TICKS if floor => {
                // Dropped for good: a leader elected now that dies before this node
                // caught up does not bring the floor back.
                self.vote_floor = (0, 0);
                Some(FloorRelaxed::Dropped)
            }
            _ => None,
        }
    }

    /// On a follower whose leader is known to be gone (its connection closed, or it
    /// fell silent): the election timeout runs out within `ticks` ticks (at least 1)
    /// instead of after the rest of the randomised timeout, and past the lease, so the
    /// other followers, which see the same, grant this node's pre-vote instead of
    /// refusing it for that leader. Callers give the followers different `ticks` so
    /// that one campaigns first. Only when the election comes sooner: a no-op on a
    /// leader or candidate, on a follower that knows no leader, and where less is left.
    /// Timing only: what a vote needs is unchanged, and a leader that is in fact alive
    /// keeps the other followers, which refuse the pre-vote for its lease.
    pub fn expedite_election(&mut self, ticks: usize) {
        let raft = &mut self.node.raft;
        if raft.state != StateRole::Follower || raft.leader_id == raft::INVALID_ID {
            return;
        }
        let timeout = raft.randomized_election_timeout();
        let at = timeout
            .saturating_sub(ticks.max(1))
            .max(raft.election_timeout());
        if raft.election_elapsed < at {
            raft.election_elapsed = at;
        }
    }

    /// Whether raft-rs has something for [`TopicGroup::poll`] (messages to send, entries
    /// to persist or apply, a state change): after a tick, a follower of a quiet group
    /// usually has nothing.
    #[must_use]
    pub fn has_ready(&self) -> bool {
        self.node.has_ready()
    }

    /// Whether the vote floor gives way for a candidate whose log ends at `last_index`
    /// (a restarted node that has heard of no leader for a while: [`FLOOR_RELAX_TICKS`]).
    fn floor_waived(&self, last_index: u64) -> bool {
        self.leaderless_ticks >= FLOOR_RELAX_TICKS && last_index > 0
    }

    /// A node without saved state that started (its process) less than `ticks` ago
    /// votes for no candidate with an empty log until its group is `ticks` old: the
    /// members that kept the group's entries speak within that time (a leader's
    /// heartbeat, a candidate's request), and two replicas that lost their disks must
    /// not elect each other first. 0 (the default): no wait.
    pub fn set_fresh_grace(&mut self, ticks: u32) {
        self.fresh_grace = ticks;
    }

    /// Hands a Raft message from a peer to the group.
    ///
    /// # Errors
    ///
    /// [`ReplicationError::WrongRecipient`] for a message to another node;
    /// [`ReplicationError::Raft`] for a message raft-rs refuses (a local message type, a
    /// response from a node outside the group).
    pub fn step(&mut self, message: RaftMessage) -> Result<(), ReplicationError> {
        if message.to != self.id() {
            return Err(ReplicationError::WrongRecipient { to: message.to });
        }
        let mut message = message;
        // Raft's vote rule compares the candidate's log with this node's; a node that
        // restarted with an empty log compares it with what it held before, so that it
        // never helps elect a candidate that lacks entries it had acknowledged.
        use raft::eraftpb::MessageType;
        // An append after an entry this log does not hold must be refused; raft-rs
        // reads the missing entry's term as 0, so an append that names term 0 there
        // would pass its check and commit past this log's end (a panic). Any other term
        // makes it the refusal it is.
        if message.get_msg_type() == MessageType::MsgAppend
            && message.index > self.node.raft.raft_log.last_index()
            && message.log_term == 0
        {
            message.log_term = u64::MAX;
        }
        if message.index > 0 || message.log_term > 0 || message.commit > 0 {
            self.saw_entries = true;
        }
        let vote = matches!(
            message.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        );
        if vote
            && (message.log_term, message.index) < self.vote_floor
            && !self.floor_waived(message.index)
        {
            return Ok(());
        }
        // A candidate that is not a voter of this node's configuration gets no vote: a
        // member that joins the cluster starts the group from its own placement, which
        // may name voters the group never had, and could otherwise be elected by the
        // votes of members whose configuration it is not in (two configurations, two
        // leaders). Refusing a vote never breaks Raft's safety; a voter added by a
        // change this node has not applied yet gets its vote once it has.
        if vote && !self.node.raft.prs().conf().voters().contains(message.from) {
            return Ok(());
        }
        // A node with no saved state that is asked to elect a candidate of a group with
        // entries may be a replica whose disk was lost: what it acknowledged before is
        // unknown, so it waits until a leader has given it entries (a group with no
        // entries yet, a new topic, elects as usual). Once it knows the group has entries it never
        // helps elect a candidate with an empty log (two wiped replicas would otherwise
        // elect each other beside the one that holds everything); after
        // FLOOR_RELAX_TICKS without a leader it votes for a candidate with entries.
        if vote && self.fresh && self.node.raft.raft_log.last_index() == 0 {
            let has_entries = message.index > 0;
            let waived = has_entries && self.leaderless_ticks >= FLOOR_RELAX_TICKS;
            let early = !has_entries && self.age_ticks < self.fresh_grace;
            if ((has_entries || self.saw_entries) && !waived) || early {
                return Ok(());
            }
        }
        // A vote request for a later term from a member that is not this node: on the
        // leader, the member knows no leader (it restarted, or made the group again
        // after dropping it), and a heartbeat now tells it (a quiet group's leader
        // sends none for seconds); on a follower of that very member, the member no
        // longer leads (a leader never asks for votes), so its lease ends here and the
        // request is judged on the logs alone. Neither changes what a vote needs.
        if vote && message.term > self.term() && message.from != self.id() {
            if self.is_leader() {
                self.heartbeat();
            } else if self.leader() == Some(message.from) {
                let term = self.term();
                self.node.raft.become_follower(term, raft::INVALID_ID);
            }
        }
        // A heartbeat carries the commit index the leader believes this replica has
        // matched; after a restart with an empty log that is past this log's end, and
        // raft-rs would panic on it. The Raft rule is to commit no further than the
        // last entry held, which this clamp restores; the leader then finds the
        // replica's real end by its rejected appends and sends what is missing.
        if message.get_msg_type() == raft::eraftpb::MessageType::MsgHeartbeat {
            let last = self.node.raft.raft_log.last_index();
            if message.commit > last {
                message.commit = last;
            }
        }
        self.node.step(message)?;
        Ok(())
    }

    /// After a restart that emptied this node's log: candidates whose last entry is
    /// before `(term, index)` (what this node had applied, [`TopicGroup::applied_position`])
    /// get no vote or pre-vote from it, as its log would have refused them.
    pub fn set_vote_floor(&mut self, term: u64, index: u64) {
        self.vote_floor = (term, index);
    }

    /// On the leader: replica `id` connected again, perhaps after a restart that
    /// emptied its log. What it acknowledged before no longer counts towards a commit
    /// or an ack policy until it acknowledges again (its match index goes back to 0;
    /// the next append is sent from the end of the log, and a replica that lacks the
    /// entries before refuses it and is brought up to date). A no-op elsewhere.
    pub fn peer_reconnected(&mut self, id: u64) {
        if !self.is_leader() || id == self.id() {
            return;
        }
        let next = self.node.raft.raft_log.last_index() + 1;
        if let Some(pr) = self.node.raft.mut_prs().get_mut(id) {
            pr.matched = 0;
            pr.become_probe();
            pr.next_idx = next;
        }
    }

    /// This node starts with no saved state (a new replica, or one whose disk was
    /// lost): until a leader has given its Raft log entries, it votes for no candidate of
    /// a group that has entries (it cannot know which of them it had acknowledged), and
    /// once it knows the group has entries, for no candidate with an empty log either,
    /// and sends no vote requests of its own. After [`FLOOR_RELAX_TICKS`] in a row
    /// without a leader it votes for a candidate with entries (the replicas that lost
    /// their disks elect one that kept its log).
    pub fn set_fresh(&mut self, fresh: bool) {
        self.fresh = fresh;
    }

    /// (term, index) of the last entry this node applied (`None` when its term is no
    /// longer known): what a restart keeps as its vote floor.
    #[must_use]
    pub fn applied_position(&self) -> Option<(u64, u64)> {
        let index = self.applied_index();
        let term = self.node.raft.raft_log.term(index).ok()?;
        (term > 0 || index == 0).then_some((term, index))
    }

    /// Starts an election now instead of after the election timeout (a replica that
    /// created the group on a publish, so that the first publish waits for one round
    /// trip rather than a timeout). A no-op on the leader.
    ///
    /// # Errors
    ///
    /// [`ReplicationError::Raft`] if raft-rs refuses (this node is not a voter).
    pub fn campaign(&mut self) -> Result<(), ReplicationError> {
        if self.is_leader() {
            return Ok(());
        }
        self.node.campaign()?;
        Ok(())
    }

    /// Asks the leader to hand leadership to `to` (raft-rs's leadership transfer: once
    /// `to` has the whole log it campaigns at once, and the leader refuses proposals
    /// meanwhile). A follower passes the request to the leader it knows; a candidate
    /// drops it.
    pub fn transfer_leader(&mut self, to: u64) {
        self.node.transfer_leader(to);
    }

    /// On the leader: asks a majority of the voters whether this node still leads
    /// (raft-rs's read index, `ReadOnlyOption::Safe`): a heartbeat carrying `request`
    /// goes to every replica, and once a majority answered it in this term a later
    /// [`poll`](Self::poll) lists `request` in [`Output::confirmed`]. A replica that
    /// follows another leader answers with its higher term instead, and this node steps
    /// down. Nothing comes back when this node does not lead, or has not yet committed an
    /// entry of its term (raft-rs drops the request): ask again with another number.
    /// Answers to heartbeats sent before the call carry other numbers, so a confirmation
    /// says the majority followed this node after the call.
    pub fn confirm_leadership(&mut self, request: u64) {
        if self.is_leader() {
            self.node.read_index(request.to_le_bytes().to_vec());
        }
    }

    /// Whether the replicas in `reachable` make a quorum of the group's voters (both
    /// halves of a joint configuration while one is under way): what a leader needs in
    /// touch to deliver (src/cluster/replica/lease.rs).
    #[must_use]
    pub fn has_quorum(&self, reachable: &ReplicaSet) -> bool {
        self.node.raft.prs().has_quorum(reachable)
    }

    /// True on a leader while a leadership transfer it started runs (raft-rs's
    /// `lead_transferee`): it ends when the transferee leads, or after an election
    /// timeout without that.
    #[must_use]
    pub fn transferring(&self) -> bool {
        self.node.raft.lead_transferee.is_some()
    }

    /// The voters of the group's current configuration.
    #[must_use]
    pub fn voters(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.node.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    /// The highest log index known to be on `replica` (the leader's progress tracker;
    /// `None` on a follower or for a non-member): the leader's last index minus this is
    /// the replica's replication lag in entries.
    #[must_use]
    pub fn matched(&self, replica: u64) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        self.node.raft.prs().get(replica).map(|p| p.matched)
    }

    /// Proposes `entry` on the leader: it is appended to the leader's log (in memory until
    /// the next [`poll`](Self::poll) persists it) and replicated from there.
    ///
    /// # Errors
    ///
    /// [`ReplicationError::NotLeader`] on a follower or candidate (forward the PUB to
    /// `leader`); [`ReplicationError::HandingOver`] during a leadership transfer;
    /// [`ReplicationError::Raft`] if raft-rs drops it otherwise.
    pub fn propose(&mut self, entry: &Entry) -> Result<ProposalId, ReplicationError> {
        self.propose_wire(entry, None)
    }

    /// [`propose`](Self::propose) of a batch whose bodies came in `wire` (the message
    /// part of their MPUB or PUB frame): the Raft entry's data is `wire` itself, not a
    /// copy, when it holds exactly the bodies ([`Entry::encode_raft`]).
    ///
    /// # Errors
    ///
    /// As [`propose`](Self::propose).
    pub fn propose_wire(
        &mut self,
        entry: &Entry,
        wire: Option<&bytes::Bytes>,
    ) -> Result<ProposalId, ReplicationError> {
        if !self.is_leader() {
            return Err(ReplicationError::NotLeader {
                leader: self.leader(),
            });
        }
        if let Some(to) = self.node.raft.lead_transferee {
            return Err(ReplicationError::HandingOver { to });
        }
        let before = self.last_index();
        let (context, data) = entry.encode_raft(wire);
        if wire.is_some_and(|w| w.as_ptr() == data.as_ptr() && w.len() == data.len()) {
            self.uncopied += 1;
        }
        // raft-rs's `RawNode::propose` with the data as it is (it takes a Vec).
        let proposal = RaftEntry {
            data,
            context: context.into(),
            ..RaftEntry::default()
        };
        let mut m = raft::eraftpb::Message::default();
        m.set_msg_type(raft::eraftpb::MessageType::MsgPropose);
        m.from = self.node.raft.id;
        m.set_entries(vec![proposal].into());
        self.node.raft.step(m)?;
        let index = self.last_index();
        if index == before {
            return Err(ReplicationError::Raft(raft::Error::ProposalDropped));
        }
        Ok(ProposalId {
            term: self.term(),
            index,
        })
    }

    /// Batches this node proposed as leader with the bytes they came in as their data,
    /// uncopied ([`TopicGroup::propose_wire`]), since the group started here.
    #[must_use]
    pub fn uncopied_proposals(&self) -> u64 {
        self.uncopied
    }

    /// Proposes a membership change on the leader; it takes effect on each replica when
    /// committed ([`Output::voters`]).
    ///
    /// # Errors
    ///
    /// [`ReplicationError::NotLeader`] on a follower; [`ReplicationError::Raft`] with
    /// `ProposalDropped` while an earlier change is not yet applied.
    pub fn propose_membership(
        &mut self,
        change: Membership,
    ) -> Result<ProposalId, ReplicationError> {
        if !self.is_leader() {
            return Err(ReplicationError::NotLeader {
                leader: self.leader(),
            });
        }
        let mut cc = ConfChange::default();
        match change {
            Membership::Add(id) => {
                cc.set_change_type(ConfChangeType::AddNode);
                cc.node_id = id;
            }
            Membership::Remove(id) => {
                cc.set_change_type(ConfChangeType::RemoveNode);
                cc.node_id = id;
            }
            Membership::AddLearner(id) => {
                cc.set_change_type(ConfChangeType::AddLearnerNode);
                cc.node_id = id;
            }
        }
        let before = self.last_index();
        self.node.propose_conf_change(Vec::new(), cc)?;
        let index = self.last_index();
        // raft-rs turns a change proposed while another is pending into an empty entry.
        if index == before || self.node.raft.pending_conf_index != index {
            return Err(ReplicationError::Raft(raft::Error::ProposalDropped));
        }
        Ok(ProposalId {
            term: self.term(),
            index,
        })
    }

    /// Whether `proposal` (from [`propose`](Self::propose) on this node) meets `policy`.
    /// Computed from this node's log and, for [`AckPolicy::All`], the leader's progress
    /// tracker; cheap enough to ask for every waiting PUB after each poll.
    #[must_use]
    pub fn ack_state(&self, proposal: ProposalId, policy: AckPolicy) -> AckState {
        let log = &self.node.raft.raft_log;
        // The log was cut below the index (a new leader's shorter suffix): by Raft's log
        // matching no later log can hold this proposal there.
        if proposal.index > log.last_index() {
            return AckState::Lost;
        }
        if proposal.index + 1 < log.first_index() {
            return AckState::Unknown;
        }
        match log.term(proposal.index) {
            Ok(term) if term == proposal.term => {}
            // Another leader's entry at that index: this proposal is gone for good.
            Ok(_) => return AckState::Lost,
            Err(_) => return AckState::Unknown,
        }
        let committed = log.committed >= proposal.index;
        match policy {
            AckPolicy::Leader if log.persisted >= proposal.index => AckState::Acked,
            AckPolicy::Quorum if committed => AckState::Acked,
            AckPolicy::All if committed && self.is_leader() => {
                let everyone = self
                    .node
                    .raft
                    .prs()
                    .iter()
                    .all(|(_, progress)| progress.matched >= proposal.index);
                if everyone {
                    AckState::Acked
                } else {
                    AckState::Pending
                }
            }
            AckPolicy::All if !self.is_leader() => AckState::Unknown,
            _ => AckState::Pending,
        }
    }

    /// Persists what raft-rs produced since the last poll and returns what the caller
    /// must do: send messages, restore a snapshot, apply committed entries (all of them
    /// before the next poll: raft-rs counts them as applied), note a leadership change.
    ///
    /// # Errors
    ///
    /// [`ReplicationError::Raft`] if the store fails; the group must then be stopped
    /// (raft-rs's state is ahead of the store's).
    pub fn poll(&mut self) -> Result<Output, ReplicationError> {
        let mut out = Output::default();
        if self.node.has_ready() {
            let mut ready = self.node.ready();
            // A leader may send its appends before persisting them (Raft allows the
            // leader's own write in parallel).
            out.messages.extend(ready.take_messages());
            for r in ready.take_read_states() {
                if let Ok(b) = <[u8; 8]>::try_from(r.request_ctx.as_slice()) {
                    out.confirmed.push(u64::from_le_bytes(b));
                }
            }
            let snapshot = ready.snapshot();
            if !snapshot.is_empty() {
                self.node.mut_store().apply_snapshot(snapshot)?;
                out.restore = Some(restore_of(snapshot));
                let conf = snapshot.get_metadata().get_conf_state();
                out.voters = Some(conf.voters.clone());
                out.learners = Some(conf.learners.clone());
            }
            self.take_committed(&mut out, ready.take_committed_entries())?;
            self.node.mut_store().append(ready.entries())?;
            if let Some(hs) = ready.hs() {
                self.node.mut_store().set_hard_state(hs);
            }
            // Votes and append acknowledgements go out only once the store has what
            // they promise.
            out.persisted_messages
                .extend(ready.take_persisted_messages());
            let mut light = self.node.advance(ready);
            if let Some(commit) = light.commit_index() {
                self.node.mut_store().set_commit(commit);
            }
            out.messages.extend(light.take_messages());
            self.take_committed(&mut out, light.take_committed_entries())?;
            self.node.advance_apply();
        }
        // A node without saved state that knows the group has entries cannot lead it
        // with its empty log: its campaign would only let another wiped replica elect
        // it. Its vote requests are not sent (it still votes, and follows a leader).
        if self.fresh && self.saw_entries && self.node.raft.raft_log.last_index() == 0 {
            use raft::eraftpb::MessageType;
            let not_a_vote_request = |m: &RaftMessage| {
                !matches!(
                    m.get_msg_type(),
                    MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                )
            };
            out.messages.retain(not_a_vote_request);
            out.persisted_messages.retain(not_a_vote_request);
        }
        out.snapshot_wanted = self.node.mut_store().take_snapshot_request();
        let now = (self.node.raft.leader_id, self.term());
        if now != self.reported {
            self.reported = now;
            out.leadership = Some(Leadership {
                leader: self.leader(),
                term: now.1,
                is_self: self.is_leader(),
            });
        }
        Ok(out)
    }

    /// Makes a snapshot at `applied` (an index this node has applied) holding the
    /// application's state `data`, and drops the log up to it. A replica whose next
    /// entry was dropped then receives the snapshot ([`Output::restore`]).
    ///
    /// # Errors
    ///
    /// [`ReplicationError::Raft`] if `applied` is past what was applied or the store
    /// fails.
    pub fn compact(&mut self, applied: u64, data: Vec<u8>) -> Result<(), ReplicationError> {
        if applied > self.applied_index() {
            return Err(ReplicationError::Raft(raft::Error::Store(
                raft::StorageError::Unavailable,
            )));
        }
        self.node.mut_store().compact(applied, data)?;
        Ok(())
    }

    /// The learners of the group's current configuration ([`Membership::AddLearner`]).
    #[must_use]
    pub fn learners(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .node
            .raft
            .prs()
            .conf()
            .learners()
            .iter()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the group has nothing under way that needs its clock: this node's log is
    /// committed and applied to its end, and on the leader every replica holds the
    /// whole log and has acknowledged the commit index, with no membership change or
    /// leadership transfer pending. A candidate is never settled. The caller may then
    /// stop ticking the group while the members stay in touch (docs/replication.md,
    /// "Quiet groups"): a leader that does not tick sends no heartbeats, and a follower
    /// that does not tick starts no election.
    #[must_use]
    pub fn settled(&self) -> bool {
        let raft = &self.node.raft;
        let log = &raft.raft_log;
        let last = log.last_index();
        if log.committed != last || log.applied != last {
            return false;
        }
        match raft.state {
            StateRole::Follower => raft.leader_id != raft::INVALID_ID,
            StateRole::Leader => {
                raft.lead_transferee.is_none()
                    && !self.membership_pending()
                    && raft
                        .prs()
                        .iter()
                        .all(|(_, p)| p.matched == last && p.committed_index >= last)
            }
            _ => false,
        }
    }

    /// On a leader that stops serving the group (its store failed): messages that make
    /// the other voters campaign at once (raft-rs's `MsgTimeoutNow`, what ends a
    /// leadership transfer), the one holding the most of the log first, so that they
    /// elect a leader without waiting for an election timeout, which a follower of a
    /// quiet group does not run. Two that campaign in the same term split its votes and
    /// elect in the next. Empty on a follower.
    #[must_use]
    pub fn handoff(&self) -> Vec<RaftMessage> {
        if !self.is_leader() {
            return Vec::new();
        }
        let me = self.id();
        let mut to: Vec<u64> = self.voters().into_iter().filter(|&v| v != me).collect();
        to.sort_by_key(|&v| std::cmp::Reverse(self.matched(v).unwrap_or(0)));
        to.into_iter()
            .map(|v| {
                let mut m = RaftMessage::default();
                m.set_msg_type(raft::eraftpb::MessageType::MsgTimeoutNow);
                m.from = me;
                m.to = v;
                m.term = self.term();
                m
            })
            .collect()
    }

    /// On the leader: a heartbeat to every replica now (raft-rs's `MsgBeat`), sent by
    /// the next [`poll`](Self::poll); what a quiet group's leader sends now and then so
    /// that its followers know it still leads. A no-op elsewhere.
    pub fn heartbeat(&mut self) {
        if !self.is_leader() {
            return;
        }
        let mut m = RaftMessage::default();
        m.set_msg_type(raft::eraftpb::MessageType::MsgBeat);
        m.from = self.id();
        // A local message: raft-rs's own tick sends the same one.
        let _ = self.node.raft.step(m);
    }

    /// True while a membership change is proposed and not yet applied here (raft-rs
    /// takes one at a time).
    #[must_use]
    pub fn membership_pending(&self) -> bool {
        self.node.raft.pending_conf_index > self.applied_index()
    }

    /// The voters' lowest match index (the leader's progress tracker; `None` on a
    /// follower): entries up to it are on every voter, so compacting up to it makes no
    /// replica need a snapshot.
    #[must_use]
    pub fn min_matched(&self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        let prs = self.node.raft.prs();
        prs.conf()
            .voters()
            .ids()
            .iter()
            .filter_map(|id| prs.get(id).map(|p| p.matched))
            .min()
    }

    /// Tells raft-rs that messages to `peer` cannot be delivered now (the transport lost
    /// its connection), so the leader probes it instead of streaming appends.
    pub fn report_unreachable(&mut self, peer: u64) {
        self.node.report_unreachable(peer);
    }

    /// Hands the application's committed entries to `out` and applies committed
    /// membership changes to raft-rs and the store. raft-rs also commits an empty entry
    /// when a leader takes over (to commit its predecessors' entries): not the
    /// application's, so skipped.
    fn take_committed(
        &mut self,
        out: &mut Output,
        entries: Vec<RaftEntry>,
    ) -> Result<(), ReplicationError> {
        for e in entries {
            match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() && e.context.is_empty() => {}
                EntryType::EntryNormal => out.committed.push(Committed {
                    index: e.index,
                    term: e.term,
                    entry: Entry::decode_raft(&e.context, &e.data),
                }),
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicationError::Raft(err.into()))?;
                    let conf_state = self.node.apply_conf_change(&cc)?;
                    self.save_membership(conf_state, out);
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data)
                        .map_err(|err| ReplicationError::Raft(err.into()))?;
                    let conf_state = self.node.apply_conf_change(&cc)?;
                    self.save_membership(conf_state, out);
                }
            }
        }
        Ok(())
    }

    /// Saves the voters raft-rs computed for an applied membership change.
    fn save_membership(&mut self, conf_state: raft::eraftpb::ConfState, out: &mut Output) {
        self.node.mut_store().set_conf_state(&conf_state);
        out.voters = Some(conf_state.voters);
        out.learners = Some(conf_state.learners);
    }

    /// Tells raft-rs whether a snapshot message (`MsgSnapshot`) sent to `peer` arrived.
    /// The transport must report every one it was given: until it does, the leader sends
    /// that peer nothing else, and a lost snapshot would stall it for good.
    pub fn report_snapshot(&mut self, peer: u64, delivered: bool) {
        let status = if delivered {
            raft::SnapshotStatus::Finish
        } else {
            raft::SnapshotStatus::Failure
        };
        self.node.report_snapshot(peer, status);
    }

    /// The highest index handed out as committed by [`poll`](Self::poll) (and so applied
    /// by the caller), or covered by a restored snapshot.
    #[must_use]
    pub fn applied_index(&self) -> u64 {
        self.node.raft.raft_log.applied
    }

    /// The entries in this node's log after the applied index, decoded (those that do
    /// not decode left out), those not yet persisted by a [`poll`](Self::poll)
    /// included (a proposal's, a leader's empty entry): what a leader looks through
    /// before it gives message IDs and sequences, so that its IDs follow those of
    /// entries it will apply later and its batches are numbered after theirs.
    #[must_use]
    pub fn unapplied_entries(&self) -> Vec<Entry> {
        let log = &self.node.raft.raft_log;
        let (low, high) = (log.applied + 1, log.last_index() + 1);
        if low >= high {
            return Vec::new();
        }
        // The applied index is never compacted away, so the slice is whole.
        log.slice(low, high, None, raft::GetEntriesContext::empty(false))
            .unwrap_or_default()
            .iter()
            .filter(|e| !e.data.is_empty() || !e.context.is_empty())
            .filter_map(|e| Entry::decode_raft(&e.context, &e.data).ok())
            .collect()
    }

    /// The first index still in the log (after the latest snapshot).
    #[must_use]
    pub fn first_index(&self) -> u64 {
        self.node.store().first_index().unwrap_or(1)
    }
}

fn restore_of(snapshot: &Snapshot) -> Restore {
    let meta = snapshot.get_metadata();
    Restore {
        index: meta.index,
        term: meta.term,
        data: snapshot.get_data().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemLog;

    #[test]
    fn ack_policy_parses_the_flag_values() {
        assert_eq!("quorum".parse(), Ok(AckPolicy::Quorum));
        assert_eq!("all".parse(), Ok(AckPolicy::All));
        assert_eq!("leader".parse(), Ok(AckPolicy::Leader));
        assert!("one".parse::<AckPolicy>().is_err());
    }

    #[test]
    fn a_bad_config_is_an_error() {
        assert!(TopicGroup::new(&GroupConfig::new(0), MemLog::new(&[1])).is_err());
        let mut config = GroupConfig::new(1);
        config.heartbeat_tick = config.election_tick;
        assert!(TopicGroup::new(&config, MemLog::new(&[1])).is_err());
    }

    /// Node 2 of a new three-node group (voters 1, 2 and 3), as the vote tests use it.
    fn node_2() -> TopicGroup {
        TopicGroup::new(&GroupConfig::new(2), MemLog::new(&[1, 2, 3])).unwrap()
    }

    /// A message from node 1 to node 2 naming `log_term` and `index`.
    fn to_node_2(
        t: raft::eraftpb::MessageType,
        term: u64,
        log_term: u64,
        index: u64,
    ) -> RaftMessage {
        let mut m = RaftMessage::default();
        m.set_msg_type(t);
        m.from = 1;
        m.to = 2;
        m.term = term;
        m.log_term = log_term;
        m.index = index;
        m
    }

    /// Every message of a poll, those sent before and after the store's writes.
    fn sent(out: Output) -> Vec<RaftMessage> {
        let mut all = out.messages;
        all.extend(out.persisted_messages);
        all
    }

    /// Whether node 2 granted each vote it answered since the last poll.
    fn granted(group: &mut TopicGroup) -> Vec<bool> {
        sent(group.poll().unwrap())
            .iter()
            .filter(|m| m.get_msg_type() == raft::eraftpb::MessageType::MsgRequestVoteResponse)
            .map(|m| !m.reject)
            .collect()
    }

    /// A node restarted with an empty log votes for no candidate whose log ends before
    /// what it had applied (its vote floor), and for one whose log reaches it.
    #[test]
    fn a_vote_floor_keeps_an_empty_log_from_electing_a_candidate_behind_it() {
        let mut group = node_2();
        group.set_vote_floor(5, 100);
        let ask = |log_term: u64, index: u64| {
            to_node_2(
                raft::eraftpb::MessageType::MsgRequestVote,
                6,
                log_term,
                index,
            )
        };
        // Behind the floor: a later index of an older term, an earlier index of its term.
        group.step(ask(4, 200)).unwrap();
        group.step(ask(5, 99)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        // At the floor: granted (the node's own empty log does not object).
        group.step(ask(5, 100)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
    }

    /// A restarted node that hears of no leader lets its vote floor give way: after
    /// FLOOR_RELAX_TICKS to a candidate whose log has entries, after FLOOR_DROP_TICKS to
    /// any (every member restarted, every log empty).
    #[test]
    fn a_vote_floor_gives_way_when_no_leader_comes() {
        use raft::eraftpb::MessageType::MsgRequestVote;
        let mut group = node_2();
        group.set_vote_floor(5, 100);
        let mut relaxed = Vec::new();
        for _ in 1..FLOOR_RELAX_TICKS {
            relaxed.extend(group.tick());
        }
        let _ = group.poll();
        group.step(to_node_2(MsgRequestVote, 1000, 4, 50)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        relaxed.extend(group.tick());
        assert_eq!(relaxed, vec![FloorRelaxed::ForKeptLogs]);
        // A candidate with an empty log is still refused; one with entries is not.
        group.step(to_node_2(MsgRequestVote, 1001, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        group.step(to_node_2(MsgRequestVote, 1002, 4, 50)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
        for _ in FLOOR_RELAX_TICKS..FLOOR_DROP_TICKS {
            relaxed.extend(group.tick());
        }
        assert_eq!(
            relaxed,
            vec![FloorRelaxed::ForKeptLogs, FloorRelaxed::Dropped]
        );
        let _ = group.poll();
        group.step(to_node_2(MsgRequestVote, 2000, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
    }

    /// A node without saved state that learnt the group has entries never helps elect
    /// a candidate with an empty log (another wiped replica), and votes for one with
    /// entries once no leader came for FLOOR_RELAX_TICKS.
    #[test]
    fn a_fresh_node_elects_no_empty_log_once_it_knows_the_group_has_entries() {
        use raft::eraftpb::MessageType::{MsgRequestPreVote, MsgRequestVote};
        let mut group = node_2();
        group.set_fresh(true);
        group.step(to_node_2(MsgRequestPreVote, 3, 2, 40)).unwrap();
        group.step(to_node_2(MsgRequestVote, 4, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        let relaxed: Vec<FloorRelaxed> =
            (0..FLOOR_DROP_TICKS).filter_map(|_| group.tick()).collect();
        assert_eq!(relaxed, vec![FloorRelaxed::FreshVotes]);
        let _ = group.poll();
        group.step(to_node_2(MsgRequestVote, 1000, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        group.step(to_node_2(MsgRequestVote, 1001, 2, 40)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
        // Its own campaigns (an empty log) are not sent.
        let asked = (0..FLOOR_DROP_TICKS)
            .flat_map(|_| {
                group.tick();
                sent(group.poll().unwrap())
            })
            .filter(|m| matches!(m.get_msg_type(), MsgRequestVote | MsgRequestPreVote))
            .count();
        assert_eq!(asked, 0);
    }

    /// A node without saved state in its grace period elects no empty candidate (the
    /// members that kept the group speak first); after it, a new group elects as usual.
    #[test]
    fn a_fresh_node_in_its_grace_period_elects_no_empty_log() {
        use raft::eraftpb::MessageType::MsgRequestVote;
        let mut group = node_2();
        group.set_fresh(true);
        group.set_fresh_grace(60);
        group.step(to_node_2(MsgRequestVote, 1, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        for _ in 0..60 {
            group.tick();
        }
        let _ = group.poll();
        group.step(to_node_2(MsgRequestVote, 100, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
    }

    /// A restarted node whose log a leader filled partly, still before its floor, lets
    /// the floor give way too when that leader is gone.
    #[test]
    fn a_vote_floor_gives_way_for_a_log_that_ends_before_it() {
        use raft::eraftpb::MessageType::{MsgAppend, MsgRequestVote};
        let mut group = node_2();
        group.set_vote_floor(5, 100);
        let mut append = to_node_2(MsgAppend, 5, 0, 0);
        append.set_entries(
            (1..=40)
                .map(|index| RaftEntry {
                    index,
                    term: 5,
                    ..RaftEntry::default()
                })
                .collect::<Vec<_>>()
                .into(),
        );
        group.step(append).unwrap();
        let _ = group.poll();
        let relaxed: Vec<FloorRelaxed> = (0..FLOOR_DROP_TICKS + 40)
            .filter_map(|_| group.tick())
            .collect();
        assert_eq!(
            relaxed,
            vec![FloorRelaxed::ForKeptLogs, FloorRelaxed::Dropped]
        );
        let _ = group.poll();
        // A candidate at (5, 50): behind the floor, ahead of this log.
        group.step(to_node_2(MsgRequestVote, 1000, 5, 50)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
    }

    /// A restarted node that keeps hearing from a leader keeps its whole vote floor.
    #[test]
    fn a_vote_floor_stays_while_a_leader_is_heard() {
        use raft::eraftpb::MessageType::MsgHeartbeat;
        let mut group = node_2();
        group.set_vote_floor(5, 100);
        let mut relaxed = Vec::new();
        for t in 0..FLOOR_DROP_TICKS + 10 {
            if t % 5 == 0 {
                group.step(to_node_2(MsgHeartbeat, 7, 0, 0)).unwrap();
            }
            relaxed.extend(group.tick());
            let _ = group.poll();
        }
        assert_eq!(relaxed, Vec::<FloorRelaxed>::new());
    }

    /// A node with no saved state votes in a new group, and in a group with entries
    /// only once a leader gave it entries.
    #[test]
    fn a_fresh_node_waits_for_a_leader_before_electing_a_candidate_with_entries() {
        let mut group = node_2();
        group.set_fresh(true);
        let msg = to_node_2;
        use raft::eraftpb::MessageType::{MsgAppend, MsgRequestVote};
        // A new group: every log is empty.
        group.step(msg(MsgRequestVote, 3, 0, 0)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
        group.step(msg(MsgRequestVote, 4, 2, 40)).unwrap();
        assert_eq!(granted(&mut group), Vec::<bool>::new());
        // Once a leader gave it entries (and its lease ran out), as usual.
        let mut append = msg(MsgAppend, 5, 0, 0);
        append.set_entries(
            vec![RaftEntry {
                index: 1,
                term: 5,
                ..RaftEntry::default()
            }]
            .into(),
        );
        group.step(append).unwrap();
        group.poll().unwrap();
        for _ in 0..40 {
            group.tick();
        }
        group.poll().unwrap();
        group.step(msg(MsgRequestVote, 9, 5, 40)).unwrap();
        assert_eq!(granted(&mut group), vec![true]);
    }

    #[test]
    fn a_single_replica_group_commits_alone() {
        let mut group = TopicGroup::new(&GroupConfig::new(1), MemLog::new(&[1])).unwrap();
        for _ in 0..20 {
            group.tick();
        }
        let out = group.poll().unwrap();
        let leadership = out.leadership.unwrap();
        assert!(leadership.is_self && leadership.leader == Some(1));
        let entry = Entry::TopicPause(true);
        let p = group.propose(&entry).unwrap();
        let out = group.poll().unwrap();
        assert!(out.messages.is_empty() && out.persisted_messages.is_empty());
        assert_eq!(out.committed.len(), 1);
        assert_eq!(out.committed[0].entry, Ok(entry));
        for policy in [AckPolicy::Leader, AckPolicy::Quorum, AckPolicy::All] {
            assert_eq!(group.ack_state(p, policy), AckState::Acked);
        }
        // A message for another node is refused.
        let m = RaftMessage {
            to: 2,
            ..RaftMessage::default()
        };
        assert!(matches!(
            group.step(m),
            Err(ReplicationError::WrongRecipient { to: 2 })
        ));
    }
}
