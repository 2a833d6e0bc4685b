//! FIN, REQ and TOUCH: a consumer's answers about a message in flight (nsqd:
//! protocol_v2.go FIN, REQ, TOUCH). Their errors are not fatal: the connection stays.
//!
//! ```text
//! FIN <message_id>\n
//! REQ <message_id> <timeout>\n
//! TOUCH <message_id>\n
//! ```

use crate::server::Server;
use nsq_shards::channel::InFlightError;
use nsq_shards::client::Client;
use nsq_shards::MessageId;
use nsq_wire::v2::FRAME_ERROR;
use std::time::Duration;

/// Finishes message `id` (nsqd: FIN); queues `E_FIN_FAILED` if it is not the client's.
pub(super) fn fin(server: &Server, client: &Client, id: &[u8; 16]) {
    let r = parse(id).and_then(|mid| server.shard.finish(client, mid));
    report(client, "E_FIN_FAILED FIN", id, r);
}

/// Requeues message `id` after `timeout_ms`, clamped to `--max-req-timeout` (nsqd: REQ
/// clamps and logs); queues `E_REQ_FAILED` if it is not the client's.
pub(super) fn req(server: &Server, client: &Client, id: &[u8; 16], timeout_ms: i64) {
    let max = server.shard.opts.max_req_timeout;
    let mut delay = Duration::from_millis(timeout_ms.max(0) as u64);
    if delay > max {
        log::info!(
            "PROTOCOL(V2): [{}] REQ timeout {} out of range 0-{}. Setting to max.",
            client.remote_address(),
            timeout_ms,
            max.as_millis()
        );
        delay = max;
    }
    let r = parse(id).and_then(|mid| server.shard.requeue(client, mid, delay));
    report(client, "E_REQ_FAILED REQ", id, r);
}

/// Resets message `id`'s timeout (nsqd: TOUCH); queues `E_TOUCH_FAILED` if it is not
/// the client's.
pub(super) fn touch(server: &Server, client: &Client, id: &[u8; 16]) {
    let r = parse(id).and_then(|mid| server.shard.touch(client, mid));
    report(client, "E_TOUCH_FAILED TOUCH", id, r);
}

fn parse(id: &[u8; 16]) -> Result<MessageId, InFlightError> {
    MessageId::from_hex(id).ok_or(InFlightError::NotInFlight)
}

/// Queues `<prefix> <id> failed <reason>` for a failed command.
fn report(client: &Client, prefix: &str, id: &[u8; 16], r: Result<(), InFlightError>) {
    if let Err(e) = r {
        let text = format!(
            "{prefix} {} failed {}",
            String::from_utf8_lossy(id),
            e.text()
        );
        client.send_frame(FRAME_ERROR, text.as_bytes());
    }
}
