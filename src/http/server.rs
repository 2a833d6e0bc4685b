//! The HTTP/1.1 server loop of one shard (nsqd: http.go Serve, Go net/http): accept,
//! optional TLS, request heads (httparse), bodies (Content-Length or chunked), keep-alive,
//! and responses with Go's header layout. Status lines, headers and the query string are
//! `nsq_wire::http1`'s, shared with nsqlookupd.

use super::*;
pub use nsq_wire::http1::HeadError;
use nsq_wire::http1::{PostCrlf, MAX_HEAD, MAX_POST_HANDLER_READ};

/// Serves HTTP on this shard's listener until shutdown.
pub async fn accept_loop(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "HTTP", serve).await
}

/// Serves the HTTP API over TLS on this shard's HTTPS listener until shutdown (nsqd:
/// `--https-address`, opened when a certificate is set).
pub async fn accept_loop_tls(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "HTTPS", serve_tls).await
}

pub(super) async fn serve(server: Rc<Server>, stream: TcpStream) {
    serve_conn(server, stream, false).await
}

pub(super) async fn serve_tls(server: Rc<Server>, stream: TcpStream) {
    serve_conn(server, stream, true).await
}

/// A response: status, the handler's own headers (Go writes them sorted), the body, the
/// sniffed Content-Type Go adds after Content-Length for handlers that set none, and
/// whether the connection closes.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub sniffed_type: Option<&'static str>,
    pub close: bool,
    /// Answer with an `HTTP/1.0` status line (the request was HTTP/1.0).
    pub http10: bool,
    /// Send `Connection: keep-alive` (an HTTP/1.0 request that asked for it).
    pub keep_alive_header: bool,
    /// How many bytes of the request body nsqd's handler would have read before it
    /// answered, when fewer than it was given (doMPUB stops at the first refused message
    /// and binary mode at its count); `None`: all of them. What is left is net/http's to
    /// drop (at most 256 KiB) or to close on.
    pub body_read: Option<usize>,
}

pub(super) use nsq_wire::http1::{JSON, NSQ_V1, TEXT};

impl Response {
    /// nsqd V1 error: `{"message":"<TEXT>"}` as JSON.
    pub fn v1_err(status: u16, text: &str) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", JSON.into()), (NSQ_V1.0, NSQ_V1.1.into())],
            body: http1::v1_error_body(text),
            sniffed_type: None,
            close: false,
            http10: false,
            keep_alive_header: false,
            body_read: None,
        }
    }

    /// nsqd V1 success with a JSON value.
    pub fn v1_json(body: Vec<u8>) -> Response {
        Response {
            status: 200,
            headers: vec![("Content-Type", JSON.into()), (NSQ_V1.0, NSQ_V1.1.into())],
            body,
            sniffed_type: None,
            close: false,
            http10: false,
            keep_alive_header: false,
            body_read: None,
        }
    }

    /// nsqd V1 success with a raw string body (Go sniffs text/plain).
    pub fn v1_text(body: Vec<u8>) -> Response {
        Response {
            status: 200,
            headers: vec![(NSQ_V1.0, NSQ_V1.1.into())],
            body,
            sniffed_type: Some(TEXT),
            close: false,
            http10: false,
            keep_alive_header: false,
            body_read: None,
        }
    }

    /// nsqd V1 success with no body.
    pub fn v1_empty() -> Response {
        Response {
            status: 200,
            headers: vec![(NSQ_V1.0, NSQ_V1.1.into())],
            body: Vec::new(),
            sniffed_type: None,
            close: false,
            http10: false,
            keep_alive_header: false,
            body_read: None,
        }
    }

    /// PlainText decorator (/ping): no X-Nsq header.
    pub fn plain(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body,
            sniffed_type: Some(TEXT),
            close: false,
            http10: false,
            keep_alive_header: false,
            body_read: None,
        }
    }

    /// The response to `head`'s request, framed as net/http frames it
    /// ([`http1::encode_response`]: a HEAD request gets the headers only, a body over
    /// 2 KiB is chunked), and whether the connection must close after it (also when an
    /// HTTP/1.0 answer's body runs to the close).
    fn encode_for(&self, head: &Head) -> (Vec<u8>, bool) {
        let framing = http1::Framing {
            head: head.method == "HEAD",
            http11: !self.http10,
            close: self.close,
            keep_alive_10: self.keep_alive_header,
        };
        http1::encode_response(
            self.status,
            &self.headers,
            &self.body,
            self.sniffed_type,
            &framing,
        )
    }
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_length: Option<u64>,
    pub chunked: bool,
    pub keep_alive: bool,
    /// The request said `Connection: close`.
    pub asked_close: bool,
    pub http10: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
    /// Another expectation (net/http answers 417).
    pub expect_unknown: bool,
    pub head_len: usize,
}

/// Parses a request head with net/http's rules (`nsq_wire::http1::parse_request_head`:
/// `Ok(None)`: incomplete; `Err`: refused, answered with [`HeadError::response`]). Public
/// for the fuzz targets (fuzz/).
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, HeadError> {
    let Some(h) = nsq_wire::http1::parse_request_head(buf)? else {
        return Ok(None);
    };
    Ok(Some(Head {
        keep_alive: h.keep_alive(),
        asked_close: h.conn_close,
        http10: !h.http11,
        method: h.method,
        path: h.path,
        query: h.query.unwrap_or_default(),
        content_length: h.content_length,
        chunked: h.chunked,
        expect_continue: h.expect_continue,
        expect_unknown: h.expect_unknown,
        head_len: h.head_len,
    }))
}

pub(super) async fn read_more(stream: &SharedStream, buf: &mut BytesMut) -> bool {
    let old = buf.len();
    buf.resize(old + 16 * 1024, 0);
    match stream.read(&mut buf[old..]).await {
        Ok(0) | Err(_) => {
            buf.truncate(old);
            false
        }
        Ok(n) => {
            buf.truncate(old + n);
            true
        }
    }
}

/// A chunk-size line as Go's chunked reader takes it: trailing spaces and tabs trimmed,
/// any `;extension` cut off, then 1 to 16 hex digits and nothing else (no sign, no
/// space before the `;`). `None`: malformed.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let end = line
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(0, |i| i + 1);
    let digits = line[..end].split(|&b| b == b';').next().unwrap_or(&[]);
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        Some(n << 4 | (d as char).to_digit(16)? as u64)
    })
}

/// How a read of a chunked request body stopped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ChunkEnd {
    /// The last chunk and the trailers were read: the body is over.
    Complete,
    /// As many data bytes as were asked for were read; the body may go on (Go's
    /// `io.LimitReader` stops there without looking further).
    Limit,
    /// Malformed chunked framing, or the connection ended inside the body.
    Failed,
}

/// A chunked request body read in steps, as Go's chunked reader is: by nsqd's handler
/// through its `LimitReader`, then by net/http dropping what the handler left (at most
/// 256 KiB more). Keeps its place inside the current chunk between the steps.
#[derive(Default)]
pub(super) struct ChunkedBody {
    /// Data bytes left in the current chunk (its CRLF follows them); `None`: a chunk-size
    /// line comes next.
    left: Option<u64>,
}

impl ChunkedBody {
    /// Reads up to `max` more data bytes from `buf` and the stream, appending them to
    /// `out` when given (else dropping them: memory stays bounded whatever the sizes
    /// say). A chunk size of any value up to 2^64-1 is taken as Go takes it; only the
    /// bytes that arrive are buffered.
    pub(super) async fn read(
        &mut self,
        stream: &SharedStream,
        buf: &mut BytesMut,
        max: u64,
        mut out: Option<&mut Vec<u8>>,
    ) -> ChunkEnd {
        let mut got = 0u64;
        loop {
            if got == max {
                return ChunkEnd::Limit;
            }
            match self.left {
                Some(0) => {
                    while buf.len() < 2 {
                        if !read_more(stream, buf).await {
                            return ChunkEnd::Failed;
                        }
                    }
                    // Go's chunked reader: "malformed chunked encoding" after the data.
                    if &buf[..2] != b"\r\n" {
                        return ChunkEnd::Failed;
                    }
                    let _ = buf.split_to(2);
                    self.left = None;
                }
                Some(n) => {
                    if buf.is_empty() && !read_more(stream, buf).await {
                        return ChunkEnd::Failed;
                    }
                    let take = n.min(max - got).min(buf.len() as u64) as usize;
                    if let Some(o) = out.as_deref_mut() {
                        o.extend_from_slice(&buf[..take]);
                    }
                    let _ = buf.split_to(take);
                    got += take as u64;
                    self.left = Some(n - take as u64);
                }
                None => {
                    let line_end = loop {
                        if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                            break p;
                        }
                        if buf.len() >= 4096 || !read_more(stream, buf).await {
                            return ChunkEnd::Failed;
                        }
                    };
                    let Some(size) = chunk_size(&buf[..line_end]) else {
                        return ChunkEnd::Failed;
                    };
                    let _ = buf.split_to(line_end + 2);
                    if size > 0 {
                        self.left = Some(size);
                        continue;
                    }
                    // The last chunk: trailers end with an empty line.
                    loop {
                        if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                            let _ = buf.split_to(p + 2);
                            if p == 0 {
                                return ChunkEnd::Complete;
                            }
                            continue;
                        }
                        // Trailer lines are bounded as the head is.
                        if buf.len() >= MAX_HEAD || !read_more(stream, buf).await {
                            return ChunkEnd::Failed;
                        }
                    }
                }
            }
        }
    }
}

/// Reads and drops `n` more bytes of a Content-Length body; false if the connection
/// ended first.
async fn discard(stream: &SharedStream, buf: &mut BytesMut, mut n: u64) -> bool {
    loop {
        let take = (buf.len() as u64).min(n) as usize;
        let _ = buf.split_to(take);
        n -= take as u64;
        if n == 0 {
            return true;
        }
        if !read_more(stream, buf).await {
            return false;
        }
    }
}

pub(super) async fn serve_conn(server: Rc<Server>, stream: TcpStream, tls: bool) {
    // The access log names the client as nsqd does (Go's `req.RemoteAddr`).
    let remote = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let stream = SharedStream::new(stream);
    stream.set_read_timeout(Some(Duration::from_secs(60)));
    stream.set_write_timeout(Some(Duration::from_secs(60)));
    if tls {
        let Some(cfg) = server.cfg.tls.clone() else {
            return;
        };
        // Boxed: the handshake's state (10 KB) would otherwise stay in the connection's
        // task for its whole life.
        let hs = Box::pin(stream.accept_tls(cfg, &[]));
        let r = glommio::timer::timeout(Duration::from_secs(10), async {
            hs.await.map_err(glommio::GlommioError::IoError)
        });
        if let Err(e) = Box::pin(r).await {
            // Go's http.Server logs a failed handshake the same way.
            log::info!("http: TLS handshake error from {remote}: {e}");
            stream.shutdown();
            return;
        }
    }
    // nsqd's ServeHTTP: with --tls-required=true the plain listener answers every request
    // with 403 and the HTTPS port.
    let refuse = !tls && server.cfg.tls_required == crate::config::TLS_REQUIRED;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut crlf = PostCrlf::default();
    loop {
        let head = loop {
            let _ = buf.split_to(crlf.drop_from(&buf));
            // Parsed within the limit only, as Go reads the head through it.
            match parse_head(&buf[..buf.len().min(MAX_HEAD)]) {
                Ok(Some(h)) => break h,
                Ok(None) if buf.len() < MAX_HEAD => {
                    if !read_more(&stream, &mut buf).await {
                        return;
                    }
                }
                // net/http's own answers (no Date, no Content-Length), then close.
                Ok(None) => {
                    let _ = stream.write_all(&HeadError::TooLarge.response()).await;
                    stream.close_write_and_wait().await;
                    return;
                }
                Err(e) => {
                    let _ = stream.write_all(&e.response()).await;
                    stream.shutdown();
                    return;
                }
            }
        };
        let _ = buf.split_to(head.head_len);
        crlf.after(&head.method);
        let started = Instant::now();
        // net/http answers these before any handler runs: an unknown expectation (417,
        // then close) and `OPTIONS *` (globalOptionsHandler: 200, Content-Length 0).
        if head.expect_unknown {
            let mut r = Response::plain(417, Vec::new());
            r.sniffed_type = None;
            r.headers = vec![("Connection", "close".into())];
            r.http10 = head.http10;
            let _ = stream.write_all(&r.encode_for(&head).0).await;
            stream.shutdown();
            return;
        }
        // Limits checked before the body is read (nsqd checks ContentLength first).
        let early = if refuse {
            None
        } else {
            early_reject(&server, &head)
        };
        if let Some(mut r) = early {
            r.http10 = head.http10;
            let len = head.content_length.unwrap_or(0);
            if len >= MAX_POST_HANDLER_READ {
                // A body of 256 KiB or more left unread: `Connection: close`, then Go's
                // closeWriteAndWait; when the client asked to close (`Connection:
                // close`, HTTP/1.0 without keep-alive), a plain close (a reset: its
                // body reader, told the connection closes, reads nothing more).
                r.close = true;
                let _ = stream.write_all(&r.encode_for(&head).0).await;
                if head.keep_alive {
                    stream.close_write_and_wait().await;
                } else {
                    stream.close_now();
                }
                return;
            }
            // A shorter one net/http reads and drops, and the connection is kept (unless
            // the body ends early: then `Connection: close`).
            let mut complete = true;
            while (buf.len() as u64) < len {
                if !read_more(&stream, &mut buf).await {
                    complete = false;
                    break;
                }
            }
            let _ = buf.split_to(buf.len().min(len as usize));
            r.close = !complete || head.asked_close;
            r.keep_alive_header = head.http10 && head.keep_alive && !r.close;
            let (bytes, body_to_close) = r.encode_for(&head);
            let close = r.close || !head.keep_alive || body_to_close;
            if stream.write_all(&bytes).await.is_err() || close {
                stream.shutdown();
                return;
            }
            continue;
        }
        // How much of the body nsqd's handler reads, through Go's LimitReader: doPUB and
        // doConfig's PUT --max-msg-size + 1 bytes, doMPUB --max-body-size + 1; the other
        // handlers (and the TLS-required answer) read none. net/http deals with the rest
        // after the handler (below).
        let read_limit = if refuse || !reads_body_first(&head) {
            0
        } else {
            handler_read_limit(&server.shard.opts, &head)
        };
        // `Expect: 100-continue` (HTTP/1.1, a body announced): Go sends `100 Continue`
        // when the handler starts reading the body. A handler that answers without
        // reading it never asks for it: its answer goes out with `Connection: close`
        // and the body is never read.
        let announced = head.chunked || head.content_length.unwrap_or(0) > 0;
        if head.expect_continue && !head.http10 && announced {
            if !refuse && reads_body_first(&head) {
                if stream
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
            } else {
                let mut resp = if refuse {
                    tls_required_response(server.https_port)
                } else {
                    route(&server, &head, Bytes::new(), false).await
                };
                resp.close = true;
                let _ = stream.write_all(&resp.encode_for(&head).0).await;
                stream.shutdown();
                return;
            }
        }
        // The handler's read. A body that fails (malformed chunked framing, or the
        // connection ends inside it) still gets its route's answer, as Go's server runs
        // the handler and the handler's read returns the error: nsqd answers 500
        // INTERNAL_ERROR where it reads the body (`route` in http/mod.rs), the others
        // answer as usual; then close.
        let announced_len = if head.chunked {
            None
        } else {
            Some(head.content_length.unwrap_or(0))
        };
        let mut chunked = ChunkedBody::default();
        let mut chunk_end = ChunkEnd::Limit;
        let mut failed = false;
        let mut cl_eof = false;
        let body: Bytes = match announced_len {
            _ if read_limit == 0 => Bytes::new(),
            None => {
                let mut b = Vec::new();
                chunk_end = chunked
                    .read(&stream, &mut buf, read_limit, Some(&mut b))
                    .await;
                failed = chunk_end == ChunkEnd::Failed;
                Bytes::from(b)
            }
            Some(len) => {
                let want = len.min(read_limit);
                while (buf.len() as u64) < want {
                    if !read_more(&stream, &mut buf).await {
                        failed = true;
                        cl_eof = true;
                        break;
                    }
                }
                let have = buf.len().min(want as usize);
                buf.split_to(have).freeze()
            }
        };
        let body_len = body.len();
        let mut resp = if refuse {
            tls_required_response(server.https_port)
        } else if head.method == "OPTIONS" && head.path == "*" {
            let mut r = Response::plain(200, Vec::new());
            r.sniffed_type = None;
            r.headers = vec![("Content-Length", "0".into())];
            r
        } else {
            route(&server, &head, body, failed).await
        };
        resp.http10 = head.http10;
        // Go's server adds "Connection: close" when a body ended in an error, unless
        // it was a Content-Length body cut short by EOF (Go's body reader then counts as
        // having seen EOF); the connection closes either way. (With `Expect:
        // 100-continue` Go's body reader never counts a short body as having seen EOF,
        // so it closes with the header then too.)
        let expect_active = head.expect_continue && !head.http10;
        let close_header = failed && (!cl_eof || expect_active);
        // What the handler left unread, net/http's (chunkWriter.writeHeader): with
        // `Expect: 100-continue` the connection closes; a Content-Length body with 256
        // KiB or more left is not read (too big); otherwise it reads and drops up to 256
        // KiB + 1 bytes: too big if they were there, the connection kept if the body
        // ended, closed if it failed. Too big: `Connection: close`, then Go's
        // closeWriteAndWait.
        let handler_read = resp.body_read.unwrap_or(body_len).min(body_len);
        let left = (body_len - handler_read) as u64;
        let handler_saw_end = match announced_len {
            None => chunk_end == ChunkEnd::Complete && left == 0,
            Some(len) => handler_read as u64 == len,
        };
        let mut too_big = false;
        let mut drop_failed = false;
        if !failed && !handler_saw_end {
            if expect_active {
                too_big = true;
            } else if let Some(len) = announced_len {
                if !head.keep_alive {
                    // The client asked to close (`Connection: close`, HTTP/1.0 without
                    // keep-alive): net/http reads nothing more (its discard is skipped,
                    // and its body's Close, told the connection closes, reads none), so
                    // the plain close below resets if the rest was sent.
                } else if len - handler_read as u64 >= MAX_POST_HANDLER_READ {
                    too_big = true;
                } else {
                    drop_failed = !discard(&stream, &mut buf, len - body_len as u64).await;
                }
            } else if left > MAX_POST_HANDLER_READ {
                too_big = true;
            } else if chunk_end != ChunkEnd::Complete {
                let budget = MAX_POST_HANDLER_READ + 1 - left;
                match chunked.read(&stream, &mut buf, budget, None).await {
                    ChunkEnd::Complete => {}
                    ChunkEnd::Limit => too_big = true,
                    ChunkEnd::Failed => drop_failed = true,
                }
            }
        }
        resp.close |= head.asked_close || close_header || too_big || drop_failed;
        resp.keep_alive_header = head.http10 && head.keep_alive && !resp.close;
        log::info!(
            "{} {} {}{} ({}) {:?}",
            resp.status,
            head.method,
            head.path,
            if head.query.is_empty() {
                String::new()
            } else {
                format!("?{}", head.query)
            },
            remote,
            started.elapsed()
        );
        let (bytes, body_to_close) = resp.encode_for(&head);
        let close = resp.close || !head.keep_alive || failed || body_to_close;
        if stream.write_all(&bytes).await.is_err() {
            return;
        }
        if close {
            // A body left unread: Go's closeWriteAndWait (its body's earlyClose), unless
            // the client asked to close: then, as otherwise, a plain close (a reset when
            // input is left unread).
            if too_big && head.keep_alive {
                stream.close_write_and_wait().await;
            } else {
                stream.close_now();
            }
            return;
        }
    }
}

/// How many body bytes nsqd's handler reads at most (its LimitReader's size): doPUB
/// and doConfig's PUT --max-msg-size + 1, doMPUB --max-body-size + 1. (doMPUB's binary
/// mode reads through its count with no limit; a chunked binary body is read here up to
/// --max-body-size + 1, so one whose messages add up to more is refused.)
fn handler_read_limit(o: &nsq_shards::Options, head: &Head) -> u64 {
    let max = if head.path == "/mpub" {
        o.max_body_size
    } else {
        o.max_msg_size
    };
    max.max(0) as u64 + 1
}

/// nsqd's answer on its plain HTTP listener when TLS is required (http.go ServeHTTP).
pub(super) fn tls_required_response(https_port: u16) -> Response {
    let mut r = Response::v1_err(403, "TLS_REQUIRED");
    r.body =
        format!("{{\"message\": \"TLS_REQUIRED\", \"https_port\": {https_port}}}").into_bytes();
    r
}

/// nsqd's ContentLength checks on /pub and /mpub, answered before reading the body.
pub(super) fn early_reject(server: &Server, head: &Head) -> Option<Response> {
    if head.method != "POST" {
        return None;
    }
    let len = head.content_length? as i64;
    let o = &server.shard.opts;
    match head.path.as_str() {
        "/pub" if len > o.max_msg_size => Some(Response::v1_err(413, "MSG_TOO_BIG")),
        "/mpub" if len > o.max_body_size => Some(Response::v1_err(413, "BODY_TOO_BIG")),
        _ => None,
    }
}
