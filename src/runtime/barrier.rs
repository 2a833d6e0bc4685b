//! The recovery barrier: no shard serves before every shard has recovered its topics.

use super::allowed_cpus;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// The point every shard reaches once its topics are recovered; no shard serves before
/// all have arrived (nsqd: LoadMetadata runs before Main starts the listeners' loops).
pub struct RecoveryBarrier {
    shards: usize,
    arrived: AtomicUsize,
    failed: AtomicBool,
}

impl RecoveryBarrier {
    pub fn new(shards: usize) -> RecoveryBarrier {
        RecoveryBarrier {
            shards,
            arrived: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// A shard could not start: the others stop waiting.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Counts this shard as recovered and waits for the others. Polls (every
    /// millisecond, every `shards / CPUs` ms with more shards than CPUs: each wake-up
    /// of an executor ends in a process-wide `membarrier` when it sleeps again) rather
    /// than relying on a cross-executor wake-up (one can be missed while an executor
    /// goes to sleep). Returns false if a shard failed to start. (A SIGTERM meanwhile is
    /// handled once serving starts: the shards then shut down gracefully.)
    pub async fn arrive_and_wait(&self) -> bool {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let per_cpu = self.shards / allowed_cpus().len().max(1);
        let poll = Duration::from_millis(per_cpu.clamp(1, 50) as u64);
        loop {
            if self.failed.load(Ordering::SeqCst) {
                return false;
            }
            if self.arrived.load(Ordering::SeqCst) >= self.shards {
                return true;
            }
            glommio::timer::sleep(poll).await;
        }
    }
}
