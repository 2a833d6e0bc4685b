//! Moving a connection to the shard that owns its topic. nsqd has one process and no
//! counterpart: here a SUB must run on the topic's owning shard, and a producer's first
//! publish moves it to its topic's owner, so the connection's socket, its client state,
//! what it read but did not execute yet, its TLS session and its compression state
//! travel over the shard mesh ([`HandOff`] in a [`ShardMsg::HandOff`]) and the
//! connection resumes there ([`resume`]).

use super::compress::Decoder;
use super::conn::{run_connection, Outcome};
use super::stream::{SharedStream, TlsSession};
use crate::mesh::ShardMsg;
use crate::server::Server;
use bytes::BytesMut;
use glommio::net::TcpStream;
use nsq_shards::client::{Client, ClientSnapshot};
use nsq_shards::{owner_of, ClientState};
use nsq_wire::v2::Command;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;

/// A connection moving to the shard that owns the topic it is about to SUB (or PUB) to:
/// the socket, the negotiated client state, its TLS session and compressor state, and
/// every byte read but not yet processed (the command that caused the move comes first).
///
/// It crosses threads inside a [`ShardMsg`], so it is `Send`: the TLS session is a
/// [`TlsSession`] (a `rustls::ServerConnection` and its unread ciphertext), named here
/// by its type. This message type lives in the root crate, beside the socket code,
/// rather than in the shards crate, which would otherwise need rustls or a type-erased
/// `Any` for it.
pub struct HandOff {
    pub fd: OwnedFd,
    pub client: ClientSnapshot,
    /// Read and decompressed, not executed yet (starts with the command that moves it).
    pub pending: Vec<u8>,
    /// Received bytes not yet decoded (an incomplete snappy chunk).
    pub pending_raw: Vec<u8>,
    /// With deflate: the last 32 KiB inflated (the client's deflate window).
    pub inflate_history: Vec<u8>,
    /// With deflate: the last 32 KiB the server sent (the peer's inflate window), to
    /// prime the compressor that continues the stream on the new shard.
    pub deflate_history: Vec<u8>,
    /// The connection's TLS session, so a TLS connection continues on the new shard
    /// mid-stream.
    pub tls: Option<Box<TlsSession>>,
    /// How many bytes past the start of `pending` a Go nsqd would have read from the
    /// socket by now (its 16 KiB read buffer), when known: what decides whether a fatal
    /// error's close is a reset.
    pub read_ahead: Option<usize>,
}

/// The shard a connection must move to before `cmd` runs: a SUB always runs on the
/// topic's owner; a connection's first publish moves it to that topic's owner, so a
/// producer of one topic publishes without crossing shards.
pub(super) fn target(server: &Server, client: &Client, cmd: &Command) -> Option<usize> {
    let shard = &server.shard;
    if shard.count() == 1 {
        return None;
    }
    let topic = match cmd {
        Command::Sub { topic, .. } => topic,
        Command::Pub { topic, .. } | Command::Mpub { topic, .. } | Command::Dpub { topic, .. }
            if client.state() == ClientState::Init && client.pub_counts().is_empty() =>
        {
            topic
        }
        _ => return None,
    };
    let owner = owner_of(topic, shard.count());
    (owner != shard.index()).then_some(owner)
}

/// A deflate stream moves only at a client flush point: reads on (the client flushes
/// each command) onto `buf` until it is at one. Returns the decoder's state to move
/// with the connection: (undecoded bytes, inflate window).
pub(super) async fn wait_flush_point(
    stream: &SharedStream,
    decoder: &mut Option<Decoder>,
    buf: &mut BytesMut,
) -> Result<(Vec<u8>, Vec<u8>), Outcome> {
    while let Some(d) = decoder.as_mut().filter(|d| !d.can_hand_off()) {
        let mut raw = vec![0u8; 16 * 1024];
        match stream.read(&mut raw).await {
            Ok(n) if n > 0 => {
                let mut out = Vec::new();
                if d.feed(&raw[..n], &mut out).is_err() {
                    return Err(Outcome::Closed);
                }
                buf.extend_from_slice(&out);
            }
            _ => return Err(Outcome::Closed),
        }
    }
    Ok(decoder
        .take()
        .map(|d| d.handoff_state())
        .unwrap_or_default())
}

/// Where a connection's reader and writer stand, besides its socket and client state:
/// what moves with it to another shard, and what it starts from on a shard.
#[derive(Default)]
pub(super) struct Moved {
    /// Read and decompressed, not executed yet (starts with the command that moves it).
    pub pending: BytesMut,
    /// Read, still compressed (snappy).
    pub pending_raw: Vec<u8>,
    /// The inflate window (deflate).
    pub inflate_history: Vec<u8>,
    /// The window of what the writer sent compressed (deflate).
    pub deflate_history: Vec<u8>,
    /// Where a Go nsqd's read buffer would stand, from the start of `pending`.
    pub read_ahead: Option<usize>,
}

/// Sends the connection to shard `target` once its reader and writer have stopped.
pub(super) async fn send(
    server: &Server,
    stream: SharedStream,
    client: &Client,
    target: usize,
    moved: Moved,
) {
    // SAFETY: the stream is alive (we hold `stream`), so its fd is valid here.
    let dup = unsafe { BorrowedFd::borrow_raw(stream.fd()) }.try_clone_to_owned();
    // The writer has finished (awaited by the caller): the session has nothing left to
    // send, and what it received but was not read yet moves with it.
    let tls = stream.take_tls();
    drop(stream);
    let Ok(fd) = dup else {
        log::error!(
            "hand-off of {} failed: cannot dup the socket",
            client.remote_address()
        );
        return;
    };
    client.outbox().set_closed(false);
    let h = HandOff {
        fd,
        client: client.snapshot(),
        pending: moved.pending.to_vec(),
        pending_raw: moved.pending_raw,
        inflate_history: moved.inflate_history,
        deflate_history: moved.deflate_history,
        tls,
        read_ahead: moved.read_ahead,
    };
    server.shard.count_handoff_sent();
    if let Some(mesh) = server.mesh() {
        if mesh
            .send_to(target, ShardMsg::HandOff(Box::new(h)))
            .await
            .is_err()
        {
            log::error!("hand-off to shard {target} failed: mesh closed");
        }
    }
}

/// Resumes a connection handed over by another shard.
pub async fn resume(server: Rc<Server>, h: HandOff) {
    server.shard.count_handoff_received();
    // SAFETY: the fd came out of an OwnedFd, so it is open and owned by nobody else.
    let stream = unsafe { TcpStream::from_raw_fd(h.fd.into_raw_fd()) };
    let client = Rc::new(Client::from_snapshot(h.client));
    let stream = match h.tls {
        None => SharedStream::new(stream),
        Some(conn) => SharedStream::with_tls(stream, conn),
    };
    let moved = Moved {
        pending: BytesMut::from(&h.pending[..]),
        pending_raw: h.pending_raw,
        inflate_history: h.inflate_history,
        deflate_history: h.deflate_history,
        read_ahead: h.read_ahead,
    };
    run_connection(server, stream, client, moved).await;
}
