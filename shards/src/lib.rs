//! The broker core of the thread-per-core nsqd: shard runtime state ([`shard`]), topic
//! ownership by hash ([`owner_of`]), topics ([`topic`]: the in-memory log and its pump),
//! channels with their in-flight and deferred heaps ([`channel`]), the per-shard timer
//! heap ([`timers`]), the subscribed clients' shard-side handles with their AUTH state
//! ([`client`], [`auth`]), recovery, checkpoints, retention and the hand-over of records
//! to the segment store ([`persist`], over `nsq-storage`), the node-wide run-time
//! settings ([`node`]), stats ([`stats`], e2e latency quantiles in [`quantile`]), the
//! admin operations shards ask of each other over the channel mesh ([`mesh`]),
//! topology-aware delivery ([`topology`]), and per channel its dead letters and rate
//! limit. For a replicated topic the core also takes a batch at the leader's IDs and
//! sequences, a channel's position from the leader and a snapshot of the leader's
//! unfinished records (`topic::replica`, the shard's `replica` methods); the Raft side
//! is the root crate's `cluster`.
//!
//! Nothing here parses bytes from a socket (the protocol codecs are in the runtime-free
//! `nsq-wire` crate; the root crate's connections call them) and nothing here is shared
//! between threads except what the mesh carries (the [`mesh`] operations, stats,
//! client snapshots), which moves by value.

#![forbid(unsafe_code)]

pub mod auth;
pub mod channel;
pub mod client;
pub mod delivery_gate;
pub mod mesh;
pub mod message;
/// Topic and channel name rules, from the wire crate.
pub use nsq_wire::names;
pub mod node;
pub mod options;
pub mod persist;
pub mod quantile;
pub mod seqset;
pub mod shard;
pub mod stats;
pub mod timers;
pub mod topic;
pub mod topology;
pub mod wake;
pub mod wire;

pub use channel::Channel;
pub use client::{Client, ClientState};
pub use message::{Message, MessageId};
pub use options::Options;
pub use shard::{owner_of, Shard};
pub use topic::Topic;

thread_local! {
    /// Body bytes this shard's thread let go in bulk since the last
    /// [`take_memory_freed`] (a topic or channel deleted, read-ahead dropped).
    static FREED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `bytes` of message bodies freed on the calling shard: the broker's memory task
/// returns freed heap to the OS once enough has been (glibc keeps it otherwise).
pub(crate) fn memory_freed(bytes: usize) {
    if bytes > 0 {
        FREED.with(|f| f.set(f.get().saturating_add(bytes as u64)));
    }
}

/// Body bytes freed on the calling shard since the last call (and resets the count).
pub fn take_memory_freed() -> u64 {
    FREED.with(|f| f.replace(0))
}
