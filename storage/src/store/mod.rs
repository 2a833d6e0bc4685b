//! One topic's segment log on glommio DMA files (io_uring, O_DIRECT, aligned buffers).
//!
//! * Appends are encoded into a pending buffer (no syscall, no await) and written by the
//!   store's writer task in batches through a `DmaStreamWriter` (group commit).
//! * `fdatasync` runs after `sync_every` records or `sync_timeout` with records unsynced,
//!   and at once when a publisher waits for durability; every publisher waiting at that
//!   moment shares the same sync.
//! * A segment is closed and a new one started once it passes `max_bytes_per_file`
//!   (checked between batches, so a segment may exceed it by one batch).
//! * Reads by sequence use a sparse in-memory index (one entry per [`INDEX_EVERY`]
//!   records) and only cover data already flushed to the file.
//! * A segment is sealed when nothing more goes into it (rotation, clean close, or
//!   recovery of a segment a crash left open): its side index `<base>.idx`
//!   ([`crate::index`]) holds its record count, sequence range and sparse index.
//! * The segment being written is checkpointed too: after a sync, every
//!   `--sync-timeout` or `PARTIAL_EVERY` bytes, `<base>.pidx` describes its synced
//!   prefix (same format).
//! * Recovery reads the index of each sealed segment and scans (CRC-checking every
//!   record) only segments without a valid one: in practice the one being written when
//!   the process died, and that one only after its last partial index. Corrupt records and torn tails a scan meets are logged with
//!   file and offset and skipped; corrupt records of sealed segments are found, logged
//!   and skipped when a channel reads them. Only the newest segment's last records are
//!   loaded into memory. Writing then continues in a new segment.
//! * Journal events ([`crate::journal`]) are appended to their file (the page cache) as
//!   they are recorded, before the call that records them returns (never behind a
//!   sync), and synced by the writer with the records, counted toward `--sync-every`
//!   like records.
//!
//! By concept, with the parts of nsqd's diskqueue.go they correspond to:
//!
//! * `writer`: the writer task (diskqueue ioLoop's write side, writeOne, sync),
//! * `reader`: reads by sequence (readOne; nsqd reads one message at a time from a
//!   single read position, here any channel reads from any sequence),
//! * `recovery`: opening a topic's directory after a start or crash (retrieveMetaData,
//!   and the scan nsqd does not do: it trusts its metadata file),
//! * `checkpoint`: side indexes of sealed and open segments (persistMetaData),
//! * `retention`: deleting segments every channel has passed and deleting a topic
//!   (moveForward's removal of a read file, Delete/Empty),
//! * `journal_files`: the delivery journal's files (no nsqd counterpart),
//! * `replay`: segment listing and timestamp seek (no nsqd counterpart).

use crate::error::StoreError;
use crate::index::SegmentIndex;
use crate::record::{self, StoredRecord};
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// One sparse index entry per this many records.
pub const INDEX_EVERY: u64 = 256;
/// Bytes read per step during recovery.
const RECOVERY_CHUNK: usize = 8 * 1024 * 1024;
/// Largest pending buffer kept for reuse (bytes); a bigger one (a burst) is freed.
const SPARE_MAX: usize = 64 << 20;
/// A pending buffer above this capacity is kept for reuse only while batches fill a
/// quarter of it: after a burst, the next small batch lets it go (freed, and counted
/// for the heap trim: [`crate::take_buffers_freed`]).
const SPARE_KEEP: usize = 1 << 20;
/// Most bytes of appended records a store holds unwritten while its disk fails
/// ([`TopicStore::admit`]): past this, new publishes are refused instead of queued. What
/// was queued before is never dropped, so this bounds the memory a failing disk costs.
pub const UNWRITTEN_MAX: usize = 64 << 20;
/// DmaStreamWriter buffer size.
const WRITE_BUFFER: usize = 256 * 1024;
/// The open segment's partial index is rewritten after a sync once this many bytes were
/// added since the last one (or `--sync-timeout` passed): a crash leaves at most about
/// this much (plus what was not synced) to scan.
const PARTIAL_EVERY: u64 = 8 * 1024 * 1024;
/// At most this many bytes of the newest sealed segment are read back at start-up for
/// the memory tail; older records are read from disk when a channel needs them.
const TAIL_BYTES: u64 = 16 * 1024 * 1024;

mod blocks;
mod checkpoint;
mod descriptors;
mod journal_files;
mod reader;
mod recovery;
mod replay;
mod retention;
mod segment_io;
mod writer;

pub use descriptors::stores_holding_descriptors;
use journal_files::{journal_flusher, JournalFile};
pub use replay::SegmentInfo;
pub use segment_io::SegmentIo;
use writer::writer_task;

/// Sync and rotation policy (nsqd flags --sync-every, --sync-timeout,
/// --max-bytes-per-file).
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub max_bytes_per_file: u64,
    pub sync_every: u64,
    pub sync_timeout: Duration,
    /// How segment files are written and read ([`SegmentIo::choose`]).
    pub io: SegmentIo,
}

struct Segment {
    path: PathBuf,
    /// The salt its records carry (from its header).
    salt: u32,
    /// One past the last sequence written to it.
    end_seq: u64,
    /// (sequence, byte offset) of records number 0, INDEX_EVERY, 2 * INDEX_EVERY, ...
    /// (by count, not by sequence: sequences may have gaps).
    index: Vec<(u64, u64)>,
    /// Records in the segment.
    count: u64,
    /// Records with sequence below this are flushed to the file and readable.
    readable_seq: u64,
    /// Bytes below this offset are flushed (they hold the records below
    /// `readable_seq`); readers never decode past it, where the file holds a partly
    /// written stream buffer (or nothing yet). For a segment found on disk at start-up:
    /// where its records end (its side index's data end, or where recovery's scan found
    /// the last whole record).
    readable_end: u64,
}

impl Segment {
    /// Adds a record at byte offset `off` to the count and sparse index.
    fn note(&mut self, seq: u64, off: u64) {
        if self.count.is_multiple_of(INDEX_EVERY) {
            self.index.push((seq, off));
        }
        self.count += 1;
        self.end_seq = seq + 1;
    }

    /// The side index describing this segment once sealed; `None` when it is empty.
    fn sealed_index(&self, base: u64, data_end: u64) -> Option<SegmentIndex> {
        let first = self.index.first()?.0;
        Some(SegmentIndex {
            base,
            salt: self.salt,
            file_len: 0,
            data_end,
            count: self.count,
            first_seq: first,
            last_seq: self.end_seq.checked_sub(1)?,
            entries: self.index.clone(),
        })
    }
}

struct Waiter {
    seq: u64,
    tx: oneshot::Sender<Result<(), StoreError>>,
}

/// The disk side of one topic.
pub struct TopicStore {
    dir: PathBuf,
    cfg: StoreConfig,
    segments: RefCell<BTreeMap<u64, Segment>>,
    readers: RefCell<HashMap<u64, Rc<segment_io::SegmentFile>>>,
    /// Blocks of segment data read recently, shared by the channels' reads.
    blocks: blocks::BlockCache,
    pending: RefCell<Vec<u8>>,
    /// Bytes of the batch the writer task has taken from `pending` and is writing (or
    /// about to put back after a failure): still unwritten, so counted by
    /// [`TopicStore::unwritten_bytes`].
    in_write: Cell<usize>,
    /// (sequence, encoded length) of each pending record.
    pending_recs: RefCell<Vec<(u64, u32)>>,
    /// The other half of the double buffer (empty, with its capacity kept).
    spare: RefCell<Vec<u8>>,
    spare_recs: RefCell<Vec<(u64, u32)>>,
    /// Next sequence to append.
    next_seq: Cell<u64>,
    /// Records below this are fdatasync'ed.
    durable_seq: Cell<u64>,
    waiters: RefCell<Vec<Waiter>>,
    wake: Rc<crate::Notify>,
    closing: Cell<bool>,
    /// The last write or sync error, cleared by the next success (nsqd's health).
    error: RefCell<Option<StoreError>>,
    /// Rate limit of the error's log lines ([`TopicStore::set_error`]).
    error_logged: crate::repeat_log::RepeatLog,
    /// Set once the writer task has finished (after `close`).
    done: Rc<crate::Notify>,
    finished: Cell<bool>,
    /// The topic directory, open while the store is active (see [`descriptors`]): files
    /// are opened through `/proc/self/fd/<fd>/` so that renaming the directory (topic
    /// delete) never breaks an open in flight.
    dir_fd: RefCell<Option<descriptors::HeldDir>>,
    /// The directory's (device, inode), checked when it is opened again by its path.
    dir_id: (u64, u64),
    /// Opens of segment files in flight; files are unlinked only when none is.
    opens: Cell<usize>,
    /// Topic deleted: no more writes or opens.
    destroyed: Cell<bool>,
    /// This writer's salt, in every record and segment header it writes.
    salt: u32,
    /// Publishers waiting for the pending buffer to drain (backpressure).
    drain_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// Encoded journal events not yet written, by generation (oldest first).
    journal_pending: RefCell<Vec<(u64, Vec<u8>)>>,
    /// Events in `journal_pending`.
    journal_events: Cell<u64>,
    /// The generation new journal events go to.
    journal_gen: Cell<u64>,
    /// Generations at or below this are covered by `meta.json`: their files go.
    journal_covered: Cell<u64>,
    /// Generations that have a file on disk.
    journal_files: RefCell<BTreeSet<u64>>,
    /// The journal file being appended to; held across a write or a generation switch.
    journal_file: RefCell<Option<JournalFile>>,
    /// One journal flush at a time on the blocking-thread path ([`SegmentIo::Threads`]),
    /// where a flush holds the current file across an await.
    journal_io: glommio::sync::Semaphore,
    /// Dirty files of earlier generations, synced by the writer's next sync.
    journal_retired: RefCell<Vec<Arc<std::fs::File>>>,
    /// Events written to the page cache by the flusher and not yet counted by the writer
    /// toward `--sync-every`.
    journal_written: Cell<u64>,
    /// Wakes the journal flusher task.
    journal_wake: Rc<crate::Notify>,
    /// A partial index of the open segment is being written.
    partial_busy: Cell<bool>,
}

/// A random salt for a new writer instance.
fn new_salt() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() as u32).max(1)
}

/// Where a sequential read stopped: the record with sequence >= `seq` starts at byte
/// `offset` of the segment that begins at sequence `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPos {
    pub base: u64,
    pub offset: u64,
    pub seq: u64,
}

/// What recovery found in a topic's directory.
pub struct Recovered {
    pub store: Rc<TopicStore>,
    /// The newest records of the newest segment (at most `keep` of them and about
    /// `TAIL_BYTES` bytes), oldest first; older ones are read back when needed.
    pub tail: VecDeque<StoredRecord>,
    /// The oldest sequence still on disk.
    pub first_seq: u64,
    /// One past the newest sequence on disk.
    pub next_seq: u64,
    /// Segments recovered from their side index (not scanned).
    pub sealed_segments: usize,
    /// Segments scanned record by record (no valid index: left open by a crash, or
    /// written before indexes existed).
    pub scanned_segments: usize,
    /// Bytes those scans read (a segment with a partial index is scanned from its end).
    pub scanned_bytes: u64,
}

fn seg_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.seg"))
}

fn idx_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

/// The partial index of the segment being written: it describes the segment's synced
/// prefix (same format as a sealed index; its data end is where a scan resumes).
fn pidx_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.pidx"))
}

/// An I/O error (std's or glommio's) as a [`StoreError`] that keeps its kind.
fn io_err<E: std::fmt::Display + Into<std::io::Error>>(e: E) -> StoreError {
    StoreError::io(e)
}

impl TopicStore {
    /// Records a write or sync error (the store is unhealthy until a success clears it)
    /// and logs `line`: at once for a new error, then at most once a second while the
    /// same error repeats, with the count of repeats (a full disk under load fails
    /// thousands of syncs a second).
    pub(crate) fn set_error(&self, e: &StoreError, line: std::fmt::Arguments<'_>) {
        let same = self.error.borrow().as_ref() == Some(e);
        self.error_logged.error(same, line);
        *self.error.borrow_mut() = Some(e.clone());
    }
}

impl TopicStore {
    /// Creates the store of a new topic (its directory must not hold old data) and spawns
    /// its writer task. The directory is created at once; segment files lazily.
    pub fn create(
        dir: PathBuf,
        cfg: StoreConfig,
        next_seq: u64,
    ) -> Result<Rc<TopicStore>, StoreError> {
        let dir_fd = TopicStore::prepare_dir(&dir)?;
        TopicStore::create_in(dir, dir_fd, cfg, next_seq)
    }

    /// The blocking half of [`TopicStore::create`]: makes the directory (and its
    /// parents) and opens it. For a thread off the shard where a `mkdir` can wait for a
    /// server (FUSE, network filesystems: [`SegmentIo::Threads`]).
    ///
    /// Errors: the `mkdir` or `open` failure, naming the directory.
    pub fn prepare_dir(dir: &Path) -> Result<std::fs::File, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io_err(e).context(format_args!("create {}", dir.display())))?;
        std::fs::File::open(dir)
            .map_err(|e| io_err(e).context(format_args!("open {}", dir.display())))
    }

    /// The rest of [`TopicStore::create`], with `dir_fd` from
    /// [`TopicStore::prepare_dir`]: builds the store and spawns its writer (no I/O).
    pub fn create_in(
        dir: PathBuf,
        dir_fd: std::fs::File,
        cfg: StoreConfig,
        next_seq: u64,
    ) -> Result<Rc<TopicStore>, StoreError> {
        TopicStore::start(dir, dir_fd, true, cfg, BTreeMap::new(), next_seq)
    }

    /// Builds the store around its (recovered or empty) segments and its open
    /// directory, and spawns its writer. The directory stays open when `hold` (a new
    /// topic, about to be written) or on the blocking-thread path; otherwise (a recovered
    /// topic) it is closed at once and opened again when needed.
    ///
    /// Errors: the directory's `fstat` failure.
    fn start(
        dir: PathBuf,
        dir_fd: std::fs::File,
        hold: bool,
        cfg: StoreConfig,
        segments: BTreeMap<u64, Segment>,
        next_seq: u64,
    ) -> Result<Rc<TopicStore>, StoreError> {
        let dir_id = descriptors::dir_id(&dir_fd)
            .map_err(|e| io_err(e).context(format_args!("stat {}", dir.display())))?;
        let dir_fd =
            (hold || cfg.io == SegmentIo::Threads).then(|| descriptors::HeldDir::new(dir_fd));
        let store = Rc::new(TopicStore {
            dir,
            cfg,
            segments: RefCell::new(segments),
            readers: RefCell::new(HashMap::new()),
            blocks: blocks::BlockCache::default(),
            pending: RefCell::new(Vec::new()),
            in_write: Cell::new(0),
            pending_recs: RefCell::new(Vec::new()),
            spare: RefCell::new(Vec::new()),
            spare_recs: RefCell::new(Vec::new()),
            next_seq: Cell::new(next_seq),
            durable_seq: Cell::new(next_seq),
            waiters: RefCell::new(Vec::new()),
            wake: Rc::new(crate::Notify::default()),
            closing: Cell::new(false),
            error: RefCell::new(None),
            error_logged: Default::default(),
            done: Rc::new(crate::Notify::default()),
            finished: Cell::new(false),
            dir_fd: RefCell::new(dir_fd),
            dir_id,
            opens: Cell::new(0),
            destroyed: Cell::new(false),
            salt: new_salt(),
            drain_waiters: RefCell::new(Vec::new()),
            journal_pending: RefCell::new(Vec::new()),
            journal_events: Cell::new(0),
            journal_gen: Cell::new(1),
            journal_covered: Cell::new(0),
            journal_files: RefCell::new(BTreeSet::new()),
            journal_file: RefCell::new(None),
            journal_io: glommio::sync::Semaphore::new(1),
            journal_retired: RefCell::new(Vec::new()),
            journal_written: Cell::new(0),
            journal_wake: Rc::new(crate::Notify::default()),
            partial_busy: Cell::new(false),
        });
        glommio::spawn_local(writer_task(store.clone())).detach();
        glommio::spawn_local(journal_flusher(store.clone())).detach();
        Ok(store)
    }

    /// Records below this sequence can be read back from disk.
    pub fn readable_seq(&self) -> u64 {
        let segs = self.segments.borrow();
        match segs.values().next_back() {
            Some(s) => s.readable_seq,
            None => self.durable_seq.get(),
        }
    }

    /// The directory holding this store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The next sequence this store expects.
    pub fn next_seq(&self) -> u64 {
        self.next_seq.get()
    }

    /// Records below this sequence are durable (fdatasync'ed).
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq.get()
    }

    /// The last disk error, if the store is unhealthy.
    pub fn error(&self) -> Option<StoreError> {
        self.error.borrow().clone()
    }

    /// Queues a record; written by the writer task. Its `seq` must be at least
    /// `next_seq()`: sequences skipped over are absent from the log (records every
    /// channel finished before they were written).
    pub fn append(&self, rec: &StoredRecord) {
        debug_assert!(rec.seq >= self.next_seq.get());
        let len = record::encode(rec, self.salt, &mut self.pending.borrow_mut());
        self.pending_recs.borrow_mut().push((rec.seq, len as u32));
        self.next_seq.set(rec.seq + 1);
        self.wake.notify();
    }

    /// Moves the next sequence to at least `seq` without writing anything: the sequences
    /// in between are absent (recovery of a topic whose newest records were finished
    /// before they were written).
    pub fn advance_to(&self, seq: u64) {
        if seq > self.next_seq.get() {
            self.next_seq.set(seq);
            if self.pending.borrow().is_empty() {
                self.durable_seq.set(self.durable_seq.get().max(seq));
            }
        }
    }

    /// Bytes appended and not yet handed to the writer.
    pub fn pending_bytes(&self) -> usize {
        self.pending.borrow().len()
    }

    /// Drops the records below `seq` from those waiting to be written (the pending buffer,
    /// which holds them in sequence order; the batch being written is left alone), and
    /// returns how many. For records every channel has finished (the topic's low
    /// watermark), which no reader needs: after a long disk outage, what a consumer
    /// drained meanwhile is not written at all, so the space it freed goes to what is
    /// still to be delivered. Their sequences become gaps, as for records finished
    /// before they were due to be written. Not for topics kept for replay.
    pub fn forget_unwritten_below(&self, seq: u64) -> usize {
        let mut recs = self.pending_recs.borrow_mut();
        let n = recs.partition_point(|&(s, _)| s < seq);
        if n == 0 {
            return 0;
        }
        let bytes: usize = recs[..n].iter().map(|&(_, len)| len as usize).sum();
        recs.drain(..n);
        self.pending.borrow_mut().drain(..bytes);
        n
    }

    /// Bytes of appended records not yet written to a segment: the pending buffer and
    /// the batch being written (which a failed write puts back in front of it).
    pub fn unwritten_bytes(&self) -> usize {
        self.pending.borrow().len() + self.in_write.get()
    }

    /// Whether a publish of about `bytes` more may be appended. While the disk fails
    /// (the store holds an error), appended records wait in memory for the writer's
    /// retries and are never dropped; once [`UNWRITTEN_MAX`] bytes wait, new publishes
    /// are refused with the disk's error (nsqd answers `E_PUB_FAILED` / 503 when its
    /// disk queue cannot take a message) before anything already acknowledged is lost.
    /// A healthy store always admits (publishers wait for a long pending buffer instead:
    /// [`TopicStore::wait_pending_below`]).
    pub fn admit(&self, bytes: usize) -> Result<(), StoreError> {
        match self.error.borrow().as_ref() {
            Some(e) if self.unwritten_bytes() + bytes > UNWRITTEN_MAX => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Waits until the pending buffer holds at most `limit` bytes (or the store closes).
    pub async fn wait_pending_below(&self, limit: usize) {
        while self.pending_bytes() > limit && !self.finished.get() {
            let (tx, rx) = oneshot::channel();
            self.drain_waiters.borrow_mut().push(tx);
            self.wake.notify();
            let _ = rx.await;
        }
    }

    /// Completes once every record below `seq` is durable (group commit), or with the
    /// disk error that prevented it.
    pub fn wait_durable(
        &self,
        seq: u64,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let rx = if self.durable_seq.get() >= seq {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            self.waiters.borrow_mut().push(Waiter { seq, tx });
            self.wake.notify();
            Some(rx)
        };
        async move {
            match rx {
                None => Ok(()),
                Some(rx) => rx.await.unwrap_or_else(|_| Err(StoreError::exiting())),
            }
        }
    }

    /// Writes the topic's `meta.json` ([`crate::meta::write_to`], fsynced when `sync`) through the held
    /// directory fd, so that it lands in this store's directory and nowhere else: not in
    /// a directory made again under the same name by a later topic, and never a new one.
    /// `Ok(false)`: the topic was deleted before or during the write, so nothing was
    /// written that a start could find (a delete moves the directory aside and removes
    /// it once this write is over); an error of a write cut off by the delete is none.
    pub async fn write_meta(
        &self,
        meta: crate::meta::TopicMeta,
        sync: bool,
    ) -> std::io::Result<bool> {
        self.in_dir(move |dir| crate::meta::write_to(dir, &meta, sync))
            .await
    }

    /// fsyncs the `meta.json` [`TopicStore::write_meta`] wrote without a sync, and the
    /// directory ([`crate::meta::sync_blocking`]); `Ok(false)` as there.
    pub async fn sync_meta(&self) -> std::io::Result<bool> {
        self.in_dir(crate::meta::sync_blocking).await
    }

    /// Runs `f` on a blocking thread with the path of the held directory fd (see
    /// [`TopicStore::write_meta`]).
    async fn in_dir<F>(&self, f: F) -> std::io::Result<bool>
    where
        F: FnOnce(&Path) -> std::io::Result<()> + Send + 'static,
    {
        use std::os::fd::AsRawFd;
        if self.destroyed.get() {
            return Ok(false);
        }
        // The fd for the blocking thread: it stays open (and means this directory) even
        // if this future is dropped and the store goes meanwhile.
        let fd = match self.dir_for_once() {
            Ok(fd) => fd,
            Err(_) if self.destroyed.get() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        struct Open<'a>(&'a Cell<usize>);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.opens.set(self.opens.get() + 1);
        let _open = Open(&self.opens);
        let res = glommio::executor()
            .spawn_blocking(move || {
                let dir = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                let res = f(&dir);
                drop(fd);
                res
            })
            .await;
        if self.destroyed.get() {
            return Ok(false);
        }
        res.map(|()| true)
    }

    /// Waits until no open of a segment file is in flight.
    async fn no_opens(&self) {
        while self.opens.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Bytes on disk in segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.borrow().len()
    }

    /// Flushes, syncs and stops the writer task, and waits for segment seals in flight.
    pub async fn close(&self) {
        self.closing.set(true);
        self.wake.notify();
        while !self.finished.get() {
            self.done.wait().await;
        }
        self.no_opens().await;
    }
}
