//! nsqd's HTTP API on every shard (nsqd: http.go, internal/http_api): request parsing
//! with httparse, keep-alive, and responses with Go's header layout so that bytes match
//! a real nsqd (apart from the Date value).

use crate::protocol::identify::VERSION;
use crate::server::Server;
use crate::stats_render;
use crate::tcp::SharedStream;
use crate::timefmt;
use bytes::{Bytes, BytesMut};
use glommio::net::{TcpListener, TcpStream};
use nsq_shards::mesh::{AdminError, AdminOp, SeekTo};
use nsq_shards::names::{is_valid_channel_name, is_valid_topic_name};
use nsq_shards::stats::StatsRequest;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Largest request head accepted (Go's default is 1 MiB; 64 KiB is plenty here).
const MAX_HEAD: usize = 64 * 1024;

/// Serves HTTP on this shard's listener until shutdown.
pub async fn accept_loop(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "HTTP", serve).await
}

/// Serves the HTTP API over TLS on this shard's HTTPS listener until shutdown (nsqd:
/// `--https-address`, opened when a certificate is set).
pub async fn accept_loop_tls(server: Rc<Server>, listener: TcpListener) {
    crate::server::accept_until_shutdown(server, listener, "HTTPS", serve_tls).await
}

async fn serve(server: Rc<Server>, stream: TcpStream) {
    serve_conn(server, stream, false).await
}

async fn serve_tls(server: Rc<Server>, stream: TcpStream) {
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
}

const NSQ_V1: (&str, &str) = ("X-Nsq-Content-Type", "nsq; version=1.0");
const JSON: &str = "application/json; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

impl Response {
    /// nsqd V1 error: `{"message":"<TEXT>"}` as JSON.
    pub fn v1_err(status: u16, text: &str) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", JSON.into()), (NSQ_V1.0, NSQ_V1.1.into())],
            body: format!("{{\"message\":\"{text}\"}}").into_bytes(),
            sniffed_type: None,
            close: false,
            http10: false,
            keep_alive_header: false,
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
        }
    }

    /// The response to `head`'s request: a HEAD request gets the headers only (Go's
    /// server discards a HEAD handler's body; its Content-Length stays).
    fn encode_for(&self, head: &Head) -> Vec<u8> {
        let mut out = self.encode();
        if head.method == "HEAD" {
            out.truncate(out.len() - self.body.len());
        }
        out
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.body.len());
        out.extend_from_slice(
            format!(
                "{} {} {}\r\n",
                if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" },
                self.status,
                status_text(self.status)
            )
            .as_bytes(),
        );
        for (k, v) in &self.headers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(
            format!("Date: {}\r\n", timefmt::http_date(timefmt::now_secs())).as_bytes(),
        );
        out.extend_from_slice(format!("Content-Length: {}\r\n", self.body.len()).as_bytes());
        if let Some(t) = self.sniffed_type {
            if !self.body.is_empty() {
                out.extend_from_slice(format!("Content-Type: {t}\r\n").as_bytes());
            }
        }
        if self.close {
            out.extend_from_slice(b"Connection: close\r\n");
        } else if self.keep_alive_header {
            out.extend_from_slice(b"Connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Request Entity Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
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
    pub head_len: usize,
}

/// A malformed request head (a 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHead;

/// Parses a request head (`Ok(None)`: incomplete; `Err`: malformed, a 400). Public for
/// the fuzz targets (fuzz/).
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, BadHead> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadHead),
    };
    let target = req.path.unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut content_length = None;
    let mut chunked = false;
    let mut keep_alive = req.version == Some(1);
    let mut asked_close = false;
    for h in req.headers.iter() {
        let v = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            content_length = Some(v.parse::<u64>().map_err(|_| BadHead)?);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.eq_ignore_ascii_case("chunked");
        } else if h.name.eq_ignore_ascii_case("connection") {
            if v.eq_ignore_ascii_case("close") {
                keep_alive = false;
                asked_close = true;
            } else if v.eq_ignore_ascii_case("keep-alive") {
                keep_alive = true;
            }
        }
    }
    Ok(Some(Head {
        method: req.method.unwrap_or("").to_string(),
        path: path.to_string(),
        query: query.to_string(),
        content_length,
        chunked,
        keep_alive,
        asked_close,
        http10: req.version == Some(0),
        head_len: n,
    }))
}

async fn read_more(stream: &SharedStream, buf: &mut BytesMut) -> bool {
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

/// Reads a chunked body; `None` on malformed input or EOF. `(body, true)`: the body went
/// over `limit`; it holds the first `limit` bytes and the rest is left unread.
async fn read_chunked(
    stream: &SharedStream,
    buf: &mut BytesMut,
    limit: u64,
) -> Option<(Vec<u8>, bool)> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                break p;
            }
            if buf.len() > 1024 || !read_more(stream, buf).await {
                return None;
            }
        };
        let line = std::str::from_utf8(&buf[..line_end]).ok()?;
        let size = u64::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        let _ = buf.split_to(line_end + 2);
        if size == 0 {
            // Trailers end with an empty line.
            loop {
                if let Some(p) = buf.windows(2).position(|w| w == b"\r\n") {
                    let _ = buf.split_to(p + 2);
                    if p == 0 {
                        return Some((body, false));
                    }
                    continue;
                }
                if !read_more(stream, buf).await {
                    return None;
                }
            }
        }
        if size > limit - body.len() as u64 {
            // Over the limit (a huge or endless chunk, or too many): keep what fits, so
            // the route answers 413, and read no further (the caller closes). Reading the
            // whole chunk first let a chunk size of 2^64-1 overflow `size + 2` (a panic:
            // the broker died) and a size of, say, 2^40 grow `buf` without bound.
            let want = (limit - body.len() as u64) as usize;
            while buf.len() < want {
                if !read_more(stream, buf).await {
                    return None;
                }
            }
            body.extend_from_slice(&buf[..want]);
            let _ = buf.split_to(want);
            return Some((body, true));
        }
        while (buf.len() as u64) < size + 2 {
            if !read_more(stream, buf).await {
                return None;
            }
        }
        body.extend_from_slice(&buf[..size as usize]);
        let _ = buf.split_to(size as usize + 2);
    }
}

async fn serve_conn(server: Rc<Server>, stream: TcpStream, tls: bool) {
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
        let hs = stream.accept_tls(cfg, &[]);
        let r = glommio::timer::timeout(Duration::from_secs(10), async {
            hs.await.map_err(glommio::GlommioError::IoError)
        })
        .await;
        if let Err(e) = r {
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
    loop {
        let head = loop {
            match parse_head(&buf) {
                Ok(Some(h)) => break h,
                Ok(None) if buf.len() < MAX_HEAD => {
                    if !read_more(&stream, &mut buf).await {
                        return;
                    }
                }
                _ => {
                    let mut r = Response::plain(400, b"400 Bad Request".to_vec());
                    r.close = true;
                    let _ = stream.write_all(&r.encode()).await;
                    stream.shutdown();
                    return;
                }
            }
        };
        let _ = buf.split_to(head.head_len);
        let started = Instant::now();
        // Limits checked before the body is read (nsqd checks ContentLength first).
        let early = if refuse {
            None
        } else {
            early_reject(&server, &head)
        };
        if let Some(mut r) = early {
            r.close = true;
            r.http10 = head.http10;
            let _ = stream.write_all(&r.encode_for(&head)).await;
            stream.shutdown();
            return;
        }
        let limit = server
            .shard
            .opts
            .max_body_size
            .max(server.shard.opts.max_msg_size) as u64
            + 1;
        // A chunked body over `limit` is cut there (the route answers 413 as nsqd does)
        // and the connection closes after the reply: the rest is never read.
        let mut cut = false;
        let body: Bytes = if head.chunked {
            match read_chunked(&stream, &mut buf, limit).await {
                Some((b, over)) => {
                    cut = over;
                    Bytes::from(b)
                }
                None => return,
            }
        } else {
            let len = head.content_length.unwrap_or(0);
            if len > limit.max(16 << 20) {
                let mut r = Response::v1_err(413, "BODY_TOO_BIG");
                r.close = true;
                let _ = stream.write_all(&r.encode_for(&head)).await;
                stream.shutdown();
                return;
            }
            while (buf.len() as u64) < len {
                if !read_more(&stream, &mut buf).await {
                    return;
                }
            }
            buf.split_to(len as usize).freeze()
        };
        let mut resp = if refuse {
            tls_required_response(server.https_port)
        } else {
            route(&server, &head, body).await
        };
        resp.http10 = head.http10;
        resp.close |= head.asked_close || cut;
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
        let close = resp.close || !head.keep_alive;
        if stream.write_all(&resp.encode_for(&head)).await.is_err() {
            return;
        }
        if close {
            stream.shutdown();
            return;
        }
    }
}

/// nsqd's answer on its plain HTTP listener when TLS is required (http.go ServeHTTP).
fn tls_required_response(https_port: u16) -> Response {
    let mut r = Response::v1_err(403, "TLS_REQUIRED");
    r.body =
        format!("{{\"message\": \"TLS_REQUIRED\", \"https_port\": {https_port}}}").into_bytes();
    r
}

/// nsqd's ContentLength checks on /pub and /mpub, answered before reading the body.
fn early_reject(server: &Server, head: &Head) -> Option<Response> {
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

/// A query string Go's url.ParseQuery rejects (a bad `%` escape, a `;`, bad UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadQuery;

/// Routes whose handler never reads the query string (nsqd: doPing, doInfo, doConfig,
/// and this broker's /metrics and /shards), so a malformed one is not an error there.
fn ignores_query(path: &str) -> bool {
    matches!(path, "/ping" | "/info" | "/metrics" | "/shards") || path.starts_with("/config/")
}

/// Go's url.ParseQuery: `&`-separated pairs, `+` is a space, `%XX` escapes; a bad
/// escape or a `;` is an error (nsqd: 400 INVALID_REQUEST).
pub fn parse_query(q: &str) -> Result<Vec<(String, String)>, BadQuery> {
    let mut out = Vec::new();
    for part in q.split('&') {
        if part.is_empty() {
            continue;
        }
        if part.contains(';') {
            return Err(BadQuery);
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        out.push((unescape(k)?, unescape(v)?));
    }
    Ok(out)
}

fn unescape(s: &str) -> Result<String, BadQuery> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = b.get(i + 1..i + 3).ok_or(BadQuery)?;
                let hex = std::str::from_utf8(h).map_err(|_| BadQuery)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| BadQuery)?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| BadQuery)
}

struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
    }
}

/// nsqd's boolParams: true/1 and false/0; anything else is unknown.
fn bool_param(v: Option<&str>) -> Option<bool> {
    match v? {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

fn method_not_allowed(allowed: &[&str]) -> Response {
    let mut r = Response::v1_err(405, "METHOD_NOT_ALLOWED");
    let mut list: Vec<&str> = allowed.to_vec();
    list.push("OPTIONS");
    list.sort();
    r.headers.insert(0, ("Allow", list.join(", ")));
    r
}

async fn route(server: &Rc<Server>, head: &Head, body: Bytes) -> Response {
    let allowed: &[&str] = match head.path.as_str() {
        "/ping" | "/info" | "/stats" | "/metrics" | "/shards" | "/" => &["GET"],
        "/pub" | "/mpub" | "/topic/create" | "/topic/delete" | "/topic/empty" | "/topic/pause"
        | "/topic/unpause" | "/channel/create" | "/channel/delete" | "/channel/empty"
        | "/channel/pause" | "/channel/unpause" | "/channel/seek" => &["POST"],
        p if p.starts_with("/config/") && p.len() > "/config/".len() && !p[8..].contains('/') => {
            &["GET", "PUT"]
        }
        _ => return Response::v1_err(404, "NOT_FOUND"),
    };
    if head.method == "OPTIONS" {
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
        };
    }
    if !allowed.contains(&head.method.as_str()) {
        return method_not_allowed(allowed);
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
        "/pub" => do_pub(server, &params, body).await,
        "/mpub" => do_mpub(server, &params, body).await,
        "/stats" => do_stats(server, &params).await,
        "/metrics" => {
            let req = StatsRequest {
                include_clients: false,
                ..Default::default()
            };
            let shards = server.gather_stats(&req).await;
            let mut r = Response::plain(
                200,
                crate::metrics::prometheus(&shards, server.cfg.start_time).into_bytes(),
            );
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
            Response::v1_json(serde_json::to_vec(&view).unwrap_or_default())
        }
        "/" => shards_page(),
        "/topic/create" => match topic_param(&params, true) {
            Err(r) => r,
            Ok(t) => {
                server.create_topic(&t).await;
                Response::v1_empty()
            }
        },
        "/topic/delete" => match topic_param(&params, false) {
            Err(r) => r,
            Ok(t) => admin(server, AdminOp::DeleteTopic(t)).await,
        },
        "/topic/empty" => match topic_param(&params, true) {
            Err(r) => r,
            Ok(t) => admin(server, AdminOp::EmptyTopic(t)).await,
        },
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
                _ => AdminOp::PauseChannel(t, c, false),
            };
            admin(server, op).await
        }
        _ => do_config(server, head, &body).await,
    }
}

/// The live per-shard page (beyond nsqd, which answers 404 at `/`): one self-contained
/// HTML file with inline CSS and JS, embedded in the binary, that polls `/shards` and
/// `/stats` every second.
pub const SHARDS_PAGE: &str = include_str!("page/shards.html");

fn shards_page() -> Response {
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
    }
}

fn topic_param(p: &Params, validate: bool) -> Result<String, Response> {
    let t = p
        .get("topic")
        .ok_or_else(|| Response::v1_err(400, "MISSING_ARG_TOPIC"))?;
    if validate && !is_valid_topic_name(t) {
        return Err(Response::v1_err(400, "INVALID_TOPIC"));
    }
    Ok(t.to_string())
}

/// nsqd http_api.GetTopicChannelArgs.
fn topic_channel_params(p: &Params) -> Result<(String, String), Response> {
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

/// Where `POST /channel/seek` goes (beyond nsqd), checked after topic and channel as
/// nsqd checks its arguments in order: `timestamp` (Unix seconds, fractions allowed, or
/// RFC 3339; see [`timefmt::parse_time_ns`]) or `position` (`oldest` / `newest`), exactly
/// one of them. 400 MISSING_ARG_TIMESTAMP when neither is given, INVALID_ARG_TIMESTAMP
/// for a time that does not parse, INVALID_ARG_POSITION for another position or when
/// both are given.
fn seek_param(p: &Params) -> Result<SeekTo, Response> {
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

async fn admin(server: &Server, op: AdminOp) -> Response {
    match server.admin(op).await {
        Ok(()) => Response::v1_empty(),
        Err(AdminError::TopicNotFound) => Response::v1_err(404, "TOPIC_NOT_FOUND"),
        Err(AdminError::ChannelNotFound) => Response::v1_err(404, "CHANNEL_NOT_FOUND"),
        Err(AdminError::Internal) => Response::v1_err(500, "INTERNAL_ERROR"),
    }
}

fn info(server: &Server) -> Response {
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
    }
    let i = Info {
        version: VERSION,
        broadcast_address: &c.broadcast_address,
        hostname: &c.hostname,
        http_port: server.http_port,
        tcp_port: server.tcp_port,
        start_time: c.start_time,
        max_heartbeat_interval: o.max_heartbeat_interval.as_nanos(),
        max_output_buffer_size: o.max_output_buffer_size,
        max_output_buffer_timeout: o.max_output_buffer_timeout.as_nanos(),
        max_deflate_level: o.max_deflate_level,
    };
    Response::v1_json(serde_json::to_vec(&i).unwrap_or_default())
}

async fn do_pub(server: &Server, p: &Params, body: Bytes) -> Response {
    let o = &server.shard.opts;
    if body.len() as i64 > o.max_msg_size {
        return Response::v1_err(413, "MSG_TOO_BIG");
    }
    if body.is_empty() {
        return Response::v1_err(400, "MSG_EMPTY");
    }
    let topic = match topic_param(p, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mut defer = None;
    if let Some(d) = p.get("defer") {
        let ms = match d.parse::<i64>() {
            Ok(ms) if ms >= 0 && ms as u128 <= o.max_req_timeout.as_millis() => ms,
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

async fn do_mpub(server: &Server, p: &Params, body: Bytes) -> Response {
    let o = &server.shard.opts;
    let topic = match topic_param(p, true) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let binary = match p.get("binary") {
        None => false,
        Some(v) => bool_param(Some(v)).unwrap_or(true),
    };
    let msgs: Vec<Bytes> = match parse_mpub_body(&body, binary, &limits(o)) {
        Ok(ranges) => ranges.into_iter().map(|r| body.slice(r)).collect(),
        Err((500, text)) => return Response::v1_err(500, text),
        Err((status, text)) => {
            server.create_topic(&topic).await;
            return Response::v1_err(status, text);
        }
    };
    if msgs.is_empty() {
        server.create_topic(&topic).await;
        return Response::v1_text(b"OK".to_vec());
    }
    publish_response(server.publish(&topic, msgs, None).await)
}

fn limits(o: &nsq_shards::Options) -> crate::protocol::Limits {
    crate::protocol::Limits {
        max_msg_size: o.max_msg_size,
        max_body_size: o.max_body_size,
        max_rdy_count: o.max_rdy_count,
        max_req_timeout_ms: o.max_req_timeout.as_millis() as i64,
    }
}

/// Splits a `/mpub` body into its messages (byte ranges of `body`): binary (nsqd
/// readMPUB: `[int32 count]([int32 size][bytes])...`) or newline-separated text (empty
/// lines skipped). The error is the HTTP status and nsqd's text (413 errors create the
/// topic first, as nsqd does). Public for the fuzz targets (fuzz/).
pub fn parse_mpub_body(
    body: &[u8],
    binary: bool,
    limits: &crate::protocol::Limits,
) -> Result<Vec<std::ops::Range<usize>>, (u16, &'static str)> {
    let mut msgs = Vec::new();
    if binary {
        let mut framed = b"MPUB t\n".to_vec();
        framed.extend_from_slice(&(body.len().max(1) as u32).to_be_bytes());
        let prefix = framed.len();
        framed.extend_from_slice(body);
        let ctx = crate::protocol::Context {
            state: nsq_shards::ClientState::Init,
            heartbeats_enabled: true,
            limits: *limits,
            eof: true,
        };
        match crate::protocol::decode(&framed, &ctx) {
            Ok(Some((crate::protocol::Command::Mpub { bodies, .. }, _))) => {
                for r in bodies {
                    msgs.push(r.start - prefix..r.end - prefix);
                }
            }
            Err(e) => return Err((413, e.code.trim_start_matches("E_"))),
            _ => return Err((500, "INTERNAL_ERROR")),
        }
    } else {
        if body.len() as i64 > limits.max_body_size {
            return Err((413, "BODY_TOO_BIG"));
        }
        let mut start = 0;
        while start < body.len() {
            let end = body[start..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|p| start + p)
                .unwrap_or(body.len());
            if end > start {
                if (end - start) as i64 > limits.max_msg_size {
                    return Err((413, "MSG_TOO_BIG"));
                }
                msgs.push(start..end);
            }
            start = end + 1;
        }
    }
    Ok(msgs)
}

/// nsqd: 503 EXITING while shutting down; a disk error is 500 INTERNAL_ERROR.
fn publish_response(r: Result<(), nsq_shards::topic::PublishError>) -> Response {
    match r {
        Ok(()) => Response::v1_text(b"OK".to_vec()),
        Err(nsq_shards::topic::PublishError::Exiting) => Response::v1_err(503, "EXITING"),
        Err(nsq_shards::topic::PublishError::Disk(_)) => Response::v1_err(500, "INTERNAL_ERROR"),
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

async fn do_stats(server: &Server, p: &Params) -> Response {
    let req = StatsRequest {
        topic: p.get("topic").unwrap_or("").to_string(),
        channel: p.get("channel").unwrap_or("").to_string(),
        include_clients: bool_param(p.get("include_clients")).unwrap_or(true),
        counters_only: false,
    };
    let include_mem = bool_param(p.get("include_mem")).unwrap_or(true);
    let shards = server.gather_stats(&req).await;
    if p.get("format") == Some("json") {
        Response::v1_json(stats_render::json(server, &req, &shards, include_mem))
    } else {
        Response::v1_text(stats_render::text(server, &req, &shards, include_mem))
    }
}

/// nsqd's log level for /config: 1 debug .. 5 fatal; 0 until a PUT changed it (then the
/// command line's level applies). Process-wide: a PUT may land on any shard.
static LOG_LEVEL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn log_level_number(c: &crate::config::Config) -> u8 {
    match LOG_LEVEL.load(std::sync::atomic::Ordering::Relaxed) {
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
async fn do_config(server: &Server, head: &Head, body: &[u8]) -> Response {
    let opt = &head.path["/config/".len()..];
    if head.method == "PUT" {
        let read_max = server.shard.opts.max_msg_size + 1;
        if body.len() as i64 >= read_max || body.is_empty() {
            return Response::v1_err(413, "INVALID_VALUE");
        }
        match opt {
            "nsqlookupd_tcp_addresses" => {
                let Ok(addrs) = serde_json::from_slice::<Option<Vec<String>>>(body) else {
                    return Response::v1_err(400, "INVALID_VALUE");
                };
                crate::lookup::set_peer_addresses(server, addrs).await;
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
                LOG_LEVEL.store(n, std::sync::atomic::Ordering::Relaxed);
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
        "nsqlookupd_tcp_addresses" => crate::lookup::peer_addresses_json(server),
        "log_level" => log_level_number(c).into(),
        "statsd_prefix" => return raw(&crate::statsd::server_prefix(server)),
        "broadcast_tcp_port" if c.broadcast_tcp_port == 0 => server.tcp_port.into(),
        "broadcast_http_port" if c.broadcast_http_port == 0 => server.http_port.into(),
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
    Response::v1_json(v.to_string().into_bytes())
}
