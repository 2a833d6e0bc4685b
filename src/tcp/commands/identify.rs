//! IDENTIFY and AUTH (nsqd: protocol_v2.go IDENTIFY and AUTH).
//!
//! ```text
//! IDENTIFY\n
//! [ 4-byte size in bytes ][ N-byte JSON data ]
//!
//! AUTH\n
//! [ 4-byte size in bytes ][ N-byte secret ]
//! ```

use super::{fatal, Fatal, Upgrade};
use crate::server::Server;
use crate::tcp::conn::apply_deadlines;
use crate::tcp::stream::SharedStream;
use nsq_shards::client::{Client, Compression, OutputTicker};
use nsq_wire::identify::{apply_identify, identify_response_at};
use nsq_wire::v2::FRAME_RESPONSE;
use std::time::Instant;

/// Applies the client's IDENTIFY settings and queues the reply: `OK`, or the negotiated
/// settings as JSON when the client asked for `feature_negotiation`. Returns the upgrade
/// (TLS, compression) the reply announced; the caller performs it.
pub(super) fn identify(
    server: &Server,
    stream: &SharedStream,
    client: &Client,
    body: &[u8],
) -> Result<Upgrade, Fatal> {
    let shard = &server.shard;
    let negotiated = {
        let mut s = client.settings_mut();
        match apply_identify(body, &mut s, &shard.opts) {
            Ok(n) => {
                // Topology-aware consumption: the client's delivery rank (0 when off).
                let t = &mut s.topology;
                t.rank = shard.opts.topology.rank(&t.region, &t.zone);
                n
            }
            Err(e) => {
                drop(s);
                return fatal(client, format!("{} {}", e.code, e.text));
            }
        }
    };
    apply_deadlines(stream, client);
    // nsqd's messagePump makes a new output-buffer ticker at IDENTIFY.
    let obt = client.settings().pump.output_buffer_timeout;
    client
        .outbox()
        .set_ticker(OutputTicker::new(Instant::now(), obt));
    if !negotiated.negotiate {
        client.send_frame(FRAME_RESPONSE, b"OK");
        return Ok(Upgrade::None);
    }
    if negotiated.snappy && negotiated.deflate {
        return fatal(
            client,
            "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression".into(),
        );
    }
    let current = client.compression();
    let mut shown = negotiated;
    // A TLS connection is not upgraded twice (a repeated IDENTIFY).
    let tls = negotiated.tls_v1 && server.cfg.tls.is_some() && !stream.is_tls();
    shown.tls_v1 = tls;
    if current != Compression::None {
        // Already compressed (a repeated IDENTIFY): no second upgrade.
        shown.snappy = current == Compression::Snappy;
        shown.deflate = matches!(current, Compression::Deflate(_));
    }
    let topology = &shard.opts.topology;
    let resp = identify_response_at(
        &client.settings(),
        &shard.opts,
        &shown,
        server.cfg.auth.enabled(),
        (&topology.region, &topology.zone),
    );
    client.send_frame(FRAME_RESPONSE, &resp);
    let want = if current != Compression::None {
        Compression::None
    } else if negotiated.snappy {
        Compression::Snappy
    } else if negotiated.deflate {
        Compression::Deflate(negotiated.deflate_level.clamp(1, 9) as u32)
    } else {
        Compression::None
    };
    if tls {
        return Ok(Upgrade::Tls(want));
    }
    if want != Compression::None {
        // nsqd: the JSON reply goes out plain, then an OK over the new transport.
        client.set_compression(want);
        let out = client.outbox();
        out.set_compress_from(Some(out.buf().len()));
        client.send_frame(FRAME_RESPONSE, b"OK");
        return Ok(Upgrade::Compression);
    }
    Ok(Upgrade::None)
}

/// Asks the auth server about `secret` and queues its reply (nsqd: AUTH).
pub(super) async fn auth(server: &Server, client: &Client, secret: &[u8]) -> Result<(), Fatal> {
    match crate::auth::auth(&server.cfg.auth, client, secret).await {
        Ok(resp) => {
            client.send_frame(FRAME_RESPONSE, &resp);
            Ok(())
        }
        Err(e) => fatal(client, e.to_string()),
    }
}
