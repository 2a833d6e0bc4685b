//! `GET /message` and `GET /messages` (beyond nsqd; docs/inspecting-messages.md): a
//! message by ID with its state on every channel, and the messages a channel would
//! deliver next, read without changing anything. The topic's owner answers
//! ([`Server::inspect`]).
//!
//! A message is shown as `{"id", "timestamp", "attempts", "body", "body_text"}`: `id`
//! the 16 hex characters of the message frame, `timestamp` its publish time in Unix ns,
//! `body` the body in standard base64 (with padding), `body_text` the body as text when
//! it is valid UTF-8 (absent otherwise).

use super::{topic_channel_params, topic_param, Response};
use crate::server::Server;
use nsq_shards::message::{Message, MessageId};
use nsq_shards::shard::inspect::{InspectAnswer, InspectError, InspectRequest, MAX_PEEK};
use nsq_wire::http1::Params;
use serde::Serialize;

/// `count` of `/messages` when the request gives none.
const DEFAULT_PEEK: usize = 10;

/// One message as both endpoints show it.
#[derive(Serialize)]
struct MessageJson {
    id: String,
    timestamp: i64,
    attempts: u16,
    body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_text: Option<String>,
}

impl MessageJson {
    fn new(id: MessageId, timestamp: i64, attempts: u16, body: &[u8]) -> MessageJson {
        MessageJson {
            id: String::from_utf8_lossy(&id.to_hex()).into_owned(),
            timestamp,
            attempts,
            body: base64(body),
            body_text: std::str::from_utf8(body).ok().map(str::to_string),
        }
    }
}

/// A message's state on one channel.
#[derive(Serialize)]
struct ChannelState {
    channel_name: String,
    /// `waiting`, `in_flight`, `deferred` or `finished`.
    state: &'static str,
    attempts: u16,
}

/// `GET /message` answer.
#[derive(Serialize)]
struct MessageAnswer {
    #[serde(flatten)]
    message: MessageJson,
    channels: Vec<ChannelState>,
}

/// `GET /messages` answer.
#[derive(Serialize)]
struct PeekAnswer {
    count: usize,
    messages: Vec<MessageJson>,
}

fn error_response(e: InspectError) -> Response {
    match e {
        InspectError::TopicNotFound => Response::v1_err(404, "TOPIC_NOT_FOUND"),
        InspectError::ChannelNotFound => Response::v1_err(404, "CHANNEL_NOT_FOUND"),
        InspectError::MessageNotFound => Response::v1_err(404, "MESSAGE_NOT_FOUND"),
        InspectError::Disk => Response::v1_err(500, "INTERNAL_ERROR"),
        InspectError::Exiting => Response::v1_err(503, "EXITING"),
    }
}

/// `GET /message?topic=T&id=ID`. Errors: 400 `MISSING_ARG_TOPIC`, `INVALID_ARG_TOPIC`,
/// `MISSING_ARG_ID`, `INVALID_ARG_ID` (not 16 lowercase hex characters); 404
/// `TOPIC_NOT_FOUND`, `MESSAGE_NOT_FOUND`.
pub(super) async fn do_message(server: &Server, params: &Params) -> Response {
    let topic = match topic_param(params, true) {
        Ok(t) => t,
        Err(_) if params.get("topic").is_some() => {
            return Response::v1_err(400, "INVALID_ARG_TOPIC")
        }
        Err(r) => return r,
    };
    let Some(id) = params.get("id") else {
        return Response::v1_err(400, "MISSING_ARG_ID");
    };
    let Some(id) = MessageId::from_hex(id.as_bytes()) else {
        return Response::v1_err(400, "INVALID_ARG_ID");
    };
    match server.inspect(InspectRequest::Message { topic, id }).await {
        Ok(InspectAnswer::Message(v)) => {
            let attempts = v.channels.iter().map(|c| c.2).max().unwrap_or(0);
            let answer = MessageAnswer {
                message: MessageJson::new(v.id, v.timestamp, attempts, &v.body),
                channels: v
                    .channels
                    .into_iter()
                    .map(|(channel_name, state, attempts)| ChannelState {
                        channel_name,
                        state: state.as_str(),
                        attempts,
                    })
                    .collect(),
            };
            Response::v1_json(nsq_wire::json::to_vec_go(&answer))
        }
        Ok(InspectAnswer::Peek(_)) => Response::v1_err(500, "INTERNAL_ERROR"),
        Err(e) => error_response(e),
    }
}

/// `GET /messages?topic=T&channel=C[&count=N][&from=NS]`: `count` 1 to [`MAX_PEEK`]
/// (larger is cut to it; default [`DEFAULT_PEEK`]), `from` a Unix-ns publish time.
/// Errors: nsqd's topic and channel argument errors; 400 `INVALID_ARG_COUNT`,
/// `INVALID_ARG_FROM`; 404 `TOPIC_NOT_FOUND`, `CHANNEL_NOT_FOUND`.
pub(super) async fn do_messages(server: &Server, params: &Params) -> Response {
    let (topic, channel) = match topic_channel_params(params) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let count = match params.get("count").map(str::parse::<usize>) {
        None => DEFAULT_PEEK,
        Some(Ok(n)) if n > 0 => n.min(MAX_PEEK),
        Some(_) => return Response::v1_err(400, "INVALID_ARG_COUNT"),
    };
    let from_ns = match params.get("from").map(str::parse::<i64>) {
        None => None,
        Some(Ok(ns)) => Some(ns),
        Some(Err(_)) => return Response::v1_err(400, "INVALID_ARG_FROM"),
    };
    let req = InspectRequest::Peek {
        topic,
        channel,
        count,
        from_ns,
    };
    match server.inspect(req).await {
        Ok(InspectAnswer::Peek(msgs)) => {
            let messages: Vec<MessageJson> = msgs
                .iter()
                .map(|m: &Message| MessageJson::new(m.id, m.timestamp, m.attempts, &m.body))
                .collect();
            let answer = PeekAnswer {
                count: messages.len(),
                messages,
            };
            Response::v1_json(nsq_wire::json::to_vec_go(&answer))
        }
        Ok(InspectAnswer::Message(_)) => Response::v1_err(500, "INTERNAL_ERROR"),
        Err(e) => error_response(e),
    }
}

/// Standard base64 (RFC 4648, with `=` padding).
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &x)| n | (x as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }
}
