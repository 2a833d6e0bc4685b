//! nsqlookupd's HTTP API (nsqlookupd: http.go, internal/http_api) on plain threads, one
//! per connection, with Go's wire details: httprouter's routing (405 with an `Allow`
//! header, OPTIONS, trailing-slash and case redirects), the V1 response style, Go's
//! header order (handler headers sorted, then Date, Content-Length, a sniffed
//! Content-Type) and net/http's chunking of bodies over 2048 bytes.

use super::registration_db::{filter_by_active, keys, now_nanos, sub_keys, Producer, Registration};
use super::Context;
use nsq_wire::duration::go_duration_string;
use nsq_wire::http1::{
    self, clean_path, parse_query, status_text, HeadError, MAX_POST_HANDLER_READ,
};
use nsq_wire::json;
use nsq_wire::names::{is_valid_channel_name, is_valid_topic_name};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nsq_wire::http1::{Framing, HTML, JSON, MAX_HEAD, NSQ_V1, TEXT};

/// The routes, as registered with httprouter upstream.
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/ping"),
    ("GET", "/info"),
    ("GET", "/debug"),
    ("GET", "/lookup"),
    ("GET", "/topics"),
    ("GET", "/channels"),
    ("GET", "/nodes"),
    ("POST", "/topic/create"),
    ("POST", "/topic/delete"),
    ("POST", "/channel/create"),
    ("POST", "/channel/delete"),
    ("POST", "/topic/tombstone"),
    ("GET", "/debug/pprof"),
    ("GET", "/debug/pprof/cmdline"),
    ("GET", "/debug/pprof/symbol"),
    ("POST", "/debug/pprof/symbol"),
    ("GET", "/debug/pprof/profile"),
    ("GET", "/debug/pprof/heap"),
    ("GET", "/debug/pprof/goroutine"),
    ("GET", "/debug/pprof/block"),
    ("GET", "/debug/pprof/threadcreate"),
];

/// A response before framing. `headers` are the handler's, already in Go's sorted order.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    /// Content-Type Go sniffs from the body when the handler set none.
    pub sniffed_type: Option<&'static str>,
}

impl Response {
    fn new(
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
        sniffed_type: Option<&'static str>,
    ) -> Response {
        Response {
            status,
            headers,
            body,
            sniffed_type,
        }
    }

    /// V1 error: `{"message":"<TEXT>"}`.
    pub fn v1_err(status: u16, text: &str) -> Response {
        let body = http1::v1_error_body(text);
        Response::new(
            status,
            vec![("Content-Type", JSON.into()), (NSQ_V1.0, NSQ_V1.1.into())],
            body,
            None,
        )
    }

    /// V1 success with a JSON document.
    pub fn v1_json(body: String) -> Response {
        Response::new(
            200,
            vec![("Content-Type", JSON.into()), (NSQ_V1.0, NSQ_V1.1.into())],
            body.into_bytes(),
            None,
        )
    }

    /// V1 success with nothing to say (Go's `nil`): an empty body and no Content-Type.
    pub fn v1_empty() -> Response {
        Response::new(200, vec![(NSQ_V1.0, NSQ_V1.1.into())], Vec::new(), None)
    }

    /// The PlainText decorator (/ping): raw text, no X-Nsq header.
    pub fn plain(status: u16, body: &str) -> Response {
        Response::new(status, Vec::new(), body.as_bytes().to_vec(), Some(TEXT))
    }
}

/// Frames a response for its request ([`http1::encode_response`], net/http's rules).
/// Returns the bytes and whether the connection must close afterwards.
fn encode(r: &Response, f: &Framing) -> (Vec<u8>, bool) {
    http1::encode_response(r.status, &r.headers, &r.body, r.sniffed_type, f)
}

/// net/http's answer to a request it cannot parse; the connection then closes.
fn server_error(stream: &mut TcpStream, e: HeadError) {
    let _ = stream.write_all(&e.response());
}

/// A parsed request head.
struct Request {
    method: String,
    /// The path as sent (still escaped), for logs.
    raw_path: String,
    /// The unescaped path that routing uses.
    path: String,
    /// The raw query; `None` when the target had no `?`.
    query: Option<String>,
    framing: Framing,
    content_length: Option<u64>,
    chunked: bool,
    expect_continue: bool,
    /// An `Expect` other than `100-continue` (net/http answers 417).
    expect_unknown: bool,
    remote: String,
}

impl Request {
    fn request_uri(&self) -> String {
        match &self.query {
            Some(q) if !q.is_empty() => format!("{}?{}", self.raw_path, q),
            _ => self.raw_path.clone(),
        }
    }
}

/// Parses a request head with net/http's rules (nsq_wire::http1) and frames its answer.
fn parse_head(buf: &[u8], remote: &str) -> Result<Option<(Request, usize)>, HeadError> {
    let Some(h) = http1::parse_request_head(buf)? else {
        return Ok(None);
    };
    let framing = Framing {
        head: h.method == "HEAD",
        http11: h.http11,
        close: !h.keep_alive(),
        keep_alive_10: !h.http11 && h.conn_keep_alive,
    };
    Ok(Some((
        Request {
            method: h.method,
            raw_path: h.raw_path,
            path: h.path,
            query: h.query,
            framing,
            content_length: h.content_length,
            chunked: h.chunked,
            expect_continue: h.expect_continue,
            expect_unknown: h.expect_unknown,
            remote: remote.to_string(),
        },
        h.head_len,
    )))
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl Conn {
    fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Reads more bytes from the socket into the buffer; 0 at EOF.
    fn fill(&mut self) -> std::io::Result<usize> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 16 * 1024, 0);
        let r = self.stream.read(&mut self.buf[old..]);
        let n = *r.as_ref().unwrap_or(&0);
        self.buf.truncate(old + n);
        r
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }

    /// One line including its `\n`, at most `max` bytes.
    fn read_line(&mut self, max: usize) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buffered().iter().position(|&b| b == b'\n') {
                let line = self.buffered()[..=i].to_vec();
                self.consume(i + 1);
                return Ok(line);
            }
            if self.buffered().len() > max || self.fill()? == 0 {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
        }
    }

    /// Drops `n` body bytes.
    fn skip(&mut self, mut n: u64) -> std::io::Result<()> {
        while n > 0 {
            if self.buffered().is_empty() && self.fill()? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let k = (self.buffered().len() as u64).min(n) as usize;
            self.consume(k);
            n -= k as u64;
        }
        Ok(())
    }
}

/// Reads and drops a request body (the handlers only use the query string), as
/// net/http does up to [`MAX_POST_HANDLER_READ`]. `Ok(false)`: the body is too long (a
/// Content-Length of 256 KiB or more, a chunked body over it); the rest is left unread
/// and the caller closes after responding (`Connection: close`), so an endless body
/// costs bounded time and memory. Err: malformed chunking or EOF.
fn discard_body(conn: &mut Conn, req: &Request) -> std::io::Result<bool> {
    if let Some(n) = req.content_length {
        if n >= MAX_POST_HANDLER_READ {
            return Ok(false);
        }
        return conn.skip(n).map(|()| true);
    }
    if !req.chunked {
        return Ok(true);
    }
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk");
    let mut budget = MAX_POST_HANDLER_READ;
    loop {
        let line = conn.read_line(4096)?;
        let line = String::from_utf8_lossy(&line);
        let size_str = line.trim_end().split(';').next().unwrap_or("").trim();
        let size = u64::from_str_radix(size_str, 16).map_err(|_| bad())?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                let t = conn.read_line(4096)?;
                if t == b"\r\n" || t == b"\n" {
                    return Ok(true);
                }
            }
        }
        if size > budget {
            return Ok(false);
        }
        budget -= size;
        conn.skip(size)?;
        let crlf = conn.read_line(2)?;
        if crlf != b"\r\n" && crlf != b"\n" {
            return Err(bad());
        }
    }
}

/// Serves one HTTP connection (keep-alive) until it closes.
pub fn serve_conn(ctx: Arc<Context>, stream: TcpStream) {
    let remote = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut conn = Conn {
        stream,
        buf: Vec::new(),
        pos: 0,
    };
    let mut crlf = http1::PostCrlf::default();
    loop {
        let (req, n) = loop {
            let k = crlf.drop_from(conn.buffered());
            conn.consume(k);
            // Parsed within the limit only, as Go reads the head through it.
            let buffered = conn.buffered();
            match parse_head(&buffered[..buffered.len().min(MAX_HEAD)], &remote) {
                Ok(Some(v)) => break v,
                Ok(None) if conn.buffered().len() >= MAX_HEAD => {
                    server_error(&mut writer, HeadError::TooLarge);
                    close_write_and_wait(&writer);
                    return;
                }
                Ok(None) => match conn.fill() {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                },
                Err(e) => {
                    server_error(&mut writer, e);
                    let _ = writer.shutdown(Shutdown::Both);
                    return;
                }
            }
        };
        conn.consume(n);
        crlf.after(&req.method);
        let mut req = req;
        if req.expect_unknown {
            // net/http (sendExpectationFailed), before any handler: 417, then close.
            let r = Response::new(417, vec![("Connection", "close".into())], Vec::new(), None);
            let _ = writer.write_all(&encode(&r, &req.framing).0);
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
        let has_body = req.chunked || req.content_length.unwrap_or(0) > 0;
        let mut body_left_unread = false;
        if req.expect_continue && has_body && req.framing.http11 {
            // net/http sends `100 Continue` when a handler reads the body; nsqlookupd's
            // never do, so the client is answered without it, with `Connection: close`,
            // and the body is never read.
            req.framing.close = true;
        } else {
            match discard_body(&mut conn, &req) {
                Ok(true) => {}
                Ok(false) => {
                    req.framing.close = true;
                    body_left_unread = true;
                }
                Err(_) => {
                    let _ = writer.shutdown(Shutdown::Both);
                    return;
                }
            }
        }
        let resp = route(&ctx, &req);
        let (bytes, close) = encode(&resp, &req.framing);
        if writer.write_all(&bytes).is_err() {
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
        if close {
            if body_left_unread {
                close_write_and_wait(&writer);
            } else {
                let _ = writer.shutdown(Shutdown::Both);
            }
            return;
        }
    }
}

/// Ends the connection as net/http does after answering a request whose input it left
/// unread (server.go closeWriteAndWait: a head over the limit, a body over 256 KiB):
/// FIN after the answer, then the socket stays open 500 ms (rstAvoidanceDelay), so a
/// client still sending reads the answer before its unread input resets the connection.
fn close_write_and_wait(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    std::thread::sleep(Duration::from_millis(500));
    let _ = stream.shutdown(Shutdown::Both);
}

/// Query parameters (Go's url.Values: the first value of a key wins).
struct Params(http1::Params);

impl Params {
    /// Parses the raw query; an error is 400 INVALID_REQUEST (http_api.NewReqParams).
    fn from(req: &Request) -> Result<Params, Response> {
        parse_query(req.query.as_deref().unwrap_or(""))
            .map(|q| Params(http1::Params(q)))
            .map_err(|_| Response::v1_err(400, "INVALID_REQUEST"))
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k)
    }

    fn require(&self, k: &str, missing: &str) -> Result<String, Response> {
        self.get(k)
            .map(str::to_owned)
            .ok_or_else(|| Response::v1_err(400, missing))
    }

    /// http_api.GetTopicChannelArgs.
    fn topic_channel(&self) -> Result<(String, String), Response> {
        let t = self.require("topic", "MISSING_ARG_TOPIC")?;
        if !is_valid_topic_name(&t) {
            return Err(Response::v1_err(400, "INVALID_ARG_TOPIC"));
        }
        let c = self.require("channel", "MISSING_ARG_CHANNEL")?;
        if !is_valid_channel_name(&c) {
            return Err(Response::v1_err(400, "INVALID_ARG_CHANNEL"));
        }
        Ok((t, c))
    }
}

fn toggle_slash(p: &str) -> String {
    match p.strip_suffix('/') {
        Some(s) => s.to_string(),
        None => format!("{p}/"),
    }
}

/// Methods other than `method` with a route at `path`, plus OPTIONS, sorted and joined
/// (httprouter allowed); for the path `*` every method with a route (server-wide, the
/// request's own included). `None` when there are none.
fn allowed(path: &str, method: &str) -> Option<String> {
    let mut list: Vec<&str> = ROUTES
        .iter()
        .filter(|(m, p)| (path == "*" || (*p == path && *m != method)) && *m != "OPTIONS")
        .map(|(m, _)| *m)
        .collect();
    if list.is_empty() {
        return None;
    }
    list.push("OPTIONS");
    list.sort();
    list.dedup();
    Some(list.join(", "))
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

/// http.Redirect to `path` with the request's query kept.
fn redirect(req: &Request, path: &str, code: u16) -> Response {
    let mut url = path.to_string();
    if let Some(q) = &req.query {
        url.push('?');
        url.push_str(q);
    }
    let mut location = String::new();
    for b in url.bytes() {
        if b.is_ascii() {
            location.push(b as char);
        } else {
            location.push_str(&format!("%{b:02x}"));
        }
    }
    let mut headers = Vec::new();
    let mut body = Vec::new();
    if req.method == "GET" || req.method == "HEAD" {
        headers.push(("Content-Type", HTML.to_string()));
    }
    headers.push(("Location", location));
    if req.method == "GET" {
        body = format!(
            "<a href=\"{}\">{}</a>.\n\n",
            html_escape(&url),
            status_text(code)
        )
        .into_bytes();
    }
    Response::new(code, headers, body, None)
}

/// httprouter's ServeHTTP: the route, else a redirect to a near miss, else OPTIONS, 405
/// or 404.
fn route(ctx: &Context, req: &Request) -> Response {
    let (m, p) = (req.method.as_str(), req.path.as_str());
    if m == "OPTIONS" && req.raw_path == "*" {
        // net/http answers `OPTIONS *` itself (globalOptionsHandler sets the length).
        return Response::new(200, vec![("Content-Length", "0".into())], Vec::new(), None);
    }
    if ROUTES.contains(&(m, p)) {
        return handle(ctx, req);
    }
    if ROUTES.iter().any(|(rm, _)| *rm == m) && m != "CONNECT" && p != "/" {
        let code = if m == "GET" { 301 } else { 307 };
        let toggled = toggle_slash(p);
        if ROUTES.contains(&(m, toggled.as_str())) {
            return redirect(req, &toggled, code);
        }
        let cleaned = clean_path(p);
        let fixed = ROUTES
            .iter()
            .find(|(rm, rp)| *rm == m && rp.eq_ignore_ascii_case(&cleaned))
            .or_else(|| {
                let t = toggle_slash(&cleaned);
                ROUTES
                    .iter()
                    .find(|(rm, rp)| *rm == m && rp.eq_ignore_ascii_case(&t))
            });
        if let Some((_, rp)) = fixed {
            return redirect(req, rp, code);
        }
    }
    if m == "OPTIONS" {
        if let Some(allow) = allowed(p, m) {
            return Response::new(200, vec![("Allow", allow)], Vec::new(), None);
        }
    } else if let Some(allow) = allowed(p, m) {
        let start = Instant::now();
        let mut r = Response::v1_err(405, "METHOD_NOT_ALLOWED");
        r.headers.insert(0, ("Allow", allow));
        log_request(req, 405, start);
        return r;
    }
    let start = Instant::now();
    log_request(req, 404, start);
    Response::v1_err(404, "NOT_FOUND")
}

/// http_api.Log: `200 GET /lookup?topic=t (127.0.0.1:57918) 23.044µs`.
fn log_request(req: &Request, status: u16, start: Instant) {
    log::info!(
        "{} {} {} ({}) {}",
        status,
        req.method,
        req.request_uri(),
        req.remote,
        go_duration_string(start.elapsed())
    );
}

fn handle(ctx: &Context, req: &Request) -> Response {
    if req.path.starts_with("/debug/pprof") {
        // Go's profiler endpoints have no Rust equivalent.
        return Response::plain(501, "pprof is not available in this nsqlookupd\n");
    }
    let start = Instant::now();
    let r = match req.path.as_str() {
        "/ping" => Response::plain(200, "OK"),
        "/info" => {
            let mut s = String::from("{\"version\":");
            json::push_str(&mut s, super::VERSION);
            s.push('}');
            Response::v1_json(s)
        }
        "/debug" => do_debug(ctx),
        "/topics" => {
            let topics = keys(&ctx.db.find_registrations("topic", "*", ""));
            let mut s = String::from("{\"topics\":");
            json::push_str_array(&mut s, &topics);
            s.push('}');
            Response::v1_json(s)
        }
        "/nodes" => do_nodes(ctx),
        path => with_params(ctx, req, path).unwrap_or_else(|e| e),
    };
    log_request(req, r.status, start);
    r
}

fn with_params(ctx: &Context, req: &Request, path: &str) -> Result<Response, Response> {
    let params = Params::from(req)?;
    let db = &ctx.db;
    Ok(match path {
        "/channels" => {
            let topic = params.require("topic", "MISSING_ARG_TOPIC")?;
            let channels = sub_keys(&db.find_registrations("channel", &topic, "*"));
            let mut s = String::from("{\"channels\":");
            json::push_str_array(&mut s, &channels);
            s.push('}');
            Response::v1_json(s)
        }
        "/lookup" => {
            let topic = params.require("topic", "MISSING_ARG_TOPIC")?;
            if db.find_registrations("topic", &topic, "").is_empty() {
                return Err(Response::v1_err(404, "TOPIC_NOT_FOUND"));
            }
            let channels = sub_keys(&db.find_registrations("channel", &topic, "*"));
            let producers = filter_by_active(
                db.find_producers("topic", &topic, ""),
                ctx.opts.inactive_producer_timeout,
                ctx.opts.tombstone_lifetime,
                now_nanos(),
            );
            let mut s = String::from("{\"channels\":");
            json::push_str_array(&mut s, &channels);
            s.push_str(",\"producers\":[");
            for (i, p) in producers.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                push_peer_info(&mut s, p);
                s.push('}');
            }
            s.push_str("]}");
            Response::v1_json(s)
        }
        "/topic/create" => {
            let topic = params.require("topic", "MISSING_ARG_TOPIC")?;
            if !is_valid_topic_name(&topic) {
                return Err(Response::v1_err(400, "INVALID_ARG_TOPIC"));
            }
            log::info!("DB: adding topic({topic})");
            db.add_registration(Registration::new("topic", &topic, ""));
            Response::v1_empty()
        }
        "/topic/delete" => {
            let topic = params.require("topic", "MISSING_ARG_TOPIC")?;
            for r in db.find_registrations("channel", &topic, "*") {
                log::info!("DB: removing channel({}) from topic({topic})", r.sub_key);
                db.remove_registration(&r);
            }
            for r in db.find_registrations("topic", &topic, "") {
                log::info!("DB: removing topic({topic})");
                db.remove_registration(&r);
            }
            Response::v1_empty()
        }
        "/topic/tombstone" => {
            let topic = params.require("topic", "MISSING_ARG_TOPIC")?;
            let node = params.require("node", "MISSING_ARG_NODE")?;
            log::info!("DB: setting tombstone for producer@{node} of topic({topic})");
            db.tombstone_topic_producer(&topic, &node, now_nanos());
            Response::v1_empty()
        }
        "/channel/create" => {
            let (topic, channel) = params.topic_channel()?;
            log::info!("DB: adding channel({channel}) in topic({topic})");
            db.add_registration(Registration::new("channel", &topic, &channel));
            log::info!("DB: adding topic({topic})");
            db.add_registration(Registration::new("topic", &topic, ""));
            Response::v1_empty()
        }
        "/channel/delete" => {
            let (topic, channel) = params.topic_channel()?;
            let regs = db.find_registrations("channel", &topic, &channel);
            if regs.is_empty() {
                return Err(Response::v1_err(404, "CHANNEL_NOT_FOUND"));
            }
            log::info!("DB: removing channel({channel}) from topic({topic})");
            for r in regs {
                db.remove_registration(&r);
            }
            Response::v1_empty()
        }
        _ => Response::v1_err(404, "NOT_FOUND"),
    })
}

/// Writes `{remote_address,hostname,broadcast_address,tcp_port,http_port,version` of a
/// PeerInfo, leaving the object open.
fn push_peer_info(s: &mut String, p: &Producer) {
    let pi = &p.peer;
    s.push('{');
    json::push_key(s, "remote_address");
    json::push_str(s, &pi.remote_address);
    s.push(',');
    json::push_key(s, "hostname");
    json::push_str(s, &pi.hostname);
    s.push(',');
    json::push_key(s, "broadcast_address");
    json::push_str(s, &pi.broadcast_address);
    s.push_str(&format!(
        ",\"tcp_port\":{},\"http_port\":{},",
        pi.tcp_port, pi.http_port
    ));
    json::push_key(s, "version");
    json::push_str(s, &pi.version);
}

/// GET /nodes: every identified peer that pinged within the inactivity timeout, with its
/// topics and whether it is tombstoned in each. Tombstoned peers are listed.
fn do_nodes(ctx: &Context) -> Response {
    let db = &ctx.db;
    let now = now_nanos();
    let producers = filter_by_active(
        db.find_producers("client", "", ""),
        ctx.opts.inactive_producer_timeout,
        Duration::ZERO,
        now,
    );
    let mut topic_producers: std::collections::HashMap<String, Vec<Producer>> = Default::default();
    let mut s = String::from("{\"producers\":[");
    for (i, p) in producers.iter().enumerate() {
        let regs: Vec<Registration> = db
            .lookup_registrations(&p.peer.id)
            .into_iter()
            .filter(|r| r.is_match("topic", "*", ""))
            .collect();
        let topics = keys(&regs);
        let tombstones: Vec<bool> = topics
            .iter()
            .map(|t| {
                let tps = topic_producers
                    .entry(t.clone())
                    .or_insert_with(|| db.find_producers("topic", t, ""));
                tps.iter()
                    .find(|tp| Arc::ptr_eq(&tp.peer, &p.peer))
                    .is_some_and(|tp| tp.is_tombstoned(ctx.opts.tombstone_lifetime, now))
            })
            .collect();
        if i > 0 {
            s.push(',');
        }
        push_peer_info(&mut s, p);
        s.push_str(",\"tombstones\":");
        json::push_bool_array(&mut s, &tombstones);
        s.push_str(",\"topics\":");
        json::push_str_array(&mut s, &topics);
        s.push('}');
    }
    s.push_str("]}");
    Response::v1_json(s)
}

/// GET /debug: `"category:key:subkey"` → the producers of that registration (a Go map, so
/// keys are sorted and registrations without producers are absent).
fn do_debug(ctx: &Context) -> Response {
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (r, producers) in ctx.db.snapshot() {
        let key = format!("{}:{}:{}", r.category, r.key, r.sub_key);
        for p in producers {
            let pi = &p.peer;
            let mut m = String::from("{");
            json::push_key(&mut m, "broadcast_address");
            json::push_str(&mut m, &pi.broadcast_address);
            m.push(',');
            json::push_key(&mut m, "hostname");
            json::push_str(&mut m, &pi.hostname);
            m.push_str(&format!(",\"http_port\":{},", pi.http_port));
            json::push_key(&mut m, "id");
            json::push_str(&mut m, &pi.id);
            m.push_str(&format!(
                ",\"last_update\":{},\"tcp_port\":{},\"tombstoned\":{},\"tombstoned_at\":{},",
                pi.last_update(),
                pi.tcp_port,
                p.tombstoned,
                p.tombstoned_at_go()
            ));
            json::push_key(&mut m, "version");
            json::push_str(&mut m, &pi.version);
            m.push('}');
            groups.entry(key.clone()).or_default().push(m);
        }
    }
    let mut s = String::from("{");
    for (i, (k, list)) in groups.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        json::push_key(&mut s, k);
        s.push('[');
        s.push_str(&list.join(","));
        s.push(']');
    }
    s.push('}');
    Response::v1_json(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_helpers() {
        assert_eq!(clean_path("//ping"), "/ping");
        assert_eq!(clean_path("/a/../ping/"), "/ping/");
        assert_eq!(clean_path("/./x/."), "/x/");
        assert_eq!(allowed("/ping", "POST").as_deref(), Some("GET, OPTIONS"));
        assert_eq!(
            allowed("/debug/pprof/symbol", "PUT").as_deref(),
            Some("GET, OPTIONS, POST")
        );
        assert_eq!(allowed("/nope", "GET"), None);
        assert_eq!(toggle_slash("/ping/"), "/ping");
    }
}
