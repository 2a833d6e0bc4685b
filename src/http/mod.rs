//! nsqd's HTTP API on every shard (nsqd: http.go, internal/http_api): request parsing
//! with httparse, keep-alive, and responses with Go's header layout so that bytes match
//! a real nsqd (apart from the Date value).
//!
//! `server` runs the connection loop and writes responses; this module routes a request
//! to its handler: `publish` (/pub, /mpub), `admin` (topic and channel actions), `stats`
//! (/info, /stats, the page), `config` (/config/:opt).

use crate::server::Server;
use crate::stats::render as stats_render;
use crate::tcp::SharedStream;
use crate::timefmt;
use bytes::{Bytes, BytesMut};
use glommio::net::{TcpListener, TcpStream};
use nsq_shards::mesh::{AdminError, AdminOp, SeekTo};
use nsq_shards::names::{is_valid_channel_name, is_valid_topic_name};
use nsq_shards::stats::StatsRequest;
use nsq_wire::http1::{self, Params};
/// Go's url.ParseQuery, shared with nsqlookupd (public for the fuzz targets).
pub use nsq_wire::http1::{parse_query, BadQuery};
use nsq_wire::identify::VERSION;
use std::rc::Rc;
use std::time::{Duration, Instant};

mod admin;
mod config;
mod inspect;
mod publish;
mod router;
mod server;
mod stats;

use admin::*;
use config::*;
use publish::*;
pub use publish::{parse_mpub_body, MpubParse};
pub use server::{accept_loop, accept_loop_tls, parse_head, Head, HeadError, Response};
use stats::*;
pub use stats::{health, SHARDS_PAGE};

/// Routes whose handler never reads the query string (nsqd: doPing, doInfo, doConfig,
/// and this broker's /metrics and /shards), so a malformed one is not an error there.
pub(super) fn ignores_query(path: &str) -> bool {
    matches!(path, "/ping" | "/info" | "/metrics" | "/shards") || path.starts_with("/config/")
}

/// nsqd's boolParams: true/1 and false/0; anything else is unknown.
pub(super) fn bool_param(v: Option<&str>) -> Option<bool> {
    match v? {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

pub(super) fn method_not_allowed(allowed: &[&str]) -> Response {
    let mut r = Response::v1_err(405, "METHOD_NOT_ALLOWED");
    let mut list: Vec<&str> = allowed.to_vec();
    list.push("OPTIONS");
    list.sort();
    r.headers.insert(0, ("Allow", list.join(", ")));
    r
}

/// Whether nsqd's handler for this request reads the body before it answers anything
/// (what decides when Go sends `100 Continue`): doPUB and doConfig's PUT at once,
/// doMPUB once its query and topic are good.
pub(super) fn reads_body_first(head: &Head) -> bool {
    match (head.method.as_str(), head.path.as_str()) {
        ("POST", "/pub") => true,
        ("PUT", p) => router::has_route("PUT", p),
        ("POST", "/mpub") => parse_query(&head.query)
            .ok()
            .is_some_and(|p| topic_param(&Params(p), true).is_ok()),
        _ => false,
    }
}

/// Answers one request. `body_failed`: the body ended in an error (malformed chunked
/// framing or EOF) after the bytes in `body`; the handlers that read the body answer as
/// nsqd's do when their read fails (500 INTERNAL_ERROR, or the error the bytes before
/// it give), the others ignore it.
pub(super) async fn route(
    server: &Rc<Server>,
    head: &Head,
    body: Bytes,
    body_failed: bool,
) -> Response {
    if !router::has_route(&head.method, &head.path) {
        let allowed = router::allowed_methods(&head.path);
        if let Some(r) = router::redirect(&head.method, &head.path, &head.query) {
            return r;
        }
        if head.method == "OPTIONS" && !allowed.is_empty() {
            let mut list: Vec<&str> = allowed.to_vec();
            list.push("OPTIONS");
            list.sort();
            return Response {
                status: 200,
                headers: vec![("Allow", list.join(", "))],
                body: Vec::new(),
                sniffed_type: None,
                close: false,
                http10: false,
                keep_alive_header: false,
                body_read: None,
            };
        }
        if allowed.is_empty() {
            return Response::v1_err(404, "NOT_FOUND");
        }
        return method_not_allowed(&allowed);
    }
    // nsqd's doPUB and doConfig (PUT) read the body before anything else.
    if head.path == "/pub" {
        if let Some(r) = pub_body_error(&server.shard.opts, &body, body_failed) {
            return r;
        }
    }
    if head.method == "PUT" && body_failed {
        return config_body_error(&server.shard.opts, &body);
    }
    let params = match parse_query(&head.query) {
        Ok(p) => Params(p),
        // nsqd parses the query only in handlers that read it (http_api.NewReqParams):
        // /ping, /info and /config answer whatever the query holds.
        Err(BadQuery) if ignores_query(&head.path) => Params(Vec::new()),
        Err(BadQuery) => return Response::v1_err(400, "INVALID_REQUEST"),
    };
    match head.path.as_str() {
        "/ping" => match health(server).await {
            None => Response::plain(200, b"OK".to_vec()),
            Some(e) => Response::plain(500, format!("NOK - {e}").into_bytes()),
        },
        "/info" => info(server),
        "/cluster" => match server.cluster_state().await {
            Some(v) => Response::v1_json(v.to_string().into_bytes()),
            None => Response::v1_err(404, "NOT_FOUND"),
        },
        "/pub" => do_pub(server, &params, body).await,
        "/mpub" => do_mpub(server, &params, body, body_failed).await,
        "/stats" => do_stats(server, &params).await,
        "/metrics" => {
            let req = StatsRequest {
                include_clients: false,
                ..Default::default()
            };
            let shards = server.gather_stats(&req).await;
            let mut text = crate::stats::prometheus::prometheus(&shards, server.cfg.start_time);
            if let Some(state) = server.cluster_state().await {
                text.push_str(&crate::stats::prometheus::cluster_metrics(&state));
            }
            let mut r = Response::plain(200, text.into_bytes());
            r.sniffed_type = None;
            r.headers.push((
                "Content-Type",
                "text/plain; version=0.0.4; charset=utf-8".into(),
            ));
            r
        }
        "/shards" => {
            let req = StatsRequest {
                counters_only: true,
                ..Default::default()
            };
            let shards = server.gather_stats(&req).await;
            /// A shard's counters plus the names of its topics.
            #[derive(serde::Serialize)]
            struct ShardView<'a> {
                #[serde(flatten)]
                counters: &'a nsq_shards::stats::ShardCounters,
                topic_names: &'a [String],
            }
            let view: Vec<_> = shards
                .iter()
                .map(|s| ShardView {
                    counters: &s.counters,
                    topic_names: &s.topic_names,
                })
                .collect();
            Response::v1_json(nsq_wire::json::to_vec_go(&view))
        }
        "/" => shards_page(),
        "/message" => inspect::do_message(server, &params).await,
        "/messages" => inspect::do_messages(server, &params).await,
        "/topic/create" => match topic_param(&params, true) {
            Err(r) => r,
            // nsqd answers 200 whatever happened, except that a drain refuses a new
            // topic (503 EXITING, as nsqd's draining prototype).
            Ok(t) => match server.admin(AdminOp::CreateTopic(t)).await {
                Err(AdminError::Draining) => Response::v1_err(503, "EXITING"),
                _ => Response::v1_empty(),
            },
        },
        "/topic/delete" => match topic_param(&params, false) {
            Err(r) => r,
            Ok(t) => admin(server, AdminOp::DeleteTopic(t)).await,
        },
        "/topic/empty" => match topic_param(&params, true) {
            Err(r) => r,
            Ok(t) => admin(server, AdminOp::EmptyTopic(t)).await,
        },
        "/topic/move-leader" => move_leader(server, &params).await,
        "/topic/pause" | "/topic/unpause" => match topic_param(&params, false) {
            Err(r) => r,
            Ok(t) => admin(server, AdminOp::PauseTopic(t, head.path == "/topic/pause")).await,
        },
        p if p.starts_with("/channel/") => {
            let (t, c) = match topic_channel_params(&params) {
                Ok(v) => v,
                Err(r) => return r,
            };
            let op = match p {
                "/channel/create" => AdminOp::CreateChannel(t, c),
                "/channel/delete" => AdminOp::DeleteChannel(t, c),
                "/channel/empty" => AdminOp::EmptyChannel(t, c),
                "/channel/pause" => AdminOp::PauseChannel(t, c, true),
                "/channel/seek" => match seek_param(&params) {
                    Ok(to) => AdminOp::SeekChannel(t, c, to),
                    Err(r) => return r,
                },
                "/channel/max-attempts" => match max_attempts_param(&params, &t) {
                    Ok(n) => AdminOp::ChannelMaxAttempts(t, c, n),
                    Err(r) => return r,
                },
                "/channel/rate-limit" => match rate_limit_param(&params) {
                    Ok(r) => AdminOp::ChannelRateLimit(t, c, r),
                    Err(r) => return r,
                },
                _ => AdminOp::PauseChannel(t, c, false),
            };
            admin(server, op).await
        }
        _ => do_config(server, head, &body).await,
    }
}

/// `POST /topic/move-leader?topic=&to=HOST:PORT` (a cluster only; docs/replication.md):
/// answered once the member whose `--cluster-address` is `to` leads the topic.
async fn move_leader(server: &Server, params: &Params) -> Response {
    if server.cluster.is_none() {
        return Response::v1_err(404, "NOT_FOUND");
    }
    let topic = match topic_param(params, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Some(to) = params.get("to").filter(|t| !t.is_empty()) else {
        return Response::v1_err(400, "MISSING_ARG_TO");
    };
    match server.move_leader(&topic, to).await {
        Ok(()) => Response::v1_empty(),
        Err(e) => {
            let (code, text) = e.code();
            Response::v1_err(code, text)
        }
    }
}

pub(super) fn topic_param(p: &Params, validate: bool) -> Result<String, Response> {
    let t = p
        .get("topic")
        .ok_or_else(|| Response::v1_err(400, "MISSING_ARG_TOPIC"))?;
    if validate && !is_valid_topic_name(t) {
        return Err(Response::v1_err(400, "INVALID_TOPIC"));
    }
    Ok(t.to_string())
}

/// nsqd http_api.GetTopicChannelArgs.
pub(super) fn topic_channel_params(p: &Params) -> Result<(String, String), Response> {
    let t = p
        .get("topic")
        .ok_or_else(|| Response::v1_err(400, "MISSING_ARG_TOPIC"))?;
    if !is_valid_topic_name(t) {
        return Err(Response::v1_err(400, "INVALID_ARG_TOPIC"));
    }
    let c = p
        .get("channel")
        .ok_or_else(|| Response::v1_err(400, "MISSING_ARG_CHANNEL"))?;
    if !is_valid_channel_name(c) {
        return Err(Response::v1_err(400, "INVALID_ARG_CHANNEL"));
    }
    Ok((t.to_string(), c.to_string()))
}
