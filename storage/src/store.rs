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
//! * Recovery scans every segment, CRC-checking each record; corrupt records and torn
//!   tails are logged with file and offset and skipped. Writing then continues in a new
//!   segment.

use crate::record::{self, Decoded, StoredRecord, SEGMENT_HEADER_LEN};
use bytes::Bytes;
use futures::channel::oneshot;
use futures::io::AsyncWriteExt;
use glommio::io::{DmaFile, DmaStreamWriter, DmaStreamWriterBuilder};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
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
    /// (sequence, byte offset) every INDEX_EVERY records, and the first record.
    index: Vec<(u64, u64)>,
    /// Records with sequence below this are flushed to the file and readable.
    readable_seq: u64,
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
    /// The newest records (at most `keep` of them), oldest first.
    pub tail: VecDeque<StoredRecord>,
    /// The oldest sequence still on disk.
    pub first_seq: u64,
    /// One past the newest sequence on disk.
    pub next_seq: u64,
}

fn seg_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.seg"))
}

fn io_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl TopicStore {
    /// Opens (creating if needed) the store in `dir` and recovers it, keeping the newest
    /// `keep` records for the caller's memory tail. Spawns the writer task on the current
    /// executor.
    pub async fn open(dir: PathBuf, cfg: StoreConfig, keep: usize) -> Result<Recovered, String> {
        let d = dir.clone();
        glommio::executor()
            .spawn_blocking(move || std::fs::create_dir_all(&d))
            .await
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut bases = Vec::new();
        let d = dir.clone();
        let names: Vec<String> = glommio::executor()
            .spawn_blocking(move || {
                std::fs::read_dir(&d)
                    .map(|rd| {
                        rd.filter_map(|e| e.ok())
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .await;
        for n in names {
            if let Some(b) = n.strip_suffix(".seg").and_then(|b| b.parse::<u64>().ok()) {
                bases.push(b);
            }
        }
        bases.sort_unstable();
        let mut segments = BTreeMap::new();
        let mut tail: VecDeque<StoredRecord> = VecDeque::new();
        let mut next_seq = 0u64;
        let mut first_seq = None;
        for base in bases {
            let path = seg_path(&dir, base);
            let mut seg = Segment {
                path: path.clone(),
                salt: 0,
                end_seq: base,
                index: Vec::new(),
                readable_seq: base,
            };
            let mut count = 0u64;
            let res = scan_file(&path, &mut seg.salt, |rec, off| {
                if count.is_multiple_of(INDEX_EVERY) {
                    seg.index.push((rec.seq, off));
                }
                count += 1;
                seg.end_seq = rec.seq + 1;
                if keep > 0 {
                    if tail.len() == keep {
                        tail.pop_front();
                    }
                    tail.push_back(rec);
                }
            })
            .await;
            if let Err(e) = res {
                log::error!(
                    "STORE: segment {} unreadable - {e}; skipped",
                    path.display()
                );
            }
            if count == 0 {
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
        Ok(Recovered {
            store,
            tail,
            first_seq: first_seq.unwrap_or(next_seq),
            next_seq,
        })
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
        });
        glommio::spawn_local(writer_task(store.clone())).detach();
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
        for (_, p) in victims {
            log::info!("STORE: deleting segment {}", p.display());
            let fp = self.fd_path(&p);
            let _ = glommio::executor()
                .spawn_blocking(move || std::fs::remove_file(fp))
                .await;
        }
    }

    /// Bytes on disk in segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.borrow().len()
    }

    /// Flushes, syncs and stops the writer task.
    pub async fn close(&self) {
        self.closing.set(true);
        self.wake.notify();
        while !self.finished.get() {
            self.done.wait().await;
        }
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

/// Reads a segment file from its start and calls `f` for every valid record with its
/// offset, logging and skipping corrupt ones.
async fn scan_file(
    path: &Path,
    salt_out: &mut u32,
    mut f: impl FnMut(StoredRecord, u64),
) -> Result<(), String> {
    let file = DmaFile::open(path).await.map_err(io_err)?;
    let size = file.file_size().await.map_err(io_err)?;
    let head = file.read_at(0, SEGMENT_HEADER_LEN).await.map_err(io_err)?;
    let (base, salt) = record::parse_segment_header(&head)?;
    *salt_out = salt;
    let mut last: Option<u64> = base.checked_sub(1);
    let mut pos = SEGMENT_HEADER_LEN as u64;
    let mut carry: Vec<u8> = Vec::new();
    let mut carry_at = pos;
    while pos < size {
        let rr = file.read_at(pos, RECOVERY_CHUNK).await.map_err(io_err)?;
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
                    last = Some(r.seq);
                    f(r, carry_at + at as u64);
                    at += n;
                }
                Decoded::End => {
                    end = true;
                    break;
                }
                Decoded::Incomplete => break,
                Decoded::Corrupt { reason, skip } => {
                    log::error!(
                        "STORE: {} offset {}: {reason}; record skipped",
                        path.display(),
                        carry_at + at as u64
                    );
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
        if pos >= size && !carry.is_empty() {
            log::error!(
                "STORE: {} offset {}: torn record at the end ({} bytes); skipped",
                path.display(),
                carry_at,
                carry.len()
            );
        }
    }
    let _ = file.close().await;
    Ok(())
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

async fn writer_task(store: Rc<TopicStore>) {
    let mut active: Option<Active> = None;
    let mut unsynced: u64 = 0;
    let mut last_sync = Instant::now();
    loop {
        let has_pending = !store.pending.borrow().is_empty();
        let has_waiters = !store.waiters.borrow().is_empty();
        let closing = store.closing.get();
        if !has_pending && !has_waiters && !closing {
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
                    let _ = a.writer.close().await;
                    let upto = (a.written > 0).then_some(a.written);
                    mark_readable(&store, &mut a, u64::MAX);
                    if let (true, Some(seq)) = (ok, upto) {
                        store.durable_seq.set(store.durable_seq.get().max(seq));
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
                        // Sequences may have gaps: index by distance, not by value.
                        if seg
                            .index
                            .last()
                            .is_none_or(|&(q, _)| seq >= q + INDEX_EVERY)
                        {
                            seg.index.push((seq, off));
                        }
                        off += len as u64;
                        seg.end_seq = seq + 1;
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
        let waiting = !store.waiters.borrow().is_empty();
        let due = unsynced >= store.cfg.sync_every
            || (unsynced > 0 && last_sync.elapsed() >= store.cfg.sync_timeout)
            || (waiting && !failed)
            || store.closing.get();
        if due && !failed {
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
        if store.closing.get() && store.pending.borrow().is_empty() {
            if let Some(mut a) = active.take() {
                let _ = a.writer.close().await;
                mark_readable(&store, &mut a, u64::MAX);
            }
            store.fail_waiters("exiting");
            break;
        }
    }
    store.finished.set(true);
    for w in store.drain_waiters.borrow_mut().drain(..) {
        let _ = w.send(());
    }
    store.done.notify();
}
