//! Stream compression negotiated by IDENTIFY (nsqd: nsqd/protocol_v2.go upgradeSnappy /
//! upgradeDeflate): the snappy framing format and raw DEFLATE, both incremental and pure.

pub mod deflate;
pub mod snappy;

use std::fmt;

/// Why a compressed stream could not be decoded or encoded. `Display` is the text nsqd-rs
/// logs when a client's stream fails (`failed to read command - <text>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompressError {
    /// The compression library refused the data or its state (flate2's or snap's text).
    Codec(String),
    /// `deflate stream ended`: the client's stream held a final block.
    DeflateEnded,
    /// `snappy stream without its identifier`: the first chunk is another kind.
    SnappyNoIdentifier,
    /// `bad snappy stream identifier`.
    SnappyBadIdentifier,
    /// `snappy chunk too long`: a chunk longer than Go's reader buffer (76,494 bytes).
    SnappyChunkTooLong,
    /// `snappy chunk too large`: more than 64 KiB uncompressed.
    SnappyChunkTooLarge,
    /// `short snappy chunk`: a data chunk shorter than its checksum.
    SnappyShortChunk,
    /// `unsupported snappy chunk type 0x..`: a reserved unskippable chunk type.
    SnappyChunkType(u8),
    /// `snappy checksum mismatch`.
    SnappyChecksum,
}

impl fmt::Display for CompressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompressError::Codec(text) => f.write_str(text),
            CompressError::DeflateEnded => f.write_str("deflate stream ended"),
            CompressError::SnappyNoIdentifier => {
                f.write_str("snappy stream without its identifier")
            }
            CompressError::SnappyBadIdentifier => f.write_str("bad snappy stream identifier"),
            CompressError::SnappyChunkTooLong => f.write_str("snappy chunk too long"),
            CompressError::SnappyChunkTooLarge => f.write_str("snappy chunk too large"),
            CompressError::SnappyShortChunk => f.write_str("short snappy chunk"),
            CompressError::SnappyChunkType(kind) => {
                write!(f, "unsupported snappy chunk type {kind:#x}")
            }
            CompressError::SnappyChecksum => f.write_str("snappy checksum mismatch"),
        }
    }
}

impl std::error::Error for CompressError {}

/// A compression library's error, by its text.
pub(crate) fn codec(e: impl fmt::Display) -> CompressError {
    CompressError::Codec(e.to_string())
}
