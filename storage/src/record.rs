//! The on-disk record format, version [`FORMAT_VERSION`]. Pure: bytes in, records out.
//!
//! A segment file starts with a 32-byte header, then records back to back:
//!
//! ```text
//! segment header (32 bytes):
//!   [8]  magic "NSQRSEG\0"
//!   [4]  u32 format version (1)
//!   [8]  u64 base sequence (the first record's sequence; also in the file name)
//!   [4]  u32 salt: random per writer instance, repeated in every record
//!   [8]  zero
//! record (all integers big-endian):
//!   [4]  u32 len   = bytes after the crc field (39 + body length); 0 = end of data
//!   [4]  u32 crc   = CRC-32 (IEEE, crc32fast) of those len bytes
//!   [1]  u8  kind  = 1 (message)
//!   [4]  u32 salt  = the segment header's salt
//!   [8]  u64 sequence (per topic, increasing within a segment, >= the base)
//!   [8]  i64 timestamp, Unix ns (publish time)
//!   [8]  i64 defer until, Unix ns (0 = not deferred)
//!   [8]  u64 message id
//!   [2]  u16 attempts at write time (0 for a fresh publish)
//!   [..] body
//! ```
//! A zero length marks the end of the written data. DMA writes pad the last block, and
//! the padding of a reused buffer may hold stale bytes, even whole valid-looking
//! records of another file: so the data of a segment also ends at the first record
//! whose salt differs from the header's or whose sequence does not increase. A record
//! whose length is out of range or whose CRC does not match is corrupt; readers skip it
//! (see [`scan`]). Zeros or another writer's record followed by valid records of this
//! writer are damage (a zeroed range, say), not the end: readers step over them too
//! ([`resync`] finds where the next record starts).

/// Version of this layout, written in every segment header.
pub const FORMAT_VERSION: u32 = 1;
pub const SEGMENT_MAGIC: &[u8; 8] = b"NSQRSEG\0";
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Bytes of a record before its body: len, crc, kind, seq, ts, defer, id, attempts.
pub const RECORD_OVERHEAD: usize = 4 + 4 + 1 + 4 + 8 + 8 + 8 + 8 + 2;
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
pub fn segment_header(base_seq: u64, salt: u32) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
    h[12..20].copy_from_slice(&base_seq.to_be_bytes());
    h[20..24].copy_from_slice(&salt.to_be_bytes());
    h
}

/// Why a segment header is not valid (its `Display` is the text recovery logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than [`SEGMENT_HEADER_LEN`], or not starting with [`SEGMENT_MAGIC`].
    BadMagic,
    /// A format version other than [`FORMAT_VERSION`].
    UnsupportedVersion(u32),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::BadMagic => f.write_str("bad segment magic"),
            HeaderError::UnsupportedVersion(v) => {
                write!(f, "unsupported segment format version {v}")
            }
        }
    }
}

impl std::error::Error for HeaderError {}

/// Checks a segment header; returns its (base sequence, salt).
pub fn parse_segment_header(h: &[u8]) -> Result<(u64, u32), HeaderError> {
    if h.len() < SEGMENT_HEADER_LEN || &h[..8] != SEGMENT_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let v = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
    if v != FORMAT_VERSION {
        return Err(HeaderError::UnsupportedVersion(v));
    }
    Ok((
        u64::from_be_bytes(h[12..20].try_into().unwrap_or([0; 8])),
        u32::from_be_bytes(h[20..24].try_into().unwrap_or([0; 4])),
    ))
}

/// Appends one encoded record to `out`; returns its encoded length.
pub fn encode(r: &StoredRecord, salt: u32, out: &mut Vec<u8>) -> usize {
    let len = RECORD_OVERHEAD - 8 + r.body.len();
    let start = out.len();
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.push(KIND_MESSAGE);
    out.extend_from_slice(&salt.to_be_bytes());
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
    /// A record that fails its checks (its length is then not trusted either).
    Corrupt { reason: String },
}

/// Decodes the record at `at`, which must carry `salt` (a valid record with another salt
/// is stale padding: the end of data). `data` shares the buffer, so the body is a slice,
/// not a copy.
pub fn decode(data: &bytes::Bytes, at: usize, salt: u32) -> Decoded {
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
    if !(RECORD_OVERHEAD - 8..=MAX_BODY + RECORD_OVERHEAD).contains(&len) {
        return Decoded::Corrupt {
            reason: format!("record length {len} out of range"),
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
        };
    }
    if payload[0] != KIND_MESSAGE {
        return Decoded::Corrupt {
            reason: format!("unknown record kind {}", payload[0]),
        };
    }
    if u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]) != salt {
        return Decoded::End;
    }
    let u64_at = |o: usize| u64::from_be_bytes(payload[o..o + 8].try_into().unwrap_or([0; 8]));
    let rec = StoredRecord {
        seq: u64_at(5),
        timestamp: u64_at(13) as i64,
        defer_until: u64_at(21) as i64,
        id: u64_at(29),
        attempts: u16::from_be_bytes([payload[37], payload[38]]),
        body: data.slice(at + 8 + 39..at + 8 + len),
    };
    Decoded::Record(rec, 8 + len)
}

/// Whether a record of this writer may start at the beginning of `buf`: a length in
/// range, then (as far as `buf` reaches) the message kind and `salt` after the CRC. A
/// cheap filter (five fixed bytes) so that resynchronising after damage does not
/// CRC-check every offset of it.
fn plausible_start(buf: &[u8], salt: u32) -> bool {
    if buf.len() >= 4 {
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(RECORD_OVERHEAD - 8..=MAX_BODY + RECORD_OVERHEAD).contains(&len) {
            return false;
        }
    }
    let mut fixed = [KIND_MESSAGE, 0, 0, 0, 0];
    fixed[1..].copy_from_slice(&salt.to_be_bytes());
    let have = buf.get(8..).unwrap_or(&[]);
    let n = have.len().min(fixed.len());
    have[..n] == fixed[..n]
}

/// The first offset at or after `from` where a record of this writer (`salt`) may start
/// (see `plausible_start`), for stepping over damage: runs of zeros are skipped in
/// one pass. `data.len()` when there is none; when `data` ends in zeros, the offset 3
/// bytes before its end (a record's big-endian length may start with 3 zero bytes, and
/// the rest of it may be in the next read).
pub fn resync(data: &[u8], mut from: usize, salt: u32) -> usize {
    while from < data.len() {
        if data[from] == 0 {
            match data[from..].iter().position(|&b| b != 0) {
                None => return data.len().saturating_sub(3).max(from),
                Some(p) => from = (from + p).saturating_sub(3).max(from),
            }
        }
        if plausible_start(&data[from..], salt) {
            return from;
        }
        from += 1;
    }
    data.len()
}

/// The (sequence, salt) of the record a segment file's bytes `after_header` (read from
/// offset [`SEGMENT_HEADER_LEN`]) start with, from its fixed fields, without its CRC:
/// `None` when they do not look like a message record. A segment's first record carries
/// its writer's salt and, written first, its base: a damaged header is read by it.
pub fn first_record_fields(after_header: &[u8]) -> Option<(u64, u32)> {
    let b = after_header.get(..8 + 13)?;
    let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if !(RECORD_OVERHEAD - 8..=MAX_BODY + RECORD_OVERHEAD).contains(&len) || b[8] != KIND_MESSAGE {
        return None;
    }
    let salt = u32::from_be_bytes([b[9], b[10], b[11], b[12]]);
    let seq = u64::from_be_bytes(b[13..21].try_into().ok()?);
    Some((seq, salt))
}

/// True when `data` holds only zeros from `at` on (the unwritten end of a segment).
pub fn zeros_from(data: &[u8], at: usize) -> bool {
    data.get(at..).unwrap_or(&[]).iter().all(|&b| b == 0)
}

/// Whether a valid record of this writer with a sequence above `after` follows `from`.
fn has_record_after(data: &bytes::Bytes, mut from: usize, salt: u32, after: Option<u64>) -> bool {
    while from < data.len() {
        from = resync(data, from, salt);
        if from >= data.len() {
            return false;
        }
        match decode(data, from, salt) {
            Decoded::Record(r, n) => {
                if after.is_none_or(|a| r.seq > a) {
                    return true;
                }
                from += n;
            }
            _ => from += 1,
        }
    }
    false
}

/// One problem [`scan`] stepped over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub offset: usize,
    pub reason: String,
}

/// Decodes every record of a buffer (a segment after its header, or a read-back
/// window) whose records carry `salt` and have sequences above `after` (`None`: any),
/// skipping damage: after a corrupt record (bad length, CRC or kind), zeros or another
/// writer's record that valid data follows, the scan goes on at the next offset where a
/// record may start ([`resync`]; the length of a record that fails its CRC is not
/// trusted, so a flipped length loses that record only). Zeros up to the end are the
/// end of the data; a record whose sequence does not increase is stale data: the end.
/// Returns the records, the problems, and the offset where decoding stopped (the end of
/// valid data, or where an incomplete record starts).
pub fn scan(
    data: &bytes::Bytes,
    at: usize,
    salt: u32,
    after: Option<u64>,
) -> (Vec<(StoredRecord, usize)>, Vec<Skipped>, usize) {
    scan_up_to(data, at, salt, after, usize::MAX)
}

/// [`scan`], stopping after `max` records (the offset returned is then where the next
/// record starts), so a reader that wants a few records of a large window does not
/// decode and CRC-check all of it.
pub fn scan_up_to(
    data: &bytes::Bytes,
    mut at: usize,
    salt: u32,
    mut after: Option<u64>,
    max: usize,
) -> (Vec<(StoredRecord, usize)>, Vec<Skipped>, usize) {
    let mut recs = Vec::new();
    let mut skipped = Vec::new();
    while at < data.len() && recs.len() < max {
        match decode(data, at, salt) {
            Decoded::Record(r, n) => {
                if after.is_some_and(|a| r.seq <= a) {
                    // An older record of this writer: stale padding past the end of the
                    // data (when nothing valid follows), else a copy written over the
                    // data (damage): stepped over either way.
                    if !has_record_after(data, at + n, salt, after) {
                        break;
                    }
                    skipped.push(Skipped {
                        offset: at,
                        reason: format!("stale record (sequence {})", r.seq),
                    });
                    at += n;
                    continue;
                }
                after = Some(r.seq);
                recs.push((r, at));
                at += n;
            }
            Decoded::Incomplete => break,
            Decoded::End if zeros_from(data, at) => break,
            Decoded::End => {
                skipped.push(Skipped {
                    offset: at,
                    reason: "zeroed bytes or another writer's record".into(),
                });
                at = resync(data, at + 1, salt);
            }
            Decoded::Corrupt { reason, .. } => {
                skipped.push(Skipped { offset: at, reason });
                at = resync(data, at + 1, salt);
            }
        }
    }
    (recs, skipped, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    const SALT: u32 = 0x5a17;

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
        let n = encode(&rec(7, b"hello"), SALT, &mut out);
        assert_eq!(n, RECORD_OVERHEAD + 5);
        let b = Bytes::from(out);
        assert_eq!(decode(&b, 0, SALT), Decoded::Record(rec(7, b"hello"), n));
        assert_eq!(
            decode(&b, 0, SALT + 1),
            Decoded::End,
            "another writer's record is stale"
        );
    }

    #[test]
    fn zeros_end_and_short_is_incomplete() {
        let b = Bytes::from(vec![0u8; 64]);
        assert_eq!(decode(&b, 0, SALT), Decoded::End);
        let mut out = Vec::new();
        encode(&rec(1, b"abc"), SALT, &mut out);
        let b = Bytes::from(out[..out.len() - 1].to_vec());
        assert_eq!(decode(&b, 0, SALT), Decoded::Incomplete);
    }

    #[test]
    fn scan_skips_bad_crc_and_garbage_length() {
        let mut out = Vec::new();
        for i in 0..5u64 {
            encode(&rec(i, b"body-bytes"), SALT, &mut out);
        }
        let one = RECORD_OVERHEAD + 10;
        out[one + 20] ^= 0xff; // corrupt record 1's payload
        out[2 * one] = 0x7f; // garbage length for record 2
        let b = Bytes::from(out);
        let (recs, skipped, _) = scan(&b, 0, SALT, None);
        let seqs: Vec<u64> = recs.iter().map(|(r, _)| r.seq).collect();
        assert_eq!(seqs, vec![0, 3, 4]);
        // One damaged range: the resync from record 1 steps over record 2 too.
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].offset, one);
    }

    fn records(n: u64, body: &'static [u8]) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::new();
        let mut offs = Vec::new();
        for i in 0..n {
            offs.push(out.len());
            encode(&rec(i, body), SALT, &mut out);
        }
        (out, offs)
    }

    fn seqs_of(data: Vec<u8>) -> (Vec<u64>, Vec<Skipped>, usize) {
        let b = Bytes::from(data);
        let (recs, skipped, end) = scan(&b, 0, SALT, None);
        (recs.iter().map(|(r, _)| r.seq).collect(), skipped, end)
    }

    #[test]
    fn a_zeroed_range_loses_only_the_records_it_covers() {
        let (mut out, offs) = records(40, b"twenty-bytes-of-body");
        // Zero records 10..=14 and parts of their neighbours 9 and 15.
        let (from, to) = (offs[9] + 5, offs[15] + 7);
        out[from..to].iter_mut().for_each(|b| *b = 0);
        let len = out.len();
        let (seqs, skipped, end) = seqs_of(out);
        let want: Vec<u64> = (0..9).chain(16..40).collect();
        assert_eq!(seqs, want);
        assert_eq!(end, len);
        assert!(
            !skipped.is_empty() && skipped[0].offset == offs[9],
            "{skipped:?}"
        );
    }

    #[test]
    fn a_flipped_length_loses_only_its_record() {
        let (mut out, offs) = records(30, b"body");
        // Record 7's length grows (still in range): its CRC check fails over the bytes
        // of the records after it, which must not be skipped with it.
        out[offs[7] + 2] ^= 0x01;
        let (seqs, skipped, _) = seqs_of(out);
        let want: Vec<u64> = (0..30).filter(|s| *s != 7).collect();
        assert_eq!(seqs, want);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
    }

    #[test]
    fn zeros_to_the_end_are_the_end_not_damage() {
        let (mut out, _) = records(5, b"abc");
        let len = out.len();
        out.resize(len + 4096, 0);
        let (seqs, skipped, end) = seqs_of(out);
        assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(end, len);
    }

    #[test]
    fn another_writers_record_between_records_is_stepped_over() {
        let (mut out, offs) = records(6, b"abcdef");
        let mut other = Vec::new();
        encode(&rec(3, b"abcdef"), SALT ^ 0xff, &mut other);
        let n = other.len();
        out[offs[3]..offs[3] + n].copy_from_slice(&other);
        let (seqs, skipped, _) = seqs_of(out);
        assert_eq!(seqs, vec![0, 1, 2, 4, 5]);
        assert_eq!(skipped.len(), 1);
    }

    #[test]
    fn stale_padding_ends_the_data() {
        // Valid records followed by an older copy of themselves (a reused DMA buffer).
        let mut out = Vec::new();
        for i in 10..13u64 {
            encode(&rec(i, b"x"), SALT, &mut out);
        }
        let copy = out.clone();
        out.extend_from_slice(&copy);
        let b = Bytes::from(out);
        let (recs, _, stop) = scan(&b, 0, SALT, None);
        assert_eq!(recs.len(), 3);
        assert_eq!(stop, copy.len());
    }

    #[test]
    fn header_round_trip() {
        assert_eq!(parse_segment_header(&segment_header(42, 7)), Ok((42, 7)));
        assert_eq!(
            parse_segment_header(&[0u8; 32]).map_err(|e| e.to_string()),
            Err("bad segment magic".to_string())
        );
    }
}
