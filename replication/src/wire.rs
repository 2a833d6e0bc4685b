//! The framing of Raft messages on the inter-broker connection: which topic's group a
//! message is for, and raft-rs's protobuf message.
//!
//! ```text
//! len u32 LE (bytes after this field) | version u8 (= 1) | topic_len u8 | topic | eraftpb.Message
//! ```
//!
//! A frame is at most [`MAX_FRAME_LEN`] bytes after the length field; the receiver reads
//! the length, refuses larger frames before buffering them, then decodes. The
//! transport that carries these frames between shards is not built yet
//! (docs/replication.md).

use protobuf::Message as _;
use raft::eraftpb::Message as RaftMessage;

use crate::entry::{DecodeError, MAX_NAME_LEN};

/// The frame version this crate writes and reads.
pub const FRAME_VERSION: u8 = 1;

/// The largest frame, in bytes after the length field: a group's appends are cut at
/// `GroupConfig::max_size_per_msg` (1 MiB by default), nsqd's bodies at 1 MiB by
/// default, and a snapshot travels in one message, so the limit leaves room for both.
pub const MAX_FRAME_LEN: usize = 64 << 20;

/// A decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The topic whose group the message is for.
    pub topic: String,
    /// The Raft message.
    pub message: RaftMessage,
}

/// Why a frame could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The topic name is empty or longer than [`MAX_NAME_LEN`] bytes.
    Topic,
    /// The frame would exceed [`MAX_FRAME_LEN`].
    TooLarge(usize),
    /// protobuf refused the message.
    Protobuf,
}

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Topic => write!(f, "topic name empty or too long"),
            Self::TooLarge(n) => write!(f, "frame of {n} bytes over the limit"),
            Self::Protobuf => write!(f, "Raft message does not serialise"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Writes one frame.
///
/// # Errors
///
/// [`EncodeError`] for a bad topic name, an oversized message or a protobuf failure.
pub fn encode_frame(topic: &str, message: &RaftMessage) -> Result<Vec<u8>, EncodeError> {
    let name = topic.as_bytes();
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(EncodeError::Topic);
    }
    let body = message
        .write_to_bytes()
        .map_err(|_| EncodeError::Protobuf)?;
    let len = 2 + name.len() + body.len();
    if len > MAX_FRAME_LEN {
        return Err(EncodeError::TooLarge(len));
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    out.push(FRAME_VERSION);
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(name);
    out.extend_from_slice(&body);
    Ok(out)
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
/// [`DecodeError`]s for a bad version, topic name or protobuf body.
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
    let Some(frame) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    let version = frame[0];
    if version != FRAME_VERSION {
        return Err(DecodeError::Version(version));
    }
    let name_len = usize::from(frame[1]);
    let name = frame.get(2..2 + name_len).ok_or(DecodeError::Truncated)?;
    if name.is_empty() {
        return Err(DecodeError::Name);
    }
    let topic = std::str::from_utf8(name)
        .map_err(|_| DecodeError::Name)?
        .to_owned();
    let message =
        RaftMessage::parse_from_bytes(&frame[2 + name_len..]).map_err(|_| DecodeError::Protobuf)?;
    Ok(Some((Frame { topic, message }, 4 + len)))
}
