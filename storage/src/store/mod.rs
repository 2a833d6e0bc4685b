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
//!
//! [`TopicStore`]'s state is split by concern into parts, each owning its fields and
//! changed only through its methods:
//!
//! * `segments::Segments`: the segment list with sparse indexes, cached readers and
//!   blocks (diskqueue's files and read/write positions),
//! * `pending::Pending`: records acknowledged and not yet written, and their bound
//!   (diskqueue's writeChan),
//! * `durability::Durability`: the durable sequence and the publishers waiting for it
//!   (diskqueue's sync), with the writer's `durability::Unsynced` counts,
//! * `journal_files::Journal`: the delivery journal's events, generations and files,
//! * `health::Health`: the last disk error and its log rate limit,
//! * `descriptors::Directory`: the directory, its descriptor, opens in flight, deletion,
//! * `lifecycle::Lifecycle`: the writer task's wake-up and close handshake (diskqueue's
//!   exitChan).

use crate::error::StoreError;
use crate::record::StoredRecord;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
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
mod durability;
mod health;
mod journal_files;
mod lifecycle;
mod pending;
mod reader;
mod recovery;
mod replay;
mod retention;
mod segment_io;
mod segments;
mod writer;

pub use descriptors::stores_holding_descriptors;
use descriptors::Directory;
use durability::Durability;
use health::Health;
use journal_files::{journal_flusher, Journal};
use lifecycle::Lifecycle;
use pending::Pending;
pub use replay::SegmentInfo;
pub use segment_io::{SegmentIo, UnknownSegmentIo};
use segments::{Segment, Segments};
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

/// The disk side of one topic, by concern: each part owns its state and is changed
/// only through its methods.
pub struct TopicStore {
    cfg: StoreConfig,
    /// This writer's salt, in every record and segment header it writes.
    salt: u32,
    /// The topic's directory, its descriptor and the opens under it.
    dir: Directory,
    /// Sealed segments and the one being written, their readers and cached blocks.
    segments: Segments,
    /// Records appended and not yet written (acknowledged), and their bound.
    pending: Pending,
    /// What is fdatasync'ed, and the publishers waiting for it.
    durability: Durability,
    /// The delivery journal's events and files.
    journal: Journal,
    /// The last disk error and its log rate limit.
    health: Health,
    /// Wake-ups and the close handshake with the writer task.
    life: Lifecycle,
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
        let life = Lifecycle::new();
        let hold = hold || cfg.io == SegmentIo::Threads;
        let dir = Directory::new(dir, dir_fd, hold, life.waker())?;
        let store = Rc::new(TopicStore {
            cfg,
            salt: new_salt(),
            dir,
            segments: Segments::new(segments),
            pending: Pending::new(next_seq),
            durability: Durability::new(next_seq),
            journal: Journal::new(),
            health: Health::default(),
            life,
        });
        glommio::spawn_local(writer_task(store.clone())).detach();
        glommio::spawn_local(journal_flusher(store.clone())).detach();
        Ok(store)
    }

    /// Records below this sequence can be read back from disk.
    pub fn readable_seq(&self) -> u64 {
        self.segments
            .newest_readable_seq()
            .unwrap_or_else(|| self.durability.durable_seq())
    }

    /// The directory holding this store.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The next sequence this store expects.
    pub fn next_seq(&self) -> u64 {
        self.pending.next_seq()
    }

    /// Records below this sequence are durable (fdatasync'ed).
    pub fn durable_seq(&self) -> u64 {
        self.durability.durable_seq()
    }

    /// The last disk error, if the store is unhealthy.
    pub fn error(&self) -> Option<StoreError> {
        self.health.error()
    }

    /// Queues a record; written by the writer task. Its `seq` must be at least
    /// `next_seq()`: sequences skipped over are absent from the log (records every
    /// channel finished before they were written).
    pub fn append(&self, rec: &StoredRecord) {
        self.pending.append(rec, self.salt);
        self.life.wake();
    }

    /// Moves the next sequence to at least `seq` without writing anything: the sequences
    /// in between are absent (recovery of a topic whose newest records were finished
    /// before they were written).
    pub fn advance_to(&self, seq: u64) {
        if self.pending.advance_to(seq) && self.pending.is_empty() {
            self.durability.advance(seq);
        }
    }

    /// Bytes appended and not yet handed to the writer.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Drops the records below `seq` from those waiting to be written (the pending buffer,
    /// which holds them in sequence order; the batch being written is left alone), and
    /// returns how many. For records every channel has finished (the topic's low
    /// watermark), which no reader needs: after a long disk outage, what a consumer
    /// drained meanwhile is not written at all, so the space it freed goes to what is
    /// still to be delivered. Their sequences become gaps, as for records finished
    /// before they were due to be written. Not for topics kept for replay.
    pub fn forget_unwritten_below(&self, seq: u64) -> usize {
        let dropped = self.pending.forget_below(seq);
        if dropped > 0 {
            // Publishers may wait for their durability: the writer's next sync releases
            // them (nothing of theirs is left to write).
            self.life.wake();
        }
        dropped
    }

    /// Bytes of appended records not yet written to a segment: the pending buffer and
    /// the batch being written (which a failed write puts back in front of it).
    pub fn unwritten_bytes(&self) -> usize {
        self.pending.unwritten()
    }

    /// Whether a publish of about `bytes` more may be appended. While the disk fails
    /// (the store holds an error), appended records wait in memory for the writer's
    /// retries and are never dropped; once [`UNWRITTEN_MAX`] bytes wait, new publishes
    /// are refused with the disk's error (nsqd answers `E_PUB_FAILED` / 503 when its
    /// disk queue cannot take a message) before anything already acknowledged is lost.
    /// A healthy store always admits (publishers wait for a long pending buffer instead:
    /// [`TopicStore::wait_pending_below`]).
    pub fn admit(&self, bytes: usize) -> Result<(), StoreError> {
        self.health
            .refuse_if(|| self.pending.unwritten() + bytes > UNWRITTEN_MAX)
    }

    /// Waits until the pending buffer holds at most `limit` bytes (or the store closes).
    pub async fn wait_pending_below(&self, limit: usize) {
        while self.pending.len() > limit && !self.life.finished() {
            let rx = self.pending.drain_waiter();
            self.life.wake();
            let _ = rx.await;
        }
    }

    /// Completes once every record below `seq` is durable (group commit), or with the
    /// disk error that prevented it.
    pub fn wait_durable(
        &self,
        seq: u64,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> {
        let rx = self.durability.waiter(seq);
        if rx.is_some() {
            self.life.wake();
        }
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
        if self.dir.is_deleted() {
            return Ok(false);
        }
        // The fd for the blocking thread: it stays open (and means this directory) even
        // if this future is dropped and the store goes meanwhile.
        let fd = match self.dir.for_once() {
            Ok(fd) => fd,
            Err(_) if self.dir.is_deleted() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        /// Ends the open when dropped, also when this future is dropped mid-write.
        struct Open<'a>(&'a Directory);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.end_open();
            }
        }
        self.dir.begin_open();
        let _open = Open(&self.dir);
        let res = glommio::executor()
            .spawn_blocking(move || {
                let dir = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                let res = f(&dir);
                drop(fd);
                res
            })
            .await;
        if self.dir.is_deleted() {
            return Ok(false);
        }
        res.map(|()| true)
    }

    /// Segments on disk.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Flushes, syncs and stops the writer task, and waits for segment seals in flight.
    pub async fn close(&self) {
        self.life.close();
        self.life.wait_finished().await;
        self.dir.no_opens().await;
    }
}
