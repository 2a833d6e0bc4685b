//! The connections between cluster members (plain TCP, or mutual TLS 1.3 under
//! `--cluster-tls`: [`crate::tls::cluster_configs`]).
//!
//! Each shard keeps one outgoing connection to each peer, used only for sending: it
//! greets with a [`Hello`], then writes frames ([`nsq_replication::wire`]) as its groups
//! produce them, and a ping every [`liveness::PING_EVERY`] (what tells the peer this
//! member is alive). Shard 0 listens on `--cluster-address`; an accepted connection is only
//! read: after the peer's greeting is checked (a listed member, its replica id, a
//! `--node-id` that differs from this node's), each frame goes to the shard that owns
//! its topic, and a [`Frame::Reply`] to the shard that sent the request (the request
//! number's top 16 bits). Raft tolerates lost, repeated and reordered messages, so a
//! broken connection loses at most what was queued on it: it is dialled again after
//! [`REDIAL`], and a forwarded proposal whose reply is lost times out at its sender.

use super::{liveness, ClusterConfig, Member};
use crate::server::Server;
use bytes::BytesMut;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use nsq_replication::wire::{self, Frame, Hello, OutFrame};
use nsq_shards::wake::Notify;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

/// A connection that a peer closes within this long after it was made counts as
/// refused (logged once a minute instead of at each redial).
const FLAP: Duration = Duration::from_secs(1);

/// Wait between two dials of an unreachable peer.
pub const REDIAL: Duration = Duration::from_millis(100);

/// The longest a dial waits.
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);

/// The most bytes an incoming connection's first frame may take: a greeting (two
/// addresses of at most 255 bytes and 14 more). Anything larger is not a member's, and
/// is refused before it is buffered.
const GREETING_MAX: usize = 600;

/// How long an incoming connection has to greet before it is closed.
const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// For how long after this member's links start a peer greeting with this member's
/// `--node-id` makes it refuse to run: the peers that are up greet within it (each dials
/// every [`REDIAL`]), so the member that starts second, or both when they start
/// together, exits at start; a member that has run longer keeps running and refuses the
/// peer's connections.
pub const NODE_ID_CHECK: Duration = Duration::from_secs(5);

/// When this process's links started (the first shard to start them).
static LINKS_STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// A reason per peer, by the address its greeting named (or `frame version N` for a
/// greeting in another release's frames), shared by the shards and shown by
/// `GET /cluster`: why its connections were last refused (`refused_peers`; the entry
/// goes once a greeting of it is accepted), or that it lists other members
/// (`peers_listing_other_members`; the entry goes once it greets with the same list).
#[derive(Debug, Default)]
pub struct PeerReports(std::sync::Mutex<std::collections::BTreeMap<String, String>>);

impl PeerReports {
    pub(crate) fn set(&self, key: &str, why: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), why.to_string());
    }

    pub(crate) fn clear(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// `[{"address": ..., "reason": ...}]`, by address.
    pub fn to_json(&self) -> serde_json::Value {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter()
            .map(|(a, r)| serde_json::json!({ "address": a, "reason": r }))
            .collect()
    }
}

/// Bytes queued for a peer that is not connected beyond which the oldest frames are
/// dropped (Raft sends again what matters).
const QUEUE_LIMIT: usize = 64 << 20;

/// One peer's outgoing queue on this shard.
struct Outgoing {
    member: Member,
    queue: RefCell<VecDeque<OutFrame>>,
    queued_bytes: Cell<usize>,
    wake: Notify,
    /// True while the connection is up (set once the greeting is written).
    connected: Cell<bool>,
}

/// This shard's outgoing connections, one per peer.
pub struct Links {
    peers: Vec<Rc<Outgoing>>,
    /// `--cluster-tls`: the dialling side's TLS.
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Links {
    /// The queues for `cfg`'s peers; [`Links::start`] runs their connections.
    pub fn new(cfg: &ClusterConfig) -> Links {
        Links {
            peers: cfg
                .peers
                .iter()
                .map(|m| {
                    Rc::new(Outgoing {
                        member: m.clone(),
                        queue: RefCell::new(VecDeque::new()),
                        queued_bytes: Cell::new(0),
                        wake: Notify::default(),
                        connected: Cell::new(false),
                    })
                })
                .collect(),
            tls: cfg.tls.as_ref().map(|t| t.client.clone()),
        }
    }

    /// Starts one task per peer that dials it, greets and writes what is queued, until
    /// the shard shuts down.
    pub fn start(&self, server: &Rc<Server>, hello: Hello) {
        LINKS_STARTED.get_or_init(std::time::Instant::now);
        for p in &self.peers {
            let p = p.clone();
            let server = server.clone();
            let hello = hello.clone();
            let tls = self.tls.clone();
            glommio::spawn_local(async move { connection_loop(&server, &p, &hello, tls).await })
                .detach();
        }
    }

    /// True while this shard's connection to replica `to` is up.
    pub fn connected(&self, to: u64) -> bool {
        self.peers
            .iter()
            .any(|p| p.member.replica == to && p.connected.get())
    }

    /// Whether each of this shard's connections is up, in the order of the peers.
    pub fn connected_all(&self) -> Vec<bool> {
        self.peers.iter().map(|p| p.connected.get()).collect()
    }

    /// Queues `frame` for the peer with replica id `to` (dropped when `to` is not a
    /// peer); the peer's task writes it.
    pub fn send(&self, to: u64, frame: impl Into<OutFrame>) {
        let Some(p) = self.peers.iter().find(|p| p.member.replica == to) else {
            return;
        };
        let frame = frame.into();
        let mut q = p.queue.borrow_mut();
        let mut bytes = p.queued_bytes.get() + frame.len();
        while bytes > QUEUE_LIMIT {
            match q.pop_front() {
                Some(old) => bytes -= old.len(),
                None => break,
            }
        }
        q.push_back(frame);
        p.queued_bytes.set(bytes);
        p.wake.notify();
    }
}

async fn connection_loop(
    server: &Server,
    p: &Outgoing,
    hello: &Hello,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) {
    let greeting = match wire::encode_hello(hello) {
        Ok(g) => g,
        Err(e) => {
            log::error!("CLUSTER: cannot greet {}: {e}", p.member.address);
            return;
        }
    };
    let mut logged_down = false;
    let mut flapping = false;
    while !server.shard.shutdown.is_set() {
        let stream = match TcpStream::connect_timeout(p.member.address.as_str(), DIAL_TIMEOUT).await
        {
            Ok(s) => s,
            Err(e) => {
                if !logged_down {
                    log::warn!("CLUSTER: peer {} unreachable: {e}", p.member.address);
                    logged_down = true;
                }
                glommio::timer::sleep(REDIAL).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let announce = !flapping && (logged_down || server.shard.index() == 0);
        logged_down = false;
        let connected = || {
            if announce {
                log::info!("CLUSTER: connected to peer {}", p.member.address);
            }
        };
        let since = std::time::Instant::now();
        // Open for as long as `stream` (or the TLS stream around it) lives.
        let socket = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let r = match &tls {
            None => {
                connected();
                write_loop(server, p, stream, &greeting, Some(socket), socket).await
            }
            Some(client) => match dial_tls(client, &p.member.address, stream).await {
                Ok(stream) => {
                    connected();
                    write_loop(server, p, stream, &greeting, None, socket).await
                }
                Err(e) => {
                    // Once a minute per peer: it is dialled again every REDIAL.
                    log_once(
                        &format!("tls to {}", p.member.address),
                        &format!(
                            "TLS handshake with peer {} failed: {e}; dialled again every {} ms (every member needs --cluster-tls and a certificate that chains to --tls-root-ca-file and names the host of its address)",
                            p.member.address,
                            REDIAL.as_millis()
                        ),
                        log::Level::Warn,
                    );
                    glommio::timer::sleep(REDIAL).await;
                    continue;
                }
            },
        };
        p.connected.set(false);
        // A peer that closes each connection at once (it refuses this member: its own
        // log says why) is reported once a minute, not at every redial.
        flapping = since.elapsed() < FLAP;
        if let Err(e) = r {
            if flapping {
                log_once(
                    &format!("closed {}", p.member.address),
                    &format!(
                        "connection to {} closed at once: {e} (the peer refuses this member? its log says why); dialled again every {} ms",
                        p.member.address,
                        REDIAL.as_millis()
                    ),
                    log::Level::Warn,
                );
            } else {
                log::warn!("CLUSTER: connection to {} closed: {e}", p.member.address);
            }
        }
        glommio::timer::sleep(REDIAL).await;
    }
}

/// The TLS handshake of a member connection this member dialled (`--cluster-tls`): the
/// peer's certificate must chain to the cluster's root CA and name the host of its
/// address. Gives up after [`DIAL_TIMEOUT`].
async fn dial_tls(
    client: &std::sync::Arc<rustls::ClientConfig>,
    address: &str,
    stream: TcpStream,
) -> std::io::Result<futures_rustls::client::TlsStream<TcpStream>> {
    let host = address
        .rsplit_once(':')
        .map_or(address, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::other(format!("{host} is not a TLS server name: {e}")))?;
    let connect = futures_rustls::TlsConnector::from(client.clone()).connect(name, stream);
    within(DIAL_TIMEOUT, connect, "TLS handshake").await
}

/// `f`, or a `TimedOut` error naming `what` after `limit`.
async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = std::io::Result<T>>,
    what: &str,
) -> std::io::Result<T> {
    let f = std::pin::pin!(f);
    let sleep = std::pin::pin!(glommio::timer::sleep(limit));
    match futures::future::select(f, sleep).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} took over {} ms", limit.as_millis()),
        )),
    }
}

/// Writes the greeting, then what is queued for the peer and a ping every
/// [`liveness::PING_EVERY`], until the connection fails or the shard shuts down. `fd`:
/// the socket of a plain TCP `stream`, written with vectored sends ([`write_frames`]).
async fn write_loop<S: AsyncRead + AsyncWrite + Unpin>(
    server: &Server,
    p: &Outgoing,
    mut stream: S,
    greeting: &[u8],
    fd: Option<std::os::fd::RawFd>,
    socket: std::os::fd::RawFd,
) -> std::io::Result<()> {
    if super::cut::is_cut() {
        super::cut::wait().await;
    }
    stream.write_all(greeting).await?;
    stream.flush().await?;
    p.connected.set(true);
    let mut frames: Vec<OutFrame> = Vec::new();
    let mut buf = Vec::new();
    // The first ping goes with the first frames after the greeting.
    let mut last_ping: Option<std::time::Instant> = None;
    let peer = p.member.replica;
    loop {
        if super::cut::is_cut() {
            super::cut::wait().await;
        }
        acknowledged(socket, peer)?;
        // The ping goes first, ahead of what is queued: the time it carries, sent back,
        // renews this member's delivery lease, and the peer's answer is the sooner.
        if last_ping.is_none_or(|at| at.elapsed() >= liveness::PING_EVERY) {
            let (contact, sent, echo) = liveness::ping_fields(p.member.replica);
            frames.push(wire::encode_ping(contact, sent, echo).into());
            last_ping = Some(std::time::Instant::now());
        }
        {
            let mut q = p.queue.borrow_mut();
            let mut taken = 0;
            while let Some(f) = q.pop_front() {
                taken += f.len();
                frames.push(f);
                if taken > 1 << 20 {
                    break;
                }
            }
            p.queued_bytes
                .set(p.queued_bytes.get().saturating_sub(taken));
        }
        if frames.is_empty() {
            if server.shard.shutdown.is_set() {
                return Ok(());
            }
            // The peer never writes on this connection: a read that completes means it
            // closed or reset it (a killed peer), seen at once rather than at the next
            // write. The next ping is due within PING_EVERY.
            let mut probe = [0u8; 1];
            let wake = std::pin::pin!(p.wake.wait());
            let stop = std::pin::pin!(server.shard.shutdown.wait());
            let due = last_ping.map_or(Duration::ZERO, |at| {
                liveness::PING_EVERY.saturating_sub(at.elapsed())
            });
            let ping = std::pin::pin!(glommio::timer::sleep(due));
            let closed = std::pin::pin!(stream.read(&mut probe));
            let waited = futures::future::select(wake, futures::future::select(stop, ping));
            if let futures::future::Either::Right((r, _)) =
                futures::future::select(waited, closed).await
            {
                return Err(match r {
                    Ok(_) => std::io::Error::other("the peer closed the connection"),
                    Err(e) => e,
                });
            }
            continue;
        }
        {
            // A write that waits for room in a socket the peer no longer acknowledges
            // (a network partition) is given up too.
            let mut write = std::pin::pin!(write_frames(&mut stream, fd, &frames, &mut buf));
            // Most writes complete at once: no timer for those.
            match futures::poll!(write.as_mut()) {
                std::task::Poll::Ready(written) => written?,
                std::task::Poll::Pending => {
                    let watch = std::pin::pin!(watch_acknowledgements(socket, peer));
                    match futures::future::select(write, watch).await {
                        futures::future::Either::Left((written, _)) => written?,
                        futures::future::Either::Right((e, _)) => return Err(e),
                    }
                }
            }
        }
        frames.clear();
    }
}

/// A connection on which this member's data has waited for the peer's acknowledgement
/// this long, while nothing came from the peer either, is given up and dialled again: a
/// network partition that left it open. TCP would otherwise resend on it at
/// exponentially growing intervals (6 s apart after a few seconds, up to 2 min), and
/// after the network heals the members would wait for the next resend to hear each
/// other; a new connection is made within a dial timeout (1 s) and [`REDIAL`] of the heal. A
/// peer that is stopped (SIGSTOP) still acknowledges through its kernel, even with its
/// receive buffer full (the window probes are answered), so its connections stay.
pub const UNACKNOWLEDGED_AFTER: Duration = Duration::from_secs(2);

/// How often a write that waits is checked against [`UNACKNOWLEDGED_AFTER`].
const ACK_CHECK: Duration = Duration::from_millis(250);

/// Whether a connection counts as cut off: data unacknowledged (`unacked` segments),
/// the last acknowledgement `last_ack_ms` ago, and the peer silent for `silent_ms` (from
/// the kernel's `TCP_INFO` and [`liveness::silent_for_ms`]).
fn cut_off(unacked: u32, last_ack_ms: u32, silent_ms: u64) -> bool {
    let limit = u64::try_from(UNACKNOWLEDGED_AFTER.as_millis()).unwrap_or(u64::MAX);
    unacked > 0 && u64::from(last_ack_ms) >= limit && silent_ms >= limit
}

/// `Err` (`TimedOut`) when `socket`, a connection to peer `peer`, is cut off
/// ([`cut_off`]). Reads the socket's `TCP_INFO` only when the peer has been silent for
/// [`UNACKNOWLEDGED_AFTER`].
fn acknowledged(socket: std::os::fd::RawFd, peer: u64) -> std::io::Result<()> {
    let silent = liveness::silent_for_ms(peer);
    if silent < u64::try_from(UNACKNOWLEDGED_AFTER.as_millis()).unwrap_or(u64::MAX) {
        return Ok(());
    }
    // SAFETY: an all-zero tcp_info is valid (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>())
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `socket` is open for the caller's connection; `info` and `len` are valid
    // for the kernel to fill (it writes at most `len` bytes).
    let rc = unsafe {
        libc::getsockopt(
            socket,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    if rc != 0 || !cut_off(info.tcpi_unacked, info.tcpi_last_ack_recv, silent) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "nothing acknowledged or heard for {} ms (the network between the members is cut?); dialled again",
            info.tcpi_last_ack_recv
        ),
    ))
}

/// Resolves, with the error, once `socket` is cut off ([`acknowledged`]), looking every
/// [`ACK_CHECK`].
async fn watch_acknowledgements(socket: std::os::fd::RawFd, peer: u64) -> std::io::Error {
    loop {
        glommio::timer::sleep(ACK_CHECK).await;
        if let Err(e) = acknowledged(socket, peer) {
            return e;
        }
    }
}

/// The most pieces one vectored send takes (Linux's `IOV_MAX`).
const MAX_PIECES: usize = 1024;

/// Writes `frames` in order. On a plain socket (`fd`), their pieces go with vectored
/// sends that do not wait, from the frames' own buffers: an append's entry data is not
/// copied into a send buffer. What the socket does not take at once (its buffer is
/// full), and everything on a TLS connection, is copied into `buf` and written through
/// `stream`, which waits for the socket.
async fn write_frames<S: AsyncWrite + Unpin>(
    stream: &mut S,
    fd: Option<std::os::fd::RawFd>,
    frames: &[OutFrame],
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut sent = 0;
    if let Some(fd) = fd {
        // SAFETY: `fd` is the socket of `stream`, which this call borrows: it stays
        // open for the call.
        let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut pieces: Vec<std::io::IoSlice<'_>> = Vec::new();
        for f in frames {
            f.pieces(|p| pieces.push(std::io::IoSlice::new(p)));
        }
        for batch in pieces.chunks(MAX_PIECES) {
            let want: usize = batch.iter().map(|p| p.len()).sum();
            let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
            let mut control = rustix::net::SendAncillaryBuffer::default();
            match rustix::net::sendmsg(socket, batch, &mut control, flags) {
                Ok(n) => {
                    sent += n;
                    if n < want {
                        break;
                    }
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    buf.clear();
    let mut skip = sent;
    for f in frames {
        f.pieces(|p| {
            if skip >= p.len() {
                skip -= p.len();
            } else {
                buf.extend_from_slice(&p[skip..]);
                skip = 0;
            }
        });
    }
    if !buf.is_empty() {
        stream.write_all(buf).await?;
    }
    // TLS keeps what it encrypted until flushed; plain TCP has nothing to flush.
    stream.flush().await
}

/// Shard 0's listener on `--cluster-address`: reads each peer's frames and hands them to
/// their shards. A bind failure stops the broker (as a TCP or HTTP listener's does).
pub async fn accept_loop(server: Rc<Server>, cfg: Rc<ClusterConfig>) {
    // Bound exclusively as the TCP and HTTP listeners are (SO_REUSEADDR, never
    // SO_REUSEPORT, retried while a previous instance releases it): a second process on
    // the same address is refused instead of sharing the port and taking part of the
    // cluster's traffic.
    let deadline = std::time::Instant::now() + crate::runtime::listeners::BIND_RETRY;
    let bound = crate::runtime::listeners::bind(&cfg.me.address, deadline)
        .and_then(|(_, s)| {
            crate::runtime::listeners::listen(&cfg.me.address, &s)?;
            Ok(s)
        })
        .map(|s| {
            use std::os::fd::{FromRawFd, IntoRawFd};
            // SAFETY: the descriptor is a listening socket this function owns.
            unsafe { TcpListener::from_raw_fd(s.into_raw_fd()) }
        });
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            log::error!("FATAL: listen ({}) failed - {e}", cfg.me.address);
            std::process::exit(1);
        }
    };
    log::info!(
        "CLUSTER: listening on {}{}",
        cfg.me.address,
        if cfg.tls.is_some() {
            " (mutual TLS: --cluster-tls)"
        } else {
            ""
        }
    );
    loop {
        let accept = std::pin::pin!(listener.accept());
        let stop = std::pin::pin!(server.shard.shutdown.wait());
        let stream = match futures::future::select(accept, stop).await {
            futures::future::Either::Left((Ok(s), _)) => s,
            futures::future::Either::Left((Err(e), _)) => {
                log::warn!("CLUSTER: accept failed: {e}");
                glommio::timer::sleep(REDIAL).await;
                continue;
            }
            futures::future::Either::Right(_) => return,
        };
        let server = server.clone();
        let cfg = cfg.clone();
        glommio::spawn_local(async move {
            let r = match &cfg.tls {
                None => read_loop(&server, &cfg, stream).await,
                Some(tls) => {
                    let peer = stream
                        .peer_addr()
                        .map_or_else(|_| "?".to_string(), |a| a.ip().to_string());
                    let accept =
                        futures_rustls::TlsAcceptor::from(tls.server.clone()).accept(stream);
                    match within(DIAL_TIMEOUT, accept, "TLS handshake").await {
                        Ok(stream) => read_loop(&server, &cfg, stream).await,
                        Err(e) => {
                            log_once(
                                &format!("tls {peer}"),
                                &format!(
                                    "TLS handshake with {peer} failed, connection refused: {e} (every member needs --cluster-tls and a certificate that chains to --tls-root-ca-file)"
                                ),
                                log::Level::Error,
                            );
                            return;
                        }
                    }
                }
            };
            if let Err(e) = r {
                // A refused peer is logged by `log_once`.
                if e.to_string().contains("refused") {
                    log::debug!("CLUSTER: incoming connection closed: {e}");
                } else {
                    log::warn!("CLUSTER: incoming connection closed: {e}");
                }
            }
        })
        .detach();
    }
}

async fn read_loop<S: AsyncRead + Unpin>(
    server: &Rc<Server>,
    cfg: &ClusterConfig,
    mut stream: S,
) -> std::io::Result<()> {
    // Small until the peer greets: a connection that is not a member's costs little.
    // Frames are split off the buffer as they complete: a Raft append's large entry
    // data stays where it was read (wire::decode_frame_shared), and the buffer is
    // replaced once its room runs low.
    let mut buf = BytesMut::with_capacity(1 << 10);
    let mut read_size = 1 << 10;
    let mut last_frame = 0usize;
    let accepted = std::time::Instant::now();
    let mut from: Option<u64> = None;
    // The peer is out of touch once this connection ends, however it ends.
    struct Touch(Option<u64>);
    impl Drop for Touch {
        fn drop(&mut self) {
            if let Some(replica) = self.0 {
                liveness::closed(replica);
            }
        }
    }
    let mut touch = Touch(None);
    // Before the greeting: what is not a member's greeting is refused, logged once a
    // minute (anyone who reaches the port can send anything).
    let refuse = |why: String| {
        log_once(
            "not a member",
            &format!("{why}; connection refused (the cluster port is for members: --cluster-peer)"),
            log::Level::Warn,
        );
        std::io::Error::other(format!("{why}; refused"))
    };
    loop {
        if super::cut::is_cut() {
            super::cut::wait().await;
        }
        let n = if from.is_none() {
            let left = GREETING_TIMEOUT.saturating_sub(accepted.elapsed());
            match within(
                left,
                read_append(&mut stream, &mut buf, read_size, 0),
                "a greeting",
            )
            .await
            {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Err(refuse(format!(
                        "an incoming connection sent no greeting within {} s",
                        GREETING_TIMEOUT.as_secs()
                    )));
                }
                Err(e) => return Err(e),
            }
        } else {
            // The rest of a frame whose length is known gets its room at once: a large
            // append is then read into one buffer, not copied into larger ones as it
            // arrives.
            let short = lacking(&buf);
            // At a frame's start, room for a frame as large as the last one (up to
            // APPEND_HINT_MAX, the size of the largest appends), so that a stream of
            // large appends is read one buffer per frame, uncopied.
            let max = if buf.is_empty() {
                read_size.max(last_frame.min(APPEND_HINT_MAX))
            } else {
                read_size
            };
            read_append(&mut stream, &mut buf, max, short).await?
        };
        if n == 0 {
            return Ok(());
        }
        if from.is_none() {
            if let Some(len) = wire::length_field(&buf).filter(|&l| l > GREETING_MAX) {
                return Err(refuse(format!(
                    "an incoming connection's first frame ({len} bytes) is not a greeting"
                )));
            }
        }
        loop {
            let decoded = match wire::frame_len(&buf) {
                Ok(Some(len)) => {
                    last_frame = len;
                    wire::decode_frame_shared(&buf.split_to(len).freeze())
                }
                Ok(None) => break,
                Err(_)
                    if from.is_some()
                        && wire::length_field(&buf).is_some_and(|l| l > wire::MAX_FRAME_LEN) =>
                {
                    return Err(std::io::Error::other(format!(
                        "bad frame: {} bytes long, over the {} bytes a frame may take",
                        wire::length_field(&buf).unwrap_or(0),
                        wire::MAX_FRAME_LEN
                    )));
                }
                Err(e) => Err(e),
            };
            let frame = match decoded {
                Ok(Some((f, _))) => f,
                Ok(None) => break,
                Err(nsq_replication::DecodeError::Version(v)) => {
                    // Once a minute: the peer dials again every REDIAL.
                    let e = format!(
                        "a peer speaks frame version {v}, this member {}: every member must run the same release; its connection is refused",
                        wire::FRAME_VERSION
                    );
                    log_once(&format!("frame version {v}"), &e, log::Level::Error);
                    cfg.refusals.set(&format!("frame version {v}"), &e);
                    return Err(std::io::Error::other(e));
                }
                Err(e) if from.is_none() => {
                    return Err(refuse(format!(
                        "an incoming connection's first frame does not decode ({e})"
                    )));
                }
                Err(e) => return Err(std::io::Error::other(format!("bad frame: {e}"))),
            };
            match (from, frame) {
                (None, Frame::Hello(h)) => {
                    let replica = check_hello(cfg, &h)?;
                    from = Some(replica);
                    read_size = READ_SIZE;
                    touch.0 = Some(replica);
                    liveness::opened(replica);
                    super::replica::peer_greeted(server, replica, h.tcp).await;
                }
                (None, _) => {
                    return Err(refuse(
                        "an incoming connection sent a frame before its greeting".into(),
                    ))
                }
                (Some(_), Frame::Hello(_)) => {
                    return Err(std::io::Error::other("a second greeting"))
                }
                (
                    Some(peer),
                    Frame::Ping {
                        contact,
                        sent,
                        echo,
                    },
                ) => liveness::pinged(peer, contact, sent, echo),
                (Some(peer), frame) => {
                    liveness::heard(peer);
                    super::replica::route(server, peer, frame).await;
                }
            }
        }
    }
}

/// The bytes the frame begun in `buf` still lacks (0: none begun, a whole one there, or
/// a length that does not decode, which the decoder refuses).
fn lacking(buf: &[u8]) -> usize {
    match wire::frame_len(buf) {
        Ok(None) => wire::length_field(buf).map_or(0, |len| (len + 4).saturating_sub(buf.len())),
        _ => 0,
    }
}

/// How much a member's connection reads at once (more for the rest of a larger
/// frame).
const READ_SIZE: usize = 256 << 10;

/// The most room a connection makes at a frame's start for a frame as large as the
/// last: a Raft append is cut at 1 MiB of entries (a larger snapshot frame still gets
/// room for its rest once its length is in).
const APPEND_HINT_MAX: usize = 2 << 20;

/// Reads what `stream` has, appended to `buf` without zero-filling the room first:
/// the `short` bytes a large frame begun in `buf` lacks (`max / 4` or more), and no
/// more, so that the next frame starts in a buffer of its own instead of being copied
/// into a larger one once its length is known; otherwise up to `max` bytes. `buf` gets
/// room for the large frame's rest, or for `max` and `max / 4` more when it has less
/// than `short` or `max / 4` left. Returns the bytes read; 0 at end of stream.
async fn read_append<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    max: usize,
    short: usize,
) -> std::io::Result<usize> {
    let want = if short >= max / 4 { short } else { max };
    let spare = buf.capacity() - buf.len();
    if short >= max / 4 && spare < short {
        buf.reserve(short);
    } else if spare < short.max(max / 4) {
        buf.reserve(want + max / 4);
    }
    let room = (buf.capacity() - buf.len()).min(want);
    crate::tcp::read_into_spare(buf, room, async |area| stream.read(area).await).await
}

/// The peer's replica id when its greeting names a listed member with the matching id
/// and a `--node-id` other than this node's; otherwise the refusal, logged once a
/// minute and kept in [`ClusterConfig::refusals`]. A peer with this node's `--node-id`
/// found within [`NODE_ID_CHECK`] of the start makes this member refuse to run
/// ([`crate::runtime::drain::refuse_to_run`]).
fn check_hello(cfg: &ClusterConfig, h: &Hello) -> std::io::Result<u64> {
    let refused = |e: String| {
        log_once(&h.address, &e, log::Level::Error);
        cfg.refusals.set(&h.address, &e);
        Err(std::io::Error::other(e))
    };
    let Some(m) = cfg.peers.iter().find(|m| m.address == h.address) else {
        return refused(format!(
            "peer {} is not in --cluster-peer; its connection is refused",
            h.address
        ));
    };
    if m.replica != h.replica {
        return refused(format!(
            "peer {} greets with replica id {} instead of {}",
            h.address, h.replica, m.replica
        ));
    }
    if h.node_id == cfg.node_id {
        let at_start = LINKS_STARTED
            .get()
            .is_none_or(|t| t.elapsed() < NODE_ID_CHECK);
        if at_start {
            crate::runtime::drain::refuse_to_run(format!(
                "cluster member {} has this member's --node-id {}: every member needs its own (message IDs carry it)",
                h.address, h.node_id
            ));
        }
        return refused(format!(
            "peer {} has the same --node-id {} as this node: every member needs its own (message IDs carry it); its connection is refused",
            h.address, h.node_id
        ));
    }
    cfg.refusals.clear(&h.address);
    if h.members == cfg.members_digest() {
        cfg.other_lists.clear(&h.address);
    } else {
        // Not refused: a rolling restart that adds or removes a member goes through
        // this, and the members settle on the list each leader places topics by.
        let e = format!(
            "peer {} lists other members than this member's --cluster-address and --cluster-peer: every member must end with the same list (expected only while members are added or removed)",
            h.address
        );
        log_once(&format!("members of {}", h.address), &e, log::Level::Warn);
        cfg.other_lists.set(&h.address, &e);
    }
    Ok(m.replica)
}

/// Logs `text` at `level` once a minute per `key` (a refused peer's reason, keyed by its
/// address: it dials again every [`REDIAL`]).
fn log_once(key: &str, text: &str, level: log::Level) {
    thread_local! {
        static LOGGED: std::cell::RefCell<std::collections::HashMap<String, std::time::Instant>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    let now = std::time::Instant::now();
    let due = LOGGED.with(|l| {
        let mut l = l.borrow_mut();
        let due = l
            .get(key)
            .is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(60));
        if due {
            l.insert(key.to_string(), now);
        }
        due
    });
    if due {
        log::log!(level, "CLUSTER: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nsq_replication::raft::eraftpb::Entry as RaftEntry;
    use nsq_replication::RaftMessage;

    #[test]
    fn a_connection_is_cut_off_only_when_unacknowledged_and_the_peer_silent() {
        // A partition: data waits, no acknowledgement, nothing heard.
        assert!(cut_off(3, 2000, 2000));
        assert!(cut_off(1, 5000, u64::MAX));
        // A stopped peer's kernel acknowledges (window probes included).
        assert!(!cut_off(3, 10, 5000));
        // Nothing waits for an acknowledgement: an idle connection.
        assert!(!cut_off(0, 5000, 5000));
        // The peer still speaks (on its own connection): not cut off.
        assert!(!cut_off(3, 5000, 100));
        // Not long enough yet.
        assert!(!cut_off(3, 1999, 5000));
    }

    /// Appends whose large entry data goes as separate pieces, `n` of them, each `size`
    /// bytes of data (a different byte per append).
    fn appends(n: usize, size: usize) -> Vec<OutFrame> {
        (0..n)
            .map(|i| {
                let mut m = RaftMessage {
                    to: 2,
                    index: i as u64,
                    ..RaftMessage::default()
                };
                m.entries = vec![
                    RaftEntry {
                        index: i as u64 + 1,
                        data: vec![(i % 251) as u8; size].into(),
                        ..RaftEntry::default()
                    },
                    RaftEntry {
                        index: i as u64 + 2,
                        data: b"small".to_vec().into(),
                        ..RaftEntry::default()
                    },
                ]
                .into();
                wire::encode_frame("t", &mut m).expect("encodes")
            })
            .collect()
    }

    /// More than the socket takes at once (a reader that is slow to start): what the
    /// vectored send leaves is written through the stream, and the reader gets every
    /// frame whole and in order, its large data read into the buffer it decodes from.
    #[test]
    fn frames_arrive_whole_and_in_order_past_a_full_socket() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .spawn(|| async {
                let frames = appends(40, 300 << 10);
                let expected: Vec<Vec<u8>> = frames.iter().map(OutFrame::to_vec).collect();
                let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
                let addr = listener.local_addr().expect("address");
                let reader = glommio::spawn_local(async move {
                    let mut stream = listener.accept().await.expect("accepts");
                    glommio::timer::sleep(Duration::from_millis(200)).await;
                    let mut buf = BytesMut::new();
                    let mut got = Vec::new();
                    while got.len() < 40 {
                        let short = lacking(&buf);
                        let n = read_append(&mut stream, &mut buf, READ_SIZE, short)
                            .await
                            .expect("reads");
                        assert!(n > 0, "the writer closed early");
                        while let Ok(Some(len)) = wire::frame_len(&buf) {
                            let whole = buf.split_to(len).freeze();
                            let Ok(Some((Frame::Raft { message, .. }, _))) =
                                wire::decode_frame_shared(&whole)
                            else {
                                panic!("not a Raft frame");
                            };
                            let data = &message.entries[0].data;
                            let at = data.as_ptr() as usize;
                            let start = whole.as_ptr() as usize;
                            assert!(at >= start && at < start + whole.len(), "copied");
                            got.push(whole.to_vec());
                        }
                    }
                    got
                });
                let mut stream = TcpStream::connect(addr).await.expect("connects");
                let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
                let mut buf = Vec::new();
                write_frames(&mut stream, Some(fd), &frames, &mut buf)
                    .await
                    .expect("writes");
                assert!(!buf.is_empty(), "the socket took 12 MB at once");
                let got = reader.await;
                assert_eq!(got.len(), expected.len());
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert!(g == e, "frame {i} differs");
                }
            })
            .expect("executor")
            .join()
            .expect("test");
    }
}
