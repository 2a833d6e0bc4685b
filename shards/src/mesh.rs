//! Requests shards send each other over the glommio channel mesh. Each variant that
//! expects an answer carries a oneshot sender; nothing else crosses threads.

use crate::client::ClientSnapshot;
use crate::stats::{ShardStats, StatsRequest};
use crate::topic::PublishError;
use bytes::Bytes;
use futures::channel::oneshot;
use std::os::fd::OwnedFd;
use std::time::Instant;

/// A connection moving to the shard that owns the topic it is about to SUB (or PUB) to:
/// the socket, the negotiated client state and every byte read but not yet processed
/// (the command that caused the move comes first).
pub struct HandOff {
    pub fd: OwnedFd,
    pub client: ClientSnapshot,
    pub pending: Vec<u8>,
    /// Received bytes not yet decoded (an incomplete snappy chunk).
    pub pending_raw: Vec<u8>,
    /// With deflate: the last 32 KiB inflated (the client's deflate window).
    pub inflate_history: Vec<u8>,
    /// The connection's TLS session (a `rustls::ServerConnection`, which is `Send`), so a
    /// TLS connection continues on the new shard mid-stream. Typed `Any` to keep this
    /// crate free of the TLS library.
    pub tls: Option<Box<dyn std::any::Any + Send>>,
    /// How many bytes past the start of `pending` a Go nsqd would have read from the
    /// socket by now (its 16 KiB read buffer), when known: what decides whether a fatal
    /// error's close is a reset.
    pub read_ahead: Option<usize>,
}

/// Admin operations that must run on the topic's owner (HTTP API, nsqd: http.go).
#[derive(Clone, Debug)]
pub enum AdminOp {
    CreateTopic(String),
    DeleteTopic(String),
    EmptyTopic(String),
    PauseTopic(String, bool),
    CreateChannel(String, String),
    DeleteChannel(String, String),
    EmptyChannel(String, String),
    PauseChannel(String, String, bool),
    /// `POST /channel/seek` (beyond nsqd): move a channel's cursor (see
    /// `Shard::seek_channel`). Runs on its own task on the owner: it may read the disk.
    SeekChannel(String, String, SeekTo),
}

impl AdminOp {
    /// The topic the operation is about (its owner shard runs it).
    pub fn topic(&self) -> &str {
        match self {
            AdminOp::CreateTopic(t)
            | AdminOp::DeleteTopic(t)
            | AdminOp::EmptyTopic(t)
            | AdminOp::PauseTopic(t, _)
            | AdminOp::CreateChannel(t, _)
            | AdminOp::DeleteChannel(t, _)
            | AdminOp::EmptyChannel(t, _)
            | AdminOp::PauseChannel(t, _, _)
            | AdminOp::SeekChannel(t, _, _) => t,
        }
    }
}

/// Where `POST /channel/seek` moves a channel's cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTo {
    /// The oldest message still retained (on disk or in memory).
    Oldest,
    /// After the newest message the channel was given: only new messages follow.
    Newest,
    /// The first retained message published at or after this time (Unix ns).
    Timestamp(i64),
}

/// Why an admin operation failed, as nsqd's HTTP error texts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminError {
    TopicNotFound,
    ChannelNotFound,
    /// A disk read failed (channel seek); logged on the owner shard. HTTP 500
    /// INTERNAL_ERROR.
    Internal,
    /// The owner shard could not take or answer the operation (it is shutting down:
    /// its mesh queue is closed or it dropped the reply). HTTP 503 EXITING, nsqd's
    /// answer to a request that comes while it exits.
    Exiting,
}

pub enum ShardMsg {
    /// Publish to a topic this shard owns; answered once the messages are in the log.
    Publish {
        topic: String,
        bodies: Vec<Bytes>,
        defer_until: Option<Instant>,
        reply: oneshot::Sender<Result<(), PublishError>>,
    },
    HandOff(Box<HandOff>),
    Stats {
        req: StatsRequest,
        reply: oneshot::Sender<ShardStats>,
    },
    Admin {
        op: AdminOp,
        reply: oneshot::Sender<Result<(), AdminError>>,
    },
    /// Registration changes for shard 0, which owns the nsqlookupd connections.
    Lookup(Vec<crate::shard::LookupEvent>),
    /// To shard 0, which owns the node-wide settings: make this change on every shard;
    /// answered once every shard has it (see [`crate::node`]).
    NodeChange {
        update: crate::node::NodeUpdate,
        reply: oneshot::Sender<()>,
    },
    /// From shard 0: apply this change to this shard's copy of the node-wide settings;
    /// answered once applied.
    NodeApply {
        update: crate::node::NodeUpdate,
        reply: oneshot::Sender<()>,
    },
}
