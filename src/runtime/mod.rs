//! Process start-up and shutdown: one glommio executor per shard, each pinned to one CPU
//! of the process's affinity set (round robin when there are more shards than CPUs),
//! joined into a full channel mesh. The TCP and HTTP addresses are bound once, before
//! recovery (clients wait in the accept backlog); every shard accepts on a duplicate of
//! each socket, and none serves anything until every shard has recovered its topics.

use crate::config::Config;
use crate::server::Server;
use crate::{http, tcp};
use futures::future::{select, Either};
use futures::FutureExt;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use nsq_shards::mesh::{AdminOp, ShardMsg};
use nsq_shards::Shard;
use sd_notify::NotifyState;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Shortest interval between two timer passes of a shard ([`timer_loop`], which with
/// `Shard::process_timers` is nsqd's queueScanLoop): timers due within it are handled
/// together (in-flight timeouts and deferred messages fire at most this late). nsqd's
/// queueScanLoop scans a random sample of channels every 100 ms
/// (queueScanInterval); here only the channels with a timer due are visited.
const TICK: Duration = Duration::from_millis(10);

/// Longest a shard's timer loop sleeps when nothing is due sooner: how quickly it notices
/// a shutdown signal.
const IDLE_TICK: Duration = Duration::from_millis(100);

/// Longest a graceful shutdown may take before the process exits regardless.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

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

/// CPUs this process may run on, from /proc/self/status (`Cpus_allowed_list`).
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut cpus = Vec::new();
    if let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
        for part in line["Cpus_allowed_list:".len()..].trim().split(',') {
            let mut it = part.split('-').map(|v| v.trim().parse::<usize>());
            match (it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(b))) => cpus.extend(a..=b),
                (Some(Ok(a)), None) => cpus.push(a),
                _ => {}
            }
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        cpus.extend(0..n);
    }
    cpus
}

/// How long a bind that finds its address in use is retried before giving up.
pub(crate) const BIND_RETRY: Duration = Duration::from_secs(2);

/// Binds `s` to `sa`, retrying until `deadline` (normally [`BIND_RETRY`] from start-up)
/// while the address is in use.
///
/// After a `kill -9`, the dead process's listening socket can stay bound for tens of
/// milliseconds while the kernel tears down its io_uring instances (pending accepts hold a
/// reference to it), so a supervisor's immediate restart would otherwise fail. An address
/// still taken after the retry fails with nsqd's message:
/// `listen (ADDR) failed - listen tcp ADDR: bind: address already in use`.
fn bind_retrying(
    s: &socket2::Socket,
    sa: &SocketAddr,
    addr: &str,
    deadline: Instant,
) -> Result<(), String> {
    let mut logged = false;
    loop {
        match s.bind(&(*sa).into()) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                if !logged {
                    log::warn!(
                        "listen ({addr}): address in use; retrying for up to {:?} \
                         (a previous instance may still be releasing it)",
                        deadline.saturating_duration_since(Instant::now())
                    );
                    logged = true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(format!(
                    "listen ({addr}) failed - {}",
                    go_net_error("bind", addr, &e)
                ))
            }
        }
    }
}

/// Go's text for a failed socket call (net.OpError): `listen tcp ADDR: OP: ERRNO TEXT`,
/// e.g. `listen tcp 127.0.0.1:4150: bind: address already in use`, as nsqd prints it.
fn go_net_error(op: &str, addr: &str, e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text
        .split(" (os error")
        .next()
        .unwrap_or(&text)
        .to_lowercase();
    format!("listen tcp {addr}: {op}: {text}")
}

/// Binds `addr` exclusively, as nsqd does (an address in use is an error, even if its
/// holder used SO_REUSEPORT); [`listen`] then opens it to connections. Every shard
/// accepts on a duplicate of this one socket, so the kernel hands each connection to one
/// idle shard.
pub(crate) fn bind(
    addr: &str,
    retry_until: Instant,
) -> Result<(SocketAddr, socket2::Socket), String> {
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| format!("invalid address {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("invalid address {addr}"))?;
    let domain = if sa.is_ipv6() {
        socket2::Domain::IPV6
    } else {
        socket2::Domain::IPV4
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None).map_err(|e| e.to_string())?;
    // Go's listeners set SO_REUSEADDR (rebinding over TIME_WAIT), never SO_REUSEPORT.
    s.set_reuse_address(true).map_err(|e| e.to_string())?;
    bind_retrying(&s, &sa, addr, retry_until)?;
    let local = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| "cannot read the listening address".to_string())?;
    Ok((local, s))
}

/// Starts listening on a socket [`bind`] bound to `addr`: only once every address is
/// bound, so a broker that then fails to start (another address taken) never had a
/// connection queued that its exit would reset (a client sees "connection refused"
/// meanwhile, and retries).
pub(crate) fn listen(addr: &str, s: &socket2::Socket) -> Result<(), String> {
    s.listen(1024).map_err(|e| {
        format!(
            "listen ({addr}) failed - {}",
            go_net_error("listen", addr, &e)
        )
    })?;
    // Non-blocking for good: glommio toggles O_NONBLOCK around its first accept attempt,
    // and the file description (so its flags) is shared by every shard's duplicate.
    s.set_nonblocking(true).map_err(|e| e.to_string())
}

/// Set once SIGINT or SIGTERM has started the shutdown (see [`shutting_down`]).
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// True once SIGINT or SIGTERM has started the graceful shutdown.
pub fn shutting_down() -> bool {
    SHUTTING_DOWN.load(Ordering::SeqCst)
}

/// Runs the broker until SIGINT or SIGTERM, then shuts down gracefully, on what the
/// preflight checked and prepared (`crate::preflight::check`): the data path's lock, held
/// until this returns, and the bound listeners.
///
/// Under systemd (`NOTIFY_SOCKET` set, `Type=notify`) it sends `READY=1` once every shard
/// has recovered and accepts, and `STOPPING=1` when a shutdown starts (sd_notify(3)).
/// `on_serving` runs then too (main stops treating panics as start-up failures).
pub fn run(
    mut cfg: Config,
    ready: crate::preflight::Ready,
    on_serving: impl FnOnce(),
) -> Result<(), String> {
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
    let dir_lock =
        std::fs::File::open(&data_path).map_err(|e| format!("failed to lock data-path - {e}"))?;
    crate::preflight::lock_waiting_for_exit(&dir_lock).map_err(|_| {
        format!(
            "failed to lock data-path: --data-path={} in use (possibly by another instance of nsqd)",
            data_path.display()
        )
    })?;
    // Segment I/O through io_uring, or on each shard's blocking thread where the
    // filesystem would make io_uring wait on the shard's own thread (FUSE, NFS, ...).
    let (segment_io, why) = nsq_storage::SegmentIo::choose(
        &data_path,
        std::env::var("NSQD_SEGMENT_IO").ok().as_deref(),
    )?;
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
    .map_err(|e| format!("failed to import nsqd data - {e}"))?;

    let term = Arc::new(AtomicBool::new(false));
    SHUTTING_DOWN.store(false, Ordering::SeqCst);
    // SIGINT/SIGTERM: tell systemd the shutdown starts (STOPPING=1), then the shards.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let term_set = term.clone();
    let serving = Arc::new(AtomicBool::new(false));
    let serving_seen = serving.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                // Before every shard serves (a long recovery, many more shards than
                // cores): the process exits here, as a supervisor's stop expects,
                // whatever the start is busy with; what is on disk is crash-safe.
                if !serving_seen.load(Ordering::SeqCst) {
                    log::info!("shutdown requested during start-up; exiting");
                    std::process::exit(0);
                }
                if !term_set.load(Ordering::SeqCst) {
                    if let Err(e) = sd_notify::notify(&[NotifyState::Stopping]) {
                        log::warn!("sd_notify STOPPING=1 failed: {e}");
                    }
                }
                term_set.store(true, Ordering::SeqCst);
                SHUTTING_DOWN.store(true, Ordering::SeqCst);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;

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
        let cpu = cpus[i % cpus.len()];
        let cfg = cfg.clone();
        let mesh = mesh[i].take();
        let ready = ready_tx.clone();
        let term = term.clone();
        let recovery = recovery.clone();
        let dup = |s: &socket2::Socket| {
            s.try_clone()
                .map(std::os::fd::OwnedFd::from)
                .map_err(|e| format!("failed to share the listening socket: {e}"))
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
        let h = LocalExecutorBuilder::new(Placement::Fixed(cpu))
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
            .map_err(|e| format!("failed to start shard {i}: {e}"))?;
        handles.push(Some(h));
    }
    drop(ready_tx);
    let mut aborted = false;
    for _ in 0..n {
        match ready_rx.recv().map_err(|_| ()) {
            Ok(Ok(_)) => {}
            Ok(Err(StartError::Aborted)) => aborted = true,
            Ok(Err(StartError::Shard(e))) => return Err(e),
            Ok(Err(StartError::Executor(i))) => {
                // The thread has ended (its closure was dropped uncalled): its join
                // result is glommio's reason.
                let why = match handles.get_mut(i).and_then(Option::take).map(|h| h.join()) {
                    Some(Err(e)) => e.to_string(),
                    _ => "unknown reason".into(),
                };
                return Err(format!(
                    "shard {i} could not start its io_uring executor: {why}"
                ));
            }
            Err(()) => return Err("a shard failed to start".into()),
        }
    }
    if aborted {
        return Err("a shard failed to start".into());
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
        if term.load(Ordering::Relaxed) {
            let d = *deadline.get_or_insert_with(|| Instant::now() + SHUTDOWN_GRACE);
            if Instant::now() >= d {
                log::error!("shutdown took longer than {SHUTDOWN_GRACE:?}; exiting anyway");
                break;
            }
        }
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

/// Why a shard did not report itself serving.
enum StartError {
    /// Its start-up failed (the message says why).
    Shard(String),
    /// Another shard failed, so this one stopped waiting at the recovery barrier.
    Aborted,
    /// glommio could not create the executor of this shard (its io_uring rings, its
    /// locked memory): the thread ended without running the shard.
    Executor(usize),
}

impl From<String> for StartError {
    fn from(e: String) -> StartError {
        StartError::Shard(e)
    }
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

/// A shard's listening sockets: TCP, HTTP and (with TLS) HTTPS.
type Listeners = (
    std::os::fd::OwnedFd,
    std::os::fd::OwnedFd,
    Option<std::os::fd::OwnedFd>,
);

/// One shard's whole life; its start-up errors go to the main thread through `ready`.
#[allow(clippy::too_many_arguments)]
async fn shard_future(
    i: usize,
    cpu: usize,
    cfg: Arc<Config>,
    mesh: Option<crate::mesh::Peer>,
    addrs: (SocketAddr, SocketAddr, Option<SocketAddr>),
    listeners: Listeners,
    ready: ReadyTx,
    term: Arc<AtomicBool>,
    recovery: Arc<RecoveryBarrier>,
) {
    let r = shard_main(
        i,
        cpu,
        cfg,
        mesh,
        addrs,
        listeners,
        ready.clone(),
        term,
        recovery.clone(),
    )
    .await;
    if let Err(e) = r {
        recovery.fail();
        let _ = ready.send(Err(e));
    }
}

#[allow(clippy::too_many_arguments)]
async fn shard_main(
    index: usize,
    cpu: usize,
    cfg: Arc<Config>,
    mesh: Option<crate::mesh::Peer>,
    (tcp_addr, http_addr, https_addr): (SocketAddr, SocketAddr, Option<SocketAddr>),
    (tcp_fd, http_fd, https_fd): Listeners,
    ready: ReadyTx,
    term: Arc<AtomicBool>,
    recovery: Arc<RecoveryBarrier>,
) -> Result<(), StartError> {
    let shard = Rc::new(Shard::new(index, cfg.shards, cpu, cfg.opts.clone()));
    *shard.me.borrow_mut() = Rc::downgrade(&shard);
    let mut senders = None;
    let mut receivers = None;
    if let Some(m) = mesh {
        // A cross-executor wake-up can be missed while an executor goes to sleep; one
        // that nothing else wakes would then wait a long time (seen: 20 s on a loaded
        // machine). A short ticker keeps the executor polling its remote channels
        // until the mesh is joined; afterwards the shard's timer loop (at least every
        // IDLE_TICK) does the same.
        let ticking = Rc::new(std::cell::Cell::new(true));
        let t2 = ticking.clone();
        let ticker = glommio::spawn_local(async move {
            while t2.get() {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
        });
        let (s, r) = m.connect().await;
        ticking.set(false);
        ticker.await;
        log::debug!("shard {index}: mesh joined");
        senders = Some(Rc::new(s));
        receivers = Some(r);
    }
    let server = Rc::new(Server {
        shard: shard.clone(),
        cfg: Rc::new((*cfg).clone()),
        tcp_port: tcp_addr.port(),
        http_port: http_addr.port(),
        https_port: https_addr.map(|a| a.port()).unwrap_or(0),
        mesh: senders,
    });
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: each fd is a listening socket this shard now owns (a dup made for it).
    let tcp = unsafe { TcpListener::from_raw_fd(tcp_fd.into_raw_fd()) };
    // SAFETY: as above.
    let http = unsafe { TcpListener::from_raw_fd(http_fd.into_raw_fd()) };
    // SAFETY: as above.
    let https = https_fd.map(|fd| unsafe { TcpListener::from_raw_fd(fd.into_raw_fd()) });
    // nsqd always runs its lookup loop: peers can be added later with
    // PUT /config/nsqlookupd_tcp_addresses, and they must then learn every registration.
    shard.lookup_enabled.set(true);
    glommio::spawn_local(lookup_task(server.clone())).detach();
    log::debug!("shard {index}: listeners bound");
    // Before any data file is opened on this thread (storage/src/probe.rs).
    if let Some(dir) = &cfg.opts.data_path {
        if std::env::var_os("NO_PROBE_TMP").is_none() {
            nsq_storage::probe::probe_direct_io(dir, index).await;
        }
    }
    shard.recover().await;
    // Recovered topics and channels are on disk already: their registration events
    // need no metadata checkpoint.
    shard.meta_wake.clear();
    log::debug!("shard {index}: recovered");
    // nsqd loads all of its metadata before it serves anything. A shard that finished
    // early must not answer (a SUB, /stats, a /pub) while another still reads its topics
    // back: every shard waits here until all have recovered. Connections wait in the
    // kernel's accept backlog meanwhile, and mesh messages (hand-offs, forwarded
    // publishes, stats requests) wait in their channels.
    if !recovery.arrive_and_wait().await {
        return Err(StartError::Aborted);
    }
    // From now on a new topic asks nsqlookupd for its channels first (nsqd: GetTopic,
    // which skips this while loading metadata).
    crate::lookupd_client::install_channel_query(&server);
    if let Some(mut r) = receivers {
        for (_peer, rx) in r.drain(..) {
            let server = server.clone();
            glommio::spawn_local(async move {
                while let Some(msg) = rx.recv().await {
                    handle_mesh(&server, msg);
                }
            })
            .detach();
        }
    }
    // statsd (src/stats/statsd.rs): shard 0 pushes every shard's stats.
    if index == 0 && !cfg.flags.statsd_address.is_empty() {
        glommio::spawn_local(crate::stats::statsd::statsd_loop(server.clone())).detach();
    }
    let tcp_task = glommio::spawn_local(tcp::accept_loop(server.clone(), tcp));
    let http_task = glommio::spawn_local(http::accept_loop(server.clone(), http));
    let https_task = https.map(|l| glommio::spawn_local(http::accept_loop_tls(server.clone(), l)));
    let _ = ready.send(Ok(index));

    let checkpoints = glommio::spawn_local(checkpoint_loop(shard.clone()));
    let store_pump = glommio::spawn_local(shard.clone().store_loop());
    let trims = {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            crate::memory::trim_loop(shard.shutdown.wait()).await;
        })
    };
    timer_loop(&shard, &term).await;
    // Graceful shutdown (nsqd Exit): stop accepting, close clients, let writers flush.
    shard.shutdown.set();
    tcp_task.await;
    http_task.await;
    if let Some(t) = https_task {
        t.await;
    }
    shard.close_all_clients();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !shard.clients.borrow().is_empty() && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    checkpoints.await;
    store_pump.await;
    trims.await;
    shard.close_stores().await;
    Ok(())
}

/// The shard's timer loop (nsqd: nsqd.go queueScanLoop) until SIGINT/SIGTERM: it sleeps
/// until the earliest timer of the shard's channels is due (at least [`TICK`] after the
/// previous pass, at most [`IDLE_TICK`]), woken early when an earlier timer is
/// registered, and then visits only the channels with something due. Idle channels cost
/// nothing. Loop lag (/shards, /metrics) is how late a timed wake-up came, in µs.
async fn timer_loop(shard: &Rc<Shard>, term: &AtomicBool) {
    let mut last_pass = Instant::now();
    let mut next_refresh = last_pass + nsq_shards::shard::TIMER_REFRESH;
    loop {
        let now = Instant::now();
        let wake_at = shard
            .next_timer_due()
            .map_or(now + IDLE_TICK, |d| d.max(last_pass + TICK))
            .min(now + IDLE_TICK);
        let sleep = pin!(glommio::timer::sleep(
            wake_at.saturating_duration_since(now)
        ));
        let woken = pin!(shard.timer_wake.wait());
        let slept = matches!(select(sleep, woken).await, Either::Left(_));
        if slept {
            let late = Instant::now().saturating_duration_since(wake_at);
            shard.record_loop_lag(late.as_micros() as u64);
        }
        if term.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if !slept
            && shard
                .next_timer_due()
                .is_none_or(|d| d.max(last_pass + TICK) > now)
        {
            // Woken for a timer registered earlier than the planned wake-up: sleep again,
            // until it, and never sooner than TICK after the last pass (a timer due at
            // once, every pass, as with --msg-timeout=0, redelivered 900,000 times a
            // second instead of once a pass).
            continue;
        }
        if now >= next_refresh {
            shard.schedule_all_timers();
            next_refresh = now + nsq_shards::shard::TIMER_REFRESH;
        }
        shard.process_timers(now);
        last_pass = now;
    }
}

/// Writes topic metadata and applies retention every --sync-timeout until shutdown, and
/// soon after a topic or channel is created or deleted (changes within
/// [`META_COALESCE`] share one write). Each round first retries the stores that could
/// not be created ([`Shard::retry_missing_stores`]).
async fn checkpoint_loop(shard: Rc<Shard>) {
    loop {
        let sleep = pin!(glommio::timer::sleep(shard.opts.sync_timeout));
        let changed = pin!(shard.meta_wake.wait());
        let stop = pin!(shard.shutdown.wait());
        match select(select(sleep, changed), stop).await {
            Either::Right(_) => return,
            Either::Left((Either::Right(_), _)) => {
                glommio::timer::sleep(META_COALESCE).await;
            }
            Either::Left((Either::Left(_), _)) => {}
        }
        shard.prepare_missing_stores().await;
        shard.retry_missing_stores();
        shard.run_checkpoint().await;
    }
}

/// How long a metadata change waits for others before the checkpoint it triggers.
const META_COALESCE: Duration = Duration::from_millis(20);

/// Shard 0 talks to nsqlookupd; the other shards forward their registration changes
/// to it in batches.
async fn lookup_task(server: Rc<Server>) {
    if server.shard.index == 0 {
        crate::lookupd_client::lookup_loop(server).await;
        return;
    }
    loop {
        let wake = pin!(server.shard.lookup_wake.wait());
        let stop = pin!(server.shard.shutdown.wait());
        if let Either::Right(_) = select(wake, stop).await {
            return;
        }
        let events: Vec<_> = std::mem::take(&mut *server.shard.lookup_events.borrow_mut());
        if events.is_empty() {
            continue;
        }
        if let Some(mesh) = server.mesh() {
            let _ = mesh.send_to(0, ShardMsg::Lookup(events)).await;
        }
    }
}

fn handle_mesh(server: &Rc<Server>, msg: ShardMsg) {
    let shard = &server.shard;
    match msg {
        ShardMsg::Publish {
            topic,
            bodies,
            defer_until,
            reply,
        } => {
            shard.count_cross_received();
            if shard.needs_prepared_store(&topic) {
                // Its directory is made off the shard's thread first (FUSE, network
                // filesystems); the sender waits for the reply, so its order holds.
                let server = server.clone();
                glommio::spawn_local(async move {
                    let shard = &server.shard;
                    shard.prepare_store(&topic).await;
                    let res = shard.publish_local(&topic, bodies, defer_until);
                    let _ = reply.send(match res {
                        Ok(wait) => crate::server::wait_durable(wait).await,
                        Err(e) => Err(e),
                    });
                })
                .detach();
                return;
            }
            match shard.publish_local(&topic, bodies, defer_until) {
                Ok(None) => {
                    let _ = reply.send(Ok(()));
                }
                Ok(wait) => {
                    glommio::spawn_local(async move {
                        let _ = reply.send(crate::server::wait_durable(wait).await);
                    })
                    .detach();
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        ShardMsg::HandOff(h) => {
            // An adapter, not an `async` block (which would hold the connection's
            // future twice); its end counts towards this shard's heap trim.
            let conn = tcp::resume(server.clone(), *h).map(|()| crate::memory::connection_closed());
            glommio::spawn_local(conn).detach();
        }
        ShardMsg::Stats { req, reply } => {
            let _ = reply.send(shard.stats(&req));
        }
        ShardMsg::Admin { op, reply } => {
            let prepare = shard.admin_creates_store(&op);
            if let (AdminOp::SeekChannel(..), _) | (_, true) = (&op, prepare) {
                // It may read the disk, or make the topic's directory first (FUSE,
                // network filesystems): not on the mesh receiver's task.
                let s = server.clone();
                glommio::spawn_local(async move {
                    let _ = reply.send(s.shard.admin_async(op).await);
                })
                .detach();
            } else if shard.admin_persists(&op) {
                // Applied now, in mesh order; answered once the metadata has it.
                let r = shard.admin(op);
                let s = server.clone();
                glommio::spawn_local(async move {
                    if r.is_ok() {
                        s.shard.persist_changes().await;
                    }
                    let _ = reply.send(r);
                })
                .detach();
            } else {
                let _ = reply.send(shard.admin(op));
            }
        }
        ShardMsg::Lookup(events) => {
            shard.lookup_events.borrow_mut().extend(events);
            shard.lookup_wake.notify();
        }
        ShardMsg::NodeChange { update, reply } => {
            // It waits for every shard: not on the mesh receiver's task.
            let s = server.clone();
            glommio::spawn_local(async move {
                s.apply_node_settings_everywhere(update).await;
                let _ = reply.send(());
            })
            .detach();
        }
        ShardMsg::NodeApply { update, reply } => {
            shard.node.apply(&update);
            let _ = reply.send(());
        }
    }
}
