//! FIN, REQ and TOUCH: a consumer's answers about a message in flight (nsqd:
//! protocol_v2.go FIN, REQ, TOUCH). Their errors are not fatal: the connection stays.
//!
//! ```text
//! FIN <message_id>\n
//! REQ <message_id> <timeout>\n
//! TOUCH <message_id>\n
//! ```

use crate::server::Server;
use nsq_shards::channel::{clamp_req_timeout, InFlightError};
use nsq_shards::client::Client;
use nsq_shards::MessageId;
use nsq_wire::errors::{in_flight_failed, InFlightOp};
use nsq_wire::v2::FRAME_ERROR;

/// Finishes message `id` (nsqd: FIN); queues `E_FIN_FAILED` if it is not the client's,
/// unless it is `stale` (a previous leader delivered it: [`crate::cluster::relay`]).
pub(super) fn fin(server: &Server, client: &Client, id: &[u8; 16], stale: bool) {
    let r = parse(id).and_then(|mid| server.shard.finish(client, mid));
    report(client, InFlightOp::Fin, id, r, stale);
}

/// Requeues message `id` after `timeout_ms`, clamped to `--max-req-timeout` (nsqd: REQ
/// clamps and logs); queues `E_REQ_FAILED` if it is not the client's, unless `stale`.
pub(super) fn req(server: &Server, client: &Client, id: &[u8; 16], timeout_ms: i64, stale: bool) {
    let max = server.shard.opts.max_req_timeout;
    let (delay, clamped) = clamp_req_timeout(timeout_ms, max);
    if clamped && timeout_ms > 0 {
        log::info!(
            "PROTOCOL(V2): [{}] REQ timeout {} out of range 0-{}. Setting to max.",
            client.remote_address(),
            timeout_ms,
            max.as_millis()
        );
    }
    let r = parse(id).and_then(|mid| server.shard.requeue(client, mid, delay));
    report(client, InFlightOp::Req, id, r, stale);
}

/// Resets message `id`'s timeout (nsqd: TOUCH); queues `E_TOUCH_FAILED` if it is not
/// the client's, unless `stale`.
pub(super) fn touch(server: &Server, client: &Client, id: &[u8; 16], stale: bool) {
    let r = parse(id).and_then(|mid| server.shard.touch(client, mid));
    report(client, InFlightOp::Touch, id, r, stale);
}

fn parse(id: &[u8; 16]) -> Result<MessageId, InFlightError> {
    MessageId::from_hex(id).ok_or(InFlightError::NotInFlight)
}

/// Queues `E_FIN_FAILED FIN <id> failed <reason>` (or REQ's, TOUCH's) for a failed command,
/// and logs it at error as nsqd's IOLoop does, with its cause after ` - `. Nothing for a
/// `stale` message (delivered by a previous leader, not by this member).
fn report(
    client: &Client,
    op: InFlightOp,
    id: &[u8; 16],
    r: Result<(), InFlightError>,
    stale: bool,
) {
    if stale {
        return;
    }
    if let Err(e) = r {
        let why: nsq_wire::errors::InFlightFailure = e.into();
        let text = in_flight_failed(op, id, why);
        log::error!("[{}] - {text} - {}", client.remote_address(), why.text());
        client.send_frame(FRAME_ERROR, text.as_bytes());
    }
}
