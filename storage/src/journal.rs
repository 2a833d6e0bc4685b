//! The per-topic delivery journal, format version 1: what happened to messages between
//! two metadata checkpoints, so that a message's attempts count and a requeue delay
//! survive a crash (nsqd keeps both in memory only and loses them on a crash; its clean
//! shutdown writes them to the disk queue).
//!
//! Only the rare path is journaled, so the common one (deliver once, FIN) costs nothing:
//! a REQ (with the attempts so far and the due time), a redelivery (attempts >= 2: after
//! a REQ or a timeout), the FIN of a message delivered more than once, and a channel
//! empty. A crash therefore loses at most the first delivery's increment of a message
//! that was never requeued or timed out. After a restart, until the first checkpoint,
//! the FIN of every message that may have been delivered before it (below the head the
//! topic recovered) is journaled too, whatever its attempts: a crash loses a first
//! delivery's increment, so attempts cannot tell such a redelivery from a first one.
//!
//! Events are written to their file (the page cache) as they are recorded, so a process
//! crash keeps every event recorded before it, and synced with the records (`--sync-every`, `--sync-timeout`; with `--sync-every=1`, in the same
//! group commit as the publishes). Each metadata checkpoint starts a new generation
//! (`journal-<generation, 20 digits>.log`) and records in `meta.json` the last
//! generation it covers; once `meta.json` is written, files of covered generations are
//! deleted. Recovery applies `meta.json`, then the events of every newer generation in
//! order.
//!
//! ```text
//! event (all integers big-endian):
//!   [4]  u32 len = bytes after the crc field (28 + channel name length)
//!   [4]  u32 crc = CRC-32 (IEEE) of those len bytes
//!   [1]  u8  kind: 1 delivered, 2 requeued, 3 finished, 4 channel emptied
//!   [8]  u64 sequence of the message (emptied: the channel's new cursor)
//!   [2]  u16 attempts (deliveries so far)
//!   [8]  i64 due time, Unix ns (requeued with a delay; else 0)
//!   [1]  u8  channel name length n
//!   [n]  channel name
//! ```
//! A file ends at its first event that is torn or fails its CRC (a crash mid-append).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

const HEAD: usize = 8;
const FIXED: usize = 1 + 8 + 2 + 8 + 1;

/// What happened to a message of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Delivered again (attempts >= 2); it is in flight.
    Delivered = 1,
    /// REQ: ready again at `due_unix_ns` (0 = at once).
    Requeued = 2,
    /// FIN of a message delivered more than once, or recovered after a restart.
    Finished = 3,
    /// The channel was emptied: every message below `seq` (its new cursor) is dropped.
    Emptied = 4,
}

/// One journal event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub channel: String,
    pub seq: u64,
    pub attempts: u16,
    /// Unix ns; 0 = none.
    pub due_unix_ns: i64,
}

/// Appends one encoded event to `out`. Channel names longer than 255 bytes (nsqd allows
/// 64) are cut, which only makes their events unmatched at recovery.
pub fn encode(
    out: &mut Vec<u8>,
    kind: EventKind,
    channel: &str,
    seq: u64,
    attempts: u16,
    due_unix_ns: i64,
) {
    let name = &channel.as_bytes()[..channel.len().min(255)];
    let start = out.len();
    out.extend_from_slice(&((FIXED + name.len()) as u32).to_be_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.push(kind as u8);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&attempts.to_be_bytes());
    out.extend_from_slice(&due_unix_ns.to_be_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    let crc = crc32fast::hash(&out[start + HEAD..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

/// Decodes the events of one journal file. Returns them and, when the data does not end
/// cleanly, the byte offset and reason where decoding stopped (a torn or corrupt event).
pub fn decode(data: &[u8]) -> (Vec<Event>, Option<(usize, String)>) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let b = &data[at..];
        if b.len() < HEAD {
            return (out, Some((at, "torn event".into())));
        }
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if !(FIXED..=FIXED + 255).contains(&len) {
            return (out, Some((at, format!("event length {len} out of range"))));
        }
        if b.len() < HEAD + len {
            return (out, Some((at, "torn event".into())));
        }
        let p = &b[HEAD..HEAD + len];
        if crc32fast::hash(p) != u32::from_be_bytes([b[4], b[5], b[6], b[7]]) {
            return (out, Some((at, "event crc mismatch".into())));
        }
        let kind = match p[0] {
            1 => EventKind::Delivered,
            2 => EventKind::Requeued,
            3 => EventKind::Finished,
            4 => EventKind::Emptied,
            k => return (out, Some((at, format!("unknown event kind {k}")))),
        };
        let n = p[19] as usize;
        if FIXED + n != len {
            return (out, Some((at, "event name length mismatch".into())));
        }
        let u64_at = |o: usize| u64::from_be_bytes(p[o..o + 8].try_into().unwrap_or([0; 8]));
        out.push(Event {
            kind,
            seq: u64_at(1),
            attempts: u16::from_be_bytes([p[9], p[10]]),
            due_unix_ns: u64_at(11) as i64,
            channel: String::from_utf8_lossy(&p[FIXED..]).into_owned(),
        });
        at += HEAD + len;
    }
    (out, None)
}

/// The file of journal generation `gen` in `dir`.
pub fn path(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("journal-{gen:020}.log"))
}

/// The generation of a journal file name, if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    name.strip_prefix("journal-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

/// Reads every journal file of `dir` with a generation above `after` (blocking; run it
/// off the executor), oldest first, logging and stopping at a torn or corrupt event of a
/// file. Unreadable files are logged and skipped.
pub fn read_blocking(dir: &Path, after: u64) -> Vec<Event> {
    let mut gens: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| parse_name(&e.file_name().to_string_lossy()))
                .filter(|g| *g > after)
                .collect()
        })
        .unwrap_or_default();
    gens.sort_unstable();
    let mut out = Vec::new();
    for g in gens {
        let p = path(dir, g);
        match std::fs::read(&p) {
            Ok(data) => {
                let (evs, problem) = decode(&data);
                if let Some((off, why)) = problem {
                    log::warn!(
                        "STORE: {} offset {off}: {why}; the journal ends there",
                        p.display()
                    );
                }
                out.extend(evs);
            }
            Err(e) => log::error!("STORE: {} unreadable - {e}; skipped", p.display()),
        }
    }
    out
}

/// A message's state in a channel after folding the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageState {
    /// Not finished: delivered `attempts` times, ready at `due_unix_ns` (0 = at once).
    Pending {
        attempts: u16,
        due_unix_ns: i64,
    },
    Finished,
}

/// What the journal says about one channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelFold {
    /// Set when the channel was emptied: its cursor moved to at least this, and every
    /// message the checkpoint listed as pending is dropped.
    pub emptied_to: Option<u64>,
    /// The last state of each journaled message (after the last empty).
    pub states: BTreeMap<u64, MessageState>,
}

/// Folds events, in order, into each channel's final state.
pub fn fold(events: impl IntoIterator<Item = Event>) -> HashMap<String, ChannelFold> {
    let mut out: HashMap<String, ChannelFold> = HashMap::new();
    for e in events {
        let c = out.entry(e.channel).or_default();
        match e.kind {
            EventKind::Delivered => {
                c.states.insert(
                    e.seq,
                    MessageState::Pending {
                        attempts: e.attempts,
                        due_unix_ns: 0,
                    },
                );
            }
            EventKind::Requeued => {
                c.states.insert(
                    e.seq,
                    MessageState::Pending {
                        attempts: e.attempts,
                        due_unix_ns: e.due_unix_ns,
                    },
                );
            }
            EventKind::Finished => {
                c.states.insert(e.seq, MessageState::Finished);
            }
            EventKind::Emptied => {
                c.states.clear();
                c.emptied_to = Some(c.emptied_to.unwrap_or(0).max(e.seq));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_torn_tail_and_fold() {
        let mut b = Vec::new();
        encode(&mut b, EventKind::Requeued, "c", 5, 1, 1_000);
        encode(&mut b, EventKind::Delivered, "c", 5, 2, 0);
        encode(&mut b, EventKind::Requeued, "c", 5, 2, 2_000);
        encode(&mut b, EventKind::Requeued, "d", 6, 1, 0);
        encode(&mut b, EventKind::Finished, "d", 6, 2, 0);
        encode(&mut b, EventKind::Emptied, "e", 9, 0, 0);
        let whole = b.len();
        encode(&mut b, EventKind::Requeued, "c", 7, 1, 0);
        b.truncate(b.len() - 3);
        let (evs, problem) = decode(&b);
        assert_eq!(evs.len(), 6);
        assert_eq!(problem.map(|p| p.0), Some(whole));
        let f = fold(evs);
        assert_eq!(
            f["c"].states[&5],
            MessageState::Pending {
                attempts: 2,
                due_unix_ns: 2_000
            }
        );
        assert_eq!(f["d"].states[&6], MessageState::Finished);
        assert_eq!(f["e"].emptied_to, Some(9));
        let mut bad = b[..whole].to_vec();
        bad[20] ^= 1;
        assert!(decode(&bad).1.is_some());
        assert_eq!(parse_name("journal-00000000000000000012.log"), Some(12));
        assert_eq!(parse_name("journal-x.log"), None);
    }
}
