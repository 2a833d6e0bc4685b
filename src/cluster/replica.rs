//! One shard's replicated topics: a Raft group per topic it owns and holds a replica
//! of, driven on the shard's thread.
//!
//! - **Publishing** ([`ShardCluster::publish`]): the leader proposes the batch with IDs
//!   and timestamps it gives, and answers once `--replication-ack` is met (and, under
//!   `--sync-every=1`, its own disk has it); any other node forwards the batch to the
//!   leader (or, when it holds no replica, to a replica) and relays the answer.
//! - **Applying**: every replica, the leader included, appends a committed batch to its
//!   topic log with the leader's IDs, and applies channel entries (creation, deletion,
//!   pause, empty, and the cursor the leader replicates every [`CURSOR_EVERY`]).
//! - **Leadership**: only the leader registers the topic and its channels with
//!   nsqlookupd and serves consumers; a node that loses leadership unregisters the topic
//!   and closes its consumers' connections, which find the new leader through
//!   nsqlookupd.
//!
//! The driver task ticks every awake group each [`TICK`] (election after 10 to 19
//! ticks, heartbeats every 2) and polls a group after anything stepped or proposed on
//! it. A group with nothing under way goes quiet (docs/replication.md, "Quiet groups"): it is not
//! ticked, so its leader sends no heartbeats and its followers start no election,
//! while the members stay in touch ([`super::liveness`]); anything that happens to it,
//! or a member going out of or coming into touch, wakes it.
//!
//! This file holds the groups, their driver and leadership; by concern beside it:
//! `propose` (publishing, forwarding, answering proposals), `apply` (committed entries
//! and the replicated channel state), `compaction` (log compaction and snapshots),
//! `catchup` (a backlog larger than a snapshot carries, fetched in pages),
//! `deletion` (a topic deleted and made again through its log), `vote` (the term,
//! vote and vote floor on disk), `journal` (the Raft log on disk, `--sync-every=1`)
//! and `requests` (admin operations, SUBs and frames from the rest of the broker).

mod apply;
mod catchup;
mod compaction;
mod deletion;
mod handover;
mod journal;
mod lease;
mod membership;
mod positions;
mod propose;
mod rebalance;
mod requests;
mod stall;
mod vote;

use apply::apply;
use compaction::{snapshot_data, Retention};
use requests::client_address;
pub use requests::{
    admin, peer_greeted, route, serves_consumers, subscribe, MoveLeaderError, SubRoute,
};

use super::link::Links;
use super::{liveness, ClusterConfig};
use crate::server::Server;
use bytes::Bytes;
use futures::channel::oneshot;
use nsq_replication::wire::{self, Frame, Hello, Reply};
use nsq_replication::{
    AckPolicy, AckState, ChannelOp, Entry, FloorRelaxed, GroupConfig, JournaledLog, Leadership,
    Message, ProposalId, RaftMessage, ReplicationError, TopicGroup,
};
use nsq_shards::message::{IdGenerator, MessageId};
use nsq_shards::shard::{DurableWait, LookupEvent};
use nsq_shards::topic::PublishError;
use nsq_shards::wake::Notify;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The groups' clock period: elections after 0.5 to 0.95 s without a leader,
/// heartbeats every 100 ms.
pub const TICK: Duration = Duration::from_millis(50);

/// How often a leader replicates its channels' finished positions: after a failover, a
/// message FINished within this much before is delivered again.
pub const CURSOR_EVERY: Duration = Duration::from_millis(100);

/// Ticks without anything but heartbeats before a settled group may go quiet (200 ms):
/// well under the least election timeout (10 ticks), so a follower that stops ticking
/// is far from starting an election when it is woken.
const QUIET_TICKS: u32 = 4;

/// How often the leader of a quiet group heartbeats all the same: what keeps its
/// followers quiet when nothing else comes ([`QUIET_LEASE`]).
const QUIET_BEAT: Duration = Duration::from_secs(5);

/// A follower stays quiet only while its leader's last append or heartbeat is younger
/// than this (two [`QUIET_BEAT`]s and some): a leader whose member stays in touch but
/// whose group stopped serving (a stuck shard, a lost hand-off) is replaced once it
/// runs out, within this plus an election timeout.
const QUIET_LEASE: Duration = Duration::from_secs(12);

/// Every how many [`CURSOR_EVERY`] rounds log compaction and journal start-overs look
/// at every group (1 s), where the other rounds look only at the awake ones.
const SWEEP_EVERY: u32 = 10;

/// The most unfinished messages of one channel a leader sends whole each round; a
/// channel holding more is replicated by what changed since the previous round
/// (docs/replication.md, "Channel state").
pub const POSITION_MAX: usize = 4096;

/// The most unfinished messages of one channel a leader sends whole when a replica asks
/// for its whole state ([`ChannelOp::SendWhole`]): an entry of at most 18 MB.
pub const WHOLE_MAX: usize = 1_000_000;

/// The longest a publish or a channel change waits for its replicas (an election
/// included) before it is refused.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The Raft log a leader keeps for a replica that lags (down, or slow), per topic, in
/// bytes of entries: beyond it the log is compacted to what this node applied, and the
/// lagging replica is sent a snapshot when it comes back (docs/replication.md, "What a
/// replica can miss").
pub const RETAIN_BYTES: u64 = 64 << 20;

/// The longest a forwarded proposal waits for the leader's reply (the leader answers
/// within [`PROPOSE_TIMEOUT`]); an unanswered one is not sent again, which could store
/// its messages twice: the publish fails and the producer decides.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(6);

/// A proposal waiting for its ack policy.
struct Waiter {
    proposal: ProposalId,
    reply: oneshot::Sender<Reply>,
    /// The leader's own durable write of the batch (`--sync-every=1`).
    durable: Option<DurableWait>,
}

/// How often a replica that misses messages ([`Gap::Missing`]) hands leadership away.
const GAP_HANDOVER_EVERY: Duration = Duration::from_secs(10);

/// Whether a replica's topic log misses messages the other replicas hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gap {
    /// It holds every message (as far as it knows).
    None,
    /// It restored a snapshot past messages it does not hold; `handed_at`: when it last
    /// handed leadership to another replica.
    Missing { handed_at: Option<Instant> },
}

/// One topic's group on this shard.
struct Group {
    group: TopicGroup<JournaledLog>,
    /// The IDs this node gives the messages it proposes while it leads.
    ids: IdGenerator,
    waiters: Vec<Waiter>,
    /// A digest of the state last proposed per channel (leader only).
    cursors: HashMap<String, u64>,
    /// The topic's count of changes ([`nsq_shards::topic::Topic::changes`]) when its
    /// channels' state was last proposed in full: while it stays the same the leader
    /// does not look at the channels again (a quiet topic costs nothing there).
    cursors_at: Option<u64>,
    /// A committed entry that does not decode stops the group here.
    stopped: bool,
    /// What this node knows about how far its Raft log can be compacted.
    retention: Retention,
    /// The topic was deleted through the log ([`Entry::TopicDelete`]): the group runs
    /// on without it ([`deletion`]).
    deleted: bool,
    /// Since when the group has run without its topic: once quiet for
    /// [`deletion::DROP_AFTER`] it leaves memory ([`ShardCluster::drop_deleted_groups`]).
    deleted_at: Option<Instant>,
    /// This replica restored a snapshot past messages its topic does not hold: its topic
    /// log misses messages the others have, and its channels' positions (the leader's
    /// offsets) no longer match its own log, so it hands leadership to another replica
    /// whenever it gets it while one is connected (for as long as this process runs),
    /// at most once per [`GAP_HANDOVER_EVERY`]: two such replicas would otherwise hand
    /// it to each other without end.
    gap: Gap,
    /// The term, vote and vote floor last saved ([`vote`]), and when the floor was.
    vote: vote::VoteFile,
    /// While this node leads: the sequence the next proposed message takes in the
    /// topic's log (its head once every entry in the Raft log is applied).
    next_seq: Option<u64>,
    /// Messages proposed since the channels' positions were last proposed (leader).
    published_since_positions: u64,
    /// Whether the group's members are its placement ([`membership`]).
    placement: membership::Placement,
    /// The Raft log's journal file while it is written (`--sync-every=1`).
    journal_file: Option<journal::OpenJournal>,
    /// The applied index of the journal's last start-over attempt: the next waits for
    /// the applied index to move past it.
    journal_started_at: u64,
    /// Ticks since anything but heartbeats happened to the group
    /// ([`ShardCluster::quiet`]).
    idle_ticks: u32,
    /// On a follower: the leader it last had an append, heartbeat or snapshot from,
    /// that leader's contact number then ([`liveness`]) and when.
    leader_contact: Option<(u64, liveness::Contact, Instant)>,
    /// On the leader: each replica's contact number when it last answered an append or
    /// a heartbeat.
    replica_contact: HashMap<u64, liveness::Contact>,
    /// The batches of the entries the running poll took as committed, until they are
    /// applied to the topic: raft-rs counts them applied from the poll on, so they are
    /// in neither [`TopicGroup::unapplied_entries`] nor the topic meanwhile.
    applying: Vec<Batch>,
    /// A catch-up in pages is under way ([`catchup`]): the leader's appends and
    /// snapshots are dropped until it ends.
    catching_up: bool,
    /// The head of the snapshot a finished catch-up held back: restoring that snapshot
    /// finds its log at that head, though its newest message may be older than the
    /// leader's newest (finished there meanwhile), so it misses nothing.
    paged_to: Option<u64>,
    /// The channel states this replica holds exactly ([`positions`]).
    views: positions::Views,
    /// While this member leads: its channels took over the states kept for them and
    /// record their changes ([`ShardCluster::take_over_channels`]).
    channels_taken_over: bool,
    /// While this member leads and its shard stalled: the question to the replicas
    /// whether it still leads, delivery held until they confirm ([`stall`]).
    confirming: Option<stall::Confirming>,
}

/// What the numbering needs of a publish entry: its first sequence (`None`: an entry
/// without one, placed at the topic's head), its size and its newest message ID.
#[derive(Clone, Copy, Debug)]
struct Batch {
    base: Option<u64>,
    len: u64,
    newest_id: u64,
}

impl Batch {
    fn of(e: &Entry) -> Option<Batch> {
        let (base, msgs) = match e {
            Entry::PublishAt { base, messages } => (Some(*base), messages),
            Entry::Publish(messages) => (None, messages),
            _ => return None,
        };
        // A leader gives a batch's IDs in increasing order: the last is the newest (one
        // parse per batch, not per message, on every poll).
        Some(Batch {
            base,
            len: msgs.len() as u64,
            newest_id: msgs
                .last()
                .and_then(|m| MessageId::from_hex(&m.id))
                .map_or(0, |i| i.0),
        })
    }
}

impl Group {
    /// The publish entries of this node's Raft log that are not in the topic yet:
    /// those being applied now, then those raft-rs has not handed out.
    fn batches_ahead(&self) -> Vec<Batch> {
        let mut v = self.applying.clone();
        v.extend(self.group.unapplied_entries().iter().filter_map(Batch::of));
        v
    }

    /// The topic log's head once every entry of this node's Raft log is applied, from
    /// `head`, the head now (where the next batch this node proposes goes: a batch
    /// numbered below what the log will hold would be skipped on every replica). A
    /// batch being applied counts again, which can only leave a hole.
    fn seq_after_log(&self, head: u64) -> u64 {
        let mut next = head;
        for b in self.batches_ahead() {
            next = match b.base {
                Some(base) => next.max(base.saturating_add(b.len)),
                None => next.saturating_add(b.len),
            };
        }
        next
    }
}

/// This shard's part of the cluster (one per shard, in its [`Server`]).
pub struct ShardCluster {
    pub cfg: Rc<ClusterConfig>,
    links: Links,
    groups: RefCell<HashMap<String, Group>>,
    /// Groups to poll.
    dirty: RefCell<HashSet<String>>,
    /// Groups ticked at each [`TICK`]: every group but the quiet ones
    /// ([`ShardCluster::quiet`]).
    awake: RefCell<HashSet<String>>,
    /// Led topics that took [`ShardCluster::positions_after`] messages since their
    /// channels' positions were last proposed: proposed again now, not at the next
    /// [`CURSOR_EVERY`].
    positions_due: RefCell<HashSet<String>>,
    /// The peers' touch and this shard's connections to them at the last tick: a change
    /// wakes every group.
    touch: RefCell<(liveness::View, Vec<bool>)>,
    wake: Notify,
    /// Forwarded proposals waiting for their reply, by request number.
    requests: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_request: Cell<u64>,
    /// The topics this node leads (what nsqlookupd is told).
    led: RefCell<HashSet<String>>,
    /// The last leader heard of for topics this node holds no replica of.
    hints: RefCell<HashMap<String, u64>>,
    /// This shard's index (the top bits of its request numbers).
    shard_index: usize,
    /// Consumers of this shard served through a topic's leader, by client id.
    pub relays: RefCell<HashMap<u64, Rc<super::relay::Relay>>>,
    /// The peers' TCP addresses for clients (from their greetings).
    peer_tcps: RefCell<HashMap<u64, String>>,
    /// Topics whose Raft log journal could not be read: no group for them until a
    /// restart (read once, logged once).
    unreadable_journals: RefCell<HashSet<String>>,
    /// This member's TCP address for clients (what its greeting tells the peers).
    own_tcp: RefCell<String>,
    /// Groups of deleted topics dropped from memory, by topic: what making one again
    /// needs ([`deletion::Dropped`]).
    dropped: RefCell<HashMap<String, deletion::Dropped>>,
    /// Consumers of topics this member stopped leading, by topic, until the driver
    /// relays each to the new leader ([`super::relay::serve_detached`]).
    detached: RefCell<Vec<(String, nsq_shards::shard::DetachedConsumer)>>,
    /// Hand-overs of topics this member leads, under way ([`handover`]).
    hand_overs: RefCell<HashMap<String, handover::HandOver>>,
    /// Topics whose group may wait for its replicas to confirm this member still leads
    /// after a stall ([`stall`]; a topic whose group no longer waits leaves it at the
    /// next clock run).
    confirming: RefCell<HashSet<String>>,
    /// What the last lease check that looked at every led topic was made under
    /// ([`lease`]; `None`: every replica was fresh).
    lease_checked: RefCell<Option<lease::LeaseCheck>>,
    /// Changes to the topics this shard leads and to their voters, counted
    /// ([`ShardCluster::leases_changed`]).
    lease_changes: Cell<u64>,
}

/// When this process started its cluster role (the first shard to start it).
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// For how long after the process starts a group without saved state elects no
/// candidate with an empty log ([`TopicGroup::set_fresh_grace`]): the members that kept
/// a group's entries speak within it (a leader heartbeats every 100 ms, a leaderless
/// member campaigns within its 0.5-0.95 s election timeout).
const FRESH_GRACE: Duration = Duration::from_secs(3);

impl ShardCluster {
    pub fn new(cfg: ClusterConfig, shard_index: usize) -> ShardCluster {
        STARTED.get_or_init(Instant::now);
        liveness::init(&cfg.peers.iter().map(|m| m.replica).collect::<Vec<_>>());
        let links = Links::new(&cfg);
        ShardCluster {
            cfg: Rc::new(cfg),
            links,
            groups: RefCell::new(HashMap::new()),
            dirty: RefCell::new(HashSet::new()),
            awake: RefCell::new(HashSet::new()),
            positions_due: RefCell::new(HashSet::new()),
            touch: RefCell::new((liveness::View::default(), Vec::new())),
            wake: Notify::default(),
            requests: RefCell::new(HashMap::new()),
            next_request: Cell::new(1),
            led: RefCell::new(HashSet::new()),
            hints: RefCell::new(HashMap::new()),
            shard_index,
            relays: RefCell::new(HashMap::new()),
            peer_tcps: RefCell::new(HashMap::new()),
            unreadable_journals: RefCell::new(HashSet::new()),
            own_tcp: RefCell::new(String::new()),
            dropped: RefCell::new(HashMap::new()),
            detached: RefCell::new(Vec::new()),
            hand_overs: RefCell::new(HashMap::new()),
            confirming: RefCell::new(HashSet::new()),
            lease_checked: RefCell::new(None),
            lease_changes: Cell::new(0),
        }
    }

    /// Keeps the registrations of replicated topics this member does not lead from
    /// nsqlookupd, from now on (before recovery: a recovered topic registers only once
    /// this member leads it).
    pub fn hide_registrations(server: &Server) {
        let Some(c) = server.cluster.clone() else {
            return;
        };
        let weak = Rc::downgrade(&c);
        server.shard.lookup.set_hidden(Box::new(move |topic| {
            weak.upgrade().is_some_and(|c| {
                ClusterConfig::replicates(topic) && !c.led.borrow().contains(topic)
            })
        }));
    }

    /// Starts the shard's connections to the peers, its driver and (on shard 0) the
    /// cluster listener, and the groups of the topics recovered from disk.
    pub fn start(server: &Rc<Server>) {
        let Some(c) = server.cluster.clone() else {
            return;
        };
        let tcp = client_address(server);
        c.own_tcp.replace(tcp.clone());
        c.links.start(
            server,
            Hello {
                node_id: c.cfg.node_id,
                replica: c.cfg.me.replica,
                address: c.cfg.me.address.clone(),
                tcp,
                members: c.cfg.members_digest(),
            },
        );
        // The topics recovered from disk: their groups start now (an election follows).
        // Those of topics deleted through their logs start only when something names
        // the topic ([`ShardCluster::ensure_group`] reads the deletion mark): a member
        // that has seen many topics deleted starts no group for any of them.
        for topic in server.shard.topic_names() {
            if ClusterConfig::replicates(&topic) && c.ensure_group(server, &topic) {
                c.mark(&topic);
            }
        }
        glommio::spawn_local(driver(server.clone())).detach();
        glommio::spawn_local(stall::clock(server.clone())).detach();
        if server.shard.index() == 0 {
            glommio::spawn_local(super::link::accept_loop(server.clone(), c.cfg.clone())).detach();
        }
    }

    /// The leader of `topic`'s group as this member knows it.
    pub fn leader_of(&self, topic: &str) -> Option<u64> {
        self.groups
            .borrow()
            .get(topic)
            .and_then(|g| g.group.leader())
    }

    /// Where peer `replica`'s clients connect, once its greeting said.
    pub fn peer_tcp(&self, replica: u64) -> Option<String> {
        self.peer_tcps.borrow().get(&replica).cloned()
    }

    /// Peer `replica` greeted (it connected, perhaps after a restart): records its
    /// client TCP address, and in the groups this node leads stops counting what the
    /// peer had acknowledged until it acknowledges again (a restart empties its Raft
    /// log).
    pub fn set_peer_tcp(&self, replica: u64, tcp: String) {
        self.peer_tcps.borrow_mut().insert(replica, tcp);
        let mut touched = Vec::new();
        for (topic, g) in self.groups.borrow_mut().iter_mut() {
            if g.group.is_leader() {
                g.group.peer_reconnected(replica);
                touched.push(topic.clone());
            }
        }
        for t in touched {
            self.mark(&t);
        }
    }

    /// True when this node leads `topic` now.
    pub fn leads(&self, topic: &str) -> bool {
        self.led.borrow().contains(topic)
    }

    /// Makes `topic`'s group (and the topic) on this shard, its owner, if this node holds
    /// a replica. Returns whether it does.
    pub fn ensure_group(&self, server: &Server, topic: &str) -> bool {
        self.ensure_group_for(server, topic, false)
    }

    /// [`ShardCluster::ensure_group`]; `invited`: a leader sent this member its log
    /// (an append, heartbeat or snapshot), so the group counts it in even where the
    /// members saved here do not (it was removed once and is being added again).
    fn ensure_group_for(&self, server: &Server, topic: &str, invited: bool) -> bool {
        if self.groups.borrow().contains_key(topic) {
            return true;
        }
        if self.unreadable_journals.borrow().contains(topic) {
            return false;
        }
        let me = self.cfg.me.replica;
        let data = server.shard.opts.data_path.as_ref();
        // A deleted topic's group dropped from memory comes back as it was.
        let dropped = self.dropped.borrow_mut().remove(topic);
        // The members saved when a change last applied here, else the placement.
        let members = match &dropped {
            Some(d) => Some(d.members.clone()),
            None => data.and_then(|d| membership::load(&membership::path(d, topic))),
        };
        let saved_members = members.is_some();
        let (voters, learners) =
            members.unwrap_or_else(|| (self.cfg.replicas_of(topic), Vec::new()));
        if !invited && !voters.contains(&me) && !learners.contains(&me) {
            return false;
        }
        if let (false, Some(d)) = (saved_members, data) {
            membership::save_initial(d, topic, (voters.clone(), learners.clone()));
        }
        let config = GroupConfig::new(me);
        // The term and vote this member saved before a restart (a small read, once per
        // group).
        let saved = data.and_then(|d| vote::load(&vote::path(d, topic)));
        // A topic deleted through its log keeps its group, and its term and vote in the
        // mark of its deletion: the group starts without making the topic.
        let tombstone = match (data, saved) {
            (Some(d), None) if !server.shard.topic_exists(topic) => {
                vote::load(&vote::tombstone_path(d, topic))
            }
            _ => None,
        };
        let deleted = tombstone.is_some() || dropped.is_some();
        let saved = dropped.as_ref().map(|d| d.saved).or(saved).or(tombstone);
        let found = saved;
        let saved = saved.unwrap_or_default();
        let Some(mut store) = Self::log_of(server, topic, &voters, &learners, saved) else {
            self.unreadable_journals
                .borrow_mut()
                .insert(topic.to_string());
            return false;
        };
        if let Some(d) = &dropped {
            store = d.log_from_base(store, (&voters, &learners));
        }
        let mut group = match TopicGroup::new(&config, store) {
            Ok(g) => g,
            Err(e) => {
                log::error!("TOPIC({topic}): cannot start its replication group: {e}");
                return false;
            }
        };
        group.set_vote_floor(saved.floor.0, saved.floor.1);
        // No saved state while the topic keeps a data path: a new replica, or one whose
        // disk was lost.
        group.set_fresh(found.is_none() && data.is_some());
        let grace = FRESH_GRACE.saturating_sub(STARTED.get_or_init(Instant::now).elapsed());
        group.set_fresh_grace(u32::try_from(grace.as_millis() / TICK.as_millis()).unwrap_or(0));
        if !deleted {
            server.shard.create_topic(topic);
        }
        self.groups.borrow_mut().insert(
            topic.to_string(),
            Group {
                group,
                ids: IdGenerator::new(self.cfg.node_id),
                waiters: Vec::new(),
                cursors: HashMap::new(),
                cursors_at: None,
                stopped: false,
                retention: Retention::default(),
                deleted,
                deleted_at: deleted.then(Instant::now),
                gap: Gap::None,
                vote: vote::VoteFile::new(saved),
                next_seq: None,
                published_since_positions: 0,
                placement: membership::Placement::of(
                    &voters,
                    &learners,
                    &self.cfg.replicas_of(topic),
                ),
                journal_file: None,
                journal_started_at: 0,
                idle_ticks: 0,
                leader_contact: None,
                replica_contact: HashMap::new(),
                applying: Vec::new(),
                catching_up: false,
                paged_to: None,
                views: positions::Views::default(),
                channels_taken_over: false,
                confirming: None,
            },
        );
        self.awake.borrow_mut().insert(topic.to_string());
        log::info!(
            "TOPIC({topic}): replicated on {} members",
            voters.len() + learners.len()
        );
        true
    }

    /// Something happened to `topic`'s group: it is polled, and ticked until it is
    /// quiet again.
    fn mark(&self, topic: &str) {
        self.dirty.borrow_mut().insert(topic.to_string());
        if !self.awake.borrow().contains(topic) {
            self.awake.borrow_mut().insert(topic.to_string());
        }
        self.wake.notify();
    }

    /// Starts an election of `topic`'s group now if it knows no leader: a group made a
    /// moment ago (a topic's first publish, `/topic/create` or SUB) then has its first
    /// leader after a round trip instead of an election timeout (0.5-0.95 s). Safe where
    /// a leader exists that this member has not heard of yet: with pre-vote, the others
    /// refuse a campaign while they hear from their leader, and nobody's term moves.
    pub(super) fn campaign_if_leaderless(&self, topic: &str) {
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            // A campaign under way is left alone: campaigning again would start its
            // count of votes over (callers look again every few ms). So is one this
            // member voted in: its winner (a leadership transfer's target, say) is
            // about to send its first append, and a campaign now would depose it.
            if g.stopped
                || g.group.leader().is_some()
                || g.group.campaigning()
                || g.group.voted_for_another()
            {
                return;
            }
            let _ = g.group.campaign();
        }
        self.mark(topic);
    }

    /// Whether `g` may go without ticks now (docs/replication.md, "Quiet groups"): it
    /// has been idle for [`QUIET_TICKS`], nothing waits on it, its Raft state is
    /// [settled](TopicGroup::settled), and the members it relies on are in touch under
    /// the contact they last answered under: on the leader, every replica (this
    /// shard's connection to it up); on a follower, its leader (whose append or
    /// heartbeat came since the leader last came into touch, and within
    /// [`QUIET_LEASE`]). A stopped group is quiet for good.
    fn quiet(&self, g: &Group, touch: &liveness::View) -> bool {
        if g.stopped {
            return true;
        }
        if g.idle_ticks < QUIET_TICKS || !g.waiters.is_empty() || !g.group.settled() {
            return false;
        }
        let me = self.cfg.me.replica;
        if g.group.is_leader() {
            g.group
                .voters()
                .into_iter()
                .chain(g.group.learners())
                .filter(|&r| r != me)
                .all(|r| {
                    self.links.connected(r)
                        && touch
                            .contact(r)
                            .is_some_and(|c| g.replica_contact.get(&r) == Some(&c))
                })
        } else {
            match (g.group.leader(), g.leader_contact) {
                (Some(leader), Some((heard, contact, at))) => {
                    leader == heard
                        && touch.contact(leader) == Some(contact)
                        && at.elapsed() < QUIET_LEASE
                }
                _ => false,
            }
        }
    }

    /// A frame from peer `from` for a topic this shard owns (or a reply to a request
    /// this shard sent).
    pub fn handle(self: &Rc<Self>, server: &Rc<Server>, from: u64, frame: Frame) {
        match frame {
            Frame::Raft { topic, message } => {
                use nsq_replication::raft::eraftpb::MessageType;
                let invited = matches!(
                    message.get_msg_type(),
                    MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
                );
                if !self.ensure_group_for(server, &topic, invited) {
                    return;
                }
                let kind = message.get_msg_type();
                // A backlog larger than a snapshot carries is fetched in pages before
                // the snapshot is restored; the leader sends what is dropped meanwhile
                // again.
                if matches!(kind, MessageType::MsgAppend | MessageType::MsgSnapshot)
                    && (self.catching_up(&topic)
                        || (kind == MessageType::MsgSnapshot
                            && self.catch_up_first(server, &topic, &message)))
                {
                    return;
                }
                // A campaign request that waited for this member (it was stopped or
                // cut off with its connection up) is for a transfer given up long ago.
                if let Some(age) = handover::stale_campaign_request(&message) {
                    log::info!(
                        "TOPIC({topic}): a request to campaign from replica {:016x} is {} ms old (this member was stopped or out of touch meanwhile); ignored",
                        message.from,
                        age.as_millis()
                    );
                    return;
                }
                // A leadership transfer a follower passed on (`move-leader` asked of it;
                // raft-rs names the transferee as the sender): handed over as one asked
                // here is (`transfer_leader`).
                if kind == MessageType::MsgTransferLeader && self.led.borrow().contains(&topic) {
                    self.start_hand_over(server, &topic, message.from);
                    return;
                }
                let stepped = self.groups.borrow_mut().get_mut(&topic).map(|g| {
                    let sender = message.from;
                    let r = g.group.step(message);
                    // What a quiet group relies on (`quiet`): whom it heard from, under
                    // which contact, and whether anything but a heartbeat came.
                    match kind {
                        MessageType::MsgAppend
                        | MessageType::MsgHeartbeat
                        | MessageType::MsgSnapshot
                            if g.group.leader() == Some(sender) =>
                        {
                            g.leader_contact =
                                Some((sender, liveness::contact(sender), Instant::now()));
                        }
                        MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse
                            if g.group.is_leader() =>
                        {
                            g.replica_contact.insert(sender, liveness::contact(sender));
                        }
                        _ => {}
                    }
                    if !matches!(
                        kind,
                        MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse
                    ) {
                        g.idle_ticks = 0;
                    }
                    r
                });
                if let Some(Err(e)) = stepped {
                    log::debug!("TOPIC({topic}): Raft message from {from} refused: {e}");
                }
                self.mark(&topic);
            }
            Frame::Propose {
                request,
                topic,
                context,
                data,
            } => {
                let me = self.clone();
                let server = server.clone();
                glommio::spawn_local(async move {
                    let reply = me.answer_propose(&server, &topic, &context, &data).await;
                    if let Ok(f) = wire::encode_reply(request, &reply) {
                        me.links.send(from, f);
                    }
                })
                .detach();
            }
            Frame::Fetch {
                request,
                topic,
                from: seq,
                max_bytes,
            } => {
                let me = self.clone();
                let server = server.clone();
                glommio::spawn_local(async move {
                    let reply = me.answer_fetch(&server, &topic, seq, max_bytes).await;
                    match wire::encode_reply(request, &reply) {
                        Ok(f) => me.links.send(from, f),
                        Err(e) => log::warn!("TOPIC({topic}): a page of records not sent: {e}"),
                    }
                })
                .detach();
            }
            Frame::Reply { request, reply } => {
                if let Some(tx) = self.requests.borrow_mut().remove(&request) {
                    let _ = tx.send(reply);
                }
            }
            Frame::Hello(_) | Frame::Ping { .. } => {}
        }
    }

    /// Polls `topic`'s group: sends its messages, follows a leadership change, applies
    /// what committed and answers the proposals whose policy is met.
    async fn process(&self, server: &Server, topic: &str) {
        let mut out = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(topic) else {
                return;
            };
            if g.stopped {
                return;
            }
            match g.group.poll() {
                Ok(o) => {
                    use nsq_replication::raft::eraftpb::MessageType;
                    let heartbeats_only = o.restore.is_none()
                        && o.committed.is_empty()
                        && o.leadership.is_none()
                        && o.voters.is_none()
                        && o.messages.iter().chain(&o.persisted_messages).all(|m| {
                            matches!(
                                m.get_msg_type(),
                                MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse
                            )
                        });
                    if !heartbeats_only {
                        g.idle_ticks = 0;
                    }
                    g.applying = o
                        .committed
                        .iter()
                        .filter_map(|c| c.entry.as_ref().ok().and_then(Batch::of))
                        .collect();
                    o
                }
                Err(e) => {
                    drop(groups);
                    self.stop_group(server, topic, &e.to_string());
                    return;
                }
            }
        };
        let members = out
            .voters
            .take()
            .map(|v| (v, out.learners.take().unwrap_or_default()));
        if members.is_some() {
            self.leases_changed();
        }
        let mut messages = std::mem::take(&mut out.messages);
        let mut persisted = std::mem::take(&mut out.persisted_messages);
        let confirmed = std::mem::take(&mut out.confirmed);
        if !self.save_vote(server, topic).await {
            // Not sent: a vote must be on disk before anyone hears of it (Raft's rule).
            // The group takes them as lost on the network.
            messages.clear();
            persisted.clear();
        }
        if let Some(r) = &out.restore {
            if r.data.as_slice() == deletion::DELETED_SNAPSHOT {
                self.delete_here(server, topic).await;
            } else {
                self.recreate_here(server, topic).await;
                self.restore(server, topic, r);
            }
        }
        if self.journaled(topic) {
            // A leader's appends go before its own journal write (its followers write
            // theirs meanwhile); publishers are answered (`resolve`) only after it.
            self.send_messages(server, topic, std::mem::take(&mut messages))
                .await;
            // The journal's base record stands for the restored state: on disk first.
            if out.restore.is_some() && !self.topic_synced(server, topic).await {
                self.stop_group(
                    server,
                    topic,
                    "the restored snapshot was not synced; restart the member once the disk is fixed",
                );
                return;
            }
            // Raft's rule: what an acknowledgement or a vote promises is on disk before
            // it is sent. Nothing of this poll is applied or answered without it.
            if !self.write_journal(server, topic).await {
                return;
            }
        }
        messages.append(&mut persisted);
        self.send_messages(server, topic, messages).await;
        if let Some(l) = out.leadership {
            self.leadership_changed(server, topic, l);
        }
        if !confirmed.is_empty() {
            self.leadership_confirmed(server, topic, &confirmed);
        }
        if out.snapshot_wanted {
            let mut groups = self.groups.borrow_mut();
            if let Some(g) = groups.get_mut(topic) {
                let applied = g.group.applied_index();
                let data = snapshot_data(server, topic, g, applied);
                if let Err(e) = g.group.compact(applied, data) {
                    log::debug!("TOPIC({topic}): no snapshot made: {e}");
                }
            }
        }
        if !out.committed.is_empty() && server.shard.needs_prepared_store(topic) {
            server.shard.prepare_store(topic).await;
        }
        let mut durable: Vec<(u64, DurableWait)> = Vec::new();
        for c in out.committed {
            match c.entry {
                Ok(Entry::Compact { index }) => {
                    if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                        g.retention.safe = g.retention.safe.max(index);
                    }
                }
                Ok(Entry::TopicDelete) => {
                    if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                        g.retention.last_real = c.index;
                    }
                    self.delete_here(server, topic).await;
                }
                Ok(entry) => {
                    if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                        g.retention.last_real = c.index;
                    }
                    if self.deleted(topic) {
                        // Only what makes the topic again applies to a deleted one.
                        let makes = matches!(
                            entry,
                            Entry::TopicCreate
                                | Entry::Publish(_)
                                | Entry::PublishAt { .. }
                                | Entry::Channel {
                                    op: ChannelOp::Create,
                                    ..
                                }
                        );
                        if !makes || !self.recreate_here(server, topic).await {
                            continue;
                        }
                    }
                    let publish = matches!(entry, Entry::Publish(_) | Entry::PublishAt { .. });
                    // This leader's own proposal of this term: its channels are already
                    // in the state the entry describes.
                    let own = self
                        .groups
                        .borrow()
                        .get(topic)
                        .is_some_and(|g| g.group.is_leader() && g.group.term() == c.term);
                    match apply(server, topic, entry, own) {
                        Ok(Some(w)) => durable.push((c.index, w)),
                        Ok(None) => {}
                        // With a journal, going on would let it start over past a batch
                        // the topic does not hold.
                        Err(apply::Unstored) if self.journaled(topic) => {
                            self.stop_group(
                                server,
                                topic,
                                "a committed batch was not stored; restart the member once the disk is fixed",
                            );
                            return;
                        }
                        Err(apply::Unstored) => {}
                    }
                    if publish {
                        let id = server.shard.topic_last_id(topic).map_or(0, |i| i.0);
                        let head = server.shard.topic_head(topic);
                        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                            g.retention.ids_at.push_back((c.index, id, head));
                        }
                    }
                }
                Err(e) => {
                    self.stop_group(
                        server,
                        topic,
                        &format!("committed entry {} does not decode ({e})", c.index),
                    );
                    return;
                }
            }
        }
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            g.applying.clear();
        }
        if self.leads(topic) {
            self.take_over_channels(server, topic);
        }
        self.resolve(topic, durable);
        if let Some((voters, learners)) = members {
            self.members_changed(server, topic, voters, learners).await;
        }
    }

    /// Sends `messages` of `topic`'s group to their peers, with the data of any
    /// snapshot among them made now, and tells the group how each snapshot went.
    async fn send_messages(&self, server: &Server, topic: &str, mut messages: Vec<RaftMessage>) {
        use nsq_replication::raft::eraftpb::MessageType;
        let mut snapshots_sent = Vec::new();
        for m in &mut messages {
            if m.get_msg_type() == MessageType::MsgSnapshot {
                if let Some(data) = self.snapshot_to_send(server, topic).await {
                    m.mut_snapshot().set_data(data.into());
                }
            }
        }
        for m in &mut messages {
            // A MsgTimeoutNow makes its receiver campaign at once, whatever its lease.
            // Queued for a peer out of reach, it would depose this leader whenever the
            // peer came back, long after the transfer was given up (raft-rs aborts one
            // after an election timeout, and `move-leader` answers 500): it goes on a
            // live connection or not at all.
            if m.get_msg_type() == MessageType::MsgTimeoutNow && !self.links.connected(m.to) {
                continue;
            }
            // Stamped: a replica that finds it only much later ignores it.
            handover::stamp_campaign_request(m);
            let queued = match wire::encode_frame(topic, m) {
                Ok(f) => {
                    self.links.send(m.to, f);
                    self.links.connected(m.to)
                }
                Err(e) => {
                    log::warn!("TOPIC({topic}): Raft message not sent: {e}");
                    false
                }
            };
            if m.get_msg_type() == MessageType::MsgSnapshot {
                snapshots_sent.push((m.to, queued));
            }
        }
        if !snapshots_sent.is_empty() {
            // raft-rs sends a replica nothing more until told how its snapshot went: it
            // was queued on a live connection (a connection that breaks after that loses
            // it, and the replica's next rejection asks again), or it was not.
            if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                for (to, queued) in snapshots_sent {
                    g.group.report_snapshot(to, queued);
                }
            }
            self.mark(topic);
        }
    }

    /// Stops `topic`'s group on this member (`why` is logged): it sends, applies and
    /// answers nothing more until the member restarts, every publish waiting on it
    /// fails, and if it led the topic it no longer does (its registrations with
    /// nsqlookupd go, its consumers are closed and find the leader the others elect).
    pub(super) fn stop_group(&self, server: &Server, topic: &str, why: &str) {
        log::error!("TOPIC({topic}): replication of the topic stopped on this member: {why}");
        let term = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(topic) else {
                return;
            };
            // A leader that stops makes the replicas it reaches campaign at once: the
            // followers of a quiet group would otherwise wait for its lease to end.
            for mut m in g.group.handoff() {
                if !self.links.connected(m.to) {
                    continue;
                }
                handover::stamp_campaign_request(&mut m);
                if let Ok(f) = wire::encode_frame(topic, &mut m) {
                    self.links.send(m.to, f);
                }
            }
            g.stopped = true;
            g.journal_file = None;
            for w in g.waiters.drain(..) {
                let _ = w.reply.send(Reply::Failed(
                    "replication of the topic stopped on this member".into(),
                ));
            }
            g.group.term()
        };
        let lost = Leadership {
            leader: None,
            term,
            is_self: false,
        };
        self.leadership_changed(server, topic, lost);
    }

    fn leadership_changed(&self, server: &Server, topic: &str, l: Leadership) {
        let was = self.leads(topic);
        let was_confirming = self
            .groups
            .borrow_mut()
            .get_mut(topic)
            .and_then(|g| g.confirming.take())
            .is_some();
        if was_confirming {
            self.leases_changed();
            // A question asked as the leader of an earlier term is moot: an election
            // settled who leads. Consumers this member keeps (it leads again) get what
            // was held; a member that no longer leads drops it below, before any write.
            for client in server.shard.topic_consumers(topic) {
                client.outbox().hold_flushes(false);
            }
        }
        super::relay::leader_changed(self, topic, l.leader);
        if l.is_self && !was {
            log::info!("TOPIC({topic}): this node leads it (term {})", l.term);
            if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                // A new leader looks at every channel at its first round.
                g.cursors_at = None;
                g.channels_taken_over = false;
                let hand_over = match g.gap {
                    Gap::None => false,
                    Gap::Missing { handed_at } => {
                        handed_at.is_none_or(|at| at.elapsed() >= GAP_HANDOVER_EVERY)
                    }
                };
                if hand_over {
                    let me = self.cfg.me.replica;
                    let other = g
                        .group
                        .voters()
                        .into_iter()
                        .find(|&v| v != me && self.links.connected(v));
                    if let Some(to) = other {
                        log::info!(
                            "TOPIC({topic}): handing leadership to {} (this replica misses messages)",
                            self.cfg.member(to).map_or("?", |m| m.address.as_str())
                        );
                        g.group.transfer_leader(to);
                        g.gap = Gap::Missing {
                            handed_at: Some(Instant::now()),
                        };
                    }
                } else if g.gap != Gap::None {
                    log::info!(
                        "TOPIC({topic}): keeps the leadership it was handed back (this replica misses messages; it handed it over less than {} s ago)",
                        GAP_HANDOVER_EVERY.as_secs()
                    );
                }
                let mut highest = server.shard.topic_last_id(topic).map_or(0, |i| i.0);
                for b in g.batches_ahead() {
                    highest = highest.max(b.newest_id);
                }
                if highest != 0 {
                    g.ids.resume_above(MessageId(highest));
                }
                g.next_seq = Some(g.seq_after_log(server.shard.topic_head(topic)));
            }
            self.led.borrow_mut().insert(topic.to_string());
            self.leases_changed();
            // Nothing is delivered from the channels' states as this member applied them
            // as a follower: they may lag the last leader's (a follower learns of a
            // commit with the next append or heartbeat), and a consumer relayed here at
            // once would get messages that were finished. Delivery starts once the
            // channels took over the states of every entry before this term.
            self.apply_delivery_hold(server, topic);
            let lookup = &server.shard.lookup;
            if !server.shard.topic_exists(topic) {
                // Deleted through the log: registered when it is made again.
                return;
            }
            lookup.push_always(LookupEvent::Register(topic.to_string(), None));
            for c in server.shard.channel_names(topic) {
                lookup.push_always(LookupEvent::Register(topic.to_string(), Some(c)));
            }
        } else if !l.is_self && was {
            match l.leader.and_then(|r| self.cfg.member(r)) {
                Some(m) => log::info!(
                    "TOPIC({topic}): leadership moved to {} (term {})",
                    m.address,
                    l.term
                ),
                None => log::info!(
                    "TOPIC({topic}): this node no longer leads it; no leader yet (term {})",
                    l.term
                ),
            }
            self.led.borrow_mut().remove(topic);
            if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                g.next_seq = None;
                // Its channels hold what its own consumers did, which no entry says.
                g.channels_taken_over = false;
                g.views.forget_all();
            }
            server.shard.stop_tracking_changes(topic);
            let lookup = &server.shard.lookup;
            for c in server.shard.channel_names(topic) {
                lookup.push_always(LookupEvent::Unregister(topic.to_string(), Some(c)));
            }
            lookup.push_always(LookupEvent::Unregister(topic.to_string(), None));
            // Its consumers stay connected: each is served through the new leader. Where
            // replication stopped, this member cannot follow the group: they are closed
            // and find the leader the others elect through nsqlookupd.
            let stopped = self.groups.borrow().get(topic).is_some_and(|g| g.stopped);
            let consumers = server.shard.detach_topic_consumers(topic);
            for consumer in &consumers {
                // What this member framed for them and did not write yet is stale: the
                // new leader delivers it again, and would drop their FIN of this copy.
                let out = consumer.client.outbox();
                out.drop_message_frames();
                out.hold_flushes(false);
            }
            if stopped {
                for consumer in &consumers {
                    consumer.client.kill();
                }
                if !consumers.is_empty() {
                    log::info!("TOPIC({topic}): closed {} consumer(s)", consumers.len());
                }
            } else {
                if !consumers.is_empty() {
                    log::info!(
                        "TOPIC({topic}): {} consumer(s) now relayed to the new leader",
                        consumers.len()
                    );
                }
                // Served by the driver, which holds the server for the relays' tasks.
                self.detached.borrow_mut().extend(
                    consumers
                        .into_iter()
                        .map(|consumer| (topic.to_string(), consumer)),
                );
            }
        } else if !l.is_self {
            if let Some(m) = l.leader.and_then(|r| self.cfg.member(r)) {
                log::info!("TOPIC({topic}): led by {} (term {})", m.address, l.term);
            }
        }
    }

    /// `topic`'s leader as this replica knows it (`Some(None)`: none known now; `None`:
    /// no group for `topic` here).
    fn group_leader(&self, topic: &str) -> Option<Option<u64>> {
        self.groups.borrow().get(topic).map(|g| g.group.leader())
    }

    /// Asks `topic`'s group to hand leadership to replica `to` (a follower passes the
    /// request to the leader, which does the same on receiving it). A leader first lets
    /// its consumers finish what they hold in flight and replicates the topic's channel
    /// positions ([`handover`]), so that the consumers it relays to the new leader get
    /// nothing again.
    fn transfer_leader(&self, server: &Server, topic: &str, to: u64) {
        if self.led.borrow().contains(topic) {
            self.start_hand_over(server, topic, to);
            return;
        }
        if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
            g.group.transfer_leader(to);
        }
        self.mark(topic);
    }

    /// `topic`'s replication for `/stats`: its leader's address, term, commit and
    /// applied index and whether this node leads (`None`: not replicated here).
    pub fn topic_state(&self, topic: &str) -> Option<serde_json::Value> {
        let groups = self.groups.borrow();
        let g = groups.get(topic)?;
        let leader = g.group.leader();
        let last = g.group.last_index();
        let voters = g.group.voters();
        let learners = g.group.learners();
        let replicas: Vec<serde_json::Value> = voters
            .iter()
            .chain(&learners)
            .map(|r| {
                let matched = g.group.matched(*r);
                let me = *r == self.cfg.me.replica;
                serde_json::json!({
                    // Empty for a replica not in this member's --cluster-peer list (a
                    // member removed from it, or a list that differs between members).
                    "address": self.cfg.member(*r).map_or("", |m| m.address.as_str()),
                    "replica_id": format!("{r:016x}"),
                    // A learner receives the log but does not vote: a replica being
                    // added (docs/replication.md, "Adding and removing members").
                    "learner": learners.contains(r),
                    "lag_entries": matched.map(|m| last.saturating_sub(m)),
                    // Known to the leader only: it is reachable and holds every
                    // committed entry.
                    "in_sync": matched.map(|m| {
                        m >= g.group.commit_index() && (me || self.links.connected(*r))
                    }),
                })
            })
            .collect();
        Some(serde_json::json!({
            "topic": topic,
            "leader": leader.and_then(|l| self.cfg.member(l)).map(|m| m.address.clone()),
            // Where clients reach the leader (its TCP address, from its greeting).
            "leader_tcp_address": leader.and_then(|l| {
                if l == self.cfg.me.replica {
                    Some(self.own_tcp.borrow().clone())
                } else {
                    self.peer_tcp(l)
                }
            }),
            // A stopped group serves nothing, whatever raft-rs last said.
            "is_leader": g.group.is_leader() && !g.stopped,
            // Its Raft role (`TopicGroup::role`): an election under way shows here.
            "role": if g.stopped { "stopped" } else { g.group.role() },
            // Not ticked: nothing under way and the members in touch (`quiet`).
            "quiet": !self.awake.borrow().contains(topic),
            // Replication of the topic stopped on this member ([`ShardCluster::stop_group`]:
            // its log says why); a restart starts it again.
            "stopped": g.stopped,
            // Deleted through its log: the group runs on without the topic.
            "deleted": g.deleted,
            "term": g.group.term(),
            "commit_index": g.group.commit_index(),
            "applied_index": g.group.applied_index(),
            // The vote floor on disk: what a restart of this member still protects.
            "saved_floor_term": g.vote.saved.floor.0,
            "saved_floor_index": g.vote.saved.floor.1,
            "last_index": last,
            "first_index": g.group.first_index(),
            "log_bytes": g.group.store().log().entry_bytes(),
            // Publish batches this member proposed as leader with the producer's PUB,
            // DPUB or MPUB frame as the Raft entry's data, not a copy of the bodies.
            "uncopied_proposals": g.group.uncopied_proposals(),
            // The Raft log's journal on disk (`--sync-every=1`; 0: kept in memory only).
            "journal_bytes": g.group.store().journal_bytes(),
            // On a replica: the channels whose leader sends only what changed (more
            // unfinished messages than it sends whole), with the state this replica
            // keeps for them (docs/replication.md, "Channel state").
            "channel_states": g.views.describe(),
            "replicas": replicas,
            // The members this member's --cluster-peer list places the topic on: the
            // leader moves the replicas there.
            "placement": self
                .cfg
                .replicas_of(topic)
                .iter()
                .map(|r| self.cfg.member(*r).map_or("", |m| m.address.as_str()))
                .collect::<Vec<_>>(),
        }))
    }

    /// Every replicated topic of this shard, as [`ShardCluster::topic_state`].
    pub fn state(&self) -> Vec<serde_json::Value> {
        let mut names: Vec<String> = self.groups.borrow().keys().cloned().collect();
        names.sort();
        names.iter().filter_map(|t| self.topic_state(t)).collect()
    }
}

/// Logs the topics whose vote rules gave way at one tick ([`FloorRelaxed`]): index 0
/// restarted members that now vote for a member with entries, 1 members without saved
/// state that do, 2 restarted members that dropped their floor.
fn log_relaxed(relaxed: &[Vec<String>; 3]) {
    let relax = (TICK * nsq_replication::FLOOR_RELAX_TICKS).as_secs();
    let drop = (TICK * nsq_replication::FLOOR_DROP_TICKS).as_secs();
    let texts = [
        format!(
            "no leader for {relax} s since this member restarted with an empty Raft log: it now also votes for a member whose Raft log has entries, even if they end before what this member had applied; if no leader comes by {drop} s (every member restarted), it drops its vote floor"
        ),
        format!(
            "no leader for {relax} s since this member started without saved state (a new or wiped replica): it now votes for a member whose Raft log has entries; what only a member that is down holds may be lost"
        ),
        format!(
            "no leader for {drop} s since this member restarted (every member restarted?): its vote floor is dropped so the group elects a leader again; what was acknowledged after the members' saved floors may be lost"
        ),
    ];
    for (topics, text) in relaxed.iter().zip(texts) {
        match topics.as_slice() {
            [] => {}
            [t] => log::warn!("TOPIC({t}): {text}"),
            many => log::warn!(
                "{} topics (first {}): {text}",
                many.len(),
                many.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// The shard's driver: ticks every group each [`TICK`], replicates cursors every
/// [`CURSOR_EVERY`], and polls the groups something happened to.
/// Ticks before a follower whose leader is gone campaigns
/// ([`TopicGroup::expedite_election`]): 1 + 2 x its place among the group's voters
/// other than `leader`, in an order that turns with the topic's name, so that one
/// follower campaigns first (two at once split their votes and wait a whole election
/// timeout) and the first is not the same member for every topic.
fn expedite_ticks(topic: &str, me: u64, voters: &[u64], leader: u64) -> usize {
    let mut others: Vec<u64> = voters.iter().copied().filter(|&v| v != leader).collect();
    others.sort_unstable();
    let n = others.len().max(1);
    let turn = usize::try_from(crc32fast::hash(topic.as_bytes())).unwrap_or(0) % n;
    let place = others.iter().position(|&v| v == me).unwrap_or(0);
    1 + 2 * ((place + n - turn) % n)
}

async fn driver(server: Rc<Server>) {
    let Some(c) = server.cluster.clone() else {
        return;
    };
    let me = c.cfg.me.replica;
    let mut next_tick = Instant::now() + TICK;
    let mut next_cursor = Instant::now() + CURSOR_EVERY;
    let mut next_reconcile = Instant::now() + membership::RECONCILE_EVERY;
    let mut next_rebalance = Instant::now() + rebalance::REBALANCE_EVERY;
    let mut sweeps: u32 = 0;
    let mut next_beat = Instant::now() + QUIET_BEAT;
    while !server.shard.shutdown.is_set() {
        let now = Instant::now();
        if now >= next_tick {
            let mut groups = c.groups.borrow_mut();
            let mut dirty = c.dirty.borrow_mut();
            let mut awake = c.awake.borrow_mut();
            // A peer went out of touch or came back, or this shard's connection to one
            // went down or up: every group ticks until it is quiet again (a follower
            // whose leader is gone elects another; a leader heartbeats a replica that
            // lost touch). Every QUIET_BEAT, too: the leaders of quiet groups
            // heartbeat, and quiet followers look at their lease.
            let touch = liveness::View::now();
            let links = c.links.connected_all();
            let beat = now >= next_beat;
            if beat {
                next_beat = now + QUIET_BEAT;
            }
            {
                let mut last = c.touch.borrow_mut();
                if beat || last.0 != touch || last.1 != links {
                    awake.extend(groups.keys().cloned());
                    *last = (touch.clone(), links);
                }
            }
            // Topics whose vote rules gave way at this tick, by how (logged once per
            // tick, not once per topic).
            let mut relaxed: [Vec<String>; 3] = [Vec::new(), Vec::new(), Vec::new()];
            awake.retain(|t| {
                let Some(g) = groups.get_mut(t) else {
                    return false;
                };
                if g.stopped {
                    return false;
                }
                // Polled when the vote floor on disk is behind what was applied
                // (process saves it).
                let floor_behind = server.shard.opts.data_path.is_some()
                    && g.group
                        .applied_position()
                        .is_some_and(|p| p > g.vote.saved.floor);
                if floor_behind {
                    dirty.insert(t.clone());
                }
                if c.quiet(g, &touch) {
                    if beat && g.group.is_leader() {
                        g.group.heartbeat();
                        dirty.insert(t.clone());
                    }
                    return false;
                }
                // A follower whose leader is out of touch (its connection closed, or
                // silent for SILENT_AFTER) campaigns within a few ticks rather than
                // after the rest of its election timeout.
                if let Some(l) = g.group.leader() {
                    if l != me && touch.contact(l).is_none() {
                        g.group
                            .expedite_election(expedite_ticks(t, me, &g.group.voters(), l));
                    }
                }
                match g.group.tick() {
                    Some(FloorRelaxed::ForKeptLogs) => relaxed[0].push(t.clone()),
                    Some(FloorRelaxed::FreshVotes) => relaxed[1].push(t.clone()),
                    Some(FloorRelaxed::Dropped) => relaxed[2].push(t.clone()),
                    None => {}
                }
                g.idle_ticks = g.idle_ticks.saturating_add(1);
                // Polled only when the tick gave raft-rs something to do (a heartbeat
                // due, an election): most ticks of an idle group do not.
                if g.group.has_ready() {
                    dirty.insert(t.clone());
                }
                true
            });
            log_relaxed(&relaxed);
            next_tick = now + TICK;
        }
        let due: Vec<String> = c.positions_due.borrow_mut().drain().collect();
        if !due.is_empty() {
            c.replicate_busy(&server, due);
        }
        if now >= next_cursor {
            c.replicate_cursors(&server);
            c.ask_for_whole_states(&server);
            // The awake groups each time, every group (the quiet ones) every SWEEP_EVERY.
            sweeps += 1;
            let all = sweeps.is_multiple_of(SWEEP_EVERY);
            c.compact_logs(&server, all);
            c.start_journals_over(&server, all).await;
            if all {
                c.drop_deleted_groups();
            }
            next_cursor = now + CURSOR_EVERY;
        }
        if now >= next_reconcile {
            c.reconcile_members(&server).await;
            next_reconcile = Instant::now() + membership::RECONCILE_EVERY;
        }
        if now >= next_rebalance {
            c.rebalance_leaders(&server);
            next_rebalance = Instant::now() + rebalance::REBALANCE_EVERY;
        }
        // Side by side: a group's poll can wait on its Raft log's journal write
        // (`--sync-every=1`), and those of different topics are synced in parallel.
        let dirty: Vec<String> = c.dirty.borrow_mut().drain().collect();
        futures::future::join_all(dirty.iter().map(|t| c.process(&server, t))).await;
        let detached = std::mem::take(&mut *c.detached.borrow_mut());
        for (topic, consumer) in detached {
            super::relay::serve_detached(&server, &topic, consumer);
        }
        let handing_over = c.handing_over();
        if handing_over {
            c.advance_hand_overs(&server);
        }
        if !c.dirty.borrow().is_empty() {
            continue;
        }
        let mut wait = next_tick.saturating_duration_since(Instant::now());
        if handing_over {
            wait = wait.min(handover::HAND_OVER_POLL);
        }
        let sleep = std::pin::pin!(glommio::timer::sleep(wait));
        let woken = std::pin::pin!(c.wake.wait());
        futures::future::select(sleep, woken).await;
    }
}
