//! The topic and channel admin routes: create, delete, empty, pause, unpause and this
//! broker's /channel/seek (nsqd: http.go doCreateTopic ... doPauseChannel).

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

pub(super) async fn admin(server: &Server, op: AdminOp) -> Response {
    match server.admin(op).await {
        Ok(()) => Response::v1_empty(),
        Err(AdminError::TopicNotFound) => Response::v1_err(404, "TOPIC_NOT_FOUND"),
        Err(AdminError::ChannelNotFound) => Response::v1_err(404, "CHANNEL_NOT_FOUND"),
        Err(AdminError::Internal) => Response::v1_err(500, "INTERNAL_ERROR"),
        Err(AdminError::Exiting | AdminError::Draining) => Response::v1_err(503, "EXITING"),
    }
}
