//! Snappy framing format (the stream format nsqd speaks after IDENTIFY negotiates
//! `snappy`), pure and incremental: [`SnappyDecoder`] takes bytes as they arrive and
//! returns what complete chunks decode to; [`SnappyEncoder`] frames each flush.
//!
//! ```text
//! chunk: [u8 type][u24 little-endian length][data]
//!   0xff  stream identifier, data "sNaPpY" (sent once at the start; may repeat)
//!   0x00  compressed:   [u32 LE masked CRC-32C of the uncompressed data][snappy block]
//!   0x01  uncompressed: [u32 LE masked CRC-32C][data]
//!   0x02-0x7f reserved, unskippable (an error); 0x80-0xfe skippable (padding)
//! masked crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8
//! ```

use super::{codec, CompressError};

const STREAM_ID: &[u8] = b"\xff\x06\x00\x00sNaPpY";
/// Largest uncompressed chunk the format allows.
const MAX_CHUNK: usize = 65536;

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Go snappy's Reader buffer: the longest chunk it takes (maxEncodedLenOfMaxBlockSize
/// plus the checksum); a longer one is refused from its header.
const MAX_CHUNK_LEN: usize = 76_490 + 4;

/// Decodes a snappy-framed byte stream incrementally, with the checks of Go's snappy
/// Reader (nsqd's): the stream must start with its identifier; a chunk is refused from
/// its 4-byte header when longer than Go's buffer (76,494 bytes), of a reserved
/// unskippable type, or too short or long for its type; so at most one chunk of 76 KB is
/// ever held.
#[derive(Default, Debug)]
pub struct SnappyDecoder {
    /// Bytes of an incomplete chunk.
    raw: Vec<u8>,
    /// The stream identifier was read.
    identified: bool,
    /// Bytes of the chunk being decoded that Go's Reader has read when it checks what
    /// it checks now: its 4-byte header, then the whole chunk.
    read_of_chunk: usize,
}

impl SnappyDecoder {
    /// A decoder that continues a stream (its undecoded bytes so far).
    pub fn with_pending(raw: Vec<u8>) -> SnappyDecoder {
        SnappyDecoder {
            raw,
            identified: true,
            read_of_chunk: 0,
        }
    }

    /// Bytes received but not yet decodable (an incomplete chunk).
    pub fn pending(&self) -> &[u8] {
        &self.raw
    }

    /// After a failed [`feed`](Self::feed): the bytes received that Go's snappy Reader
    /// would not have read (a bad header is refused once its 4 bytes are read, a bad
    /// chunk once all of it is).
    pub fn unread_after_error(&self) -> usize {
        self.raw.len().saturating_sub(self.read_of_chunk)
    }

    /// Appends `data`, decodes every complete chunk into `out`. Errors on a corrupt
    /// stream (bad CRC, bad block, reserved chunk type); `out` then holds the chunks
    /// before the bad one (nothing of it), and [`pending`](Self::pending) starts at its
    /// header, as Go's snappy Reader returns the chunks it read before the error.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CompressError> {
        self.raw.extend_from_slice(data);
        let mut at = 0;
        let mut good = out.len();
        let r = self.decode_chunks(out, &mut at, &mut good);
        if r.is_err() {
            out.truncate(good);
        }
        self.raw.drain(..at);
        r
    }

    /// Decodes the complete chunks of `raw` from `at` on; `at` and `good` (the length of
    /// `out`) advance past each chunk decoded whole.
    fn decode_chunks(
        &mut self,
        out: &mut Vec<u8>,
        at: &mut usize,
        good: &mut usize,
    ) -> Result<(), CompressError> {
        let mut at_ = *at;
        while self.raw.len() - at_ >= 4 {
            let h = &self.raw[at_..at_ + 4];
            let kind = h[0];
            let len = h[1] as usize | (h[2] as usize) << 8 | (h[3] as usize) << 16;
            self.read_of_chunk = 4;
            // Go's Reader checks the header before reading the chunk.
            if !self.identified && kind != 0xff {
                return Err(CompressError::SnappyNoIdentifier);
            }
            if len > MAX_CHUNK_LEN {
                return Err(CompressError::SnappyChunkTooLong);
            }
            match kind {
                0xff if len != 6 => return Err(CompressError::SnappyBadIdentifier),
                0x00 | 0x01 if len < 4 => return Err(CompressError::SnappyShortChunk),
                0x01 if len - 4 > MAX_CHUNK => return Err(CompressError::SnappyChunkTooLarge),
                0x02..=0x7f => return Err(CompressError::SnappyChunkType(kind)),
                _ => {}
            }
            self.identified = true;
            if self.raw.len() - at_ < 4 + len {
                break;
            }
            self.read_of_chunk = 4 + len;
            let chunk = &self.raw[at_ + 4..at_ + 4 + len];
            match kind {
                0xff if chunk != b"sNaPpY" => {
                    return Err(CompressError::SnappyBadIdentifier);
                }
                0xff => {}
                0x00 | 0x01 => {
                    if len < 4 {
                        return Err(CompressError::SnappyShortChunk);
                    }
                    let crc = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                    let start = out.len();
                    if kind == 0x00 {
                        let n = snap::raw::decompress_len(&chunk[4..]).map_err(codec)?;
                        if n > MAX_CHUNK {
                            return Err(CompressError::SnappyChunkTooLarge);
                        }
                        out.resize(start + n, 0);
                        snap::raw::Decoder::new()
                            .decompress(&chunk[4..], &mut out[start..])
                            .map_err(codec)?;
                    } else {
                        out.extend_from_slice(&chunk[4..]);
                    }
                    if masked_crc(&out[start..]) != crc {
                        return Err(CompressError::SnappyChecksum);
                    }
                }
                0x02..=0x7f => return Err(CompressError::SnappyChunkType(kind)),
                _ => {}
            }
            at_ += 4 + len;
            *at = at_;
            *good = out.len();
        }
        Ok(())
    }
}

/// Frames outgoing bytes.
#[derive(Default, Debug)]
pub struct SnappyEncoder {
    sent_identifier: bool,
}

impl SnappyEncoder {
    /// An encoder for a stream whose identifier was already sent (a connection that
    /// moved to another shard).
    pub fn continuing() -> SnappyEncoder {
        SnappyEncoder {
            sent_identifier: true,
        }
    }

    /// Appends the framed form of `data` to `out`.
    pub fn encode(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if !self.sent_identifier {
            out.extend_from_slice(STREAM_ID);
            self.sent_identifier = true;
        }
        let mut enc = snap::raw::Encoder::new();
        for part in data.chunks(MAX_CHUNK) {
            let crc = masked_crc(part);
            let compressed = enc.compress_vec(part).unwrap_or_default();
            let (kind, body): (u8, &[u8]) =
                if !compressed.is_empty() && compressed.len() < part.len() {
                    (0x00, &compressed)
                } else {
                    (0x01, part)
                };
            let len = body.len() + 4;
            out.extend_from_slice(&[kind, len as u8, (len >> 8) as u8, (len >> 16) as u8]);
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn round_trip_with_the_snap_crate_stream_format() {
        // Our encoder's output reads back with snap's reference frame decoder...
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut framed = Vec::new();
        let mut e = SnappyEncoder::default();
        e.encode(&data[..1000], &mut framed);
        e.encode(&data[1000..], &mut framed);
        let mut back = Vec::new();
        snap::read::FrameDecoder::new(&framed[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, data);
        // ...and snap's reference encoder's output decodes here, fed in odd pieces.
        let mut w = snap::write::FrameEncoder::new(Vec::new());
        w.write_all(&data).unwrap();
        let framed = w.into_inner().unwrap();
        let mut d = SnappyDecoder::default();
        let mut out = Vec::new();
        for piece in framed.chunks(777) {
            d.feed(piece, &mut out).unwrap();
        }
        assert_eq!(out, data);
        assert!(d.pending().is_empty());
    }

    #[test]
    fn corruption_is_an_error() {
        let mut framed = Vec::new();
        SnappyEncoder::default().encode(b"hello hello hello hello", &mut framed);
        let n = framed.len();
        framed[n - 1] ^= 1;
        assert!(SnappyDecoder::default()
            .feed(&framed, &mut Vec::new())
            .is_err());
        let id = b"\xff\x06\x00\x00sNaPpY";
        let after_id =
            |rest: &[u8]| SnappyDecoder::default().feed(&[&id[..], rest].concat(), &mut Vec::new());
        assert!(after_id(b"\x80\x00\x00\x00").is_ok());
        assert!(after_id(b"\x05\x01\x00\x00x").is_err());
        // As Go's snappy Reader (nsqd): refused from the 4-byte header alone, before
        // any of the chunk is held: a stream not starting with its identifier, a chunk
        // over 76,494 bytes (padding too), a reserved type, an uncompressed chunk over
        // 64 KiB + 4.
        let mut d = SnappyDecoder::default();
        assert!(d.feed(b"\x01\x0e\x00\x00", &mut Vec::new()).is_err());
        assert!(after_id(b"\xfe\xff\xff\xff").is_err());
        assert!(after_id(b"\x00\xff\xff\xff").is_err());
        assert!(after_id(b"\x02\x01\x00\x00").is_err());
        assert!(after_id(b"\x01\x05\x00\x01").is_err());
        assert!(after_id(b"\xfe\xce\x2a\x01").is_ok());
    }
}
