//! Work that can block or take long, run on threads of its own instead of a shard's
//! executor thread (which would stall every client of the shard) or glommio's
//! blocking pool (which would queue the shard's file work behind it): name lookups
//! (`crate::dns`) and the validation of large auth replies (`crate::auth`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A process-wide limit on the threads [`off_executor`] runs at once for one kind of
/// work; a further call waits for a slot.
pub struct Slots {
    used: AtomicUsize,
    max: usize,
}

impl Slots {
    /// At most `max` at once (at least 1).
    pub const fn new(max: usize) -> Slots {
        Slots {
            used: AtomicUsize::new(0),
            max: if max == 0 { 1 } else { max },
        }
    }

    /// Threads running now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Why work given to [`off_executor`] produced no result. `Display`: `cannot start a
/// NAME thread: <io error>`, `NAME thread ended`.
#[derive(Debug)]
pub enum OffloadError {
    /// The thread could not be started.
    Spawn { name: String, error: std::io::Error },
    /// The thread ended without a result (the work panicked).
    Ended { name: String },
}

impl std::fmt::Display for OffloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OffloadError::Spawn { name, error } => {
                write!(f, "cannot start a {name} thread: {error}")
            }
            OffloadError::Ended { name } => write!(f, "{name} thread ended"),
        }
    }
}

impl std::error::Error for OffloadError {}

/// Runs `f` on a thread of its own (named `name`), at most `slots.max` such threads at
/// once process-wide, and waits for its result without blocking the calling executor.
/// For work that can block or take long (a name lookup, the parse of a large auth
/// reply), which on a shard thread would stall every client of the shard and on
/// glommio's blocking pool would queue the shard's file work behind it.
/// Errors: the thread could not be started, or it panicked.
pub async fn off_executor<T: Send + 'static>(
    name: &str,
    slots: &'static Slots,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, OffloadError> {
    // A slot, without blocking the executor.
    loop {
        let n = slots.used.load(Ordering::Relaxed);
        if n < slots.max
            && slots
                .used
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            break;
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    let (tx, rx) = futures::channel::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            /// Gives the slot back also when `f` panics.
            struct Slot(&'static Slots);
            impl Drop for Slot {
                fn drop(&mut self) {
                    self.0.used.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let slot = Slot(slots);
            let out = f();
            // Free before the caller sees the result: a call made once it has it finds
            // the slot free.
            drop(slot);
            let _ = tx.send(out);
        });
    if let Err(e) = spawned {
        slots.used.fetch_sub(1, Ordering::AcqRel);
        return Err(OffloadError::Spawn {
            name: name.to_string(),
            error: e,
        });
    }
    rx.await.map_err(|_| OffloadError::Ended {
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind of work limited to two threads runs at most two at once, and every call
    /// still gets its result.
    #[test]
    fn slots_bound_the_threads_running_at_once() {
        static TWO: Slots = Slots::new(2);
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let tasks: Vec<_> = (0..6)
                    .map(|i| {
                        glommio::spawn_local(off_executor("two", &TWO, move || {
                            let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
                            MOST.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            RUNNING.fetch_sub(1, Ordering::SeqCst);
                            i * 10
                        }))
                    })
                    .collect();
                let mut got = Vec::new();
                for t in tasks {
                    got.push(t.await.unwrap());
                }
                assert_eq!(got, [0, 10, 20, 30, 40, 50]);
                assert_eq!(MOST.load(Ordering::SeqCst), 2);
                assert_eq!(TWO.in_use(), 0);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
