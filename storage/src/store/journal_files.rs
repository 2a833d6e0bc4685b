//! The delivery journal's files (no nsqd counterpart: nsqd keeps in-flight and
//! deferred state in memory only): recording events, appending them to the current
//! generation's file as soon as they are recorded, and syncing them with the records.

use super::descriptors::{Directory, FdPath};
use super::lifecycle::Lifecycle;
use super::retention::delete_covered_journals;
use super::segment_io::{close_off_thread, SegmentIo};
use super::{io_err, TopicStore};
use crate::error::StoreError;
use crate::journal::EventKind;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

impl TopicStore {
    /// Journals what happened to message `seq` of `channel` (see [`crate::journal`]):
    /// the event reaches its file (the page cache) before this returns, so a process
    /// crash after it (the delivery it records may be in the consumer's hands as soon as
    /// the connection's writer runs) keeps it; the writer task syncs it with the records,
    /// counted toward `--sync-every` like a record. (An event written a task turn later
    /// is lost by a kill -9 in between, tens of milliseconds on a loaded machine: a
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
        if self.dir.is_deleted() || self.life.finished() {
            return;
        }
        self.journal
            .record(kind, channel, seq, attempts, due_unix_ns);
        // A borrowed journal file means a write is under way on this thread (never across
        // an await, so not expected): the flusher task writes the event then. On the
        // blocking-thread path (FUSE, network filesystems: a write there can wait for a
        // server) the flusher always does, off this thread.
        if self.cfg.io == SegmentIo::Ring && self.journal.file_free() {
            let n = self.journal.flush(&self.dir);
            if n > 0 {
                self.durability.journal_written(n);
                self.life.wake();
            }
        }
        self.journal.wake();
    }

    /// True when events were journaled since the last [`TopicStore::journal_snapshot`]
    /// (the current generation has some, pending or in its file): a checkpoint must then
    /// write `meta.json` to cover them even if the metadata itself did not change.
    pub fn journal_has_events(&self) -> bool {
        self.journal.has_events()
    }

    /// Starts a new journal generation and returns the one a metadata snapshot taken now
    /// covers (store it in `meta.json` as `journal_gen`). Call it in the same synchronous
    /// step that builds the snapshot.
    pub fn journal_snapshot(&self) -> u64 {
        self.journal.snapshot()
    }

    /// Recovery: the metadata read covers generations up to `gen`. New events go to a
    /// later generation, and files of covered ones are deleted.
    pub fn journal_recovered(&self, gen: u64) {
        self.journal.recovered(gen);
    }

    /// `meta.json` covering generations up to `gen` is written: their journal files are
    /// deleted (by the journal flusher task, or here once the store has stopped).
    /// Checkpoints of one topic must not overlap (a later generation must not be covered
    /// by an older `meta.json` written last).
    pub async fn journal_covered(&self, gen: u64) {
        self.journal.cover(gen);
        if self.life.finished() {
            delete_covered_journals(self).await;
        } else {
            self.journal.wake();
        }
    }
}

/// A store's delivery journal: events recorded and not yet written, the generations and
/// their files, and the file being appended to.
pub(super) struct Journal {
    /// Encoded events not yet written, by generation (oldest first).
    pending: RefCell<Vec<(u64, Vec<u8>)>>,
    /// Events in `pending`.
    events: Cell<u64>,
    /// The generation new events go to.
    gen: Cell<u64>,
    /// Generations at or below this are covered by `meta.json`: their files go.
    covered: Cell<u64>,
    /// Generations that have a file on disk.
    files: RefCell<BTreeSet<u64>>,
    /// The file being appended to; held across a write or a generation switch.
    file: RefCell<Option<JournalFile>>,
    /// One flush at a time on the blocking-thread path ([`SegmentIo::Threads`]), where a
    /// flush holds the current file across an await.
    io: glommio::sync::Semaphore,
    /// Dirty files of earlier generations, synced by the writer's next sync.
    retired: RefCell<Vec<Arc<std::fs::File>>>,
    /// Wakes the journal flusher task.
    wake: crate::Notify,
}

impl Journal {
    /// No events and no files yet; new events go to generation 1.
    pub(super) fn new() -> Journal {
        Journal {
            pending: RefCell::new(Vec::new()),
            events: Cell::new(0),
            gen: Cell::new(1),
            covered: Cell::new(0),
            files: RefCell::new(BTreeSet::new()),
            file: RefCell::new(None),
            io: glommio::sync::Semaphore::new(1),
            retired: RefCell::new(Vec::new()),
            wake: crate::Notify::default(),
        }
    }

    /// Recovery found the files of generations `gens`: new events go to a later one.
    pub(super) fn found_files(&self, gens: BTreeSet<u64>) {
        self.gen.set(gens.last().map(|g| g + 1).unwrap_or(1));
        *self.files.borrow_mut() = gens;
    }

    /// Encodes an event into the pending events of the current generation.
    fn record(&self, kind: EventKind, channel: &str, seq: u64, attempts: u16, due_unix_ns: i64) {
        let gen = self.gen.get();
        {
            let mut p = self.pending.borrow_mut();
            if p.last().is_none_or(|(g, _)| *g != gen) {
                p.push((gen, Vec::new()));
            }
            if let Some((_, buf)) = p.last_mut() {
                crate::journal::encode(buf, kind, channel, seq, attempts, due_unix_ns);
            }
        }
        self.events.set(self.events.get() + 1);
    }

    /// True when no write holds the current file (see [`TopicStore::journal`]).
    fn file_free(&self) -> bool {
        self.file.try_borrow_mut().is_ok()
    }

    /// See [`TopicStore::journal_has_events`].
    fn has_events(&self) -> bool {
        let g = self.gen.get();
        self.files.borrow().contains(&g)
            || self
                .pending
                .borrow()
                .iter()
                .any(|(pg, b)| *pg == g && !b.is_empty())
    }

    /// See [`TopicStore::journal_snapshot`].
    fn snapshot(&self) -> u64 {
        let g = self.gen.get();
        self.gen.set(g + 1);
        g
    }

    /// See [`TopicStore::journal_recovered`].
    fn recovered(&self, gen: u64) {
        if self.gen.get() <= gen {
            self.gen.set(gen + 1);
        }
        self.cover(gen);
        self.wake.notify();
    }

    /// Generations up to `gen` are covered by `meta.json`.
    fn cover(&self, gen: u64) {
        self.covered.set(self.covered.get().max(gen));
    }

    /// Takes the generations covered by `meta.json` that have a file: theirs to delete.
    pub(super) fn take_covered_files(&self) -> Vec<u64> {
        let covered = self.covered.get();
        let mut files = self.files.borrow_mut();
        let gone: Vec<u64> = files.iter().copied().filter(|g| *g <= covered).collect();
        for g in &gone {
            files.remove(g);
        }
        gone
    }

    /// True when events wait to be written.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.borrow().is_empty()
    }

    /// True when the store holds a journal file open.
    pub(super) fn holds_file(&self) -> bool {
        self.file.borrow().is_some()
    }

    /// True when something of the journal is not yet synced: events pending, a dirty
    /// current file, or dirty files of earlier generations.
    pub(super) fn unsynced(&self) -> bool {
        self.file.borrow().as_ref().is_some_and(|j| j.dirty)
            || !self.retired.borrow().is_empty()
            || !self.pending.borrow().is_empty()
    }

    /// Closes the current file.
    pub(super) fn drop_file(&self) {
        *self.file.borrow_mut() = None;
    }

    /// Wakes the journal flusher task.
    pub(super) fn wake(&self) {
        self.wake.notify();
    }

    /// Completes at the next [`Journal::wake`] (or one not yet seen).
    pub(super) async fn woken(&self) {
        self.wake.wait().await
    }

    /// Takes the pending events: (generation, encoded events) oldest first, the number
    /// of events, and the generation `meta.json` covers now.
    fn take_pending(&self) -> (Vec<(u64, Vec<u8>)>, u64, u64) {
        let bufs = std::mem::take(&mut *self.pending.borrow_mut());
        (bufs, self.events.replace(0), self.covered.get())
    }

    /// Writes every pending event to its generation's file in `dir` (the page cache: a
    /// process crash no longer loses it; the writer's next sync makes it durable), in
    /// order, without yielding, switching files when the generation changed (a dirty
    /// previous file is handed to the writer's next sync). Returns the events written.
    ///
    /// A plain buffered `write(2)` on this thread: blocking, but a write of a few hundred
    /// bytes to the page cache takes microseconds, happens only on the rare paths that
    /// are journaled, and makes the event survive a process crash at once; the same
    /// through io_uring (open, statx, write) was measured to take tens of milliseconds on
    /// a loaded machine, long enough for a kill -9 right after a REQ to lose it.
    pub(super) fn flush(&self, dir: &Directory) -> u64 {
        let (bufs, events, covered) = self.take_pending();
        let mut jf = self.file.borrow_mut();
        for (gen, data) in bufs {
            if gen <= covered {
                continue; // already covered by meta.json
            }
            let open = |gen| {
                if dir.is_deleted() {
                    return Err(StoreError::topic_deleted());
                }
                let file = open_journal(&dir.fd_path(&crate::journal::path(dir.path(), gen))?)?;
                self.files.borrow_mut().insert(gen);
                Ok(file)
            };
            let retire = |file| self.retired.borrow_mut().push(file);
            if let Err(e) = append_events(&mut jf, gen, &data, open, retire) {
                log::error!("STORE: journal of {} - {e}", dir.display());
                *jf = None;
            }
        }
        if jf.as_ref().is_some_and(|j| j.gen <= covered) {
            *jf = None;
        }
        events
    }

    /// [`Journal::flush`] for the store's segment I/O path `io`: on the blocking-thread
    /// path the writes (and any file opens) run on the shard's blocking thread, one flush
    /// at a time, so a filesystem that makes them wait never stalls the shard.
    pub(super) async fn flush_io(&self, io: SegmentIo, dir: &Directory, life: &Lifecycle) -> u64 {
        if io == SegmentIo::Ring {
            return self.flush(dir);
        }
        let Ok(_one_at_a_time) = self.io.acquire_permit(1).await else {
            return 0;
        };
        let (bufs, events, covered) = self.take_pending();
        if dir.is_deleted() {
            return events;
        }
        // (On this path the store keeps its directory open: no path is missing here.)
        let work: Vec<(u64, Vec<u8>, FdPath)> = bufs
            .into_iter()
            .filter(|(gen, _)| *gen > covered)
            .filter_map(|(gen, data)| {
                let path = dir.fd_path(&crate::journal::path(dir.path(), gen)).ok()?;
                Some((gen, data, path))
            })
            .collect();
        let jf = self.file.borrow_mut().take();
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
        self.files.borrow_mut().extend(opened);
        self.retired.borrow_mut().extend(retired);
        for e in errors {
            log::error!("STORE: journal of {} - {e}", dir.display());
        }
        let covered = self.covered.get();
        match jf {
            Some(j) if j.gen > covered && !life.finished() && !dir.is_deleted() => {
                *self.file.borrow_mut() = Some(j);
            }
            Some(j) => close_off_thread(j.file),
            None => {}
        }
        events
    }

    /// Syncs (off this thread) the files written since their last sync. A write made
    /// while the sync runs marks the file dirty again for the next one.
    pub(super) async fn sync(&self, io: SegmentIo, dir: &Directory) {
        // On the blocking-thread path a flush may have the current file out: wait for it.
        let _one_at_a_time = match io {
            SegmentIo::Ring => None,
            SegmentIo::Threads => self.io.acquire_permit(1).await.ok(),
        };
        let mut files: Vec<Arc<std::fs::File>> = std::mem::take(&mut *self.retired.borrow_mut());
        let current = self
            .file
            .borrow_mut()
            .as_mut()
            .filter(|j| j.dirty)
            .map(|j| {
                j.dirty = false;
                j.gen
            });
        if let Some(f) = self.file.borrow().as_ref().filter(|_| current.is_some()) {
            files.push(f.file.clone());
        }
        if files.is_empty() {
            return;
        }
        let res = glommio::executor()
            .spawn_blocking(move || files.iter().try_for_each(|f| f.sync_data()))
            .await;
        if let Err(e) = res {
            log::error!("STORE: journal sync of {} - {e}", dir.display());
            if let Some(j) = self.file.borrow_mut().as_mut() {
                if Some(j.gen) == current {
                    j.dirty = true;
                }
            }
        }
    }
}

/// The journal file being appended to.
struct JournalFile {
    gen: u64,
    /// Opened for appending; shared with the blocking thread that fdatasyncs it.
    file: Arc<std::fs::File>,
    /// Written since its last sync.
    dirty: bool,
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

/// Appends journal events [`TopicStore::journal`] could not write at once (a write was
/// under way), the task turn after, so that they never wait behind a sync of the
/// writer; the writer counts them toward `--sync-every` and syncs them with the
/// records. Also deletes covered generations.
pub(super) async fn journal_flusher(store: Rc<TopicStore>) {
    loop {
        store.journal.woken().await;
        if store.life.finished() || store.dir.is_deleted() {
            break;
        }
        let n = store
            .journal
            .flush_io(store.cfg.io, &store.dir, &store.life)
            .await;
        if n > 0 {
            store.durability.journal_written(n);
            store.life.wake();
        }
        delete_covered_journals(&store).await;
    }
}
