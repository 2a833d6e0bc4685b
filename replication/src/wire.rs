//! The frames of the inter-broker connection: a greeting, Raft messages for a topic's
//! group, and proposals forwarded to a group's leader with their answers.
//!
//! ```text
//! frame   = len u32 LE (bytes after this field) | version u8 (= 4) | kind u8 | payload
//! kind 1  Hello   : node_id u16 | replica u64 | addr_len u8 | addr | tcp_len u8 | tcp
//! kind 2  Raft    : topic_len u8 | topic | eraftpb.Message (protobuf)
//! kind 3  Propose : request u64 | topic_len u8 | topic | entry (crate::entry encoding)
//! kind 4  Reply   : request u64 | status u8 | status fields
//!           status 0 Acked
//!           status 1 NotLeader : leader u64 (0: none known)
//!           status 2 Failed    : text_len u16 | text (UTF-8)
//!           status 3 Records   : the rest of the frame (a page of a topic's records,
//!                                in the application's encoding)
//! kind 5  Ping    : contact u64: the sender is alive, and its contact number for the
//!                   receiver (src/cluster/liveness.rs); every 100 ms on each connection
//! kind 6  Fetch   : request u64 | topic_len u8 | topic | from u64 | max_bytes u32: a
//!                   page of the topic's records from sequence `from`, answered by a
//!                   Reply (Records or Failed) with the same request
//! ```
//!
//! All integers are little-endian. A frame is at most [`MAX_FRAME_LEN`] bytes after the
//! length field; the receiver reads the length, refuses larger frames before buffering
//! them, then decodes. Decoding reads bytes from the network: it never panics, and a bad
//! frame is a [`DecodeError`] after which the connection is out of step and is closed.

use protobuf::Message as _;
use raft::eraftpb::Message as RaftMessage;

use crate::entry::{DecodeError, MAX_NAME_LEN};

/// The frame version this crate writes and reads.
pub const FRAME_VERSION: u8 = 4;

/// The largest frame, in bytes after the length field: a group's appends are cut at
/// `GroupConfig::max_size_per_msg` (1 MiB by default), nsqd's bodies at 1 MiB by
/// default, and a snapshot travels in one message, so the limit leaves room for both.
pub const MAX_FRAME_LEN: usize = 64 << 20;

/// The first frame each side of a connection sends: who it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's `--node-id` (unique in a cluster; the message IDs carry it).
    pub node_id: u16,
    /// The sender's replica id in every topic group.
    pub replica: u64,
    /// The sender's `--cluster-address`, as its peers list it in `--cluster-peer`.
    pub address: String,
    /// Where the sender's clients connect (its TCP address for protocol V2): a
    /// follower relays a consumer's session there.
    pub tcp: String,
}

/// How the leader answered a forwarded proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The entry is in the log of as many replicas as the ack policy asks.
    Acked,
    /// The receiver does not lead the topic's group; `leader` is the one it knows of
    /// (0: none known, an election is under way).
    NotLeader {
        /// The leader's replica id, or 0.
        leader: u64,
    },
    /// The proposal failed (the entry was replaced by another leader's, the group
    /// timed out, the topic cannot take it), or a fetch did; the text says why.
    Failed(String),
    /// The page of records a [`Frame::Fetch`] asked for, as the application encodes it.
    Records(Vec<u8>),
}

/// A decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// The greeting.
    Hello(Hello),
    /// A Raft message for `topic`'s group.
    Raft {
        /// The topic whose group the message is for.
        topic: String,
        /// The Raft message.
        message: RaftMessage,
    },
    /// An entry for `topic`'s leader to propose, answered by a [`Frame::Reply`] with the
    /// same `request`.
    Propose {
        /// The sender's number for this request.
        request: u64,
        /// The topic.
        topic: String,
        /// The entry, encoded ([`crate::Entry::encode`]); a publish's ids and timestamps
        /// are assigned again by the leader.
        entry: Vec<u8>,
    },
    /// A replica asks a member holding `topic` for a page of its records from sequence
    /// `from` (a backlog larger than a snapshot carries), answered by a
    /// [`Frame::Reply`] with the same `request`: [`Reply::Records`] or
    /// [`Reply::Failed`].
    Fetch {
        /// The sender's number for this request.
        request: u64,
        /// The topic.
        topic: String,
        /// The first sequence wanted.
        from: u64,
        /// About how many bytes of bodies the page may carry.
        max_bytes: u32,
    },
    /// The answer to a [`Frame::Propose`] or a [`Frame::Fetch`].
    Reply {
        /// The request answered.
        request: u64,
        /// The answer.
        reply: Reply,
    },
    /// The sender is alive (a peer that stops, a killed host or a stopped process, is
    /// noticed without a heartbeat per topic); `contact`: the sender's contact number for
    /// the receiver, so that both ends see when either lost touch.
    Ping {
        /// The sender's contact number for the receiver.
        contact: u64,
    },
}

/// Why a frame could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The topic name (or address) is empty or longer than [`MAX_NAME_LEN`] bytes.
    Topic,
    /// The frame would exceed [`MAX_FRAME_LEN`].
    TooLarge(usize),
    /// protobuf refused the message.
    Protobuf,
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Topic => write!(f, "topic name or address empty or too long"),
            Self::TooLarge(n) => write!(f, "frame of {n} bytes over the limit"),
            Self::Protobuf => write!(f, "Raft message does not serialise"),
        }
    }
}

impl std::error::Error for EncodeError {}

const KIND_HELLO: u8 = 1;
const KIND_RAFT: u8 = 2;
const KIND_PROPOSE: u8 = 3;
const KIND_REPLY: u8 = 4;
const KIND_PING: u8 = 5;
const KIND_FETCH: u8 = 6;

fn push_name(out: &mut Vec<u8>, name: &str) -> Result<(), EncodeError> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > MAX_NAME_LEN {
        return Err(EncodeError::Topic);
    }
    out.push(u8::try_from(b.len()).map_err(|_| EncodeError::Topic)?);
    out.extend_from_slice(b);
    Ok(())
}

/// Writes the length field in front of `out[4..]`, checking the limit.
fn finish(mut out: Vec<u8>) -> Result<Vec<u8>, EncodeError> {
    let len = out.len() - 4;
    if len > MAX_FRAME_LEN {
        return Err(EncodeError::TooLarge(len));
    }
    let n = u32::try_from(len).map_err(|_| EncodeError::TooLarge(len))?;
    out[..4].copy_from_slice(&n.to_le_bytes());
    Ok(out)
}

fn start(kind: u8, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + capacity);
    out.extend_from_slice(&[0, 0, 0, 0, FRAME_VERSION, kind]);
    out
}

/// Writes a [`Frame::Hello`].
///
/// # Errors
///
/// [`EncodeError::Topic`] for an empty or over-long address.
pub fn encode_hello(hello: &Hello) -> Result<Vec<u8>, EncodeError> {
    let mut out = start(KIND_HELLO, 12 + hello.address.len() + hello.tcp.len());
    out.extend_from_slice(&hello.node_id.to_le_bytes());
    out.extend_from_slice(&hello.replica.to_le_bytes());
    push_name(&mut out, &hello.address)?;
    push_name(&mut out, &hello.tcp)?;
    finish(out)
}

/// Writes a [`Frame::Raft`].
///
/// # Errors
///
/// [`EncodeError`] for a bad topic name, an oversized message or a protobuf failure.
pub fn encode_frame(topic: &str, message: &RaftMessage) -> Result<Vec<u8>, EncodeError> {
    // Written in place after the header: an append's entries are copied once. One
    // byte more than the frame takes: protobuf's final flush reserves one byte, which
    // on a full vector would reallocate (and copy) it at twice its size.
    let size = message.compute_size() as usize;
    let mut out = start(KIND_RAFT, 1 + topic.len() + size + 1);
    push_name(&mut out, topic)?;
    message
        .write_to_vec(&mut out)
        .map_err(|_| EncodeError::Protobuf)?;
    finish(out)
}

/// Writes a [`Frame::Propose`] of an encoded entry.
///
/// # Errors
///
/// [`EncodeError`] for a bad topic name or an oversized entry.
pub fn encode_propose(request: u64, topic: &str, entry: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = start(KIND_PROPOSE, 9 + topic.len() + entry.len());
    out.extend_from_slice(&request.to_le_bytes());
    push_name(&mut out, topic)?;
    out.extend_from_slice(entry);
    finish(out)
}

/// Writes a [`Frame::Fetch`].
///
/// # Errors
///
/// [`EncodeError::Topic`] for a bad topic name.
pub fn encode_fetch(
    request: u64,
    topic: &str,
    from: u64,
    max_bytes: u32,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = start(KIND_FETCH, 21 + topic.len());
    out.extend_from_slice(&request.to_le_bytes());
    push_name(&mut out, topic)?;
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&max_bytes.to_le_bytes());
    finish(out)
}

/// Writes a [`Frame::Ping`].
#[must_use]
pub fn encode_ping(contact: u64) -> Vec<u8> {
    let mut out = start(KIND_PING, 8);
    out.extend_from_slice(&contact.to_le_bytes());
    out[..4].copy_from_slice(&10u32.to_le_bytes());
    out
}

/// Writes a [`Frame::Reply`]; a `Failed` text is cut to 1,024 bytes (at a character
/// boundary).
///
/// # Errors
///
/// [`EncodeError::TooLarge`] for records over the frame limit.
pub fn encode_reply(request: u64, reply: &Reply) -> Result<Vec<u8>, EncodeError> {
    let records = match reply {
        Reply::Records(r) => r.len(),
        _ => 0,
    };
    let mut out = start(KIND_REPLY, 16 + records);
    out.extend_from_slice(&request.to_le_bytes());
    match reply {
        Reply::Acked => out.push(0),
        Reply::NotLeader { leader } => {
            out.push(1);
            out.extend_from_slice(&leader.to_le_bytes());
        }
        Reply::Failed(text) => {
            out.push(2);
            let mut cut = text.len().min(1024);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            out.extend_from_slice(&u16::try_from(cut).unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&text.as_bytes()[..cut]);
        }
        Reply::Records(r) => {
            out.push(3);
            out.extend_from_slice(r);
        }
    }
    finish(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let mut b = [0u8; 2];
        b.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(b))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn name(&mut self) -> Result<String, DecodeError> {
        let n = usize::from(self.u8()?);
        if n == 0 {
            return Err(DecodeError::Name);
        }
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Name)
    }
    fn text(&mut self) -> Result<String, DecodeError> {
        let n = usize::from(self.u16()?);
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Name)
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.0.len()))
        }
    }
}

/// Reads one frame from the start of `buf` (a connection's receive buffer).
///
/// Returns `Ok(None)` when `buf` does not hold the whole frame yet, or the frame and the
/// number of bytes it took.
///
/// # Errors
///
/// [`DecodeError::Truncated`] for a length over [`MAX_FRAME_LEN`] or too short for the
/// header (the connection should be closed: the stream is out of step), and the other
/// [`DecodeError`]s for a bad version, kind ([`DecodeError::Tag`]), name, status or
/// protobuf body.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(head) = buf.get(..4) else {
        return Ok(None);
    };
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(head);
    let len = usize::try_from(u32::from_le_bytes(len_bytes)).unwrap_or(usize::MAX);
    if !(2..=MAX_FRAME_LEN).contains(&len) {
        return Err(DecodeError::Truncated);
    }
    let Some(body) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    let mut r = Reader(body);
    let version = r.u8()?;
    if version != FRAME_VERSION {
        return Err(DecodeError::Version(version));
    }
    let frame = match r.u8()? {
        KIND_HELLO => {
            let node_id = r.u16()?;
            let replica = r.u64()?;
            let address = r.name()?;
            let tcp = r.name()?;
            r.end()?;
            Frame::Hello(Hello {
                node_id,
                replica,
                address,
                tcp,
            })
        }
        KIND_RAFT => {
            let topic = r.name()?;
            let message = RaftMessage::parse_from_bytes(r.0).map_err(|_| DecodeError::Protobuf)?;
            Frame::Raft { topic, message }
        }
        KIND_PROPOSE => {
            let request = r.u64()?;
            let topic = r.name()?;
            Frame::Propose {
                request,
                topic,
                entry: r.0.to_vec(),
            }
        }
        KIND_REPLY => {
            let request = r.u64()?;
            let reply = match r.u8()? {
                0 => Reply::Acked,
                1 => Reply::NotLeader { leader: r.u64()? },
                2 => Reply::Failed(r.text()?),
                3 => Reply::Records(std::mem::take(&mut r.0).to_vec()),
                s => return Err(DecodeError::Tag(s)),
            };
            r.end()?;
            Frame::Reply { request, reply }
        }
        KIND_FETCH => {
            let request = r.u64()?;
            let topic = r.name()?;
            let from = r.u64()?;
            let max_bytes = r.u32()?;
            r.end()?;
            Frame::Fetch {
                request,
                topic,
                from,
                max_bytes,
            }
        }
        KIND_PING => {
            let contact = r.u64()?;
            r.end()?;
            Frame::Ping { contact }
        }
        k => return Err(DecodeError::Tag(k)),
    };
    Ok(Some((frame, 4 + len)))
}
