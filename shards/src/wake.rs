//! Single-threaded wake-ups for tasks of one executor (no atomics, no locks; nothing to
//! do with Unix signals, which `src/runtime/signals.rs` handles): [`Notify`] wakes one waiting
//! task, [`Latch`] releases every task once (shutdown).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// An edge-triggered notification for one waiting task: `notify` sets a flag and wakes
/// the waiter; `wait` completes once the flag is set, clearing it.
pub use nsq_storage::Notify;

/// A one-shot, level-triggered latch many tasks can wait for (shutdown): once `set`,
/// every present and future `wait` completes.
#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl Latch {
    pub fn set(&self) {
        self.set.set(true);
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn wait(&self) -> LatchWait<'_> {
        LatchWait(self)
    }
}

/// The future of [`Latch::wait`].
pub struct LatchWait<'a>(&'a Latch);

impl Future for LatchWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.set.get() {
            return Poll::Ready(());
        }
        let mut wakers = self.0.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// A counter that only grows, which tasks can wait to reach (the metadata checkpoint a
/// change must be written by before it is answered).
#[derive(Default)]
pub struct Progress {
    done: Cell<u64>,
    /// Calls of `advance_to` so far (each wakes every waiter).
    ticks: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Progress {
    /// The highest value reached.
    pub fn get(&self) -> u64 {
        self.done.get()
    }

    /// Moves the counter to `n` (never back) and wakes every waiter.
    pub fn advance_to(&self, n: u64) {
        if n > self.done.get() {
            self.done.set(n);
        }
        self.ticks.set(self.ticks.get() + 1);
        for w in self.wakers.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Completes once the counter has reached `n`.
    pub fn wait_for(&self, n: u64) -> ProgressWait<'_> {
        ProgressWait(self, n)
    }

    /// How many times `advance_to` was called.
    pub fn ticks(&self) -> u64 {
        self.ticks.get()
    }

    /// Completes at the first `advance_to` after [`Progress::ticks`] said `t`.
    pub async fn next_tick(&self, t: u64) {
        std::future::poll_fn(|cx| {
            if self.ticks.get() > t {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// The future of [`Progress::wait_for`].
pub struct ProgressWait<'a>(&'a Progress, u64);

impl Future for ProgressWait<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.done.get() >= self.1 {
            return Poll::Ready(());
        }
        let mut wakers = self.0.wakers.borrow_mut();
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
