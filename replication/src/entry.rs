//! The entries of a topic's replicated log and their binary encoding.
//!
//! One entry is what the topic's owner applies at one Raft index: a batch of published
//! messages (PUB, MPUB, DPUB) or one channel operation (FIN, REQ, an attempt, a cursor
//! move, channel creation or deletion, pause). Every replica applies the same entries in
//! the same order, so its topic log and channel state end up the same as the leader's.
//!
//! # Encoding (version 1)
//!
//! All integers are little-endian. An entry is
//!
//! ```text
//! version u8 (= 1) | tag u8 | fields of the tag
//! ```
//!
//! with no trailing bytes. Variable-length fields are length-prefixed: a channel name is
//! `len u16 | UTF-8 bytes` (at most [`MAX_NAME_LEN`] bytes, nsqd's limit on topic and
//! channel names), a message body is `len u32 | bytes`, a batch is `count u32 | messages`.
//! A message is `id [16] | timestamp_ns u64 | attempts u16 | defer_ms u32 | body`.
//!
//! | tag | entry | fields |
//! |-----|-------|--------|
//! | 1 | [`Entry::Publish`] | batch |
//! | 2 | [`ChannelOp::Create`] | channel |
//! | 3 | [`ChannelOp::Delete`] | channel |
//! | 4 | [`ChannelOp::Fin`] | channel, id |
//! | 5 | [`ChannelOp::Req`] | channel, id, delay_ms u32 |
//! | 6 | [`ChannelOp::Attempt`] | channel, id, attempts u16 |
//! | 7 | [`ChannelOp::Cursor`] | channel, offset u64 |
//! | 8 | [`ChannelOp::Empty`] | channel |
//! | 9 | [`ChannelOp::Pause`] | channel, paused u8 (0 or 1) |
//! | 10 | [`Entry::TopicPause`] | paused u8 (0 or 1) |
//! | 11 | [`Entry::Compact`] | index u64 |
//! | 13 | [`Entry::PublishAt`] | base u64, batch |
//! | 12 | [`ChannelOp::Position`] | channel, cursor u64, count u32, (offset u64, attempts u16, due_unix_ns i64) × count |
//! | 14 | [`Entry::TopicDelete`] | (none) |
//! | 15 | [`Entry::TopicCreate`] | (none) |
//! | 19 | [`ChannelOp::SendWhole`] | channel |
//! | 18 | [`ChannelOp::Changes`] | channel, cursor u64, low u64, count u32, offset u64 × count, count u32, (offset u64, attempts u16, due_unix_ns i64) × count |
//!
//! # A publish in a Raft entry
//!
//! The leader proposes a numbered batch ([`Entry::PublishAt`]) split over the Raft
//! entry's two fields ([`Entry::encode_raft`]), so that the bodies need not be copied:
//!
//! ```text
//! context: version u8 (= 1) | tag u8 (= 16) | base u64 | count u32
//!          | (id [16] | timestamp_ns u64 | attempts u16 | defer_ms u32) × count
//! data:    (len u32 big-endian | body) × count
//! ```
//!
//! `data` is laid out as the message part of nsqd's MPUB and PUB frames (each body after
//! its big-endian size), so a batch that came in one such frame is proposed with the
//! frame's own bytes as its data. A batch forwarded to the leader ([`Entry::Publish`])
//! travels split the same way, with tag 17 and no `base`. Every other entry has an empty
//! context and the encoding above in its data; [`Entry::decode_raft`] reads both.
//!
//! Decoding reads bytes that came from the network or a disk: it never panics and
//! allocates no more than the input's length; a bad entry is a [`DecodeError`].

use std::fmt;

/// The encoding version this crate writes and reads (the first byte of an entry).
pub const ENTRY_VERSION: u8 = 1;

/// The longest channel name the encoding carries, in bytes (nsqd's names are at most 64
/// bytes; the encoding allows 255 so that a longer limit needs no new version).
pub const MAX_NAME_LEN: usize = 255;

/// A message id as nsqd writes it: 16 bytes (hex digits of a GUID).
pub type MessageId = [u8; 16];

/// One published message as the leader assigned it: every replica stores the same id,
/// timestamp and body, so a consumer that fails over sees the same message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The id the leader gave it.
    pub id: MessageId,
    /// When the leader accepted it, in nanoseconds since the Unix epoch (nsqd's
    /// `Message.Timestamp`).
    pub timestamp_ns: u64,
    /// Delivery attempts so far (0 when published).
    pub attempts: u16,
    /// DPUB's delay in milliseconds (0: deliver at once).
    pub defer_ms: u32,
    /// The body as the producer sent it (a slice of the entry's bytes once decoded with
    /// [`Entry::decode_shared`]).
    pub body: bytes::Bytes,
}

/// An operation on one channel of the topic; each replica applies it to its copy of the
/// channel so that, after a failover, consumers get every message not yet FINished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChannelOp {
    /// The channel was created (a SUB or `/channel/create`).
    Create,
    /// The channel was deleted with its state.
    Delete,
    /// FIN: the message is done and is never delivered again.
    Fin {
        /// The message.
        id: MessageId,
    },
    /// REQ: the message goes back to the queue after `delay_ms` milliseconds.
    Req {
        /// The message.
        id: MessageId,
        /// The requeue delay in milliseconds (0: at once).
        delay_ms: u32,
    },
    /// The message was delivered: its attempts count is now `attempts`.
    Attempt {
        /// The message.
        id: MessageId,
        /// The count after this delivery.
        attempts: u16,
    },
    /// The channel's cursor moved: every message of the topic log below `offset` is done
    /// for this channel (a compact form of many FINs).
    Cursor {
        /// The offset in the topic log.
        offset: u64,
    },
    /// `/channel/empty`: every queued and in-flight message of the channel is dropped.
    Empty,
    /// The channel's whole delivery state: its cursor in the topic log and every
    /// message it holds unfinished (in flight, requeued, deferred), by offset; the rest
    /// below the cursor is finished (FINs, REQs with their delays and attempts at once).
    Position {
        /// The next offset the channel reads.
        cursor: u64,
        /// The unfinished messages.
        pending: Vec<PendingMessage>,
    },
    /// `/channel/pause` (`true`) or `/channel/unpause` (`false`).
    Pause(bool),
    /// What changed in the channel's delivery state since the leader's previous
    /// [`ChannelOp::Position`] or `Changes` of it: a channel holding too many unfinished
    /// messages to send them all each round sends only these. A replica that holds the
    /// previous state applies them to it; one that does not (it restarted, or never had
    /// a whole position) keeps everything from `low` on unfinished.
    Changes {
        /// The next offset the channel reads.
        cursor: u64,
        /// Every offset below it is finished (the leader's low watermark).
        low: u64,
        /// Messages finished since (FIN, dead-lettered).
        finished: Vec<u64>,
        /// Messages whose state changed since (delivered, requeued, deferred), as they
        /// are now.
        pending: Vec<PendingMessage>,
    },
    /// A replica asks the leader for the channel's whole state ([`ChannelOp::Position`])
    /// at its next round: it holds no state that [`ChannelOp::Changes`] apply to (it
    /// restarted, or restored a snapshot). Only the leader acts on it.
    SendWhole,
}

/// A message a channel holds unfinished ([`ChannelOp::Position`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingMessage {
    /// Its offset in the topic log.
    pub offset: u64,
    /// Deliveries so far.
    pub attempts: u16,
    /// When a deferred or requeued-with-delay message is due, in Unix ns (0: now).
    pub due_unix_ns: i64,
}

/// Bytes one [`PendingMessage`] takes in an entry.
const PENDING_LEN: usize = 18;

/// One entry of a topic's replicated log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A batch of published messages, appended to the topic log in this order.
    Publish(Vec<Message>),
    /// A batch as [`Entry::Publish`] whose first message takes sequence `base` in the
    /// topic's log, as the leader numbers it: a replica whose log ends below `base`
    /// steps to it (a hole: nothing is there on any replica), and one whose log already
    /// reaches past a message's sequence holds it. Every replica thereby numbers the
    /// topic's log alike, which a channel position replicated as a sequence needs.
    PublishAt {
        /// The sequence of the first message.
        base: u64,
        /// The messages.
        messages: Vec<Message>,
    },
    /// An operation on one channel.
    Channel {
        /// The channel's name.
        channel: String,
        /// What happens to it.
        op: ChannelOp,
    },
    /// `/topic/pause` (`true`) or `/topic/unpause` (`false`).
    TopicPause(bool),
    /// `/topic/delete`: every replica deletes the topic (its channels, consumers and
    /// files) here in the log; the group lives on, so a later publish or
    /// [`Entry::TopicCreate`] makes the topic again on every replica.
    TopicDelete,
    /// `/topic/create` of a topic deleted through the log ([`Entry::TopicDelete`]).
    TopicCreate,
    /// The leader's word that every replica holds the entries up to `index` safely
    /// (durably, as far as it can tell): a replica may drop them from its Raft log.
    Compact {
        /// The highest Raft index that may be dropped.
        index: u64,
    },
}

/// Why bytes are not an entry (or a framed Raft message, see [`crate::wire`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ended inside a field.
    Truncated,
    /// The first byte is a version this build does not read.
    Version(u8),
    /// The tag byte names no entry.
    Tag(u8),
    /// A name longer than [`MAX_NAME_LEN`] or not UTF-8.
    Name,
    /// A boolean byte that is neither 0 nor 1.
    Bool(u8),
    /// Bytes left after the entry.
    Trailing(usize),
    /// A framed Raft message whose protobuf does not parse.
    Protobuf,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => write!(f, "input ends inside a field"),
            Self::Version(v) => write!(f, "unknown encoding version {v}"),
            Self::Tag(t) => write!(f, "unknown entry tag {t}"),
            Self::Name => write!(f, "channel name too long or not UTF-8"),
            Self::Bool(b) => write!(f, "boolean byte {b} is neither 0 nor 1"),
            Self::Trailing(n) => write!(f, "{n} bytes after the end"),
            Self::Protobuf => write!(f, "Raft message does not parse"),
        }
    }
}

impl std::error::Error for DecodeError {}

const TAG_PUBLISH: u8 = 1;
const TAG_CREATE: u8 = 2;
const TAG_DELETE: u8 = 3;
const TAG_FIN: u8 = 4;
const TAG_REQ: u8 = 5;
const TAG_ATTEMPT: u8 = 6;
const TAG_CURSOR: u8 = 7;
const TAG_EMPTY: u8 = 8;
const TAG_PAUSE: u8 = 9;
const TAG_TOPIC_PAUSE: u8 = 10;
const TAG_COMPACT: u8 = 11;
const TAG_POSITION: u8 = 12;
const TAG_PUBLISH_AT: u8 = 13;
const TAG_TOPIC_DELETE: u8 = 14;
const TAG_TOPIC_CREATE: u8 = 15;
const TAG_PUBLISH_AT_SPLIT: u8 = 16;
const TAG_PUBLISH_SPLIT: u8 = 17;
const TAG_CHANGES: u8 = 18;
const TAG_SEND_WHOLE: u8 = 19;

/// Bytes of a message before its body: id, timestamp, attempts, defer, body length.
const MESSAGE_HEADER: usize = 16 + 8 + 2 + 4 + 4;

/// Bytes of a message's fields in a split publish's context: id, timestamp, attempts,
/// defer (its body's length is in the data).
const SPLIT_META: usize = 16 + 8 + 2 + 4;

impl Entry {
    /// The entry's bytes (the format in the [module docs](self)).
    ///
    /// Never panics. Within nsqd's limits the encoding is exact; a channel name over
    /// [`MAX_NAME_LEN`] bytes, a body over 4 GiB or more than 2³² messages in a batch are
    /// cut at the length field's width, so callers check names and sizes first (nsqd
    /// already refuses such names and bodies before a publish reaches the shard).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len_hint());
        out.push(ENTRY_VERSION);
        match self {
            Self::Publish(batch) => {
                out.push(TAG_PUBLISH);
                encode_batch(&mut out, batch);
            }
            Self::PublishAt { base, messages } => {
                out.push(TAG_PUBLISH_AT);
                out.extend_from_slice(&base.to_le_bytes());
                encode_batch(&mut out, messages);
            }
            Self::Channel { channel, op } => encode_channel_op(&mut out, channel, op),
            Self::TopicPause(paused) => {
                out.push(TAG_TOPIC_PAUSE);
                out.push(u8::from(*paused));
            }
            Self::Compact { index } => {
                out.push(TAG_COMPACT);
                out.extend_from_slice(&index.to_le_bytes());
            }
            Self::TopicDelete => out.push(TAG_TOPIC_DELETE),
            Self::TopicCreate => out.push(TAG_TOPIC_CREATE),
        }
        out
    }

    fn encoded_len_hint(&self) -> usize {
        match self {
            Self::Publish(batch)
            | Self::PublishAt {
                messages: batch, ..
            } => {
                14 + batch
                    .iter()
                    .map(|m| MESSAGE_HEADER + m.body.len())
                    .sum::<usize>()
            }
            Self::Channel {
                channel,
                op: ChannelOp::Position { pending, .. },
            } => 2 + 2 + channel.len() + 12 + PENDING_LEN * pending.len(),
            Self::Channel {
                channel,
                op: ChannelOp::Changes {
                    finished, pending, ..
                },
            } => 2 + 2 + channel.len() + 24 + 8 * finished.len() + PENDING_LEN * pending.len(),
            Self::Channel { channel, .. } => 2 + 2 + channel.len() + 16 + 8,
            Self::TopicPause(_) => 3,
            Self::TopicDelete | Self::TopicCreate => 2,
            Self::Compact { .. } => 10,
        }
    }

    /// Parses an entry written by [`Entry::encode`]: the whole of `bytes`, no more and no
    /// less.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] for any input that is not exactly one version-1 entry.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_from(bytes, None)
    }

    /// [`Entry::decode`] of an entry held in shared `bytes` (a Raft entry's data): the
    /// message bodies are slices of it, not copies.
    ///
    /// # Errors
    ///
    /// As [`Entry::decode`].
    pub fn decode_shared(bytes: &bytes::Bytes) -> Result<Self, DecodeError> {
        Self::decode_from(bytes, Some(bytes))
    }

    /// The entry as a Raft entry's `(context, data)`: a batch ([`Entry::PublishAt`],
    /// [`Entry::Publish`]) split as the [module docs](self#a-publish-in-a-raft-entry)
    /// show, every other entry `(empty, `[`Entry::encode`]`)`.
    ///
    /// `wire`, when given, is the bytes the batch's bodies are slices of, laid out as
    /// the data is (the message part of the MPUB or PUB frame they came in): if every
    /// body is the slice of `wire` after its size and nothing else is in it, `wire` is
    /// the data itself and no body is copied. Otherwise the data is built by copying.
    /// Never panics; lengths are cut as [`Entry::encode`] cuts them.
    #[must_use]
    pub fn encode_raft(&self, wire: Option<&bytes::Bytes>) -> (Vec<u8>, bytes::Bytes) {
        let (base, messages) = match self {
            Self::PublishAt { base, messages } => (Some(base), messages),
            Self::Publish(messages) => (None, messages),
            _ => return (Vec::new(), self.encode().into()),
        };
        let mut context = Vec::with_capacity(14 + SPLIT_META * messages.len());
        context.push(ENTRY_VERSION);
        match base {
            Some(base) => {
                context.push(TAG_PUBLISH_AT_SPLIT);
                context.extend_from_slice(&base.to_le_bytes());
            }
            None => context.push(TAG_PUBLISH_SPLIT),
        }
        put_u32(&mut context, messages.len());
        for m in messages {
            put_fields(&mut context, m);
        }
        let data = match wire {
            Some(w) if wire_holds(w, messages) => w.clone(),
            _ => {
                let len = messages.iter().map(|m| 4 + m.body.len()).sum();
                let mut data = Vec::with_capacity(len);
                for m in messages {
                    let size = u32::try_from(m.body.len()).unwrap_or(u32::MAX);
                    data.extend_from_slice(&size.to_be_bytes());
                    data.extend_from_slice(&m.body);
                }
                data.into()
            }
        };
        (context, data)
    }

    /// Parses a Raft entry's `(context, data)` written by [`Entry::encode_raft`] (or an
    /// empty context and [`Entry::encode`]'s bytes); bodies are slices of `data`.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] unless the two fields are exactly one entry: a context whose
    /// tag is not a split publish, a count that the context or the data does not hold,
    /// or bytes left in either.
    pub fn decode_raft(context: &[u8], data: &bytes::Bytes) -> Result<Self, DecodeError> {
        if context.is_empty() {
            return Self::decode_shared(data);
        }
        let mut c = Reader(context);
        let version = c.u8()?;
        if version != ENTRY_VERSION {
            return Err(DecodeError::Version(version));
        }
        let base = match c.u8()? {
            TAG_PUBLISH_AT_SPLIT => Some(c.u64()?),
            TAG_PUBLISH_SPLIT => None,
            other => return Err(DecodeError::Tag(other)),
        };
        let count = c.u32()? as usize;
        // Refused before anything is allocated: each message takes SPLIT_META bytes of
        // the context and at least 4 of the data.
        if count > c.0.len() / SPLIT_META || count > data.len() / 4 {
            return Err(DecodeError::Truncated);
        }
        let mut d = Reader(data);
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            let fields = c.fields()?;
            let len = u32::from_be_bytes(d.array()?) as usize;
            let at = data.len() - d.0.len();
            d.take(len)?;
            messages.push(fields.with_body(data.slice(at..at + len)));
        }
        match (c.0.len(), d.0.len(), base) {
            (0, 0, Some(base)) => Ok(Self::PublishAt { base, messages }),
            (0, 0, None) => Ok(Self::Publish(messages)),
            (0, n, _) | (n, _, _) => Err(DecodeError::Trailing(n)),
        }
    }

    fn decode_from(bytes: &[u8], shared: Option<&bytes::Bytes>) -> Result<Self, DecodeError> {
        let mut r = Reader(bytes);
        let version = r.u8()?;
        if version != ENTRY_VERSION {
            return Err(DecodeError::Version(version));
        }
        let tag = r.u8()?;
        let entry = match tag {
            TAG_PUBLISH => Self::Publish(decode_batch(&mut r, bytes, shared)?),
            TAG_PUBLISH_AT => {
                let base = r.u64()?;
                Self::PublishAt {
                    base,
                    messages: decode_batch(&mut r, bytes, shared)?,
                }
            }
            TAG_TOPIC_PAUSE => Self::TopicPause(r.bool()?),
            TAG_COMPACT => Self::Compact { index: r.u64()? },
            TAG_TOPIC_DELETE => Self::TopicDelete,
            TAG_TOPIC_CREATE => Self::TopicCreate,
            TAG_CREATE..=TAG_PAUSE | TAG_POSITION | TAG_CHANGES | TAG_SEND_WHOLE => {
                let channel = r.name()?;
                let op = decode_channel_op(tag, &mut r)?;
                Self::Channel { channel, op }
            }
            other => return Err(DecodeError::Tag(other)),
        };
        if r.0.is_empty() {
            Ok(entry)
        } else {
            Err(DecodeError::Trailing(r.0.len()))
        }
    }
}

/// Whether `wire` is exactly the split data of `messages`: each body the slice of it
/// after its big-endian size, one after another, and nothing after the last.
fn wire_holds(wire: &[u8], messages: &[Message]) -> bool {
    let mut at = 0usize;
    for m in messages {
        let Ok(size) = u32::try_from(m.body.len()) else {
            return false;
        };
        let Some(end) = at.checked_add(4 + m.body.len()) else {
            return false;
        };
        if wire.get(at..at + 4) != Some(&size.to_be_bytes()[..])
            || end > wire.len()
            || !std::ptr::eq(wire[at + 4..].as_ptr(), m.body.as_ptr())
        {
            return false;
        }
        at = end;
    }
    at == wire.len()
}

fn encode_batch(out: &mut Vec<u8>, batch: &[Message]) {
    put_u32(out, batch.len());
    for m in batch {
        put_fields(out, m);
        put_u32(out, m.body.len());
        out.extend_from_slice(&m.body);
    }
}

/// A batch from `r`, which reads `bytes` (the whole entry); bodies are slices of
/// `shared` when given (the same bytes), copies otherwise.
fn decode_batch(
    r: &mut Reader<'_>,
    bytes: &[u8],
    shared: Option<&bytes::Bytes>,
) -> Result<Vec<Message>, DecodeError> {
    let count = r.u32()? as usize;
    // Every message takes at least MESSAGE_HEADER bytes: a count the input cannot hold
    // is refused before anything is allocated for it.
    if count > r.0.len() / MESSAGE_HEADER {
        return Err(DecodeError::Truncated);
    }
    let mut batch = Vec::with_capacity(count);
    for _ in 0..count {
        let fields = r.fields()?;
        let len = r.u32()? as usize;
        let at = bytes.len() - r.0.len();
        let slice = r.take(len)?;
        let body = match shared {
            Some(b) => b.slice(at..at + len),
            None => bytes::Bytes::copy_from_slice(slice),
        };
        batch.push(fields.with_body(body));
    }
    Ok(batch)
}

fn encode_channel_op(out: &mut Vec<u8>, channel: &str, op: &ChannelOp) {
    let tag = match op {
        ChannelOp::Create => TAG_CREATE,
        ChannelOp::Delete => TAG_DELETE,
        ChannelOp::Fin { .. } => TAG_FIN,
        ChannelOp::Req { .. } => TAG_REQ,
        ChannelOp::Attempt { .. } => TAG_ATTEMPT,
        ChannelOp::Cursor { .. } => TAG_CURSOR,
        ChannelOp::Empty => TAG_EMPTY,
        ChannelOp::Pause(_) => TAG_PAUSE,
        ChannelOp::Position { .. } => TAG_POSITION,
        ChannelOp::Changes { .. } => TAG_CHANGES,
        ChannelOp::SendWhole => TAG_SEND_WHOLE,
    };
    out.push(tag);
    let name = channel.as_bytes();
    let len = name.len().min(MAX_NAME_LEN);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&name[..len]);
    match op {
        ChannelOp::Create | ChannelOp::Delete | ChannelOp::Empty | ChannelOp::SendWhole => {}
        ChannelOp::Fin { id } => out.extend_from_slice(id),
        ChannelOp::Req { id, delay_ms } => {
            out.extend_from_slice(id);
            out.extend_from_slice(&delay_ms.to_le_bytes());
        }
        ChannelOp::Attempt { id, attempts } => {
            out.extend_from_slice(id);
            out.extend_from_slice(&attempts.to_le_bytes());
        }
        ChannelOp::Cursor { offset } => out.extend_from_slice(&offset.to_le_bytes()),
        ChannelOp::Pause(paused) => out.push(u8::from(*paused)),
        ChannelOp::Position { cursor, pending } => {
            out.extend_from_slice(&cursor.to_le_bytes());
            put_pending(out, pending);
        }
        ChannelOp::Changes {
            cursor,
            low,
            finished,
            pending,
        } => {
            out.extend_from_slice(&cursor.to_le_bytes());
            out.extend_from_slice(&low.to_le_bytes());
            put_u32(out, finished.len());
            for offset in finished {
                out.extend_from_slice(&offset.to_le_bytes());
            }
            put_pending(out, pending);
        }
    }
}

fn put_pending(out: &mut Vec<u8>, pending: &[PendingMessage]) {
    put_u32(out, pending.len());
    for p in pending {
        out.extend_from_slice(&p.offset.to_le_bytes());
        out.extend_from_slice(&p.attempts.to_le_bytes());
        out.extend_from_slice(&p.due_unix_ns.to_le_bytes());
    }
}

fn read_pending(r: &mut Reader<'_>) -> Result<Vec<PendingMessage>, DecodeError> {
    let count = r.u32()? as usize;
    if count > r.0.len() / PENDING_LEN {
        return Err(DecodeError::Truncated);
    }
    let mut pending = Vec::with_capacity(count);
    for _ in 0..count {
        pending.push(PendingMessage {
            offset: r.u64()?,
            attempts: r.u16()?,
            due_unix_ns: r.u64()? as i64,
        });
    }
    Ok(pending)
}

fn decode_channel_op(tag: u8, r: &mut Reader<'_>) -> Result<ChannelOp, DecodeError> {
    Ok(match tag {
        TAG_CREATE => ChannelOp::Create,
        TAG_DELETE => ChannelOp::Delete,
        TAG_FIN => ChannelOp::Fin { id: r.id()? },
        TAG_REQ => ChannelOp::Req {
            id: r.id()?,
            delay_ms: r.u32()?,
        },
        TAG_ATTEMPT => ChannelOp::Attempt {
            id: r.id()?,
            attempts: r.u16()?,
        },
        TAG_CURSOR => ChannelOp::Cursor { offset: r.u64()? },
        TAG_EMPTY => ChannelOp::Empty,
        TAG_PAUSE => ChannelOp::Pause(r.bool()?),
        TAG_SEND_WHOLE => ChannelOp::SendWhole,
        TAG_POSITION => ChannelOp::Position {
            cursor: r.u64()?,
            pending: read_pending(r)?,
        },
        TAG_CHANGES => {
            let cursor = r.u64()?;
            let low = r.u64()?;
            let count = r.u32()? as usize;
            if count > r.0.len() / 8 {
                return Err(DecodeError::Truncated);
            }
            let mut finished = Vec::with_capacity(count);
            for _ in 0..count {
                finished.push(r.u64()?);
            }
            ChannelOp::Changes {
                cursor,
                low,
                finished,
                pending: read_pending(r)?,
            }
        }
        other => return Err(DecodeError::Tag(other)),
    })
}

/// A message's fields before its body, as both publish encodings carry them.
struct Fields {
    id: MessageId,
    timestamp_ns: u64,
    attempts: u16,
    defer_ms: u32,
}

impl Fields {
    fn with_body(self, body: bytes::Bytes) -> Message {
        Message {
            id: self.id,
            timestamp_ns: self.timestamp_ns,
            attempts: self.attempts,
            defer_ms: self.defer_ms,
            body,
        }
    }
}

/// Appends a message's fields before its body: id, timestamp, attempts, defer
/// ([`Reader::fields`] reads them).
fn put_fields(out: &mut Vec<u8>, m: &Message) {
    out.extend_from_slice(&m.id);
    out.extend_from_slice(&m.timestamp_ns.to_le_bytes());
    out.extend_from_slice(&m.attempts.to_le_bytes());
    out.extend_from_slice(&m.defer_ms.to_le_bytes());
}

/// Appends `len` as a u32; lengths past u32 are cut (see [`Entry::encode`]).
fn put_u32(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
}

/// A cursor over input that fails with [`DecodeError::Truncated`] instead of panicking.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn id(&mut self) -> Result<MessageId, DecodeError> {
        self.array()
    }

    /// A message's fields as [`put_fields`] wrote them.
    fn fields(&mut self) -> Result<Fields, DecodeError> {
        Ok(Fields {
            id: self.id()?,
            timestamp_ns: self.u64()?,
            attempts: self.u16()?,
            defer_ms: self.u32()?,
        })
    }

    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::Bool(b)),
        }
    }

    fn name(&mut self) -> Result<String, DecodeError> {
        let len = usize::from(self.u16()?);
        if len > MAX_NAME_LEN {
            return Err(DecodeError::Name);
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Name)
    }
}
