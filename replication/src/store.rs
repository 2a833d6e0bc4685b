//! Raft's own log storage for one group: the [`LogStore`] trait (raft-rs's read-side
//! [`raft::Storage`] plus the writes the driver makes) and [`MemLog`], an in-memory
//! implementation.
//!
//! [`MemLog`] keeps everything in memory: a restarted broker comes back with an empty
//! log and relies on catch-up from the other replicas, unless the log is journaled
//! ([`crate::journal::JournaledLog`], which rebuilds a [`MemLog`] from its records).

use std::cell::Cell;

use raft::eraftpb::{ConfState, Entry as RaftEntry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// The writes [`crate::TopicGroup`] makes to a group's log, on top of raft-rs's read
/// side ([`raft::Storage`]).
///
/// The driver calls these synchronously from `poll` in the order raft-rs requires:
/// restore a received snapshot, append new entries, save the hard state, then (after
/// `advance`) record the new commit index. An implementation must have made each write
/// durable before it returns, because the driver sends the messages that depend on it
/// (votes, append acknowledgements) right after; an asynchronous store would instead
/// use raft-rs's `advance_append_async`/`on_persist_ready`, which this driver does not
/// use yet.
pub trait LogStore: Storage {
    /// Appends `entries` (consecutive indexes); any stored entry at or after
    /// `entries[0].index` is replaced (a leader overwrote an uncommitted suffix).
    ///
    /// # Errors
    ///
    /// [`StorageError::Unavailable`] if `entries[0].index` would leave a gap after the
    /// last stored entry; an I/O error from a durable store.
    fn append(&mut self, entries: &[RaftEntry]) -> raft::Result<()>;

    /// Saves the hard state (term, vote, commit).
    fn set_hard_state(&mut self, hard_state: &HardState);

    /// Records a new commit index (the hard state's `commit`).
    fn set_commit(&mut self, commit: u64);

    /// Saves the voters after a committed membership change (kept in later snapshots).
    fn set_conf_state(&mut self, conf_state: &ConfState);

    /// Replaces the log with a snapshot received from the leader: entries up to its index
    /// are dropped, and its index becomes the commit index.
    ///
    /// # Errors
    ///
    /// [`StorageError::SnapshotOutOfDate`] if the snapshot is older than the stored one.
    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> raft::Result<()>;

    /// Makes a snapshot at `index` with the application's state `data` and drops the
    /// entries up to `index`, so that a replica too far behind gets the snapshot instead.
    /// `index` equal to the current snapshot's makes a fresh one at the same index.
    ///
    /// # Errors
    ///
    /// [`StorageError::Unavailable`] if `index` is past the commit index or the last
    /// entry; a no-op if it is 0 or before the current snapshot.
    fn compact(&mut self, index: u64, data: Vec<u8>) -> raft::Result<()>;

    /// Whether raft-rs asked for a snapshot that the store did not have (none yet,
    /// or one whose voters do not include the replica it is for, such as a replica
    /// added after it was made); clears the request. The application then makes a fresh
    /// one with [`crate::TopicGroup::compact`], and raft-rs takes it on its next try.
    fn take_snapshot_request(&mut self) -> bool;
}

/// An in-memory [`LogStore`]: a vector of entries after the latest snapshot. No locks
/// (unlike raft-rs's `MemStorage`): it is owned by the one group that uses it.
#[derive(Clone, Debug, Default)]
pub struct MemLog {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot (metadata and data); index 0 when there is none.
    snapshot: Snapshot,
    /// The entries from `snapshot.index + 1` on.
    entries: Vec<RaftEntry>,
    /// The total size of `entries`' data, in bytes.
    entry_bytes: u64,
    /// Set when raft-rs asked for a snapshot the store could not give
    /// ([`LogStore::take_snapshot_request`]); a `Cell` because raft-rs asks through
    /// `&self`, and the store is owned by one thread.
    snapshot_wanted: Cell<bool>,
}

impl MemLog {
    /// An empty log of a group whose initial voters are `voters` (node ids, each
    /// nonzero). Every replica starts from the same initial voters, a replica added later
    /// included: it then replays the membership changes from the log (or receives them in
    /// a snapshot), as raft-rs requires of nodes that do not start from a snapshot.
    #[must_use]
    pub fn new(voters: &[u64]) -> Self {
        let mut log = Self::default();
        log.conf_state.voters = voters.to_vec();
        log.snapshot
            .mut_metadata()
            .set_conf_state(log.conf_state.clone());
        log
    }

    /// [`MemLog::new`] for a replica that restarts with the term and vote it saved
    /// (Raft's rule: a node never votes twice in one term, restarts included). Its log
    /// is empty: the leader sends it again what it lacks.
    #[must_use]
    pub fn with_term_vote(voters: &[u64], term: u64, vote: u64) -> Self {
        let mut log = Self::new(voters);
        log.hard_state.term = term;
        log.hard_state.vote = vote;
        log
    }

    /// [`MemLog::with_term_vote`] for a replica whose group's membership changed since
    /// it started: it restarts from the voters and learners it saved when it applied
    /// the latest change.
    #[must_use]
    pub fn with_members(voters: &[u64], learners: &[u64], term: u64, vote: u64) -> Self {
        let mut log = Self::with_term_vote(voters, term, vote);
        log.conf_state.learners = learners.to_vec();
        log.snapshot
            .mut_metadata()
            .set_conf_state(log.conf_state.clone());
        log
    }

    /// A log that starts after `base` (a snapshot's index, term and members, without
    /// its data) for a replica that restarts from its journal ([`crate::journal`]):
    /// `base`'s index counts as committed and applied, and the entries after it come
    /// from the journal's later records. The term and vote are those it saved.
    #[must_use]
    pub fn from_base(base: &SnapshotMetadata, term: u64, vote: u64) -> Self {
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(base.clone());
        Self {
            conf_state: base.get_conf_state().clone(),
            hard_state: HardState {
                term: term.max(base.term),
                vote,
                commit: base.index,
                ..HardState::default()
            },
            snapshot,
            ..Self::default()
        }
    }

    /// The latest snapshot's index, term and members (what a journal's base record
    /// holds).
    #[must_use]
    pub fn snapshot_metadata(&self) -> &SnapshotMetadata {
        self.snapshot.get_metadata()
    }

    /// The members after every applied membership change.
    #[must_use]
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    /// The stored entries after the latest snapshot (for tests and stats).
    #[must_use]
    pub fn stored_entries(&self) -> &[RaftEntry] {
        &self.entries
    }

    /// The saved hard state.
    #[must_use]
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// The size of the stored entries' data and contexts, in bytes (what compaction
    /// frees).
    #[must_use]
    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }
}

fn data_len(entries: &[RaftEntry]) -> u64 {
    entries
        .iter()
        .map(|e| (e.data.len() + e.context.len()) as u64)
        .sum()
}

impl Storage for MemLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<RaftEntry>> {
        let first = self.snapshot_index() + 1;
        if low < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let last = self.snapshot_index() + self.entries.len() as u64;
        if high > last + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = usize::try_from(low - first).unwrap_or(usize::MAX);
        let hi = usize::try_from(high - first).unwrap_or(usize::MAX);
        let mut out = self.entries.get(lo..hi).unwrap_or_default().to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let snap = self.snapshot_index();
        if idx == snap {
            return Ok(self.snapshot.get_metadata().term);
        }
        if idx < snap {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        let at = usize::try_from(idx - snap - 1).unwrap_or(usize::MAX);
        self.entries
            .get(at)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_index() + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_index() + self.entries.len() as u64)
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let conf = self.snapshot.get_metadata().get_conf_state();
        // raft-rs refuses to restore a snapshot whose voters and learners do not include
        // the receiving replica.
        let includes_to = conf.voters.contains(&to) || conf.learners.contains(&to);
        if self.snapshot_index() == 0 || self.snapshot_index() < request_index || !includes_to {
            self.snapshot_wanted.set(true);
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

impl LogStore for MemLog {
    fn append(&mut self, entries: &[RaftEntry]) -> raft::Result<()> {
        let Some(head) = entries.first() else {
            return Ok(());
        };
        let first = self.snapshot_index() + 1;
        let last = self.snapshot_index() + self.entries.len() as u64;
        let consecutive = entries.windows(2).all(|w| w[1].index == w[0].index + 1);
        if head.index > last + 1 || !consecutive {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        // Entries at or before the snapshot are already covered by it.
        let skip = usize::try_from(first.saturating_sub(head.index)).unwrap_or(usize::MAX);
        let Some(new) = entries.get(skip..).filter(|n| !n.is_empty()) else {
            return Ok(());
        };
        let keep = usize::try_from(new[0].index - first).unwrap_or(usize::MAX);
        if let Some(gone) = self.entries.get(keep..) {
            self.entry_bytes -= data_len(gone);
        }
        self.entries.truncate(keep);
        self.entries.extend_from_slice(new);
        self.entry_bytes += data_len(new);
        Ok(())
    }

    fn set_hard_state(&mut self, hard_state: &HardState) {
        self.hard_state = hard_state.clone();
    }

    fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    fn set_conf_state(&mut self, conf_state: &ConfState) {
        self.conf_state = conf_state.clone();
    }

    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> raft::Result<()> {
        let meta = snapshot.get_metadata();
        if meta.index < self.snapshot_index() {
            return Err(raft::Error::Store(StorageError::SnapshotOutOfDate));
        }
        self.hard_state.term = self.hard_state.term.max(meta.term);
        self.hard_state.commit = meta.index;
        self.conf_state = meta.get_conf_state().clone();
        self.entries.clear();
        self.entry_bytes = 0;
        self.snapshot = snapshot.clone();
        Ok(())
    }

    fn take_snapshot_request(&mut self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    fn compact(&mut self, index: u64, data: Vec<u8>) -> raft::Result<()> {
        // The same index again makes a fresh snapshot (the voters may have changed).
        if index == 0 || index < self.snapshot_index() {
            return Ok(());
        }
        if index > self.hard_state.commit {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let term = self.term(index)?;
        let drop = usize::try_from(index - self.snapshot_index()).unwrap_or(usize::MAX);
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        let dropped = drop.min(self.entries.len());
        self.entry_bytes -= data_len(&self.entries[..dropped]);
        self.entries.drain(..dropped);
        self.snapshot = snapshot;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> RaftEntry {
        RaftEntry {
            index,
            term,
            ..RaftEntry::default()
        }
    }

    fn ctx() -> GetEntriesContext {
        GetEntriesContext::empty(false)
    }

    #[test]
    fn append_replaces_a_suffix_and_refuses_gaps() {
        let mut log = MemLog::new(&[1, 2, 3]);
        log.append(&[entry(1, 1), entry(2, 1), entry(3, 1)])
            .unwrap();
        // A new leader's entry at index 2 replaces 2 and 3.
        log.append(&[entry(2, 2)]).unwrap();
        assert_eq!(log.last_index().unwrap(), 2);
        assert_eq!(log.term(2).unwrap(), 2);
        assert!(matches!(
            log.term(3),
            Err(raft::Error::Store(StorageError::Unavailable))
        ));
        assert!(log.append(&[entry(5, 2)]).is_err(), "a gap");
        assert!(
            log.append(&[entry(3, 2), entry(5, 2)]).is_err(),
            "a gap between the entries"
        );
        assert_eq!(log.last_index().unwrap(), 2, "nothing appended");
        assert_eq!(log.entries(1, 3, None, ctx()).unwrap().len(), 2);
        assert!(log.entries(1, 4, None, ctx()).is_err(), "past the end");
        assert!(log.entries(2, 1, None, ctx()).is_err(), "low > high");
    }

    #[test]
    fn compact_keeps_a_snapshot_and_drops_the_prefix() {
        let mut log = MemLog::new(&[1, 2, 3]);
        log.append(&[entry(1, 1), entry(2, 1), entry(3, 2)])
            .unwrap();
        assert!(log.compact(2, b"state".to_vec()).is_err(), "not committed");
        log.set_commit(3);
        log.compact(2, b"state".to_vec()).unwrap();
        assert_eq!(log.first_index().unwrap(), 3);
        assert_eq!(log.term(2).unwrap(), 1, "the snapshot keeps its term");
        assert!(matches!(
            log.entries(1, 3, None, ctx()),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let snap = log.snapshot(0, 1).unwrap();
        assert_eq!(snap.get_metadata().index, 2);
        assert_eq!(snap.get_data(), b"state");
        assert!(!log.take_snapshot_request());
        // A replica outside the snapshot's voters asks for a fresh one.
        assert!(log.snapshot(0, 4).is_err());
        assert!(log.take_snapshot_request());
        assert!(!log.take_snapshot_request(), "the request is cleared");
        // Appending at or before the snapshot skips what it covers.
        log.append(&[entry(2, 1), entry(3, 2), entry(4, 2)])
            .unwrap();
        assert_eq!(log.last_index().unwrap(), 4);
    }

    #[test]
    fn apply_snapshot_replaces_the_log() {
        let mut log = MemLog::new(&[1, 2, 3]);
        log.append(&[entry(1, 1)]).unwrap();
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 10;
        snap.mut_metadata().term = 3;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2, 4];
        log.apply_snapshot(&snap).unwrap();
        assert_eq!(log.first_index().unwrap(), 11);
        assert_eq!(log.last_index().unwrap(), 10);
        assert_eq!(log.hard_state().commit, 10);
        assert_eq!(
            log.initial_state().unwrap().conf_state.voters,
            vec![1, 2, 4]
        );
        snap.mut_metadata().index = 5;
        assert!(
            log.apply_snapshot(&snap).is_err(),
            "older than the stored one"
        );
    }
}
