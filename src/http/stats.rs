//! GET /info, /stats, nsqd's health, and this broker's live page at / (nsqd: http.go
//! doInfo, doStats).

use super::*;

pub(super) fn info(server: &Server) -> Response {
    let c = &server.cfg;
    let o = &server.shard.opts;
    #[derive(serde::Serialize)]
    struct Info<'a> {
        version: &'a str,
        broadcast_address: &'a str,
        hostname: &'a str,
        http_port: u16,
        tcp_port: u16,
        start_time: i64,
        max_heartbeat_interval: u128,
        max_output_buffer_size: i64,
        max_output_buffer_timeout: u128,
        max_deflate_level: i64,
        /// Beyond nsqd (RFC nsqio/nsq#1302): `true` while the node drains, absent
        /// otherwise (nsqd's keys stay as they are).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        draining: bool,
    }
    let i = Info {
        version: VERSION,
        broadcast_address: &c.broadcast_address,
        hostname: &c.hostname,
        http_port: server.http_port,
        tcp_port: server.tcp_port,
        start_time: c.start_time,
        max_heartbeat_interval: o.identify.max_heartbeat_interval.as_nanos(),
        max_output_buffer_size: o.identify.max_output_buffer_size,
        max_output_buffer_timeout: o.identify.max_output_buffer_timeout.as_nanos(),
        max_deflate_level: o.identify.max_deflate_level,
        draining: crate::runtime::drain::draining() || server.shard.node.draining(),
    };
    Response::v1_json(nsq_wire::json::to_vec_go(&i))
}

/// The live per-shard page (beyond nsqd, which answers 404 at `/`): one self-contained
/// HTML file with inline CSS and JS, embedded in the binary, that polls `/shards` and
/// `/stats` every second.
pub const SHARDS_PAGE: &str = include_str!("../page/shards.html");

pub(super) fn shards_page() -> Response {
    Response {
        status: 200,
        headers: vec![
            ("Cache-Control", "no-cache".into()),
            ("Content-Type", "text/html; charset=utf-8".into()),
        ],
        body: SHARDS_PAGE.as_bytes().to_vec(),
        sniffed_type: None,
        close: false,
        http10: false,
        keep_alive_header: false,
        body_read: None,
    }
}

/// The first disk error any shard reports (nsqd's health), or `None` when healthy.
pub async fn health(server: &Server) -> Option<String> {
    let req = StatsRequest {
        counters_only: true,
        ..Default::default()
    };
    let shards = server.gather_stats(&req).await;
    shards.into_iter().find_map(|s| s.counters.health_error)
}

pub(super) async fn do_stats(server: &Server, p: &Params) -> Response {
    let req = StatsRequest {
        topic: p.get("topic").unwrap_or("").to_string(),
        channel: p.get("channel").unwrap_or("").to_string(),
        include_clients: bool_param(p.get("include_clients")).unwrap_or(true),
        counters_only: false,
    };
    let include_mem = bool_param(p.get("include_mem")).unwrap_or(true);
    let shards = server.gather_stats(&req).await;
    if p.get("format") == Some("json") {
        let mut cluster = server.cluster_state().await;
        // `topic=` narrows the cluster document's topics as it narrows nsqd's.
        if !req.topic.is_empty() {
            if let Some(topics) = cluster
                .as_mut()
                .and_then(|c| c.get_mut("topics"))
                .and_then(|t| t.as_array_mut())
            {
                topics.retain(|t| t["topic"] == req.topic.as_str());
            }
        }
        Response::v1_json(stats_render::json(
            server,
            &req,
            &shards,
            include_mem,
            cluster,
        ))
    } else {
        Response::v1_text(stats_render::text(server, &req, &shards, include_mem))
    }
}
