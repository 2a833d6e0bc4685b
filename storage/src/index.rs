//! The side index of a sealed segment, format version [`INDEX_VERSION`]. Pure: bytes in,
//! index out.
//!
//! A segment is sealed when nothing more will be written to it: at rotation, at a clean
//! shutdown, or when recovery has scanned a segment left open by a crash (writing always
//! continues in a new segment). Sealing writes `<base>.idx` beside `<base>.seg`
//! (write a temporary file, fsync, rename), so recovery reads a few kilobytes instead of
//! reading and CRC-checking every record (nsqd's diskqueue likewise restarts from
//! positions kept in its metadata). A segment without a valid index is scanned as before,
//! so segments written before this format existed still recover, and get an index.
//!
//! The segment being written gets a *partial* index, `<base>.pidx`, in the same format:
//! rewritten (temporary file, rename; not fsynced) after a sync every `--sync-timeout` or
//! 8 MiB, it describes the synced prefix up to its data end, and recovery after a crash
//! scans the segment only from there. Its file length field equals its data end; it is
//! trusted when the segment is at least that long and has the same salt, and removed once
//! the segment is sealed.
//!
//! ```text
//! index file (all integers big-endian):
//!   [8]  magic "NSQRIDX\0"
//!   [4]  u32 index format version (1)
//!   [8]  u64 base sequence (also in both file names)
//!   [4]  u32 salt of the segment's records
//!   [8]  u64 file length: the segment file's size in bytes when sealed
//!   [8]  u64 data end: byte offset just after the last valid record
//!   [8]  u64 record count (valid records; sequences may have gaps, so this is not
//!            last - first + 1)
//!   [8]  u64 first sequence
//!   [8]  u64 last sequence
//!   [4]  u32 n: sparse index entries
//!   n x ([8] u64 sequence, [8] u64 byte offset): the records number 0, k, 2k, ... of
//!            the segment (k = INDEX_EVERY)
//!   [4]  u32 CRC-32 (IEEE) of every byte before it
//! ```
//! An index is trusted only when its CRC matches, its base is the file's, and the segment
//! file still has the recorded length; anything else means "scan the segment". Record
//! CRCs of a sealed segment are checked when the records are read (a corrupt one is
//! logged and skipped then), not at start-up.

/// Version of the index layout.
pub const INDEX_VERSION: u32 = 1;
pub const INDEX_MAGIC: &[u8; 8] = b"NSQRIDX\0";
const FIXED_LEN: usize = 8 + 4 + 8 + 4 + 8 + 8 + 8 + 8 + 8 + 4;

/// What a sealed segment's index says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentIndex {
    pub base: u64,
    pub salt: u32,
    /// Size in bytes of the segment file when it was sealed.
    pub file_len: u64,
    /// Byte offset just after the last valid record.
    pub data_end: u64,
    /// Valid records in the segment.
    pub count: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// (sequence, byte offset) of records number 0, INDEX_EVERY, 2 * INDEX_EVERY, ...
    pub entries: Vec<(u64, u64)>,
}

/// Encodes an index file.
pub fn encode(ix: &SegmentIndex) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED_LEN + 16 * ix.entries.len() + 4);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&INDEX_VERSION.to_be_bytes());
    out.extend_from_slice(&ix.base.to_be_bytes());
    out.extend_from_slice(&ix.salt.to_be_bytes());
    out.extend_from_slice(&ix.file_len.to_be_bytes());
    out.extend_from_slice(&ix.data_end.to_be_bytes());
    out.extend_from_slice(&ix.count.to_be_bytes());
    out.extend_from_slice(&ix.first_seq.to_be_bytes());
    out.extend_from_slice(&ix.last_seq.to_be_bytes());
    out.extend_from_slice(&(ix.entries.len() as u32).to_be_bytes());
    for &(seq, off) in &ix.entries {
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&off.to_be_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0)
}

/// Why an index file cannot be trusted (its `Display` is the text recovery logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexError {
    /// Shorter than the fixed part, or not starting with [`INDEX_MAGIC`].
    BadMagic,
    /// A format version other than [`INDEX_VERSION`].
    UnsupportedVersion(u32),
    /// An entry count whose size overflows.
    EntryCountOverflow,
    /// The file's length in bytes is not what its entry count makes it.
    Length { len: usize, expected: usize },
    /// The CRC does not match the bytes.
    CrcMismatch,
    /// A record count of 0.
    EmptySegment,
    /// The data end lies before the first record or past the file length.
    DataEndOutOfRange,
    /// The first and last sequences are out of order (or below the base).
    SequenceRangeOutOfOrder,
    /// Not one entry per [`crate::store::INDEX_EVERY`] records.
    EntryCountMismatch,
    /// The first entry is not the first record.
    FirstEntryNotFirstRecord,
    /// An entry outside the segment's data or sequence range.
    EntryOutOfRange,
    /// Entries not increasing in both sequence and offset.
    EntriesOutOfOrder,
}

impl std::fmt::Display for IndexError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexError::BadMagic => f.write_str("bad index magic or length"),
            IndexError::UnsupportedVersion(v) => write!(f, "unsupported index version {v}"),
            IndexError::EntryCountOverflow => f.write_str("index entry count out of range"),
            IndexError::Length { len, expected } => {
                write!(f, "index length {len} (expected {expected})")
            }
            IndexError::CrcMismatch => f.write_str("index crc mismatch"),
            IndexError::EmptySegment => f.write_str("index of an empty segment"),
            IndexError::DataEndOutOfRange => f.write_str("index data end out of range"),
            IndexError::SequenceRangeOutOfOrder => f.write_str("index sequence range out of order"),
            IndexError::EntryCountMismatch => {
                f.write_str("index entry count does not match the record count")
            }
            IndexError::FirstEntryNotFirstRecord => {
                f.write_str("index does not start at the first record")
            }
            IndexError::EntryOutOfRange => f.write_str("index entry out of range"),
            IndexError::EntriesOutOfOrder => f.write_str("index entries out of order"),
        }
    }
}

impl std::error::Error for IndexError {}

/// Decodes and checks an index file; the error says why it cannot be trusted.
pub fn decode(b: &[u8]) -> Result<SegmentIndex, IndexError> {
    if b.len() < FIXED_LEN + 4 || &b[..8] != INDEX_MAGIC {
        return Err(IndexError::BadMagic);
    }
    let v = u32_at(b, 8);
    if v != INDEX_VERSION {
        return Err(IndexError::UnsupportedVersion(v));
    }
    let n = u32_at(b, FIXED_LEN - 4) as usize;
    let want = n
        .checked_mul(16)
        .and_then(|e| e.checked_add(FIXED_LEN + 4))
        .ok_or(IndexError::EntryCountOverflow)?;
    if b.len() != want {
        return Err(IndexError::Length {
            len: b.len(),
            expected: want,
        });
    }
    let crc = u32_at(b, want - 4);
    if crc32fast::hash(&b[..want - 4]) != crc {
        return Err(IndexError::CrcMismatch);
    }
    let ix = SegmentIndex {
        base: u64_at(b, 12),
        salt: u32_at(b, 20),
        file_len: u64_at(b, 24),
        data_end: u64_at(b, 32),
        count: u64_at(b, 40),
        first_seq: u64_at(b, 48),
        last_seq: u64_at(b, 56),
        entries: (0..n)
            .map(|i| {
                let o = FIXED_LEN + 16 * i;
                (u64_at(b, o), u64_at(b, o + 8))
            })
            .collect(),
    };
    check(&ix)?;
    Ok(ix)
}

/// Consistency rules an index must follow to be used.
fn check(ix: &SegmentIndex) -> Result<(), IndexError> {
    let hdr = crate::record::SEGMENT_HEADER_LEN as u64;
    if ix.count == 0 {
        return Err(IndexError::EmptySegment);
    }
    if ix.data_end > ix.file_len || ix.data_end < hdr {
        return Err(IndexError::DataEndOutOfRange);
    }
    if ix.first_seq < ix.base || ix.last_seq < ix.first_seq || ix.last_seq == u64::MAX {
        return Err(IndexError::SequenceRangeOutOfOrder);
    }
    let every = crate::store::INDEX_EVERY;
    if ix.entries.len() as u64 != ix.count.div_ceil(every) {
        return Err(IndexError::EntryCountMismatch);
    }
    if ix.entries.first().map(|e| e.0) != Some(ix.first_seq) {
        return Err(IndexError::FirstEntryNotFirstRecord);
    }
    let mut prev: Option<(u64, u64)> = None;
    for &(seq, off) in &ix.entries {
        if off < hdr || off >= ix.data_end || seq > ix.last_seq {
            return Err(IndexError::EntryOutOfRange);
        }
        if prev.is_some_and(|(ps, po)| seq <= ps || off <= po) {
            return Err(IndexError::EntriesOutOfOrder);
        }
        prev = Some((seq, off));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SegmentIndex {
        SegmentIndex {
            base: 100,
            salt: 7,
            file_len: 9000,
            data_end: 8990,
            count: 300,
            first_seq: 100,
            last_seq: 520,
            entries: vec![(100, 32), (400, 5000)],
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        let ix = sample();
        let b = encode(&ix);
        assert_eq!(decode(&b), Ok(ix.clone()));
        for i in [0, 9, 30, b.len() / 2, b.len() - 1] {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "flipped byte {i} detected");
        }
        assert!(decode(&b[..b.len() - 3]).is_err());
        assert_eq!(
            decode(&[]).map_err(|e| e.to_string()),
            Err("bad index magic or length".to_string())
        );
        assert_eq!(
            IndexError::Length {
                len: 3,
                expected: 92
            }
            .to_string(),
            "index length 3 (expected 92)"
        );
        // Gaps in sequences are fine; inconsistent counts are not.
        let mut wrong = ix.clone();
        wrong.count = 1000;
        assert!(decode(&encode(&wrong)).is_err());
        let mut wrong = ix;
        wrong.entries[1].1 = 9500;
        assert!(decode(&encode(&wrong)).is_err());
    }

    #[test]
    fn huge_entry_count_is_an_error_not_a_panic() {
        let mut b = encode(&sample());
        let at = FIXED_LEN - 4;
        b[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&b).is_err());
    }
}
