//! Blocks of segment data read recently, shared by every channel of the topic: lagging
//! channels reading the same region of the log read it from the disk once (nsqd gives
//! each channel its own disk queue, so each reads its own copy).
//!
//! Reads go by aligned blocks of [`BLOCK`] bytes. Only whole blocks that lie wholly
//! within a segment's flushed data are kept: flushed records never change, while the
//! bytes past the flushed end of the segment being written are a partly written buffer.
//! A segment created again under the same base (after a failed first write) or deleted
//! forgets its blocks ([`BlockCache::forget`]). A block being read is read once: a
//! second reader waits for the first and takes its block.
//!
//! Memory: at most [`PER_STORE`] blocks a topic and [`PER_THREAD`] bytes a shard
//! (beyond that, blocks are read and not kept); an idle store drops its blocks with its
//! descriptors.

use bytes::Bytes;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};

/// The read and cache unit (bytes); a multiple of every O_DIRECT alignment.
pub(super) const BLOCK: u64 = 1024 * 1024;
/// Blocks a topic keeps (channels within this many MiB of each other share reads).
const PER_STORE: usize = 16;
/// Bytes of blocks all the topics of one shard keep.
const PER_THREAD: usize = 128 << 20;

thread_local! {
    /// Bytes of blocks kept by the stores of this thread.
    static KEPT: Cell<usize> = const { Cell::new(0) };
}

/// (segment base, block offset).
type Key = (u64, u64);

#[derive(Default)]
pub(super) struct BlockCache {
    /// Most recently used last.
    blocks: RefCell<VecDeque<(Key, Bytes)>>,
    /// Blocks being read, with the readers waiting for them.
    reading: RefCell<HashMap<Key, Vec<oneshot::Sender<()>>>>,
    /// Blocks read from the disk, and blocks found here (for tests and stats).
    misses: Cell<u64>,
    hits: Cell<u64>,
}

impl BlockCache {
    fn get(&self, key: Key) -> Option<Bytes> {
        let mut blocks = self.blocks.borrow_mut();
        let i = blocks.iter().position(|(k, _)| *k == key)?;
        let entry = blocks.remove(i)?;
        let data = entry.1.clone();
        blocks.push_back(entry);
        Some(data)
    }

    fn put(&self, key: Key, data: Bytes) {
        let mut blocks = self.blocks.borrow_mut();
        if blocks.iter().any(|(k, _)| *k == key) {
            return;
        }
        if blocks.len() >= PER_STORE {
            if let Some((_, old)) = blocks.pop_front() {
                KEPT.with(|k| k.set(k.get().saturating_sub(old.len())));
            }
        }
        if KEPT.with(|k| k.get()) + data.len() > PER_THREAD {
            return;
        }
        KEPT.with(|k| k.set(k.get() + data.len()));
        blocks.push_back((key, data));
    }

    /// Forgets the blocks of the segment at `base` (deleted, or created again).
    pub(super) fn forget(&self, base: u64) {
        self.blocks.borrow_mut().retain(|((b, _), d)| {
            let keep = *b != base;
            if !keep {
                KEPT.with(|k| k.set(k.get().saturating_sub(d.len())));
            }
            keep
        });
    }

    /// Drops every block (the store is idle or closing).
    pub(super) fn clear(&self) {
        for (_, d) in self.blocks.borrow_mut().drain(..) {
            KEPT.with(|k| k.set(k.get().saturating_sub(d.len())));
        }
    }

    /// (blocks read from the disk, blocks served from memory) so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        (self.misses.get(), self.hits.get())
    }

    /// The block at `key`: from memory, from a read already under way, or read with
    /// `read` (which returns up to [`BLOCK`] bytes; a shorter block is not kept).
    pub(super) async fn block<F, Fut>(&self, key: Key, read: F) -> std::io::Result<Bytes>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = std::io::Result<Bytes>>,
    {
        if let Some(b) = self.get(key) {
            self.hits.set(self.hits.get() + 1);
            return Ok(b);
        }
        let wait = match self.reading.borrow_mut().get_mut(&key) {
            Some(waiters) => {
                let (tx, rx) = oneshot::channel();
                waiters.push(tx);
                Some(rx)
            }
            None => None,
        };
        if let Some(rx) = wait {
            // The other read ended: take its block, or (failed, short, not kept) read
            // it here.
            let _ = rx.await;
            if let Some(b) = self.get(key) {
                self.hits.set(self.hits.get() + 1);
                return Ok(b);
            }
        }
        self.reading.borrow_mut().insert(key, Vec::new());
        // Woken however the read ends (also when this future is dropped mid-read).
        struct Done<'a>(&'a BlockCache, Key);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                if let Some(waiters) = self.0.reading.borrow_mut().remove(&self.1) {
                    for w in waiters {
                        let _ = w.send(());
                    }
                }
            }
        }
        let _done = Done(self, key);
        self.misses.set(self.misses.get() + 1);
        let data = read().await?;
        if data.len() as u64 == BLOCK {
            self.put(key, data.clone());
        }
        Ok(data)
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        self.clear();
    }
}
