//! Giving memory back after a burst of connections ends.
//!
//! Each shard's thread allocates from its own glibc arena. When thousands of
//! connections close, their memory goes back to that arena's free lists, and the kernel
//! still counts it (RSS); the next burst may land on the other shards (every shard
//! accepts from one listening socket, whichever is awake wins), which cannot use it.
//! Measured before this: a second round of 19,750 idle connections on 2 shards raised
//! RSS by 0.5 % to 29 % depending on how the rounds split between the shards. Go's
//! runtime (nsqd) returns freed heap to the kernel in the background (its scavenger);
//! here each shard asks glibc to do the same (`malloc_trim(0)`: whole free pages of
//! every arena are handed back with `MADV_DONTNEED`), checked every [`TRIM_CHECK`]: once
//! at least [`TRIM_AFTER_CLOSES`] connections on it have ended since its last trim, or
//! at least [`TRIM_AFTER_QUIET_CLOSES`] and then none for a whole check interval (a
//! smaller burst that is over). A deleted topic's store counts as an ended connection
//! (`nsq_storage::take_stores_released`): each frees a 256 KiB DMA write buffer that
//! glibc otherwise keeps, partly resident, in the shard's arena; without a trim,
//! rounds of creating and deleting topics raised RSS by about 6 KB per topic for good.
//! A trim costs about a millisecond per 100 MB of heap; a steady stream of short
//! connections causes at most one per check interval.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Connections (TCP, HTTP, HTTPS) that must have ended on a shard before it trims.
pub const TRIM_AFTER_CLOSES: u64 = 1024;
/// Connections that must have ended on a shard, none of them in the last
/// [`TRIM_CHECK`], before it trims.
pub const TRIM_AFTER_QUIET_CLOSES: u64 = 128;
/// How often a shard looks at its count of ended connections.
pub const TRIM_CHECK: Duration = Duration::from_secs(1);

/// Message bodies freed in bulk on a shard (topics or channels deleted, a channel's disk
/// read-ahead dropped: `nsq_shards::take_memory_freed`) that make it trim at its next
/// check whatever its count of ended connections: a deleted topic's backlog of large
/// messages stayed resident (1.4 GB of 1.5 GB after deleting a topic of 200 lagging
/// channels).
pub const TRIM_AFTER_FREED_BYTES: u64 = 16 << 20;
/// Message bodies freed on a shard, none of them in the last [`TRIM_CHECK`], that make
/// it trim: the tail of a burst (the last deferred messages of a million delivered and
/// finished) would otherwise stay resident below [`TRIM_AFTER_FREED_BYTES`]. glibc's
/// trim covers every arena, so bodies another shard allocated (a forwarded publish) go
/// back too.
pub const TRIM_AFTER_QUIET_FREED_BYTES: u64 = 1 << 20;

thread_local! {
    /// Connections ended on this shard's thread since its last trim.
    static CLOSED: Cell<u64> = const { Cell::new(0) };
    /// Body bytes freed on this shard's thread since its last trim.
    static FREED: Cell<u64> = const { Cell::new(0) };
    /// Bytes counted by [`note_freed_by_burst`] since the last trim.
    static BURST_FREED: Cell<u64> = const { Cell::new(0) };
}

/// Counts `bytes` freed on the calling shard by the end of a burst: a replicated topic's
/// Raft log entries dropped by a compaction, which on a follower are most of what a
/// burst of publishes allocated (it has no consumers whose FINs count what they free).
/// They make the shard trim once none has been freed for a [`TRIM_CHECK`] (at least
/// [`TRIM_AFTER_QUIET_FREED_BYTES`] of them), never while they keep coming: a trim
/// under a steady load hands back memory the next appends fault in again.
pub fn note_freed_by_burst(bytes: u64) {
    BURST_FREED.with(|f| f.set(f.get().saturating_add(bytes)));
}

/// Counts one ended connection on the calling shard (called by the accept loop when a
/// connection's task returns).
pub fn connection_closed() {
    CLOSED.with(|c| c.set(c.get() + 1));
}

/// Whether to trim, given the connections ended since the last trim now and at the
/// previous check.
fn due(closed: u64, closed_at_last_check: u64) -> bool {
    closed >= TRIM_AFTER_CLOSES
        || (closed >= TRIM_AFTER_QUIET_CLOSES && closed == closed_at_last_check)
}

/// Whether to trim, given the body bytes freed since the last trim now and at the
/// previous check.
fn due_freed(freed: u64, freed_at_last_check: u64) -> bool {
    freed >= TRIM_AFTER_FREED_BYTES
        || (freed >= TRIM_AFTER_QUIET_FREED_BYTES && freed == freed_at_last_check)
}

/// Whether to trim, given the bytes counted by [`note_freed_by_burst`] since the last
/// trim now and at the previous check: once they stopped growing, if enough.
fn due_burst(freed: u64, freed_at_last_check: u64) -> bool {
    freed >= TRIM_AFTER_QUIET_FREED_BYTES && freed == freed_at_last_check
}

/// Runs until `stop` resolves: every [`TRIM_CHECK`], trims the heap when enough
/// connections ended on this shard since the last trim (see the module docs).
pub async fn trim_loop(stop: impl std::future::Future<Output = ()>) {
    use futures::future::{select, Either};
    use std::pin::pin;
    let mut stop = pin!(stop);
    let mut last = 0;
    let mut last_freed = 0;
    let mut last_burst = 0;
    loop {
        let tick = pin!(glommio::timer::sleep(TRIM_CHECK));
        if let Either::Right(_) = select(tick, stop.as_mut()).await {
            return;
        }
        // A deleted topic's store counts as a closed connection: it freed a 256 KiB
        // DMA write buffer (and its pending buffers) that glibc keeps resident.
        let released = nsq_storage::take_stores_released();
        let closed = CLOSED.with(|c| {
            c.set(c.get() + released);
            c.get()
        });
        let freed = FREED.with(|f| {
            let freed =
                nsq_shards::take_memory_freed().saturating_add(nsq_storage::take_buffers_freed());
            f.set(f.get().saturating_add(freed));
            f.get()
        });
        let burst = BURST_FREED.with(Cell::get);
        if !due(closed, last) && !due_freed(freed, last_freed) && !due_burst(burst, last_burst) {
            last = closed;
            last_freed = freed;
            last_burst = burst;
            continue;
        }
        last = 0;
        last_freed = 0;
        last_burst = 0;
        CLOSED.with(|c| c.set(0));
        FREED.with(|f| f.set(0));
        BURST_FREED.with(|f| f.set(0));
        let t = Instant::now();
        let released = trim();
        log::debug!(
            "heap trimmed after a burst of closed connections ({} in {:?})",
            if released {
                "memory released"
            } else {
                "nothing to release"
            },
            t.elapsed()
        );
    }
}

/// `malloc_trim(0)`; true when glibc released memory. A no-op on other C libraries.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: malloc_trim takes no pointers and only walks glibc's own arenas under
    // their locks; it is safe to call from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

/// Allocations from this size up are mapped on their own and unmapped when freed.
/// Above the 1 MiB blocks a lagging channel reads (mapping each one afresh costs a page
/// fault per page: ten lagging channels drained 1.25 GB in 21.6 s with a 1 MiB threshold,
/// 16.5 s with this one), and low enough that a large collection's old buffers (a
/// deferred heap doubling) go back to the kernel when freed.
pub const MMAP_THRESHOLD: usize = 2 << 20;
/// Free memory at the top of an arena beyond this goes back to the kernel at once.
pub const TRIM_THRESHOLD: usize = 4 << 20;

/// Fixes glibc's mmap and trim thresholds (call once, before the shards start). glibc
/// otherwise raises them as large blocks are freed, up to 32 MiB and 64 MiB: after a
/// million deferred messages were delivered, their freed heap then stayed at the top of
/// the shard's arena, which `malloc_trim` does not shrink for a thread's arena, and RSS
/// stayed twice its idle value. A no-op on other C libraries.
pub fn fix_malloc_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers and only sets glibc's own parameters; called
    // at start-up before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_after_a_compaction_burst_only_once_it_stopped() {
        let mb = TRIM_AFTER_QUIET_FREED_BYTES;
        // Still growing (a steady load compacting every 100 ms): never, however much.
        assert!(!due_burst(100 * mb, 99 * mb));
        // Stopped: once it is enough.
        assert!(due_burst(100 * mb, 100 * mb));
        assert!(due_burst(mb, mb));
        assert!(!due_burst(mb - 1, mb - 1));
        assert!(!due_burst(0, 0));
    }

    #[test]
    fn trims_after_a_large_burst_or_a_finished_small_one() {
        assert!(due(TRIM_AFTER_CLOSES, 0));
        assert!(due(TRIM_AFTER_CLOSES, TRIM_AFTER_CLOSES - 1));
        // A small burst: not while connections are still ending, then once they stop.
        assert!(!due(TRIM_AFTER_QUIET_CLOSES, 0));
        assert!(due(TRIM_AFTER_QUIET_CLOSES, TRIM_AFTER_QUIET_CLOSES));
        assert!(due(700, 700));
        // A few closes never trim on their own.
        assert!(!due(
            TRIM_AFTER_QUIET_CLOSES - 1,
            TRIM_AFTER_QUIET_CLOSES - 1
        ));
        assert!(!due(0, 0));
    }

    #[test]
    fn trims_after_many_freed_bytes_or_the_quiet_tail_of_a_burst() {
        assert!(due_freed(TRIM_AFTER_FREED_BYTES, 0));
        // Still freeing: wait; nothing freed for a check interval: trim.
        assert!(!due_freed(TRIM_AFTER_QUIET_FREED_BYTES, 0));
        assert!(due_freed(
            TRIM_AFTER_QUIET_FREED_BYTES,
            TRIM_AFTER_QUIET_FREED_BYTES
        ));
        // A few freed bytes never trim on their own.
        assert!(!due_freed(4096, 4096));
        assert!(!due_freed(0, 0));
    }
}
