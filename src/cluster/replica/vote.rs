//! A group's term and vote on disk: Raft's persistent state besides the log. A member
//! that restarts keeps them, so it never votes twice in one term (two leaders of one
//! term could each commit entries the other overwrites). The Raft log itself is kept in
//! memory (docs/replication.md, "Guarantees").
//!
//! The file `raft-vote` in the topic's directory holds two 32-byte slots, written in
//! turn (each with `fdatasync`), so that a write torn by a crash leaves the other one:
//!
//! ```text
//! magic "NRV1" | sequence u64 | term u64 | vote u64 | CRC-32 of the 28 bytes before u32
//! ```
//!
//! (little-endian). The valid slot with the higher sequence is the state.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"NRV1";
const SLOT: usize = 32;

/// Where `topic`'s term and vote live under `data_path`.
pub(super) fn path(data_path: &Path, topic: &str) -> PathBuf {
    nsq_storage::topic_dir(data_path, topic).join("raft-vote")
}

/// The saved (sequence, term, vote), or `None` when there is no valid slot (no file:
/// a new or wiped member).
pub(super) fn load(path: &Path) -> Option<(u64, u64, u64)> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; 2 * SLOT];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    buf[..n]
        .chunks_exact(SLOT)
        .filter_map(decode)
        .max_by_key(|&(seq, _, _)| seq)
}

fn decode(slot: &[u8]) -> Option<(u64, u64, u64)> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(slot.get(i..i + 8)?.try_into().ok()?))
    };
    let crc = u32::from_le_bytes(slot.get(28..32)?.try_into().ok()?);
    (slot.get(..4)? == MAGIC && crc32fast::hash(slot.get(..28)?) == crc).then_some((
        word(4)?,
        word(12)?,
        word(20)?,
    ))
}

fn encode(seq: u64, term: u64, vote: u64) -> [u8; SLOT] {
    let mut s = [0u8; SLOT];
    s[..4].copy_from_slice(MAGIC);
    s[4..12].copy_from_slice(&seq.to_le_bytes());
    s[12..20].copy_from_slice(&term.to_le_bytes());
    s[20..28].copy_from_slice(&vote.to_le_bytes());
    let crc = crc32fast::hash(&s[..28]);
    s[28..].copy_from_slice(&crc.to_le_bytes());
    s
}

/// Writes (term, vote) as sequence `seq` into slot `seq % 2` and syncs it (blocking:
/// run off the shard's thread). Creates the topic's directory if needed.
pub(super) fn store_blocking(path: &Path, seq: u64, term: u64, vote: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    f.seek(SeekFrom::Start((seq % 2) * SLOT as u64))?;
    f.write_all(&encode(seq, term, vote))?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_one_is_passed_over() {
        let dir = std::env::temp_dir().join(format!("nsqd-vote-{}", std::process::id()));
        let p = dir.join("t").join("raft-vote");
        assert_eq!(load(&p), None);
        store_blocking(&p, 1, 3, 7).unwrap();
        assert_eq!(load(&p), Some((1, 3, 7)));
        store_blocking(&p, 2, 4, 0).unwrap();
        assert_eq!(load(&p), Some((2, 4, 0)));
        // A crash tore the next write (slot 1): the previous state stands.
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[SLOT + 13] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        store_blocking(&p, 3, 5, 9).unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[SLOT + 13] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(load(&p), Some((2, 4, 0)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
