//! The delivery journal's files (no nsqd counterpart: nsqd keeps in-flight and
//! deferred state in memory only): recording events, appending them to the current
//! generation's file as soon as they are recorded, and syncing them with the records.

use super::descriptors::FdPath;
use super::retention::delete_covered_journals;
use super::segment_io::{close_off_thread, SegmentIo};
use super::{io_err, TopicStore};
use crate::error::StoreError;
use crate::journal::EventKind;
use std::rc::Rc;
use std::sync::Arc;

impl TopicStore {
    /// Journals what happened to message `seq` of `channel` (see [`crate::journal`]):
    /// the event reaches its file (the page cache) before this returns, so a process
    /// crash after it (the delivery it records may be in the consumer's hands as soon as
    /// the connection's writer runs) keeps it; the writer task syncs it with the records,
    /// counted toward `--sync-every` like a record. (Written a task turn later, as
    /// before, a kill -9 in between, tens of milliseconds on a loaded machine, lost a
    /// redelivery's attempts or a REQ's delay.)
    /// `attempts` counts deliveries so far; `due_unix_ns` is the requeue due time (Unix
    /// ns, 0 = none). No-op once the topic is deleted or the store closed.
    pub fn journal(
        &self,
        kind: EventKind,
        channel: &str,
        seq: u64,
        attempts: u16,
        due_unix_ns: i64,
    ) {
        if self.destroyed.get() || self.finished.get() {
            return;
        }
        let gen = self.journal_gen.get();
        {
            let mut p = self.journal_pending.borrow_mut();
            if p.last().is_none_or(|(g, _)| *g != gen) {
                p.push((gen, Vec::new()));
            }
            if let Some((_, buf)) = p.last_mut() {
                crate::journal::encode(buf, kind, channel, seq, attempts, due_unix_ns);
            }
        }
        self.journal_events.set(self.journal_events.get() + 1);
        // A borrowed journal file means a write is under way on this thread (never across
        // an await, so not expected): the flusher task writes the event then. On the
        // blocking-thread path (FUSE, network filesystems: a write there can wait for a
        // server) the flusher always does, off this thread.
        if self.cfg.io == SegmentIo::Ring && self.journal_file.try_borrow_mut().is_ok() {
            let n = flush_journal(self);
            if n > 0 {
                self.journal_written.set(self.journal_written.get() + n);
                self.wake.notify();
            }
        }
        self.journal_wake.notify();
    }

    /// True when events were journaled since the last [`TopicStore::journal_snapshot`]
    /// (the current generation has some, pending or in its file): a checkpoint must then
    /// write `meta.json` to cover them even if the metadata itself did not change.
    pub fn journal_has_events(&self) -> bool {
        let g = self.journal_gen.get();
        self.journal_files.borrow().contains(&g)
            || self
                .journal_pending
                .borrow()
                .iter()
                .any(|(pg, b)| *pg == g && !b.is_empty())
    }

    /// Starts a new journal generation and returns the one a metadata snapshot taken now
    /// covers (store it in `meta.json` as `journal_gen`). Call it in the same synchronous
    /// step that builds the snapshot.
    pub fn journal_snapshot(&self) -> u64 {
        let g = self.journal_gen.get();
        self.journal_gen.set(g + 1);
        g
    }

    /// Recovery: the metadata read covers generations up to `gen`. New events go to a
    /// later generation, and files of covered ones are deleted.
    pub fn journal_recovered(&self, gen: u64) {
        if self.journal_gen.get() <= gen {
            self.journal_gen.set(gen + 1);
        }
        self.journal_covered
            .set(self.journal_covered.get().max(gen));
        self.journal_wake.notify();
    }

    /// `meta.json` covering generations up to `gen` is written: their journal files are
    /// deleted (by the journal flusher task, or here once the store has stopped).
    /// Checkpoints of one topic must not overlap (a later generation must not be covered
    /// by an older `meta.json` written last).
    pub async fn journal_covered(&self, gen: u64) {
        self.journal_covered
            .set(self.journal_covered.get().max(gen));
        if self.finished.get() {
            delete_covered_journals(self).await;
        } else {
            self.journal_wake.notify();
        }
    }
}

/// The journal file being appended to.
pub(super) struct JournalFile {
    gen: u64,
    /// Opened for appending; shared with the blocking thread that fdatasyncs it.
    file: Arc<std::fs::File>,
    /// Written since its last sync.
    pub(super) dirty: bool,
}

/// Appends `data` to the journal file of generation `gen` with a plain buffered
/// `write(2)` on this thread, switching files when the generation changed (a dirty
/// previous file is handed to the writer's next sync). Blocking, but a write of a few
/// hundred bytes to the page cache takes microseconds, happens only on the rare paths
/// that are journaled, and makes the event survive a process crash at once; the same
/// through io_uring (open, statx, write) was measured to take tens of milliseconds on a
/// loaded machine, long enough for a kill -9 right after a REQ to lose it.
pub(super) fn journal_write(
    store: &TopicStore,
    jf: &mut Option<JournalFile>,
    gen: u64,
    data: &[u8],
) -> Result<(), StoreError> {
    append_events(
        jf,
        gen,
        data,
        |gen| {
            if store.destroyed.get() {
                return Err(StoreError::topic_deleted());
            }
            let file = open_journal(&store.fd_path(&crate::journal::path(&store.dir, gen))?)?;
            store.journal_files.borrow_mut().insert(gen);
            Ok(file)
        },
        |file| store.journal_retired.borrow_mut().push(file),
    )
}

/// Opens (creating it) a journal file for appending.
fn open_journal(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(io_err)
}

/// Appends `data` to `jf` when it is generation `gen`'s file; else `retire`s it (when
/// dirty: the writer's next sync must cover it) and appends to the file `open` gives.
fn append_events(
    jf: &mut Option<JournalFile>,
    gen: u64,
    data: &[u8],
    open: impl FnOnce(u64) -> Result<std::fs::File, StoreError>,
    retire: impl FnOnce(Arc<std::fs::File>),
) -> Result<(), StoreError> {
    use std::io::Write;
    if jf.as_ref().is_some_and(|j| j.gen != gen) {
        if let Some(j) = jf.take().filter(|j| j.dirty) {
            retire(j.file);
        }
    }
    let j = match jf {
        Some(j) => j,
        None => jf.insert(JournalFile {
            gen,
            file: Arc::new(open(gen)?),
            dirty: false,
        }),
    };
    j.dirty = true;
    (&*j.file).write_all(data).map_err(io_err)
}

/// [`flush_journal`] for the store's segment I/O path: on the blocking-thread path the
/// writes (and any file opens) run on the shard's blocking thread, one flush at a time
/// (`journal_io`), so a filesystem that makes them wait never stalls the shard.
pub(super) async fn flush_journal_io(store: &TopicStore) -> u64 {
    if store.cfg.io == SegmentIo::Ring {
        return flush_journal(store);
    }
    let Ok(_one_at_a_time) = store.journal_io.acquire_permit(1).await else {
        return 0;
    };
    let bufs = std::mem::take(&mut *store.journal_pending.borrow_mut());
    let events = store.journal_events.replace(0);
    let covered = store.journal_covered.get();
    if store.destroyed.get() {
        return events;
    }
    // (On this path the store keeps its directory open: no path is missing here.)
    let work: Vec<(u64, Vec<u8>, FdPath)> = bufs
        .into_iter()
        .filter(|(gen, _)| *gen > covered)
        .filter_map(|(gen, data)| {
            let path = store.fd_path(&crate::journal::path(&store.dir, gen)).ok()?;
            Some((gen, data, path))
        })
        .collect();
    let jf = store.journal_file.borrow_mut().take();
    let (jf, opened, retired, errors) = glommio::executor()
        .spawn_blocking(move || {
            let (mut jf, mut opened, mut retired, mut errors) = (jf, vec![], vec![], vec![]);
            for (gen, data, path) in work {
                let open = |gen| {
                    let f = open_journal(&path)?;
                    opened.push(gen);
                    Ok(f)
                };
                if let Err(e) = append_events(&mut jf, gen, &data, open, |f| retired.push(f)) {
                    errors.push(e);
                    jf = None;
                }
            }
            (jf, opened, retired, errors)
        })
        .await;
    store.journal_files.borrow_mut().extend(opened);
    store.journal_retired.borrow_mut().extend(retired);
    for e in errors {
        log::error!("STORE: journal of {} - {e}", store.dir.display());
    }
    let covered = store.journal_covered.get();
    match jf {
        Some(j) if j.gen > covered && !store.finished.get() && !store.destroyed.get() => {
            *store.journal_file.borrow_mut() = Some(j);
        }
        Some(j) => close_off_thread(j.file),
        None => {}
    }
    events
}

/// Writes every pending journal event to its generation's file (the page cache: a
/// process crash no longer loses it; the writer's next sync makes it durable), in order,
/// without yielding. Returns the events written.
pub(super) fn flush_journal(store: &TopicStore) -> u64 {
    let bufs = std::mem::take(&mut *store.journal_pending.borrow_mut());
    let events = store.journal_events.replace(0);
    let covered = store.journal_covered.get();
    let mut jf = store.journal_file.borrow_mut();
    for (gen, data) in bufs {
        if gen <= covered {
            continue; // already covered by meta.json
        }
        if let Err(e) = journal_write(store, &mut jf, gen, &data) {
            log::error!("STORE: journal of {} - {e}", store.dir.display());
            *jf = None;
        }
    }
    if jf.as_ref().is_some_and(|j| j.gen <= covered) {
        *jf = None;
    }
    events
}

/// Appends journal events [`TopicStore::journal`] could not write at once (a write was
/// under way), the task turn after, so that they never wait behind a sync of the
/// writer; the writer counts them toward `--sync-every` and syncs them with the
/// records. Also deletes covered generations.
pub(super) async fn journal_flusher(store: Rc<TopicStore>) {
    loop {
        store.journal_wake.wait().await;
        if store.finished.get() || store.destroyed.get() {
            break;
        }
        let n = flush_journal_io(&store).await;
        if n > 0 {
            store.journal_written.set(store.journal_written.get() + n);
            store.wake.notify();
        }
        delete_covered_journals(&store).await;
    }
}

/// Syncs (off this thread) the journal files written since their last sync. A write
/// made while the sync runs marks the file dirty again for the next one.
pub(super) async fn sync_journal(store: &TopicStore) {
    // On the blocking-thread path a flush may have the current file out: wait for it.
    let _one_at_a_time = match store.cfg.io {
        SegmentIo::Ring => None,
        SegmentIo::Threads => store.journal_io.acquire_permit(1).await.ok(),
    };
    let mut files: Vec<Arc<std::fs::File>> =
        std::mem::take(&mut *store.journal_retired.borrow_mut());
    let current = store
        .journal_file
        .borrow_mut()
        .as_mut()
        .filter(|j| j.dirty)
        .map(|j| {
            j.dirty = false;
            j.gen
        });
    if let Some(f) = store
        .journal_file
        .borrow()
        .as_ref()
        .filter(|_| current.is_some())
    {
        files.push(f.file.clone());
    }
    if files.is_empty() {
        return;
    }
    let res = glommio::executor()
        .spawn_blocking(move || files.iter().try_for_each(|f| f.sync_data()))
        .await;
    if let Err(e) = res {
        log::error!("STORE: journal sync of {} - {e}", store.dir.display());
        if let Some(j) = store.journal_file.borrow_mut().as_mut() {
            if Some(j.gen) == current {
                j.dirty = true;
            }
        }
    }
}
