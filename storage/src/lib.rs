//! Durable storage for the thread-per-core nsqd: per-topic segment logs with CRC-framed
//! records ([`record`], format version [`record::FORMAT_VERSION`]), written with O_DIRECT
//! through io_uring (glommio DMA files), or with plain `pwrite`/`fdatasync` on the
//! shard's blocking thread on FUSE and network filesystems ([`SegmentIo`]); side indexes
//! of sealed segments and the partial index of the one being written ([`index`]); group
//! commit, recovery, reads with a shared block cache, retention and descriptor limits
//! ([`store`]); a delivery journal of attempts and requeues between checkpoints
//! ([`journal`]); atomically written metadata ([`meta`]); the direct-I/O probe each
//! shard runs first ([`probe`]); deterministic disk-fault injection for tests
//! ([`faults`], `NSQD_STORAGE_FAULTS`); and rate-limited logging of repeating errors
//! ([`repeat_log`]).
//!
//! Layout under `--data-path`:
//! ```text
//! <data-path>/topics/t-<topic>/<base sequence, 20 digits>.seg   segment files
//! <data-path>/topics/t-<topic>/<base sequence, 20 digits>.idx   index of a sealed segment
//! <data-path>/topics/t-<topic>/<base sequence, 20 digits>.pidx  partial index of the segment being written
//! <data-path>/topics/t-<topic>/journal-<generation, 20 digits>.log  delivery journal
//! <data-path>/topics/t-<topic>/meta.json                          topic metadata
//! ```
//! Errors are [`StoreError`]s: the message the logs and health show, and the
//! `io::ErrorKind` behind it.
//!
//! Data is laid out by topic name, not by shard, so a restart with another `--shards`
//! finds everything.

#![forbid(unsafe_code)]

pub mod error;
pub mod faults;
pub mod index;
pub mod journal;
pub mod meta;
pub mod probe;
pub mod record;
pub mod repeat_log;
pub mod store;

pub use error::StoreError;
pub use record::StoredRecord;
pub use store::{
    ReadPos, Recovered, SegmentInfo, SegmentIo, StoreConfig, TopicStore, UnknownSegmentIo,
};

use std::cell::{Cell, RefCell};
use std::task::{Poll, Waker};

thread_local! {
    /// Stores of deleted topics that finished on this thread since the last
    /// [`take_stores_released`].
    static STORES_RELEASED: Cell<u64> = const { Cell::new(0) };
}

/// How many stores of deleted topics finished on the calling thread since the last call
/// (and resets the count). Each freed its segment's DMA write buffer (256 KiB from
/// malloc) and its pending buffers: glibc keeps those pages (RSS) until `malloc_trim`,
/// which the broker's memory task runs after enough of them (see nsqd's `memory`).
pub fn take_stores_released() -> u64 {
    STORES_RELEASED.with(|c| c.replace(0))
}

pub(crate) fn store_released() {
    STORES_RELEASED.with(|c| c.set(c.get() + 1));
}

thread_local! {
    /// Bytes of buffers stores on this thread let go since the last
    /// [`take_buffers_freed`].
    static BUFFERS_FREED: Cell<u64> = const { Cell::new(0) };
}

/// Bytes of write buffers the stores on the calling thread let go since the last call
/// (and resets the count): a pending buffer that grew for a burst is freed once the
/// burst is over; the broker's memory task trims the heap after enough of them.
pub fn take_buffers_freed() -> u64 {
    BUFFERS_FREED.with(|c| c.replace(0))
}

pub(crate) fn buffer_freed(bytes: usize) {
    BUFFERS_FREED.with(|c| c.set(c.get().saturating_add(bytes as u64)));
}

/// Edge-triggered wake-up for one task of this executor.
#[derive(Default)]
pub struct Notify {
    flag: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.flag.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Drops a pending notification (a `wait` then waits for the next `notify`).
    pub fn clear(&self) {
        self.flag.set(false);
    }

    pub async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.flag.replace(false) {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// The directory of a topic's data: `t-` + name, so that names like `.` stay safe.
pub fn topic_dir(data_path: &std::path::Path, topic: &str) -> std::path::PathBuf {
    data_path.join("topics").join(format!("t-{topic}"))
}
