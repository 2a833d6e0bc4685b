//! The writer task's lifecycle (nsqd: the disk queue's exitChan and exitSyncChan): the
//! wake-up publishers and the journal give it, the request to close, and the signal
//! that it has finished.

use crate::Notify;
use std::cell::Cell;
use std::rc::Rc;

/// Wake-ups and the close handshake between a store and its writer task.
pub(super) struct Lifecycle {
    /// Wakes the writer task: records, journal events, waiters or a close.
    wake: Rc<Notify>,
    /// A close was asked for: the writer flushes, syncs and stops.
    closing: Cell<bool>,
    /// Notified once the writer task has finished.
    done: Notify,
    /// Set once the writer task has finished (after a close).
    finished: Cell<bool>,
}

impl Lifecycle {
    pub(super) fn new() -> Lifecycle {
        Lifecycle {
            wake: Rc::new(Notify::default()),
            closing: Cell::new(false),
            done: Notify::default(),
            finished: Cell::new(false),
        }
    }

    /// The writer's wake-up, shared with whatever else must wake it.
    pub(super) fn waker(&self) -> Rc<Notify> {
        self.wake.clone()
    }

    /// Wakes the writer task.
    #[inline]
    pub(super) fn wake(&self) {
        self.wake.notify();
    }

    /// Completes at the next [`Lifecycle::wake`] (or one not yet seen).
    pub(super) async fn woken(&self) {
        self.wake.wait().await
    }

    /// Asks the writer to flush, sync and stop.
    pub(super) fn close(&self) {
        self.closing.set(true);
        self.wake.notify();
    }

    /// True once a close was asked for.
    pub(super) fn closing(&self) -> bool {
        self.closing.get()
    }

    /// The writer task has finished.
    pub(super) fn finish(&self) {
        self.finished.set(true);
    }

    /// Tells [`Lifecycle::wait_finished`] that the writer has finished (after the
    /// waiters it must release are released).
    pub(super) fn notify_done(&self) {
        self.done.notify();
    }

    /// True once the writer task has finished.
    pub(super) fn finished(&self) -> bool {
        self.finished.get()
    }

    /// Waits until the writer task has finished.
    pub(super) async fn wait_finished(&self) {
        while !self.finished.get() {
            self.done.wait().await;
        }
    }
}
