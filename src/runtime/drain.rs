//! The drain (nsqd RFC nsqio/nsq#1302, docs/draining.md) and the shutdown asked for over
//! HTTP: process-wide flags shared by the signal thread, the HTTP handlers
//! (`PUT /config/drain`, `PUT /config/shutdown`), the shards' timer loops and the main
//! thread, which starts the clean shutdown once every shard has nothing left to deliver.
//!
//! A drain is one way: once started it ends only by completing (every topic that has
//! channels empty: depth, in-flight and deferred all 0) or by a clean shutdown asked for
//! meanwhile (SIGINT, `PUT /config/shutdown`).

use nsq_shards::shard::DrainLeft;
use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set once a drain started.
static DRAINING: AtomicBool = AtomicBool::new(false);
/// Set by `PUT /config/shutdown` and [`refuse_to_run`]: the main thread starts the clean
/// shutdown.
static SHUTDOWN: AtomicBool = AtomicBool::new(false);
/// Why the broker refuses to run ([`refuse_to_run`]): the process exits with status 1
/// after the clean shutdown.
static REFUSED: Mutex<Option<String>> = Mutex::new(None);
/// Set once systemd was told `STOPPING=1`.
static STOPPING_SENT: AtomicBool = AtomicBool::new(false);
/// Each shard's last report while draining (`None` until its first).
static LEFT: Mutex<Vec<Option<DrainLeft>>> = Mutex::new(Vec::new());

/// Clears the flags for a broker of `shards` shards (at start; tests start several
/// brokers in one process).
pub(super) fn reset(shards: usize) {
    DRAINING.store(false, Ordering::SeqCst);
    SHUTDOWN.store(false, Ordering::SeqCst);
    STOPPING_SENT.store(false, Ordering::SeqCst);
    *REFUSED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    *LEFT.lock().unwrap_or_else(|e| e.into_inner()) = vec![None; shards];
}

/// Tells systemd the service is stopping (`STOPPING=1`, sd_notify(3)), once: at the
/// start of a drain or of a clean shutdown, whichever comes first.
pub fn notify_stopping() {
    if !STOPPING_SENT.swap(true, Ordering::SeqCst) {
        if let Err(e) = sd_notify::notify(&[NotifyState::Stopping]) {
            log::warn!("sd_notify STOPPING=1 failed: {e}");
        }
    }
}

/// Starts the drain (`why`: what asked, for the log); true if this call started it,
/// false if a drain was already under way (nothing changes then). Every shard applies
/// it at its next timer pass (at most 100 ms); `PUT /config/drain` also applies it on
/// every shard before answering.
pub fn start_drain(why: &str) -> bool {
    if DRAINING.swap(true, Ordering::SeqCst) {
        return false;
    }
    log::info!("NSQ: draining ({why}): publishes and new topics and channels are refused; exiting once every channel is empty");
    notify_stopping();
    true
}

/// True once a drain started.
pub fn draining() -> bool {
    DRAINING.load(Ordering::SeqCst)
}

/// Applies a drain a signal started to `shard`'s copy of the node-wide settings if its
/// timer loop has not yet (every publish, admin operation and SUB on a topic's owner
/// asks first, so a refusal never waits for that pass); true when the node drains.
pub fn applied(shard: &nsq_shards::Shard) -> bool {
    if draining() && !shard.node.draining() {
        shard.node.apply(&nsq_shards::node::NodeUpdate::Drain);
    }
    shard.node.draining()
}

/// Asks for a clean shutdown now (`PUT /config/shutdown`; during a drain too): the main
/// thread starts it within 100 ms.
pub fn request_shutdown() {
    log::info!("NSQ: clean shutdown requested over HTTP");
    notify_stopping();
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// Shuts down cleanly because the broker cannot run as configured (`why`, found only
/// once it runs: a cluster member with this member's `--node-id`): the main thread starts
/// the shutdown within 100 ms and `run` then fails with [`super::RunError::Refused`]
/// (status 1, the `FATAL` line). The first reason is kept and logged.
pub fn refuse_to_run(why: String) {
    let mut refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    if refused.is_none() {
        log::error!("FATAL: {why}; shutting down");
        notify_stopping();
        *refused = Some(why);
    }
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// The reason given to [`refuse_to_run`], if it was called.
pub(super) fn refused() -> Option<String> {
    REFUSED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// True once [`request_shutdown`] or [`refuse_to_run`] was called.
pub(super) fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// Shard `index` reports what it still holds (its timer loop, while draining).
pub(super) fn report(index: usize, left: DrainLeft) {
    let mut v = LEFT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(slot) = v.get_mut(index) {
        *slot = Some(left);
    }
}

/// While draining: `Some` with the messages left in topics without channels once every
/// shard reported nothing else left to deliver; `None` before (or when not draining).
pub(super) fn completed() -> Option<u64> {
    if !draining() {
        return None;
    }
    let v = LEFT.lock().unwrap_or_else(|e| e.into_inner());
    let mut without_channels = 0;
    for left in v.iter() {
        match left {
            Some(l) if l.messages == 0 => without_channels += l.without_channels,
            _ => return None,
        }
    }
    Some(without_channels)
}
