//! The journal of a group's Raft log: the records that rebuild its [`MemLog`] after a
//! restart, so that what a replica acknowledged to its leader is still in its log
//! after a crash (Raft's rule that a follower persists entries before acknowledging
//! them). The broker journals under `--sync-every=1` (docs/replication.md,
//! "Guarantees"); this module encodes and decodes, and [`JournaledLog`] collects the
//! records its writes make. The caller writes them to the file (and syncs it) before
//! it sends the messages of the same poll.
//!
//! A journal is a sequence of records (integers little-endian):
//!
//! ```text
//! [4] u32 len = bytes after the crc field
//! [4] u32 crc = CRC-32 (IEEE) of those len bytes
//! [1] u8  kind: 1 base, 2 append, 3 commit
//!     base:   eraftpb.SnapshotMetadata (protobuf): the log starts after this index
//!             and term, with these members (a snapshot restored, or the journal
//!             started over)
//!     append: repeated { u32 n | n bytes of eraftpb.Entry (protobuf) }, consecutive
//!             indexes; any entry at or after the first one's index is replaced
//!     commit: u64 index known committed
//! ```
//!
//! The first record is a base. A rebuilt log starts with the members of its base and
//! the commit index last recorded: raft-rs hands the entries from the base to that
//! index out as committed again at once, so the application applies them again (its
//! membership changes included) before the replica takes part in an election with
//! members it no longer has. Reading stops at the first record that is torn or fails
//! its CRC (a crash mid-write): what follows it was never acknowledged.

use crate::store::{LogStore, MemLog};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry as RaftEntry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage};

const HEAD: usize = 8;
const BASE: u8 = 1;
const APPEND: u8 = 2;
const COMMIT: u8 = 3;

/// Records to write to the journal file: appended to it, or replacing it whole
/// (`replace`: the journal started over).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub bytes: Vec<u8>,
    pub replace: bool,
}

/// A [`MemLog`] whose writes are also recorded for its journal, or (not journaled)
/// a [`MemLog`] alone.
#[derive(Debug)]
pub struct JournaledLog {
    log: MemLog,
    /// `None`: not journaled.
    journal: Option<Journal>,
}

#[derive(Debug, Default)]
struct Journal {
    pending: Pending,
    /// The size of the file once `pending` is written, in bytes.
    bytes: u64,
    /// The commit index last recorded.
    commit: u64,
}

/// A log rebuilt from its journal by [`JournaledLog::recover`].
#[derive(Debug)]
pub struct Recovered {
    pub log: JournaledLog,
    /// The journal's bytes up to the end of its last valid record (the rest, when
    /// `torn`, was left out).
    pub valid_bytes: u64,
    /// Records after the last valid one were torn or corrupt: the journal starts over
    /// at the next write (its first [`JournaledLog::take_pending`] replaces the file).
    pub torn: bool,
}

impl JournaledLog {
    /// `log` without a journal.
    #[must_use]
    pub fn in_memory(log: MemLog) -> Self {
        Self { log, journal: None }
    }

    /// `log` with a new journal: the first [`take_pending`](Self::take_pending)
    /// replaces the file with a base at `log`'s snapshot and the entries after it.
    #[must_use]
    pub fn journaled(log: MemLog) -> Self {
        let mut j = Self {
            log,
            journal: Some(Journal::default()),
        };
        let base = j.log.snapshot_metadata().index;
        j.start_over(base);
        j
    }

    /// Rebuilds a log from the journal `bytes`, with the `term` and `vote` saved beside
    /// it. `None`: `bytes` holds no valid base record (empty, or torn in its first
    /// record): the log is unknown, as without a journal.
    #[must_use]
    pub fn recover(bytes: &[u8], term: u64, vote: u64) -> Option<Recovered> {
        let mut log: Option<MemLog> = None;
        let mut at = 0;
        let mut torn = false;
        while at < bytes.len() {
            let Some((kind, payload, next)) = read_record(bytes, at) else {
                torn = true;
                break;
            };
            let ok = match (kind, &mut log) {
                (BASE, _) => match SnapshotMetadata::parse_from_bytes(payload) {
                    Ok(meta) => {
                        log = Some(MemLog::from_base(&meta, term, vote));
                        true
                    }
                    Err(_) => false,
                },
                (APPEND, Some(l)) => parse_entries(payload).is_some_and(|e| {
                    let appended = l.append(&e).is_ok();
                    // A committed entry is never replaced: a record that would (a
                    // corrupt journal) leaves the commit index at the log's end, where
                    // raft-rs requires it.
                    let last = l.last_index().unwrap_or(0);
                    if l.hard_state().commit > last {
                        l.set_commit(last);
                    }
                    appended
                }),
                (COMMIT, Some(l)) => match payload.try_into().map(u64::from_le_bytes) {
                    Ok(c) => {
                        let last = l.last_index().unwrap_or(0);
                        if c > l.hard_state().commit {
                            l.set_commit(c.min(last));
                        }
                        true
                    }
                    Err(_) => false,
                },
                _ => false,
            };
            if !ok {
                torn = true;
                break;
            }
            at = next;
        }
        let log = log?;
        let journal = Journal {
            pending: Pending::default(),
            bytes: at as u64,
            commit: log.hard_state().commit,
        };
        let mut out = Self {
            log,
            journal: Some(journal),
        };
        if torn {
            let base = out.log.snapshot_metadata().index;
            out.start_over(base);
        }
        Some(Recovered {
            log: out,
            valid_bytes: at as u64,
            torn,
        })
    }

    /// The log.
    #[must_use]
    pub fn log(&self) -> &MemLog {
        &self.log
    }

    /// Whether the log is journaled.
    #[must_use]
    pub fn is_journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// The size of the journal file once what is pending is written, in bytes (0 when
    /// not journaled).
    #[must_use]
    pub fn journal_bytes(&self) -> u64 {
        self.journal.as_ref().map_or(0, |j| j.bytes)
    }

    /// The records written since the last call, for the caller to write to the file
    /// and sync; `None` when there are none.
    pub fn take_pending(&mut self) -> Option<Pending> {
        let j = self.journal.as_mut()?;
        if j.pending.bytes.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut j.pending))
    }

    /// Starts the journal over at `base`, which must be the snapshot's index or the
    /// index applied last (the members the base record takes are those of that
    /// moment): the next [`take_pending`](Self::take_pending) replaces the file with
    /// a base record and the entries after `base`. The caller makes sure that what
    /// `base` covers is on disk elsewhere (the topic's own log). Returns false, and
    /// changes nothing, when not journaled or `base` is outside the stored log.
    pub fn start_over(&mut self, base: u64) -> bool {
        let Some(j) = self.journal.as_mut() else {
            return false;
        };
        let snap = self.log.snapshot_metadata();
        let mut meta = SnapshotMetadata {
            index: base,
            ..SnapshotMetadata::default()
        };
        if base == snap.index {
            meta.term = snap.term;
            meta.set_conf_state(snap.get_conf_state().clone());
        } else {
            let Ok(term) = self.log.term(base) else {
                return false;
            };
            meta.term = term;
            meta.set_conf_state(self.log.conf_state().clone());
        }
        let first = snap.index + 1;
        let after = usize::try_from(base + 1 - first).unwrap_or(usize::MAX);
        let Some(entries) = self.log.stored_entries().get(after..) else {
            return false;
        };
        let mut bytes = Vec::new();
        push_base(&mut bytes, &meta);
        if !entries.is_empty() {
            push_append(&mut bytes, entries);
        }
        let commit = self.log.hard_state().commit;
        if commit > base {
            push_commit(&mut bytes, commit);
        }
        j.commit = commit;
        j.bytes = bytes.len() as u64;
        j.pending = Pending {
            bytes,
            replace: true,
        };
        true
    }

    fn record_commit(&mut self) {
        let commit = self.log.hard_state().commit;
        if self.journal.as_ref().is_some_and(|j| commit > j.commit) {
            self.record(|b| push_commit(b, commit));
            if let Some(j) = self.journal.as_mut() {
                j.commit = commit;
            }
        }
    }

    fn record(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        if let Some(j) = self.journal.as_mut() {
            let before = j.pending.bytes.len();
            f(&mut j.pending.bytes);
            j.bytes += (j.pending.bytes.len() - before) as u64;
        }
    }
}

fn read_record(bytes: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let head = bytes.get(at..at + HEAD)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    let body = bytes.get(at + HEAD..(at + HEAD).checked_add(len)?)?;
    if len == 0 || crc32fast::hash(body) != crc {
        return None;
    }
    Some((body[0], &body[1..], at + HEAD + len))
}

fn parse_entries(mut payload: &[u8]) -> Option<Vec<RaftEntry>> {
    let mut out = Vec::new();
    while !payload.is_empty() {
        let n = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
        let e = RaftEntry::parse_from_bytes(payload.get(4..4 + n)?).ok()?;
        out.push(e);
        payload = &payload[4 + n..];
    }
    Some(out)
}

fn push_record(out: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; HEAD]);
    out.push(kind);
    body(out);
    let len = u32::try_from(out.len() - start - HEAD).unwrap_or(u32::MAX);
    let crc = crc32fast::hash(&out[start + HEAD..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEAD].copy_from_slice(&crc.to_le_bytes());
}

fn push_base(out: &mut Vec<u8>, meta: &SnapshotMetadata) {
    push_record(out, BASE, |b| {
        // Writing a message of plain fields to a vector cannot fail.
        let _ = meta.write_to_vec(b);
    });
}

fn push_commit(out: &mut Vec<u8>, commit: u64) {
    push_record(out, COMMIT, |b| b.extend_from_slice(&commit.to_le_bytes()));
}

fn push_append(out: &mut Vec<u8>, entries: &[RaftEntry]) {
    push_record(out, APPEND, |b| {
        for e in entries {
            let n = e.compute_size();
            b.extend_from_slice(&n.to_le_bytes());
            let _ = e.write_to_vec(b);
        }
    });
}

impl Storage for JournaledLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.log.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<RaftEntry>> {
        self.log.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.log.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.log.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.log.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        self.log.snapshot(request_index, to)
    }
}

impl LogStore for JournaledLog {
    fn append(&mut self, entries: &[RaftEntry]) -> raft::Result<()> {
        self.log.append(entries)?;
        if !entries.is_empty() {
            self.record(|b| push_append(b, entries));
        }
        Ok(())
    }

    fn set_hard_state(&mut self, hard_state: &HardState) {
        self.log.set_hard_state(hard_state);
        self.record_commit();
    }

    fn set_commit(&mut self, commit: u64) {
        self.log.set_commit(commit);
        self.record_commit();
    }

    fn set_conf_state(&mut self, conf_state: &ConfState) {
        self.log.set_conf_state(conf_state);
    }

    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> raft::Result<()> {
        self.log.apply_snapshot(snapshot)?;
        let meta = snapshot.get_metadata().clone();
        self.record(|b| push_base(b, &meta));
        if let Some(j) = self.journal.as_mut() {
            j.commit = meta.index;
        }
        Ok(())
    }

    fn compact(&mut self, index: u64, data: Vec<u8>) -> raft::Result<()> {
        // The journal keeps what the memory drops: it starts over only when the
        // caller knows the topic's own log has it ([`JournaledLog::start_over`]).
        self.log.compact(index, data)
    }

    fn take_snapshot_request(&mut self) -> bool {
        self.log.take_snapshot_request()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> RaftEntry {
        RaftEntry {
            index,
            term,
            data: data.to_vec().into(),
            ..RaftEntry::default()
        }
    }

    fn written(log: &mut JournaledLog, file: &mut Vec<u8>) {
        if let Some(p) = log.take_pending() {
            if p.replace {
                file.clear();
            }
            file.extend_from_slice(&p.bytes);
        }
        assert_eq!(log.journal_bytes(), file.len() as u64);
    }

    fn indexes_terms(log: &MemLog) -> Vec<(u64, u64)> {
        log.stored_entries()
            .iter()
            .map(|e| (e.index, e.term))
            .collect()
    }

    #[test]
    fn recovery_replays_appends_suffix_replacements_and_snapshots() {
        let mut file = Vec::new();
        let mut log = JournaledLog::journaled(MemLog::new(&[1, 2, 3]));
        written(&mut log, &mut file);
        log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")])
            .unwrap();
        written(&mut log, &mut file);
        // A new leader replaced entry 3, and entries up to 3 are committed.
        log.append(&[entry(3, 2, b"C"), entry(4, 2, b"d")]).unwrap();
        log.set_commit(3);
        written(&mut log, &mut file);
        let r = JournaledLog::recover(&file, 2, 7).unwrap();
        assert!(!r.torn);
        assert_eq!(r.valid_bytes, file.len() as u64);
        assert_eq!(
            indexes_terms(r.log.log()),
            vec![(1, 1), (2, 1), (3, 2), (4, 2)]
        );
        assert_eq!(r.log.log().stored_entries()[2].data.as_ref(), b"C");
        assert_eq!(
            r.log.log().hard_state().commit,
            3,
            "raft-rs hands out 1 to 3 as committed again"
        );
        assert_eq!(r.log.log().hard_state().vote, 7);
        assert_eq!(
            r.log.log().initial_state().unwrap().conf_state.voters,
            vec![1, 2, 3]
        );

        // A snapshot restored: the log starts after it, with its members.
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 10;
        snap.mut_metadata().term = 3;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 4];
        log.apply_snapshot(&snap).unwrap();
        log.append(&[entry(11, 3, b"e")]).unwrap();
        written(&mut log, &mut file);
        let r = JournaledLog::recover(&file, 3, 0).unwrap();
        assert_eq!(r.log.log().first_index().unwrap(), 11);
        assert_eq!(r.log.log().term(10).unwrap(), 3);
        assert_eq!(indexes_terms(r.log.log()), vec![(11, 3)]);
        assert_eq!(
            r.log.log().hard_state().commit,
            10,
            "the base counts as committed"
        );
        assert_eq!(
            r.log.log().initial_state().unwrap().conf_state.voters,
            vec![1, 2, 4]
        );
    }

    #[test]
    fn a_torn_tail_is_dropped_and_the_journal_starts_over() {
        let mut file = Vec::new();
        let mut log = JournaledLog::journaled(MemLog::new(&[1, 2]));
        log.append(&[entry(1, 1, b"a")]).unwrap();
        written(&mut log, &mut file);
        log.append(&[entry(2, 1, b"b")]).unwrap();
        written(&mut log, &mut file);
        // The last record loses its final byte, then one byte of it flips.
        for bad in [file[..file.len() - 1].to_vec(), {
            let mut f = file.clone();
            let at = f.len() - 2;
            f[at] ^= 0xff;
            f
        }] {
            let mut r = JournaledLog::recover(&bad, 1, 0).unwrap();
            assert!(r.torn);
            assert_eq!(indexes_terms(r.log.log()), vec![(1, 1)]);
            let p = r.log.take_pending().unwrap();
            assert!(
                p.replace,
                "the file is replaced, not appended after the torn record"
            );
            let again = JournaledLog::recover(&p.bytes, 1, 0).unwrap();
            assert!(!again.torn);
            assert_eq!(indexes_terms(again.log.log()), vec![(1, 1)]);
        }
        assert!(
            JournaledLog::recover(&file[..HEAD + 1], 1, 0).is_none(),
            "no whole base"
        );
        assert!(JournaledLog::recover(&[], 1, 0).is_none());
    }

    #[test]
    fn starting_over_keeps_the_entries_after_the_base() {
        let mut file = Vec::new();
        let mut log = JournaledLog::journaled(MemLog::new(&[1, 2, 3]));
        log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 2, b"c")])
            .unwrap();
        written(&mut log, &mut file);
        log.set_commit(2);
        written(&mut log, &mut file);
        // Compaction drops entries from memory, not from the journal.
        log.compact(1, Vec::new()).unwrap();
        assert!(log.take_pending().is_none());
        assert!(!log.start_over(5), "past the log");
        assert!(log.start_over(2));
        written(&mut log, &mut file);
        let r = JournaledLog::recover(&file, 2, 0).unwrap();
        assert_eq!(r.log.log().first_index().unwrap(), 3);
        assert_eq!(r.log.log().term(2).unwrap(), 1);
        assert_eq!(indexes_terms(r.log.log()), vec![(3, 2)]);
        assert!(!log.start_over(0), "compacted away");
    }

    /// A replica rebuilt from its journal applies the membership changes it had
    /// applied before its first election: raft-rs hands out the entries up to the
    /// recorded commit index as committed again. (Without the commit record it kept
    /// the members of the journal's base and refused the votes of a member added
    /// since: a cluster-chaos run stayed without a leader.)
    #[test]
    fn a_rebuilt_log_applies_its_committed_membership_changes_again() {
        use crate::{GroupConfig, Membership, TopicGroup};
        let mut file = Vec::new();
        let mut g = TopicGroup::new(
            &GroupConfig::new(1),
            JournaledLog::journaled(MemLog::new(&[1])),
        )
        .unwrap();
        g.campaign().unwrap();
        let poll = |g: &mut TopicGroup<JournaledLog>, file: &mut Vec<u8>| {
            let out = g.poll().unwrap();
            written(g.store_mut(), file);
            out
        };
        for _ in 0..3 {
            poll(&mut g, &mut file);
        }
        assert!(g.is_leader());
        g.propose_membership(Membership::AddLearner(2)).unwrap();
        for _ in 0..3 {
            poll(&mut g, &mut file);
        }
        assert_eq!(g.learners(), vec![2]);
        let term = g.term();
        drop(g);

        let r = JournaledLog::recover(&file, term, 1).unwrap();
        let mut again = TopicGroup::new(&GroupConfig::new(1), r.log).unwrap();
        assert!(
            again.learners().is_empty(),
            "the base's members until applied"
        );
        let out = poll(&mut again, &mut file);
        assert_eq!(out.learners, Some(vec![2]));
        assert_eq!(again.learners(), vec![2]);
    }

    /// A journal whose records pass their checksums but contradict each other (a
    /// committed entry replaced: never written by this code) rebuilds a log that
    /// raft-rs accepts, rather than one it would stop on at every start.
    #[test]
    fn a_commit_past_a_replaced_suffix_is_brought_back_to_the_log() {
        use crate::{GroupConfig, TopicGroup};
        let mut file = Vec::new();
        push_base(&mut file, &SnapshotMetadata::default());
        push_append(
            &mut file,
            &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
        );
        push_commit(&mut file, 3);
        push_append(&mut file, &[entry(2, 2, b"B")]);
        let r = JournaledLog::recover(&file, 2, 0).unwrap();
        assert!(!r.torn);
        assert_eq!(r.log.log().hard_state().commit, 2);
        assert!(TopicGroup::new(&GroupConfig::new(1), r.log).is_ok());
    }

    #[test]
    fn a_log_in_memory_records_nothing() {
        let mut log = JournaledLog::in_memory(MemLog::new(&[1]));
        log.append(&[entry(1, 1, b"a")]).unwrap();
        assert!(log.take_pending().is_none());
        assert!(!log.start_over(0));
        assert_eq!(log.journal_bytes(), 0);
    }
}
