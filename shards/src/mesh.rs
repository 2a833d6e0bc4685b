//! What one shard asks of the shard that owns a topic, in the terms of this crate:
//! admin operations ([`AdminOp`]) and their errors. The mesh's message enum
//! (`nsqd::mesh::ShardMsg`) is the root crate's: one of its messages is a connection
//! hand-off, with the socket and the TLS session, which this crate knows nothing of.

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
    /// `POST /channel/max-attempts` (beyond nsqd): the channel's own maximum attempts
    /// (`Some(0)`: unlimited) or `None` to follow `--max-attempts` again.
    ChannelMaxAttempts(String, String, Option<u16>),
    /// `POST /channel/rate-limit` (beyond nsqd): the channel's delivery rate in messages
    /// a second across its consumers (0 removes the limit).
    ChannelRateLimit(String, String, u32),
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
            | AdminOp::SeekChannel(t, _, _)
            | AdminOp::ChannelMaxAttempts(t, _, _)
            | AdminOp::ChannelRateLimit(t, _, _) => t,
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
    /// The node drains and the topic or channel to create does not exist (nsqd RFC
    /// nsqio/nsq#1302). HTTP 503 EXITING, the answer of nsqd's draining prototype
    /// (nsqio/nsq#1305) when it refuses to create one.
    Draining,
}
