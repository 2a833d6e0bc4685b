//! GET and PUT /config/:opt (nsqd: http.go doConfig).

use super::*;

/// nsqd's log level for /config: 1 debug .. 5 fatal. `set` is the level a PUT set (0
/// until one did: then the command line's level applies), from the node-wide settings
/// (a PUT may land on any shard: see `nsq_shards::node`).
pub(super) fn log_level_number(c: &crate::config::Config, set: u8) -> u8 {
    match set {
        // The level as given (flag or file): `fatal` is 5, though it logs as `error`.
        0 => match c.option("log_level") {
            Some(crate::config_file::GoValue::Int(n @ 1..=5)) => *n as u8,
            _ => match c.log_level {
                log::LevelFilter::Debug | log::LevelFilter::Trace => 1,
                log::LevelFilter::Info => 2,
                log::LevelFilter::Warn => 3,
                _ => 4,
            },
        },
        n => n,
    }
}

/// GET and PUT /config/:opt (nsqd: http.go doConfig). PUT changes
/// `nsqlookupd_tcp_addresses` (a JSON array; shard 0 then adds and removes lookupd peers)
/// and `log_level` (debug/info/warn/error/fatal), then answers the new value like GET.
/// doConfig's PUT when reading the body failed: 413 INVALID_VALUE if more than
/// --max-msg-size had arrived (Go's LimitReader stops before the error), else 500
/// INTERNAL_ERROR.
pub(super) fn config_body_error(o: &nsq_shards::Options, body: &[u8]) -> Response {
    if body.len() as i64 > o.max_msg_size {
        Response::v1_err(413, "INVALID_VALUE")
    } else {
        Response::v1_err(500, "INTERNAL_ERROR")
    }
}

pub(super) async fn do_config(server: &Server, head: &Head, body: &[u8]) -> Response {
    let opt = &head.path["/config/".len()..];
    if head.method == "PUT" && matches!(opt, "drain" | "shutdown") {
        return lifecycle(server, opt).await;
    }
    if head.method == "PUT" {
        let read_max = server.shard.opts.max_msg_size + 1;
        if body.len() as i64 >= read_max || body.is_empty() {
            return Response::v1_err(413, "INVALID_VALUE");
        }
        // Which options a PUT may change is part of their declaration (`nsqd_options!`).
        if !crate::config_file::spec(opt).is_some_and(|o| o.put_at_run_time) {
            return Response::v1_err(400, "INVALID_OPTION");
        }
        match opt {
            "nsqlookupd_tcp_addresses" => {
                let Ok(addrs) = serde_json::from_slice::<Option<Vec<String>>>(body) else {
                    return Response::v1_err(400, "INVALID_VALUE");
                };
                crate::lookupd_client::set_peer_addresses(server, addrs).await;
            }
            "log_level" => {
                let text = String::from_utf8_lossy(body);
                let (n, level) = match text.to_lowercase().as_str() {
                    "debug" => (1, log::LevelFilter::Debug),
                    "info" => (2, log::LevelFilter::Info),
                    "warn" => (3, log::LevelFilter::Warn),
                    "error" => (4, log::LevelFilter::Error),
                    "fatal" => (5, log::LevelFilter::Error),
                    _ => return Response::v1_err(400, "INVALID_VALUE"),
                };
                server
                    .change_node_settings(nsq_shards::node::NodeUpdate::LogLevel(n))
                    .await;
                log::set_max_level(level);
            }
            _ => return Response::v1_err(400, "INVALID_OPTION"),
        }
    }
    let c = &server.cfg;
    let raw = |s: &str| Response::v1_text(s.as_bytes().to_vec());
    // Options nsqd changes after start: PUT-able ones, the ports resolved from the
    // listeners (nsqd.New) and the statsd prefix with `%s` replaced.
    let v: serde_json::Value = match opt {
        "nsqlookupd_tcp_addresses" => crate::lookupd_client::peer_addresses_json(server),
        "log_level" => log_level_number(c, server.shard.node.log_level()).into(),
        "statsd_prefix" => return raw(&crate::stats::statsd::server_prefix(server)),
        "broadcast_tcp_port" if c.flags.broadcast_tcp_port == 0 => server.tcp_port.into(),
        "broadcast_http_port" if c.flags.broadcast_http_port == 0 => server.http_port.into(),
        _ => {
            let Some(value) = c.option(opt) else {
                return Response::v1_err(400, "INVALID_OPTION");
            };
            return match value.config_body() {
                (true, text) => raw(&text),
                (false, json) => Response::v1_json(json.into_bytes()),
            };
        }
    };
    Response::v1_json(nsq_wire::json::to_vec_go(&v))
}

/// `PUT /config/drain` and `PUT /config/shutdown` (nsqd RFC nsqio/nsq#1302; not options:
/// GET answers 400 INVALID_OPTION for them as for any unknown name; the body is
/// ignored). `drain` starts the drain (again: nothing changes) and answers 200 with an
/// empty body once every shard refuses publishes and new topics and channels;
/// `shutdown` answers 200 and then starts the clean shutdown (also during a drain).
async fn lifecycle(server: &Server, what: &str) -> Response {
    if what == "shutdown" {
        crate::runtime::drain::request_shutdown();
    } else {
        crate::runtime::drain::start_drain("PUT /config/drain");
        server
            .change_node_settings(nsq_shards::node::NodeUpdate::Drain)
            .await;
    }
    Response::v1_empty()
}
