//! POST /pub and /mpub (nsqd: http.go doPUB, doMPUB).

use super::*;

/// doPUB's checks of the body, made before the query's (nsqd reads the body first): a
/// failed read is 500 INTERNAL_ERROR unless more than --max-msg-size had arrived (Go's
/// LimitReader stops before the error), then MSG_TOO_BIG and MSG_EMPTY.
pub(super) fn pub_body_error(
    o: &nsq_shards::Options,
    body: &[u8],
    failed: bool,
) -> Option<Response> {
    if body.len() as i64 > o.max_msg_size {
        return Some(Response::v1_err(413, "MSG_TOO_BIG"));
    }
    if failed {
        return Some(Response::v1_err(500, "INTERNAL_ERROR"));
    }
    if body.is_empty() {
        return Some(Response::v1_err(400, "MSG_EMPTY"));
    }
    None
}

/// Publishes one message (nsqd doPUB); the body was checked by [`pub_body_error`].
pub(super) async fn do_pub(server: &Server, p: &Params, body: Bytes) -> Response {
    let o = &server.shard.opts;
    let topic = match topic_param(p, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mut defer = None;
    if let Some(d) = p.get("defer") {
        // Go: ParseInt, then `time.Duration(ms) * time.Millisecond`, which wraps.
        let max_ns = o.max_req_timeout.as_nanos().min(i64::MAX as u128) as i64;
        let ms = match d.parse::<i64>().map(|ms| ms.wrapping_mul(1_000_000)) {
            Ok(ns) if ns >= 0 && ns <= max_ns => ns / 1_000_000,
            _ => {
                server.create_topic(&topic).await;
                return Response::v1_err(400, "INVALID_DEFER");
            }
        };
        if ms > 0 {
            defer = Some(Instant::now() + Duration::from_millis(ms as u64));
        }
    }
    publish_response(server.publish(&topic, vec![body], defer).await)
}

/// Publishes a batch (nsqd doMPUB). `failed`: the body's read ended in an error after
/// `body`: binary mode reads messages as far as the bytes go (readMPUB stops at its
/// count, so a complete batch still publishes; a short one is its usual 413); text mode
/// reads whole lines up to the error (a line's error still wins) and then answers 500
/// INTERNAL_ERROR, publishing nothing.
pub(super) async fn do_mpub(server: &Server, p: &Params, body: Bytes, failed: bool) -> Response {
    let o = &server.shard.opts;
    let topic = match topic_param(p, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let binary = match p.get("binary") {
        None => false,
        Some(v) => bool_param(Some(v)).unwrap_or(true),
    };
    if failed && !binary {
        let lines = body.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let (status, text) =
            match parse_mpub_body(&body[..lines], false, &nsq_wire::v2::Limits::from(o)) {
                Err((status, text)) if status != 500 => (status, text),
                _ => (500, "INTERNAL_ERROR"),
            };
        server.create_topic(&topic).await;
        return Response::v1_err(status, text);
    }
    let (parsed, read) = scan_mpub_body(&body, binary, &nsq_wire::v2::Limits::from(o));
    let read = (read < body.len()).then_some(read);
    let msgs: Vec<Bytes> = match parsed {
        Ok(ranges) => ranges.into_iter().map(|r| body.slice(r)).collect(),
        Err((500, text)) => return Response::v1_err(500, text),
        Err((status, text)) => {
            server.create_topic(&topic).await;
            let mut r = Response::v1_err(status, text);
            r.body_read = read;
            return r;
        }
    };
    let mut r = if msgs.is_empty() {
        server.create_topic(&topic).await;
        Response::v1_text(b"OK".to_vec())
    } else {
        publish_response(server.publish(&topic, msgs, None).await)
    };
    r.body_read = read;
    r
}

/// A `/mpub` body's messages (byte ranges of the body), or the HTTP status and nsqd's
/// text of its refusal.
pub type MpubParse = Result<Vec<std::ops::Range<usize>>, (u16, &'static str)>;

/// Splits a `/mpub` body into its messages (byte ranges of `body`): binary (nsqd
/// readMPUB: `[int32 count]([int32 size][bytes])...`) or newline-separated text (empty
/// lines skipped). The error is the HTTP status and nsqd's text (413 errors create the
/// topic first, as nsqd does). Public for the fuzz targets (fuzz/).
pub fn parse_mpub_body(body: &[u8], binary: bool, limits: &nsq_wire::v2::Limits) -> MpubParse {
    scan_mpub_body(body, binary, limits).0
}

/// [`parse_mpub_body`], and how many bytes of `body` nsqd's doMPUB reads to reach that
/// answer: binary mode stops after its count of messages (or at the field it refuses),
/// text mode through the 4 KiB bufio read that holds the line it refuses (its reads
/// are whole buffers where the bytes have arrived; a chunk boundary can end one sooner,
/// which only matters within 4 KiB of net/http's 256 KiB rule).
pub(super) fn scan_mpub_body(
    body: &[u8],
    binary: bool,
    limits: &nsq_wire::v2::Limits,
) -> (MpubParse, usize) {
    let mut msgs = Vec::new();
    if binary {
        let read = binary_mpub_read_len(body, limits);
        let mut framed = b"MPUB t\n".to_vec();
        // Only what readMPUB reads: bytes after the counted messages are ignored.
        framed.extend_from_slice(&(read.max(1) as u32).to_be_bytes());
        let prefix = framed.len();
        framed.extend_from_slice(&body[..read]);
        let ctx = nsq_wire::v2::Context {
            state: nsq_shards::ClientState::Init,
            heartbeats_enabled: true,
            limits: *limits,
            eof: true,
        };
        let r = match nsq_wire::v2::decode(&framed, &ctx) {
            Ok(Some((nsq_wire::v2::Command::Mpub { bodies, .. }, _))) => {
                for r in bodies {
                    msgs.push(r.start - prefix..r.end - prefix);
                }
                Ok(msgs)
            }
            Err(e) => Err((413, e.code.trim_start_matches("E_"))),
            _ => Err((500, "INTERNAL_ERROR")),
        };
        return (r, read);
    }
    // doMPUB's text loop: each line (its newline included) counts towards
    // --max-body-size before the line itself is checked against --max-msg-size.
    let mut start = 0;
    while start < body.len() {
        let end = body[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|p| start + p)
            .unwrap_or(body.len());
        let next = (end + 1).min(body.len());
        let read = next
            .div_ceil(BUFIO_SIZE)
            .saturating_mul(BUFIO_SIZE)
            .min(body.len());
        if next as i64 > limits.max_body_size {
            return (Err((413, "BODY_TOO_BIG")), read);
        }
        if end > start {
            if (end - start) as i64 > limits.max_msg_size {
                return (Err((413, "MSG_TOO_BIG")), read);
            }
            msgs.push(start..end);
        }
        start = next;
    }
    (Ok(msgs), body.len())
}

/// Go's bufio.Reader default size, through which doMPUB reads text bodies.
const BUFIO_SIZE: usize = 4096;

/// How far nsqd's readMPUB reads a binary `/mpub` body: the count, then each
/// message's size and body, stopping after a field it refuses (a count or size out of
/// range) or at the end of the body. Bytes after the last counted message are never read.
fn binary_mpub_read_len(body: &[u8], limits: &nsq_wire::v2::Limits) -> usize {
    let field = |at: usize| {
        body.get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(i32::from_be_bytes)
    };
    let Some(count) = field(0) else {
        return body.len();
    };
    if count <= 0 || i64::from(count) > (limits.max_body_size - 4) / 5 {
        return 4;
    }
    let mut at = 4usize;
    for _ in 0..count {
        let Some(size) = field(at) else {
            return body.len();
        };
        at += 4;
        if size <= 0 || i64::from(size) > limits.max_msg_size {
            return at;
        }
        at = at.saturating_add(size as usize);
        if at >= body.len() {
            return body.len();
        }
    }
    at
}

/// nsqd: any failure to put the messages (shutting down, or the disk failed) is 503
/// EXITING (http.go doPUB/doMPUB: `if err != nil { return nil, http_api.Err{503,
/// "EXITING"} }`).
pub(super) fn publish_response(r: Result<(), nsq_shards::topic::PublishError>) -> Response {
    match r {
        Ok(()) => Response::v1_text(b"OK".to_vec()),
        Err(nsq_shards::topic::PublishError::Exiting) => Response::v1_err(503, "EXITING"),
        // nsqd's draining prototype: the topic's PutMessage error, so 503 EXITING.
        Err(nsq_shards::topic::PublishError::Draining) => Response::v1_err(503, "EXITING"),
        Err(nsq_shards::topic::PublishError::Disk(_)) => Response::v1_err(503, "EXITING"),
        // A replicated publish that missed its ack policy: nsqd's answer for a put that
        // failed.
        Err(nsq_shards::topic::PublishError::Replication(_)) => Response::v1_err(503, "EXITING"),
    }
}
