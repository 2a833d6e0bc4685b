//! A topic's descriptors follow its activity: an idle topic holds none (nsqd's disk
//! queues likewise hold a file only while they read or write it).
//!
//! What a store holds open while active: its directory (every other file is opened
//! through `/proc/self/fd/<dir fd>/<name>`, so that a topic delete, which renames the
//! directory, never breaks an open in flight), the segment being written (two
//! descriptors on the io_uring path), cached segment readers and the journal file. Once
//! the writer has been idle for [`IDLE_RELEASE`] (nothing pending, everything synced;
//! [`PRESSED_RELEASE`] while more than [`held_cap`] stores hold descriptors), it closes
//! and seals the segment being written (the next write starts a new one), and drops the
//! readers, the journal file and the directory.
//!
//! The directory is opened again on demand ([`Directory::fd_path`]) by its path, which
//! is safe as long as the path still names this store's directory: the store records the
//! directory's device and inode when it starts and checks them on every reopen, and does
//! not reopen at all once the topic is deleted ([`TopicStore::destroy`] renames the
//! directory aside and marks it deleted in one synchronous step, so a later reopen by the
//! path could only find a new topic's directory of the same name: that is refused too by
//! the inode check). An open in flight keeps the descriptor it was given alive
//! ([`FdPath`] holds a reference to it), so that releasing the store's own reference
//! never lets `/proc/self/fd/<n>` name another file while a path built on it is in use.
//!
//! On the blocking-thread path ([`SegmentIo::Threads`]: FUSE and network filesystems,
//! where an open can wait for a server) the store holds its descriptors for as long as it exists: an
//! open there must not run on the shard's thread, and reopening off it would add a round
//! trip to every write after a pause.

use super::{io_err, SegmentIo, TopicStore};
use crate::error::StoreError;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Waker;
use std::time::Duration;

/// After this long idle (no record, journal event, sync or new open), a store gives
/// its descriptors back. A topic written less often than this starts a new segment per
/// write burst (each is sealed with its index; retention removes them as usual).
pub(super) const IDLE_RELEASE: Duration = Duration::from_secs(30);

/// The idle time after which a store gives its descriptors back while more than
/// [`held_cap`] stores hold some.
pub(super) const PRESSED_RELEASE: Duration = Duration::from_millis(10);

/// Stores of this process (all shards) that hold their directory open.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Above this many stores holding descriptors, idle ones release them after
/// [`PRESSED_RELEASE`]: a twelfth of the soft `RLIMIT_NOFILE` as the first store
/// reads it (at least 16), so that stores (at most four descriptors each while active,
/// mostly one or two) use at most about a third of the limit, leaving the rest to
/// connections.
pub(super) fn held_cap() -> usize {
    usize::try_from(nofile_limit() / 12)
        .unwrap_or(usize::MAX)
        .max(16)
}

/// The soft `RLIMIT_NOFILE`, read once by the first store (`u64::MAX` when unlimited or
/// unreadable).
fn nofile_limit() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX)
    })
}

/// True while more stores hold descriptors than [`held_cap`], or a writer of this
/// thread waits for a segment permit ([`writer_slot`]).
pub(super) fn pressed() -> bool {
    HELD.load(Ordering::Relaxed) > held_cap() || SLOT_WAITERS.with(|w| w.get()) > 0
}

/// Segments a thread's writers may hold open at once: a 32nd of the soft
/// `RLIMIT_NOFILE` (at least 8), each two descriptors on the io_uring path (with the
/// directory, three), so that the segments of every shard's active topics stay well
/// inside the limit however fast topics become active.
fn writer_slots() -> u64 {
    (nofile_limit() / 32).max(8)
}

thread_local! {
    static WRITER_SLOTS: std::rc::Rc<glommio::sync::Semaphore> =
        std::rc::Rc::new(glommio::sync::Semaphore::new(writer_slots()));
    /// Writers of this thread waiting for a permit.
    static SLOT_WAITERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A permit to hold a segment open, from this thread's [`writer_slots`]; waits (waking
/// idle writers, which then give theirs back after [`PRESSED_RELEASE`]) while none is
/// free. `None` on the blocking-thread path, which keeps its descriptors and takes
/// none, and when the semaphore is closed.
pub(super) async fn writer_slot(store: &TopicStore) -> Option<glommio::sync::StaticPermit> {
    if store.cfg.io != SegmentIo::Ring {
        return None;
    }
    let sem = WRITER_SLOTS.with(|s| s.clone());
    if let Ok(p) = sem.try_acquire_static_permit(1) {
        return Some(p);
    }
    SLOT_WAITERS.with(|w| w.set(w.get() + 1));
    wake_pressure_waiters();
    let p = sem.acquire_static_permit(1).await.ok();
    SLOT_WAITERS.with(|w| w.set(w.get() - 1));
    p
}

/// The number of stores holding descriptors (all shards).
pub fn stores_holding_descriptors() -> usize {
    HELD.load(Ordering::Relaxed)
}

thread_local! {
    /// Idle writers of this thread waiting with descriptors held, by store address,
    /// woken when a store takes descriptors above [`held_cap`].
    static PRESSURE_WAITERS: RefCell<HashMap<usize, Waker>> = RefCell::new(HashMap::new());
}

/// Wakes every idle writer of this thread (see [`pressure_changed`]).
fn wake_pressure_waiters() {
    let wakers = PRESSURE_WAITERS.with(|w| std::mem::take(&mut *w.borrow_mut()));
    for (_, w) in wakers {
        w.wake();
    }
}

/// Completes the next time a store of this thread takes descriptors while
/// [`pressed`]. `key` identifies the waiting store (its address); the registration
/// goes when the future does.
pub(super) async fn pressure_changed(key: usize) {
    struct Registered(usize);
    impl Drop for Registered {
        fn drop(&mut self) {
            let _ = PRESSURE_WAITERS.try_with(|w| w.borrow_mut().remove(&self.0));
        }
    }
    let mut registered = None;
    std::future::poll_fn(|cx| {
        if registered.is_some() && !PRESSURE_WAITERS.with(|w| w.borrow().contains_key(&key)) {
            return std::task::Poll::Ready(());
        }
        PRESSURE_WAITERS.with(|w| w.borrow_mut().insert(key, cx.waker().clone()));
        registered.get_or_insert(Registered(key));
        std::task::Poll::Pending
    })
    .await
}

/// The store's directory, open and counted in [`HELD`] until dropped.
pub(super) struct HeldDir {
    file: Arc<std::fs::File>,
}

impl HeldDir {
    pub(super) fn new(file: std::fs::File) -> HeldDir {
        let held = HELD.fetch_add(1, Ordering::Relaxed) + 1;
        if held > held_cap() {
            wake_pressure_waiters();
        }
        HeldDir {
            file: Arc::new(file),
        }
    }
}

impl Drop for HeldDir {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A path under the store's directory through its descriptor
/// (`/proc/self/fd/<n>/<name>`), holding that descriptor open for as long as it lives.
pub struct FdPath {
    path: PathBuf,
    _dir: Arc<std::fs::File>,
}

impl std::ops::Deref for FdPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for FdPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// The (device, inode) of an open directory, which identify it across renames.
pub(super) fn dir_id(f: &std::fs::File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// A topic's directory: its path, the descriptor held while the store is active, the
/// opens in flight under it, and whether the topic was deleted.
pub(super) struct Directory {
    path: PathBuf,
    /// The directory's (device, inode), checked when it is opened again by its path.
    id: (u64, u64),
    /// The directory, open while the store is active: files are opened through
    /// `/proc/self/fd/<fd>/` so that renaming the directory (topic delete) never breaks
    /// an open in flight.
    held: RefCell<Option<HeldDir>>,
    /// Opens of files in flight; files are unlinked only when none is.
    opens: Cell<usize>,
    /// Topic deleted: no more writes or opens.
    deleted: Cell<bool>,
    /// The writer's wake-up: an idle writer starts counting idle time again when the
    /// directory is opened again.
    wake: Rc<crate::Notify>,
}

impl Directory {
    /// The directory at `path`, open as `file`: held when `hold`, else closed at once and
    /// opened again when needed. `wake` is the writer's wake-up.
    ///
    /// Errors: the directory's `fstat` failure.
    pub(super) fn new(
        path: PathBuf,
        file: std::fs::File,
        hold: bool,
        wake: Rc<crate::Notify>,
    ) -> Result<Directory, StoreError> {
        let id = dir_id(&file)
            .map_err(|e| io_err(e).context(format_args!("stat {}", path.display())))?;
        Ok(Directory {
            path,
            id,
            held: RefCell::new(hold.then(|| HeldDir::new(file))),
            opens: Cell::new(0),
            deleted: Cell::new(false),
            wake,
        })
    }

    /// The directory's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The path, for log lines.
    pub(super) fn display(&self) -> std::path::Display<'_> {
        self.path.display()
    }

    /// True once the topic is deleted.
    pub(super) fn is_deleted(&self) -> bool {
        self.deleted.get()
    }

    /// The topic is deleted (its directory moved aside): nothing more is opened.
    pub(super) fn mark_deleted(&self) {
        self.deleted.set(true);
    }

    /// An open of a file under the directory starts: files are not unlinked until it
    /// ends ([`Directory::end_open`]).
    pub(super) fn begin_open(&self) {
        self.opens.set(self.opens.get() + 1);
    }

    /// An open begun by [`Directory::begin_open`] is over.
    pub(super) fn end_open(&self) {
        self.opens.set(self.opens.get() - 1);
    }

    /// Waits until no open of a file is in flight.
    pub(super) async fn no_opens(&self) {
        while self.opens.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }

    /// True while the directory descriptor is held.
    pub(super) fn holds(&self) -> bool {
        self.held.borrow().is_some()
    }

    /// Closes the held directory descriptor (opened again on demand).
    pub(super) fn release(&self) {
        *self.held.borrow_mut() = None;
    }

    /// The directory descriptor: the one held, else the directory opened again by its
    /// path (then held until the writer finds the store idle).
    ///
    /// Errors: `topic deleted` once the topic is deleted, or when the path now names
    /// another directory (see the module docs); the open's error otherwise.
    pub(super) fn handle(&self) -> Result<Arc<std::fs::File>, StoreError> {
        if let Some(h) = self.held.borrow().as_ref() {
            return Ok(h.file.clone());
        }
        let held = HeldDir::new(self.open()?);
        let file = held.file.clone();
        *self.held.borrow_mut() = Some(held);
        // The writer (if idle) starts counting idle time from now.
        self.wake.notify();
        Ok(file)
    }

    /// The directory descriptor held, else the directory opened by its path for the
    /// caller alone (not kept): for a one-off use, such as a metadata write of an idle
    /// topic.
    ///
    /// Errors: as [`Directory::handle`].
    pub(super) fn for_once(&self) -> Result<Arc<std::fs::File>, StoreError> {
        if let Some(h) = self.held.borrow().as_ref() {
            return Ok(h.file.clone());
        }
        Ok(Arc::new(self.open()?))
    }

    /// Opens the directory by its path, unless the topic is deleted, and checks that it
    /// is still this store's (see the module docs).
    fn open(&self) -> Result<std::fs::File, StoreError> {
        if self.deleted.get() {
            return Err(StoreError::topic_deleted());
        }
        let f = std::fs::File::open(&self.path)
            .map_err(|e| io_err(e).context(format_args!("open {}", self.path.display())))?;
        if dir_id(&f).ok() != Some(self.id) {
            return Err(StoreError::topic_deleted());
        }
        Ok(f)
    }

    /// `path`'s file name under the directory descriptor (stable across a rename of the
    /// directory); the result keeps the descriptor open.
    ///
    /// Errors: as [`Directory::handle`].
    pub(super) fn fd_path(&self, path: &Path) -> Result<FdPath, StoreError> {
        use std::os::fd::AsRawFd;
        let dir = self.handle()?;
        let name = path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        Ok(FdPath {
            path: PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name),
            _dir: dir,
        })
    }
}

impl TopicStore {
    /// True when the store holds a descriptor it can give back when idle: never on the
    /// blocking-thread path, which keeps them (see the module docs).
    pub(super) fn holds_releasable(&self) -> bool {
        self.cfg.io == SegmentIo::Ring
            && (self.dir.holds() || self.segments.holds_readers() || self.journal.holds_file())
    }

    /// Drops the cached readers, the journal file (when synced: a dirty one is kept for
    /// the next sync) and the directory descriptor, once no open is in flight. The
    /// segment being written is the writer's to close first.
    pub(super) async fn release_descriptors(&self) {
        self.dir.no_opens().await;
        self.segments.release_readers();
        if !self.journal.unsynced() {
            self.journal.drop_file();
            self.dir.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{StoreConfig, StoredRecord, TopicStore};
    use bytes::Bytes;
    use std::time::Duration;

    fn record(seq: u64) -> StoredRecord {
        StoredRecord {
            seq,
            timestamp: 1,
            defer_until: 0,
            id: seq,
            attempts: 0,
            body: Bytes::from_static(b"body"),
        }
    }

    /// A store without its directory open reopens it by its path only while that path
    /// still names its own directory: after the directory was replaced (a topic deleted
    /// and made again under the same name) it refuses, and never touches the new one.
    #[test]
    fn a_released_directory_is_reopened_only_if_it_is_still_the_stores() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t");
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(move || async move {
                let cfg = StoreConfig {
                    max_bytes_per_file: 1 << 30,
                    sync_every: 1,
                    sync_timeout: Duration::from_secs(60),
                    io: crate::SegmentIo::Ring,
                };
                let store = TopicStore::create(path.clone(), cfg, 0).unwrap();
                store.append(&record(0));
                store.wait_durable(1).await.unwrap();
                // Released, then opened again by its path: the same directory.
                store.release_descriptors().await;
                assert!(!store.dir.holds());
                let p = store.dir.fd_path(&path.join("x")).unwrap();
                std::fs::write(&*p, b"x").unwrap();
                assert!(path.join("x").exists());
                drop(p);
                store.release_descriptors().await;
                // The directory replaced by another under the same name: refused.
                std::fs::rename(&path, path.with_file_name("aside")).unwrap();
                std::fs::create_dir(&path).unwrap();
                let e = store
                    .dir
                    .fd_path(&path.join("y"))
                    .err()
                    .map(|e| e.to_string());
                assert_eq!(e.as_deref(), Some("topic deleted"));
                assert!(!path.join("y").exists());
                std::fs::remove_dir(&path).unwrap();
                std::fs::rename(path.with_file_name("aside"), &path).unwrap();
                // Records written before a release are read back after it.
                store.release_descriptors().await;
                let recs = store.read(0, 10).await.unwrap();
                assert_eq!(recs.len(), 1);
                store.close().await;
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
