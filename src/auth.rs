//! AUTH against an auth server (`--auth-http-address`): the HTTP query (nsqd:
//! internal/auth/authorizations.go QueryAnyAuthd/QueryAuthd, internal/http_api GETV1 and,
//! with `--auth-http-request-method=post`, master's POSTV1) and the per-command check
//! (nsqd: protocol_v2.go CheckAuth, client_v2.go IsAuthorized).
//!
//! ```text
//! GET  http://<addr>/auth?common_name=<cn>&remote_ip=<ip>&secret=<secret>&tls=<bool>
//! POST http://<addr>/auth   {"common_name":["<cn>"],"remote_ip":["<ip>"],"secret":["<secret>"],"tls":["<bool>"]}
//! (tls: the connection is TLS; cn: its client certificate's common name, else empty)
//! 200  {"ttl":<secs>,"identity":"..","identity_url":"..",
//!       "authorizations":[{"topic":"<re>","channels":["<re>"..],"permissions":["subscribe"|"publish"]}]}
//! ```
//!
//! The query runs on the connection's own task over a `glommio::net::TcpStream`, so the
//! shard's executor keeps serving every other connection while the auth server answers
//! (a host name is resolved on glommio's blocking thread pool, never on the executor).

use futures::future::{select, Either};
use futures::io::{AsyncReadExt, AsyncWriteExt};
use nsq_shards::auth::{AuthState, Authorization};
use nsq_shards::Client;
use nsq_wire::json::{push_key, push_str};
use nsq_wire::v2::go_quote;
use serde::Deserialize;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::{Duration, Instant};

/// Most bytes of an auth server reply this broker reads (headers and body).
const MAX_REPLY: usize = 16 << 20;

/// Why AUTH or a command's auth check failed. `Display` is the fatal error frame's text
/// the client gets (nsqd: protocol_v2.go AUTH and CheckAuth), byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// `E_INVALID AUTH already set`.
    AlreadySet,
    /// `E_AUTH_DISABLED AUTH disabled`.
    Disabled,
    /// `E_AUTH_FAILED AUTH failed`: no auth server gave a valid answer (the reason is
    /// logged, never sent).
    Failed,
    /// `E_UNAUTHORIZED AUTH no authorizations found`.
    NoAuthorizations,
    /// `E_AUTH_FIRST AUTH required before <cmd>`.
    First { cmd: String },
    /// `E_UNAUTHORIZED AUTH failed for <cmd> on "<topic>" "<channel>"`.
    Unauthorized {
        cmd: String,
        topic: String,
        channel: String,
    },
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::AlreadySet => f.write_str("E_INVALID AUTH already set"),
            AuthError::Disabled => f.write_str("E_AUTH_DISABLED AUTH disabled"),
            AuthError::Failed => f.write_str("E_AUTH_FAILED AUTH failed"),
            AuthError::NoAuthorizations => {
                f.write_str("E_UNAUTHORIZED AUTH no authorizations found")
            }
            AuthError::First { cmd } => write!(f, "E_AUTH_FIRST AUTH required before {cmd}"),
            AuthError::Unauthorized {
                cmd,
                topic,
                channel,
            } => write!(
                f,
                "E_UNAUTHORIZED AUTH failed for {cmd} on {} {}",
                go_quote(topic.as_bytes()),
                go_quote(channel.as_bytes())
            ),
        }
    }
}

impl std::error::Error for AuthError {}

/// Why a query to the auth servers got no valid answer (only logged).
#[derive(Debug)]
pub enum QueryError {
    /// `no auth server configured`.
    NoServer,
    /// Every server failed, in the order asked: `failed to auth against <addr> - <err>`
    /// for each, joined by `; ` (nsqd: QueryAnyAuthd).
    AllFailed(Vec<(String, RequestError)>),
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::NoServer => f.write_str("no auth server configured"),
            QueryError::AllFailed(errors) => {
                for (i, (addr, e)) in errors.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "failed to auth against {addr} - {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for QueryError {}

/// Why one HTTP request (to an auth server or an nsqlookupd) or the auth reply it got
/// failed. `Display` follows Go's net/http client texts where nsqd logs them.
#[derive(Debug)]
pub enum RequestError {
    /// `invalid URL "u"`: no `scheme://`.
    InvalidUrl(String),
    /// `unsupported protocol scheme "s"`: not `http`.
    Scheme(String),
    /// `invalid host in URL "u"`: an IPv6 host without its `]`.
    InvalidHost(String),
    /// `invalid port "p" in URL "u"`.
    InvalidPort { port: String, url: String },
    /// `no host in URL "u"`.
    NoHost(String),
    /// `dial tcp: lookup <host>: <err>`.
    Lookup {
        host: String,
        error: crate::dns::LookupError,
    },
    /// `dial tcp <addr>: <err>`.
    Connect {
        addr: SocketAddr,
        error: glommio::GlommioError<()>,
    },
    /// `write: <err>`.
    Write(std::io::Error),
    /// `read: <err>`.
    Read(std::io::Error),
    /// `reply larger than N bytes` (`MAX_REPLY`).
    TooLarge,
    /// `request to <endpoint> timed out after <go duration>`.
    TimedOut { endpoint: String, after: Duration },
    /// `unexpected EOF in reply headers`.
    HeadersEof,
    /// `malformed HTTP response: <err>`.
    Malformed(httparse::Error),
    /// `bad Content-Length "v"`.
    ContentLength(String),
    /// `unexpected EOF in reply body`.
    BodyEof,
    /// `unexpected EOF in chunk size`.
    ChunkSizeEof,
    /// `bad chunk size "v"`.
    ChunkSize(String),
    /// `unexpected EOF in chunk`.
    ChunkEof,
    /// `got response <code> <reason> "<body>"` (nsqd: http_api client): not a 200.
    Status {
        status: u16,
        reason: String,
        body: Vec<u8>,
    },
    /// The auth reply is not the JSON expected (serde_json's text).
    Json(serde_json::Error),
    /// An authorization of the reply is invalid (an unknown permission, a bad regex).
    Authorization(nsq_shards::auth::AuthorizationError),
    /// `invalid TTL <n> (must be >0)`.
    Ttl(i64),
    /// The reply's parse could not run on its own thread.
    Offload(crate::offload::OffloadError),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::InvalidUrl(url) => write!(f, "invalid URL {url:?}"),
            RequestError::Scheme(scheme) => write!(f, "unsupported protocol scheme {scheme:?}"),
            RequestError::InvalidHost(url) => write!(f, "invalid host in URL {url:?}"),
            RequestError::InvalidPort { port, url } => {
                write!(f, "invalid port {port:?} in URL {url:?}")
            }
            RequestError::NoHost(url) => write!(f, "no host in URL {url:?}"),
            RequestError::Lookup { host, error } => write!(f, "dial tcp: lookup {host}: {error}"),
            RequestError::Connect { addr, error } => write!(f, "dial tcp {addr}: {error}"),
            RequestError::Write(e) => write!(f, "write: {e}"),
            RequestError::Read(e) => write!(f, "read: {e}"),
            RequestError::TooLarge => write!(f, "reply larger than {MAX_REPLY} bytes"),
            RequestError::TimedOut { endpoint, after } => write!(
                f,
                "request to {endpoint} timed out after {}",
                crate::config::go_duration_string(*after)
            ),
            RequestError::HeadersEof => f.write_str("unexpected EOF in reply headers"),
            RequestError::Malformed(e) => write!(f, "malformed HTTP response: {e}"),
            RequestError::ContentLength(v) => write!(f, "bad Content-Length {v:?}"),
            RequestError::BodyEof => f.write_str("unexpected EOF in reply body"),
            RequestError::ChunkSizeEof => f.write_str("unexpected EOF in chunk size"),
            RequestError::ChunkSize(v) => write!(f, "bad chunk size {v:?}"),
            RequestError::ChunkEof => f.write_str("unexpected EOF in chunk"),
            RequestError::Status {
                status,
                reason,
                body,
            } => write!(f, "got response {status} {reason} {}", go_quote(body)),
            RequestError::Json(e) => e.fmt(f),
            RequestError::Authorization(e) => e.fmt(f),
            RequestError::Ttl(ttl) => write!(f, "invalid TTL {ttl} (must be >0)"),
            RequestError::Offload(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RequestError {}

/// The auth settings (flags `--auth-http-address`, `--auth-http-request-method`,
/// `--http-client-connect-timeout`, `--http-client-request-timeout`).
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    /// `host:port` (becomes `http://host:port/auth`) or a full `http://` URL.
    pub addresses: Vec<String>,
    /// POST a JSON body instead of GET with a query string (nsqd master).
    pub post: bool,
    /// Limit for the TCP connect; zero: none.
    pub connect_timeout: Duration,
    /// Limit for the whole request: connect, send and the full reply; zero: none.
    pub request_timeout: Duration,
}

impl AuthConfig {
    /// nsqd `IsAuthEnabled`: at least one auth address.
    pub fn enabled(&self) -> bool {
        !self.addresses.is_empty()
    }
}

/// What the auth server is told about the connection.
#[derive(Clone, Debug)]
pub struct AuthRequest<'a> {
    /// The client's IP without port (nsqd: net.SplitHostPort of the remote address).
    pub remote_ip: &'a str,
    pub tls: bool,
    /// The client certificate's CN (empty without TLS).
    pub common_name: &'a str,
    /// The AUTH body as sent.
    pub secret: &'a [u8],
}

impl AuthRequest<'_> {
    /// Go's `url.Values.Encode()` of the four fields (keys sorted).
    fn query_string(&self) -> String {
        let tls = if self.tls { "true" } else { "false" };
        format!(
            "common_name={}&remote_ip={}&secret={}&tls={}",
            query_escape(self.common_name.as_bytes()),
            query_escape(self.remote_ip.as_bytes()),
            query_escape(self.secret),
            tls
        )
    }

    /// Go's `json.Marshal(url.Values)`: keys sorted, each value a one-element array.
    fn json_body(&self) -> String {
        let mut out = String::from("{");
        let fields: [(&str, String); 4] = [
            ("common_name", self.common_name.to_string()),
            ("remote_ip", self.remote_ip.to_string()),
            ("secret", String::from_utf8_lossy(self.secret).into_owned()),
            ("tls", if self.tls { "true" } else { "false" }.to_string()),
        ];
        for (i, (k, v)) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_key(&mut out, k);
            out.push('[');
            push_str(&mut out, v);
            out.push(']');
        }
        out.push('}');
        out
    }
}

/// Go's `url.QueryEscape`: unreserved bytes kept, space as `+`, the rest `%XX`.
pub fn query_escape(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for &c in b {
        match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(c as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{c:02X}")),
        }
    }
    out
}

/// Queries the auth servers in a rotation from a random start until one answers with a
/// valid reply (nsqd: QueryAnyAuthd). The error lists every failure
/// (`failed to auth against <addr> - <err>; ...`); it is only logged, clients see
/// `E_AUTH_FAILED AUTH failed`.
pub async fn query_any(cfg: &AuthConfig, req: &AuthRequest<'_>) -> Result<AuthState, QueryError> {
    let n = cfg.addresses.len();
    if n == 0 {
        return Err(QueryError::NoServer);
    }
    let start = fastrand::usize(..n);
    let mut errors = Vec::new();
    for i in 0..n {
        let addr = &cfg.addresses[(i + start) % n];
        match query(cfg, addr, req).await {
            Ok(state) => return Ok(state),
            Err(e) => errors.push((addr.clone(), e)),
        }
    }
    Err(QueryError::AllFailed(errors))
}

/// One auth server (nsqd: QueryAuthd), bounded by the request timeout.
async fn query(
    cfg: &AuthConfig,
    addr: &str,
    req: &AuthRequest<'_>,
) -> Result<AuthState, RequestError> {
    let endpoint = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}/auth")
    };
    let (endpoint, body) = if cfg.post {
        (endpoint, Some(req.json_body()))
    } else {
        (format!("{endpoint}?{}", req.query_string()), None)
    };
    let reply = timed_request(cfg, &endpoint, body.as_deref()).await?;
    if reply.len() <= PARSE_INLINE_MAX {
        return parse_reply(&reply, Instant::now());
    }
    // Compiling the regexes of a large reply takes long (100,000 authorizations: about
    // a second), which on the shard's thread would stall all its clients.
    // At most two at once: a parse can take hundreds of MB (100,000 authorizations:
    // about 300 MB), and inline the shards' threads bounded them to one a shard.
    crate::offload::off_executor("auth-parse", &PARSES, move || {
        parse_reply(&reply, Instant::now())
    })
    .await
    .map_err(RequestError::Offload)
    .and_then(|r| r)
}

/// Auth replies up to this size (bytes) are parsed on the shard's thread; larger ones
/// on a thread of their own.
const PARSE_INLINE_MAX: usize = 16 << 10;

/// The threads parsing large auth replies at once, process-wide.
static PARSES: crate::offload::Slots = crate::offload::Slots::new(2);

/// One HTTP request (GET, or POST with a JSON `body`) with nsqd's HTTP client settings:
/// `cfg.connect_timeout` for the TCP connect and `cfg.request_timeout` for the whole
/// request (zero: no limit, as in Go). Sends nsqd's `Accept` header for the v1 API
/// (nsqd: http_api.Client GETV1/POSTV1); returns the body of a 200 reply. Runs on the
/// calling task: the executor serves everything else meanwhile.
pub async fn timed_request(
    cfg: &AuthConfig,
    endpoint: &str,
    body: Option<&str>,
) -> Result<Vec<u8>, RequestError> {
    let fetch = pin!(http_request(cfg, endpoint, body));
    // Go's http.Client: a zero Timeout means no limit.
    if cfg.request_timeout.is_zero() {
        return fetch.await;
    }
    let limit = pin!(glommio::timer::sleep(cfg.request_timeout));
    match select(fetch, limit).await {
        Either::Left((r, _)) => r,
        Either::Right(_) => Err(RequestError::TimedOut {
            endpoint: endpoint.to_string(),
            after: cfg.request_timeout,
        }),
    }
}

/// The JSON reply (nsqd: auth.State). Go ignores unknown keys and takes `null` as empty.
#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    ttl: Option<i64>,
    #[serde(default)]
    authorizations: Option<Vec<ReplyAuthorization>>,
    #[serde(default)]
    identity: Option<String>,
    #[serde(default)]
    identity_url: Option<String>,
}

#[derive(Deserialize)]
struct ReplyAuthorization {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    permissions: Option<Vec<String>>,
}

/// Validates a 200 reply's body as nsqd does: permissions known, regexes compile,
/// ttl > 0 (`invalid TTL <n> (must be >0)`). The state expires `ttl` seconds after `now`.
pub fn parse_reply(body: &[u8], now: Instant) -> Result<AuthState, RequestError> {
    let r: Reply = serde_json::from_slice(body).map_err(RequestError::Json)?;
    let mut authorizations = Vec::new();
    for a in r.authorizations.unwrap_or_default() {
        authorizations.push(
            Authorization::new(
                a.topic.as_deref().unwrap_or(""),
                &a.channels.unwrap_or_default(),
                &a.permissions.unwrap_or_default(),
            )
            .map_err(RequestError::Authorization)?,
        );
    }
    let ttl = r.ttl.unwrap_or(0);
    if ttl <= 0 {
        return Err(RequestError::Ttl(ttl));
    }
    // nsqd: time.Duration(ttl) * time.Second, which wraps in int64 for a ttl over 292
    // years: a wrapped negative one has expired at once (asked again at the next check).
    let ttl_ns = ttl.wrapping_mul(1_000_000_000);
    Ok(AuthState::new(
        r.identity.unwrap_or_default(),
        r.identity_url.unwrap_or_default(),
        authorizations,
        Duration::from_nanos(u64::try_from(ttl_ns).unwrap_or(0)),
        now,
    ))
}

/// An `http://host[:port][/path][?query]` URL split for a request.
#[derive(Debug, PartialEq, Eq)]
struct Url<'a> {
    /// `host:port` as written (the Host header).
    authority: &'a str,
    host: &'a str,
    port: u16,
    /// Path and query, `/` when empty.
    target: String,
}

fn parse_url(url: &str) -> Result<Url<'_>, RequestError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(RequestError::InvalidUrl(url.to_string()));
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(RequestError::Scheme(scheme.to_string()));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    let target = match target {
        "" => "/".to_string(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_string(),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| RequestError::InvalidHost(url.to_string()))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None | Some("") => 80,
        Some(p) => p.parse::<u16>().map_err(|_| RequestError::InvalidPort {
            port: p.to_string(),
            url: url.to_string(),
        })?,
    };
    if host.is_empty() {
        return Err(RequestError::NoHost(url.to_string()));
    }
    Ok(Url {
        authority,
        host,
        port,
        target,
    })
}

/// Resolves `host` off the executor thread when it is not an IP literal (DNS may block).
async fn resolve(host: &str, port: u16) -> Result<SocketAddr, RequestError> {
    crate::dns::lookup(host, port)
        .await
        .map_err(|error| RequestError::Lookup {
            host: host.to_string(),
            error,
        })
}

/// One HTTP/1.1 request with `Connection: close`; returns the body of a 200 reply.
async fn http_request(
    cfg: &AuthConfig,
    endpoint: &str,
    body: Option<&str>,
) -> Result<Vec<u8>, RequestError> {
    let url = parse_url(endpoint)?;
    let sa = resolve(url.host, url.port).await?;
    // Go's net.Dialer: a zero Timeout means no limit (glommio refuses a zero timeout).
    let connected = if cfg.connect_timeout.is_zero() {
        glommio::net::TcpStream::connect(sa).await
    } else {
        glommio::net::TcpStream::connect_timeout(sa, cfg.connect_timeout).await
    };
    let mut stream = connected.map_err(|error| RequestError::Connect { addr: sa, error })?;
    let method = if body.is_some() { "POST" } else { "GET" };
    let mut req = format!(
        "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: nsqd/{}\r\n\
         Accept: application/vnd.nsq; version=1.0\r\nConnection: close\r\n",
        url.target,
        url.authority,
        nsq_wire::identify::VERSION
    );
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(RequestError::Write)?;
    let mut raw = Vec::new();
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await.map_err(RequestError::Read)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&chunk[..n]);
        if raw.len() > MAX_REPLY {
            return Err(RequestError::TooLarge);
        }
        if reply_complete(&raw) {
            break;
        }
    }
    reply_body(&raw)
}

/// The body of a whole HTTP response read to EOF (`raw`) when its status is 200 (Go's
/// http.Client), else `got response <code> <reason> "<body>"` as nsqd's http_api
/// client words it. Errors for a malformed or truncated response.
pub fn reply_body(raw: &[u8]) -> Result<Vec<u8>, RequestError> {
    let (status, reason, body) = parse_response(raw)?;
    if status != 200 {
        return Err(RequestError::Status {
            status,
            reason,
            body,
        });
    }
    Ok(body)
}

/// True when `raw` holds a whole response framed by Content-Length (a server that keeps
/// the connection open despite `Connection: close` is not waited on).
fn reply_complete(raw: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = resp.parse(raw) else {
        return false;
    };
    resp.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|len| raw.len() >= head + len)
}

/// (status, reason, body) of a whole response read to EOF: the body framed by
/// Content-Length, chunked, or the rest of the stream.
fn parse_response(raw: &[u8]) -> Result<(u16, String, Vec<u8>), RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(RequestError::HeadersEof),
        Err(e) => return Err(RequestError::Malformed(e)),
    };
    let status = resp.code.unwrap_or(0);
    let reason = resp.reason.unwrap_or("").to_string();
    let rest = &raw[head..];
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = header("content-length") {
        let len: usize = len.parse().map_err(|_| RequestError::ContentLength(len))?;
        rest.get(..len).ok_or(RequestError::BodyEof)?.to_vec()
    } else {
        rest.to_vec()
    };
    Ok((status, reason, body))
}

/// Decodes a chunked body (extensions and trailers ignored).
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, RequestError> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(RequestError::ChunkSizeEof)?;
        let line = String::from_utf8_lossy(&b[..nl]);
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| RequestError::ChunkSize(size_hex.to_string()))?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        let data = b.get(..size).ok_or(RequestError::ChunkEof)?;
        out.extend_from_slice(data);
        b = b.get(size + 2..).unwrap_or(&[]);
    }
}

/// The client's IP as nsqd sends it (`remote_ip`): the address without its port.
pub fn remote_ip(remote_address: &str) -> &str {
    let ip = remote_address
        .rsplit_once(':')
        .map(|(h, _)| h)
        .unwrap_or(remote_address);
    ip.trim_start_matches('[').trim_end_matches(']')
}

/// AUTH: queries the auth servers with `secret` and keeps the answer on the client
/// (nsqd: protocol_v2.go AUTH). Returns the JSON response, or the fatal error frame's
/// text in nsqd's order: `E_INVALID AUTH already set`, `E_AUTH_DISABLED AUTH disabled`,
/// `E_AUTH_FAILED AUTH failed`, `E_UNAUTHORIZED AUTH no authorizations found`.
pub async fn auth(cfg: &AuthConfig, client: &Client, secret: &[u8]) -> Result<Vec<u8>, AuthError> {
    if client.has_authorizations() {
        return Err(AuthError::AlreadySet);
    }
    if !cfg.enabled() {
        return Err(AuthError::Disabled);
    }
    client.set_auth_secret(Some(secret.to_vec()));
    let state = Box::pin(query_client(cfg, client)).await?;
    let resp = {
        let mut out = String::from("{");
        push_key(&mut out, "identity");
        push_str(&mut out, &state.identity);
        out.push(',');
        push_key(&mut out, "identity_url");
        push_str(&mut out, &state.identity_url);
        out.push(',');
        push_key(&mut out, "permission_count");
        out.push_str(&state.authorizations.len().to_string());
        out.push('}');
        out
    };
    client.set_auth(Some(state));
    if !client.has_authorizations() {
        return Err(AuthError::NoAuthorizations);
    }
    Ok(resp.into_bytes())
}

/// Queries with the client's secret; a failure is logged (never shown to the client,
/// as nsqd) and becomes `E_AUTH_FAILED AUTH failed`.
async fn query_client(cfg: &AuthConfig, client: &Client) -> Result<AuthState, AuthError> {
    let secret = client.auth_secret().unwrap_or_default();
    // nsqd: the TLS state and the client certificate's common name.
    let common_name = client
        .tls()
        .as_ref()
        .map(|t| t.common_name.clone())
        .unwrap_or_default();
    let req = AuthRequest {
        remote_ip: remote_ip(client.remote_address()),
        tls: client.tls().is_some(),
        common_name: &common_name,
        secret: &secret,
    };
    query_any(cfg, &req).await.map_err(|e| {
        log::warn!(
            "PROTOCOL(V2): [{}] AUTH failed {e}",
            client.remote_address()
        );
        AuthError::Failed
    })
}

/// nsqd CheckAuth for `cmd` (SUB, PUB, MPUB, DPUB) on `topic` and `channel` (empty for a
/// publish): nothing to check without auth servers; otherwise the client must have
/// authorized (`E_AUTH_FIRST AUTH required before <cmd>`), an expired state is fetched
/// again (`E_AUTH_FAILED AUTH failed`), and one authorization must allow it
/// (`E_UNAUTHORIZED AUTH failed for <cmd> on "<topic>" "<channel>"`).
pub async fn check(
    cfg: &AuthConfig,
    client: &Client,
    cmd: &str,
    topic: &str,
    channel: &str,
) -> Result<(), AuthError> {
    if !cfg.enabled() {
        return Ok(());
    }
    if !client.has_authorizations() {
        return Err(AuthError::First {
            cmd: cmd.to_string(),
        });
    }
    let expired = client
        .auth()
        .as_ref()
        .is_some_and(|a| a.is_expired(Instant::now()));
    if expired {
        // Boxed (here and in `auth`): the HTTP query's state (1.5 KB) would otherwise
        // sit in every connection's task.
        let state = Box::pin(query_client(cfg, client)).await?;
        client.set_auth(Some(state));
    }
    let allowed = client
        .auth()
        .as_ref()
        .is_some_and(|a| a.is_allowed(topic, channel));
    if !allowed {
        return Err(AuthError::Unauthorized {
            cmd: cmd.to_string(),
            topic: topic.to_string(),
            channel: channel.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_string_like_go() {
        let r = AuthRequest {
            remote_ip: "127.0.0.1",
            tls: false,
            common_name: "",
            secret: b"a b&c=d/\xff~",
        };
        assert_eq!(
            r.query_string(),
            "common_name=&remote_ip=127.0.0.1&secret=a+b%26c%3Dd%2F%FF~&tls=false"
        );
        assert_eq!(
            r.json_body(),
            "{\"common_name\":[\"\"],\"remote_ip\":[\"127.0.0.1\"],\
             \"secret\":[\"a b\\u0026c=d/\u{fffd}~\"],\"tls\":[\"false\"]}"
        );
    }

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:4181/auth?x=1").unwrap();
        assert_eq!(
            (u.authority, u.host, u.port, u.target.as_str()),
            ("127.0.0.1:4181", "127.0.0.1", 4181, "/auth?x=1")
        );
        let u = parse_url("http://[::1]:81").unwrap();
        assert_eq!((u.host, u.port, u.target.as_str()), ("::1", 81, "/"));
        let u = parse_url("HTTP://auth.example?a").unwrap();
        assert_eq!(
            (u.host, u.port, u.target.as_str()),
            ("auth.example", 80, "/?a")
        );
        assert!(parse_url("https://x/auth").is_err());
        assert!(parse_url("http://:80/").is_err());
        assert!(parse_url("http://h:99999/").is_err());
    }

    #[test]
    fn responses() {
        let (s, _, b) =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"{}"[..]));
        let (_, _, b) = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{\"\r\n3;x=y\r\na\":\r\n1\r\n1\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(b, b"{\"a\":1");
        let (s, r, b) = parse_response(b"HTTP/1.0 403 Forbidden\r\n\r\nno").unwrap();
        assert_eq!(
            (s, r.as_str(), b.as_slice()),
            (403, "Forbidden", &b"no"[..])
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Le").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(reply_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        ));
        assert!(!reply_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{}"
        ));
    }

    #[test]
    fn replies() {
        let now = Instant::now();
        let st = parse_reply(
            br#"{"ttl":2,"identity":"me","identity_url":null,"extra":1,
                "authorizations":[{"topic":"t","channels":[".*"],"permissions":["publish"]}]}"#,
            now,
        )
        .unwrap();
        assert_eq!(st.identity, "me");
        assert_eq!(st.authorizations.len(), 1);
        assert_eq!(st.expires, now + Duration::from_secs(2));
        assert_eq!(
            parse_reply(br#"{"ttl":0}"#, now).unwrap_err().to_string(),
            "invalid TTL 0 (must be >0)"
        );
        assert_eq!(
            parse_reply(
                br#"{"ttl":1,"authorizations":[{"topic":"t","permissions":["x"]}]}"#,
                now
            )
            .unwrap_err()
            .to_string(),
            "unknown permission x"
        );
        assert!(parse_reply(b"not json", now).is_err());
        assert!(parse_reply(br#"{"ttl":1.5}"#, now).is_err());
        // A ttl past 292 years wraps as nsqd's time.Duration(ttl) * time.Second (it
        // panicked on the Instant's overflow): i64::MAX s wraps to -1 s, expired at once.
        let st = parse_reply(br#"{"ttl":9223372036854775807}"#, now).unwrap();
        assert!(st.is_expired(now + Duration::from_millis(1)));
        let st = parse_reply(br#"{"ttl":3153600000}"#, now).unwrap();
        assert!(!st.is_expired(now + Duration::from_secs(3_000_000_000)));
    }

    #[test]
    fn remote_ips() {
        assert_eq!(remote_ip("127.0.0.1:5000"), "127.0.0.1");
        assert_eq!(remote_ip("[::1]:5000"), "::1");
    }
}
