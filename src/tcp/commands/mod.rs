//! Runs one decoded command against the shard (nsqd: protocol_v2.go Exec, which
//! dispatches to one method per command). One file per command family:
//!
//! - [`identify`]: IDENTIFY and AUTH (nsqd: IDENTIFY, AUTH),
//! - [`subscribe`]: SUB, RDY and CLS (nsqd: SUB, RDY, CLS),
//! - [`in_flight`]: FIN, REQ and TOUCH (nsqd: FIN, REQ, TOUCH),
//! - [`publish`]: PUB, MPUB and DPUB (nsqd: PUB, MPUB, DPUB).
//!
//! NOP has nothing to do (nsqd: NOP). A command's reply, if any, is queued on the
//! client's output buffer; the writer task sends it.

mod identify;
mod in_flight;
mod publish;
mod subscribe;

use super::stream::SharedStream;
use crate::server::Server;
use bytes::Bytes;
use nsq_shards::client::{Client, Compression};
use nsq_wire::v2::{Command, FRAME_ERROR};
use std::rc::Rc;

/// What a command asks of the connection once its reply is queued.
pub(super) enum Upgrade {
    None,
    /// IDENTIFY switched the stream to snappy or deflate.
    Compression,
    /// IDENTIFY granted `tls_v1`: the TLS handshake follows the reply, then the given
    /// compression if any.
    Tls(Compression),
}

/// Marker: the command failed fatally; its error frame is queued.
pub(super) struct Fatal;

/// Logs `text` (at error, as nsqd's IOLoop logs a failed command: `[addr] - <error>`),
/// queues it as an error frame and fails the command fatally (nsqd: a FatalClientErr
/// ends the IOLoop after its error is sent).
pub(super) fn fatal<T>(client: &Client, text: String) -> Result<T, Fatal> {
    log::error!("[{}] - {}", client.remote_address(), text);
    client.send_frame(FRAME_ERROR, text.as_bytes());
    Err(Fatal)
}

/// Runs `cmd`, decoded from `frame` (whose ranges it refers to), on this shard (nsqd:
/// protocol_v2.go Exec). `Err(Fatal)` ends the connection.
pub(super) async fn exec(
    server: &Rc<Server>,
    stream: &SharedStream,
    client: &Rc<Client>,
    cmd: Command,
    frame: &Bytes,
) -> Result<Upgrade, Fatal> {
    // A FIN, REQ or TOUCH of a message a previous leader delivered: no error if this
    // member did not deliver it again.
    let mut stale = false;
    if let Some(relay) = crate::cluster::relay::of(server, client) {
        use crate::cluster::relay::Forward;
        let forward = match &cmd {
            Command::Rdy { count } => {
                // Kept here too: the consumer's output buffering follows it.
                client.set_ready_count(*count);
                Some(Forward::Rdy(*count))
            }
            Command::Fin { id } => Some(Forward::Fin(id)),
            Command::Req { id, timeout_ms } => Some(Forward::Req(id, *timeout_ms)),
            Command::Touch { id } => Some(Forward::Touch(id)),
            Command::Cls => Some(Forward::Cls),
            _ => None,
        };
        // A consumer served through the topic's leader (docs/replication.md).
        if let Some(f) = forward {
            if relay.forward(client, f) {
                return Ok(Upgrade::None);
            }
        }
        stale = match &cmd {
            Command::Fin { id } | Command::Req { id, .. } | Command::Touch { id } => {
                relay.stale_here(id)
            }
            _ => false,
        };
    }
    match cmd {
        Command::Nop | Command::RdyIgnored => {}
        Command::Identify { body } => {
            return identify::identify(server, stream, client, &frame[body]);
        }
        Command::Auth { body } => identify::auth(server, client, &frame[body]).await?,
        Command::Sub { topic, channel } => subscribe::sub(server, client, &topic, &channel).await?,
        Command::Rdy { count } => subscribe::rdy(server, client, count),
        Command::Cls => subscribe::cls(client),
        Command::Fin { id } => in_flight::fin(server, client, &id, stale),
        Command::Req { id, timeout_ms } => in_flight::req(server, client, &id, timeout_ms, stale),
        Command::Touch { id } => in_flight::touch(server, client, &id, stale),
        Command::Pub { topic, body } => publish::pub_(server, client, &topic, frame, body).await?,
        Command::Dpub {
            topic,
            defer_ms,
            body,
        } => publish::dpub(server, client, &topic, frame, body, defer_ms).await?,
        Command::Mpub { topic, bodies } => {
            publish::mpub(server, client, &topic, frame, bodies).await?
        }
    }
    Ok(Upgrade::None)
}
