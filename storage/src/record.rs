//! The on-disk record format, version [`FORMAT_VERSION`]. Pure: bytes in, records out.
//!
//! A segment file starts with a 32-byte header, then records back to back:
//!
//! ```text
//! segment header (32 bytes):
//!   [8]  magic "NSQRSEG\0"
//!   [4]  u32 format version (1)
//!   [8]  u64 base sequence (the first record's sequence; also in the file name)
//!   [12] zero
//! record (all integers big-endian):
//!   [4]  u32 len   = bytes after the crc field (35 + body length); 0 = end of data
//!   [4]  u32 crc   = CRC-32 (IEEE, crc32fast) of those len bytes
//!   [1]  u8  kind  = 1 (message)
//!   [8]  u64 sequence (per topic, dense, starting at the segment's base)
//!   [8]  i64 timestamp, Unix ns (publish time)
//!   [8]  i64 defer until, Unix ns (0 = not deferred)
//!   [8]  u64 message id
//!   [2]  u16 attempts at write time (0 for a fresh publish)
//!   [..] body
//! ```
//! DMA writes pad the file with zeros to the block size, so a zero length marks the end
//! of the written data. A record whose length is out of range or whose CRC does not
//! match is corrupt; readers skip it (see [`scan`]).

/// Version of this layout, written in every segment header.
pub const FORMAT_VERSION: u32 = 1;
pub const SEGMENT_MAGIC: &[u8; 8] = b"NSQRSEG\0";
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Bytes of a record before its body: len, crc, kind, seq, ts, defer, id, attempts.
pub const RECORD_OVERHEAD: usize = 4 + 4 + 1 + 8 + 8 + 8 + 8 + 2;
const KIND_MESSAGE: u8 = 1;
/// Bodies larger than this cannot be valid records (nsqd's max --max-msg-size is far
/// below); a larger length field means corruption.
pub const MAX_BODY: usize = 256 * 1024 * 1024;

/// One stored message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    pub seq: u64,
    pub timestamp: i64,
    /// Unix ns; 0 = none.
    pub defer_until: i64,
    pub id: u64,
    pub attempts: u16,
    pub body: bytes::Bytes,
}

/// The 32-byte segment header.
pub fn segment_header(base_seq: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
    h[12..20].copy_from_slice(&base_seq.to_be_bytes());
    h
}

/// Checks a segment header; returns its base sequence.
pub fn parse_segment_header(h: &[u8]) -> Result<u64, String> {
    if h.len() < SEGMENT_HEADER_LEN || &h[..8] != SEGMENT_MAGIC {
        return Err("bad segment magic".into());
    }
    let v = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    if v != FORMAT_VERSION {
        return Err(format!("unsupported segment format version {v}"));
    }
    Ok(u64::from_be_bytes(h[12..20].try_into().unwrap_or([0; 8])))
}

/// Appends one encoded record to `out`; returns its encoded length.
pub fn encode(r: &StoredRecord, out: &mut Vec<u8>) -> usize {
    let len = RECORD_OVERHEAD - 8 + r.body.len();
    let start = out.len();
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.push(KIND_MESSAGE);
    out.extend_from_slice(&r.seq.to_be_bytes());
    out.extend_from_slice(&r.timestamp.to_be_bytes());
    out.extend_from_slice(&r.defer_until.to_be_bytes());
    out.extend_from_slice(&r.id.to_be_bytes());
    out.extend_from_slice(&r.attempts.to_be_bytes());
    out.extend_from_slice(&r.body);
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    out.len() - start
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record and its encoded length.
    Record(StoredRecord, usize),
    /// Not enough bytes for the record whose header is here.
    Incomplete,
    /// A zero length field: the end of written data (DMA padding).
    End,
    /// A record that fails its checks; `skip` bytes jump over it when its length field
    /// looked sane (0 when the length itself is garbage).
    Corrupt { reason: String, skip: usize },
}

/// Decodes the record at the start of `buf`. `data` shares the buffer so the body is a
/// slice, not a copy.
pub fn decode(data: &bytes::Bytes, at: usize) -> Decoded {
    let buf = &data[at..];
    if buf.len() < 8 {
        if buf.len() >= 4 && buf[..4] == [0, 0, 0, 0] {
            return Decoded::End;
        }
        return Decoded::Incomplete;
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 {
        return Decoded::End;
    }
    if len < RECORD_OVERHEAD - 8 || len > MAX_BODY + RECORD_OVERHEAD {
        return Decoded::Corrupt {
            reason: format!("record length {len} out of range"),
            skip: 0,
        };
    }
    if buf.len() < 8 + len {
        return Decoded::Incomplete;
    }
    let crc = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let payload = &buf[8..8 + len];
    if crc32fast::hash(payload) != crc {
        return Decoded::Corrupt {
            reason: "crc mismatch".into(),
            skip: 8 + len,
        };
    }
    if payload[0] != KIND_MESSAGE {
        return Decoded::Corrupt {
            reason: format!("unknown record kind {}", payload[0]),
            skip: 8 + len,
        };
    }
    let u64_at = |o: usize| u64::from_be_bytes(payload[o..o + 8].try_into().unwrap_or([0; 8]));
    let rec = StoredRecord {
        seq: u64_at(1),
        timestamp: u64_at(9) as i64,
        defer_until: u64_at(17) as i64,
        id: u64_at(25),
        attempts: u16::from_be_bytes([payload[33], payload[34]]),
        body: data.slice(at + 8 + 35..at + 8 + len),
    };
    Decoded::Record(rec, 8 + len)
}

/// One problem [`scan`] stepped over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub offset: usize,
    pub reason: String,
}

/// Decodes every record of a complete buffer (a whole segment after its header, or a
/// read-back window), skipping corrupt ones: a record with a sane length but a bad CRC is
/// jumped over; after a garbage length the scan looks for the next offset where a valid
/// record starts. Returns the records, the problems, and the offset where decoding
/// stopped (the end of valid data, or where an incomplete record starts).
pub fn scan(
    data: &bytes::Bytes,
    mut at: usize,
) -> (Vec<(StoredRecord, usize)>, Vec<Skipped>, usize) {
    let mut recs = Vec::new();
    let mut skipped = Vec::new();
    while at < data.len() {
        match decode(data, at) {
            Decoded::Record(r, n) => {
                recs.push((r, at));
                at += n;
            }
            Decoded::End | Decoded::Incomplete => break,
            Decoded::Corrupt { reason, skip } => {
                skipped.push(Skipped { offset: at, reason });
                if skip > 0 {
                    at += skip;
                    continue;
                }
                // Resynchronise: the next offset holding a valid record.
                let mut next = at + 1;
                while next < data.len() {
                    if let Decoded::Record(..) = decode(data, next) {
                        break;
                    }
                    next += 1;
                }
                at = next;
            }
        }
    }
    (recs, skipped, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(seq: u64, body: &'static [u8]) -> StoredRecord {
        StoredRecord {
            seq,
            timestamp: 1_700_000_000_000_000_000 + seq as i64,
            defer_until: 0,
            id: 0xabc0 + seq,
            attempts: 0,
            body: Bytes::from_static(body),
        }
    }

    #[test]
    fn round_trip() {
        let mut out = Vec::new();
        let n = encode(&rec(7, b"hello"), &mut out);
        assert_eq!(n, RECORD_OVERHEAD + 5);
        let b = Bytes::from(out);
        assert_eq!(decode(&b, 0), Decoded::Record(rec(7, b"hello"), n));
    }

    #[test]
    fn zeros_end_and_short_is_incomplete() {
        let b = Bytes::from(vec![0u8; 64]);
        assert_eq!(decode(&b, 0), Decoded::End);
        let mut out = Vec::new();
        encode(&rec(1, b"abc"), &mut out);
        let b = Bytes::from(out[..out.len() - 1].to_vec());
        assert_eq!(decode(&b, 0), Decoded::Incomplete);
    }

    #[test]
    fn scan_skips_bad_crc_and_garbage_length() {
        let mut out = Vec::new();
        for i in 0..5u64 {
            encode(&rec(i, b"body-bytes"), &mut out);
        }
        let one = RECORD_OVERHEAD + 10;
        out[one + 20] ^= 0xff; // corrupt record 1's payload
        out[2 * one] = 0x7f; // garbage length for record 2
        let b = Bytes::from(out);
        let (recs, skipped, _) = scan(&b, 0);
        let seqs: Vec<u64> = recs.iter().map(|(r, _)| r.seq).collect();
        assert_eq!(seqs, vec![0, 3, 4]);
        assert_eq!(skipped.len(), 2);
        assert_eq!(skipped[0].offset, one);
    }

    #[test]
    fn header_round_trip() {
        assert_eq!(parse_segment_header(&segment_header(42)), Ok(42));
        assert!(parse_segment_header(&[0u8; 32]).is_err());
    }
}
