//! The protocol V2 TCP server (nsqd: tcp.go TCPServer, protocol_v2.go). This module
//! accepts connections and checks their magic (nsqd: tcp.go Handle); the rest, by
//! nsqd's names:
//!
//! - `conn`: the per-connection reader loop (nsqd: protocol_v2.go IOLoop),
//! - `commands`: one function per command (nsqd: protocol_v2.go Exec, IDENTIFY, SUB, ...),
//! - `writer`: output buffering, flushes and heartbeats (the writing half of nsqd's
//!   messagePump; `Channel::dispatch` in the shards crate is the half that picks
//!   messages),
//! - `handoff`: moving a connection to the shard that owns its topic (no nsqd
//!   counterpart: nsqd has one process),
//! - `compress`: snappy and deflate streams (nsqd: clientV2.UpgradeSnappy/Deflate),
//! - `stream`: the socket shared by reader and writer, plain or TLS (nsqd:
//!   clientV2.UpgradeTLS).

mod commands;
mod compress;
mod conn;
mod handoff;
mod stream;
pub(crate) use stream::read_into_spare;
mod writer;

pub use handoff::{resume, HandOff};
pub use stream::{SharedStream, TlsSession};

use crate::server::Server;
use bytes::BytesMut;
use conn::run_connection;
use glommio::net::{TcpListener, TcpStream};
use nsq_shards::client::Client;
use nsq_wire::identify::default_settings;
use nsq_wire::v2::{self as protocol, FRAME_ERROR, MAGIC_V2};
use std::rc::Rc;

/// Accepts connections on this shard's listener until shutdown.
pub async fn accept_loop(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "TCP", new_connection).await
}

/// Reads and checks the protocol magic, then runs the connection (nsqd: tcp.go Handle).
async fn new_connection(server: Rc<Server>, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let _ = stream.set_nodelay(true);
    log::info!("TCP: new client({peer})");
    let stream = SharedStream::new(stream);
    stream.set_read_timeout(Some(server.shard.opts.identify.client_timeout));
    // Small: an idle connection holds only what it needs (the reader grows its reads
    // with the traffic, up to READ_CHUNK).
    let mut buf = BytesMut::with_capacity(64);
    while buf.len() < 4 {
        let old = buf.len();
        buf.resize(old + 64, 0);
        match stream.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.truncate(old + n),
        }
    }
    log::info!(
        "CLIENT({peer}): desired protocol magic '{}'",
        String::from_utf8_lossy(&buf[..4])
    );
    if &buf[..4] != MAGIC_V2 {
        log::error!(
            "client({peer}) bad protocol magic '{}'",
            String::from_utf8_lossy(&buf[..4])
        );
        let mut out = Vec::new();
        protocol::write_frame(&mut out, FRAME_ERROR, b"E_BAD_PROTOCOL");
        let _ = stream.write_all(&out).await;
        // nsqd reads exactly the 4 bytes of the magic: anything sent after them makes
        // its close a reset.
        if buf.len() > 4 || stream.unread_input() > 0 {
            stream.reset_on_close();
        }
        stream.shutdown();
        return;
    }
    let _ = buf.split_to(4);
    let ip = peer.rsplit_once(':').map(|(h, _)| h).unwrap_or(&peer);
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let mut settings = default_settings(ip, &server.shard.opts);
    // Topology-aware consumption: a client that never IDENTIFYs is ranked as one from
    // elsewhere (0, unranked, when the experiment is off).
    settings.topology.rank = server.shard.opts.topology.rank("", "");
    let client = Rc::new(Client::new(
        server.shard.new_client_id(),
        peer.clone(),
        settings,
    ));
    let start = handoff::Moved {
        pending: buf,
        read_ahead: Some(0),
        ..Default::default()
    };
    run_connection(server, stream, client, start).await;
}
