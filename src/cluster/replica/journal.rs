//! The files of the groups' Raft log journals ([`nsq_replication::journal`]): with
//! `--sync-every=1` each replica writes what its Raft log received to
//! `cluster-log/<topic>` under the data path and syncs it before it acknowledges any of
//! it (to the leader, or, on the leader, to a publisher), and a member that restarts
//! rebuilds its log from it. Without `--sync-every=1` the log is kept in memory only
//! (docs/replication.md, "Guarantees").
//!
//! The journal starts over (a base record at the index applied last and the entries
//! after it, written to a new file that replaces the old one) once it exceeds
//! [`START_OVER_BYTES`], after the topic's own log and metadata have synced what the
//! base covers.

use super::ShardCluster;
use crate::server::Server;
use glommio::io::{BufferedFile, Directory, OpenOptions};
use nsq_replication::raft::Storage as _;
use nsq_replication::{JournaledLog, MemLog, Pending};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The journal size past which it starts over at the index applied last, in bytes.
pub(super) const START_OVER_BYTES: u64 = 1 << 20;

/// How long a journal stays open after its last write (one descriptor per topic
/// being written, none for a quiet one).
const CLOSE_AFTER: Duration = Duration::from_secs(1);

/// A group's journal file, open while the topic is written.
pub(super) struct OpenJournal {
    file: Rc<BufferedFile>,
    used: Instant,
}

/// Where `topic`'s journal lives under `data_path`: outside the topic's directory,
/// which a deletion through the log removes while the group runs on.
pub(super) fn path(data_path: &Path, topic: &str) -> PathBuf {
    data_path.join("cluster-log").join(topic)
}

/// The journal's bytes, `None` when there is no journal (blocking: one read, when the
/// group starts).
///
/// # Errors
///
/// The read's, other than a missing file.
pub(super) fn load(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where a journal with no valid record is set aside: `<topic>~bad`, a name no topic
/// has.
fn set_aside_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("~bad");
    PathBuf::from(p)
}

/// Writes `pending` to the journal at `path` and syncs it, through io_uring, so that
/// the journals of a shard's topics are written and synced side by side: appended at
/// `offset` (the file's size) to `open` (the journal's file if it is open), or
/// (`replace`) written to `<topic>~` (a name no topic has), synced and renamed over the
/// journal, with the directory synced after. Returns the journal's file, open.
pub(super) async fn write(
    path: &Path,
    pending: Pending,
    offset: u64,
    open: Option<Rc<BufferedFile>>,
) -> std::io::Result<Rc<BufferedFile>> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("a journal path without a directory"))?;
    if !pending.replace {
        let f = match open {
            Some(f) => f,
            None => Rc::new(OpenOptions::new().write(true).buffered_open(path).await?),
        };
        write_all_at(&f, pending.bytes, offset).await?;
        f.fdatasync().await?;
        return Ok(f);
    }
    // The old file, renamed over below, is closed when dropped.
    drop(open);
    if !dir.exists() {
        let d = dir.to_path_buf();
        glommio::executor()
            .spawn_blocking(move || std::fs::create_dir_all(&d))
            .await?;
        if let Some(data) = dir.parent() {
            Directory::open(data).await?.sync().await?;
        }
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push("~");
    let mut f = BufferedFile::create(PathBuf::from(tmp)).await?;
    let synced = match write_all_at(&f, pending.bytes, 0).await {
        Ok(()) => f.fdatasync().await.map_err(std::io::Error::from),
        Err(e) => Err(e),
    };
    synced?;
    f.rename(path).await?;
    Directory::open(dir).await?.sync().await?;
    Ok(Rc::new(f))
}

/// Writes `bytes` at `offset`; a short write (the disk full) is an error: the group
/// stops ([`ShardCluster::write_journal`]), and what the write left is a torn tail.
async fn write_all_at(f: &BufferedFile, bytes: Vec<u8>, offset: u64) -> std::io::Result<()> {
    let len = bytes.len();
    let n = f.write_at(bytes, offset).await?;
    if n < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            format!("{n} of {len} bytes written"),
        ));
    }
    Ok(())
}

/// Removes `topic`'s journal and a temporary file a start-over left (blocking): for a
/// replica removed from the group (`set_aside_too`: a journal set aside too), or a
/// member whose log is in memory.
pub(super) fn remove_blocking(
    data_path: &Path,
    topic: &str,
    set_aside_too: bool,
) -> std::io::Result<()> {
    let p = path(data_path, topic);
    let mut tmp = p.as_os_str().to_owned();
    tmp.push("~");
    let mut files = vec![p.clone(), PathBuf::from(tmp)];
    if set_aside_too {
        files.push(set_aside_path(&p));
    }
    for f in files {
        match std::fs::remove_file(f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

impl ShardCluster {
    /// The Raft log a group of `topic` starts with on this member: rebuilt from its
    /// journal when there is one (`--sync-every=1`), else empty with the members
    /// (`voters`, `learners`) and the term and vote it saved. `None`: the journal cannot
    /// be read (logged); the member holds no replica of the topic until it restarts
    /// (the caller remembers it), rather than write over a journal that may hold what
    /// it acknowledged.
    pub(super) fn log_of(
        server: &Server,
        topic: &str,
        voters: &[u64],
        learners: &[u64],
        saved: super::vote::Saved,
    ) -> Option<JournaledLog> {
        let empty = MemLog::with_members(voters, learners, saved.term, saved.vote);
        let data = match server.shard.opts.data_path.as_ref() {
            Some(d) if server.shard.opts.sync_every <= 1 => d,
            Some(d) => {
                // A journal from a run under --sync-every=1 would be stale by the time
                // that flag came back: the log is in memory from here on.
                if let Err(e) = remove_blocking(d, topic, false) {
                    log::warn!("TOPIC({topic}): an old Raft log journal not removed: {e}");
                }
                return Some(JournaledLog::in_memory(empty));
            }
            None => return Some(JournaledLog::in_memory(empty)),
        };
        let p = path(data, topic);
        let bytes = match load(&p) {
            Ok(Some(b)) if !b.is_empty() => b,
            Ok(_) => return Some(JournaledLog::journaled(empty)),
            Err(e) => {
                log::error!(
                    "TOPIC({topic}): its Raft log journal {} cannot be read ({e}); this member holds no replica of the topic until it is restarted with the journal readable",
                    p.display()
                );
                return None;
            }
        };
        let Some(r) = JournaledLog::recover(&bytes, saved.term, saved.vote) else {
            let aside = set_aside_path(&p);
            log::warn!(
                "TOPIC({topic}): its Raft log journal {} holds no valid record ({} bytes); set aside as {}, the log comes from the leader as after a lost disk",
                p.display(),
                bytes.len(),
                aside.display()
            );
            if let Err(e) = std::fs::rename(&p, &aside) {
                log::error!("TOPIC({topic}): {} not set aside ({e}); not replicated on this member until it is", p.display());
                return None;
            }
            return Some(JournaledLog::journaled(empty));
        };
        if r.torn {
            log::warn!(
                "TOPIC({topic}): its Raft log journal {} ends in a record that is torn or fails its checksum: {} of its {} bytes, after the last valid record, left out (a write cut by a crash, or damage); the log comes from the leader from there",
                p.display(),
                bytes.len() as u64 - r.valid_bytes,
                bytes.len()
            );
        }
        let log = r.log.log();
        let (first, last) = (
            log.first_index().unwrap_or(0),
            log.last_index().unwrap_or(0),
        );
        if last >= first {
            log::info!(
                "TOPIC({topic}): Raft log recovered from its journal: entries {first} to {last}"
            );
        } else {
            log::info!(
                "TOPIC({topic}): Raft log recovered from its journal: no entry after index {}",
                first - 1
            );
        }
        Some(r.log)
    }

    /// Whether `topic`'s Raft log is journaled on this member.
    pub(super) fn journaled(&self, topic: &str) -> bool {
        self.groups
            .borrow()
            .get(topic)
            .is_some_and(|g| g.group.store().is_journaled())
    }

    /// Writes and syncs what `topic`'s log recorded since the last write. False when
    /// the write failed: the group stops here (its log in memory is then ahead of its
    /// journal, and acknowledging would promise what a crash can take), and the
    /// caller sends none of the messages of this poll.
    pub(super) async fn write_journal(&self, server: &Server, topic: &str) -> bool {
        let Some(data) = server.shard.opts.data_path.clone() else {
            return true;
        };
        let (pending, offset, open) = {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(topic) else {
                return true;
            };
            let open = g.journal_file.as_ref().map(|o| o.file.clone());
            let store = g.group.store_mut();
            match store.take_pending() {
                Some(p) => {
                    let offset = store.journal_bytes() - p.bytes.len() as u64;
                    (p, offset, open)
                }
                None => return true,
            }
        };
        match write(&path(&data, topic), pending, offset, open).await {
            Ok(file) => {
                if let Some(g) = self.groups.borrow_mut().get_mut(topic) {
                    g.journal_file = Some(OpenJournal {
                        file,
                        used: Instant::now(),
                    });
                }
                true
            }
            Err(e) => {
                // Acknowledging without the journal would promise what a crash can take.
                self.stop_group(
                    server,
                    topic,
                    &format!("its Raft log journal was not written ({e}); restart the member once the disk is fixed"),
                );
                false
            }
        }
    }

    /// Waits until `topic`'s own log and metadata have on disk what was applied to it;
    /// false when they may not (a failed sync, or a store that reports a disk error).
    pub(super) async fn topic_synced(&self, server: &Server, topic: &str) -> bool {
        let mut synced = true;
        if let Some(w) = server.shard.topic_durable_wait(topic) {
            let store = w.store.clone();
            if let Err(e) = crate::owner::wait_durable(Some(w)).await {
                log::warn!("TOPIC({topic}): not synced ({e})");
                synced = false;
            }
            if let Some(e) = store.error() {
                log::warn!("TOPIC({topic}): its store reports a disk error ({e})");
                synced = false;
            }
        }
        server.shard.persist_changes().await;
        synced && server.shard.meta_healthy()
    }

    /// Closes the journals not written for [`CLOSE_AFTER`], and starts over each journal
    /// larger than [`START_OVER_BYTES`] at the index its group applied last, once the
    /// topic has that on disk (at most once per applied index).
    ///
    /// `all`: every group; otherwise only the awake ones (a quiet group's journal does
    /// not grow: the driver sweeps them all less often).
    pub(super) async fn start_journals_over(&self, server: &Server, all: bool) {
        let names: Vec<String> = if all {
            self.groups.borrow().keys().cloned().collect()
        } else {
            self.awake.borrow().iter().cloned().collect()
        };
        let mut large: Vec<(String, u64)> = Vec::new();
        for topic in names {
            let mut groups = self.groups.borrow_mut();
            let Some(g) = groups.get_mut(&topic) else {
                continue;
            };
            if g.journal_file
                .as_ref()
                .is_some_and(|o| o.used.elapsed() >= CLOSE_AFTER)
            {
                g.journal_file = None;
            }
            if !g.stopped
                && g.group.store().journal_bytes() > START_OVER_BYTES
                && g.group.applied_index() > g.journal_started_at
            {
                large.push((topic, g.group.applied_index()));
            }
        }
        for (topic, applied) in large {
            // Once per applied index: a journal that cannot shrink (what is not applied
            // exceeds the threshold) or whose topic cannot sync is tried again only
            // after more is applied.
            if let Some(g) = self.groups.borrow_mut().get_mut(&topic) {
                g.journal_started_at = applied;
            }
            if !self.topic_synced(server, &topic).await {
                // Kept whole: its entries may be all this member holds of them.
                continue;
            }
            let started = self
                .groups
                .borrow_mut()
                .get_mut(&topic)
                .is_some_and(|g| g.group.store_mut().start_over(applied));
            if started {
                self.write_journal(server, &topic).await;
            }
        }
    }
}
