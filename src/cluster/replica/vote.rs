//! A group's term and vote on disk: Raft's persistent state besides the log. A member
//! that restarts keeps them, so it never votes twice in one term (two leaders of one
//! term could each commit entries the other overwrites). Under the default sync policy
//! the Raft log itself is kept in memory (docs/replication.md, "Guarantees"; under
//! `--sync-every=1` it is journaled: [`super::journal`]), so beside them goes the vote
//! floor: the (term, index) of the last entry the member applied. After a restart it
//! votes for no candidate whose log ends before it, as its lost log would have refused
//! them.
//!
//! The file `raft-vote` in the topic's directory holds two 48-byte slots, written in
//! turn, so that a write torn by a crash leaves the other one:
//!
//! ```text
//! magic "NRV2" | sequence u64 | term u64 | vote u64 | floor term u64 | floor index u64
//! | CRC-32 of the 44 bytes before u32
//! ```
//!
//! (little-endian). The valid slot with the higher sequence is the state. A write that
//! changes the term or vote is synced (`fdatasync`) before anything depending on it is
//! sent; one that only moves the floor is not (a crash of the host may then leave an
//! older floor, which protects less, never wrongly).

use super::CURSOR_EVERY;
use crate::server::Server;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

const MAGIC: &[u8; 4] = b"NRV2";
const SLOT: usize = 48;
const CRC_AT: usize = SLOT - 4;

/// What the file holds: the write's sequence, the term, the vote and the floor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Saved {
    pub seq: u64,
    pub term: u64,
    pub vote: u64,
    pub floor: (u64, u64),
}

/// A group's vote file as last written: what it holds, and when its floor was written.
pub(super) struct VoteFile {
    pub saved: Saved,
    pub floor_saved_at: Instant,
}

impl VoteFile {
    pub fn new(saved: Saved) -> Self {
        Self {
            saved,
            floor_saved_at: Instant::now(),
        }
    }
}

/// Where `topic`'s term and vote live under `data_path`.
pub(super) fn path(data_path: &Path, topic: &str) -> PathBuf {
    nsq_storage::topic_dir(data_path, topic).join("raft-vote")
}

/// Where the term and vote of `topic` live while it is deleted through its log
/// ([`nsq_replication::Entry::TopicDelete`]): outside the topic's directory, which
/// the deletion removes. The file is also the mark that the topic was deleted: a
/// member that restarts keeps the group without making the topic again.
pub(super) fn tombstone_path(data_path: &Path, topic: &str) -> PathBuf {
    data_path.join("cluster-deleted").join(format!("t-{topic}"))
}

/// The saved state, or `None` when there is no valid slot (no file: a new or wiped
/// member).
pub(super) fn load(path: &Path) -> Option<Saved> {
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
        .max_by_key(|s| s.seq)
}

fn decode(slot: &[u8]) -> Option<Saved> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(slot.get(i..i + 8)?.try_into().ok()?))
    };
    let crc = u32::from_le_bytes(slot.get(CRC_AT..SLOT)?.try_into().ok()?);
    (slot.get(..4)? == MAGIC && crc32fast::hash(slot.get(..CRC_AT)?) == crc).then_some(Saved {
        seq: word(4)?,
        term: word(12)?,
        vote: word(20)?,
        floor: (word(28)?, word(36)?),
    })
}

fn encode(s: &Saved) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[..4].copy_from_slice(MAGIC);
    for (i, w) in [s.seq, s.term, s.vote, s.floor.0, s.floor.1]
        .into_iter()
        .enumerate()
    {
        b[4 + 8 * i..12 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    let crc = crc32fast::hash(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Writes `saved` into slot `saved.seq % 2`, synced when `sync` (blocking: run off the
/// shard's thread). Creates the topic's directory if needed.
pub(super) fn store_blocking(path: &Path, saved: &Saved, sync: bool) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)?;
    f.seek(SeekFrom::Start((saved.seq % 2) * SLOT as u64))?;
    f.write_all(&encode(saved))?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

impl super::ShardCluster {
    /// Saves `topic`'s term and vote when they changed since the last write (synced),
    /// and its vote floor when it moved (at most every [`CURSOR_EVERY`], unsynced).
    /// Returns false when the term and vote could not be saved (the error is logged).
    pub(super) async fn save_vote(&self, server: &Server, topic: &str) -> bool {
        let Some(data) = server.shard.opts.data_path.clone() else {
            return true;
        };
        let (next, sync, deleted) = {
            let groups = self.groups.borrow();
            let Some(g) = groups.get(topic) else {
                return true;
            };
            let (term, vote) = (g.group.term(), g.group.vote());
            let deleted = g.deleted;
            let floor = g.group.applied_position().unwrap_or(g.vote.saved.floor);
            let sync = (term, vote) != (g.vote.saved.term, g.vote.saved.vote);
            // The floor alone goes at most every CURSOR_EVERY, unsynced.
            let floor_due =
                floor > g.vote.saved.floor && g.vote.floor_saved_at.elapsed() >= CURSOR_EVERY;
            if !sync && !floor_due {
                return true;
            }
            let next = Saved {
                seq: g.vote.saved.seq + 1,
                term,
                vote,
                floor: floor.max(g.vote.saved.floor),
            };
            (next, sync, deleted)
        };
        let path = if deleted {
            tombstone_path(&data, topic)
        } else {
            path(&data, topic)
        };
        let written = glommio::executor()
            .spawn_blocking(move || store_blocking(&path, &next, sync))
            .await;
        match written {
            Ok(()) => {
                if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                    g.vote.saved = next;
                    g.vote.floor_saved_at = Instant::now();
                }
                true
            }
            Err(e) if sync => {
                log::error!("TOPIC({topic}): term and vote not saved ({e}); messages held back");
                false
            }
            Err(e) => {
                log::warn!("TOPIC({topic}): vote floor not saved ({e})");
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(seq: u64, term: u64, vote: u64, floor: (u64, u64)) -> Saved {
        Saved {
            seq,
            term,
            vote,
            floor,
        }
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_one_is_passed_over() {
        let dir = std::env::temp_dir().join(format!("nsqd-vote-{}", std::process::id()));
        let p = dir.join("t").join("raft-vote");
        assert_eq!(load(&p), None);
        store_blocking(&p, &saved(1, 3, 7, (2, 10)), true).unwrap();
        assert_eq!(load(&p), Some(saved(1, 3, 7, (2, 10))));
        store_blocking(&p, &saved(2, 4, 0, (3, 12)), false).unwrap();
        assert_eq!(load(&p), Some(saved(2, 4, 0, (3, 12))));
        // A crash tears the next write (slot 1): the previous state stands.
        store_blocking(&p, &saved(3, 5, 9, (4, 20)), true).unwrap();
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[SLOT + 13] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(load(&p), Some(saved(2, 4, 0, (3, 12))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
