//! SUB, RDY and CLS: a consumer's subscription and its flow control (nsqd:
//! protocol_v2.go SUB, RDY, CLS).
//!
//! ```text
//! SUB <topic_name> <channel_name>\n
//! RDY <count>\n
//! CLS\n
//! ```
//!
//! A SUB runs on the shard that owns the topic: the reader loop moves the connection
//! there first (see [`crate::tcp::handoff`]).

use super::{fatal, Fatal};
use crate::server::Server;
use nsq_shards::client::Client;
use nsq_shards::shard::SubError;
use nsq_shards::ClientState;
use nsq_wire::v2::{FRAME_ERROR, FRAME_RESPONSE};
use std::rc::Rc;

/// How many times a SUB to a replicated topic is routed before it is refused, when
/// leadership keeps moving while it waits.
const SUB_ROUTES: u32 = 3;

/// Subscribes the client to `topic`/`channel` after the auth check; queues `OK`.
pub(super) async fn sub(
    server: &Rc<Server>,
    client: &Rc<Client>,
    topic: &str,
    channel: &str,
) -> Result<(), Fatal> {
    if let Err(e) = crate::auth::check(&server.cfg.auth, client, "SUB", topic, channel).await {
        return fatal(client, e.to_string());
    }
    // A drain refuses a new topic or channel before its store is prepared.
    crate::runtime::drain::applied(&server.shard);
    if server
        .shard
        .drain_allows_creating(topic, Some(channel))
        .is_err()
    {
        let e = SubError::Draining {
            topic: topic.to_string(),
            channel: channel.to_string(),
        };
        return fatal(client, e.to_string());
    }
    use crate::cluster::replica::SubRoute;
    // A replicated topic's consumers are served by its leader only, and a member that
    // stops leading closes them; leadership can move during the awaits before the
    // client joins the channel (the channel's creation through the group, the store's
    // preparation), so the route is taken again until the member that subscribes the
    // client here still leads when it does.
    let mut routes = 0;
    loop {
        routes += 1;
        match crate::cluster::replica::subscribe(server, topic, channel).await {
            Some(Err(SubRoute::Refused(e))) => return fatal(client, e),
            Some(Err(SubRoute::Relay)) => {
                // Another member's relay reached a member that does not lead (its view
                // of the leader was stale): refused, and it asks the leader itself.
                if crate::cluster::relay::is_member_relay(client) {
                    // Part of a failover or a move (the relay asks again until it finds
                    // the leader), not a client's error: logged at INFO, with the same
                    // error frame.
                    let text =
                        format!("E_SUB_FAILED SUB failed this member does not lead topic {topic}");
                    log::info!(
                        "[{}] - another member's relay reached this member before it leads the topic; it asks again: {text}",
                        client.remote_address()
                    );
                    client.send_frame(FRAME_ERROR, text.as_bytes());
                    return Err(Fatal);
                }
                match crate::cluster::relay::subscribe(server, client, topic, channel).await {
                    Ok(true) => {
                        client.send_frame(FRAME_RESPONSE, b"OK");
                        return Ok(());
                    }
                    // This member leads the topic by now: subscribed here.
                    Ok(false) => {}
                    Err(e) => return fatal(client, e),
                }
            }
            None | Some(Ok(())) => {}
        }
        server.shard.prepare_store(topic).await;
        if crate::cluster::replica::serves_consumers(server, topic) {
            break;
        }
        if routes == SUB_ROUTES {
            return fatal(
                client,
                format!("E_SUB_FAILED SUB failed topic {topic} has no leader"),
            );
        }
    }
    // No await between the check above and the client joining the channel.
    match server.shard.subscribe(client, topic, channel) {
        Err(e @ SubError::Draining { .. }) => return fatal(client, e.to_string()),
        Err(e) => return fatal(client, format!("E_SUB_FAILED SUB failed {e}")),
        // A new durable channel: answered once the metadata on disk has it.
        Ok(true) => Box::pin(server.shard.persist_changes()).await,
        Ok(false) => {}
    }
    client.send_frame(FRAME_RESPONSE, b"OK");
    Ok(())
}

/// Sets the client's RDY count (range-checked by the decoder); a client that is no
/// longer ready gets its buffered output flushed (nsqd: RDY, then messagePump's flush).
pub(super) fn rdy(server: &Server, client: &Rc<Client>, count: i64) {
    client.set_ready_count(count);
    if !client.is_ready() && !client.outbox().buf().is_empty() {
        client.outbox().request_flush();
    }
    server.shard.client_ready_changed(client);
}

/// Stops deliveries and answers `CLOSE_WAIT`; the client closes the connection.
pub(super) fn cls(client: &Client) {
    client.set_ready_count(0);
    client.set_state(ClientState::Closing);
    client.send_frame(FRAME_RESPONSE, b"CLOSE_WAIT");
}
