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
    let wire = wire_of(frame, std::slice::from_ref(&body));
    let bodies = vec![frame.slice(body)];
    publish(server, client, topic, bodies, wire, None, PublishOp::Pub).await
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
    let wire = wire_of(frame, std::slice::from_ref(&body));
    let bodies = vec![frame.slice(body)];
    let defer = (defer_ms > 0).then(|| Instant::now() + Duration::from_millis(defer_ms as u64));
    publish(server, client, topic, bodies, wire, defer, PublishOp::Dpub).await
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
    let wire = wire_of(frame, &bodies);
    let bodies = bodies.into_iter().map(|r| frame.slice(r)).collect();
    publish(server, client, topic, bodies, wire, None, PublishOp::Mpub).await
}

/// The frame's message part that holds `bodies` (in frame order, each after its 4-byte
/// size, as the decoder found them): from the first body's size to the last body's
/// end, or `None` if something lies between them.
fn wire_of(frame: &Bytes, bodies: &[Range<usize>]) -> Option<Bytes> {
    let start = bodies.first()?.start.checked_sub(4)?;
    let mut end = start;
    for b in bodies {
        if b.start != end + 4 {
            return None;
        }
        end = b.end;
    }
    (end <= frame.len()).then(|| frame.slice(start..end))
}

/// Publishes `bodies` (with `wire`, see [`Server::publish_frame`]) to `topic` (on its
/// owner) and queues `OK`, or fails fatally with `E_PUB_FAILED PUB failed <reason>` (or
/// MPUB's, DPUB's).
async fn publish(
    server: &Rc<Server>,
    client: &Client,
    topic: &str,
    bodies: Vec<Bytes>,
    wire: Option<Bytes>,
    defer: Option<Instant>,
    op: PublishOp,
) -> Result<(), Fatal> {
    let n = bodies.len() as u64;
    match server.publish_frame(topic, bodies, wire, defer).await {
        Ok(()) => {
            client.count_publish(topic, n);
            client.send_frame(FRAME_RESPONSE, b"OK");
            Ok(())
        }
        Err(e) => fatal(client, publish_failed(op, &e.text())),
    }
}

#[cfg(test)]
mod tests {
    use super::wire_of;
    use bytes::Bytes;
    use nsq_replication::{Entry, Message};
    use nsq_wire::v2::{decode, Command, Context, Limits};

    fn decoded(frame: &[u8]) -> Command {
        let ctx = Context {
            state: nsq_shards::ClientState::Init,
            heartbeats_enabled: true,
            limits: Limits::default(),
            eof: true,
        };
        match decode(frame, &ctx) {
            Ok(Some((command, _))) => command,
            other => panic!("{other:?}"),
        }
    }

    /// Whether the leader proposes `bodies` with `wire` as the Raft entry's data.
    fn proposed_uncopied(frame: &Bytes, bodies: &[std::ops::Range<usize>]) -> bool {
        let Some(wire) = wire_of(frame, bodies) else {
            return false;
        };
        let entry = Entry::PublishAt {
            base: 0,
            messages: bodies
                .iter()
                .map(|r| Message {
                    id: [b'0'; 16],
                    timestamp_ns: 1,
                    attempts: 0,
                    defer_ms: 0,
                    body: frame.slice(r.clone()),
                })
                .collect(),
        };
        let (_, data) = entry.encode_raft(Some(&wire));
        data.as_ptr() == wire.as_ptr() && data.len() == wire.len()
    }

    #[test]
    fn pub_dpub_and_mpub_frames_are_proposed_uncopied() {
        let frame = Bytes::from_static(b"PUB t\n\0\0\0\x05hello");
        let Command::Pub { body, .. } = decoded(&frame) else {
            panic!()
        };
        assert!(proposed_uncopied(&frame, &[body]));
        let frame = Bytes::from_static(b"DPUB t 100\n\0\0\0\x02hi");
        let Command::Dpub { body, .. } = decoded(&frame) else {
            panic!()
        };
        assert!(proposed_uncopied(&frame, &[body]));
        let frame = Bytes::from_static(b"MPUB t\n\0\0\0\x12\0\0\0\x02\0\0\0\x03one\0\0\0\x03two");
        let Command::Mpub { bodies, .. } = decoded(&frame) else {
            panic!()
        };
        assert_eq!(bodies.len(), 2);
        assert!(proposed_uncopied(&frame, &bodies));
        // Bodies that are not back to back after their sizes have no wire.
        assert!(wire_of(&frame, &[bodies[1].clone(), bodies[0].clone()]).is_none());
        assert!(wire_of(&frame, &[]).is_none());
    }
}
