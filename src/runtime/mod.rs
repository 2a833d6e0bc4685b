//! Process start-up and shutdown: one glommio executor per shard, each pinned to one CPU
//! of the process's affinity set (round robin when there are more shards than CPUs;
//! not pinned when there are fewer: `placement`), joined into a full channel mesh. The TCP and HTTP addresses are bound once, before
//! recovery (clients wait in the accept backlog); every shard accepts on a duplicate of
//! each socket, and none serves anything until every shard has recovered its topics.

mod barrier;
pub mod drain;
mod host;
pub(crate) mod listeners;
mod shard;
mod signals;

pub use barrier::RecoveryBarrier;
pub use host::allowed_cpus;
pub use listeners::ListenError;
pub(crate) use listeners::{bind, listen, BIND_RETRY};
use shard::shard_future;
pub use signals::shutting_down;

/// Where shard executors run: each pinned to its CPU when the shards take every CPU of
/// the process's affinity set or more (the default `--shards` on a host without a CPU
/// quota); left to the kernel's scheduler when there are fewer shards than CPUs (under
/// a CPU quota, `docker --cpus`, the default `--shards` is the quota: a share of CPU
/// time, not particular CPUs). An operator who asks for fewer
/// shards than CPUs keeps CPUs for something else on the host (another broker, its
/// clients), and pinning would put every broker started that way on the same first
/// CPUs of the set (three members of a cluster on one host would share one core while
/// the others idle). To pin such a broker all the same, start it under `taskset -c`
/// (or systemd's `CPUAffinity=`) with as many CPUs as shards.
fn placement(shards: usize, cpus: &[usize], cpu: usize) -> Option<usize> {
    (shards >= cpus.len()).then_some(cpu)
}

use crate::config::Config;
use glommio::{LocalExecutorBuilder, Placement};
use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Longest a graceful shutdown may take before the process exits regardless.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Runs the broker until SIGINT or SIGTERM, then shuts down gracefully, on what the
/// preflight checked and prepared (`crate::preflight::check`): the data path's lock, held
/// until this returns, and the bound listeners.
///
/// Under systemd (`NOTIFY_SOCKET` set, `Type=notify`) it sends `READY=1` once every shard
/// has recovered and accepts, and `STOPPING=1` when a shutdown or a drain starts
/// (sd_notify(3)). A drain ([`drain`]) ends in the same clean shutdown once every channel
/// is empty; `PUT /config/shutdown` starts it at once.
/// `on_serving` runs then too (main stops treating panics as start-up failures).
pub fn run(
    mut cfg: Config,
    ready: crate::preflight::Ready,
    on_serving: impl FnOnce(),
) -> Result<(), RunError> {
    log::info!("nsqd {}, shards: {}", crate::BUILD_VERSION, cfg.shards);
    log::info!("ID: {}", cfg.opts.node_id);
    for w in &ready.warnings {
        log::warn!("{w}");
    }
    // nsqd locks its data path so two daemons never share it; the lock goes with `_lock`.
    let crate::preflight::Ready {
        lock: _lock,
        tcp: (tcp_addr, tcp_sock),
        http: (http_addr, http_sock),
        https,
        ..
    } = ready;
    let (https_addr, https_sock) = match https {
        Some((a, s)) => (Some(a), Some(s)),
        None => (None, None),
    };
    let data_path = cfg.opts.data_path.clone().unwrap_or_else(|| ".".into());
    // The directory itself too, as nsqd does (internal/dirlock): an upstream nsqd still
    // running on this path holds that lock, and its files must not be imported under it.
    let dir_lock = std::fs::File::open(&data_path).map_err(RunError::OpenDataPath)?;
    crate::preflight::lock_waiting_for_exit(&dir_lock)
        .map_err(|_| RunError::DataPathInUse(data_path.clone()))?;
    // Segment I/O through io_uring, or on each shard's blocking thread where the
    // filesystem would make io_uring wait on the shard's own thread (FUSE, NFS, ...).
    let (segment_io, why) = nsq_storage::SegmentIo::choose(
        &data_path,
        std::env::var("NSQD_SEGMENT_IO").ok().as_deref(),
    )
    .map_err(RunError::SegmentIo)?;
    cfg.opts.segment_io = segment_io;
    if segment_io == nsq_storage::SegmentIo::Threads {
        log::info!(
            "STORE: segment files are written and read on each shard's blocking thread ({why}): \
             its writes would otherwise wait on the shard's own thread"
        );
    }
    // Moving from nsqd: its queued messages become ours before any shard recovers.
    crate::import_nsqd::run(
        &data_path,
        &crate::import_nsqd::ImportOptions {
            max_msg_size: cfg.opts.max_msg_size,
            max_bytes_per_file: cfg.opts.max_bytes_per_file,
            node_id: cfg.opts.node_id,
        },
    )
    .map_err(RunError::Import)?;

    let term = Arc::new(AtomicBool::new(false));
    let serving = Arc::new(AtomicBool::new(false));
    drain::reset(cfg.shards);
    signals::spawn_signal_thread(
        term.clone(),
        serving.clone(),
        cfg.flags.sigterm == crate::config::SIGTERM_DRAIN,
    )?;

    let n = cfg.shards;
    let cpus = allowed_cpus();
    let mut mesh: Vec<Option<crate::mesh::Peer>> = if n > 1 {
        crate::mesh::build(n, mesh_capacity(n))
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None]
    };
    let cfg = Arc::new(cfg);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<usize, StartError>>();
    let recovery = Arc::new(RecoveryBarrier::new(n));
    let mut handles = Vec::new();
    for i in 0..n {
        let cpu = placement(n, &cpus, cpus[i % cpus.len()]);
        let cfg = cfg.clone();
        let mesh = mesh[i].take();
        let ready = ready_tx.clone();
        let term = term.clone();
        let recovery = recovery.clone();
        let dup = |s: &socket2::Socket| {
            s.try_clone()
                .map(std::os::fd::OwnedFd::from)
                .map_err(RunError::ShareSocket)
        };
        let listeners = (
            dup(&tcp_sock)?,
            dup(&http_sock)?,
            https_sock.as_ref().map(dup).transpose()?,
        );
        let guard = ExecutorGuard {
            index: i,
            ready: ready.clone(),
            recovery: recovery.clone(),
            armed: true,
        };
        let h = LocalExecutorBuilder::new(cpu.map_or(Placement::Unbound, Placement::Fixed))
            .name(&format!("shard-{i}"))
            .spawn(move || {
                let mut guard = guard;
                guard.armed = false;
                drop(guard);
                shard_future(
                    i,
                    cpu,
                    cfg,
                    mesh,
                    (tcp_addr, http_addr, https_addr),
                    listeners,
                    ready,
                    term,
                    recovery,
                )
            })
            .map_err(|error| RunError::StartShard { index: i, error })?;
        handles.push(Some(h));
    }
    drop(ready_tx);
    let mut aborted = false;
    for _ in 0..n {
        match ready_rx.recv().map_err(|_| ()) {
            Ok(Ok(_)) => {}
            Ok(Err(StartError::Aborted)) => aborted = true,
            Ok(Err(StartError::Executor(i))) => {
                // The thread has ended (its closure was dropped uncalled): its join
                // result is glommio's reason.
                let why = match handles.get_mut(i).and_then(Option::take).map(|h| h.join()) {
                    Some(Err(e)) => e.to_string(),
                    _ => "unknown reason".into(),
                };
                return Err(RunError::Executor { index: i, why });
            }
            Err(()) => return Err(RunError::ShardFailed),
        }
    }
    if aborted {
        return Err(RunError::ShardFailed);
    }
    serving.store(true, Ordering::SeqCst);
    drop(tcp_sock);
    drop(http_sock);
    drop(https_sock);
    log::info!("TCP: listening on {tcp_addr}");
    log::info!("HTTP: listening on {http_addr}");
    if let Some(a) = https_addr {
        log::info!("HTTPS: listening on {a}");
    }
    on_serving();
    // systemd Type=notify: `systemctl start` returns now, with every shard serving.
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        log::warn!("sd_notify READY=1 failed: {e}");
    }
    // Shards exit on their own after SIGINT/SIGTERM; a watchdog makes sure a stuck
    // shard cannot keep the process alive (its data is crash-safe anyway).
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        for h in handles.into_iter().flatten() {
            let _ = h.join();
        }
        let _ = done_tx.send(());
    });
    let mut deadline: Option<Instant> = None;
    loop {
        match done_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !term.load(Ordering::SeqCst) {
            let drained = drain::completed();
            if let Some(left) = drained {
                if left > 0 {
                    log::warn!(
                        "NSQ: drain complete; {left} message(s) of topics without channels stay in the data path"
                    );
                } else {
                    log::info!("NSQ: drain complete");
                }
            }
            if drained.is_some() || drain::shutdown_requested() {
                signals::mark_shutting_down();
                term.store(true, Ordering::SeqCst);
            }
        }
        if term.load(Ordering::Relaxed) {
            let d = *deadline.get_or_insert_with(|| Instant::now() + SHUTDOWN_GRACE);
            if Instant::now() >= d {
                log::error!("shutdown took longer than {SHUTDOWN_GRACE:?}; exiting anyway");
                break;
            }
        }
    }
    if let Some(why) = drain::refused() {
        return Err(RunError::Refused(why));
    }
    log::info!("exiting");
    Ok(())
}

/// Messages each shard-to-shard channel of the mesh holds: 4,096 up to 4 shards, less
/// beyond (at least 256), so that the n x n channels, allocated whole at start, stay
/// near 64 MB in all (64 shards with 4,096 each took 2 GB and over a minute to start).
fn mesh_capacity(shards: usize) -> usize {
    (16_384 / shards.max(1)).clamp(256, 4096)
}

/// Why the broker did not start. `Display` is what main prints after `failed to
/// instantiate nsqd - `.
#[derive(Debug)]
pub enum RunError {
    /// `failed to lock data-path - <error>`: the data path cannot be opened.
    OpenDataPath(std::io::Error),
    /// `failed to lock data-path: --data-path=<path> in use (possibly by another
    /// instance of nsqd)`.
    DataPathInUse(std::path::PathBuf),
    /// How segment files are written could not be chosen (the store's text).
    SegmentIo(nsq_storage::UnknownSegmentIo),
    /// `failed to import nsqd data - <error>`.
    Import(crate::import_nsqd::ImportError),
    /// `cannot handle SIGINT/SIGTERM: <error>`.
    Signals(std::io::Error),
    /// `cannot start the signal thread: <error>`.
    SignalThread(std::io::Error),
    /// `failed to share the listening socket: <error>`.
    ShareSocket(std::io::Error),
    /// `failed to start shard <i>: <error>`: its thread could not start.
    StartShard {
        index: usize,
        error: glommio::GlommioError<()>,
    },
    /// `shard <i> could not start its io_uring executor: <why>` (glommio's reason).
    Executor { index: usize, why: String },
    /// `a shard failed to start` (it logged why).
    ShardFailed,
    /// The broker started but cannot run as configured (the text says why: a cluster
    /// member with the same `--node-id`); it shut down cleanly first
    /// ([`drain::refuse_to_run`]).
    Refused(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::OpenDataPath(e) => write!(f, "failed to lock data-path - {e}"),
            RunError::DataPathInUse(path) => write!(
                f,
                "failed to lock data-path: --data-path={} in use (possibly by another instance of nsqd)",
                path.display()
            ),
            RunError::SegmentIo(e) => write!(f, "{e}"),
            RunError::Import(e) => write!(f, "failed to import nsqd data - {e}"),
            RunError::Signals(e) => write!(f, "cannot handle SIGINT/SIGTERM: {e}"),
            RunError::SignalThread(e) => write!(f, "cannot start the signal thread: {e}"),
            RunError::ShareSocket(e) => write!(f, "failed to share the listening socket: {e}"),
            RunError::StartShard { index, error } => {
                write!(f, "failed to start shard {index}: {error}")
            }
            RunError::Executor { index, why } => {
                write!(f, "shard {index} could not start its io_uring executor: {why}")
            }
            RunError::ShardFailed => f.write_str("a shard failed to start"),
            RunError::Refused(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RunError {}

/// Why a shard did not report itself serving.
enum StartError {
    /// Another shard failed, so this one stopped waiting at the recovery barrier.
    Aborted,
    /// glommio could not create the executor of this shard (its io_uring rings, its
    /// locked memory): the thread ended without running the shard.
    Executor(usize),
}

type ReadyTx = mpsc::Sender<Result<usize, StartError>>;

/// Reports a shard whose executor never ran: glommio drops the closure given to
/// `LocalExecutorBuilder::spawn` uncalled when it cannot build the executor, and the
/// thread's error would otherwise reach nobody (the other shards keep waiting).
struct ExecutorGuard {
    index: usize,
    ready: ReadyTx,
    recovery: Arc<RecoveryBarrier>,
    armed: bool,
}

impl Drop for ExecutorGuard {
    fn drop(&mut self) {
        if self.armed {
            self.recovery.fail();
            let _ = self.ready.send(Err(StartError::Executor(self.index)));
        }
    }
}
