//! The frames of the inter-broker connection: a greeting, Raft messages for a topic's
//! group, and proposals forwarded to a group's leader with their answers.
//!
//! ```text
//! frame   = len u32 LE (bytes after this field) | version u8 (= 8) | kind u8 | payload
//! kind 1  Hello   : node_id u16 | replica u64 | addr_len u8 | addr | tcp_len u8 | tcp |
//!                   members u32 (a digest of the sender's member list)
//! kind 2  Raft    : topic_len u8 | topic | eraftpb.Message (protobuf)
//! kind 3  Propose : request u64 | topic_len u8 | topic | context_len u32 | context | data
//!                   (an entry as crate::Entry::encode_raft splits it)
//! kind 4  Reply   : request u64 | status u8 | status fields
//!           status 0 Acked
//!           status 1 NotLeader : leader u64 (0: none known)
//!           status 2 Failed    : text_len u16 | text (UTF-8)
//!           status 3 Records   : the rest of the frame (a page of a topic's records,
//!                                in the application's encoding)
//! kind 5  Ping    : contact u64 | sent u64 | echo u64: the sender is alive, its contact
//!                   number for the receiver, the sender's clock (ms) as it wrote the
//!                   ping, and the latest `sent` it read from the receiver (0: none);
//!                   every 50 ms on each connection (src/cluster/liveness.rs)
//! kind 6  Fetch   : request u64 | topic_len u8 | topic | from u64 | max_bytes u32: a
//!                   page of the topic's records from sequence `from`, answered by a
//!                   Reply (Records or Failed) with the same request
//! ```
//!
//! All integers are little-endian. A frame is at most [`MAX_FRAME_LEN`] bytes after the
//! length field; the receiver reads the length, refuses larger frames before buffering
//! them, then decodes. Decoding reads bytes from the network: it never panics, and a bad
//! frame is a [`DecodeError`] after which the connection is out of step and is closed.

use bytes::Bytes;
use protobuf::Message as _;
use raft::eraftpb::{Entry as RaftEntry, Message as RaftMessage};

use crate::entry::{DecodeError, MAX_NAME_LEN};

/// The frame version this crate writes and reads.
pub const FRAME_VERSION: u8 = 8;

/// The largest frame, in bytes after the length field: a group's appends are cut at
/// `GroupConfig::max_size_per_msg` (1 MiB by default), nsqd's bodies at 1 MiB by
/// default, and a snapshot travels in one message, so the limit leaves room for both.
pub const MAX_FRAME_LEN: usize = 64 << 20;

/// The least data a Raft entry carries for [`encode_frame`] to leave it in the entry's
/// own buffer, written from there ([`OutFrame`]), and for [`decode_frame_shared`] to
/// keep it as a slice of the frame read: a publish's bodies are then copied neither per
/// follower on the leader nor out of the receive buffer on a follower. Smaller data is
/// copied: that costs less than another piece to write, and a slice of a few bytes
/// would keep a whole receive buffer alive while the entry is in the Raft log.
pub const SHARE_MIN: usize = 4 << 10;

/// A frame ready to write: its bytes, with buffers that are not copied into them
/// (the data of a Raft append's large entries) inserted at given offsets. A link
/// writes the pieces with one vectored send; [`OutFrame::to_vec`] gives them as one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutFrame {
    bytes: Vec<u8>,
    /// (offset in `bytes`, buffer that goes there), offsets ascending.
    shared: Vec<(usize, Bytes)>,
    len: usize,
}

impl OutFrame {
    /// The frame's length in bytes, its length field included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a frame of no bytes (never one this module encodes).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f` with each piece of the frame in the order they go on the wire; the
    /// pieces together are the frame.
    pub fn pieces<'a>(&'a self, mut f: impl FnMut(&'a [u8])) {
        let mut at = 0;
        for (offset, data) in &self.shared {
            if *offset > at {
                f(&self.bytes[at..*offset]);
            }
            f(data);
            at = *offset;
        }
        if at < self.bytes.len() {
            f(&self.bytes[at..]);
        }
    }

    /// The frame in one vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.pieces(|p| out.extend_from_slice(p));
        out
    }
}

impl From<Vec<u8>> for OutFrame {
    fn from(bytes: Vec<u8>) -> OutFrame {
        OutFrame {
            len: bytes.len(),
            bytes,
            shared: Vec::new(),
        }
    }
}

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
    /// A digest of the sender's members (its `--cluster-address` and
    /// `--cluster-peer` list, sorted): members whose lists differ place topics
    /// differently, which the receiver reports.
    pub members: u32,
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
        /// The entry's context, as [`crate::Entry::encode_raft`] splits it.
        context: Vec<u8>,
        /// The entry's data, as [`crate::Entry::encode_raft`] splits it (a slice of
        /// the frame when decoded with [`decode_frame_shared`]); a publish's ids and
        /// timestamps are assigned again by the leader.
        data: Bytes,
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
    /// the receiver, so that both ends see when either lost touch. `sent` and `echo`
    /// give a leader its delivery lease: the receiver sends `sent` back as `echo` in its
    /// own pings, which proves to the first sender that the receiver heard from it at or
    /// after that time.
    Ping {
        /// The sender's contact number for the receiver.
        contact: u64,
        /// The sender's clock when it wrote the ping, in milliseconds.
        sent: u64,
        /// The latest `sent` the sender read from the receiver (0: none since the
        /// receiver's connections last closed).
        echo: u64,
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
    let len = out.len();
    write_len(&mut out, len)?;
    Ok(out)
}

/// Writes the length field of a frame of `len` bytes (its length field included) into
/// `out[..4]`, checking the limit.
fn write_len(out: &mut [u8], len: usize) -> Result<(), EncodeError> {
    let body = len - 4;
    if body > MAX_FRAME_LEN {
        return Err(EncodeError::TooLarge(body));
    }
    let n = u32::try_from(body).map_err(|_| EncodeError::TooLarge(body))?;
    out[..4].copy_from_slice(&n.to_le_bytes());
    Ok(())
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
    let mut out = start(KIND_HELLO, 16 + hello.address.len() + hello.tcp.len());
    out.extend_from_slice(&hello.node_id.to_le_bytes());
    out.extend_from_slice(&hello.replica.to_le_bytes());
    push_name(&mut out, &hello.address)?;
    push_name(&mut out, &hello.tcp)?;
    out.extend_from_slice(&hello.members.to_le_bytes());
    finish(out)
}

/// Writes a [`Frame::Raft`]. The entries whose data is [`SHARE_MIN`] bytes or more
/// are written from their own buffers ([`OutFrame`]); `message` is as it was after the
/// call (its entries are set aside while the rest is encoded).
///
/// The message is protobuf's encoding, with its entries (field 7) after its other
/// fields and each entry's data (field 4) after the entry's other fields: protobuf
/// decodes fields in any order, and a repeated field's elements in the order they come.
///
/// # Errors
///
/// [`EncodeError`] for a bad topic name, an oversized message or a protobuf failure.
pub fn encode_frame(topic: &str, message: &mut RaftMessage) -> Result<OutFrame, EncodeError> {
    let mut entries = std::mem::take(&mut message.entries);
    let r = encode_raft(topic, message, &mut entries);
    message.entries = entries;
    r
}

/// Protobuf's key of a length-delimited field `n`: `n << 3 | 2`.
const MESSAGE_ENTRIES_KEY: u8 = 7 << 3 | 2;
const ENTRY_DATA_KEY: u8 = 4 << 3 | 2;

fn push_varint(out: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: usize) -> usize {
    let bits = usize::BITS - (v | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

fn encode_raft(
    topic: &str,
    head: &RaftMessage,
    entries: &mut [RaftEntry],
) -> Result<OutFrame, EncodeError> {
    let head_size = head.compute_size() as usize;
    // Per entry: its key, length, type, term and index (at most 25 bytes), its
    // context, and its data unless that is sent from its own buffer.
    let copied: usize = entries
        .iter()
        .map(|e| {
            32 + e.context.len()
                + if e.data.len() < SHARE_MIN {
                    e.data.len()
                } else {
                    0
                }
        })
        .sum();
    // One byte more than the bytes take: protobuf's final flush reserves one byte,
    // which on a full vector would reallocate (and copy) it at twice its size.
    let mut out = start(KIND_RAFT, 1 + topic.len() + head_size + copied + 1);
    push_name(&mut out, topic)?;
    head.write_to_vec(&mut out)
        .map_err(|_| EncodeError::Protobuf)?;
    let mut shared = Vec::new();
    let mut shared_len = 0;
    for e in entries.iter_mut() {
        let data = std::mem::take(&mut e.data);
        let rest = e.compute_size() as usize;
        let field = if data.is_empty() {
            0
        } else {
            1 + varint_len(data.len()) + data.len()
        };
        out.push(MESSAGE_ENTRIES_KEY);
        push_varint(&mut out, rest + field);
        let written = e.write_to_vec(&mut out);
        if !data.is_empty() {
            out.push(ENTRY_DATA_KEY);
            push_varint(&mut out, data.len());
            shared_len += push_data(&mut out, &mut shared, &data);
        }
        e.data = data;
        written.map_err(|_| EncodeError::Protobuf)?;
    }
    finish_frame(out, shared, shared_len)
}

/// Ends a frame whose pieces `shared` add `outside` bytes to `out`: writes the whole
/// frame's length into its header.
fn finish_frame(
    mut out: Vec<u8>,
    shared: Vec<(usize, Bytes)>,
    outside: usize,
) -> Result<OutFrame, EncodeError> {
    let len = out.len() + outside;
    write_len(&mut out, len)?;
    Ok(OutFrame {
        bytes: out,
        shared,
        len,
    })
}

/// Puts `data` at the end of a frame being encoded: as a piece of its own (`shared`,
/// at `out`'s current end) when it has [`SHARE_MIN`] bytes or more, copied into `out`
/// otherwise. Returns the bytes it adds outside `out`.
fn push_data(out: &mut Vec<u8>, shared: &mut Vec<(usize, Bytes)>, data: &Bytes) -> usize {
    if data.len() >= SHARE_MIN {
        shared.push((out.len(), data.clone()));
        data.len()
    } else {
        out.extend_from_slice(data);
        0
    }
}

/// Writes a [`Frame::Propose`] of an entry split by [`crate::Entry::encode_raft`]:
/// data of [`SHARE_MIN`] bytes or more is a piece of its own ([`OutFrame`]), written
/// from its own buffer (a forwarded batch's, the producer's frame), not copied.
///
/// # Errors
///
/// [`EncodeError`] for a bad topic name or an oversized entry.
pub fn encode_propose(
    request: u64,
    topic: &str,
    context: &[u8],
    data: &Bytes,
) -> Result<OutFrame, EncodeError> {
    let copied = if data.len() < SHARE_MIN {
        data.len()
    } else {
        0
    };
    let mut out = start(KIND_PROPOSE, 13 + topic.len() + context.len() + copied);
    out.extend_from_slice(&request.to_le_bytes());
    push_name(&mut out, topic)?;
    let context_len =
        u32::try_from(context.len()).map_err(|_| EncodeError::TooLarge(context.len()))?;
    out.extend_from_slice(&context_len.to_le_bytes());
    out.extend_from_slice(context);
    let mut shared = Vec::new();
    let outside = push_data(&mut out, &mut shared, data);
    finish_frame(out, shared, outside)
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
pub fn encode_ping(contact: u64, sent: u64, echo: u64) -> Vec<u8> {
    let mut out = start(KIND_PING, 24);
    for word in [contact, sent, echo] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out[..4].copy_from_slice(&26u32.to_le_bytes());
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
    decode(buf, None)
}

/// [`decode_frame`] of a frame read into a shared buffer: a Raft message's entry
/// data of [`SHARE_MIN`] bytes or more (and a snapshot's data) are slices of `buf`,
/// not copies; smaller data is copied.
///
/// # Errors
///
/// As [`decode_frame`].
pub fn decode_frame_shared(buf: &Bytes) -> Result<Option<(Frame, usize)>, DecodeError> {
    decode(buf, Some(buf))
}

/// The length of the frame at the start of `buf`, its length field included, once
/// `buf` holds all of it (`None` before).
///
/// # Errors
///
/// [`DecodeError::Truncated`] for a length field over [`MAX_FRAME_LEN`] or too short
/// for a header.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    let Some(len) = length_field(buf) else {
        return Ok(None);
    };
    if !(2..=MAX_FRAME_LEN).contains(&len) {
        return Err(DecodeError::Truncated);
    }
    Ok((buf.len() >= 4 + len).then_some(4 + len))
}

/// The length field of the frame at the start of `buf` (the bytes after the field), as
/// it reads, unchecked; `None` before `buf` holds the field.
#[must_use]
pub fn length_field(buf: &[u8]) -> Option<usize> {
    let head = buf.get(..4)?;
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(head);
    Some(usize::try_from(u32::from_le_bytes(len_bytes)).unwrap_or(usize::MAX))
}

/// A Raft message parsed from `body`, a slice of `shared` when given (see
/// [`decode_frame_shared`]).
fn parse_raft(body: &[u8], shared: Option<&Bytes>) -> Result<RaftMessage, DecodeError> {
    let Some(whole) = shared else {
        return RaftMessage::parse_from_bytes(body).map_err(|_| DecodeError::Protobuf);
    };
    let mut m = RaftMessage::parse_from_carllerche_bytes(&whole.slice_ref(body))
        .map_err(|_| DecodeError::Protobuf)?;
    let own = |b: &mut Bytes| *b = kept(std::mem::take(b));
    own(&mut m.context);
    for e in m.mut_entries() {
        own(&mut e.data);
        own(&mut e.context);
    }
    Ok(m)
}

/// `part` of a frame decoded from a shared buffer as it is kept: data of [`SHARE_MIN`]
/// bytes or more stays a slice of the buffer, smaller data is copied (so that a few
/// bytes do not keep a whole receive buffer alive).
fn kept(part: Bytes) -> Bytes {
    if part.len() < SHARE_MIN {
        Bytes::copy_from_slice(&part)
    } else {
        part
    }
}

fn decode(buf: &[u8], shared: Option<&Bytes>) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(end) = frame_len(buf)? else {
        return Ok(None);
    };
    let len = end - 4;
    let body = &buf[4..end];
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
            let members = r.u32()?;
            r.end()?;
            Frame::Hello(Hello {
                node_id,
                replica,
                address,
                tcp,
                members,
            })
        }
        KIND_RAFT => {
            let topic = r.name()?;
            let message = parse_raft(r.0, shared)?;
            Frame::Raft { topic, message }
        }
        KIND_PROPOSE => {
            let request = r.u64()?;
            let topic = r.name()?;
            let context_len = r.u32()? as usize;
            let context = r.take(context_len)?.to_vec();
            let rest = std::mem::take(&mut r.0);
            let data = match shared {
                Some(whole) => kept(whole.slice_ref(rest)),
                None => Bytes::copy_from_slice(rest),
            };
            Frame::Propose {
                request,
                topic,
                context,
                data,
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
            let sent = r.u64()?;
            let echo = r.u64()?;
            r.end()?;
            Frame::Ping {
                contact,
                sent,
                echo,
            }
        }
        k => return Err(DecodeError::Tag(k)),
    };
    Ok(Some((frame, 4 + len)))
}
