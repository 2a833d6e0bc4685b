//! PUB, DPUB and MPUB (nsqd: protocol_v2.go PUB, DPUB, MPUB).
//!
//! ```text
//! PUB <topic_name>\n
//! [ 4-byte size in bytes ][ N-byte binary data ]
//!
//! DPUB <topic_name> <defer_time>\n
//! [ 4-byte size in bytes ][ N-byte binary data ]
//!
//! MPUB <topic_name>\n
//! [ 4-byte body size ][ 4-byte num messages ]
//! [ 4-byte message #1 size ][ N-byte binary data ] ...
//! ```
//!
//! A connection's first publish moves it to the topic's owning shard (see
//! [`crate::tcp::handoff`]); later ones to other topics cross the mesh.

use super::{fatal, Fatal};
use crate::server::Server;
use bytes::Bytes;
use nsq_shards::client::Client;
use nsq_wire::errors::{publish_failed, PublishOp};
use nsq_wire::v2::FRAME_RESPONSE;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// PUB: one message, after the auth check.
pub(super) async fn pub_(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    frame: &Bytes,
    body: Range<usize>,
) -> Result<(), Fatal> {
    if let Err(e) = crate::auth::check(&server.cfg.auth, client, "PUB", topic, "").await {
        return fatal(client, e.to_string());
    }
    let bodies = vec![frame.slice(body)];
    publish(server, client, topic, bodies, None, PublishOp::Pub).await
}

/// DPUB: one message deferred by `defer_ms` (range-checked by the decoder).
pub(super) async fn dpub(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    frame: &Bytes,
    body: Range<usize>,
    defer_ms: i64,
) -> Result<(), Fatal> {
    if let Err(e) = crate::auth::check(&server.cfg.auth, client, "DPUB", topic, "").await {
        return fatal(client, e.to_string());
    }
    let bodies = vec![frame.slice(body)];
    let defer = (defer_ms > 0).then(|| Instant::now() + Duration::from_millis(defer_ms as u64));
    publish(server, client, topic, bodies, defer, PublishOp::Dpub).await
}

/// MPUB: its auth check ran before its body was decoded (see the reader loop in
/// [`crate::tcp::conn`]).
pub(super) async fn mpub(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    frame: &Bytes,
    bodies: Vec<Range<usize>>,
) -> Result<(), Fatal> {
    let bodies = bodies.into_iter().map(|r| frame.slice(r)).collect();
    publish(server, client, topic, bodies, None, PublishOp::Mpub).await
}

/// Publishes `bodies` to `topic` (on its owner) and queues `OK`, or fails fatally with
/// `E_PUB_FAILED PUB failed <reason>` (or MPUB's, DPUB's).
async fn publish(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    bodies: Vec<Bytes>,
    defer: Option<Instant>,
    op: PublishOp,
) -> Result<(), Fatal> {
    let n = bodies.len() as u64;
    match server.publish(topic, bodies, defer).await {
        Ok(()) => {
            client.count_publish(topic, n);
            client.send_frame(FRAME_RESPONSE, b"OK");
            Ok(())
        }
        Err(e) => fatal(client, publish_failed(op, &e.text())),
    }
}
