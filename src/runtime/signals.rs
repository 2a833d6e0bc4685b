//! SIGINT and SIGTERM: the signal thread that starts the graceful shutdown (or, before
//! every shard serves, exits at once) and tells systemd the shutdown starts. With
//! `--sigterm=drain`, SIGTERM starts a drain instead ([`super::drain`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once SIGINT or SIGTERM has started the shutdown (see [`shutting_down`]).
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// True once SIGINT or SIGTERM has started the graceful shutdown.
pub fn shutting_down() -> bool {
    SHUTTING_DOWN.load(Ordering::SeqCst)
}

/// Marks the graceful shutdown as started (see [`shutting_down`]).
pub(super) fn mark_shutting_down() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
}

/// Starts the thread that handles SIGINT and SIGTERM: before `serving` is set the process
/// exits at once; afterwards `term` and [`shutting_down`] are set (the shards then shut
/// down gracefully). With `sigterm_drains` (`--sigterm=drain`) SIGTERM starts a drain
/// instead; a SIGTERM during a drain (started by it or by `PUT /config/drain`) changes
/// nothing (the drain goes on), while SIGINT always shuts down cleanly at once (as the
/// draining prototype, nsqio/nsq#1305, keeps SIGINT for the immediate exit).
pub(super) fn spawn_signal_thread(
    term: Arc<AtomicBool>,
    serving: Arc<AtomicBool>,
    sigterm_drains: bool,
) -> Result<(), super::RunError> {
    SHUTTING_DOWN.store(false, Ordering::SeqCst);
    // SIGINT/SIGTERM: tell systemd the shutdown starts (STOPPING=1), then the shards.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(super::RunError::Signals)?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                // Before every shard serves (a long recovery, many more shards than
                // cores): the process exits here, as a supervisor's stop expects,
                // whatever the start is busy with; what is on disk is crash-safe.
                if !serving.load(Ordering::SeqCst) {
                    log::info!("shutdown requested during start-up; exiting");
                    std::process::exit(0);
                }
                // SIGTERM during a drain (however it started: `PUT /config/drain` too)
                // changes nothing: a drain cannot be cancelled or cut short by the
                // supervisor's stop.
                if sig == signal_hook::consts::SIGTERM
                    && (sigterm_drains || super::drain::draining())
                    && !term.load(Ordering::SeqCst)
                {
                    if !super::drain::start_drain("SIGTERM") {
                        log::info!(
                            "SIGTERM during the drain: draining goes on (SIGINT or PUT /config/shutdown shuts down now)"
                        );
                    }
                    continue;
                }
                super::drain::notify_stopping();
                term.store(true, Ordering::SeqCst);
                SHUTTING_DOWN.store(true, Ordering::SeqCst);
            }
        })
        .map_err(super::RunError::SignalThread)?;
    Ok(())
}
