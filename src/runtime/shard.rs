//! A shard thread's body: joining the mesh, recovery, serving its listeners, and its
//! timer, checkpoint and lookup loops until the graceful shutdown.

use super::{ReadyTx, RecoveryBarrier, StartError};
use crate::config::Config;
use crate::mesh::ShardMsg;
use crate::server::Server;
use crate::{http, tcp};
use futures::future::{select, Either};
use glommio::net::TcpListener;
use nsq_shards::Shard;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

/// A shard's listening sockets: TCP, HTTP and (with TLS) HTTPS.
type Listeners = (
    std::os::fd::OwnedFd,
    std::os::fd::OwnedFd,
    Option<std::os::fd::OwnedFd>,
);

/// One shard's whole life; its start-up errors go to the main thread through `ready`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn shard_future(
    i: usize,
    cpu: Option<usize>,
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
    cpu: Option<usize>,
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
        cluster: cfg
            .cluster
            .clone()
            .map(|c| Rc::new(crate::cluster::ShardCluster::new(c, index))),
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
    shard.lookup.enable();
    glommio::spawn_local(lookup_task(server.clone())).detach();
    log::debug!("shard {index}: listeners bound");
    // Before any data file is opened on this thread (storage/src/probe.rs).
    if let Some(dir) = &cfg.opts.data_path {
        if std::env::var_os("NO_PROBE_TMP").is_none() {
            nsq_storage::probe::probe_direct_io(dir, index).await;
        }
    }
    crate::cluster::ShardCluster::hide_registrations(&server);
    shard.recover().await;
    // Recovered topics and channels are on disk already: their registration events
    // need no metadata checkpoint.
    shard.meta_wake().clear();
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
    crate::cluster::ShardCluster::start(&server);
    if let Some(mut r) = receivers {
        for (_peer, rx) in r.drain(..) {
            let server = server.clone();
            glommio::spawn_local(async move {
                while let Some(msg) = rx.recv().await {
                    crate::mesh::handle_mesh(&server, msg);
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

    glommio::spawn_local(crate::dead_letter::publisher(server.clone())).detach();
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
    while shard.has_clients() && Instant::now() < deadline {
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
    let mut next_drain_report = last_pass;
    loop {
        let now = Instant::now();
        let wake_at = shard
            .next_timer_due()
            .map_or(now + IDLE_TICK, |d| d.max(last_pass + TICK))
            .min(now + IDLE_TICK);
        let sleep = pin!(glommio::timer::sleep(
            wake_at.saturating_duration_since(now)
        ));
        let woken = pin!(shard.timers.wake().wait());
        let slept = matches!(select(sleep, woken).await, Either::Left(_));
        if slept {
            let late = Instant::now().saturating_duration_since(wake_at);
            shard.record_loop_lag(late.as_micros() as u64);
        }
        if term.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        if super::drain::draining() && now >= next_drain_report {
            drain_pass(shard);
            next_drain_report = now + IDLE_TICK;
        }
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

/// While the node drains (at most every [`IDLE_TICK`]): applies the drain to this
/// shard's copy of the node-wide settings if a signal started it, then reports what the
/// shard still holds to the main thread ([`super::drain::report`]).
fn drain_pass(shard: &Shard) {
    super::drain::applied(shard);
    super::drain::report(shard.index(), shard.drain_left());
}

/// Writes topic metadata and applies retention every --sync-timeout until shutdown, and
/// soon after a topic or channel is created or deleted (changes within
/// [`META_COALESCE`] share one write). Each round first retries the stores that could
/// not be created ([`Shard::retry_missing_stores`]); while some are missing, a round
/// comes at least every [`MISSING_STORE_RETRY`] (on the blocking-thread segment path only
/// this task prepares their directories, so `/ping` heals within it once the disk lets
/// them be made, whatever `--sync-timeout` is).
async fn checkpoint_loop(shard: Rc<Shard>) {
    loop {
        let period = if shard.has_missing_stores() {
            shard.opts.sync_timeout.min(MISSING_STORE_RETRY)
        } else {
            shard.opts.sync_timeout
        };
        let sleep = pin!(glommio::timer::sleep(period));
        let changed = pin!(shard.meta_wake().wait());
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

/// The longest wait between two retries of a durable topic's missing store.
const MISSING_STORE_RETRY: Duration = Duration::from_secs(1);

/// How long a metadata change waits for others before the checkpoint it triggers.
const META_COALESCE: Duration = Duration::from_millis(20);

/// Shard 0 talks to nsqlookupd; the other shards forward their registration changes
/// to it in batches.
async fn lookup_task(server: Rc<Server>) {
    if server.shard.index() == 0 {
        crate::lookupd_client::lookup_loop(server).await;
        return;
    }
    loop {
        let wake = pin!(server.shard.lookup.wake().wait());
        let stop = pin!(server.shard.shutdown.wait());
        if let Either::Right(_) = select(wake, stop).await {
            return;
        }
        let events: Vec<_> = server.shard.lookup.take_events();
        if events.is_empty() {
            continue;
        }
        if let Some(mesh) = server.mesh() {
            let _ = mesh.send_to(0, ShardMsg::Lookup(events)).await;
        }
    }
}
