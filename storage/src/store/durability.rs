//! Durability (nsqd: diskqueue.go's sync after `--sync-every` writes or
//! `--sync-timeout`): the sequence below which records are fdatasync'ed, the publishers
//! waiting for it (group commit: every publisher waiting at a sync shares it), and the
//! counts of writes not yet synced.

use crate::error::StoreError;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// A publisher waiting until the records below `seq` are durable.
struct Waiter {
    seq: u64,
    tx: oneshot::Sender<Result<(), StoreError>>,
}

/// The durable sequence and who waits for it, shared by the publishers and the writer.
pub(super) struct Durability {
    /// Records below this are fdatasync'ed.
    durable_seq: Cell<u64>,
    waiters: RefCell<Vec<Waiter>>,
    /// Journal events written to the page cache by the flusher and not yet counted by
    /// the writer toward `--sync-every`.
    journal_written: Cell<u64>,
}

impl Durability {
    /// Everything below `durable_seq` is durable already (a new or recovered store).
    pub(super) fn new(durable_seq: u64) -> Durability {
        Durability {
            durable_seq: Cell::new(durable_seq),
            waiters: RefCell::new(Vec::new()),
            journal_written: Cell::new(0),
        }
    }

    /// Records below this sequence are durable.
    pub(super) fn durable_seq(&self) -> u64 {
        self.durable_seq.get()
    }

    /// Records below `seq` are durable (never moves back).
    pub(super) fn advance(&self, seq: u64) {
        self.durable_seq.set(self.durable_seq.get().max(seq));
    }

    /// `None` when every record below `seq` is durable already; else a receiver told
    /// once they are ([`Durability::release_waiters`]) or of the error that prevented it
    /// ([`Durability::fail_waiters`]).
    pub(super) fn waiter(&self, seq: u64) -> Option<oneshot::Receiver<Result<(), StoreError>>> {
        if self.durable_seq.get() >= seq {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().push(Waiter { seq, tx });
        Some(rx)
    }

    /// True while a publisher waits for durability (the writer then syncs at once).
    /// The lowest sequence a publisher waits for, if any.
    pub(super) fn lowest_waiting(&self) -> Option<u64> {
        self.waiters.borrow().iter().map(|w| w.seq).min()
    }

    pub(super) fn has_waiters(&self) -> bool {
        !self.waiters.borrow().is_empty()
    }

    /// Tells every waiting publisher of `e`.
    pub(super) fn fail_waiters(&self, e: &StoreError) {
        for w in self.waiters.borrow_mut().drain(..) {
            let _ = w.tx.send(Err(e.clone()));
        }
    }

    /// Tells the publishers whose records are now durable.
    pub(super) fn release_waiters(&self) {
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

    /// Counts `n` journal events written to the page cache, for the writer's next sync.
    pub(super) fn journal_written(&self, n: u64) {
        self.journal_written.set(self.journal_written.get() + n);
    }

    /// True when journal events were written since the writer last counted them.
    pub(super) fn has_journal_written(&self) -> bool {
        self.journal_written.get() > 0
    }

    /// The journal events written since the last call (and resets the count).
    pub(super) fn take_journal_written(&self) -> u64 {
        self.journal_written.replace(0)
    }
}

/// The writer's writes (records and journal events) since its last sync, and when that
/// was: what `--sync-every` and `--sync-timeout` count.
pub(super) struct Unsynced {
    count: u64,
    last_sync: Instant,
}

impl Unsynced {
    /// Nothing written yet; the sync timeout counts from now.
    pub(super) fn new() -> Unsynced {
        Unsynced {
            count: 0,
            last_sync: Instant::now(),
        }
    }

    /// Counts `n` more writes.
    pub(super) fn add(&mut self, n: u64) {
        self.count += n;
    }

    /// True when something was written since the last sync.
    pub(super) fn any(&self) -> bool {
        self.count > 0
    }

    /// True when the policy calls for a sync: `every` writes, or some writes and
    /// `timeout` since the last sync.
    pub(super) fn due(&self, every: u64, timeout: Duration) -> bool {
        self.count >= every || (self.count > 0 && self.last_sync.elapsed() >= timeout)
    }

    /// Time left until writes made now are due for their sync after `timeout`.
    pub(super) fn time_left(&self, timeout: Duration) -> Duration {
        timeout.saturating_sub(self.last_sync.elapsed())
    }

    /// A sync ran: nothing unsynced, the timeout counts from now.
    pub(super) fn synced(&mut self) {
        self.count = 0;
        self.last_sync = Instant::now();
    }
}
