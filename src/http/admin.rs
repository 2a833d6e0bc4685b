//! The topic and channel admin routes: create, delete, empty, pause, unpause and this
//! broker's /channel/seek, /channel/max-attempts and /channel/rate-limit (nsqd: http.go
//! doCreateTopic ... doPauseChannel).

use super::*;

/// Where `POST /channel/seek` goes (beyond nsqd), checked after topic and channel as
/// nsqd checks its arguments in order: `timestamp` (Unix seconds, fractions allowed, or
/// RFC 3339; see [`timefmt::parse_time_ns`]) or `position` (`oldest` / `newest`), exactly
/// one of them. 400 MISSING_ARG_TIMESTAMP when neither is given, INVALID_ARG_TIMESTAMP
/// for a time that does not parse, INVALID_ARG_POSITION for another position or when
/// both are given.
pub(super) fn seek_param(p: &Params) -> Result<SeekTo, Response> {
    match (p.get("timestamp"), p.get("position")) {
        (None, None) => Err(Response::v1_err(400, "MISSING_ARG_TIMESTAMP")),
        (Some(_), Some(_)) => Err(Response::v1_err(400, "INVALID_ARG_POSITION")),
        (Some(ts), None) => timefmt::parse_time_ns(ts)
            .map(SeekTo::Timestamp)
            .ok_or_else(|| Response::v1_err(400, "INVALID_ARG_TIMESTAMP")),
        (None, Some("oldest")) => Ok(SeekTo::Oldest),
        (None, Some("newest")) => Ok(SeekTo::Newest),
        (None, Some(_)) => Err(Response::v1_err(400, "INVALID_ARG_POSITION")),
    }
}

/// The `n` of `POST /channel/max-attempts` (beyond nsqd), checked after topic and
/// channel: deliveries after which a message goes to `<topic>.dead` (0 = unlimited on
/// this channel, 1 to 65535) or `default` to follow `--max-attempts` again (`None`).
/// 400 MISSING_ARG_N without it, INVALID_ARG_N for anything else, and
/// DEAD_LETTER_UNAVAILABLE when `topic` can have no dead-letter topic
/// ([`nsq_shards::channel::dead_letter_topic`]: `#ephemeral`, itself `*.dead`, or
/// `<topic>.dead` over 64 characters).
pub(super) fn max_attempts_param(p: &Params, topic: &str) -> Result<Option<u16>, Response> {
    let n = match p.get("n") {
        None => return Err(Response::v1_err(400, "MISSING_ARG_N")),
        Some("default") => None,
        Some(s) => Some(
            s.parse::<u16>()
                .map_err(|_| Response::v1_err(400, "INVALID_ARG_N"))?,
        ),
    };
    if nsq_shards::channel::dead_letter_topic(topic).is_none() {
        return Err(Response::v1_err(400, "DEAD_LETTER_UNAVAILABLE"));
    }
    Ok(n)
}

/// The `msgs_per_sec` of `POST /channel/rate-limit` (beyond nsqd), checked after topic
/// and channel: messages a second across the channel's consumers, 0 to 4294967295 (0
/// removes the limit). 400 MISSING_ARG_MSGS_PER_SEC without it, INVALID_ARG_MSGS_PER_SEC
/// for anything else.
pub(super) fn rate_limit_param(p: &Params) -> Result<u32, Response> {
    p.get("msgs_per_sec")
        .ok_or_else(|| Response::v1_err(400, "MISSING_ARG_MSGS_PER_SEC"))?
        .parse::<u32>()
        .map_err(|_| Response::v1_err(400, "INVALID_ARG_MSGS_PER_SEC"))
}

pub(super) async fn admin(server: &Server, op: AdminOp) -> Response {
    match server.admin(op).await {
        Ok(()) => Response::v1_empty(),
        Err(AdminError::TopicNotFound) => Response::v1_err(404, "TOPIC_NOT_FOUND"),
        Err(AdminError::ChannelNotFound) => Response::v1_err(404, "CHANNEL_NOT_FOUND"),
        Err(AdminError::Internal) => Response::v1_err(500, "INTERNAL_ERROR"),
        Err(AdminError::Exiting | AdminError::Draining) => Response::v1_err(503, "EXITING"),
    }
}
