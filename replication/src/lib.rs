//! Replication of one NSQ topic across brokers: a topic's Raft group, driven
//! synchronously by the shard that owns the topic (see docs/replication.md).
//!
//! - [`entry`]: what the group replicates ([`Entry`]: publish batches, channel
//!   operations) and its versioned binary encoding;
//! - [`group`]: [`TopicGroup`], the driver of one group over raft-rs's `RawNode`
//!   (`propose`, `tick`, `step`, `poll`, `ack_state`);
//! - [`store`]: the [`LogStore`] trait that Raft's log is kept in, and [`MemLog`];
//! - [`journal`]: [`JournaledLog`], a [`MemLog`] whose writes are recorded for a file
//!   that rebuilds it after a restart;
//! - [`wire`]: the frames between cluster members (greeting, Raft messages, proposals
//!   forwarded to a leader and their replies).
//!
//! The broker's side (connections, a shard's groups, forwarding, applying entries to
//! the topic, the relay of consumers) is the root crate's `src/cluster/`.

pub mod entry;
pub mod group;
pub mod journal;
pub mod store;
pub mod wire;

pub use entry::{ChannelOp, DecodeError, Entry, Message, MessageId, PendingMessage};
pub use group::{
    AckPolicy, AckState, Committed, FloorRelaxed, GroupConfig, Leadership, Membership, Output,
    ProposalId, ReplicaSet, ReplicationError, Restore, TopicGroup, FLOOR_DROP_TICKS,
    FLOOR_RELAX_TICKS,
};
pub use journal::{JournaledLog, Pending, Recovered};
pub use raft;
pub use raft::eraftpb::Message as RaftMessage;
pub use store::{LogStore, MemLog};
