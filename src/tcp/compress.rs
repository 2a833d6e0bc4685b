//! Compression of a connection's stream after IDENTIFY negotiated snappy or deflate
//! (nsqd: clientV2.UpgradeSnappy and UpgradeDeflate): the inbound [`Decoder`] feeds the
//! reader loop, the outbound [`Encoder`] the writer, and both carry their state when the
//! connection moves to another shard.

use nsq_shards::client::Compression;
use nsq_wire::compress::deflate::{remember_output, DeflateDecoder, DeflateEncoder};
use nsq_wire::compress::snappy::{SnappyDecoder, SnappyEncoder};
use nsq_wire::compress::CompressError;

/// The inbound side of a compressed connection.
pub(super) enum Decoder {
    Snappy(SnappyDecoder),
    Deflate(DeflateDecoder),
}

impl Decoder {
    /// The decoder for `c`: for a stream that starts now (`resumed` false: a snappy
    /// stream must begin with its identifier), or one continuing from its hand-off state.
    pub(super) fn new(
        c: Compression,
        pending_raw: Vec<u8>,
        history: Vec<u8>,
        resumed: bool,
    ) -> Result<Option<Decoder>, CompressError> {
        Ok(match c {
            Compression::None => None,
            Compression::Snappy if !resumed => Some(Decoder::Snappy(SnappyDecoder::default())),
            Compression::Snappy => Some(Decoder::Snappy(SnappyDecoder::with_pending(pending_raw))),
            Compression::Deflate(_) => Some(Decoder::Deflate(DeflateDecoder::new(history)?)),
        })
    }

    /// After a failed [`Decoder::feed`]: bytes nsqd would not have read. Go's snappy
    /// Reader reads a chunk's 4-byte header straight from the socket and refuses a bad
    /// one there, so everything after it stays unread (its close is then a reset); a
    /// chunk whose checksum or block is bad was read whole first; for deflate, none are
    /// counted.
    pub(super) fn unread_after_error(&self) -> usize {
        match self {
            Decoder::Snappy(d) => d.unread_after_error(),
            Decoder::Deflate(_) => 0,
        }
    }

    pub(super) fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        match self {
            Decoder::Snappy(d) => d.feed(data, out),
            Decoder::Deflate(d) => d.feed(data, out),
        }
    }

    /// True when the stream can move to another shard now (deflate: at a flush point).
    pub(super) fn can_hand_off(&self) -> bool {
        match self {
            Decoder::Snappy(_) => true,
            Decoder::Deflate(d) => d.at_flush_point(),
        }
    }

    /// (undecoded bytes, inflate window) to move with the connection.
    pub(super) fn handoff_state(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Decoder::Snappy(d) => (d.pending().to_vec(), Vec::new()),
            Decoder::Deflate(d) => (Vec::new(), d.history().to_vec()),
        }
    }
}

/// The outbound side of a compressed connection.
pub(super) enum Encoder {
    Snappy(SnappyEncoder),
    /// The compressor and the last 32 KiB it compressed (the peer's inflate window),
    /// which moves with the connection to prime the compressor on the next shard.
    Deflate(DeflateEncoder, Vec<u8>),
}

impl Encoder {
    /// The encoder for `c`; `continuing` for a connection moved from another shard
    /// (snappy: no second stream identifier; deflate: primed with `history`).
    pub(super) fn new(
        c: Compression,
        continuing: bool,
        history: &[u8],
    ) -> Result<Option<Encoder>, CompressError> {
        Ok(match c {
            Compression::None => None,
            Compression::Snappy if continuing => Some(Encoder::Snappy(SnappyEncoder::continuing())),
            Compression::Snappy => Some(Encoder::Snappy(SnappyEncoder::default())),
            Compression::Deflate(level) => Some(Encoder::Deflate(
                DeflateEncoder::new(level, history)?,
                history.to_vec(),
            )),
        })
    }

    /// A second flush with nothing new (deflate: one more sync marker; snappy: nothing).
    pub(super) fn flush_again(&mut self, out: &mut Vec<u8>) {
        if let Encoder::Deflate(e, _) = self {
            e.flush_again(out);
        }
    }

    /// Compresses `data` onto `out`.
    pub(super) fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        match self {
            Encoder::Snappy(e) => {
                e.encode(data, out);
                Ok(())
            }
            Encoder::Deflate(e, history) => {
                remember_output(history, data);
                e.encode(data, out)
            }
        }
    }

    /// The deflate window to move with the connection (empty for snappy).
    pub(super) fn into_history(self) -> Vec<u8> {
        match self {
            Encoder::Snappy(_) => Vec::new(),
            Encoder::Deflate(_, history) => history,
        }
    }
}
