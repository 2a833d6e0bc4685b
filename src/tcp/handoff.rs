//! Moving a connection to the shard that owns its topic. nsqd has one process and no
//! counterpart: here a SUB must run on the topic's owning shard, and a producer's first
//! publish moves it to its topic's owner, so the connection's socket, its client state,
//! what it read but did not execute yet, its TLS session and its compression state
//! travel over the shard mesh ([`nsq_shards::mesh::HandOff`]) and the connection
//! resumes there ([`resume`]).

use super::compress::Decoder;
use super::conn::{run_connection, Outcome};
use super::stream::{SharedStream, TlsSession};
use crate::server::Server;
use bytes::BytesMut;
use glommio::net::TcpStream;
use nsq_shards::client::Client;
use nsq_shards::mesh::{HandOff, ShardMsg};
use nsq_shards::{owner_of, ClientState};
use nsq_wire::v2::Command;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd};
use std::rc::Rc;

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

/// What moves with a connection besides its socket and client state.
pub(super) struct Moved {
    /// Read and decompressed, not executed yet (starts with the command that moves it).
    pub pending: BytesMut,
    /// Read, still compressed (snappy).
    pub pending_raw: Vec<u8>,
    /// The inflate window (deflate).
    pub inflate_history: Vec<u8>,
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
    let tls = stream
        .take_tls()
        .map(|t| t as Box<dyn std::any::Any + Send>);
    drop(stream);
    let Ok(fd) = dup else {
        log::error!(
            "hand-off of {} failed: cannot dup the socket",
            client.remote_address()
        );
        return;
    };
    client.set_closed(false);
    let h = HandOff {
        fd,
        client: client.snapshot(),
        pending: moved.pending.to_vec(),
        pending_raw: moved.pending_raw,
        inflate_history: moved.inflate_history,
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
    let buf = BytesMut::from(&h.pending[..]);
    let stream = match h.tls.map(|t| t.downcast::<TlsSession>()) {
        None => SharedStream::new(stream),
        Some(Ok(conn)) => SharedStream::with_tls(stream, conn),
        Some(Err(_)) => {
            log::error!(
                "hand-off of {} failed: not a TLS session",
                client.remote_address()
            );
            return;
        }
    };
    run_connection(
        server,
        stream,
        client,
        buf,
        h.pending_raw,
        h.inflate_history,
        h.read_ahead,
    )
    .await;
}
