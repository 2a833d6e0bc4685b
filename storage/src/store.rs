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
//!   the process died, and that one only after its last partial index. Corrupt records and torn tails found by a scan are logged with
//!   file and offset and skipped; corrupt records of sealed segments are found, logged
//!   and skipped when a channel reads them. Only the newest segment's last records are
//!   loaded into memory. Writing then continues in a new segment.
//! * Journal events ([`crate::journal`]) are appended to their file by a flusher task as
//!   soon as they are recorded (never behind a sync), and synced by the writer with the
//!   records, counted toward `--sync-every` like records.

use crate::index::SegmentIndex;
use crate::journal::EventKind;
use crate::record::{self, Decoded, StoredRecord, SEGMENT_HEADER_LEN};
use bytes::Bytes;
use futures::channel::oneshot;
use futures::io::AsyncWriteExt;
use glommio::io::{DmaFile, DmaStreamWriter, DmaStreamWriterBuilder};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One sparse index entry per this many records.
pub const INDEX_EVERY: u64 = 256;
/// Bytes read per disk read when a channel catches up from disk.
const READ_WINDOW: usize = 1024 * 1024;
/// Bytes read per step during recovery.
const RECOVERY_CHUNK: usize = 8 * 1024 * 1024;
/// Largest pending buffer kept for reuse (bytes); a bigger one (a burst) is freed.
const SPARE_MAX: usize = 64 << 20;
/// DmaStreamWriter buffer size.
const WRITE_BUFFER: usize = 256 * 1024;
/// The open segment's partial index is rewritten after a sync once this many bytes were
/// added since the last one (or `--sync-timeout` passed): a crash leaves at most about
/// this much (plus what was not synced) to scan.
const PARTIAL_EVERY: u64 = 8 * 1024 * 1024;
/// At most this many bytes of the newest sealed segment are read back at start-up for
/// the memory tail; older records are read from disk when a channel needs them.
const TAIL_BYTES: u64 = 16 * 1024 * 1024;

mod replay;
pub use replay::SegmentInfo;

/// Sync and rotation policy (nsqd flags --sync-every, --sync-timeout,
/// --max-bytes-per-file).
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub max_bytes_per_file: u64,
    pub sync_every: u64,
    pub sync_timeout: Duration,
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
    tx: oneshot::Sender<Result<(), String>>,
}

/// The disk side of one topic.
pub struct TopicStore {
    dir: PathBuf,
    cfg: StoreConfig,
    segments: RefCell<BTreeMap<u64, Segment>>,
    readers: RefCell<HashMap<u64, Rc<DmaFile>>>,
    pending: RefCell<Vec<u8>>,
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
    error: RefCell<Option<String>>,
    /// Set once the writer task has finished (after `close`).
    done: Rc<crate::Notify>,
    finished: Cell<bool>,
    /// The topic directory, held open: files are opened through `/proc/self/fd/<fd>/`
    /// so that renaming the directory (topic delete) never breaks an open in flight.
    dir_fd: std::fs::File,
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

fn io_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A segment file found at recovery: its base, trusted side index, or else trusted
/// partial index (its synced prefix, as of the last checkpoint of the open segment).
struct Found {
    base: u64,
    index: Option<SegmentIndex>,
    partial: Option<SegmentIndex>,
}

/// The salt in a segment file's header (blocking), if it has a valid one.
fn header_salt(seg: &Path) -> Option<u32> {
    use std::io::Read;
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    std::fs::File::open(seg).ok()?.read_exact(&mut h).ok()?;
    record::parse_segment_header(&h).ok().map(|(_, salt)| salt)
}

/// Reads and checks an index file of segment `base` (`size` bytes now); `sealed`
/// requires the size recorded at sealing, a partial index only a prefix of the file.
fn read_index(path: &Path, base: u64, size: u64, sealed: bool) -> Result<SegmentIndex, String> {
    let ix = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|b| crate::index::decode(&b))?;
    if ix.base != base {
        Err(format!("index of base {} in the file of {base}", ix.base))
    } else if sealed && ix.file_len != size {
        Err(format!(
            "segment is {size} bytes, {} when sealed",
            ix.file_len
        ))
    } else if !sealed && ix.data_end > size {
        Err(format!(
            "segment is {size} bytes, shorter than the indexed {}",
            ix.data_end
        ))
    } else {
        Ok(ix)
    }
}

/// Lists a topic directory (blocking): segment files with their sizes and valid side
/// indexes, and journal generations. Removes leftovers: indexes without a segment and
/// temporary files of an interrupted seal.
fn survey_blocking(dir: &Path) -> (Vec<Found>, BTreeSet<u64>) {
    let mut segs = BTreeMap::new();
    let mut idxs = BTreeSet::new();
    let mut pidxs = BTreeSet::new();
    let mut journals = BTreeSet::new();
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for n in names {
        if let Some(b) = n.strip_suffix(".seg").and_then(|b| b.parse::<u64>().ok()) {
            let size = std::fs::metadata(dir.join(&n))
                .map(|m| m.len())
                .unwrap_or(0);
            segs.insert(b, size);
        } else if let Some(b) = n.strip_suffix(".idx").and_then(|b| b.parse::<u64>().ok()) {
            idxs.insert(b);
        } else if let Some(b) = n.strip_suffix(".pidx").and_then(|b| b.parse::<u64>().ok()) {
            pidxs.insert(b);
        } else if let Some(g) = crate::journal::parse_name(&n) {
            journals.insert(g);
        } else if n.ends_with(".idx.tmp") || n.ends_with(".pidx.tmp") {
            let _ = std::fs::remove_file(dir.join(&n));
        }
    }
    let mut found = Vec::new();
    for (&base, &size) in &segs {
        let mut index = None;
        let mut partial = None;
        for (sealed, set, path) in [
            (true, &idxs, idx_path(dir, base)),
            (false, &pidxs, pidx_path(dir, base)),
        ] {
            if !set.contains(&base) {
                continue;
            }
            if index.is_some() {
                // Sealed after its last partial index: that one is obsolete.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let checked = read_index(&path, base, size, sealed).and_then(|ix| {
                if sealed || header_salt(&seg_path(dir, base)) == Some(ix.salt) {
                    Ok(ix)
                } else {
                    Err("partial index of another writer".into())
                }
            });
            match checked {
                Ok(ix) if sealed => index = Some(ix),
                Ok(ix) => partial = Some(ix),
                Err(e) => {
                    log::warn!(
                        "STORE: {} not used - {e}; scanning the segment",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.push(Found {
            base,
            index,
            partial,
        });
    }
    for b in idxs.iter().filter(|b| !segs.contains_key(b)) {
        let _ = std::fs::remove_file(idx_path(dir, *b));
    }
    for b in pidxs.iter().filter(|b| !segs.contains_key(b)) {
        let _ = std::fs::remove_file(pidx_path(dir, *b));
    }
    (found, journals)
}

/// Seals a segment (blocking): optionally syncs its data (a segment recovered after a
/// crash may hold data the dead process never synced), then writes its side index
/// atomically (temporary file, fsync, rename) and removes its partial index. `seg`,
/// `idx` and `pidx` may be `/proc/self/fd` paths. Returns the error text on failure; an
/// unsealed segment is only slower to recover.
fn seal_blocking(
    seg: &Path,
    idx: &Path,
    pidx: &Path,
    mut ix: SegmentIndex,
    sync_data: bool,
) -> Result<(), String> {
    use std::io::Write;
    let f = std::fs::File::open(seg).map_err(io_err)?;
    if sync_data {
        f.sync_data().map_err(io_err)?;
    }
    ix.file_len = f.metadata().map_err(io_err)?.len();
    if ix.file_len < ix.data_end {
        return Err(format!(
            "segment is {} bytes, shorter than its data ({})",
            ix.file_len, ix.data_end
        ));
    }
    let mut tmp = idx.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut t = std::fs::File::create(&tmp).map_err(io_err)?;
        t.write_all(&crate::index::encode(&ix)).map_err(io_err)?;
        t.sync_all().map_err(io_err)?;
    }
    std::fs::rename(&tmp, idx).map_err(io_err)?;
    let _ = std::fs::remove_file(pidx);
    Ok(())
}

/// Writes the partial index of the open segment (blocking): temporary file, rename. Not
/// fsynced: a partial index lost or torn by a power failure only means a longer scan
/// (its CRC rejects a torn one).
fn write_partial_blocking(pidx: &Path, ix: &SegmentIndex) -> Result<(), String> {
    let mut tmp = pidx.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, crate::index::encode(ix)).map_err(io_err)?;
    std::fs::rename(&tmp, pidx).map_err(io_err)
}

impl TopicStore {
    /// Opens (creating if needed) the store in `dir` and recovers it, keeping up to the
    /// newest `keep` records of the newest segment for the caller's memory tail. Sealed
    /// segments are taken from their side index without reading their records; other
    /// segments are scanned and then sealed in the background. Spawns the writer task on
    /// the current executor. Errors: the directory cannot be created or opened.
    pub async fn open(dir: PathBuf, cfg: StoreConfig, keep: usize) -> Result<Recovered, String> {
        let d = dir.clone();
        glommio::executor()
            .spawn_blocking(move || std::fs::create_dir_all(&d))
            .await
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let d = dir.clone();
        let (found, journals) = glommio::executor()
            .spawn_blocking(move || survey_blocking(&d))
            .await;
        let mut segments = BTreeMap::new();
        let mut tail: VecDeque<StoredRecord> = VecDeque::new();
        let mut next_seq = 0u64;
        let mut first_seq = None;
        let mut to_seal = Vec::new();
        let (mut sealed_n, mut scanned_n, mut scanned_bytes) = (0, 0, 0);
        let newest = found.last().map(|f| f.base);
        for f in found {
            let base = f.base;
            let path = seg_path(&dir, base);
            let is_newest = Some(base) == newest;
            let mut seg = Segment {
                path: path.clone(),
                salt: 0,
                end_seq: base,
                index: Vec::new(),
                count: 0,
                readable_seq: base,
            };
            if let Some(ix) = f.index {
                sealed_n += 1;
                seg.salt = ix.salt;
                seg.end_seq = ix.last_seq + 1;
                seg.count = ix.count;
                if is_newest && keep > 0 {
                    load_tail(&path, &ix, keep, &mut tail).await;
                }
                seg.index = ix.entries;
            } else {
                // Scanned: from the start, or from where the last partial index of the
                // open segment ends (what was written after that checkpoint).
                scanned_n += 1;
                let mut from = SEGMENT_HEADER_LEN as u64;
                let partial = f.partial.is_some();
                if let Some(px) = f.partial {
                    seg.salt = px.salt;
                    seg.end_seq = px.last_seq + 1;
                    seg.count = px.count;
                    seg.index = px.entries;
                    from = px.data_end;
                }
                let collect = is_newest && keep > 0 && !partial;
                let mut salt = 0;
                let res = scan_file(&path, from, None, &mut salt, |rec, off| {
                    if rec.seq < seg.end_seq && seg.count > 0 {
                        return;
                    }
                    seg.note(rec.seq, off);
                    if collect {
                        if tail.len() == keep {
                            tail.pop_front();
                        }
                        tail.push_back(rec);
                    }
                })
                .await;
                seg.salt = salt;
                match res {
                    Ok(end) => {
                        scanned_bytes += end.saturating_sub(from);
                        if let Some(ix) = seg.sealed_index(base, end) {
                            if partial && is_newest && keep > 0 {
                                load_tail(&path, &ix, keep, &mut tail).await;
                            }
                            to_seal.push(ix);
                        }
                    }
                    Err(e) => log::error!(
                        "STORE: segment {} unreadable - {e}; skipped",
                        path.display()
                    ),
                }
            }
            if seg.count == 0 {
                // Empty (or unreadable) segment: nothing to serve from it.
                let p = path.clone();
                let _ = glommio::executor()
                    .spawn_blocking(move || std::fs::remove_file(p))
                    .await;
                continue;
            }
            seg.readable_seq = seg.end_seq;
            first_seq.get_or_insert(base);
            next_seq = next_seq.max(seg.end_seq);
            segments.insert(base, seg);
        }
        let store = TopicStore::start(dir, cfg, segments, next_seq)?;
        *store.journal_files.borrow_mut() = journals.clone();
        store
            .journal_gen
            .set(journals.last().map(|g| g + 1).unwrap_or(1));
        if !to_seal.is_empty() {
            let st = store.clone();
            glommio::spawn_local(async move {
                for ix in to_seal {
                    st.seal(ix, true).await;
                }
            })
            .detach();
        }
        Ok(Recovered {
            store,
            tail,
            first_seq: first_seq.unwrap_or(next_seq),
            next_seq,
            sealed_segments: sealed_n,
            scanned_segments: scanned_n,
            scanned_bytes,
        })
    }

    /// Writes the side index of a segment nothing more is written to (off the executor);
    /// failures are logged (the segment is then scanned at the next start).
    async fn seal(&self, ix: SegmentIndex, sync_data: bool) {
        if self.destroyed.get() || !self.segments.borrow().contains_key(&ix.base) {
            return;
        }
        let seg = self.fd_path(&seg_path(&self.dir, ix.base));
        let idx = self.fd_path(&idx_path(&self.dir, ix.base));
        let pidx = self.fd_path(&pidx_path(&self.dir, ix.base));
        let base = ix.base;
        self.opens.set(self.opens.get() + 1);
        let res = glommio::executor()
            .spawn_blocking(move || seal_blocking(&seg, &idx, &pidx, ix, sync_data))
            .await;
        self.opens.set(self.opens.get() - 1);
        if let Err(e) = res {
            log::warn!(
                "STORE: sealing {} failed - {e}",
                seg_path(&self.dir, base).display()
            );
        }
    }

    /// Creates the store of a new topic (its directory must not hold old data) and spawns
    /// its writer task. The directory is created at once; segment files lazily.
    pub fn create(dir: PathBuf, cfg: StoreConfig, next_seq: u64) -> Result<Rc<TopicStore>, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        TopicStore::start(dir, cfg, BTreeMap::new(), next_seq)
    }

    /// Builds the store around its (recovered or empty) segments and spawns its writer.
    fn start(
        dir: PathBuf,
        cfg: StoreConfig,
        segments: BTreeMap<u64, Segment>,
        next_seq: u64,
    ) -> Result<Rc<TopicStore>, String> {
        let dir_fd =
            std::fs::File::open(&dir).map_err(|e| format!("open {}: {e}", dir.display()))?;
        let store = Rc::new(TopicStore {
            dir,
            cfg,
            segments: RefCell::new(segments),
            readers: RefCell::new(HashMap::new()),
            pending: RefCell::new(Vec::new()),
            pending_recs: RefCell::new(Vec::new()),
            spare: RefCell::new(Vec::new()),
            spare_recs: RefCell::new(Vec::new()),
            next_seq: Cell::new(next_seq),
            durable_seq: Cell::new(next_seq),
            waiters: RefCell::new(Vec::new()),
            wake: Rc::new(crate::Notify::default()),
            closing: Cell::new(false),
            error: RefCell::new(None),
            done: Rc::new(crate::Notify::default()),
            finished: Cell::new(false),
            dir_fd,
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
    pub fn error(&self) -> Option<String> {
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
    pub fn wait_durable(&self, seq: u64) -> impl std::future::Future<Output = Result<(), String>> {
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
                Some(rx) => rx.await.unwrap_or_else(|_| Err("exiting".into())),
            }
        }
    }

    /// Reads up to `max` records with sequence >= `from`, only from data already flushed
    /// to disk, following sequence order across segments. Corrupt records are skipped.
    pub async fn read(&self, from: u64, max: usize) -> Result<Vec<StoredRecord>, String> {
        self.read_at(from, max, usize::MAX, None)
            .await
            .map(|(recs, _)| recs)
    }

    /// Like [`read`](Self::read), stopping once `max_bytes` of bodies were read (at least
    /// one record), and starting at `hint` when it is the position a previous read
    /// ended at for `from` (a sequential reader then never re-reads from the sparse
    /// index). Returns the records and the position after the last one.
    pub async fn read_at(
        &self,
        from: u64,
        max: usize,
        max_bytes: usize,
        hint: Option<ReadPos>,
    ) -> Result<(Vec<StoredRecord>, Option<ReadPos>), String> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut end_pos = None;
        let mut seq = from;
        while out.len() < max && bytes < max_bytes {
            let found = {
                let segs = self.segments.borrow();
                segs.range(..=seq)
                    .next_back()
                    .filter(|(_, s)| seq < s.readable_seq)
                    .or_else(|| {
                        segs.range(seq..).next().filter(|(_, s)| {
                            s.readable_seq > *s.index.first().map(|(q, _)| q).unwrap_or(&u64::MAX)
                        })
                    })
                    .map(|(b, s)| {
                        let hinted = hint
                            .filter(|h| h.base == *b && h.seq == seq && seq == from)
                            .map(|h| h.offset);
                        let start = hinted.unwrap_or_else(|| {
                            s.index
                                .iter()
                                .rev()
                                .find(|(q, _)| *q <= seq)
                                .map(|(_, o)| *o)
                                .unwrap_or(SEGMENT_HEADER_LEN as u64)
                        });
                        (*b, s.path.clone(), start, s.readable_seq, s.salt)
                    })
            };
            let Some((base, path, mut off, readable, salt)) = found else {
                break;
            };
            let mut last: Option<u64> = None;
            let file = self.reader(base, &path).await?;
            let mut progressed = false;
            'window: loop {
                let mut want = READ_WINDOW;
                let data = loop {
                    let rr = file.read_at(off, want).await.map_err(io_err)?;
                    let data = Bytes::copy_from_slice(&rr);
                    // Make sure at least one whole record fits.
                    if data.len() >= 8 {
                        let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                        if len + 8 > data.len()
                            && data.len() == want
                            && len <= record::MAX_BODY + 64
                        {
                            want = len + 8;
                            continue;
                        }
                    }
                    break data;
                };
                if data.is_empty() {
                    break;
                }
                // Decode only about what is asked for (plus the records below `seq` a
                // window started from the sparse index holds); what is left of the
                // window is read again by the next call, at the position returned.
                let limit = (max - out.len()).saturating_add(INDEX_EVERY as usize);
                let (recs, skipped, stop) = record::scan_up_to(&data, 0, salt, last, limit);
                if let Some((r, _)) = recs.last() {
                    last = Some(r.seq);
                }
                for s in skipped {
                    log::error!(
                        "STORE: {} offset {}: {}; record skipped",
                        path.display(),
                        off + s.offset as u64,
                        s.reason
                    );
                }
                for (r, at) in recs {
                    if r.seq >= readable {
                        break 'window;
                    }
                    if r.seq < seq {
                        continue;
                    }
                    seq = r.seq + 1;
                    progressed = true;
                    bytes += r.body.len();
                    end_pos = Some(ReadPos {
                        base,
                        offset: off + (at + record::RECORD_OVERHEAD + r.body.len()) as u64,
                        seq,
                    });
                    out.push(r);
                    if out.len() >= max || bytes >= max_bytes {
                        break 'window;
                    }
                }
                if stop == 0 || stop < data.len() && data.len() < want {
                    break;
                }
                off += stop as u64;
                if seq >= readable {
                    break;
                }
            }
            if !progressed {
                // Nothing readable at `seq` in this segment: move to the next one.
                let next = self
                    .segments
                    .borrow()
                    .range(seq + 1..)
                    .next()
                    .map(|(b, _)| *b);
                match next {
                    Some(b) if b > seq => seq = b,
                    _ => break,
                }
            }
        }
        Ok((out, end_pos))
    }

    async fn reader(&self, base: u64, path: &Path) -> Result<Rc<DmaFile>, String> {
        if let Some(f) = self.readers.borrow().get(&base) {
            return Ok(f.clone());
        }
        if self.destroyed.get() {
            return Err("topic deleted".into());
        }
        let fd_path = self.fd_path(path);
        self.opens.set(self.opens.get() + 1);
        let f = DmaFile::open(&fd_path).await.map_err(io_err);
        self.opens.set(self.opens.get() - 1);
        let f = Rc::new(f?);
        self.readers.borrow_mut().insert(base, f.clone());
        Ok(f)
    }

    /// `path`'s file name under the held directory fd (stable across a rename).
    fn fd_path(&self, path: &Path) -> PathBuf {
        use std::os::fd::AsRawFd;
        let name = path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        PathBuf::from(format!("/proc/self/fd/{}", self.dir_fd.as_raw_fd())).join(name)
    }

    /// Waits until no open of a segment file is in flight.
    async fn no_opens(&self) {
        while self.opens.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Deletes whole segments whose records are all below `seq` (retention: every
    /// channel has passed them). The segment being written is kept.
    pub async fn delete_before(&self, seq: u64) {
        let victims: Vec<(u64, PathBuf)> = {
            let segs = self.segments.borrow();
            let last = segs.keys().next_back().copied();
            segs.iter()
                .filter(|(b, s)| Some(**b) != last && s.end_seq <= seq)
                .map(|(b, s)| (*b, s.path.clone()))
                .collect()
        };
        for (b, _) in &victims {
            self.segments.borrow_mut().remove(b);
            self.readers.borrow_mut().remove(b);
        }
        self.no_opens().await;
        for (b, p) in victims {
            log::info!("STORE: deleting segment {}", p.display());
            let fp = self.fd_path(&p);
            let ip = self.fd_path(&idx_path(&self.dir, b));
            let pp = self.fd_path(&pidx_path(&self.dir, b));
            let _ = glommio::executor()
                .spawn_blocking(move || {
                    let _ = std::fs::remove_file(ip);
                    let _ = std::fs::remove_file(pp);
                    std::fs::remove_file(fp)
                })
                .await;
        }
    }

    /// Journals what happened to message `seq` of `channel` (see [`crate::journal`]):
    /// the event reaches its file (the page cache) the task turn after, and is synced by
    /// the writer task with the records, counted toward `--sync-every` like a record.
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

    /// Topic delete: moves the directory aside at once (so a topic of the same name can
    /// start afresh), then stops the writer and removes the files in the background.
    pub fn destroy(self: &Rc<Self>) {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = self
            .dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let topic = name.strip_prefix("t-").unwrap_or(&name).to_string();
        let aside = self
            .dir
            .with_file_name(format!(".deleted-{topic}-{}-{n}", std::process::id()));
        let moved = std::fs::rename(&self.dir, &aside).is_ok();
        self.destroyed.set(true);
        self.wake.notify();
        let me = self.clone();
        glommio::spawn_local(async move {
            me.close().await;
            me.no_opens().await;
            me.readers.borrow_mut().clear();
            me.segments.borrow_mut().clear();
            let d = if moved { aside } else { me.dir.clone() };
            let _ = glommio::executor()
                .spawn_blocking(move || std::fs::remove_dir_all(d))
                .await;
        })
        .detach();
    }

    fn fail_waiters(&self, e: &str) {
        for w in self.waiters.borrow_mut().drain(..) {
            let _ = w.tx.send(Err(e.to_string()));
        }
    }

    fn release_waiters(&self) {
        let durable = self.durable_seq.get();
        let mut ws = self.waiters.borrow_mut();
        let mut i = 0;
        while i < ws.len() {
            if ws[i].seq <= durable {
                let w = ws.swap_remove(i);
                let _ = w.tx.send(Ok(()));
            } else {
                i += 1;
            }
        }
    }
}

/// Reads a segment file from byte offset `start` (the first record, or a sparse index
/// entry) up to `limit` (default: the file's end) and calls `f` for every valid record
/// with its offset, logging and skipping corrupt ones. Sets `salt_out` from the header.
/// Returns the offset just after the last valid record; errors: the file cannot be
/// opened or read, or its header is not a segment header.
async fn scan_file(
    path: &Path,
    start: u64,
    limit: Option<u64>,
    salt_out: &mut u32,
    mut f: impl FnMut(StoredRecord, u64),
) -> Result<u64, String> {
    let file = DmaFile::open(path).await.map_err(io_err)?;
    let res = scan_open_file(&file, path, start, limit, salt_out, &mut f).await;
    let _ = file.close().await;
    res
}

async fn scan_open_file(
    file: &DmaFile,
    path: &Path,
    start: u64,
    limit: Option<u64>,
    salt_out: &mut u32,
    f: &mut impl FnMut(StoredRecord, u64),
) -> Result<u64, String> {
    let mut size = file.file_size().await.map_err(io_err)?;
    if let Some(l) = limit {
        size = size.min(l);
    }
    let head = file.read_at(0, SEGMENT_HEADER_LEN).await.map_err(io_err)?;
    let (base, salt) = record::parse_segment_header(&head)?;
    *salt_out = salt;
    let mut last: Option<u64> = base.checked_sub(1);
    let mut pos = start.max(SEGMENT_HEADER_LEN as u64);
    let mut data_end = pos;
    let mut carry: Vec<u8> = Vec::new();
    let mut carry_at = pos;
    // Problems seen since the last valid record. Garbage followed by a valid record is
    // corruption (logged as an error); garbage up to the end of the data is the unwritten
    // rest of the last DMA block after a crash (stale buffer bytes), which is expected.
    let mut suspect: Vec<(u64, String)> = Vec::new();
    while pos < size {
        let want = RECOVERY_CHUNK.min((size - pos) as usize);
        let rr = file.read_at(pos, want).await.map_err(io_err)?;
        if rr.is_empty() {
            break;
        }
        pos += rr.len() as u64;
        let mut buf = std::mem::take(&mut carry);
        buf.extend_from_slice(&rr);
        let data = Bytes::from(buf);
        let mut at = 0usize;
        let mut end = false;
        while at < data.len() {
            match record::decode(&data, at, salt) {
                Decoded::Record(r, n) => {
                    if last.is_some_and(|l| r.seq <= l) {
                        // Stale bytes of a reused buffer: the end of this segment.
                        end = true;
                        break;
                    }
                    for (off, reason) in suspect.drain(..) {
                        log::error!(
                            "STORE: {} offset {off}: {reason}; record skipped",
                            path.display()
                        );
                    }
                    last = Some(r.seq);
                    f(r, carry_at + at as u64);
                    at += n;
                    data_end = carry_at + at as u64;
                }
                Decoded::End => {
                    end = true;
                    break;
                }
                Decoded::Incomplete => break,
                Decoded::Corrupt { reason, skip } => {
                    suspect.push((carry_at + at as u64, reason.to_string()));
                    if skip > 0 {
                        at += skip;
                    } else {
                        at += 1;
                        while at < data.len()
                            && !matches!(
                                record::decode(&data, at, salt),
                                Decoded::Record(..) | Decoded::Incomplete
                            )
                        {
                            at += 1;
                        }
                    }
                }
            }
        }
        if end {
            break;
        }
        carry = data[at..].to_vec();
        carry_at += at as u64;
    }
    let trailing = size.saturating_sub(data_end);
    if !suspect.is_empty() || (!carry.is_empty() && pos >= size) {
        log::info!(
            "STORE: {} offset {data_end}: the {trailing} bytes after the last record hold no \
             whole record (a torn record, or the unwritten end of the segment when the \
             broker stopped); ignored",
            path.display()
        );
    }
    Ok(data_end)
}

/// Loads the newest records of a sealed segment into `tail`: at most `keep` records and
/// about [`TAIL_BYTES`] bytes, read from the sparse index entry that covers them.
async fn load_tail(path: &Path, ix: &SegmentIndex, keep: usize, tail: &mut VecDeque<StoredRecord>) {
    let by_count = (ix.count.saturating_sub(keep as u64) / INDEX_EVERY) as usize;
    let floor = ix.data_end.saturating_sub(TAIL_BYTES);
    let by_bytes = ix
        .entries
        .iter()
        .position(|&(_, off)| off >= floor)
        .unwrap_or(ix.entries.len().saturating_sub(1));
    let Some(&(_, start)) = ix.entries.get(by_count.max(by_bytes)) else {
        return;
    };
    let mut salt = 0;
    let res = scan_file(path, start, Some(ix.data_end), &mut salt, |rec, _| {
        if tail.len() == keep {
            tail.pop_front();
        }
        tail.push_back(rec);
    })
    .await;
    if let Err(e) = res {
        log::error!(
            "STORE: segment {} unreadable - {e}; its records are read when needed",
            path.display()
        );
        tail.clear();
    }
}

struct Active {
    writer: DmaStreamWriter,
    base: u64,
    /// Logical write position (header included).
    pos: u64,
    /// (end offset, one past the sequence) of each written batch not yet known flushed.
    unflushed: VecDeque<(u64, u64)>,
    /// One past the last sequence written into this segment (0 = none yet).
    written: u64,
    /// True once a sync of this segment succeeded.
    synced: bool,
}

async fn open_segment(store: &TopicStore, base: u64) -> Result<Active, String> {
    if store.destroyed.get() {
        return Err("topic deleted".into());
    }
    let path = seg_path(&store.dir, base);
    store.opens.set(store.opens.get() + 1);
    let file = DmaFile::create(store.fd_path(&path)).await.map_err(io_err);
    store.opens.set(store.opens.get() - 1);
    let file = file?;
    let mut writer = DmaStreamWriterBuilder::new(file)
        .with_buffer_size(WRITE_BUFFER)
        .with_write_behind(4)
        .build();
    writer
        .write_all(&record::segment_header(base, store.salt))
        .await
        .map_err(io_err)?;
    store.segments.borrow_mut().insert(
        base,
        Segment {
            path,
            salt: store.salt,
            end_seq: base,
            index: Vec::new(),
            count: 0,
            readable_seq: base,
        },
    );
    Ok(Active {
        writer,
        base,
        pos: SEGMENT_HEADER_LEN as u64,
        unflushed: VecDeque::new(),
        written: 0,
        synced: false,
    })
}

fn mark_readable(store: &TopicStore, a: &mut Active, flushed: u64) {
    let mut upto = None;
    while let Some(&(end, seq)) = a.unflushed.front() {
        if end > flushed {
            break;
        }
        upto = Some(seq);
        a.unflushed.pop_front();
    }
    if let Some(seq) = upto {
        if let Some(s) = store.segments.borrow_mut().get_mut(&a.base) {
            s.readable_seq = s.readable_seq.max(seq);
        }
    }
}

/// Gives up a segment after a write or sync error; one that was never synced is
/// removed, so repeated failures (a full disk) do not leave empty files behind.
async fn abandon(store: &TopicStore, a: Option<Active>) {
    let Some(a) = a else { return };
    if !a.synced {
        let seg = store.segments.borrow_mut().remove(&a.base);
        drop(a);
        if let Some(seg) = seg {
            let p = store.fd_path(&seg.path);
            let _ = glommio::executor()
                .spawn_blocking(move || std::fs::remove_file(p))
                .await;
        }
    }
}

/// Seals the segment just closed by the writer (rotation or clean close), once its data
/// is synced: `data_end` is its logical length.
async fn seal_closed(store: &TopicStore, base: u64, data_end: u64) {
    let ix = store
        .segments
        .borrow()
        .get(&base)
        .and_then(|s| s.sealed_index(base, data_end));
    if let Some(ix) = ix {
        store.seal(ix, false).await;
    }
}

/// Checkpoints the open segment: writes, in the background, the partial index of its
/// synced prefix (`data_end` bytes), so that recovery after a crash scans only what was
/// written after it. Skipped while the previous one is still being written.
fn write_partial(store: &Rc<TopicStore>, base: u64, data_end: u64) {
    if store.partial_busy.get() || store.destroyed.get() {
        return;
    }
    let ix = store
        .segments
        .borrow()
        .get(&base)
        .and_then(|s| s.sealed_index(base, data_end));
    let Some(mut ix) = ix else { return };
    ix.file_len = data_end;
    store.partial_busy.set(true);
    store.opens.set(store.opens.get() + 1);
    let st = store.clone();
    glommio::spawn_local(async move {
        let p = st.fd_path(&pidx_path(&st.dir, base));
        let res = glommio::executor()
            .spawn_blocking(move || write_partial_blocking(&p, &ix))
            .await;
        st.opens.set(st.opens.get() - 1);
        st.partial_busy.set(false);
        if let Err(e) = res {
            log::warn!("STORE: partial index of {} - {e}", st.dir.display());
        }
    })
    .detach();
}

/// The journal file being appended to.
struct JournalFile {
    gen: u64,
    /// Opened for appending; shared with the blocking thread that fdatasyncs it.
    file: Arc<std::fs::File>,
    /// Written since its last sync.
    dirty: bool,
}

/// Appends `data` to the journal file of generation `gen` with a plain buffered
/// `write(2)` on this thread, switching files when the generation changed (a dirty
/// previous file is handed to the writer's next sync). Blocking, but a write of a few
/// hundred bytes to the page cache takes microseconds, happens only on the rare paths
/// that are journaled, and makes the event survive a process crash at once; the same
/// through io_uring (open, statx, write) was measured to take tens of milliseconds on a
/// loaded machine, long enough for a kill -9 right after a REQ to lose it.
fn journal_write(
    store: &TopicStore,
    jf: &mut Option<JournalFile>,
    gen: u64,
    data: &[u8],
) -> Result<(), String> {
    use std::io::Write;
    if jf.as_ref().is_some_and(|j| j.gen != gen) {
        if let Some(j) = jf.take().filter(|j| j.dirty) {
            store.journal_retired.borrow_mut().push(j.file);
        }
    }
    let j = match jf {
        Some(j) => j,
        None => {
            if store.destroyed.get() {
                return Err("topic deleted".into());
            }
            let path = store.fd_path(&crate::journal::path(&store.dir, gen));
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)
                .map_err(io_err)?;
            store.journal_files.borrow_mut().insert(gen);
            jf.insert(JournalFile {
                gen,
                file: Arc::new(file),
                dirty: false,
            })
        }
    };
    j.dirty = true;
    (&*j.file).write_all(data).map_err(io_err)
}

/// Writes every pending journal event to its generation's file (the page cache: a
/// process crash no longer loses it; the writer's next sync makes it durable), in order,
/// without yielding. Returns the events written.
fn flush_journal(store: &TopicStore) -> u64 {
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

/// Appends journal events as soon as they are recorded (the task turn after), so that
/// they never wait behind a sync of the writer; the writer counts them toward
/// `--sync-every` and syncs them with the records. Also deletes covered generations.
async fn journal_flusher(store: Rc<TopicStore>) {
    loop {
        store.journal_wake.wait().await;
        if store.finished.get() || store.destroyed.get() {
            break;
        }
        let n = flush_journal(&store);
        if n > 0 {
            store.journal_written.set(store.journal_written.get() + n);
            store.wake.notify();
        }
        delete_covered_journals(&store).await;
    }
}

/// Syncs (off this thread) the journal files written since their last sync. A write
/// made while the sync runs marks the file dirty again for the next one.
async fn sync_journal(store: &TopicStore) {
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

/// Deletes the journal files of generations covered by the last `meta.json`.
async fn delete_covered_journals(store: &TopicStore) {
    let covered = store.journal_covered.get();
    let gone: Vec<u64> = store
        .journal_files
        .borrow()
        .iter()
        .copied()
        .filter(|g| *g <= covered)
        .collect();
    if gone.is_empty() || store.destroyed.get() {
        return;
    }
    for g in &gone {
        store.journal_files.borrow_mut().remove(g);
    }
    let paths: Vec<PathBuf> = gone
        .iter()
        .map(|g| store.fd_path(&crate::journal::path(&store.dir, *g)))
        .collect();
    store.opens.set(store.opens.get() + 1);
    let _ = glommio::executor()
        .spawn_blocking(move || {
            for p in paths {
                let _ = std::fs::remove_file(p);
            }
        })
        .await;
    store.opens.set(store.opens.get() - 1);
}

async fn writer_task(store: Rc<TopicStore>) {
    let mut active: Option<Active> = None;
    let mut unsynced: u64 = 0;
    let mut last_sync = Instant::now();
    let mut last_partial = (Instant::now(), 0u64, 0u64);
    loop {
        let has_pending = !store.pending.borrow().is_empty();
        let has_journal = store.journal_written.get() > 0;
        let has_waiters = !store.waiters.borrow().is_empty();
        let closing = store.closing.get();
        if !has_pending && !has_waiters && !closing && !has_journal {
            let wake = std::pin::pin!(store.wake.wait());
            if unsynced > 0 {
                let left = store.cfg.sync_timeout.saturating_sub(last_sync.elapsed());
                let sleep = std::pin::pin!(glommio::timer::sleep(left));
                futures::future::select(wake, sleep).await;
            } else {
                wake.await;
            }
        }
        // Double buffering: publishers encode into the spare pair (which keeps its
        // capacity, so no reallocation or page faults) while this batch is written.
        let mut buf = std::mem::take(&mut *store.spare.borrow_mut());
        std::mem::swap(&mut buf, &mut *store.pending.borrow_mut());
        let mut recs = std::mem::take(&mut *store.spare_recs.borrow_mut());
        std::mem::swap(&mut recs, &mut *store.pending_recs.borrow_mut());
        for w in store.drain_waiters.borrow_mut().drain(..) {
            let _ = w.send(());
        }
        if store.destroyed.get() {
            // Topic deleted: nothing more goes to disk.
            store.fail_waiters("exiting");
            if let Some(mut a) = active.take() {
                let _ = a.writer.close().await;
            }
            *store.journal_file.borrow_mut() = None;
            break;
        }
        let mut failed = false;
        let mut i = 0usize;
        let mut start = 0usize;
        while i < recs.len() && !failed {
            if active
                .as_ref()
                .is_some_and(|a| a.pos >= store.cfg.max_bytes_per_file)
            {
                if let Some(mut a) = active.take() {
                    // Rotation: the closed segment is synced, so all of it is durable.
                    let ok = a.writer.sync().await.is_ok();
                    let closed = a.writer.close().await.is_ok();
                    let upto = (a.written > 0).then_some(a.written);
                    mark_readable(&store, &mut a, u64::MAX);
                    if let (true, Some(seq)) = (ok, upto) {
                        store.durable_seq.set(store.durable_seq.get().max(seq));
                    }
                    if ok && closed {
                        // In the background: publishers waiting for a sync need not
                        // wait for the index file's fsync too.
                        // (Counted as an open: `close` waits for it.)
                        let (st, base, end) = (store.clone(), a.base, a.pos);
                        store.opens.set(store.opens.get() + 1);
                        glommio::spawn_local(async move {
                            seal_closed(&st, base, end).await;
                            st.opens.set(st.opens.get() - 1);
                        })
                        .detach();
                    }
                }
            }
            if active.is_none() {
                match open_segment(&store, recs[i].0).await {
                    Ok(a) => active = Some(a),
                    Err(e) => {
                        log::error!("STORE: {} - {e}", store.dir.display());
                        *store.error.borrow_mut() = Some(e.clone());
                        store.fail_waiters(&e);
                        failed = true;
                        break;
                    }
                }
            }
            let Some(a) = active.as_mut() else { break };
            // Records that go into this segment: up to the one that crosses the limit.
            let mut j = i;
            let mut bytes = 0u64;
            while j < recs.len() {
                bytes += recs[j].1 as u64;
                j += 1;
                if a.pos + bytes >= store.cfg.max_bytes_per_file {
                    break;
                }
            }
            {
                let mut segs = store.segments.borrow_mut();
                if let Some(seg) = segs.get_mut(&a.base) {
                    let mut off = a.pos;
                    for &(seq, len) in &recs[i..j] {
                        // Sequences may have gaps: index by count, not by value.
                        seg.note(seq, off);
                        off += len as u64;
                    }
                }
            }
            let chunk = &buf[start..start + bytes as usize];
            match a.writer.write_all(chunk).await {
                Ok(()) => {
                    a.pos += bytes;
                    a.unflushed.push_back((a.pos, recs[j - 1].0 + 1));
                    a.written = recs[j - 1].0 + 1;
                    unsynced += (j - i) as u64;
                    let flushed = a.writer.current_flushed_pos();
                    mark_readable(&store, a, flushed);
                }
                Err(e) => {
                    let e = format!("write {}: {e}", store.dir.display());
                    log::error!("STORE: {e}");
                    *store.error.borrow_mut() = Some(e.clone());
                    store.fail_waiters(&e);
                    abandon(&store, active.take()).await;
                    failed = true;
                }
            }
            start += bytes as usize;
            i = j;
        }
        if buf.capacity() <= SPARE_MAX {
            buf.clear();
            recs.clear();
            *store.spare.borrow_mut() = buf;
            *store.spare_recs.borrow_mut() = recs;
        }
        // Journal events share the records' sync policy and group commit; any still
        // pending are written first, so the sync below covers every event so far.
        unsynced += flush_journal(&store) + store.journal_written.replace(0);
        delete_covered_journals(&store).await;
        let waiting = !store.waiters.borrow().is_empty();
        let due = unsynced >= store.cfg.sync_every
            || (unsynced > 0 && last_sync.elapsed() >= store.cfg.sync_timeout)
            || (waiting && !failed)
            || store.closing.get();
        if due && !failed {
            sync_journal(&store).await;
            if let Some(a) = active.as_mut() {
                match a.writer.sync().await {
                    Ok(_) => {
                        a.synced = true;
                        let upto = (a.written > 0).then_some(a.written);
                        mark_readable(&store, a, u64::MAX);
                        if let Some(seq) = upto {
                            store.durable_seq.set(store.durable_seq.get().max(seq));
                        }
                        *store.error.borrow_mut() = None;
                        let (at, base, pos) = last_partial;
                        if at.elapsed() >= store.cfg.sync_timeout
                            || base != a.base
                            || a.pos >= pos + PARTIAL_EVERY
                        {
                            last_partial = (Instant::now(), a.base, a.pos);
                            write_partial(&store, a.base, a.pos);
                        }
                    }
                    Err(e) => {
                        let e = format!("sync {}: {e}", store.dir.display());
                        log::error!("STORE: {e}");
                        *store.error.borrow_mut() = Some(e.clone());
                        store.fail_waiters(&e);
                        abandon(&store, active.take()).await;
                    }
                }
            }
            unsynced = 0;
            last_sync = Instant::now();
            if active.is_none() && store.pending.borrow().is_empty() {
                // Nothing left unwritten: everything appended so far is durable.
                store
                    .durable_seq
                    .set(store.durable_seq.get().max(store.next_seq.get()));
            }
            store.release_waiters();
        }
        if store.closing.get()
            && store.pending.borrow().is_empty()
            && store.journal_pending.borrow().is_empty()
        {
            if let Some(mut a) = active.take() {
                let closed = a.writer.close().await.is_ok();
                mark_readable(&store, &mut a, u64::MAX);
                if closed && a.synced {
                    seal_closed(&store, a.base, a.pos).await;
                }
            }
            *store.journal_file.borrow_mut() = None;
            store.fail_waiters("exiting");
            break;
        }
    }
    store.finished.set(true);
    store.journal_wake.notify();
    for w in store.drain_waiters.borrow_mut().drain(..) {
        let _ = w.send(());
    }
    store.done.notify();
}
